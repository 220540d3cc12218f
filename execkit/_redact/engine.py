"""The passes: the table of shapes compiled, and how each finds its matches in one text.

`compile_passes` turns shapes (shapes.py) into passes: one per shape, or one per run of
shapes sharing an `alternation` (their sources `|`-joined in table order). A pass knows its
anchors as numbers (gate.py), what of a match to mask, and how it may be searched for;
its pattern is compiled on first use (start-up time matters). `find_spans` finds what a pass
masks in a text, choosing among ways that all give `pattern.finditer`'s matches:

- a named pass (Search.NAMED) is tried only where a name can start (gate.name_starts),
  or, in a long fold whose samples hold such a place every few dozen characters, scans
  the whole fold once (which finds the same matches as trying it at each start);
- an alternation on a long text is searched for one shape at a time (not at all for a
  shape whose opening literal has a character the text lacks) and the matches merged as
  the alternation takes them, because `re` tries every position of the text for an
  alternation whose shapes begin differently;
- a shape with `nearby` words (the AWS secret key) is searched only in the stretches of
  text after a word on its line, each stretch once;
- a pass of phase 3 that opens with a literal (`opening`), under the compiled engine and
  when at least `_OPENINGS_WORTH` such passes run on a text, is tried only where its
  literal occurs (scan.py's `Openings` finds them all in one scan);
- a pass that opens with a group of words (`branch_openings`: `(?:accountkey|...)`) is
  tried where each word occurs, found by substring search, on a long text;
- any other pass scans the text (or its fold) with its pattern.

`reference_rules` runs phase 2 over a text as plain strings, each pass over the output of
the one before; `extra_spans` finds phase 3's spans in the text as phase 1 left it (the
JSON-escaped forms of the literal secrets, then each added shape). What a long text costs
is a fixed number of substring searches over it and a scan per pass that has matches (or,
for a pass tried where its literal occurs, a try per occurrence), whatever it holds
(tests/test_exec_tree.py bounds the whole post-exit work as a number of decodes of the
same bytes).
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from execkit._redact import scan
from execkit._redact.gate import EAGER_CHARS, Gate, anchor_ids, fold, name_starts
from execkit._redact.record import (
    Anchor,
    Masked,
    Nearby,
    Phase,
    Search,
    Shape,
    opening_literal,
)
from execkit._redact.shapes import SHAPES
from execkit._redact.words import NAME_STARTS, REDACTED

__all__ = [
    "DENSE_SAMPLE",
    "EXTRA_PASSES",
    "REFERENCE_PASSES",
    "Pass",
    "SpanList",
    "alternation_matches",
    "compile_passes",
    "escaped_forms",
    "extra_spans",
    "find_spans",
    "is_placeholder",
    "keep_escapes",
    "line_reach",
    "matches_from",
    "names_dense",
    "reference_rules",
]

# (match start, match end, masked start, masked end) of each match a pass masks.
SpanList = list[tuple[int, int, int, int]]
_Span = Callable[[re.Match[str]], "tuple[int, int] | None"]


def _whole(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span()


def _after_group_1(match: re.Match[str]) -> tuple[int, int] | None:
    start, end = match.end(1), match.end()
    return (start, end) if start < end else None


def _group_1(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span(1)


def _group_2(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span(2)


_SPANS: dict[Masked, _Span] = {
    Masked.MATCH: _whole,
    Masked.AFTER_GROUP_1: _after_group_1,
    Masked.GROUP_1: _group_1,
    Masked.GROUP_2: _group_2,
}


class Pass:
    """One pattern (one shape's, or an alternation of shapes'), the anchors every match of
    it contains, and what of a match to mask.

    A `folded` pass runs on `fold(text)` (its source is lowered and case-sensitive); the
    others run on the text as it is. A `lead` pass's pattern opens with its anchor, so the
    engine's own search for it costs no more than the gate's: on a long text it runs
    without asking the gate. `alternatives` (the sources whose alternation is the pattern,
    in its order) each open with a literal: on a long text they are searched for one by
    one, which is a substring search each, where the alternation would try every position.
    """

    __slots__ = (
        "_alternatives",
        "_pattern",
        "alternative_leads",
        "alternative_sources",
        "anchors",
        "folded",
        "groups",
        "lead",
        "masks",
        "name",
        "named",
        "nearby",
        "phase",
        "placeholders",
        "reads_fold",
        "shapes",
        "source",
        "span",
    )

    def __init__(self, shapes: Sequence[Shape]) -> None:
        first = shapes[0]
        self.shapes = tuple(shapes)
        self.name = first.alternation or first.name
        _check_alike(self.name, self.shapes)
        self.phase = first.phase
        self.named = first.search is Search.NAMED  # tried only where a name can start
        self.nearby: Nearby | None = first.nearby
        if self.nearby is not None and first.masked is not Masked.MATCH:
            raise ValueError(f"{self.name}: a token found near a word is masked whole")
        sources = tuple(shape.pattern for shape in shapes)
        self.alternative_sources = sources if len(sources) > 1 else ()
        self.lead = first.search is Search.LEAD or bool(self.alternative_sources)
        # The literal each alternative opens with: one the text cannot hold rules it out.
        self.alternative_leads = tuple(map(opening_literal, self.alternative_sources))
        self._alternatives: tuple[re.Pattern[str], ...] | None = None
        self._pattern: re.Pattern[str] | None = None
        self.source = "|".join(sources)
        # An alternation's anchors: one group, every member's literals (each member has one).
        self.anchors: tuple[tuple[Anchor, ...], ...] = (
            first.anchors
            if len(shapes) == 1
            else (tuple(dict.fromkeys(a for shape in shapes for a in shape.anchors[0])),)
        )
        self.folded = first.folded
        # What the pass reads in the fold: its pattern's subject, or its anchors.
        self.reads_fold = self.folded or any(f for group in self.anchors for _, f in group)
        self.groups = anchor_ids(self.anchors)
        self.masks = tuple(sum(1 << anchor for anchor in group) for group in self.groups)
        self.span = _SPANS[first.masked]
        self.placeholders = first.placeholders  # a placeholder value is kept (is_placeholder)

    @property
    def pattern(self) -> re.Pattern[str]:
        if self._pattern is None:
            self._pattern = re.compile(self.source)
        return self._pattern

    @property
    def alternatives(self) -> tuple[re.Pattern[str], ...]:
        if self._alternatives is None:
            self._alternatives = tuple(map(re.compile, self.alternative_sources))
        return self._alternatives


def _check_alike(name: str, shapes: tuple[Shape, ...]) -> None:
    """An alternation's shapes run as one pattern: they must agree on all but it."""
    first = shapes[0]
    for shape in shapes[1:]:
        for fact in (
            "phase", "masked", "folded", "search", "nearby", "crosses_lines", "placeholders",
        ):  # fmt: skip
            if getattr(shape, fact) != getattr(first, fact):
                raise ValueError(f"alternation {name}: {shape.name} differs in {fact}")
    if len(shapes) > 1 and any(len(shape.anchors) != 1 for shape in shapes):
        raise ValueError(f"alternation {name}: each shape needs exactly one anchor group")


def compile_passes(shapes: Iterable[Shape]) -> tuple[Pass, ...]:
    """A pass per shape, or per run of adjacent shapes sharing an `alternation`, in order."""
    runs: list[list[Shape]] = []
    for shape in shapes:
        joins = runs and shape.alternation and runs[-1][0].alternation == shape.alternation
        if joins:
            runs[-1].append(shape)
        else:
            runs.append([shape])
    names = [run[0].alternation or run[0].name for run in runs]
    for run in runs:
        if run[0].alternation is not None and names.count(run[0].alternation) > 1:
            raise ValueError(f"alternation {run[0].alternation}: its shapes are not adjacent")
    if len(set(names)) != len(names):
        raise ValueError(f"two passes share a name: {sorted(names)}")
    return tuple(Pass(run) for run in runs)


# Phase 2, in the reference order; phase 3, each over the text as phase 1 left it.
REFERENCE_PASSES = compile_passes(shape for shape in SHAPES if shape.phase is Phase.REFERENCE)
EXTRA_PASSES = compile_passes(shape for shape in SHAPES if shape.phase is Phase.ADDED)


def escaped_forms(secret: str) -> tuple[str, ...]:
    """How `secret` reads inside a JSON string, where that differs from the secret."""
    if secret.isascii() and secret.isprintable() and '"' not in secret and "\\" not in secret:
        return ()
    import json  # only a secret with quotes, backslashes or non-ASCII needs it

    forms = {json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    return tuple(form for form in forms if form != secret and form not in REDACTED)


# A pass whose every match opens with a literal of this many characters or more may be
# tried only where the literal occurs (a shorter one, `sk`, `gl`, occurs about once a KiB
# in random text: each occurrence costs Python calls, where its pass's own scan costs one
# call); one `Openings` scan pays for itself once this many such passes run on a text
# (each would scan it, about as long as that one scan takes).
_OPENING_CHARS = 3
_OPENINGS_WORTH = 3


@functools.cache
def opening(source: str) -> str:
    """The literal every match of the pattern `source` opens with: the plain characters
    it starts with, as `re`'s own parser reads them (each one character, matched once and
    as written: no group, class, repeat or flag), '' when it opens with anything else."""
    from re import _constants, _parser

    parsed = _parser.parse(source)
    if parsed.state.flags & _constants.SRE_FLAG_IGNORECASE:
        return ""
    chars: list[str] = []
    for op, value in parsed:
        if op is not _constants.LITERAL:
            break
        chars.append(chr(value))
    return "".join(chars)


# A pass that opens with a choice of words is searched for each word when every word has
# this many characters or more (shorter ones would be tried too often to gain).
_BRANCH_CHARS = 4


@functools.cache
def branch_openings(source: str) -> tuple[str, ...]:
    """The literals every match of the pattern `source` opens with one of, when it opens
    with a choice (in a group or not) whose every alternative opens with a literal of
    `_BRANCH_CHARS` characters or more, as `re`'s own parser reads it (sorted, two or
    more); () when it opens otherwise, or with any flag."""
    from re import _constants, _parser

    def openings(items: Any) -> set[str] | None:
        if not len(items):
            return None
        op, value = items[0]
        if op is _constants.LITERAL:
            run: list[str] = []
            for item_op, item_value in items:
                if item_op is not _constants.LITERAL:
                    break
                run.append(chr(item_value))
            return {"".join(run)}
        if op is _constants.SUBPATTERN:
            _, added, removed, inner = value
            return None if added or removed else openings(inner)
        if op is _constants.BRANCH:
            found: set[str] = set()
            for alternative in value[1]:
                more = openings(alternative)
                if not more:
                    return None
                found |= more
            return found
        return None

    parsed = _parser.parse(source)
    if parsed.state.flags & _constants.SRE_FLAG_IGNORECASE:
        return ()
    literals = openings(parsed)
    if not literals or len(literals) < 2 or min(map(len, literals)) < _BRANCH_CHARS:
        return ()  # one literal: `re` searches for it itself (a group's prefix included)
    return tuple(sorted(literals))


def _opens_with_a_literal(step: Pass) -> bool:
    return (
        step.lead
        and not step.alternative_sources
        and not step.folded
        and not step.named
        and step.nearby is None
    )


@functools.cache
def _opening_literals() -> tuple[str, ...]:
    """Every phase 3 pass's opening literal long enough to look for, once each, sorted
    (parsed on the first text that needs them, never at import)."""
    found = {opening(step.source) for step in EXTRA_PASSES if _opens_with_a_literal(step)}
    return tuple(sorted(literal for literal in found if len(literal) >= _OPENING_CHARS))


def _openings_of(text: str, steps: Sequence[Pass]) -> dict[str, list[int]] | None:
    """Where each opening literal occurs in `text`, when the compiled engine is in use and
    enough of `steps` open with a literal for one scan to cost less than theirs."""
    if len(text) <= EAGER_CHARS or sum(map(_opens_with_a_literal, steps)) < _OPENINGS_WORTH:
        return None
    literals = _opening_literals()
    finder = scan.openings(literals)
    return None if finder is None else finder.starts(text)


def extra_spans(text: str, gate: Gate, secrets: Sequence[str]) -> SpanList:
    """Phase 3 over `text` (as phase 1 left it; `gate` is its gate): the JSON-escaped forms
    of the literal secrets, then each added shape."""
    found_spans: SpanList = []
    for secret in secrets:
        for form in escaped_forms(secret):
            found = text.find(form)
            while found >= 0:
                found_spans.append((found, found + len(form), found, found + len(form)))
                found = text.find(form, found + len(form))
    steps = gate.open_among(EXTRA_PASSES)
    starts = _openings_of(text, steps)
    literals = _opening_literals() if starts is not None else ()
    for step in steps:
        low = gate.fold() if step.reads_fold else ""
        literal = opening(step.source) if starts is not None and _opens_with_a_literal(step) else ""
        if starts is not None and literal in literals:
            # Every match opens with `literal`: it is tried only where that occurs.
            where = starts.get(literal, [])
            spans = _spans_of(step, matches_from(step.pattern, text, where)) if where else []
            found_spans.extend(_kept(text, _real(step, text, spans)))
        else:
            regions = _regions_of(step, text, gate)
            if regions is None:
                found_spans.extend(find_spans(step, text, low, gate))
            else:
                found_spans.extend(_kept(text, _spans_in(step, text, low, regions)))
    return found_spans


class _LooksFar(Exception):
    """A pattern looks at the ends of the string, or without a bound."""


# A look-around wider than this is treated as unbounded (no rule has one over 32).
_REACH_MAX = 4096


@functools.cache
def line_reach(source: str) -> tuple[int, int] | None:
    r"""(before, after): at most how many characters before a match's start and after its
    end the pattern `source` reads (its look-behinds and look-aheads, nested ones too; a
    word boundary reads one; each bound one more than that), as `re`'s own parser reads
    it; None when it asserts an end of the string (`^`, `$`, `\A`, `\Z`) or looks around
    without a bound. A match found in a slice of a text with that much text around it is
    the match `re` finds in the whole text at the same place."""
    from re import _constants, _parser

    before = after = 1  # a word boundary reads the character on either side

    def walk(items: Any) -> None:
        nonlocal before, after
        for op, value in items:
            if op in (_constants.ASSERT, _constants.ASSERT_NOT):
                direction, inner = value
                width = inner.getwidth()[1]
                if width > _REACH_MAX:
                    raise _LooksFar
                if direction < 0:
                    before = max(before, width + 1)
                else:
                    after = max(after, width + 1)
                walk(inner)
            elif op is _constants.AT:
                if value not in (_constants.AT_BOUNDARY, _constants.AT_NON_BOUNDARY):
                    raise _LooksFar
            elif op is _constants.SUBPATTERN:
                walk(value[3])
            elif op is _constants.BRANCH:
                for branch in value[1]:
                    walk(branch)
            elif op in (
                _constants.MAX_REPEAT,
                _constants.MIN_REPEAT,
                _constants.POSSESSIVE_REPEAT,
            ):
                walk(value[2])
            elif op is _constants.ATOMIC_GROUP:
                walk(value)
            elif op is _constants.GROUPREF_EXISTS:
                walk(value[1])
                if value[2] is not None:
                    walk(value[2])
            elif op not in (
                _constants.LITERAL,
                _constants.NOT_LITERAL,
                _constants.ANY,
                _constants.IN,
                _constants.GROUPREF,
            ):
                raise _LooksFar  # an operator not accounted for: not bounded here

    try:
        walk(_parser.parse(source))
    except _LooksFar:
        return None
    return before, after


def _regions_of(step: Pass, text: str, gate: Gate) -> list[tuple[int, int]] | None:
    """The runs of lines of `text` where `step` can match (gate.Gate.regions), for a pass
    that matches within a line and reads a bounded way around its matches; else None."""
    if gate.text is not text or step.shapes[0].crosses_lines:
        return None
    regions = gate.regions(step)
    return None if regions is None or _reaches()[step.name] is None else regions


@functools.cache
def _reaches() -> dict[str, tuple[int, int] | None]:
    """`line_reach` of every phase 3 pass, by name: read all at once, on the first long
    text with a pass to search in chunks (once per process, never at import)."""
    return {step.name: line_reach(step.source) for step in EXTRA_PASSES}


def _spans_in(step: Pass, text: str, low: str, regions: list[tuple[int, int]]) -> SpanList:
    """`_find_spans(step, text, low)` for a pass that can match only within `regions`
    (runs of whole lines; `_regions_of`): each searched as a slice of the text with what
    the pattern reads around it (`line_reach`), and only the matches that start inside
    it kept (no match runs over a newline, so none starts in one region and ends in
    another). Each match is the one the whole text has there: it reads the same
    characters, and from where the last one ended the whole text holds no other match
    before it."""
    reach = _reaches()[step.name]
    assert reach is not None
    before, after = reach
    # A `nearby` shape reads its line before a token: a region starts a line, and the
    # character before it is a newline, which the slice holds (before >= 1).
    found: SpanList = []
    size = len(text)
    for start, end in regions:
        lo, hi = max(0, start - before), min(size, end + after)
        piece = text[lo:hi]
        piece_low = low[lo:hi] if low else ""
        for match_start, match_end, masked_start, masked_end in _find_spans(step, piece, piece_low):
            if start <= match_start + lo < end:
                found.append((match_start + lo, match_end + lo, masked_start + lo, masked_end + lo))
    return found


def reference_rules(text: str, gate: Gate) -> str:
    """Phase 2 over `text` (`gate` is its gate), each rule over what the one before left."""
    current = text
    low: str | None = None
    for step in gate.open_among(REFERENCE_PASSES):
        if step.folded and low is None:
            low = gate.fold() if current is text else fold(current)
        found = find_spans(step, current, low or "", gate)
        if found:
            parts: list[str] = []
            last = 0
            for _, _, start, end in found:
                parts.append(current[last:start])
                parts.append(REDACTED)
                last = end
            parts.append(current[last:])
            current = "".join(parts)
            low = None
    return current


def find_spans(step: Pass, text: str, low: str, gate: Gate | None = None) -> SpanList:
    """(match start, match end, masked start, masked end) of each match `step` masks in
    `text`, whose fold is `low` (the two have the same length); `gate`, when given, is
    the gate of `text` or of the text `low` is the fold of. No masked part ends or starts
    inside a backslash escape (`keep_escapes`)."""
    return _kept(text, _find_spans(step, text, low, gate))


def _kept(text: str, found: SpanList) -> SpanList:
    """`found`, its masked parts kept off backslash escapes (`keep_escapes`) where one
    touches them."""
    for _, _, start, end in found:
        if (text[end - 1] == "\\" and text[end : end + 1] in _QUOTES) or (
            start and text[start - 1] == "\\"
        ):
            return keep_escapes(text, found)
    return found


_QUOTES = ('"', "'")


def _escaping(text: str, at: int, stop: int) -> bool:
    """Whether the backslash at `at` escapes the character after it: an odd run of
    backslashes ends at `at` (counted back to `stop` at most)."""
    run = 0
    while at >= stop and text[at] == "\\":
        run += 1
        at -= 1
    return run % 2 == 1


def keep_escapes(text: str, spans: SpanList) -> SpanList:
    """`spans` with no masked part cutting a backslash escape in two where that would
    change the syntax: one that would end on the backslash of an escaped quote (`\\"`)
    gives the backslash back (so a JSON string keeps its closing quote: masking never
    breaks a line's syntax), and one that would start on an escaped character takes the
    backslash too (`\\[` is no escape). A part left empty is dropped. (An escape whose
    backslash alone is masked, `\\n`, leaves a plain letter: no syntax lost.)"""
    out: SpanList = []
    kept = 0  # where the last masked part ended: a start never moves back past it
    for match_start, match_end, start, end in spans:
        if (
            text[end - 1] == "\\"
            and text[end : end + 1] in _QUOTES
            and _escaping(text, end - 1, start)
        ):
            end -= 1
        if start > kept and text[start - 1] == "\\" and _escaping(text, start - 1, kept):
            start -= 1
        if start < end:
            out.append((min(match_start, start), match_end, start, end))
            kept = end
    return out


def _find_spans(step: Pass, text: str, low: str, gate: Gate | None = None) -> SpanList:
    return _real(step, text, _all_spans(step, text, low, gate))


# A placeholder where a header's credential goes: an upper-case name that says what goes
# there (`TOKEN`, `YOUR_API_KEY`), a variable (`$TOKEN`, `${API_KEY}`, `$env:TOKEN`,
# `%TOKEN%`, `{{token}}`), a name in angle brackets (`<token>`), filler (`xxxx`, `***`,
# `...`), or the scheme's word alone (`Authorization: Bearer` with nothing after it); the
# sentence's or the markdown's closing `)`, `.`, `:` or backquote may follow. No key a
# vendor issues reads so: upper-case letters only, or a variable's name in one case.
_PLACEHOLDER = re.compile(
    r"(?:(?=[A-Z_\-]{0,36}(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|JWT|PAT))"
    r"[A-Z][A-Z_\-]{0,39}"
    r"|\$\{?(?:env:)?(?:[A-Z_][A-Z0-9_]{0,63}|[a-z_][a-z0-9_]{0,63})\}?"
    r"|%[A-Za-z_][A-Za-z0-9_]{0,63}%|\{\{[A-Za-z_.][A-Za-z0-9_.]{0,63}\}\}"
    r"|<[A-Za-z][A-Za-z0-9_\-]{0,38}>|x{3,64}|X{3,64}|\*{3,64}|\.{3}|\u2026"
    r"|(?i:bearer|basic|token|bot))[).:`]{0,3}"
)
_PLACEHOLDER_MAX = 74  # the longest text `_PLACEHOLDER` matches
# The characters a placeholder opens with.
_PLACEHOLDER_STARTS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ$%{<x*.\u2026bt")


def is_placeholder(value: str) -> bool:
    """Whether `value`, a credential's place in a header, holds a placeholder
    (`_PLACEHOLDER`) instead of a credential."""
    return len(value) <= _PLACEHOLDER_MAX and _PLACEHOLDER.fullmatch(value) is not None


def _real(step: Pass, text: str, found: SpanList) -> SpanList:
    """`found` without the spans whose masked part of `text` is a placeholder, for a pass
    whose shapes keep them (`Shape.placeholders`). A masked part that ends on the
    backslash of an escaped quote (`\\"`, a JSON string's end) is read without it."""
    if not step.placeholders or not found:
        return found
    # Most values open with a character no placeholder does: one look at it decides.
    opens = _PLACEHOLDER_STARTS
    return [
        span
        for span in found
        if text[span[2]] not in opens or not _placeholder_at(text, span[2], span[3])
    ]


def _placeholder_at(text: str, start: int, end: int) -> bool:
    if end - start > _PLACEHOLDER_MAX + 1:
        return False
    if text[end - 1 : end] == "\\" and text[end : end + 1] in _QUOTES:
        end -= 1
    return is_placeholder(text[start:end])


def _all_spans(step: Pass, text: str, low: str, gate: Gate | None = None) -> SpanList:
    if step.nearby is not None:
        return _nearby_spans(step, step.nearby, text, low)
    subject = low if step.folded else text
    matches: Iterable[re.Match[str]]
    if step.named:
        if names_dense(low):
            # One scan for the pattern costs less than finding and trying each start.
            matches = step.pattern.finditer(low)
        else:
            starts = name_starts(low) if gate is None else gate.name_starts(low)
            matches = matches_from(step.pattern, low, starts)
    elif step.alternative_sources and len(subject) > EAGER_CHARS:
        # The gate rules out a shape only when it is the gate of the text searched here.
        checks = gate if gate is not None and gate.text is text else None
        alternatives = [
            pattern
            for pattern, lead in zip(step.alternatives, step.alternative_leads, strict=True)
            if checks is None or checks.may_hold(lead, step.folded)
        ]
        matches = alternation_matches(alternatives, subject)
    elif (
        not step.lead and len(subject) > EAGER_CHARS and (literals := branch_openings(step.source))
    ):
        # `re` tries a pattern that opens with a group of words at every position; each
        # word's places are found by substring search instead.
        matches = matches_from(step.pattern, subject, _places(subject, literals))
    else:
        matches = step.pattern.finditer(subject)
    return _spans_of(step, matches)


def _places(text: str, literals: tuple[str, ...]) -> list[int]:
    """Every place in `text` where one of `literals` occurs, ascending, each once."""
    found: set[int] = set()
    for literal in literals:
        at = text.find(literal)
        while at >= 0:
            found.add(at)
            at = text.find(literal, at + 1)
    return sorted(found)


def _spans_of(step: Pass, matches: Iterable[re.Match[str]]) -> SpanList:
    """(match start, match end, masked start, masked end) of each of `step`'s matches
    that masks something."""
    span = step.span
    found_spans: SpanList = []
    # The two common shapes are inlined: on a text full of credentials this loop is most
    # of the work, a few calls per match.
    if span is _whole:
        return [(start, end, start, end) for start, end in map(_match_span, matches)]
    if span is _after_group_1:
        return [
            (match.start(), end, start, end)
            for match in matches
            if (start := match.end(1)) < (end := match.end())
        ]
    for match in matches:
        masked = span(match)
        if masked is not None and masked[0] < masked[1]:
            found_spans.append((match.start(), match.end(), masked[0], masked[1]))
    return found_spans


_match_span = operator.methodcaller("span")

# Above one place a name can start per this many characters of a long fold's first,
# middle and last `DENSE_SAMPLE` characters, a named pattern scans the whole fold.
_DENSE_NAMES = 64
DENSE_SAMPLE = 1 << 16


def names_dense(low: str) -> bool:
    """Whether a long fold holds name words so densely that trying a named pattern at each
    start costs more than one scan of the whole fold (judged on three samples of it: this
    only chooses the faster of two ways to the same matches)."""
    size = len(low)
    if size < 4 * DENSE_SAMPLE:
        return False
    starts = 0
    for begin in (0, (size - DENSE_SAMPLE) // 2, size - DENSE_SAMPLE):
        end = begin + DENSE_SAMPLE
        starts += sum(low.count(word, begin, end) * len(at) for word, at in NAME_STARTS)
    return starts * _DENSE_NAMES > 3 * DENSE_SAMPLE


def matches_from(
    pattern: re.Pattern[str], text: str, starts: Iterable[int]
) -> Iterator[re.Match[str]]:
    """`pattern.finditer(text)` for a pattern that can only start at `starts` (in order):
    each is tried from where the last match ended, so these are the matches `finditer`
    finds, without trying every position."""
    match_at = pattern.match
    resume = 0
    for start in starts:
        if start >= resume and (match := match_at(text, start)) is not None:
            yield match
            resume = match.end()


def alternation_matches(
    alternatives: Sequence[re.Pattern[str]], text: str
) -> Iterator[re.Match[str]]:
    """`re.compile("|".join(alternatives)).finditer(text)`, found by searching for each
    alternative on its own: from where the last match ended, the leftmost position some
    alternative matches at wins, and there the first alternative in order (as the
    alternation tries them). Each search is remembered until a match passes it."""
    ahead: list[re.Match[str] | None] = [pattern.search(text) for pattern in alternatives]
    found_at = [index for index, found in enumerate(ahead) if found is not None]
    if len(found_at) == 1:
        # Only one shape occurs at all: its own matches are the alternation's.
        (index,) = found_at
        first = ahead[index]
        assert first is not None
        yield from alternatives[index].finditer(text, first.start())
        return
    while True:
        best: re.Match[str] | None = None
        for found in ahead:
            if found is not None and (best is None or found.start() < best.start()):
                best = found
        if best is None:
            return
        yield best
        resume = best.end()
        for index, found in enumerate(ahead):
            if found is not None and found.start() < resume:
                ahead[index] = alternatives[index].search(text, resume)


@functools.cache
def _wording(words: tuple[str, ...], adjacent: bool = False) -> re.Pattern[str]:
    if not adjacent:
        return re.compile("|".join(words), re.IGNORECASE)
    # The word (and the rest of its name), then only separators up to the token: a
    # quote, blanks, `:`, `=`, `,`, `>`, a bracket or an escape's backslash.
    return re.compile(
        f"(?:{'|'.join(words)})[A-Za-z0-9_.\\-]{{0,32}}[ \\t\"'`:=,>()\\\\]{{1,8}}\\Z",
        re.IGNORECASE,
    )


@functools.cache
def _word_finders(words: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    # Each word where it starts (a look-ahead, so words that overlap are all found), in
    # one search per first letter: "a" opens three of the AWS words.
    by_first: dict[str, list[str]] = {}
    for word in words:
        by_first.setdefault(word[0], []).append(re.escape(word[1:]))
    return tuple(
        re.compile(f"{re.escape(first)}(?=({'|'.join(rests)}))")
        if len(rests) > 1
        else re.compile(f"({re.escape(first)}{rests[0]})")
        for first, rests in by_first.items()
    )


def _near_a_word(match: re.Match[str], nearby: Nearby, wording: re.Pattern[str]) -> bool:
    """Whether a token the pattern found counts: its letters in both cases (when asked),
    and one of the words (`wording` finds them) before it on its line, within the window."""
    token = match.group()
    if not _token_counts(token, nearby):
        return False  # one case only (hex), no digit, or too few distinct characters
    start = match.start()
    window = match.string[max(0, start - nearby.window) : start]
    window = window[window.rfind("\n") + 1 :]
    return wording.search(window) is not None


# The fewest characters of a token after a credential word (`adjacent`): the shape's
# pattern asks for as many (tests/test_redact.py checks the two agree).
ADJACENT_TOKEN = 16


@functools.cache
def _adjacent_finder(words: tuple[str, ...]) -> re.Pattern[str]:
    # In the fold: a word where a name starts (at the start, after a blank, a quote, `_`,
    # `-`, `.`, `$`, `,`, a bracket or a backslash, or after an escape's `\n`, `\r`, `\t`:
    # `apikey` is left to the named rules, and random text holds few), the rest of its
    # name, separators, maybe `is`/`was`/`now`; a token may start where this ends (one scan
    # in C: a word with no token after it costs no Python call).
    return re.compile(
        "(?:"
        + "|".join(
            f"{re.escape(word)}(?:(?<=[\\s\"'_.\\-$,(\\[{{\\\\]{re.escape(word)})"
            f"|(?<=\\\\[nrt]{re.escape(word)})|(?<![\\s\\S]{re.escape(word)}))"
            for word in words
        )
        + ")"
        "[a-z0-9_.\\-]{0,32}+"
        "[ \\t\"'`:=,>()\\\\]{1,8}+"
        # `token is ...`, `password was ...`: a verb between the name and its value.
        "(?:(?:is|was|now)[ \\t]{1,4}+)?+"
        f"(?=[a-z0-9+/_\\-]{{{ADJACENT_TOKEN}}})"
    )


def _adjacent_spans(step: Pass, nearby: Nearby, text: str, low: str) -> SpanList:
    """The tokens of an `adjacent` nearby shape: each where a word, the rest of its name
    and separators end (found in the fold, in one scan), if the pattern matches there and
    the token passes `_near_a_word`'s checks of its characters."""
    found_spans: SpanList = []
    match_at = step.pattern.match
    resume = 0
    for word in _adjacent_finder(nearby.words).finditer(low):
        start = word.end()
        if start < resume:
            continue
        match = match_at(text, start)
        if match is not None and _token_counts(match.group(), nearby):
            found_spans.append((start, match.end(), start, match.end()))
            resume = match.end()
    return found_spans


_DIGIT = re.compile("[0-9]")


def _token_counts(token: str, nearby: Nearby) -> bool:
    """The checks of a token's own characters (cases, digit, distinct characters), each a
    call or two into C: on a text with a credential on every line this runs per line."""
    if nearby.both_cases and (token.lower() == token or token.upper() == token):
        # One case: a hex, base32 or base36 key counts where the shape lets it (letters
        # and digits only, a letter, half its length in distinct characters, 8 at most).
        if not (nearby.one_case and token.isalnum() and not token.isdigit()):
            return False
        if nearby.digit and _DIGIT.search(token) is None:
            return False
        return len(set(token)) >= min(8, len(token) // 2)
    if nearby.digit and _DIGIT.search(token) is None:
        return False
    return not (nearby.distinct and len(set(token)) < min(16, len(token) // 2))


def _nearby_spans(step: Pass, nearby: Nearby, text: str, low: str) -> SpanList:
    """The tokens of a `nearby` shape: looked for only where the wording before them could
    be (up to the window after a word, on its line); each is then checked exactly as
    `_near_a_word` says. Each stretch of text is searched once. (An `adjacent` shape:
    `_adjacent_spans`.)"""
    if nearby.adjacent:
        return _adjacent_spans(step, nearby, text, low)
    reach: list[tuple[int, int]] = []
    window = nearby.window
    for finder in _word_finders(nearby.words):
        for word in finder.finditer(low):
            found, after = word.start(), word.end(1)
            line_end = low.find("\n", after, found + window)
            reach.append((after, found + window if line_end < 0 else line_end))
    # Where tokens may start, as disjoint stretches: the words of one line ("aws" and
    # "secret" in AWS_SECRET_ACCESS_KEY) reach over the same text.
    stretches: list[tuple[int, int]] = []
    for first, last in sorted(reach):
        if stretches and first <= stretches[-1][1] + 1:
            if last > stretches[-1][1]:
                stretches[-1] = (stretches[-1][0], last)
        elif first <= last:
            stretches.append((first, last))
    found_spans: SpanList = []
    # A token starting at `last` ends `longest` characters on at most; the character after
    # it shows where it ends.
    longest = nearby.longest
    wording = _wording(nearby.words, nearby.adjacent)
    for first, last in stretches:
        for match in step.pattern.finditer(text, first, min(len(text), last + longest + 1)):
            if match.start() > last:
                break
            if _near_a_word(match, nearby, wording):
                found_spans.append((match.start(), match.end(), match.start(), match.end()))
    return found_spans
