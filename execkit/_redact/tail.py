"""Tails: `redact_tail(tail, context)`, the kept end of a longer text, redacted with the text
just before the cut in view (`cut_tail`, which front.py calls when there is a context).

`context + tail` is redacted once and the part that came from `tail` is kept; a
credential that runs across the cut is masked from the start of the tail through its
end. Its output is the old `redact_tail` (redact the tail alone, and again with the
context; when they differ, mask the differing head) with phase 3 on top, computed without
redacting the tail twice: the two views can only differ near the cut (where a match
crosses it, or where the cut splits a word that could start a key: `BOUNDARY_STARTS`); no
reference rule matches across a newline, so from the tail's first newline on the two
agree, and only then is the tail's first line redacted alone.

No shape matches across a newline but those marked `crosses_lines` (a private key block)
and a literal secret that holds one: unless one may, only `context` and the tail's first
line are traced this way, and the rest of the tail is redacted on its own, as `redact`
would. A first line that is most of the tail is traced with the rest, once, rather than
redacted three times over.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from execkit._redact.gate import fold
from execkit._redact.shapes import BOUNDARY_STARTS, LINE_CROSSING_STARTS
from execkit._redact.text import redact_text
from execkit._redact.trace import Piece, Trace, mask_more, output_from
from execkit._redact.words import REDACTED

__all__ = ["SHORT_HEAD", "cut_tail"]

# `redact_tail` redacts a cut tail's first line apart only when it is at most this
# fraction of the tail (it is redacted three times: with the context, alone, in the tail).
SHORT_HEAD = 8

_WORD_CHAR = re.compile(r"\w")


def cut_tail(tail: str, context: str, secrets: Sequence[str]) -> str:
    """`redact_tail(tail, context)`, `context` not empty and the secrets as
    front.literal_secrets gives them."""
    split = _line_after_cut(context, tail, secrets)
    if split * SHORT_HEAD > len(tail):
        # The first line is most of the tail (or all of it): redacting it twice more
        # would cost more than tracing the whole tail once.
        return _redact_across(tail, context, secrets)
    # Only the first line can see the cut: the tail costs what `redact` costs, without
    # tracing where each piece of its output came from, and its redaction is the first
    # line's followed by the rest's. Where the cut changes nothing in the first line
    # (almost always), that is the answer as it is, not a copy of it.
    head = tail[:split]
    head_out, head_alone = _redact_across(head, context, secrets), redact_text(head, secrets)
    whole = redact_text(tail, secrets)
    if head_out == head_alone:
        return whole
    return head_out + whole[len(head_alone) :]


def _line_after_cut(context: str, tail: str, secrets: Sequence[str]) -> int:
    """Where in `tail` the text starts that is redacted the same with `context` before it
    as on its own: just after the tail's first newline, when no match can run across
    that newline. Only a shape that `crosses_lines` and a literal secret holding a newline
    can; when either may, the whole tail (`len(tail)`)."""
    newline = tail.find("\n")
    if newline < 0 or any("\n" in secret for secret in secrets):
        return len(tail)
    split = newline + 1
    for start in LINE_CROSSING_STARTS:
        reach = len(start) - 1  # an opening cut in two is still one opening
        if (
            start in context
            or start in context[-reach:] + tail[:reach]
            or tail.find(start, 0, split) >= 0
        ):
            return len(tail)
    return split


def _redact_across(tail: str, context: str, secrets: Sequence[str]) -> str:
    """`redact_tail` on phases 1 to 3 (`secrets` as front.literal_secrets gives them)."""
    joined = context + tail
    cut = len(context)
    seen = Trace(joined)
    seen.reference_phases(secrets)
    if seen.crosses(cut) or _may_start_differently(context, tail):
        kept = _reference_tail(seen, tail, cut, secrets)
    else:
        kept = seen.pieces_from(cut)
    intervals: list[tuple[int, int]] = []
    head_end = cut
    for match_start, _, start, end in seen.extra_masks(secrets):
        if end <= cut:
            continue
        if match_start < cut:
            head_end = max(head_end, end)  # it runs across the cut: mask the tail's head
        else:
            intervals.append((start, end))
    if head_end > cut:
        intervals.append((cut, head_end))
    if intervals:
        kept = mask_more(kept, intervals)
    if kept == [(cut, len(joined), None)]:
        return tail  # nothing in it masked: the tail as given, not a copy of it
    return "".join([joined[start:end] if text is None else text for start, end, text in kept])


def _may_start_differently(context: str, tail: str) -> bool:
    """Whether a reference rule could match at the start of `tail` alone but not after
    `context`: only one that checks the character before it, after a word character."""
    return _WORD_CHAR.match(context[-1]) is not None and fold(tail[:16]).startswith(BOUNDARY_STARTS)


def _reference_tail(seen: Trace, tail: str, cut: int, secrets: Sequence[str]) -> list[Piece]:
    """The old rule on phases 1 and 2: redact the tail alone and `context + tail`; keep the
    lone redaction when the joint one ends with it, else mask the head they differ in.

    The two agree after the tail's first newline (no reference rule matches across one,
    and each restarts there), so only the first line is redacted alone. A literal secret
    holding a newline could cross it: then the whole tail is.
    """
    newline = tail.find("\n")
    first = len(tail) if newline < 0 or any("\n" in s for s in secrets) else newline + 1
    alone = Trace(tail[:first])
    alone.reference_phases(secrets)
    head = [(start + cut, end + cut, text) for start, end, text in alone.pieces]
    after = seen.pieces_from(cut + first) if first < len(tail) else []
    after_text = "".join(
        seen.original[start:end] if text is None else text for start, end, text in after
    )
    before = seen.current[: len(seen.current) - len(after_text)]
    if before.endswith(alone.current):
        return head + after
    agree = _common_suffix_len(alone.current, before)
    rest = output_from(head, len(alone.current) - agree) + after
    end = rest[0][0] if rest else cut + len(tail)
    return [(cut, max(cut, end), REDACTED), *rest]


def _common_suffix_len(a: str, b: str) -> int:
    agree = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):  # the shorter one bounds it
        if x != y:
            break
        agree += 1
    return agree
