"""What one spawn was asked to do: `SpawnOptions`, checked once, before anything runs.

The three entry points (`spawn`, `spawn_async`, `spawn_cancellable`) keep their public
keyword signatures and build one `SpawnOptions` from them; everything below them reads
that value and nothing else. Building it is where bad arguments are refused, in field
order, each naming the field:

- `TypeError` for a value of the wrong type (`timeout must be a number of seconds, got
  str`): attrs' own validators (`instance_of`, `is_callable`, `optional`) composed by
  `_typed`, which words every failure the same way;
- `InvalidInput` (a ValueError, with `.field`) for a value out of range (`tail_bytes must
  be an integer between 1 and 268435456, got 0`): attrs' `ge`/`gt`/`le` composed by
  `execkit._validate.checked`, the words every execkit value type uses;
- the two checks attrs has no validator for (argv names the bad item's index, env the bad
  name), and the one that spans two fields (`input` with `inherit_stdin=True`), written
  out below.

A value that is accepted is normalised on the way in (argv a tuple, env a private dict,
cwd a str, input bytes), so later code never sees a path object or a str to encode.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, cast

import attrs
from attrs.validators import and_, ge, gt, instance_of, is_callable, le, optional

from execkit._errors import InvalidInput
from execkit._exec.lines import LineHook
from execkit._validate import checked, finite, integer_arg, is_integer

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_KILL_GRACE_S",
    "DEFAULT_TAIL_BYTES",
    "MAX_TAIL_BYTES",
    "POPEN_TYPES",
    "OutputCallback",
    "ProcessStarter",
    "SpawnOptions",
    "int_arg",
]

DEFAULT_HEARTBEAT_S = 60.0
"""How often `spawn` calls its `heartbeat` by default: well inside the ledger's shortest
default lease (300 s), so two missed beats still leave the run its lease."""

DEFAULT_KILL_GRACE_S = 5.0
"""How long a timed-out child has between SIGTERM and SIGKILL unless told otherwise: the
default of every entry point, of `run_agent` and of `execkit run --kill-grace`."""

DEFAULT_TAIL_BYTES = 64 * 1024
"""How much of each stream a spawn keeps unless told otherwise."""

MAX_TAIL_BYTES = 256 * 1024 * 1024
"""The largest `tail_bytes` spawn accepts (each stream's tail is held in memory)."""

OutputCallback = Callable[[bytes], object]
"""Receives each raw chunk of a stream as it arrives (not redacted, not decoded)."""

ProcessStarter: TypeAlias = Callable[..., "subprocess.Popen[bytes]"]
"""How `spawn` starts a process: a callable with `subprocess.Popen`'s signature.

It is called as `start(argv_list, stdin=..., stdout=PIPE, stderr=PIPE, cwd=..., env=...,
start_new_session=True, bufsize=0)` and must return a started `subprocess.Popen[bytes]`
that honours those arguments (real pipes, its own session), or raise OSError when the
program could not be started (its errno, or its type for an OSError without one, becomes
`spawn_errno`). Anything else it raises propagates out of `spawn` unchanged. (Only the
default starter, the real `subprocess.Popen`, is ever also given a `preexec_fn`: see
PR_SET_PDEATHSIG in `execkit._exec.tree.subreaper`.) Where spawns may run at once (under
the `cgroup` and `subreaper` mechanisms, a spawn started while this process runs another
thread or spawn), `env` is never None: it is the environment asked for (or execkit's own)
with the spawn's mark, `EXECKIT_SPAWN`, added; an injected starter gets it as str, the
real Popen as the bytes os.environ holds where none was asked for.
"""

POPEN_TYPES: tuple[type[subprocess.Popen[bytes]]] = (subprocess.Popen,)
"""The real `subprocess.Popen`: the default starter, and the type a starter must return.

In a tuple, not bound to a name of its own: while its fixture is active, pytest-subprocess
(1.6) rebinds every module-level name bound to `subprocess.Popen` itself to its fake."""

_Validator: TypeAlias = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _typed(kind: str, *validators: _Validator) -> _Validator:
    """All of `validators` (attrs' own), a failure raised as `TypeError`: `{field} must be
    {kind}, got {type}`. A wrong type is a programming error, not a value out of range."""
    combined = and_(*validators)

    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        try:
            combined(inst, attribute, value)
        except (TypeError, ValueError):
            raise TypeError(
                f"{attribute.name} must be {kind}, got {type(value).__name__}"
            ) from None

    return check


def _not_bool(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs' `not_(instance_of(bool))`, without the exception that one raises and catches
    for every good value (three of those were most of the cost of checking a spawn)."""
    if isinstance(value, bool):
        raise TypeError(f"{attribute.name}: a bool")


# An int or a float, never a bool. NaN and infinity are floats: a bad value, not a bad type.
_NUMBER: list[_Validator] = [instance_of((int, float)), _not_bool]
_BOOL = _typed("a bool", instance_of(bool))


def _seconds(bound: str, *limits: _Validator) -> _Validator:
    return and_(
        _typed("a number of seconds", *_NUMBER),
        checked(f"a finite number of seconds {bound}", finite, *limits),
    )


def _optional_seconds(bound: str, *limits: _Validator) -> _Validator:
    return and_(
        _typed("a number of seconds", optional(_NUMBER)),
        checked(f"a finite number of seconds {bound}", optional(and_(finite, *limits))),
    )


def int_arg(name: str, value: object, low: int, high: int | None = None) -> int:
    """`integer_arg`, with a value that is no int at all a TypeError: a wrong type, not
    a value out of range, as every argument of spawn reports it."""
    if not is_integer(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return integer_arg(name, value, low, high)


# ------------------------------------------------------------ normalising what is accepted
# Each converter passes a value of the wrong type through untouched, for its field's
# validator to refuse with the usual words.


def _argv_tuple(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else cast("tuple[str, ...]", value)


def _cwd_str(value: str | os.PathLike[str] | None) -> str | None:
    if isinstance(value, str | os.PathLike):
        return os.fsdecode(os.fspath(value))
    return value


def _env_copy(value: Mapping[str, str] | None) -> dict[str, str] | None:
    # A private copy: the caller may change its mapping while the child starts.
    return dict(value) if isinstance(value, Mapping) else value


def _default_beat(value: float | None) -> float:
    return DEFAULT_HEARTBEAT_S if value is None else value


def _input_bytes(value: str | bytes | None) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


# ---------------------------------------------------------- the checks attrs has none for


def _check_argv(_inst: object, _attribute: attrs.Attribute[Any], argv: object) -> None:
    """A list or tuple of str (never one string: it is never re-split), the program first;
    the bad item named by its index."""
    if isinstance(argv, str | bytes):
        raise TypeError(
            "argv must be a list or tuple of str, not a single string "
            "(it is never re-split): pass [program, arg, ...]"
        )
    if not isinstance(argv, tuple):
        raise TypeError(f"argv must be a list or tuple of str, got {type(argv).__name__}")
    if not argv:
        raise InvalidInput("argv must not be empty: it needs at least the program to run")
    for index, item in enumerate(argv):
        if not isinstance(item, str):
            raise TypeError(f"argv[{index}] must be str, got {type(item).__name__}")
        if "\0" in item:
            raise InvalidInput(f"argv[{index}] must not contain a NUL character")
    if not argv[0]:
        raise InvalidInput("argv[0] must be a non-empty program name or path")


def _check_env_items(_inst: object, _attribute: attrs.Attribute[Any], env: object) -> None:
    """Each name and value a str, the bad one named; a name the kernel can carry."""
    if env is None:
        return
    for name, value in cast("dict[object, object]", env).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {name!r}: {type(value).__name__}")
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise InvalidInput(
                f"env name {name!r} must be non-empty without '=' or NUL, and its value without NUL"
            )


def _one_stdin(inst: SpawnOptions, _attribute: attrs.Attribute[Any], inherit: bool) -> None:
    if inherit and inst.input is not None:
        raise InvalidInput(
            "input and inherit_stdin=True exclude each other: the child has one stdin"
        )


def _unless_default(default: object, validator: _Validator) -> _Validator:
    """`validator`, skipped for the field's own default object (that very object, not an
    equal one): it is valid by construction (tests/test_exec.py checks that each default
    passes its field's validator), and most spawns leave most fields at it. Checking
    every field was about a third of the Python work a `spawn(["true"])` does beyond
    `subprocess.run`."""

    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not default:
            validator(inst, attribute, value)

    check.validator = validator  # type: ignore[attr-defined]  # the defaults' test
    return check


@attrs.frozen
class SpawnOptions:
    """The checked arguments of one spawn (see `spawn` for what each one means).

    Raises TypeError or `InvalidInput` naming the field (module docstring). `die_with_parent`
    asks for PR_SET_PDEATHSIG(SIGKILL) on the child (`spawn_cancellable` only).
    """

    argv: tuple[str, ...] = attrs.field(converter=_argv_tuple, validator=_check_argv)
    cwd: str | None = attrs.field(
        default=None,
        converter=_cwd_str,
        validator=_unless_default(None, _typed("a path or None", optional(instance_of(str)))),
    )
    env: dict[str, str] | None = attrs.field(
        default=None,
        converter=_env_copy,
        validator=_unless_default(
            None,
            and_(_typed("a mapping of str to str", optional(instance_of(dict))), _check_env_items),
        ),
    )
    input: bytes | None = attrs.field(
        default=None,
        converter=_input_bytes,
        validator=_unless_default(None, _typed("str, bytes or None", optional(instance_of(bytes)))),
    )
    inherit_stdin: bool = attrs.field(
        default=False, validator=_unless_default(False, and_(_BOOL, _one_stdin))
    )
    timeout: float | None = attrs.field(
        default=None, validator=_unless_default(None, _optional_seconds("> 0", gt(0)))
    )
    kill_grace: float = attrs.field(
        default=DEFAULT_KILL_GRACE_S,
        validator=_unless_default(DEFAULT_KILL_GRACE_S, _seconds(">= 0", ge(0))),
    )
    tail_bytes: int = attrs.field(
        default=DEFAULT_TAIL_BYTES,
        validator=_unless_default(
            DEFAULT_TAIL_BYTES,
            and_(
                _typed("an int", instance_of(int), _not_bool),
                checked(f"an integer between 1 and {MAX_TAIL_BYTES}", ge(1), le(MAX_TAIL_BYTES)),
            ),
        ),
    )
    on_stdout: OutputCallback | None = attrs.field(
        default=None,
        validator=_unless_default(None, _typed("callable or None", optional(is_callable()))),
    )
    on_stderr: OutputCallback | None = attrs.field(
        default=None,
        validator=_unless_default(None, _typed("callable or None", optional(is_callable()))),
    )
    on_line: LineHook | None = attrs.field(
        default=None,
        validator=_unless_default(None, _typed("callable or None", optional(is_callable()))),
    )
    start: ProcessStarter = attrs.field(
        default=subprocess.Popen,
        validator=_unless_default(
            subprocess.Popen, _typed("a callable like subprocess.Popen", is_callable())
        ),
    )
    keep_descendants: bool = attrs.field(default=False, validator=_unless_default(False, _BOOL))
    die_with_parent: bool = attrs.field(default=False, validator=_unless_default(False, _BOOL))
    heartbeat: Callable[[], object] | None = attrs.field(
        default=None,
        validator=_unless_default(None, _typed("callable or None", optional(is_callable()))),
    )
    heartbeat_s: float = attrs.field(
        default=DEFAULT_HEARTBEAT_S,
        converter=_default_beat,
        validator=_unless_default(DEFAULT_HEARTBEAT_S, _seconds("> 0", gt(0))),
    )
    stall_timeout: float | None = attrs.field(
        default=None, validator=_unless_default(None, _optional_seconds("> 0", gt(0)))
    )
