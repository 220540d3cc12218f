"""Reading a text-only CLI's own fixed sentences: the lines it prints in one fixed shape
for one failure (amp, auggie and crush print no JSON on failure).

`first_fixed(text, prefixes)` finds the first line (leading marks such as `❌ ` and
spaces ignored) that starts with one of the `prefixes`: a CLI's fixed sentences are
matched by their fixed start, never searched for inside other text.
"""

from __future__ import annotations

from collections.abc import Sequence

from execkit.adapterkit import ErrorKind

__all__ = ["first_fixed"]

_MARKS = " \t❌✖✗!>*-"


def first_fixed(
    text: str, prefixes: Sequence[tuple[str, ErrorKind]]
) -> tuple[str, ErrorKind] | None:
    """(the line, its kind) for the first line of `text` that starts with a prefix."""
    for raw in text.splitlines():
        line = raw.lstrip(_MARKS)
        for prefix, kind in prefixes:
            if line.startswith(prefix):
                return line.strip(), kind
    return None
