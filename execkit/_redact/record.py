r"""What one entry of the table of shapes holds, and what can be read off entries.

A `Shape` is data, no code: its name, a line for the docs, the phase it runs in, a `re`
source, the literals every match of it holds (its anchors), what part of a match is
masked, how the engine may look for it, the facts about its start and its lines that the
tail handling needs, and an example. engine.py compiles a table of them into passes, so a
table can hold many (and another engine could compile the same records: the anchors are
what a multi-literal prefilter needs, the sources what `re` confirms).

Writing a pattern. Each runs in linear time on Python's backtracking `re`: it opens with a
literal or a one-character class; it has no unbounded quantifier inside another, and no
two side by side that could trade characters (a run followed by more pattern is
possessive, `++` or `{n,}+`, and never gives characters back); every optional run before
another quantifier is bounded (`[ \t]{0,8}`). Where a match must not follow a letter or
digit, the look-behind comes after the literal (`SK(?<![A-Za-z0-9]SK)`, and
`bearer(?<!\wbearer)` for `\bbearer`), so the engine skips ahead with a substring search
instead of trying every position. A case-insensitive shape is `folded`: its source is
written in lower case and runs, case-sensitive, on the fold of the text (gate.py).
tests/test_redact.py walks every compiled pattern for these rules, and checks each
record's facts against its pattern.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import Any, TypeAlias

import attrs
from attrs.validators import and_, deep_iterable, instance_of, min_len, optional

from execkit._redact.words import REDACTED

__all__ = [
    "Anchor",
    "Masked",
    "Nearby",
    "Phase",
    "Search",
    "Shape",
    "exact",
    "example_of",
    "folded",
    "opening_literal",
    "shape_list",
]


class Phase(enum.StrEnum):
    """When a shape runs (the package docstring tells the three phases)."""

    REFERENCE = "reference"  # phase 2: in table order, each over what the one before left
    ADDED = "added"  # phase 3: over the text as phase 1 left it, masked on top of phase 2


class Masked(enum.StrEnum):
    """What of a match the marker replaces."""

    MATCH = "the match"
    AFTER_GROUP_1 = "after group 1"  # the name, header or key line stays readable
    GROUP_1 = "group 1"  # the key inside a longer shape (a DSN's user, a JSON field's value)
    GROUP_2 = "group 2"  # the password of scheme://user:password@host


class Search(enum.StrEnum):
    """How the engine finds a shape's matches once its anchors are in the text."""

    SCAN = "scan"  # the gate looks for the anchors first, then the pattern scans the text
    # The pattern opens with its anchor: on a long text the engine's own search for it is
    # the look (the gate only checks that the anchor's characters are there).
    LEAD = "lead"
    NAMED = "named"  # every match starts with one of `NAMES`: tried only where one can


# An anchor is a literal and whether it is looked for in the fold (True) or as written.
Anchor: TypeAlias = tuple[str, bool]


def folded(*literals: str) -> tuple[Anchor, ...]:
    """Anchors looked for in the fold (a folded shape's literals, in lower case)."""
    return tuple((literal, True) for literal in literals)


def exact(*literals: str) -> tuple[Anchor, ...]:
    """Anchors looked for in the text as it is written."""
    return tuple((literal, False) for literal in literals)


# Written out, not `matches_re`: compiling a pattern per field would cost start-up time.
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_DIGITS = "0123456789"


def _snake_case(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not (
        isinstance(value, str) and value[:1].isalpha() and not value.strip(_LETTERS + _DIGITS + "_")
    ):
        raise ValueError(f"{attribute.name}: {value!r} is not a lower-case snake_case name")


def _one_line(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not (isinstance(value, str) and value.strip() and "\n" not in value):
        raise ValueError(f"{attribute.name}: {value!r} is not one line of text")


def _is_anchor(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    literal, in_fold = value if isinstance(value, tuple) and len(value) == 2 else ("", None)
    if not (isinstance(literal, str) and literal and isinstance(in_fold, bool)):
        raise TypeError(f"{attribute.name}: {value!r} is not a (literal, folded) anchor")
    if in_fold and literal != literal.lower():
        raise ValueError(f"{attribute.name}: {literal!r} is looked for in the fold, lowered")


_GROUPS = deep_iterable(
    member_validator=and_(min_len(1), deep_iterable(member_validator=_is_anchor)),
    iterable_validator=and_(instance_of(tuple), min_len(1)),
)


@attrs.frozen
class Nearby:
    """A token that is a credential only with one of `words` (looked for in the fold)
    before it on its line, starting at most `window` characters before the token, and
    (`both_cases`) with upper and lower case letters in it: a hex digest never is.
    `longest` is the most characters the shape's pattern matches (the search for tokens
    after a word stops there). `digit` asks for a digit in the token too, and `distinct` for
    at least half its length in distinct characters (16 at most): a random key has them,
    a name, a word or a path far fewer. `adjacent` asks for the
    word (with the rest of its name) to be followed by nothing but separators (quotes,
    blanks, `:`, `=`) up to the token. `one_case` lets a token in one case count too
    when it is letters and digits only, with a letter and at least half its length in
    distinct characters (8 at most): the alphabets of hex, base32 and base36 keys, where a
    name would hold `_`, `-` or `.`."""

    words: tuple[str, ...] = attrs.field(validator=deep_iterable(_snake_case, min_len(1)))
    window: int = attrs.field(validator=instance_of(int))
    longest: int = attrs.field(validator=instance_of(int))
    both_cases: bool = attrs.field(default=True, validator=instance_of(bool))
    digit: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))
    adjacent: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))
    distinct: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))
    one_case: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))


def _example_marks_one_span(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value.count("«") != 1 or value.count("»") != 1 or value.index("«") > value.index("»"):
        raise ValueError(f"{attribute.name}: {value!r} marks no one «masked» span")


@attrs.frozen
class Shape:
    """One credential shape, or one rule that finds credentials by their context.

    - `name` and `label` name it for tests and the docs; `phase` says when it runs.
    - `pattern`: a `re` source; when `folded`, written in lower case and run on the fold.
    - `anchors`: groups of literals (`exact`: as written, `folded`: in the fold), each
      group holding one that every match contains: the pattern runs only on a text that
      holds a member of each group.
    - `masked`: what of a match the marker replaces; `search`: how the engine looks.
    - `boundary`: the pattern looks at the character before the match (at its start, or
      after its opening literal): a cut can make a match start at a tail's first character.
    - `crosses_lines`: a match can run over a newline (`redact_tail` then traces more than
      the first line of a tail).
    - `nearby`: a match counts only with a word before it on its line.
    - `alternation`: shapes that share one (adjacent in the table, one anchor group each)
      run as one pattern, their sources `|`-joined in table order, tried as `re` tries an
      alternation at each position.
    - `placeholders`: a masked part that is a placeholder (`TOKEN`, `<token>`, `$API_KEY`:
      engine.is_placeholder) is kept: it names a credential and is none. For the header
      rules, whose values documentation and help texts write so.
    - `example`: the shape as a tool prints it; «» marks what is masked, and `{alnum:24}`
      stands for 24 characters of an alphabet (`example_of`), so that no credential-shaped
      literal is written here.
    """

    name: str = attrs.field(validator=_snake_case)
    label: str = attrs.field(validator=_one_line)
    phase: Phase = attrs.field(validator=instance_of(Phase))
    pattern: str = attrs.field(validator=and_(instance_of(str), min_len(1)))
    anchors: tuple[tuple[Anchor, ...], ...] = attrs.field(kw_only=True, validator=_GROUPS)
    example: str = attrs.field(kw_only=True, validator=_example_marks_one_span)
    masked: Masked = attrs.field(default=Masked.MATCH, kw_only=True, validator=instance_of(Masked))
    folded: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))
    search: Search = attrs.field(default=Search.SCAN, kw_only=True, validator=instance_of(Search))
    boundary: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))
    crosses_lines: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))
    nearby: Nearby | None = attrs.field(
        default=None, kw_only=True, validator=optional(instance_of(Nearby))
    )
    alternation: str | None = attrs.field(
        default=None, kw_only=True, validator=optional(_snake_case)
    )
    placeholders: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))


def opening_literal(source: str) -> str:
    """The literal every match of `source` opens with, as far as it is plain: after a
    leading group's `(`, the letters, digits, `_` and `-` up to the first other character
    (`gh[pousr]_...` opens with `gh`, `(authorization(?<!...` with `authorization`). Only
    meaningful for a source that does not open with an alternation."""
    body = source.removeprefix("(?:") if source.startswith("(?:") else source.removeprefix("(")
    plain = len(body) - len(body.lstrip(_LETTERS + _LETTERS.upper() + _DIGITS + "_-"))
    return body[:plain]


_ALPHABETS = {
    "alnum": _LETTERS + _LETTERS.upper() + _DIGITS,
    "letters": _LETTERS + _LETTERS.upper(),
    "upper": _LETTERS.upper() + _DIGITS,
    "lower": _LETTERS + _DIGITS,
    "digits": _DIGITS,
    "hex": "0123456789abcdef",
    "b64": _LETTERS + _LETTERS.upper() + _DIGITS + "+/",
    "urlsafe": _LETTERS + _LETTERS.upper() + _DIGITS + "-_",
}
_FILLER = r"\{(" + "|".join(_ALPHABETS) + r"):(\d+)\}"


def example_of(shape: Shape) -> tuple[str, str]:
    """The shape's example as a text, and what `redact` makes of it: the «» span masked.

    Each `{alphabet:n}` becomes n characters of the alphabet, stepped through at a stride
    prime to its size (so upper and lower case, letters and digits all occur, the same on
    every run, and the text holds no value that looks random)."""

    def fill(match: re.Match[str]) -> str:
        alphabet = _ALPHABETS[match.group(1)]
        stride = 7 if len(alphabet) % 7 else 11
        return "".join(alphabet[(i * stride) % len(alphabet)] for i in range(int(match[2])))

    before, rest = re.sub(_FILLER, fill, shape.example).split("«")
    secret, after = rest.split("»")
    return before + secret + after, before + REDACTED + after


def shape_list(shapes: Iterable[Shape]) -> str:
    """A table as the package docstring lists it: an entry a shape, in table order,
    wrapped at 92 columns between words (never inside a `code` span)."""
    lines: list[str] = []
    for shape in shapes:
        phase = 2 if shape.phase is Phase.REFERENCE else 3
        entry = f"- `{shape.name}` (phase {phase}, masks {shape.masked}): {shape.label}"
        line = ""
        for word in re.findall(r"(?:`[^`]*`|[^\s`])+", entry):
            if line and len(line) + 1 + len(word) > 92:
                lines.append(line)
                line = "  " + word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "\n".join(lines)
