"""The client's half of the wire: answers back into the ledger's values, and the arguments
that are not plain JSON into JSON.

A reader takes the answer's JSON object and returns what the bound `Ledger` method returns:
`one(Task)` the Task itself, `listed("tasks", one(Task))` its list member, `flag("revoked")`
a boolean member, `both(member("task", one(Task)), optional("last_attempt", one(Attempt)))`
an object's two members as a pair. A wire shape is read by its attrs fields: keys a newer
server adds are ignored, a missing key with a default takes it, enum fields become their
enum and whole numbers in float fields floats. An answer that does not read is
`StorageError` (the server answered something that is not the API).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from execkit._budget import DispatchCap
from execkit._errors import StorageError

__all__ = [
    "ATTEMPT_LIMITS",
    "LANES",
    "WAKE",
    "both",
    "cap_number",
    "document",
    "flag",
    "listed",
    "member",
    "one",
    "optional",
    "text",
]

ATTEMPT_LIMITS = "tasks.attempt_limits"
"""The capability a limit needs (ADR 0033; `execkit.ledger.CAPABILITIES` holds it)."""

LANES = "vendor.lanes"
"""The capability a lane needs (issue #28; `execkit.ledger.CAPABILITIES` holds it)."""

WAKE = "ledger.wake"
"""The capability a wake-up needs (issue #51; `execkit.ledger.CAPABILITIES` holds it)."""

T = TypeVar("T")
U = TypeVar("U")
A = TypeVar("A", bound=attrs.AttrsInstance)

Convert = Callable[[Any], Any]


def cap_number(cap: DispatchCap | None) -> int | None:
    """A dispatch cap on the wire: its number of attempts."""
    return None if cap is None else cap.max_attempts


def _whole_to_float(value: Any) -> Any:
    return float(value) if type(value) is int else value


def _or_none(convert: Convert) -> Convert:
    return lambda value: None if value is None else convert(value)


def _converter(annotation: Any) -> Convert | None:
    """How a JSON value becomes the field's value (None: as it is)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        inner = _converter(next(a for a in args if a is not type(None)))
        return None if inner is None else _or_none(inner)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    if annotation is float:
        return _whole_to_float
    if typing.get_origin(annotation) is tuple:
        return tuple
    return None


def one(kind: type[A]) -> Callable[[object], A]:
    """The reader of one wire shape `kind` (an attrs class with `to_dict()`), its fields'
    conversions worked out once."""
    hints = typing.get_type_hints(kind)
    fields = [(field.name, _converter(hints[field.name])) for field in attrs.fields(kind)]

    def read(doc: object) -> A:
        if not isinstance(doc, dict):
            raise StorageError(f"the server answered something that is not a {kind.__name__}")
        values: dict[str, Any] = {}
        try:
            for name, convert in fields:
                if name in doc:
                    value = doc[name]
                    values[name] = value if convert is None else convert(value)
            return kind(**values)
        except (TypeError, ValueError) as exc:
            raise StorageError(f"the server's {kind.__name__} could not be read: {exc}") from None

    return read


def text(item: object) -> str:
    """One line of a list of texts (`problems`, `repaired`)."""
    return str(item)


def listed(member: str, item: Callable[[object], T]) -> Callable[[dict[str, Any]], list[T]]:
    """The reader of a list member of the answer, each item read by `item`."""

    def read(doc: dict[str, Any]) -> list[T]:
        found = doc.get(member)
        if not isinstance(found, list):
            raise StorageError(f"the server's answer has no list {member!r}")
        return [item(entry) for entry in found]

    return read


def optional(member: str, item: Callable[[object], T]) -> Callable[[dict[str, Any]], T | None]:
    """The reader of a member that may be null (None), else read by `item`."""

    def read(doc: dict[str, Any]) -> T | None:
        found = doc.get(member)
        return None if found is None else item(found)

    return read


def member(name: str, item: Callable[[object], T]) -> Callable[[dict[str, Any]], T]:
    """The reader of a member that must be there, read by `item`."""

    def read(doc: dict[str, Any]) -> T:
        if name not in doc:
            raise StorageError(f"the server's answer has no member {name!r}")
        return item(doc[name])

    return read


def both(
    first: Callable[[dict[str, Any]], T], second: Callable[[dict[str, Any]], U]
) -> Callable[[object], tuple[T, U]]:
    """The reader of one object as a pair: what `first` and `second` read of it (each a
    reader of a member: `member`, `optional`)."""

    def read(doc: object) -> tuple[T, U]:
        if not isinstance(doc, dict):
            raise StorageError("the server answered something that is not a JSON object")
        return first(doc), second(doc)

    return read


def flag(member: str) -> Callable[[dict[str, Any]], bool]:
    """The reader of a boolean member (absent is false)."""
    return lambda doc: bool(doc.get(member))


def document(doc: dict[str, Any]) -> dict[str, Any]:
    """The answer as it is (the capabilities, read by the client itself)."""
    return doc
