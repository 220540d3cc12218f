"""The case fold and the anchor gate: which passes can match a text at all, and where.

Folded patterns. A case-insensitive rule runs as a lowered, case-sensitive pattern on
`fold(text)`: the text lowered after mapping U+0130 (İ), U+0131 (ı) and U+017F (ſ) to
`i`, `i` and `s`. The fold has the text's length (U+0130 is the one code point `lower()`
turns into two), so offsets carry over, and it is exactly what IGNORECASE sees: `re`
matches an ASCII letter to its two cases, U+212A KELVIN SIGN (for k, which `lower()`
maps to `k`), U+0130 and U+0131 (for i) and U+017F (for s), and to nothing else; a digit
or punctuation only to itself; and lowering keeps what is a word character, whitespace
or a newline. tests/test_redact.py checks each of these facts, and each character class
of the folded patterns, against every code point.

Anchors. A pass runs at all only where its anchors occur: it lists literals that every
match of it contains (in groups, each of which must be represented), and a substring
search over the text (or the fold, for a folded anchor) decides. The check is exact, for
every code point: a case-sensitive pattern can only match its literals as written, in the
string it runs on. The marker contains no anchor and no anchor contains a bracket, so
masking never creates one: one look at the text serves every pass.

Long texts. On a text of more than `EAGER_CHARS` characters, anchors are looked for one at
a time, each at most once, and a literal with a character the text lacks is settled by
that character alone. A `lead` pass (its pattern opens with its anchor) is not looked for
at all beyond its characters: the engine's own search for it costs the same, so looking
first would only search twice. The fold of a long text outside ASCII is built a piece at a
time, so that its copies stay small: what it costs is one string of the text's size.

Under the compiled engine (scan.py), every anchor of a text of any length is looked for
at once, in one scan: the gate then knows them all, as it knows a short text's.

Chunks. Under the compiled engine a text of `CHUNKED_FROM` characters or more is scanned
once more, a chunk at a time (about `CHUNK_CHARS` characters, each ending just after a
newline), for its anchors of three characters or more, so the gate knows which of those
each chunk holds (`regions`; a shorter anchor is in nearly every chunk, and counts as in
each when the text holds it). No anchor holds a newline, so an anchor occurs in a chunk
exactly when an occurrence of it in the text lies in that chunk. A pass whose
matches never run over a newline can only match on a line that holds a member of each
of its anchor groups (a match holds them, or, for a `nearby` shape, its line does before
it): it need not look at chunks that lack one (engine.py). On a long text, the anchor
of a rule that matched nothing was mostly chance (`NRAL` inside a random token): its
pattern then reads a few chunks instead of the whole text.

Named passes start only a few characters before a name word with a `:` or `=` soon after
it on its line; `name_starts` finds those places (once per text, through its gate).
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from execkit._redact import scan
from execkit._redact.record import Anchor
from execkit._redact.words import NAME_STARTS

__all__ = [
    "ANCHORS",
    "CHUNKED_FROM",
    "CHUNK_CHARS",
    "EAGER_CHARS",
    "FOLD_FIXES",
    "FOLD_PIECE",
    "Gate",
    "Opening",
    "anchor_ids",
    "fold",
    "line_chunks",
    "name_starts",
]

# Code points outside ASCII that IGNORECASE pairs with an ASCII letter and that `lower()`
# does not turn into it (U+212A KELVIN SIGN lowers to "k" already). Found by scanning all
# of Unicode; tests/test_redact.py checks the table is complete.
FOLD_FIXES = (("\u0130", "i"), ("\u0131", "i"), ("\u017f", "s"))

# A long text outside ASCII is folded this many characters at a time: each piece's copies
# are small and reused, so the fold costs one string of the text's size, not one per fix.
FOLD_PIECE = 1 << 18


def fold(text: str) -> str:
    """`text` lowered so that whatever a case-insensitive pattern matches to an ASCII
    literal reads as that literal in lower case (see the module docstring)."""
    if text.isascii():
        return text.lower()
    if len(text) <= FOLD_PIECE:
        return _fold_piece(text)
    piece = FOLD_PIECE
    return "".join([_fold_piece(text[at : at + piece]) for at in range(0, len(text), piece)])


def _fold_piece(text: str) -> str:
    for char, letter in FOLD_FIXES:
        if char in text:
            text = text.replace(char, letter)
    return text.lower()


# Every anchor of every pass once, numbered (`anchor_ids`): a gate keeps one flag each.
ANCHORS: list[Anchor] = []
_ANCHOR_IDS: dict[Anchor, int] = {}


def anchor_ids(anchors: tuple[tuple[Anchor, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """The groups of a pass's anchors as anchor numbers, numbering new anchors."""
    for group in anchors:
        for anchor in group:
            if anchor not in _ANCHOR_IDS:
                _ANCHOR_IDS[anchor] = len(ANCHORS)
                ANCHORS.append(anchor)
    return tuple(tuple(_ANCHOR_IDS[anchor] for anchor in group) for group in anchors)


# Characters by how rarely logs hold them (a guess: it orders the checks, nothing more).
_COMMON = " etaoinsrhldcumfpgwybvkxjqz0123456789-_.:/=\n"
# Per literal looked for: its distinct characters, the rarest first (`_rarest_first`).
_RAREST_FIRST: dict[str, tuple[str, ...]] = {}


def _rarest_first(literal: str) -> tuple[str, ...]:
    found = _RAREST_FIRST.get(literal)
    if found is None:
        found = _RAREST_FIRST[literal] = tuple(sorted(set(literal), key=_rarity))
    return found


def _rarity(char: str) -> int:
    at = _COMMON.find(char.lower())
    common = len(_COMMON) if at < 0 else at
    return -common - (100 if char.isupper() else 0)  # an upper-case letter is rarer still


# Up to this length a gate looks for all anchors up front (argv items, error messages).
EAGER_CHARS = 2048

# Under the compiled engine, a text this long or longer is scanned in chunks of about
# `CHUNK_CHARS` characters (each a scan call; a chunk reports each anchor it holds once,
# a Python call each: some 60 per chunk of a log full of credentials).
CHUNK_CHARS = 1 << 15
CHUNKED_FROM = 4 * CHUNK_CHARS
# A pass whose chunks hold more than 1/`_WHOLE_SHARE` of the text searches it whole.
_WHOLE_SHARE = 2


def line_chunks(text: str, size: int) -> list[tuple[int, int]]:
    """[start, end) of consecutive chunks of `text`, each ending just after the first
    newline at or after `size` characters into it (the last one at the text's end)."""
    chunks: list[tuple[int, int]] = []
    start, length = 0, len(text)
    while start < length:
        newline = text.find("\n", start + size - 1)
        end = length if newline < 0 else newline + 1
        chunks.append((start, end))
        start = end
    return chunks


@functools.cache
def _short_anchors(count: int) -> int:
    """The bits of the first `count` anchors that chunks are not scanned for."""
    return sum(
        1 << index
        for index, (literal, _) in enumerate(ANCHORS[:count])
        if len(literal) < scan.CHUNK_ANCHOR_CHARS
    )


@functools.cache
def _newline_anchor(count: int) -> bool:
    """Whether one of the first `count` anchors holds a newline (none does: chunks rely
    on it, and check it for each table)."""
    return any("\n" in literal for literal, _ in ANCHORS[:count])


class Opening(Protocol):
    """What the gate reads of a pass (engine.py's `Pass`): its anchor groups, as anchor ids
    and as bit masks, and whether its own search opens with its anchor."""

    @property
    def groups(self) -> Sequence[Sequence[int]]: ...

    @property
    def masks(self) -> Sequence[int]: ...

    @property
    def lead(self) -> bool: ...


_O = TypeVar("_O", bound=Opening)

# `Gate.open_among`'s memory: per (passes, anchors found), the passes that open. A text
# whose anchors were all looked for opens the passes its anchors decide, and texts of one
# kind (request keys, ids, messages) hold the same few sets of anchors.
_OPEN_BY_ANCHORS: dict[tuple[int, int], tuple[Sequence[Any], tuple[Any, ...]]] = {}
_OPEN_BY_ANCHORS_MAX = 4096  # sets remembered; past it, the memory starts again


class Gate:
    """Which anchors occur in one text; each is looked for at most once."""

    __slots__ = ("_bits", "_chars", "_chunk_bits", "_chunks", "_low", "_names", "_state", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._low: str | None = None
        self._names: list[int] | None = None  # where a name can start in the fold, once
        self._state: list[int] = []  # per anchor id: -1 not looked for yet, 0 absent, 1 found
        self._chars: dict[tuple[str, bool], bool] = {}  # (character, in the fold): present
        self._bits = 0  # bit i set: anchor i found (a short text's anchors, all looked for)
        self._chunks: list[tuple[int, int]] = []  # a long text's chunks, under Hyperscan
        self._chunk_bits: list[int] = []  # per chunk, its `_bits`
        found = scan.scanner(ANCHORS)
        if found is not None:
            # The compiled engine: every anchor looked for in one scan, whatever the length;
            # a long text's a chunk at a time, which also says where its longer ones are.
            chunks = (
                line_chunks(text, CHUNK_CHARS)
                if len(text) >= CHUNKED_FROM and not _newline_anchor(len(ANCHORS))
                else []
            )
            if len(chunks) < 2:
                self._bits = found.bits(text, scan.ascii_bytes(text), self.fold)
            else:
                self._scan_chunks(found, chunks)
            return
        if len(text) > EAGER_CHARS:
            self._state = [-1] * len(ANCHORS)
            return
        # A short text: looking for every anchor at once costs less than deciding which.
        low = self._low = fold(text)
        bits = 0
        for bit, (literal, folded) in enumerate(ANCHORS):
            if literal in (low if folded else text):
                bits |= 1 << bit
        self._bits = bits

    @property
    def empty(self) -> bool:
        """True when the text is short and holds no anchor at all."""
        return not self._state and not self._bits

    def open_among(self, passes: tuple[_O, ...]) -> tuple[_O, ...]:
        """The passes of `passes` that `opens`, in order. When every anchor was looked for
        (a short text, or any text under Hyperscan) the answer depends only on which were
        found, and is remembered for them: hundreds of passes are not asked one by one
        again for each key or message of the same kind."""
        # A list made and then frozen, not a generator: one call, where a generator is
        # resumed once a pass (tests count the calls of the work after a process exits).
        if self._state:
            return tuple([step for step in passes if self.opens(step)])
        key = (id(passes), self._bits)
        held = _OPEN_BY_ANCHORS.get(key)
        if held is not None and held[0] is passes:  # not another tuple at a reused id
            opening: tuple[_O, ...] = held[1]
            return opening
        opening = tuple([step for step in passes if self.opens(step)])
        if len(_OPEN_BY_ANCHORS) >= _OPEN_BY_ANCHORS_MAX:
            _OPEN_BY_ANCHORS.clear()
        _OPEN_BY_ANCHORS[key] = (passes, opening)
        return opening

    def opens(self, step: Opening) -> bool:
        """True when each of the pass's anchor groups has a member in the text. For a
        `lead` pass on a long text, True can mean only that their characters are there:
        its own search decides. False always means the pass cannot match."""
        if not self._state:
            bits = self._bits
            for mask in step.masks:  # noqa: SIM110 - a loop, not a generator: it runs per pass
                if not bits & mask:
                    return False
            return True
        state = self._state
        if step.lead:
            # The pattern's own search costs what a full look would (see `Pass`): only
            # the characters are looked for, which is cheap and decides most texts.
            return all(
                any(
                    state[anchor] > 0 or (state[anchor] < 0 and self._has_chars(anchor))
                    for anchor in group
                )
                for group in step.groups
            )
        for group in step.groups:
            for anchor in group:
                found = state[anchor]
                if found < 0:
                    found = state[anchor] = self._look(anchor)
                if found:
                    break
            else:
                return False
        return True

    def _scan_chunks(self, found: scan.Scanner, chunks: list[tuple[int, int]]) -> None:
        """The anchors of a long text, one scan a chunk (`chunk_bits`: never the whole
        text encoded at once; no anchor holds a newline, so none lies across a chunk's
        end), and which of the longer ones each chunk holds; a shorter one counts as held
        by every chunk when the text holds it (`regions` may then search more than it
        need, never less)."""
        per_chunk = found.chunk_bits(self._text, self.fold, chunks)
        self._bits = functools.reduce(operator.or_, per_chunk, 0)
        short = _short_anchors(len(ANCHORS))
        everywhere = self._bits & short
        self._chunks = chunks
        self._chunk_bits = [bits & ~short | everywhere for bits in per_chunk]

    def regions(self, step: Opening) -> list[tuple[int, int]] | None:
        """Where in the text a pass that never matches over a newline can match: the runs
        of consecutive chunks that each hold a member of each of its anchor groups (whole
        lines, in order), or None when the text was not scanned in chunks or those runs
        hold more than half of it (a search of the whole text then costs no more)."""
        per_chunk = self._chunk_bits
        if not per_chunk:
            return None
        masks = step.masks
        runs: list[tuple[int, int]] = []
        covered = 0
        last_end = -1
        for (start, end), bits in zip(self._chunks, per_chunk, strict=True):
            for mask in masks:
                if not bits & mask:
                    break
            else:
                covered += end - start
                if start == last_end:
                    runs[-1] = (runs[-1][0], end)
                else:
                    runs.append((start, end))
                last_end = end
        if covered * _WHOLE_SHARE > len(self._text):
            return None
        return runs

    def _look(self, anchor: int) -> int:
        if not self._has_chars(anchor):
            return 0
        literal, folded = ANCHORS[anchor]
        return 1 if len(literal) == 1 or literal in (self.fold() if folded else self._text) else 0

    def _has_chars(self, anchor: int) -> bool:
        """Whether the text holds every character of the anchor (not yet the anchor)."""
        return self.may_hold(*ANCHORS[anchor])

    def may_hold(self, literal: str, folded: bool) -> bool:
        """False when the text (its fold, if `folded`) lacks a character of `literal`, so
        that it cannot hold it; True says only that every character is there."""
        text = self.fold() if folded else self._text
        # Looking for one character is a memchr that stops at its first occurrence, and a
        # literal with a character the text lacks cannot occur: its rarest characters
        # first save most of the full searches a long text would cost.
        chars = self._chars
        for char in _rarest_first(literal):
            key = (char, folded)
            found = chars.get(key)
            if found is None:
                found = chars[key] = char in text
            if not found:
                return False
        return True

    @property
    def text(self) -> str:
        return self._text

    def fold(self) -> str:
        """`fold` of the text, computed once."""
        if self._low is None:
            self._low = fold(self._text)
        return self._low

    def name_starts(self, low: str) -> list[int]:
        """`name_starts(low)`, computed once when `low` is this text's fold."""
        if low is not self._low:
            return name_starts(low)
        if self._names is None:
            self._names = name_starts(low)
        return self._names


# How far back from a name word its name can start, and how far past the word its
# separator can be at most (the rest of `secret_key`, an escaped quote, 8 blanks, `:`).
_NAME_BACK = max(offset for _, offsets in NAME_STARTS for offset in offsets)
_NAME_REACH = 16


@functools.cache
def _name_finders() -> tuple[tuple[re.Pattern[str], tuple[int, ...]], ...]:
    # A literal first, so the engine skips ahead with a substring search.
    reach = f"(?=[^:=\\n]{{0,{_NAME_REACH - 1}}}+[:=])"
    return tuple((re.compile(re.escape(word) + reach), offsets) for word, offsets in NAME_STARTS)


def name_starts(low: str) -> list[int]:
    """Where in the fold `low` a match of a named pattern can start, in order: a few
    characters before a name word with a `:` or `=` soon after it on its line. (No name
    word overlaps itself, so one search per word finds each.)"""
    candidates: list[list[int]] = []
    for finder, offsets in _name_finders():
        found = [word.start() for word in finder.finditer(low)]
        if found:
            candidates.extend(
                [at - offset for at in found] if offset else found for offset in offsets
            )
    if len(candidates) == 1:
        return candidates[0]  # one word, in order, each once: as it is
    starts = set().union(*candidates)
    for before_text in range(-_NAME_BACK, 0):
        starts.discard(before_text)
    return sorted(starts)
