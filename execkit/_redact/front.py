"""The front functions: `redact`, `redact_argv` and `redact_tail`, and what is done before
any rule runs.

Phase 1 (text.py) replaces the literal secrets in a text, longest first; a text then too
short for any pattern is done. The rest (phases 2 and 3, trace.py; a tail with text before its cut,
tail.py) is imported on first use: the table of shapes, its compiled passes and the
attrs classes behind them cost start-up time that a run redacting nothing longer than a
word (`execkit run -- true`) never needs. tests/test_redact.py checks that importing the
package loads none of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

from execkit._redact.text import SHORTEST_MATCH, literal_secrets, redact_text
from execkit._redact.words import REDACTED, SECRET_FLAG_ITEM

__all__ = [
    "SHORTEST_MATCH",
    "literal_secrets",
    "redact",
    "redact_argv",
    "redact_tail",
    "redact_text",
]


@functools.cache
def _cut_tail() -> Callable[[str, str, Sequence[str]], str]:
    from execkit._redact.tail import cut_tail

    return cut_tail


# Short texts recur: JSON keys, states, ids and reasons in every server answer and listing
# line. Their redaction is remembered (a bounded cache, in this process's memory only).
_SHORT = 256


@functools.lru_cache(maxsize=8192)
def _redact_short(text: str) -> str:
    return redact_text(text, ())


def redact(text: str, extra_secrets: Iterable[str] = ()) -> str:
    """`text` with credentials replaced by `[REDACTED]`.

    Masks the literal `extra_secrets` (longest first, so a secret containing another is
    masked whole; empty strings and parts of the marker are ignored), then vendor key
    shapes, then values that follow a secret-sounding name, header or flag, then the
    shapes listed in the package docstring. Idempotent: redacting twice changes nothing
    more.
    """
    if not extra_secrets and len(text) <= _SHORT and type(text) is str:
        return _redact_short(text)
    return redact_text(text, literal_secrets(extra_secrets))


def redact_tail(tail: str, context: str, extra_secrets: Iterable[str] = ()) -> str:
    """`redact(tail)`, where `tail` is what was kept of a longer text and `context` the
    text that came just before it.

    A cut can slice a credential in two: the half inside `tail` no longer looks like one.
    `context + tail` is redacted once; a credential that runs across the cut is masked
    from the start of the tail through its end, and the rest of the tail is kept as that
    one redaction left it (tail.py says how this matches the old two-redaction result).
    """
    secrets = literal_secrets(extra_secrets)
    if not context:
        return redact_text(tail, secrets)
    return _cut_tail()(tail, context, secrets)


# How much of the command line before an argument `redact_argv` reads with it.
_ARGV_CONTEXT = 512


def _in_context(item: str, before: Sequence[str], secrets: Sequence[str]) -> str:
    """`item` redacted with the arguments `before` it in view. An argument is one value:
    where the command line makes a part of it a credential (`-p` and a password with a
    blank in it, which the shell's quotes kept whole), the rest of it is masked too."""
    context = " ".join(before)[-_ARGV_CONTEXT:] + " "
    seen = _cut_tail()(item, context, secrets)
    if REDACTED not in seen or seen == (alone := redact_text(item, secrets)):
        return seen
    head = seen[: seen.index(REDACTED)]
    return head + REDACTED if alone.startswith(head) else seen


def redact_argv(argv: Sequence[str], extra_secrets: Iterable[str] = ()) -> tuple[str, ...]:
    """Each argument redacted, and the argument after a bare secret flag masked whole.

    `["--api-key", "abc"]` stores as `["--api-key", "[REDACTED]"]`: the value stands alone,
    so no in-text pattern could see its name. A flag, and the argument after one, is
    redacted with the command line before it in view (`redact_tail`, the arguments joined
    by blanks): `["mysql", "-uroot", "-pS3cret"]` and `["curl", "-u", "bob:S3cret"]` store
    their last argument as `[REDACTED]` (a match that starts before an argument masks it
    from its start), where each argument alone looks like nothing; what the command line
    makes a credential runs to the end of its argument.
    """
    secrets = literal_secrets(extra_secrets)
    out: list[str] = []
    mask_next = False
    for index, item in enumerate(argv):
        if mask_next and item:
            out.append(REDACTED)
        elif index and item and (item[0] == "-" or argv[index - 1][:1] == "-"):
            out.append(_in_context(item, argv[max(0, index - 16) : index], secrets))
        else:
            out.append(redact_text(item, secrets))
        mask_next = SECRET_FLAG_ITEM.fullmatch(item) is not None
    return tuple(out)
