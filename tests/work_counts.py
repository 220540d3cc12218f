"""Work measured as counts, never as time: what a test may bound on a busy machine.

`make test` asserts no duration (a loaded 2-core CI machine makes any timing flaky); the
wall-clock figures live in benchmarks/. What a test bounds instead:

- `python_lines(fn)`: the Python lines executed while `fn` runs (sys.settrace), callees
  included. For code whose loops are in Python it *is* the work, and it is the same number
  on every run.
- `c_calls(fn)`: the calls into C functions (sys.setprofile), by name: how many regex
  searches, decodes or finds a piece of code makes. A count that grows with the input's
  length where it should not is a loop that became quadratic.
- `nested_unbounded_repeats(pattern)`: the structural cause of super-linear backtracking
  in a regular expression: an unbounded repeat inside another unbounded repeat, unless the
  inner one is possessive or atomic. CPython's `re` counts no steps, so this is checked on
  the pattern itself.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator

# The parser of CPython's own `re` (its internal name changed in 3.11: sre_parse before).
from re import _parser as sre_parse
from types import FrameType
from typing import Any

__all__ = ["c_calls", "nested_unbounded_repeats", "python_lines"]

_MAXREPEAT = sre_parse.MAXREPEAT
_REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT}
_POSSESSIVE = getattr(sre_parse, "POSSESSIVE_REPEAT", None)
_ATOMIC = getattr(sre_parse, "ATOMIC_GROUP", None)


def python_lines(fn: Callable[[], Any]) -> int:
    """How many Python lines run while `fn()` runs (its callees included)."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


def c_calls(fn: Callable[[], Any]) -> Counter[str]:
    """The calls into C functions made while `fn()` runs, counted by qualified name
    (`Pattern.finditer`, `str.find`, `bytes.decode`...)."""
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            calls[getattr(arg, "__qualname__", repr(arg))] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return calls


def _unbounded(op: Any, av: Any) -> bool:
    return op in _REPEATS and av[1] == _MAXREPEAT


def _items(subpattern: Any) -> Iterator[tuple[Any, Any]]:
    yield from subpattern.data if hasattr(subpattern, "data") else subpattern


def _children(op: Any, av: Any) -> Iterator[Any]:
    """The sub-patterns directly under one parsed item."""
    if op in _REPEATS or op == _POSSESSIVE:
        yield av[2]
    elif op == sre_parse.SUBPATTERN:
        yield av[-1]
    elif op == _ATOMIC:
        yield av
    elif op == sre_parse.BRANCH:
        yield from av[1]
    elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        yield av[1]
    elif op == sre_parse.GROUPREF_EXISTS:
        yield from (branch for branch in av[1:] if branch is not None)


def nested_unbounded_repeats(pattern: re.Pattern[str] | str) -> list[str]:
    """Each unbounded repeat that sits inside another unbounded repeat and is neither
    possessive nor inside an atomic group, as the regex text of the inner repeat's body:
    `(a+)+`, `(?:\\s*x)*`. Empty for a pattern that cannot backtrack super-linearly that way."""
    source = pattern.pattern if isinstance(pattern, re.Pattern) else pattern
    flags = pattern.flags if isinstance(pattern, re.Pattern) else 0
    found: list[str] = []

    def walk(subpattern: Any, inside_repeat: bool) -> None:
        for op, av in _items(subpattern):
            if op in (_ATOMIC, _POSSESSIVE):
                continue  # no backtracking into it
            unbounded = _unbounded(op, av)
            if unbounded and inside_repeat:
                found.append(str(av[2]))
            for child in _children(op, av):
                walk(child, inside_repeat or unbounded)

    walk(sre_parse.parse(source, flags), False)
    return found
