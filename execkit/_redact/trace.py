"""Where each piece of the output came from: phases 1 and 2 traced, phase 3 laid on top.

Phase 3 masks spans of the text as phase 1 left it, but its marks go on top of phase 2's
output, and `redact_tail` needs to know which part of an output came from before the cut.
A `Trace` runs phases 1 and 2 over a text keeping the output as pieces: original offsets
[start, end) and either None (`original[start:end]` kept as it was) or what replaced it
(the marker, or part of one when a later mask cut a marker in two; such a part after the
first has start == end). `extra_masks` maps phase 3's spans to original offsets and
`mask_more` lays them into the pieces; `render` joins them.

`later_phases` is `redact` after phase 1: phase 3 is looked for first, and only when it
finds something (rarely) is phase 2 traced; otherwise phase 2 runs as plain string
replacements (engine.reference_rules), which is most of what redaction costs.

Dense texts. Where credentials are on every line, the work is per match. It is kept to a
scan per rule: a trace lays each rule's masks into its pieces with a bisect each, and the
original offsets of phase 1 and 2 matches (`matches`, which `redact_tail` asks whether a
match crosses the cut) are kept only where a cut needs them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TypeAlias

from execkit._redact.engine import (
    REFERENCE_PASSES,
    SpanList,
    extra_spans,
    find_spans,
    reference_rules,
)
from execkit._redact.gate import Gate, fold
from execkit._redact.words import REDACTED

__all__ = ["Mask", "Piece", "Trace", "later_phases", "mask_more", "output_from", "render"]

# A piece of the output (see the module docstring).
Piece: TypeAlias = tuple[int, int, str | None]
# A mask: where the whole match lies and where the masked part lies, in original offsets.
Mask: TypeAlias = tuple[int, int, int, int]


def _length(piece: Piece) -> int:
    start, end, text = piece
    return end - start if text is None else len(text)


def _sub_piece(piece: Piece, lo: int, hi: int) -> Piece:
    """The part of `piece` that is its output [lo, hi)."""
    start, end, text = piece
    if text is None:
        return (start + lo, start + hi, None)
    if lo == 0 and hi == len(text):
        return piece
    return (start, end, text[:hi]) if lo == 0 else (end, end, text[lo:hi])


def _untouched(pieces: list[Piece]) -> bool:
    """True when `pieces` are one unmasked piece: output and original offsets agree."""
    return len(pieces) == 1 and pieces[0][2] is None and pieces[0][0] == 0


def _masked_whole(piece: Piece, spans: SpanList) -> list[Piece]:
    """`_masked([piece], spans)` for one unmasked piece that starts at 0."""
    out: list[Piece] = []
    kept = 0
    for _, _, start, end in spans:
        if start > kept:
            out.append((kept, start, None))
        out.append((start, end, REDACTED))
        kept = end
    if kept < piece[1]:
        out.append((kept, piece[1], None))
    return out


def _masked(pieces: list[Piece], spans: SpanList) -> list[Piece]:
    """`pieces` with each output span's masked part (sorted, disjoint, non-empty) turned
    into one marker that stands for the original offsets it covers."""
    starts = Trace._offsets(pieces)  # where each piece starts in the output
    find = bisect.bisect_right
    out: list[Piece] = []
    append = out.append
    index = local = 0  # the next output: pieces[index] from its `local`-th character on
    for _, _, start, end in spans:
        holder = find(starts, start) - 1  # the piece the masked part starts in
        if holder > index:  # the pieces before it are kept as they are
            if local:
                piece = pieces[index]
                append(_sub_piece(piece, local, _length(piece)))
                index += 1
                local = 0
            out.extend(pieces[index:holder])
            index = holder
        piece_start, piece_end, text = piece = pieces[index]
        lo = start - starts[index]
        if lo > local:
            append(_sub_piece(piece, local, lo))
        # Covered: the marker stands for the original from where its first character
        # came from to where its last one ended (a marker it cuts into, taken whole).
        first = piece_start + lo if text is None else piece_start if not lo else piece_end
        index = find(starts, end - 1) - 1  # the piece the masked part ends in
        piece_start, piece_end, text = piece = pieces[index]
        local = end - starts[index]
        append((first, piece_start + local if text is None else piece_end, REDACTED))
        if local == _length(piece):
            index += 1
            local = 0
    if local:
        piece = pieces[index]
        append(_sub_piece(piece, local, _length(piece)))
        index += 1
    out.extend(pieces[index:])
    return out


class Trace:
    """Phases 1 and 2 over one text as pieces of output, and the masks of phase 3.

    `matches` (phase 1 and 2 matches in original offsets, for `crosses`) is kept only when
    asked for: mapping each match back costs what masking it does.
    """

    __slots__ = ("_low", "current", "gate", "matches", "original", "phase1", "pieces")

    def __init__(
        self, original: str, gate: Gate | None = None, *, track_matches: bool = True
    ) -> None:
        self.original = original
        self.pieces: list[Piece] = [(0, len(original), None)] if original else []
        self.current = original
        self._low: str | None = None  # fold(current), once asked for
        self.matches: list[Mask] | None = [] if track_matches else None
        self.phase1: tuple[list[Piece], str] = (self.pieces, original)
        self.gate = Gate(original) if gate is None else gate

    # -- offsets

    @staticmethod
    def _offsets(pieces: list[Piece]) -> list[int]:
        starts: list[int] = []
        total = 0
        for piece in pieces:
            starts.append(total)
            total += _length(piece)
        return starts

    def _masks(self, pieces: list[Piece], spans: SpanList) -> list[Mask]:
        """Each output span in original offsets: a start where the character there came
        from, an end where the one before it ended. A marker maps as a whole."""
        if _untouched(pieces):
            return spans  # nothing masked yet: output offsets are the original's
        starts = self._offsets(pieces)
        last = len(pieces) - 1
        after_all = len(self.original)
        find = bisect.bisect_right

        def start_of(at: int) -> int:
            index = find(starts, at) - 1
            if index > last:
                return after_all
            start, _, text = pieces[index]
            return start if text is not None else start + at - starts[index]

        def end_of(at: int) -> int:
            index = find(starts, at - 1) - 1
            start, stop, text = pieces[index]
            return stop if text is not None else start + at - starts[index]

        return [
            (start_of(g_start), end_of(g_end), start_of(m_start), end_of(m_end))
            for g_start, g_end, m_start, m_end in spans
        ]

    # -- phases

    def _replace(self, spans: SpanList) -> None:
        """Mask each output span's masked part (sorted, disjoint), as `re.sub` would."""
        pieces = self.pieces
        if self.matches is not None:
            self.matches.extend(self._masks(pieces, spans))
        out = _masked_whole(pieces[0], spans) if _untouched(pieces) else _masked(pieces, spans)
        self.pieces = out
        original = self.original
        self.current = "".join(
            [original[start:end] if text is None else text for start, end, text in out]
        )
        self._low = None

    def reference_phases(self, secrets: Sequence[str]) -> None:
        """Phase 1 (the literal secrets) and phase 2 (the reference rules)."""
        for secret in secrets:
            current = self.current
            found = current.find(secret)
            if found < 0:
                continue
            spans: SpanList = []
            while found >= 0:
                spans.append((found, found + len(secret), found, found + len(secret)))
                found = current.find(secret, found + len(secret))
            self._replace(spans)
        self.phase1 = (self.pieces, self.current)
        if self.current is not self.original:
            self.gate = Gate(self.current)
        for step in self.gate.open_among(REFERENCE_PASSES):
            if self.current is self.phase1[1]:
                low = self.gate.fold() if step.folded else ""
            else:
                if self._low is None and step.folded:
                    self._low = fold(self.current)
                low = self._low or ""
            spans = find_spans(step, self.current, low, self.gate)
            if spans:
                self._replace(spans)

    def extra_masks(self, secrets: Sequence[str]) -> list[Mask]:
        """Phase 3: what the added shapes mask in the text as phase 1 left it."""
        pieces, text = self.phase1
        spans = extra_spans(text, self.gate, secrets)
        return self._masks(pieces, spans) if spans else []

    def crosses(self, cut: int) -> bool:
        """True when a phase 1 or 2 match runs across original offset `cut`."""
        assert self.matches is not None, "a trace made with track_matches=False"
        return any(start < cut < end for start, end, _, _ in self.matches)

    def pieces_from(self, cut: int) -> list[Piece]:
        """The output pieces that came from original offsets `cut` on (no piece may cross
        it). The rest of a marker that ended at `cut` stays behind with its marker."""
        out: list[Piece] = []
        for start, end, text in self.pieces:
            if text is None:
                if end > cut:
                    out.append((max(start, cut), end, None))
            elif start > cut or (start == cut and end > cut):
                out.append((start, end, text))
        return out


def mask_more(pieces: list[Piece], intervals: list[tuple[int, int]]) -> list[Piece]:
    """`pieces` with each original interval masked: the pieces it touches become one marker
    (a marker it touches is taken whole); overlapping intervals are merged first."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    if _untouched(pieces):
        return _masked_intervals(pieces[0][1], merged)
    out: list[Piece] = []
    append = out.append
    count = len(merged)
    previous = -1  # the interval the last fragment out went to, or -1 (kept as it was)

    def mask(owner: int, start: int, end: int) -> None:
        """Mask a fragment for interval `owner`: one marker with the one before it, if
        that went to the same interval."""
        nonlocal previous
        if owner == previous:
            joined_start, joined_end, _ = out.pop()
            append((joined_start, max(joined_end, end), REDACTED))
        else:
            append((start, end, REDACTED))
        previous = owner

    first = 0  # the first interval that may still touch this piece or a later one
    for piece in pieces:
        start, end, text = piece
        while first < count:
            reach = merged[first][1]
            if reach < start or (reach == start and start < end):
                first += 1
            else:
                break
        if first == count or (merged[first][0] >= end and text is None):
            append(piece)  # no interval touches it (the common case: checked first)
            previous = -1
            continue
        lo, hi = merged[first]
        if text is not None:
            # A marker's later part (start == end) goes with its marker.
            if lo < end and start < hi if start < end else lo < start <= hi:
                mask(first, start, end)
            else:
                append(piece)
                previous = -1
            continue
        position = start
        index = first
        while index < count:
            lo, hi = merged[index]
            if lo >= end:
                break
            if hi > position:
                if lo > position:
                    append((position, lo, None))
                    previous = -1
                    position = lo
                stop = hi if hi < end else end
                mask(index, position, stop)
                position = stop
            if hi > end:
                break
            index += 1
        if position < end:
            append((position, end, None))
            previous = -1
    return out


def _masked_intervals(length: int, merged: list[tuple[int, int]]) -> list[Piece]:
    """`mask_more([(0, length, None)], intervals)`, given the intervals merged: one
    marker for each, the text between them kept."""
    out: list[Piece] = []
    position = 0
    for lo, hi in merged:
        if lo >= length:
            break
        if hi > position:
            if lo > position:
                out.append((position, lo, None))
                position = lo
            end = hi if hi < length else length
            out.append((position, end, REDACTED))
            position = end
        if hi > length:
            break
    if position < length:
        out.append((position, length, None))
    return out


def render(pieces: list[Piece], original: str) -> str:
    if len(pieces) == 1 and pieces[0] == (0, len(original), None):
        return original
    return "".join([original[start:end] if text is None else text for start, end, text in pieces])


def output_from(pieces: list[Piece], at: int) -> list[Piece]:
    """The pieces from output offset `at` on (the piece holding `at` cut there)."""
    out: list[Piece] = []
    position = 0
    for piece in pieces:
        size = _length(piece)
        if position + size > at:
            lo = max(0, at - position)
            out.append(piece if lo == 0 else _sub_piece(piece, lo, size))
        position += size
    return out


def later_phases(text: str, secrets: Sequence[str]) -> str:
    """Phases 2 and 3 over `text` as phase 1 left it (`secrets` as front.literal_secrets
    gives them, for their JSON-escaped forms): a text whose gate finds no anchor is done;
    when phase 3 finds nothing (almost always), phase 2 runs as plain string replacements;
    when it finds something, phase 2 runs traced, so that phase 3's spans, which are
    offsets in phase 1's output, can be laid on top of phase 2's."""
    gate = Gate(text)
    if gate.empty:
        return text
    extra = extra_spans(text, gate, secrets)
    if not extra:
        return reference_rules(text, gate)
    trace = Trace(text, gate, track_matches=False)
    trace.reference_phases(())
    pieces = mask_more(trace.pieces, [(start, end) for _, _, start, end in extra])
    return render(pieces, text)
