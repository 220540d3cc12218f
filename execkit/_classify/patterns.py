"""How the classifier's patterns are written, compiled and run: linear time, compiled late.

Every pattern (the text rules in rules.py, the reset times in resets.py) runs on a lowered
copy of the tail with the same length (`lowered`), so match offsets index the original for
evidence. An `Alternative` runs only when one of its keywords occurs in the tail (a
substring search), which keeps the common case to a few fast scans. Alternatives whose
keyword is frequent in logs (`status`, `http`, `error`, `code`) start with that literal so
the engine skips ahead with a prefix search; context that must precede the keyword is a
fixed-width look-behind placed after it. No quantifier is nested and every gap is bounded
(`{0,n}`), so each start position costs constant work: linear time on Python's backtracking
engine (tests/test_classify_properties.py walks every pattern for a nested unbounded repeat).

Patterns compile on first use, never at import (`execkit run` and `execkit classify` start
faster; tests/test_cli_startup.py checks it), once each (`compiled` caches by source). Every
caller goes through this module's `compiled`, looked up on the module, so a test can watch
each pattern the classifier uses.
"""

from __future__ import annotations

import functools
import re
import string

import attrs

FLAGS = re.ASCII | re.MULTILINE
"""The flags of every pattern: ASCII character classes, `^` and `$` at each line."""


@functools.cache
def compiled(source: str) -> re.Pattern[str]:
    """`source` compiled with `FLAGS`, once per process."""
    return re.compile(source, FLAGS)


@attrs.frozen
class Alternative:
    """One way a rule matches: a pattern, run only when one of its keywords is in the tail."""

    keywords: tuple[str, ...]
    source: str

    @property
    def pattern(self) -> re.Pattern[str]:
        """The compiled pattern: compiled on first use, not at import (start-up time)."""
        return compiled(self.source)


@attrs.frozen
class Rule:
    """One row of the documented list (rules.py): its name, its reason, its alternatives."""

    name: str
    # None for a numeric rule: the reason is `http N` from the pattern's `code` group.
    reason: str | None
    alternatives: tuple[Alternative, ...]


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def lowered(text: str) -> str:
    """`text` lowered with every character kept in place (offsets stay valid)."""
    low = text.lower()
    # lower() never drops a character, so equal lengths mean a one-to-one mapping; the rare
    # character that expands (U+0130) falls back to ASCII-only lowering.
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)
