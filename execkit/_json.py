"""One serializer for every value type's JSON wire shape.

`to_json(value)` is what `attrs.asdict` gives, with three rules, so no value type writes its
own `to_dict` body:

- enum members become their `.value`, tuples and frozensets become lists, paths strings;
- a field whose metadata has `json_key(...)` is written under that key (the classes keep
  the Python name `failure_class`, the wire says `"class"`);
- a field with `json_key(None)` is left out.

Classes that add derived keys (`ok`, `schema_version`) merge them into this dict.

Each class's fields and wire keys are read once (`_plan`) and a value is written with one
`getattr` a field: a listing of 100,000 tasks writes 100,000 of them, and `attrs.asdict`
with a serializer and a second renaming pass was most of what that listing cost.
Nested attrs instances (direct, in a list, tuple or dict) are written the same way.
"""

from __future__ import annotations

import enum
import os
from typing import Any

import attrs

__all__ = ["JSON_KEY", "json_key", "to_json"]

JSON_KEY = "execkit.json_key"

_OMIT = object()
_SCALARS = frozenset({str, int, float, bool, type(None)})


def json_key(name: str | None) -> dict[str, Any]:
    """Field metadata: write the field under `name`, or leave it out (None)."""
    return {JSON_KEY: _OMIT if name is None else name}


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:  # exact types: a StrEnum member is a str, and goes on
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if attrs.has(type(value)):
        return to_json(value)
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, frozenset | set):
        return [_plain(item) for item in sorted(value)]
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


_PLANS: dict[type[Any], tuple[tuple[str, str], ...]] = {}


def _plan(cls: type[Any]) -> tuple[tuple[str, str], ...]:
    """(attribute, wire key) of each field `cls` writes, in field order: read once per
    class, so a value written is one `getattr` a field."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple(
            (field.name, key)
            for field in attrs.fields(cls)
            if (key := field.metadata.get(JSON_KEY, field.name)) is not _OMIT
        )
    return plan


def to_json(inst: Any) -> dict[str, Any]:
    """The JSON-safe mapping of an attrs instance (see the module docstring)."""
    return {key: _plain(getattr(inst, name)) for name, key in _plan(type(inst))}
