r"""Mask credentials before text is stored or printed.

`redact(text)` replaces every credential it recognises with `[REDACTED]`; `redact_tail`
does the same for the kept tail of a longer output, looking at the text just before the
cut; `redact_argv` does it per argument. A false positive loses a little debugging text, a
false negative leaks a credential, so redaction errs towards masking.

What is recognised, in three phases over the text:

1. The literal `extra_secrets` (values of the child's secret-named environment variables),
   longest first.
2. The reference rules, run one after another over the output of the one before, with
   the output of the code before the coverage work (tests/_redact_reference.py holds it,
   and tests/test_redact.py checks the two agree): OpenAI/Anthropic `sk-`, Google `AIza`,
   GitHub `gh?_`/`github_pat_` and Slack `xox?-` keys; `Authorization:` headers; `Bearer`
   tokens; `NAME=value`, `NAME: value` and `"name": "value"` for secret-sounding names;
   `--api-key VALUE` flags.
3. The shapes added since, each matched against the text as phase 1 left it (so no
   earlier masking can hide one) and masked on top of phase 2's output: AWS access key
   IDs and bare AWS secret keys (40 base64 characters on a line that says aws/secret),
   Slack webhook URLs, JWTs, the password of `scheme://user:password@host` (URLs and
   the connection strings of PostgreSQL, MySQL, MongoDB, Redis, AMQP...), PEM and OpenSSH
   private key blocks, Azure `AccountKey=`/`SharedAccessKey=`/`SharedAccessSignature=`,
   Stripe `sk_live_`/`rk_live_`/`sk_test_`, npm `npm_`, Hugging Face `hf_`, GitLab
   `glpat-`/`glrt-`/`gldt-`/`glptt-`, Twilio `SK` + 32 hex, SendGrid `SG.x.y`,
   `Cookie:`/`Set-Cookie:` values, names and headers whose quotes are backslash-escaped
   (JSON inside a JSON string), and the JSON-escaped form of each literal secret. So
   the output is always the reference output with more spans masked, and exactly the
   reference output wherever phase 3 finds nothing.

Formats were taken as facts (prefixes, lengths, alphabets; no code) from two well-kept
secret scanners: gitleaks `config/gitleaks.toml` (rules aws-access-token,
slack-webhook-url, jwt, private-key, stripe-access-token, npm-access-token,
huggingface-access-token, gitlab-pat, gitlab-pat-routable, gitlab-runner-authentication-
token, gitlab-deploy-token, gitlab-ptt, twilio-api-key, sendgrid-api-token,
curl-auth-user, generic-api-key) and Yelp detect-secrets `detect_secrets/plugins/`
(aws.py, aws_secret_access_key.py, basic_auth.py, azure_storage_key.py, jwt.py,
private_key.py, slack.py, stripe.py, twilio.py, sendgrid.py, npm.py). Lengths are kept
loose where the vendors' are not stable (Stripe, npm, Hugging Face: at least 10/30/30).

Left alone on purpose: git SHAs and sha256 digests (hex has no upper and lower case mix,
so it is never an AWS secret), UUIDs, `max_tokens=4096`, `token_count=5` (the secret word
must END the name), base64 data without a key context, certificates and public keys.

Linear time. Every pattern runs in linear time on Python's backtracking `re`: each starts
with a literal or a one-character class, has no nested or adjacent unbounded quantifiers
that could trade characters with each other (the new ones use possessive quantifiers,
which never give characters back), and bounds every optional run that precedes another
quantifier. Where a match must not follow a letter or digit, the look-behind comes after
the literal (`SK(?<![A-Za-z0-9]SK)`, `bearer(?<!\wbearer)` for `\bbearer`), so the engine
skips ahead with a substring search instead of trying every position.

Folded patterns. A case-insensitive rule runs as a lowered, case-sensitive pattern on
`_fold(text)`: the text lowered after mapping U+0130 (İ), U+0131 (ı) and U+017F (ſ) to
`i`, `i` and `s`. The fold has the text's length (U+0130 is the one code point `lower()`
turns into two), so offsets carry over, and it is exactly what IGNORECASE sees: `re`
matches an ASCII letter to its two cases, U+212A KELVIN SIGN (for k, which `lower()`
maps to `k`), U+0130 and U+0131 (for i) and U+017F (for s), and to nothing else; a digit
or punctuation only to itself; and lowering keeps what is a word character, whitespace
or a newline. tests/test_redact.py checks each of these facts, and each character class
of the folded patterns, against every code point.

Anchors. A pattern runs at all only where its anchors occur: each pass lists literals
that every match of it contains (in groups, each of which must be represented), and a
substring search over the text (or the fold, for a folded pass) decides. The check is
exact, for every code point: a case-sensitive pattern can only match its literals as
written, in the string it runs on. The marker contains no anchor and no anchor contains a
bracket, so masking never creates one: one look at the text serves every pass.

Long texts. On a text of more than `_EAGER_CHARS` characters, anchors are looked for one
at a time, each at most once, and a literal with a character the text lacks is settled by
that character alone. A pass whose pattern opens with its anchor (`lead`) does not ask for
the literal at all: the engine's own search for it costs the same, so looking first would
only search twice. A pattern that is an alternation of shapes each opening with a literal
(the vendor keys, Stripe's `rk_`/`sk_`) is searched for one shape at a time (not at all
for a shape whose opening literal has a character the text lacks) and the matches merged
as the alternation takes them, because `re` tries every position of the text for an
alternation whose shapes begin differently. The fold of a long text outside
ASCII is built a piece at a time, so that its copies stay small: what it costs is one
string of the text's size. What a long text costs after that is a fixed number of
substring searches over it, whatever it holds (tests/test_exec_tree.py bounds the whole
post-exit work as a number of decodes of the same bytes).

Tails. `redact_tail(tail, context)` redacts `context + tail` once and keeps the part that
came from `tail`; a credential that runs across the cut is masked from the start of the
tail through its end. Its output is the old `redact_tail` (redact the tail alone, and
again with the context; when they differ, mask the differing head) with phase 3 on top,
computed without redacting the tail twice: the two views can only differ near the cut
(where a match crosses it, or where the cut splits a word that could start a key); no
reference rule matches across a newline, so from the tail's first newline on the two
agree, and only then is the tail's first line redacted alone. No rule at all matches
across a newline but a private key block (and a literal secret that holds one): unless
one may, only `context` and the tail's first line are traced this way, and the rest of
the tail is redacted on its own, as `redact` would.

Dense texts. Where credentials are on every line, the work is per match. It is kept to a
scan per rule: a fold whose samples hold a place a name can start every few dozen
characters is scanned once by each named pattern (which finds the same matches as trying
it at each start), a trace lays each rule's masks into its pieces with a bisect each, and
the original offsets of phase 1 and 2 matches are kept only where a cut needs them.
"""

from __future__ import annotations

import bisect
import functools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

__all__ = [
    "MIN_ENV_SECRET_LEN",
    "REDACTED",
    "looks_secret_name",
    "redact",
    "redact_argv",
    "redact_tail",
    "secret_env_values",
]

REDACTED = "[REDACTED]"

# Values shorter than this are not treated as secrets when collected from an environment:
# masking every "1" or "true" would shred the text without protecting anything.
MIN_ENV_SECRET_LEN = 8

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)

# --- phase 2: the reference rules
#
# The same rules as before the coverage work (tests/_redact_reference.py holds the old code
# and tests/test_redact.py checks the two agree), written so the engine can skip ahead: the
# literal comes first and the look-behind that used to precede it follows it, and the
# case-insensitive ones run, case-sensitive and lowered, on `_fold(text)` (see "Folded
# patterns" in the module docstring).

# Vendor key shapes. The negative look-behind keeps `task-...` or `disk-...` from matching
# the `sk-` prefix.
# Each shape opens with a literal, so a long text is searched for each on its own.
_VENDOR_KEY_SHAPES = (
    r"sk-(?<![A-Za-z0-9]sk-)[A-Za-z0-9_\-]{16,}",  # OpenAI sk-..., sk-proj-..., sk-ant-...
    r"AIza(?<![A-Za-z0-9]AIza)[A-Za-z0-9_\-]{30,}",  # Google API keys
    r"gh[pousr]_(?<![A-Za-z0-9]gh[pousr]_)[A-Za-z0-9]{20,}",  # GitHub tokens
    r"github_pat_(?<![A-Za-z0-9]github_pat_)[A-Za-z0-9_]{20,}",
    r"xox[abprs]-(?<![A-Za-z0-9]xox[abprs]-)[A-Za-z0-9\-]{10,}",  # Slack tokens
)
_VENDOR_KEYS = re.compile("|".join(_VENDOR_KEY_SHAPES))

# `Authorization: Bearer x`, `Authorization: token x`, `authorization=x`: the credential.
_AUTH_HEADER = (
    r"(authorization(?<!\wauthorization)[\"']?[ \t]{0,8}[:=][ \t]{0,8}[\"']?"
    r"(?:(?:bearer|basic|token|bot)[ \t]{1,8})?)"
    r"[^\s\"',;]+"
)

# A bare `Bearer <token>` anywhere else (curl traces, logged headers).
_BEARER = r"(bearer(?<!\wbearer)[ \t]{1,8})[A-Za-z0-9\-._~+/]{8,}=*"

# `NAME=value`, `NAME: value`, `"name": "value"` where NAME ends in a secret-sounding word
# (`OPENAI_API_KEY`, `GITHUB_TOKEN`, `client_secret`, `apiKey`, `password`). The name's
# prefix is irrelevant to the match, which is what keeps this linear; requiring the word
# to END the name keeps `token_count=5` and `max_tokens=4096` readable.
_NAMES = (
    r"(?:a(?:pi[_\-]?key|ccess[_\-]?key)|s(?:ecret[_\-]?key|ecret)|p(?:rivate[_\-]?key"
    r"|ass(?:word|wd))|token|credentials?)"
)  # the reference's alternatives, in its order, sharing their first letters
# Where a name can start, from each word of it (`api_key` holds `key` 4 characters in,
# `apikey` 3, `access_key` 7...; the other words start the name), and how far past the word
# its separator can be at most (the rest of `secret_key`, an escaped quote, 8 blanks, `:`).
_NAME_STARTS = (
    ("key", (3, 4, 6, 7, 8)),
    ("token", (0,)),
    ("secret", (0,)),
    ("passw", (0,)),
    ("credential", (0,)),
)
# Above one place a name can start per this many characters of a long fold's first,
# middle and last `_DENSE_SAMPLE` characters, a named pattern scans the whole fold.
_DENSE_NAMES = 64
_DENSE_SAMPLE = 1 << 16
_NAME_BACK = max(offset for _, offsets in _NAME_STARTS for offset in offsets)
_NAME_REACH = 16
_KEY_VALUE = rf"({_NAMES}[\"']?[ \t]{{0,8}}[:=][ \t]{{0,8}}[\"']?)[^\s\"',;&]+"

# `--api-key VALUE` / `--token=VALUE` on a logged command line.
_SECRET_FLAG = (
    r"(--?(?:api[_\-]?key|access[_\-]?key|token|secret|password|passwd)(?:[ \t]{1,8}|=))"
    r"[^\s\"',;&]+"
)

_SECRET_FLAG_ITEM = re.compile(
    r"(?i)--?(?:api[_\-]?key|access[_\-]?key|token|secret|password|passwd)"
)

# --- phase 3: the shapes added since (compiled on first use: start-up time matters)

# After a name, quotes escaped with a backslash (`{\"api_key\": \"v\"}`, `KEY=\"v\"`):
# either the name's closing quote is escaped, or the value's opening one is.
_ESCAPED_SEP = (
    r"(?:\\[\"'][ \t]{0,8}[:=][ \t]{0,8}(?:\\[\"'])?"
    r"|[\"']?[ \t]{0,8}[:=][ \t]{0,8}\\[\"'])"
)
_STRIPE_AFTER_R_OR_S = r"k_(?:live|test|prod)_(?<![A-Za-z0-9].{8})[A-Za-z0-9]{10,}+"
_PEM_LINE = r"[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"
_PEM_BODY = r"[A-Za-z0-9+/=\\:,.\[\]]"
_PEM_START = "-----BEGIN"  # the one shape whose match can run over a newline
# `redact_tail` redacts a cut tail's first line apart only when it is at most this
# fraction of the tail (it is redacted three times: with the context, alone, in the tail).
_SHORT_HEAD = 8

_SOURCES = {
    # The header stays readable; the body (base64 lines, `Proc-Type:`/`DEK-Info:` headers,
    # `\n` when JSON-escaped, markers an earlier rule left) and the END line are masked. A
    # block without its END line is masked up to the next `-----` or the end of the text.
    # Whitespace counts only when more of the body follows it (so masking is idempotent).
    "private_key": (
        rf"(-----BEGIN{_PEM_LINE})"
        rf"(?:{_PEM_BODY}++|-(?!----)|\s++(?={_PEM_BODY}|-))*+"
        rf"(?:-----END{_PEM_LINE})?"
    ),
    "escaped_authorization": (
        rf"(authorization(?<!\wauthorization){_ESCAPED_SEP}"
        r"(?:(?:bearer|basic|token|bot)[ \t]{1,8})?)"
        r"[^\s\"',;\\]+"
    ),
    "escaped_key_value": rf"({_NAMES}{_ESCAPED_SEP})[^\s\"',;&\\]+",
    # scheme://user:password@host: the password (the user part may be empty: redis://:p@h).
    "url_password": r"://([^\s:/@?#\[\]\"'<>]{0,128}+):([^\s/?#\"'<>]{1,256})@",
    "slack_webhook": r"(hooks\.slack\.com/(?:services|workflows|triggers)/)[a-z0-9_+/\-]{8,}+",
    "jwt": (
        r"eyJ(?<![A-Za-z0-9_\-]eyJ)[A-Za-z0-9_\-]{10,}+={0,2}+"
        r"\.eyJ[A-Za-z0-9_\-]{10,}+={0,2}+\.[A-Za-z0-9_\-]*+={0,2}+"
    ),
    # 40 characters of base64 with both cases: a hex digest never qualifies. Masked only
    # on a line that says aws or secret (or names an access key ID) before it.
    "aws_secret_key": r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
    "aws_access_key_id": (
        r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)(?<![A-Za-z0-9]....)[A-Z0-9]{16}(?![A-Za-z0-9])"
    ),
    "azure_key": (
        r"((?:accountkey(?<!\waccountkey)|sharedaccesskey(?<!\wsharedaccesskey)"
        r"|sharedaccesssignature(?<!\wsharedaccesssignature))[ \t]{0,8}=[ \t]{0,8})"
        r"[^\s;\"'<>]+"
    ),
    "stripe": rf"[rs]{_STRIPE_AFTER_R_OR_S}",
    "npm": r"npm_(?<![A-Za-z0-9_]npm_)[A-Za-z0-9]{30,}+",
    "huggingface": r"hf_(?<![A-Za-z0-9_]hf_)[A-Za-z0-9]{30,}+",
    "gitlab": (
        r"(?:glpat-(?<![A-Za-z0-9]glpat-)|glptt-(?<![A-Za-z0-9]glptt-)"
        r"|gl[dr]t-(?<![A-Za-z0-9]gl[dr]t-))[A-Za-z0-9_\-]{20,}+(?:\.[A-Za-z0-9]{2,}+)?+"
    ),
    "twilio": r"SK(?<![A-Za-z0-9]SK)[0-9a-fA-F]{32}(?![A-Za-z0-9])",
    "sendgrid": r"SG\.(?<![A-Za-z0-9]SG\.)[A-Za-z0-9_\-]{16,}+\.[A-Za-z0-9_\-]{16,}+",
    "cookie": (
        r"((?:set-cookie(?<!\wset-cookie)|cookie(?<!\wcookie))(?:\\?[\"'])?"
        r"[ \t]{0,8}[:=][ \t]{0,8}(?:\\?[\"'])?)[^\r\n\"\\]+"
    ),
}

# The wording that makes a bare 40-character token an AWS secret key (looked for in the
# fold), and how far back on its line it may be.
_AWS_WORDS = ("aws", "secret", "akia", "asia")
_AWS_WORDING = re.compile("|".join(_AWS_WORDS), re.IGNORECASE)
_AWS_WINDOW = 80

# --- anchors and the case fold

# Code points outside ASCII that IGNORECASE pairs with an ASCII letter and that `lower()`
# does not turn into it (U+212A KELVIN SIGN lowers to "k" already). Found by scanning all
# of Unicode; tests/test_redact.py checks the table is complete.
_FOLD_FIXES = (("\u0130", "i"), ("\u0131", "i"), ("\u017f", "s"))


# A long text outside ASCII is folded this many characters at a time: each piece's copies
# are small and reused, so the fold costs one string of the text's size, not one per fix.
_FOLD_PIECE = 1 << 18


def _fold(text: str) -> str:
    """`text` lowered so that whatever a case-insensitive pattern matches to an ASCII
    literal reads as that literal in lower case (see the module docstring)."""
    if text.isascii():
        return text.lower()
    if len(text) <= _FOLD_PIECE:
        return _fold_piece(text)
    piece = _FOLD_PIECE
    return "".join([_fold_piece(text[at : at + piece]) for at in range(0, len(text), piece)])


def _fold_piece(text: str) -> str:
    for char, letter in _FOLD_FIXES:
        if char in text:
            text = text.replace(char, letter)
    return text.lower()


# An anchor is a literal and whether it is looked for in the fold (True) or as written.
_Anchor = tuple[str, bool]
_Anchors = tuple[tuple[_Anchor, ...], ...]


def _folded(*literals: str) -> tuple[_Anchor, ...]:
    return tuple((literal, True) for literal in literals)


def _exact(*literals: str) -> tuple[_Anchor, ...]:
    return tuple((literal, False) for literal in literals)


_NAME_WORDS = _folded("key", "token", "secret", "passw", "credential")
_ASSIGN = _exact(":", "=")


# Up to this length a gate looks for all anchors up front (argv items, error messages).
_EAGER_CHARS = 2048


class _Gate:
    """Which anchors occur in one text; each is looked for at most once."""

    __slots__ = ("_bits", "_chars", "_low", "_names", "_state", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._low: str | None = None
        self._names: list[int] | None = None  # where a name can start in the fold, once
        self._state: list[int] = []  # per anchor id: -1 not looked for yet, 0 absent, 1 found
        self._chars: dict[tuple[str, bool], bool] = {}  # (character, in the fold): present
        self._bits = 0  # bit i set: anchor i found (a short text's anchors, all looked for)
        if len(text) > _EAGER_CHARS:
            self._state = [-1] * len(_ANCHOR_LIST)
            return
        # A short text: looking for every anchor at once costs less than deciding which.
        low = self._low = _fold(text)
        bits = 0
        for bit, (literal, folded) in enumerate(_ANCHOR_LIST):
            if literal in (low if folded else text):
                bits |= 1 << bit
        self._bits = bits

    @property
    def empty(self) -> bool:
        """True when the text is short and holds no anchor at all."""
        return not self._state and not self._bits

    def opens(self, step: _Pass) -> bool:
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
            # The pattern's own search costs what a full look would (see `_Pass`): only
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

    def _look(self, anchor: int) -> int:
        if not self._has_chars(anchor):
            return 0
        literal, folded = _ANCHOR_LIST[anchor]
        return 1 if len(literal) == 1 or literal in (self.fold() if folded else self._text) else 0

    def _has_chars(self, anchor: int) -> bool:
        """Whether the text holds every character of the anchor (not yet the anchor)."""
        return self.may_hold(*_ANCHOR_LIST[anchor])

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
        """`_fold` of the text, computed once."""
        if self._low is None:
            self._low = _fold(self._text)
        return self._low

    def name_starts(self, low: str) -> list[int]:
        """`_name_starts(low)`, computed once when `low` is this text's fold."""
        if low is not self._low:
            return _name_starts(low)
        if self._names is None:
            self._names = _name_starts(low)
        return self._names


# Every anchor once, numbered: a gate keeps one flag per anchor.
_ANCHOR_LIST: list[_Anchor] = []
_ANCHOR_IDS: dict[_Anchor, int] = {}
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


def _anchor_ids(anchors: _Anchors) -> tuple[tuple[int, ...], ...]:
    for group in anchors:
        for anchor in group:
            if anchor not in _ANCHOR_IDS:
                _ANCHOR_IDS[anchor] = len(_ANCHOR_LIST)
                _ANCHOR_LIST.append(anchor)
    return tuple(tuple(_ANCHOR_IDS[anchor] for anchor in group) for group in anchors)


# --- passes

_Span = Callable[[re.Match[str]], "tuple[int, int] | None"]


def _whole(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span()


def _after_prefix(match: re.Match[str]) -> tuple[int, int] | None:
    start, end = match.end(1), match.end()
    return (start, end) if start < end else None


def _password(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span(2)


def _aws_secret(match: re.Match[str]) -> tuple[int, int] | None:
    token = match.group()
    if token.lower() == token or token.upper() == token:
        return None  # one case only: hex, or not random enough to be a key
    start = match.start()
    window = match.string[max(0, start - _AWS_WINDOW) : start]
    window = window[window.rfind("\n") + 1 :]
    return match.span() if _AWS_WORDING.search(window) else None


def _literal_head(source: str) -> str:
    """The literal a pattern source opens with, as far as no character is special."""
    head = len(source) - len(
        source.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
    )
    return source[:head]


class _Pass:
    """One pattern, the anchors every match of it contains, and what of a match to mask.

    A `folded` pass runs on `_fold(text)` (its source is lowered and case-sensitive) and
    looks for its anchors there; the others run on the text as it is. A `lead` pass's
    pattern opens with its anchor, so the engine's own search for it costs no more than
    the gate's: on a long text it runs without asking the gate. `alternatives` (sources
    whose alternation is the pattern, in its order) each open with a literal: on a long
    text they are searched for one by one, which is a substring search each, where the
    alternation would try every position.
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
        "reads_fold",
        "source",
        "span",
    )

    def __init__(
        self,
        name: str,
        pattern: re.Pattern[str] | str,
        anchors: _Anchors,
        span: _Span = _after_prefix,
        *,
        folded: bool = False,
        named: bool = False,
        lead: bool = False,
        alternatives: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.named = named  # every match starts with one of `_NAMES`: tried only there
        self.lead = lead or bool(alternatives)
        self.alternative_sources = alternatives
        # The literal each alternative opens with: one the text cannot hold rules it out.
        self.alternative_leads = tuple(map(_literal_head, alternatives))
        self._alternatives: tuple[re.Pattern[str], ...] | None = None
        self._pattern = pattern if isinstance(pattern, re.Pattern) else None
        self.source = pattern if isinstance(pattern, str) else pattern.pattern
        self.anchors = anchors
        self.folded = folded
        # What the pass reads in the fold: its pattern's subject, or its anchors.
        self.reads_fold = folded or any(in_fold for group in anchors for _, in_fold in group)
        self.groups = _anchor_ids(anchors)
        self.masks = tuple(sum(1 << anchor for anchor in group) for group in self.groups)
        self.span = span

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


# Phase 2, in the reference order.
_REFERENCE_PASSES = (
    _Pass(
        "vendor_key",
        _VENDOR_KEYS,
        (_exact("sk-", "AIza", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox"),),
        _whole,
        alternatives=_VENDOR_KEY_SHAPES,
    ),
    _Pass("authorization", _AUTH_HEADER, (_folded("authorization"),), folded=True),
    _Pass("bearer", _BEARER, (_folded("bearer"),), folded=True),
    _Pass("key_value", _KEY_VALUE, (_NAME_WORDS, _ASSIGN), folded=True, named=True),
    _Pass(
        "secret_flag",
        _SECRET_FLAG,
        (_exact("-"), _folded("key", "token", "secret", "passw")),
        folded=True,
    ),
)

# Phase 3: each pass sees the text as phase 1 left it, independently of the others.
_EXTRA_PASSES = (
    _Pass(
        "private_key",
        _SOURCES["private_key"],
        (_exact("-----BEGIN"), _exact("PRIVATE KEY")),
        lead=True,
    ),
    _Pass(
        "escaped_authorization",
        _SOURCES["escaped_authorization"],
        (_exact("\\"), _folded("authorization"), _ASSIGN),
        folded=True,
    ),
    _Pass(
        "escaped_key_value",
        _SOURCES["escaped_key_value"],
        (_exact("\\"), _NAME_WORDS, _ASSIGN),
        folded=True,
        named=True,
    ),
    _Pass(
        "url_password",
        _SOURCES["url_password"],
        (_exact("@"), _exact("://")),
        _password,
        lead=True,
    ),
    _Pass(
        "slack_webhook",
        _SOURCES["slack_webhook"],
        (_folded("hooks.slack.com"),),
        folded=True,
        lead=True,
    ),
    _Pass("jwt", _SOURCES["jwt"], (_exact("."), _exact("eyJ")), _whole, lead=True),
    # Its anchors are the wording in the fold; the pattern runs on the text (case matters).
    _Pass("aws_secret_key", _SOURCES["aws_secret_key"], (_folded(*_AWS_WORDS),), _aws_secret),
    _Pass(
        "aws_access_key_id",
        _SOURCES["aws_access_key_id"],
        (_exact("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),),
        _whole,
        lead=True,  # every shape opens with "A": one search for it, then a few tries
    ),
    _Pass(
        "azure_key",
        _SOURCES["azure_key"],
        (_exact("="), _folded("accountkey", "sharedaccess")),
        folded=True,
    ),
    _Pass(
        "stripe",
        _SOURCES["stripe"],
        (_exact("k_live_", "k_test_", "k_prod_"),),
        _whole,
        alternatives=(f"r{_STRIPE_AFTER_R_OR_S}", f"s{_STRIPE_AFTER_R_OR_S}"),
    ),
    _Pass("npm", _SOURCES["npm"], (_exact("npm_"),), _whole, lead=True),
    _Pass("huggingface", _SOURCES["huggingface"], (_exact("hf_"),), _whole, lead=True),
    _Pass(
        "gitlab",
        _SOURCES["gitlab"],
        (_exact("glpat-", "glptt-", "gldt-", "glrt-"),),
        _whole,
        lead=True,  # `re` searches for the shapes' common "gl" once
    ),
    _Pass("twilio", _SOURCES["twilio"], (_exact("SK"),), _whole, lead=True),
    _Pass("sendgrid", _SOURCES["sendgrid"], (_exact("SG."),), _whole, lead=True),
    _Pass("cookie", _SOURCES["cookie"], (_folded("cookie"), _ASSIGN), folded=True),
)

# What a cut can make match at the very start of a tail that did not match in context + tail:
# the rules that look at the character before them (`\b`, a look-behind).
_WORD_CHAR = re.compile(r"\w")
_BOUNDARY_STARTS = ("sk-", "aiza", "gh", "github_pat_", "xox", "authorization", "bearer")


def looks_secret_name(name: str) -> bool:
    """True when an environment variable NAME suggests its value is a credential."""
    return _SECRET_NAME.search(name) is not None


def secret_env_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """Values of `env` whose name looks secret and whose value is long enough to matter."""
    # Names first: reading every value of os.environ decodes each one, which costs more
    # than the spawn it guards on a short-lived child.
    names = [name for name in env if _SECRET_NAME.search(name)]
    return tuple(value for value in map(env.__getitem__, names) if len(value) >= MIN_ENV_SECRET_LEN)


def _literal_secrets(extra_secrets: Iterable[str]) -> list[str]:
    # A "secret" inside the marker itself would re-mask its own output forever. Built as
    # the reference builds it, so equal-length secrets come in the same order.
    literal = {s for s in extra_secrets if s and s not in REDACTED}
    return sorted(literal, key=len, reverse=True)


def _escaped_forms(secret: str) -> tuple[str, ...]:
    """How `secret` reads inside a JSON string, where that differs from the secret."""
    if secret.isascii() and secret.isprintable() and '"' not in secret and "\\" not in secret:
        return ()
    import json  # only a secret with quotes, backslashes or non-ASCII needs it

    forms = {json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    return tuple(form for form in forms if form != secret and form not in REDACTED)


# --- the redaction of one text, remembering where each piece of the output came from

# A piece of the output: original offsets [start, end) and its text, None for
# `original[start:end]` kept as it was, else what replaced it (the marker, or part of one
# when a later mask cut a marker in two; such a part after the first has start == end).
_Piece = tuple[int, int, "str | None"]
# A mask: where the whole match lies and where the masked part lies, in original offsets.
_Mask = tuple[int, int, int, int]


def _length(piece: _Piece) -> int:
    start, end, text = piece
    return end - start if text is None else len(text)


def _sub_piece(piece: _Piece, lo: int, hi: int) -> _Piece:
    """The part of `piece` that is its output [lo, hi)."""
    start, end, text = piece
    if text is None:
        return (start + lo, start + hi, None)
    if lo == 0 and hi == len(text):
        return piece
    return (start, end, text[:hi]) if lo == 0 else (end, end, text[lo:hi])


def _untouched(pieces: list[_Piece]) -> bool:
    """True when `pieces` are one unmasked piece: output and original offsets agree."""
    return len(pieces) == 1 and pieces[0][2] is None and pieces[0][0] == 0


def _masked_whole(piece: _Piece, spans: list[tuple[int, int, int, int]]) -> list[_Piece]:
    """`_masked([piece], spans)` for one unmasked piece that starts at 0."""
    out: list[_Piece] = []
    kept = 0
    for _, _, start, end in spans:
        if start > kept:
            out.append((kept, start, None))
        out.append((start, end, REDACTED))
        kept = end
    if kept < piece[1]:
        out.append((kept, piece[1], None))
    return out


def _masked(pieces: list[_Piece], spans: list[tuple[int, int, int, int]]) -> list[_Piece]:
    """`pieces` with each output span's masked part (sorted, disjoint, non-empty) turned
    into one marker that stands for the original offsets it covers."""
    starts = _Trace._offsets(pieces)  # where each piece starts in the output
    find = bisect.bisect_right
    out: list[_Piece] = []
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


class _Trace:
    """Phases 1 and 2 over one text as pieces of output, and the masks of phase 3.

    `matches` (phase 1 and 2 matches in original offsets, for `crosses`) is kept only when
    asked for: mapping each match back costs what masking it does.
    """

    __slots__ = ("_low", "current", "gate", "matches", "original", "phase1", "pieces")

    def __init__(
        self, original: str, gate: _Gate | None = None, *, track_matches: bool = True
    ) -> None:
        self.original = original
        self.pieces: list[_Piece] = [(0, len(original), None)] if original else []
        self.current = original
        self._low: str | None = None  # _fold(current), once asked for
        self.matches: list[_Mask] | None = [] if track_matches else None
        self.phase1: tuple[list[_Piece], str] = (self.pieces, original)
        self.gate = _Gate(original) if gate is None else gate

    # -- offsets

    @staticmethod
    def _offsets(pieces: list[_Piece]) -> list[int]:
        starts: list[int] = []
        total = 0
        for piece in pieces:
            starts.append(total)
            total += _length(piece)
        return starts

    def _masks(self, pieces: list[_Piece], spans: list[tuple[int, int, int, int]]) -> list[_Mask]:
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

    def _replace(self, spans: list[tuple[int, int, int, int]]) -> None:
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
            spans: list[tuple[int, int, int, int]] = []
            while found >= 0:
                spans.append((found, found + len(secret), found, found + len(secret)))
                found = current.find(secret, found + len(secret))
            self._replace(spans)
        self.phase1 = (self.pieces, self.current)
        if self.current is not self.original:
            self.gate = _Gate(self.current)
        for step in _REFERENCE_PASSES:
            if self.gate.opens(step):
                if self.current is self.phase1[1]:
                    low = self.gate.fold() if step.folded else ""
                else:
                    if self._low is None and step.folded:
                        self._low = _fold(self.current)
                    low = self._low or ""
                spans = _spans(step, self.current, low, self.gate)
                if spans:
                    self._replace(spans)

    def extra_masks(self, secrets: Sequence[str]) -> list[_Mask]:
        """Phase 3: what the added shapes mask in the text as phase 1 left it."""
        pieces, text = self.phase1
        spans = _extra_spans(text, self.gate, secrets)
        return self._masks(pieces, spans) if spans else []

    def crosses(self, cut: int) -> bool:
        """True when a phase 1 or 2 match runs across original offset `cut`."""
        assert self.matches is not None, "a trace made with track_matches=False"
        return any(start < cut < end for start, end, _, _ in self.matches)

    def pieces_from(self, cut: int) -> list[_Piece]:
        """The output pieces that came from original offsets `cut` on (no piece may cross
        it). The rest of a marker that ended at `cut` stays behind with its marker."""
        out: list[_Piece] = []
        for start, end, text in self.pieces:
            if text is None:
                if end > cut:
                    out.append((max(start, cut), end, None))
            elif start > cut or (start == cut and end > cut):
                out.append((start, end, text))
        return out


def _extra_spans(text: str, gate: _Gate, secrets: Sequence[str]) -> list[tuple[int, int, int, int]]:
    """Phase 3 over `text` (as phase 1 left it; `gate` is its gate): the JSON-escaped forms
    of the literal secrets, then each added shape."""
    spans: list[tuple[int, int, int, int]] = []
    for secret in secrets:
        for form in _escaped_forms(secret):
            found = text.find(form)
            while found >= 0:
                spans.append((found, found + len(form), found, found + len(form)))
                found = text.find(form, found + len(form))
    for step in _EXTRA_PASSES:
        if gate.opens(step):
            spans.extend(_spans(step, text, gate.fold() if step.reads_fold else "", gate))
    return spans


def _spans(
    step: _Pass, text: str, low: str, gate: _Gate | None = None
) -> list[tuple[int, int, int, int]]:
    """(match start, match end, masked start, masked end) of each match `step` masks in
    `text`, whose fold is `low` (the two have the same length); `gate`, when given, is
    the gate of `text` or of the text `low` is the fold of."""
    if step.span is _aws_secret:
        return _aws_secret_spans(step, text, low)
    spans: list[tuple[int, int, int, int]] = []
    span = step.span
    subject = low if step.folded else text
    matches: Iterable[re.Match[str]]
    if step.named:
        if _names_dense(low):
            # One scan for the pattern costs less than finding and trying each start.
            matches = step.pattern.finditer(low)
        else:
            starts = _name_starts(low) if gate is None else gate.name_starts(low)
            matches = _matches_from(step.pattern, low, starts)
    elif step.alternative_sources and len(subject) > _EAGER_CHARS:
        # The gate rules out a shape only when it is the gate of the text searched here.
        checks = gate if gate is not None and gate.text is text else None
        alternatives = [
            pattern
            for pattern, lead in zip(step.alternatives, step.alternative_leads, strict=True)
            if checks is None or checks.may_hold(lead, step.folded)
        ]
        matches = _alternation_matches(alternatives, subject)
    else:
        matches = step.pattern.finditer(subject)
    # The two common shapes are inlined: on a text full of credentials this loop is most
    # of the work, a few calls per match.
    if span is _whole:
        return [(start, end, start, end) for start, end in map(_match_span, matches)]
    if span is _after_prefix:
        return [
            (match.start(), end, start, end)
            for match in matches
            if (start := match.end(1)) < (end := match.end())
        ]
    for match in matches:
        masked = span(match)
        if masked is not None and masked[0] < masked[1]:
            spans.append((match.start(), match.end(), masked[0], masked[1]))
    return spans


_match_span = operator.methodcaller("span")


def _names_dense(low: str) -> bool:
    """Whether a long fold holds name words so densely that trying a named pattern at each
    start costs more than one scan of the whole fold (judged on three samples of it: this
    only chooses the faster of two ways to the same matches)."""
    size = len(low)
    if size < 4 * _DENSE_SAMPLE:
        return False
    starts = 0
    for begin in (0, (size - _DENSE_SAMPLE) // 2, size - _DENSE_SAMPLE):
        end = begin + _DENSE_SAMPLE
        starts += sum(low.count(word, begin, end) * len(at) for word, at in _NAME_STARTS)
    return starts * _DENSE_NAMES > 3 * _DENSE_SAMPLE


def _name_starts(low: str) -> list[int]:
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


def _matches_from(
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


def _alternation_matches(
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
def _aws_word_finders() -> tuple[re.Pattern[str], ...]:
    # Each word where it starts (a look-ahead, so words that overlap are all found), in
    # one search per first letter: "a" opens three of them.
    by_first: dict[str, list[str]] = {}
    for word in _AWS_WORDS:
        by_first.setdefault(word[0], []).append(re.escape(word[1:]))
    return tuple(
        re.compile(f"{re.escape(first)}(?=({'|'.join(rests)}))")
        if len(rests) > 1
        else re.compile(f"({re.escape(first)}{rests[0]})")
        for first, rests in by_first.items()
    )


@functools.cache
def _name_finders() -> tuple[tuple[re.Pattern[str], tuple[int, ...]], ...]:
    # A literal first, so the engine skips ahead with a substring search.
    reach = f"(?=[^:=\\n]{{0,{_NAME_REACH - 1}}}+[:=])"
    return tuple((re.compile(re.escape(word) + reach), offsets) for word, offsets in _NAME_STARTS)


def _aws_secret_spans(step: _Pass, text: str, low: str) -> list[tuple[int, int, int, int]]:
    """The AWS secret keys: 40-character tokens looked for only where the wording before
    them could be (up to `_AWS_WINDOW` characters after a word, on its line); each is then
    checked exactly as `_aws_secret` says. Each stretch of text is searched once."""
    reach: list[tuple[int, int]] = []
    for finder in _aws_word_finders():
        for word in finder.finditer(low):
            found, after = word.start(), word.end(1)
            line_end = low.find("\n", after, found + _AWS_WINDOW)
            reach.append((after, found + _AWS_WINDOW if line_end < 0 else line_end))
    # Where tokens may start, as disjoint stretches: the words of one line ("aws" and
    # "secret" in AWS_SECRET_ACCESS_KEY) reach over the same text.
    stretches: list[tuple[int, int]] = []
    for first, last in sorted(reach):
        if stretches and first <= stretches[-1][1] + 1:
            if last > stretches[-1][1]:
                stretches[-1] = (stretches[-1][0], last)
        elif first <= last:
            stretches.append((first, last))
    spans: list[tuple[int, int, int, int]] = []
    for first, last in stretches:
        # A token starting at `last` ends 40 characters on; the one after shows its end.
        for match in step.pattern.finditer(text, first, min(len(text), last + 41)):
            if match.start() > last:
                break
            if _aws_secret(match) is not None:
                spans.append((match.start(), match.end(), match.start(), match.end()))
    return spans


def _mask_more(pieces: list[_Piece], intervals: list[tuple[int, int]]) -> list[_Piece]:
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
    out: list[_Piece] = []
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


def _masked_intervals(length: int, merged: list[tuple[int, int]]) -> list[_Piece]:
    """`_mask_more([(0, length, None)], intervals)`, given the intervals merged: one
    marker for each, the text between them kept."""
    out: list[_Piece] = []
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


def _render(pieces: list[_Piece], original: str) -> str:
    if len(pieces) == 1 and pieces[0] == (0, len(original), None):
        return original
    return "".join([original[start:end] if text is None else text for start, end, text in pieces])


# No pattern matches fewer characters (`://:p@`): shorter texts only hold literal secrets.
_SHORTEST_MATCH = 6


def _redact(text: str, secrets: Sequence[str]) -> str:
    if secrets:
        for secret in secrets:  # phase 1, as the reference does it
            if secret in text:
                text = text.replace(secret, REDACTED)
    elif len(text) < _SHORTEST_MATCH:
        return text
    gate = _Gate(text)
    if gate.empty:
        return text
    extra = _extra_spans(text, gate, secrets)
    if not extra:
        return _reference_rules(text, gate)
    # Phase 3 masks something: phase 2 has to remember where its output came from.
    trace = _Trace(text, gate, track_matches=False)
    trace.reference_phases(())
    pieces = _mask_more(trace.pieces, [(start, end) for _, _, start, end in extra])
    return _render(pieces, text)


def _reference_rules(text: str, gate: _Gate) -> str:
    """Phase 2 over `text` (`gate` is its gate), each rule over what the one before left."""
    current = text
    low: str | None = None
    for step in _REFERENCE_PASSES:
        if not gate.opens(step):
            continue
        if step.folded and low is None:
            low = gate.fold() if current is text else _fold(current)
        spans = _spans(step, current, low or "", gate)
        if spans:
            parts: list[str] = []
            last = 0
            for _, _, start, end in spans:
                parts.append(current[last:start])
                parts.append(REDACTED)
                last = end
            parts.append(current[last:])
            current = "".join(parts)
            low = None
    return current


def redact(text: str, extra_secrets: Iterable[str] = ()) -> str:
    """`text` with credentials replaced by `[REDACTED]`.

    Masks the literal `extra_secrets` (longest first, so a secret containing another is
    masked whole; empty strings and parts of the marker are ignored), then vendor key
    shapes, then values that follow a secret-sounding name, header or flag, then the
    shapes listed in the module docstring. Idempotent: redacting twice changes nothing
    more.
    """
    return _redact(text, _literal_secrets(extra_secrets))


def redact_tail(tail: str, context: str, extra_secrets: Iterable[str] = ()) -> str:
    """`redact(tail)`, where `tail` is what was kept of a longer text and `context` the
    text that came just before it.

    A cut can slice a credential in two: the half inside `tail` no longer looks like one.
    `context + tail` is redacted once; a credential that runs across the cut is masked
    from the start of the tail through its end, and the rest of the tail is kept as that
    one redaction left it (see the module docstring for how this matches the old
    two-redaction result).
    """
    secrets = _literal_secrets(extra_secrets)
    if not context:
        return _redact(tail, secrets)
    split = _line_after_cut(context, tail, secrets)
    if split * _SHORT_HEAD > len(tail):
        # The first line is most of the tail (or all of it): redacting it twice more
        # would cost more than tracing the whole tail once.
        return _redact_across(tail, context, secrets)
    # Only the first line can see the cut: the tail costs what `redact` costs, without
    # tracing where each piece of its output came from, and its redaction is the first
    # line's followed by the rest's. Where the cut changes nothing in the first line
    # (almost always), that is the answer as it is, not a copy of it.
    head = tail[:split]
    head_out, head_alone = _redact_across(head, context, secrets), _redact(head, secrets)
    whole = _redact(tail, secrets)
    if head_out == head_alone:
        return whole
    return head_out + whole[len(head_alone) :]


def _line_after_cut(context: str, tail: str, secrets: Sequence[str]) -> int:
    """Where in `tail` the text starts that is redacted the same with `context` before it
    as on its own: just after the tail's first newline, when no match can run across
    that newline. Only a private key block and a literal secret holding a newline can;
    when either may, the whole tail (`len(tail)`)."""
    newline = tail.find("\n")
    if newline < 0 or any("\n" in secret for secret in secrets):
        return len(tail)
    split = newline + 1
    reach = len(_PEM_START) - 1  # a block's opening cut in two is still one opening
    if (
        _PEM_START in context
        or _PEM_START in context[-reach:] + tail[:reach]
        or tail.find(_PEM_START, 0, split) >= 0
    ):
        return len(tail)
    return split


def _redact_across(tail: str, context: str, secrets: Sequence[str]) -> str:
    """`redact_tail` on phases 1 to 3 (`secrets` as `_literal_secrets` gives them)."""
    joined = context + tail
    cut = len(context)
    seen = _Trace(joined)
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
        kept = _mask_more(kept, intervals)
    if kept == [(cut, len(joined), None)]:
        return tail  # nothing in it masked: the tail as given, not a copy of it
    return "".join([joined[start:end] if text is None else text for start, end, text in kept])


def _may_start_differently(context: str, tail: str) -> bool:
    """Whether a reference rule could match at the start of `tail` alone but not after
    `context`: only one that checks the character before it, after a word character."""
    return _WORD_CHAR.match(context[-1]) is not None and _fold(tail[:16]).startswith(
        _BOUNDARY_STARTS
    )


def _reference_tail(seen: _Trace, tail: str, cut: int, secrets: Sequence[str]) -> list[_Piece]:
    """The old rule on phases 1 and 2: redact the tail alone and `context + tail`; keep the
    lone redaction when the joint one ends with it, else mask the head they differ in.

    The two agree after the tail's first newline (no reference rule matches across one,
    and each restarts there), so only the first line is redacted alone. A literal secret
    holding a newline could cross it: then the whole tail is.
    """
    newline = tail.find("\n")
    first = len(tail) if newline < 0 or any("\n" in s for s in secrets) else newline + 1
    alone = _Trace(tail[:first])
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
    rest = _output_from(head, len(alone.current) - agree) + after
    end = rest[0][0] if rest else cut + len(tail)
    return [(cut, max(cut, end), REDACTED), *rest]


def _output_from(pieces: list[_Piece], at: int) -> list[_Piece]:
    """The pieces from output offset `at` on (the piece holding `at` cut there)."""
    out: list[_Piece] = []
    position = 0
    for piece in pieces:
        size = _length(piece)
        if position + size > at:
            lo = max(0, at - position)
            out.append(piece if lo == 0 else _sub_piece(piece, lo, size))
        position += size
    return out


def _common_suffix_len(a: str, b: str) -> int:
    agree = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):  # the shorter one bounds it
        if x != y:
            break
        agree += 1
    return agree


def redact_argv(argv: Sequence[str], extra_secrets: Iterable[str] = ()) -> tuple[str, ...]:
    """Each argument redacted, and the argument after a bare secret flag masked whole.

    `["--api-key", "abc"]` stores as `["--api-key", "[REDACTED]"]`: the value stands alone,
    so no in-text pattern could see its name.
    """
    secrets = _literal_secrets(extra_secrets)
    out: list[str] = []
    mask_next = False
    for item in argv:
        if mask_next and item:
            out.append(REDACTED)
        else:
            out.append(_redact(item, secrets))
        mask_next = _SECRET_FLAG_ITEM.fullmatch(item) is not None
    return tuple(out)
