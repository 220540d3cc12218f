"""One serializer for every value type's JSON wire shape.

`to_json(value)` is `attrs.asdict` with three rules, so no value type writes its own
`to_dict` body:

- enum members become their `.value`, tuples and frozensets become lists, paths strings;
- a field whose metadata has `json_key(...)` is written under that key (the classes keep
  the Python name `failure_class`, the wire says `"class"`);
- a field with `json_key(None)` is left out.

Classes that add derived keys (`ok`, `schema_version`) merge them into this dict.
"""

from __future__ import annotations

import enum
import os
from typing import Any

import attrs

__all__ = ["JSON_KEY", "json_key", "to_json"]

JSON_KEY = "execkit.json_key"

_OMIT = object()


def json_key(name: str | None) -> dict[str, Any]:
    """Field metadata: write the field under `name`, or leave it out (None)."""
    return {JSON_KEY: _OMIT if name is None else name}


def _plain(_inst: object, _field: attrs.Attribute[Any] | None, value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(None, None, item) for item in value]
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _keys(inst: Any, data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in attrs.fields(type(inst)):
        key = field.metadata.get(JSON_KEY, field.name)
        if key is _OMIT:
            continue
        value = data[field.name]
        nested = getattr(inst, field.name)
        if attrs.has(type(nested)):
            value = _keys(nested, value)
        elif isinstance(nested, tuple | list) and nested and attrs.has(type(nested[0])):
            value = [_keys(item, part) for item, part in zip(nested, value, strict=True)]
        out[key] = value
    return out


def to_json(inst: Any) -> dict[str, Any]:
    """The JSON-safe mapping of an attrs instance (see the module docstring)."""
    data = attrs.asdict(inst, value_serializer=_plain)
    return _keys(inst, data)
