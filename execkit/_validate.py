"""attrs validators for execkit's value types: attrs' own, composed, plus the checks it lacks.

`checked(allowed, *validators)` runs attrs validators (`ge`, `le`, `in_`, `instance_of`,
`deep_iterable`, ...) and the few below, and turns whatever they raise into one
`InvalidInput` naming the field and what it allows:

    number: int = attrs.field(validator=checked("an integer >= 1", integer, ge(1)))

so every value type refuses bad input the same way, with the same words, and no value type
writes a check out by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard

import attrs

from execkit._errors import InvalidInput

__all__ = [
    "checked",
    "finite",
    "integer",
    "integer_arg",
    "is_integer",
    "is_number",
    "non_blank",
    "number_arg",
    "opt_checked",
    "truth",
]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def is_integer(value: object) -> TypeGuard[int]:
    """An int that is not a bool (`True` is an int to Python, never a count to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float that is not a bool: JSON has no NaN or Infinity to store."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def integer(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: `is_integer`."""
    if not is_integer(value):
        raise TypeError(f"{attribute.name}: not an integer")


def finite(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: `is_number`."""
    if not is_number(value):
        raise TypeError(f"{attribute.name}: not a finite number")


def truth(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Exactly True or False: anything truthy could otherwise lift a stop."""
    if not isinstance(value, bool):
        raise TypeError(f"{attribute.name}: not a bool")


def non_blank(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A str with something other than whitespace in it."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{attribute.name}: blank")


def checked(allowed: str, *validators: Validator) -> Validator:
    """All of `validators`, in order, each failure reported as `InvalidInput` naming the
    field.

    The message is `"{field} must be {allowed}, got {value!r}"`, whichever check failed.
    The validators are called from one loop (not through `attrs.validators.and_`): every
    value type's fields pass through here, and `db check` builds one `Attempt` a run.
    """
    return _checked(allowed, tuple(validators), optional=False)


def opt_checked(allowed: str, *validators: Validator) -> Validator:
    """`checked` for an optional field: None passes, anything else must be `allowed`."""
    return _checked(f"{allowed} or None", tuple(validators), optional=True)


def _checked(allowed: str, validators: tuple[Validator, ...], *, optional: bool) -> Validator:
    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if optional and value is None:
            return
        try:
            for validator in validators:
                validator(inst, attribute, value)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidInput):
                raise
            raise InvalidInput(
                f"{attribute.name} must be {allowed}, got {_shown(value)}", field=attribute.name
            ) from None

    return check


def integer_arg(name: str, value: object, low: int | None = None, high: int | None = None) -> int:
    """`value` as an argument that must be an integer in low..high (either bound optional).

    The check functions and methods share with the value types: `InvalidInput` naming
    `name` and the range, for a bool, a float, or a number out of range.
    """
    if (
        not is_integer(value)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        raise InvalidInput(f"{name} must be {_range(low, high)}, got {_shown(value)}", field=name)
    return value


def number_arg(name: str, value: object, *, allow_zero: bool) -> float:
    """`value` as an argument that must be a finite number > 0 (or >= 0 with `allow_zero`)."""
    bound = ">= 0" if allow_zero else "> 0"
    if not is_number(value) or value < 0 or (value == 0 and not allow_zero):
        raise InvalidInput(
            f"{name} must be a finite number of seconds {bound}, got {_shown(value)}", field=name
        )
    return float(value)


def _range(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"an integer between {low} and {high}"
    if low is not None:
        return f"an integer >= {low}"
    if high is not None:
        return f"an integer <= {high}"
    return "an integer"


def _shown(value: object) -> str:
    # A huge value (a 1 MB string) must not make a huge error message.
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def fields_in_order(cls: type, names: tuple[str, ...], built_by: str) -> None:
    """ImportError unless `cls`'s attrs fields are `names`, in that order: for code that
    builds `cls` positionally (`built_by`, to skip its validators on rows the ledger wrote),
    so a field added or moved there fails at import, not as a wrong value."""
    found = tuple(field.name for field in attrs.fields(cls))
    if found != names:  # pragma: no cover
        raise ImportError(f"{cls.__name__}'s fields are {found}, not {names}: {built_by}")
