r"""The provider rules: `rules.toml` read, each record checked, and each turned into a shape.

A record is data (docs/formats.md, "Redaction rules", is its reference): an `id`, the
`provider`, and one of three ways to find the key:

- `prefix` + `charset` + `length`: the prefix, then at least `length` characters of the
  charset. A prefix that opens with a letter or digit must not follow one, unless that one
  ends an escape: `\n` (JSON), `%3D` (URL encoding) or `\u0022` (JSON's \u form) before
  the prefix does not hide it.
- `regex` + `anchor` (+ `example`): a `re` source written as record.py says (linear), and
  a literal every match holds, which decides whether it runs at all.
- `keyword` + `charset` + `length` (or + `regex`): a token with no prefix of its own, that
  counts only with the keyword before it on its line (at most `KEYWORD_WINDOW` characters
  before the token): exactly `length` characters of the charset, not inside a longer run.

`load` reads the file and checks every record (`RuleError` names the record and the field);
`shape_of` turns a record into the `Shape` the engine compiles (phase 3: masked on top).
Loaded on first use, with the rest of the table (front.py): reading 450 records costs a few
milliseconds that a run redacting nothing never pays.
"""

from __future__ import annotations

import importlib.resources
import re
import tomllib
from typing import Any

import attrs
from attrs.validators import and_, deep_iterable, in_, instance_of, min_len, optional

from execkit._redact.record import Masked, Nearby, Phase, Search, Shape, exact, folded
from execkit._redact.words import REDACTED

__all__ = [
    "CHARSETS",
    "KEYWORD_WINDOW",
    "Rule",
    "RuleError",
    "load",
    "parse",
    "provider_shapes",
    "shape_of",
]

# The charsets a record may name: the `re` class, and the alphabet its example is filled
# from (record.example_of; a subset of the class where the two differ).
CHARSETS: dict[str, tuple[str, str]] = {
    "alnum": ("A-Za-z0-9", "alnum"),
    "lower": ("a-z0-9", "lower"),
    "upper": ("A-Z0-9", "upper"),
    "hex": ("a-f0-9", "hex"),
    "hexany": ("a-fA-F0-9", "hex"),
    "urlsafe": ("A-Za-z0-9_\\-", "urlsafe"),
    "b64": ("A-Za-z0-9+/", "b64"),
    "digits": ("0-9", "digits"),
    "uuid": ("0-9a-fA-F", "hex"),
}
# The characters of a longer token (base64, base64url, names): a key does not start or
# end next to one.
_TOKEN = "A-Za-z0-9+/_\\-"
# Charsets whose random keys hold both cases: a keyword token must then hold both too.
_MIXED = frozenset({"alnum", "urlsafe", "b64"})
_UUID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID_EXAMPLE = "{hex:8}-{hex:4}-{hex:4}-{hex:4}-{hex:12}"

# How far before a keyword token its keyword may start (on the token's line).
KEYWORD_WINDOW = 80

_MASKED = {"match": Masked.MATCH, "group_1": Masked.GROUP_1, "after_group_1": Masked.AFTER_GROUP_1}
_FIELDS = frozenset(attrs.fields_dict(Shape)) | {
    "id", "provider", "prefix", "charset", "length", "regex", "anchor", "keyword",
}  # fmt: skip


class RuleError(ValueError):
    """A record of rules.toml that cannot be a rule (which one, and why)."""


def _ascii_literal(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not (isinstance(value, str) and value and value.isascii() and value.isprintable()):
        raise ValueError(f"{attribute.name}: {value!r} is not printable ASCII")
    if any(char.isspace() for char in value):
        raise ValueError(f"{attribute.name}: {value!r} holds whitespace")
    if value in REDACTED:
        raise ValueError(f"{attribute.name}: {value!r} is part of the marker {REDACTED}")


def _snake(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not (isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_]*", value)):
        raise ValueError(f"{attribute.name}: {value!r} is not a lower-case snake_case name")


def _anchors(value: object) -> Any:
    """A record's `anchor`: one literal, or a list of them, as a tuple."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen
class Rule:
    """One record of rules.toml, checked (see the module docstring for the three kinds)."""

    id: str = attrs.field(validator=_snake)
    provider: str = attrs.field(validator=instance_of(str))
    prefix: str | None = attrs.field(default=None, validator=_ascii_literal)
    charset: str | None = attrs.field(default=None, validator=optional(in_(CHARSETS)))
    length: int | None = attrs.field(default=None, validator=optional(instance_of(int)))
    regex: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    anchor: tuple[str, ...] | None = attrs.field(
        default=None,
        converter=_anchors,
        validator=optional(deep_iterable(_ascii_literal, and_(instance_of(tuple), min_len(1)))),
    )
    keyword: str | None = attrs.field(default=None, validator=optional(_snake))
    masked: Masked = attrs.field(default=Masked.MATCH, validator=instance_of(Masked))
    example: str | None = attrs.field(default=None, validator=optional(instance_of(str)))

    def __attrs_post_init__(self) -> None:
        if not self.provider.strip() or "\n" in self.provider:
            raise ValueError(f"provider: {self.provider!r} is not one line of text")
        if self.prefix is not None:
            self._needs("prefix", charset=True, length=True, regex=False, anchor=False)
            if self.keyword is not None:
                raise ValueError("prefix: a prefix rule needs no keyword")
            if self.charset == "uuid":
                raise ValueError("charset: uuid is for keyword rules")
        elif self.anchor is not None:
            self._needs("anchor", charset=False, length=False, regex=True, anchor=True)
            if self.keyword is not None:
                raise ValueError("anchor: a rule with an anchor needs no keyword")
        elif self.keyword is not None:
            if self.regex is None:
                self._needs("keyword", charset=True, length=True, regex=False, anchor=False)
            else:
                self._needs("keyword", charset=False, length=False, regex=True, anchor=False)
        else:
            raise ValueError("a rule needs a prefix, an anchor (with a regex) or a keyword")
        if self.length is not None and not 1 <= self.length <= 512:
            raise ValueError(f"length: {self.length} is not in 1..512")
        if self.charset == "uuid" and self.length != 36:
            raise ValueError("length: a uuid is 36 characters")
        if self.regex is not None:
            try:
                compiled = re.compile(self.regex)
            except re.error as error:
                raise ValueError(f"regex: {error}") from None
            if self.masked is Masked.GROUP_1 and compiled.groups < 1:
                raise ValueError("masked: group_1 of a regex without a group")
            if self.example is None:
                raise ValueError("example: a regex rule shows its key in an example")
        elif self.masked is not Masked.MATCH or self.example is not None:
            raise ValueError("masked, example: only a regex rule sets them")

    def _needs(self, kind: str, **present: bool) -> None:
        for field, wanted in present.items():
            if (getattr(self, field) is not None) is not wanted:
                raise ValueError(f"{field}: a {kind} rule {'needs' if wanted else 'has no'} one")


def parse(record: object) -> Rule:
    """A record (a TOML table) as a `Rule`, or `RuleError` saying which and why."""
    if not isinstance(record, dict):
        raise RuleError(f"{record!r}: a rule is a table")
    name = record.get("id", "?")
    unknown = set(record) - _FIELDS
    if unknown:
        raise RuleError(f"rule {name}: unknown fields {sorted(unknown)}")
    fields = dict(record)
    masked = fields.pop("masked", "match")
    if masked not in _MASKED:
        raise RuleError(f"rule {name}: masked must be one of {sorted(_MASKED)}")
    try:
        return Rule(masked=_MASKED[masked], **fields)
    except (TypeError, ValueError) as error:
        raise RuleError(f"rule {name}: {error}") from None


def load(text: str | None = None) -> tuple[Rule, ...]:
    """Every record of rules.toml (or of `text`, in its format), checked; ids unique."""
    if text is None:
        text = importlib.resources.files(__package__).joinpath("rules.toml").read_text("utf-8")
    try:
        records = tomllib.loads(text).get("rules")
    except tomllib.TOMLDecodeError as error:
        raise RuleError(f"rules.toml: {error}") from None
    if not isinstance(records, list):
        raise RuleError("rules.toml: `rules` is not a list of tables")
    rules = tuple(parse(record) for record in records)
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise RuleError(f"rule {rule.id}: two rules share the id")
        seen.add(rule.id)
    return rules


# Where a prefix that opens with a letter or digit may start: not after one, unless that
# one ends an escape (`\n`, `%3D`, `\u0022`): the prefix itself is in each look-behind so
# the engine finds the literal first.
def _after_boundary(literal: str, before: str = "A-Za-z0-9") -> str:
    return (
        f"(?:(?<![{before}]{literal})|(?<=\\\\[nrtbf]{literal})"
        f"|(?<=%[0-9A-Fa-f]{{2}}{literal})|(?<=\\\\u[0-9A-Fa-f]{{4}}{literal}))"
    )


# base64url's alphabet: what random data and names are made of.
_URLSAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _may_not_follow(prefix: str, charset: str) -> str | None:
    """The characters (a `re` class body) a prefix's key may not follow; None when it may
    follow any, inside a longer word (`k33-hvs.…`).

    A prefix that opens with a letter or digit is a key's start only where no longer
    token runs into it: base64url data and names hold any short prefix. A distinctive one
    is a key's start wherever it is: one of four characters or more holding a character
    no base64url run or name holds (`hvs.`, `ya29.`, `dp.st.`) follows anything; one of
    five or more holding `_` or `-` (`glpat-`, `github_pat_`) follows anything but a
    letter (where a kebab- or snake-case name, `task-proj-…`, could run into it), and one
    of four with a key that is not hex (`ghp_`, `npm_`; `cache_key_<digest>` is no key)
    follows `-`, `_` or `+` too."""
    if not prefix[0].isalnum():
        return None
    if len(prefix) >= 4 and not set(prefix) <= _URLSAFE:
        return None
    if not prefix.isalnum():
        if len(prefix) >= 5:
            return "A-Za-z"
        if len(prefix) == 4 and charset not in _HEX:
            return "A-Za-z0-9"
    return "A-Za-z0-9+_\\-"


_HEX = frozenset({"hex", "hexany"})
# A dotted family's key may hold more dot-separated parts: up to three short ones after
# the prefix (Doppler's `dp.st.<config>.`, Dropbox's `sl.u.`, Google's `ya29.c.`) and any
# after the body (Mapbox's `.signature`, a Vault namespace's `.id`).
_SEGMENT = "[A-Za-z0-9_\\-]"


def _dotted(body: str) -> str:
    return f"(?:{_SEGMENT}{{1,32}}+\\.){{0,3}}+{body}(?:\\.{_SEGMENT}{{2,}}+)*+"


_ESCAPE = re.compile(r"\\.")
_CLASS = re.compile(r"\[\^?\]?[^\]]*\]")
_QUANTIFIER = re.compile(r"[*+{]|(?<!\()\?")


def _opens_looking_behind(regex: str) -> bool:
    """Whether a source looks at the character before its match, as `Shape.boundary`
    says: a look-behind before anything repeats (at its start, or after an opening of
    literals, classes and groups of those). Read off the source's text, not parsed:
    start-up time; tests/test_redact.py checks it against the parsed pattern."""
    plain = _CLASS.sub("C", _ESCAPE.sub("E", regex))
    behind = plain.find("(?<")
    if behind < 0:
        return False
    repeat = _QUANTIFIER.search(plain)
    return repeat is None or behind < repeat.start()


def _token(rule: Rule) -> tuple[str, int]:
    """A keyword rule's token pattern and its most characters."""
    assert rule.charset is not None and rule.length is not None
    if rule.charset == "uuid":
        body, cls = _UUID, CHARSETS["uuid"][0]
    else:
        cls = CHARSETS[rule.charset][0]
        body = f"[{cls}]{{{rule.length}}}"
    # Not inside a longer token; after an escape's last character (`\nKEY`, `%3DKEY`) it may.
    return (
        f"(?:(?<![{_TOKEN}])|(?<=\\\\[nrt])|(?<=%[0-9A-Fa-f]{{2}})){body}(?![{_TOKEN}])",
        rule.length,
    )


# A regex record's first `(?<![A-Za-z0-9]...)` (the key must not follow a letter or digit)
# is widened as a prefix's is: an escape's last character may come before the key.
_NOT_AFTER_WORD = re.compile(r"\(\?<!\[A-Za-z0-9\]((?:\\.|[^()\\])*)\)")


def _widened(regex: str) -> str:
    return _NOT_AFTER_WORD.sub(lambda m: _after_boundary(m.group(1)), regex, count=1)


def shape_of(rule: Rule) -> Shape:
    """The shape the engine compiles for `rule` (phase 3)."""
    label = f"{rule.provider}: " + (
        f"`{rule.prefix}` and {rule.length}+ {rule.charset}"
        if rule.prefix is not None
        else f"{rule.length} {rule.charset} after `{rule.keyword}`"
        if rule.keyword is not None and rule.regex is None
        else f"after `{rule.keyword}`"
        if rule.keyword is not None
        else f"holds `{'`, `'.join(rule.anchor or ())}`"
    )
    if rule.prefix is not None:
        assert rule.charset is not None and rule.length is not None
        literal = re.escape(rule.prefix)
        before = _may_not_follow(rule.prefix, rule.charset)
        boundary = before is not None
        cls, filler = CHARSETS[rule.charset]
        after = _after_boundary(literal, before) if before is not None else ""
        padding = "={0,2}+" if rule.charset == "b64" else ""
        body = f"[{cls}]{{{rule.length},}}+{padding}"
        if "." in rule.prefix:
            body = _dotted(body)
        pattern = f"{literal}{after}{body}"
        return Shape(
            rule.id,
            label,
            Phase.ADDED,
            pattern,
            anchors=(exact(rule.prefix),),
            search=Search.LEAD,
            boundary=boundary,
            example=f"value «{rule.prefix}{{{filler}:{rule.length}}}» seen",
        )
    if rule.anchor is not None:
        assert rule.regex is not None and rule.example is not None
        body = rule.regex.removeprefix("(")
        lead = len(rule.anchor) == 1 and body.startswith(
            (rule.anchor[0], re.escape(rule.anchor[0]))
        )
        return Shape(
            rule.id,
            label,
            Phase.ADDED,
            _widened(rule.regex),
            anchors=(exact(*rule.anchor),),
            masked=rule.masked,
            search=Search.LEAD if lead else Search.SCAN,
            boundary=_opens_looking_behind(rule.regex),
            example=rule.example,
        )
    assert rule.keyword is not None
    if rule.regex is not None:
        assert rule.example is not None
        pattern, longest = _widened(rule.regex), _width(rule.regex)
        both_cases = False
        example = rule.example
    else:
        assert rule.charset is not None and rule.length is not None
        pattern, longest = _token(rule)
        both_cases = rule.charset in _MIXED
        filler = (
            _UUID_EXAMPLE
            if rule.charset == "uuid"
            else f"{{{CHARSETS[rule.charset][1]}:{rule.length}}}"
        )
        example = f"{rule.keyword} said «{filler}» ok"
    return Shape(
        rule.id,
        label,
        Phase.ADDED,
        pattern,
        anchors=(folded(rule.keyword),),
        boundary=_opens_looking_behind(pattern),
        nearby=Nearby(
            (rule.keyword,), window=KEYWORD_WINDOW, longest=longest, both_cases=both_cases
        ),
        example=example,
    )


def _width(regex: str) -> int:
    """The most characters a bounded regex matches."""
    parser: Any = importlib.import_module("re._parser")
    most = int(parser.parse(regex).getwidth()[1])
    if most >= 1 << 16:
        raise RuleError(f"{regex!r}: a keyword rule's regex must be bounded")
    return most


def provider_shapes() -> tuple[Shape, ...]:
    """A shape for each record of rules.toml, in its order."""
    return tuple(shape_of(rule) for rule in load())
