"""One row of the route table: an HTTP endpoint with both of its sides.

An `Endpoint` names its method and path, operation id, the token role it needs, the fields
of its query and body with their JSON types and the schema of its answer; then

- the server side: `handler`, which takes a checked `Call` and calls the ledger;
- the client side: `binds`, the `Ledger` method the row implements, `read`, which turns the
  answer back into that method's return value, and `needs`, a capability the client checks
  before sending.

The client side is by name: each parameter of the bound method is a path parameter, a query
field or a body member of the same name, except `actor` (its `on_behalf_of` is the
`X-On-Behalf-Of` header; who acts is the token's actor) and `now` (never sent: the server's
clock decides). A row whose fields and method disagree is refused when the table is built,
so a parameter can neither be forgotten on the wire nor sent under another name.

Used as a class attribute named after the method it binds, a row is that method on an
instance of a `Sender` (`RemoteLedger`): `ledger.create_task(...)` binds the arguments to
the method's signature (defaults included) and hands them to `Sender._send` with the row.
Typed through: `RemoteLedger().create_task` has `Ledger.create_task`'s signature, and a
`read` that does not return what the method returns is a type error.
"""

from __future__ import annotations

import enum
import inspect
import json
import types
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload

import attrs
from attrs.validators import in_

from execkit.ledger import Actor, Ledger

__all__ = [
    "JSON_TYPES",
    "UNSENT",
    "Call",
    "Endpoint",
    "Field",
    "Handler",
    "Needs",
    "Sender",
]

P = ParamSpec("P")
R = TypeVar("R")

JSON_TYPES = ("string", "integer", "number", "boolean", "object")

UNSENT = frozenset({"actor", "now"})
"""Parameters of a bound method that are not fields: `actor` becomes a header, `now` is
the server's."""


def _plain(value: Any) -> Any:
    # An enum argument (`AttemptStatus.FAILED`) goes on the wire as its value.
    return value.value if isinstance(value, enum.Enum) else value


@attrs.frozen
class Field:
    """One query parameter or body member: its JSON type, whether it must be given and
    whether null is allowed.

    For the client: `encode` turns the argument into its JSON value (enums become their
    values by default); `omit_none` leaves a None out of the body instead of sending null,
    so a server older than the member still takes a call that does not use it. An
    `object` member names its wire shape in `shape` (a component of the document, e.g.
    `RunOwner`); the server hands the handler a JSON object of scalars, and the handler
    builds the value (its validators word a bad one).
    """

    name: str
    type: str = attrs.field(validator=in_(JSON_TYPES))
    required: bool = False
    nullable: bool = False
    description: str = ""
    omit_none: bool = attrs.field(default=False, kw_only=True)
    shape: str | None = attrs.field(default=None, kw_only=True)
    encode: Callable[[Any], Any] = attrs.field(default=_plain, kw_only=True, eq=False)


@attrs.frozen
class Needs:
    """A capability the client checks before it sends (ADR 0033: a server that does not
    advertise it may not enforce the call's meaning), when the argument `when` is truthy,
    or always when `when` is None. `what` words the refusal: "... may not enforce WHAT"."""

    capability: str
    what: str
    when: str | None = None


@attrs.frozen
class Call:
    """One checked request, as a handler sees it."""

    ledger: Ledger
    actor: Actor
    path: Mapping[str, str]
    query: Mapping[str, Any]
    body: Mapping[str, Any]
    idempotency_key: str | None
    capabilities: frozenset[str]
    # The ledger's id when the caller knows it (it never changes): one read less.
    ledger_id: str | None = None


Handler = Callable[[Call], tuple[int, dict[str, Any]]]


def _as_needs(value: Needs | tuple[Needs, ...] | None) -> tuple[Needs, ...]:
    """A row's capabilities: one, several (one per optional argument), or none."""
    if value is None:
        return ()
    return (value,) if isinstance(value, Needs) else tuple(value)


Reader = Callable[[dict[str, Any]], R]


class Sender(Protocol):
    """What a row's client side needs of the object it is a method of: one call path that
    sends the row's request with these (bound) arguments and returns `endpoint.read` of the
    answer, or raises the answer's error."""

    def _send(self, endpoint: Endpoint[Any, R], arguments: Mapping[str, Any]) -> R: ...


@attrs.frozen
class _Signature:
    """The bound method's parameters, read once: binding a call is then a few dict
    operations (`inspect.Signature.bind` costs several microseconds per call)."""

    signature: inspect.Signature
    positional: tuple[str, ...]
    names: frozenset[str]
    defaults: Mapping[str, Any]

    @classmethod
    def of(cls, function: Callable[..., Any]) -> _Signature:
        signature = inspect.signature(function)
        params = list(signature.parameters.values())[1:]  # without self
        signature = signature.replace(parameters=params)
        return cls(
            signature=signature,
            positional=tuple(
                p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            ),
            names=frozenset(p.name for p in params),
            defaults={p.name: p.default for p in params if p.default is not p.empty},
        )

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Every parameter's value, defaults filled in; a call the signature refuses is the
        `TypeError` Python raises for it."""
        taken = self.positional[: len(args)]
        if (
            len(args) == len(taken)
            and kwargs.keys() <= self.names
            and kwargs.keys().isdisjoint(taken)
        ):
            values = dict(self.defaults)
            values.update(zip(taken, args, strict=True))
            values.update(kwargs)
            if len(values) == len(self.names):
                return values
        bound = self.signature.bind(*args, **kwargs)  # raises the precise TypeError
        bound.apply_defaults()
        return dict(bound.arguments)


@attrs.frozen
class Endpoint(Generic[P, R]):
    """One route (see the module docstring). `status` is the answer's on success;
    `role` the token role every call needs and `role_if` (boolean body field, role) one
    needed when that field is true; `body` None means the route takes no body (GET)."""

    method: str
    path: str
    operation_id: str
    summary: str
    handler: Handler
    response: str  # a schema name in the OpenAPI document's components
    status: int = 200
    role: str | None = None
    role_if: tuple[str, str] | None = None
    query: tuple[Field, ...] = ()
    body: tuple[Field, ...] | None = None
    authenticated: bool = True
    binds: Callable[Concatenate[Any, P], R] | None = attrs.field(default=None, eq=False)
    read: Reader[R] | None = attrs.field(default=None, eq=False)
    needs: tuple[Needs, ...] = attrs.field(default=(), converter=_as_needs)
    _params: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)
    _method: Callable[..., R] | None = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        params = tuple(part[1:-1] for part in self.path.split("/") if part.startswith("{"))
        object.__setattr__(self, "_params", params)
        object.__setattr__(self, "_method", None)
        if self.binds is None:
            return
        signature = _Signature.of(self.binds)
        wired = {*params, *(f.name for f in self.query), *(f.name for f in self.body or ())}
        if signature.names - UNSENT != wired or self.read is None:
            raise TypeError(
                f"{self.operation_id}: {self.binds.__name__}'s parameters "
                f"{sorted(signature.names - UNSENT)} must be its path, query and body "
                f"fields {sorted(wired)} (and a read is needed)"
            )
        if any(needs.when not in (None, *signature.names) for needs in self.needs):
            raise TypeError(f"{self.operation_id}: needs.when names no parameter")
        object.__setattr__(self, "_method", _method_of(self, signature))

    # -- both sides -----------------------------------------------------------------------

    def roles_needed(self, body: Mapping[str, Any]) -> frozenset[str]:
        needed = {self.role} if self.role else set()
        if self.role_if is not None and body.get(self.role_if[0]) is True:
            needed.add(self.role_if[1])
        return frozenset(needed)

    def path_params(self) -> list[str]:
        return list(self._params)

    # -- the client side --------------------------------------------------------------------

    def target(self, arguments: Mapping[str, Any]) -> str:
        """The request's path and query: each path parameter percent-encoded as one
        segment; a query parameter that is None or false is left out (false is every
        boolean parameter's default)."""
        path = self.path
        for name in self._params:
            path = path.replace(f"{{{name}}}", urllib.parse.quote(str(arguments[name]), safe=""))
        pairs = []
        for field in self.query:
            value = field.encode(arguments[field.name])
            if value is None or value is False:
                continue
            pairs.append((field.name, "true" if value is True else str(value)))
        return f"{path}?{urllib.parse.urlencode(pairs)}" if pairs else path

    def payload(self, arguments: Mapping[str, Any]) -> bytes | None:
        """The request's JSON body (None for a route without one): every member in the
        table's order, as its field encodes it; a None left out where `omit_none` says."""
        if self.body is None:
            return None
        doc: dict[str, Any] = {}
        for field in self.body:
            value = field.encode(arguments[field.name])
            if value is None and field.omit_none:
                continue
            doc[field.name] = value
        return json.dumps(doc, allow_nan=False).encode("utf-8")

    def needs_check(self, arguments: Mapping[str, Any]) -> tuple[Needs, ...]:
        """The capabilities this call relies on, with these arguments."""
        return tuple(needs for needs in self.needs if needs.when is None or arguments[needs.when])

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, instance: Sender, owner: type[Any]) -> Callable[P, R]: ...
    def __get__(self, instance: Sender | None, owner: type[Any]) -> Self | Callable[P, R]:
        if instance is None:
            return self
        if self._method is None:
            raise AttributeError(f"{self.operation_id} binds no Ledger method")
        bound: Callable[P, R] = types.MethodType(self._method, instance)
        return bound

    def __set_name__(self, owner: type[Any], name: str) -> None:
        if self._method is None or self._method.__name__ != name:
            raise TypeError(f"the row {self.operation_id} must be named after the method it binds")
        self._method.__qualname__ = f"{owner.__qualname__}.{name}"


def _method_of(endpoint: Endpoint[Any, R], signature: _Signature) -> Callable[..., R]:
    """The function a row is on its class: the bound method's name, signature and a
    docstring naming the route."""

    def method(sender: Sender, /, *args: Any, **kwargs: Any) -> R:
        return sender._send(endpoint, signature.bind(args, kwargs))

    assert endpoint.binds is not None
    name = endpoint.binds.__name__
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"`{endpoint.method} {endpoint.path}`: {endpoint.summary}."
    method.__signature__ = inspect.signature(endpoint.binds)  # type: ignore[attr-defined]
    return method
