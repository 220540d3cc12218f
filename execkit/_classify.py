"""The failure classifier (ADR 0046): did a failed attempt produce information about the work?

`classify(result)` answers for a `SpawnResult`, in order of durability:

1. A succeeded run is never classed (None).
2. Structure: `spawn_errno == ENOENT` is **environment** (reason `spawn errno ENOENT`, or
   `missing working directory` when the spawn error says the cwd was absent). Any other
   spawn errno (EACCES, E2BIG...) is **work**, reason `spawn errno <NAME>`: it is not
   positively identified, so it charges. A bare exit 127 with no errno is work: a shell
   exits 127 legitimately. Nothing is environment because of what the text says.
3. Text: `classify_text` over the last `TAIL_CHARS` (8 KiB) of `failure_text()`.
4. Otherwise **work**: reason `timeout` for a timed-out run, else `default`.

`classify_text(text)` is upstream or work, never environment. It reads only the tail and is
linear time: every gap is bounded (`{0,n}`) and no quantifier is nested, so Python's
backtracking engine does constant work per start position, and a pattern runs at all only
when its literal keyword occurs in the tail.

The upstream list is tight on purpose: a false positive wrongly withholds a charge, while a
false negative only charges an attempt as before this classifier existed. A bare number
is never enough; it must be presented as an HTTP/API status, and only 429 and 500-599
count (so `HTTP 404`, `401 Unauthorized`, `400 invalid_request_error`, `processed 500
files`, `line 503`, `max_tokens: 4290`, `port 5000` stay work).

| rule | class | reason | examples (case-insensitive) |
|---|---|---|---|
| `http` | upstream | `http N` | `HTTP/1.1 503`, `HTTP/2 502`, `HTTP Error 429`, `HTTPError: 500` |
| `status` | upstream | `http N` | `status 503`, `"status_code": 500`, `statusCode: 529` |
| `api-error` | upstream | `http N` | `API Error: 529`, `API Error (503`, `APIError: 500` |
| `error-code` | upstream | `http N` | `Error code: 429`, `"code": 503`, `'code': 500` |
| `status-phrase` | upstream | `http N` | `503 Service Unavailable`, `502 Bad Gateway` |
| | | | `504 Gateway Time-out`, `500 Internal Server Error`, `500 Server Error` |
| | | | `429 Too Many Requests`, `529 Overloaded` |
| `circuit` | upstream | `circuit open` | `circuit open`, `circuit breaker is open` |
| | | | `circuit-breaker opened`, `CircuitBreakerOpenError` |
| `overloaded` | upstream | `overloaded` | `"overloaded_error"`, `"Overloaded"` |
| | | | `model is overloaded`, `currently overloaded`, `APICallError: Overloaded` |
| `unavailable` | upstream | `service unavailable` | `Service Unavailable` |
| | | | `Service Temporarily Unavailable`, `"service_unavailable"` |
| | | | `"status": "UNAVAILABLE"` |
| `rate-limit` | upstream | `rate limited` | `rate limit exceeded`, `Rate limit reached for gpt-5` |
| | | | `rate limiting detected`, `"rate_limit_error"`, `Too Many Requests` |
| | | | `would exceed the rate limit`, `being rate limited`, `Error: rate limited` |
| `quota` | work | `insufficient quota` | `insufficient_quota`, `exceeded your current quota` |
| `billing` | work | `billing` | `credit balance is too low`, `check your plan and billing` |
| | | | `billing_hard_limit_reached`, `402 Payment Required` |
| `usage-limit` | work | `usage limit` | `Claude AI usage limit reached` |
| | | | `You've hit your usage limit` |
| `retry-notice` | ignored | | `status 503; retrying 1/5` with more output after that line |
| (none) | work | `default` | `HTTP 404`, `401 Unauthorized`, `400 invalid_request_error` |
| | | | `context_length_exceeded`, `processed 500 files`, `line 503` |
| | | | `max_tokens: 4290`, `port 5000`, `Connection refused`, `Request timed out` |
| | | | `assert resp.status == 503` |

Why the rows are as they are:

- A numeric status counts only where the text presents it as one (after `HTTP`, `status`,
  `API Error`, `error code`, a JSON `"code"` key, or before its reason phrase), and only
  429 or 500-599. Word boundaries keep `4290`, `5000` and `1503` from matching.
- A status followed by `/`, `%` or `of` is a progress count (`status: 500/1000`), not HTTP.
  A status compared with `==` is code or a test assertion an agent printed
  (`assert resp.status_code == 429`), not a response.
- Wording rules need a vendor-shaped context: C++'s `call of overloaded 'f'`, a test named
  `test_rate_limit_exceeded`, `HTTPStatus.SERVICE_UNAVAILABLE` or errno EAGAIN's `Resource
  temporarily unavailable` are work, so snake_case forms count only when quoted (a JSON
  value) and no identifier may run into the front of a phrase.
- The account-limit rows (`quota`, `billing`, `usage-limit`) veto upstream wherever they
  appear in the tail, even next to a 429: an exhausted quota, an unpaid bill or a plan's
  usage cap does not recover within a retry backoff, so going uncharged would only spin
  until the uncharged bound. They need a person, and they charge as before.
- A vendor CLI announces a transient failure it is about to retry (`...; retrying 1/5`,
  `Retrying in 1 seconds`). If the retry then succeeded and the work failed later, that
  notice must not excuse the work, so a notice counts only when it is the last line (the
  run ended while still retrying). When every retry fails, the CLI's final line says so.
- Network failures (connection refused or reset, DNS, TLS) and client-side timeouts are not
  on the list: the vendor never answered, and nothing positively says it refused.
- When several upstream signals appear, a numeric status beats wording (it is more
  specific), and within each kind the one nearest the end wins (transcripts put the reason
  last).
"""

from __future__ import annotations

import bisect
import enum
import errno
import re
import string

import attrs
from attrs.validators import instance_of, max_len

from execkit._errors import InvalidInput
from execkit._exec import SpawnFailure, SpawnResult
from execkit._json import json_key, to_json
from execkit._validate import checked, integer_arg, non_blank, opt_checked

__all__ = [
    "ACCOUNT_LIMIT_REASONS",
    "EVIDENCE_CHARS",
    "TAIL_CHARS",
    "Classification",
    "FailureClass",
    "Reason",
    "classification_fields",
    "classify",
    "classify_text",
    "is_upstream_status",
]

TAIL_CHARS = 8192
"""How much of the failure text the text rules read: its last 8 KiB (characters)."""

EVIDENCE_CHARS = 200
"""The longest evidence snippet a `Classification` carries."""

_MAX_REASON_CHARS = 64


class FailureClass(enum.StrEnum):
    """Did a failed attempt produce information about the work?"""

    WORK = "work"
    ENVIRONMENT = "environment"
    UPSTREAM = "upstream"

    @property
    def charged(self) -> bool:
        """Only work failures spend the charged budget."""
        return self is FailureClass.WORK


class Reason(enum.StrEnum):
    """The fixed reasons code compares; others are formatted (`http 503`, `spawn errno EIO`)."""

    DEFAULT = "default"  # work: nothing identified the failure
    TIMEOUT = "timeout"  # work: the run was timed out with nothing upstream to show
    MISSING_BINARY = "spawn errno ENOENT"  # environment: the program is not there
    MISSING_CWD = "missing working directory"  # environment: the cwd is not there
    CIRCUIT_OPEN = "circuit open"
    OVERLOADED = "overloaded"
    SERVICE_UNAVAILABLE = "service unavailable"
    RATE_LIMITED = "rate limited"
    INSUFFICIENT_QUOTA = "insufficient quota"  # an account limit: work, never upstream
    BILLING = "billing"
    USAGE_LIMIT = "usage limit"


ACCOUNT_LIMIT_REASONS = frozenset({Reason.INSUFFICIENT_QUOTA, Reason.BILLING, Reason.USAGE_LIMIT})
"""Reasons that name an account limit: no backoff cures them, so they veto upstream."""


@attrs.frozen
class Classification:
    """Why one failed attempt failed.

    `reason` is short and stable (`http 503`, `spawn errno ENOENT`, `default`); `evidence`
    is the text that decided it (at most `EVIDENCE_CHARS`), or None when nothing matched.
    Construction raises `InvalidInput` for a value outside those shapes.
    """

    failure_class: FailureClass = attrs.field(
        validator=checked(f"a FailureClass ({', '.join(FailureClass)})", instance_of(FailureClass)),
        metadata=json_key("class"),
    )
    reason: str = attrs.field(
        validator=checked(
            f"a non-empty string of at most {_MAX_REASON_CHARS} characters",
            non_blank,
            max_len(_MAX_REASON_CHARS),
        )
    )
    evidence: str | None = attrs.field(
        default=None,
        validator=opt_checked(
            f"a string of at most {EVIDENCE_CHARS} characters",
            instance_of(str),
            max_len(EVIDENCE_CHARS),
        ),
    )

    @property
    def charged(self) -> bool:
        """True when the attempt spends the charged budget (class work)."""
        return self.failure_class.charged

    def to_dict(self) -> dict[str, str | None]:
        """`{"class": ..., "reason": ..., "evidence": ...}`, JSON-safe."""
        return to_json(self)


_NO_CLASSIFICATION: dict[str, str | None] = {"class": None, "reason": None, "evidence": None}


# --- the text rules -------------------------------------------------------------------------
#
# Patterns run on a lowered copy of the tail with the same length, so match offsets index the
# original for evidence. An alternative runs only when one of its keywords occurs in the tail
# (a substring search), which keeps the common case to a few fast scans. Alternatives whose
# keyword is frequent in logs (`status`, `http`, `error`, `code`) start with that literal so
# the engine skips ahead with a prefix search; context that must precede the keyword is a
# fixed-width look-behind placed after it. No quantifier is nested and every gap is bounded,
# so each start position costs constant work: linear time on Python's backtracking engine.

_FLAGS = re.ASCII | re.MULTILINE

# After a status number: not part of a longer number or word, not a decimal, and not a
# progress count (`500/1000`, `500 of 1000`, `50%`).
_CODE_END = r"(?![\w%]|\.\d|\s{0,2}/|\s{1,2}of\s)"
# An optional quote, possibly backslash-escaped (JSON nested in a JSON string).
_Q = r"\\?[\"']?"
# Between a status key and its number: spaces, a colon or one `=`. Never `==`: that is a
# comparison in code or a test assertion (`assert resp.status == 503`), not a status.
_ASSIGN = r"=(?!=)"
_SEP = rf"(?:[ \t:]|{_ASSIGN}){{0,4}}"
_CODE = r"(?P<code>\d{3})"

# HTTP reason phrases that present the number before them as a status.
_STATUS_PHRASES = (
    "service unavailable",
    "service temporarily unavailable",
    "bad gateway",
    "gateway timeout",
    "gateway time-out",
    "internal server error",
    "server error",
    "too many requests",
    "overloaded",
)


@attrs.frozen
class _Alternative:
    keywords: tuple[str, ...]
    pattern: re.Pattern[str]


@attrs.frozen
class _Rule:
    name: str
    # None for a numeric rule: the reason is `http N` from the pattern's `code` group.
    reason: str | None
    alternatives: tuple[_Alternative, ...]


def _rule(name: str, reason: str | None, *alternatives: tuple[str | tuple[str, ...], str]) -> _Rule:
    return _Rule(
        name,
        reason,
        tuple(
            _Alternative((kw,) if isinstance(kw, str) else kw, re.compile(pattern, _FLAGS))
            for kw, pattern in alternatives
        ),
    )


_NUMERIC_RULES = (
    _rule(
        "http",
        None,
        (
            "http",
            r"http(?<![a-z0-9_]http)(?:/\d(?:\.\d)?)?(?:[ _-]?(?:error|status|code))?"
            rf"{_Q}(?:[ \t:(\[]|{_ASSIGN}){{0,3}}{_CODE}{_CODE_END}",
        ),
    ),
    _rule(
        "status",
        None,
        (
            "status",
            rf"status(?<![a-z0-9]status)(?:[ _-]?code)?{_Q}{_SEP}{_Q}{_CODE}{_CODE_END}",
        ),
    ),
    _rule(
        "api-error",
        None,
        ("api", rf"api(?<![a-z0-9_]api)[ _]?error[ \t:(\[]{{0,3}}{_CODE}{_CODE_END}"),
    ),
    _rule(
        "error-code",
        None,
        (
            "error",
            rf"error(?<![a-z0-9_]error)[ _-]?code{_Q}{_SEP}{_Q}{_CODE}{_CODE_END}",
        ),
        ('"code', rf'"code\\?"{_SEP}{_Q}{_CODE}{_CODE_END}'),
        ("'code", rf"'code\\?'{_SEP}{_Q}{_CODE}{_CODE_END}"),
    ),
    _rule(
        "status-phrase",
        None,
        *(
            (
                phrase,
                rf"{re.escape(phrase)}\b"
                rf"(?<=(?<![\w.:/-]){_CODE}[ \t]{re.escape(phrase)})",
            )
            for phrase in _STATUS_PHRASES
        ),
    ),
)

_RATE_LIMIT = ("rate limit", "rate-limit")

_UPSTREAM_WORDING = (
    _rule(
        "circuit",
        Reason.CIRCUIT_OPEN,
        (
            "circuit",
            r"circuit(?<![a-z0-9_]circuit)(?<!short[ -]circuit)[ _-]?(?:breaker)?[ _-]?"
            r"(?:is\s|was\s|has\s|been\s|now\s|currently\s|state\W{0,3}){0,3}"
            r"open(?:ed|error|exception)?\b",
        ),
    ),
    _rule(
        "overloaded",
        Reason.OVERLOADED,
        ("overloaded", r"overloaded(?<=[\"']overloaded)(?:_error)?\\?[\"']"),
        ("overloaded_error", r"overloaded_error(?<![a-z0-9_]overloaded_error)\b"),
        (
            "overloaded",
            r"\b(?:server|servers|model|models|service|engine|api|system|backend|upstream"
            r"|cluster|endpoint|capacity)\s(?:is\s|are\s|was\s|currently\s|temporarily\s){1,2}"
            r"overloaded\b",
        ),
        ("overloaded", r"\b(?:currently|temporarily)\s{1,2}overloaded\b"),
        ("overloaded", r"(?:error|exception)[ \t:]{1,3}overloaded[ \t]{0,3}(?:$|[.!\"'}\]])"),
    ),
    _rule(
        "unavailable",
        Reason.SERVICE_UNAVAILABLE,
        ("service", r"service(?<![a-z0-9_]service)[ -](?:temporarily[ -])?unavailable\b"),
        ("service_unavailable", r"service_unavailable(?<=[\"']service_unavailable)\\?[\"']"),
        ("unavailable", rf"status(?<![a-z0-9]status){_Q}{_SEP}\\?[\"']unavailable\\?[\"']"),
    ),
    _rule(
        "rate-limit",
        Reason.RATE_LIMITED,
        (
            _RATE_LIMIT,
            r"rate(?<![a-z0-9_]rate)[ -]limit(?:ing)?[ \t]{1,2}"
            r"(?:exceeded|reached|detected|hit|error)\b",
        ),
        ("rate_limit", r"rate_limit(?<=[\"']rate_limit)(?:_exceeded|_error|ed)\\?[\"']"),
        (
            _RATE_LIMIT,
            r"\b(?:exceed|exceeded|exceeds|exceeding|hit|reached|over)\s"
            r"(?:the\s|your\s|a\s|our\s)?(?:[a-z]{1,12}\s)?rate[ -]limits?\b",
        ),
        (
            _RATE_LIMIT,
            r"\b(?:being|been|got|getting|was|were)\s(?:temporarily\s)?rate[ -]limited\b",
        ),
        (_RATE_LIMIT, r"(?:^|error)\W{0,4}rate[ -]limited\b"),
        ("too many requests", r"\btoo many requests\b"),
    ),
)

_ACCOUNT_LIMITS = (
    _rule(
        "quota",
        Reason.INSUFFICIENT_QUOTA,
        ("insufficient_quota", r"insufficient_quota"),
        ("quota", r"\bexceeded your (?:current )?quota\b"),
    ),
    _rule(
        "billing",
        Reason.BILLING,
        ("credit balance", r"\bcredit balance is too low\b"),
        ("billing", r"\bplan and billing\b"),
        ("billing", r"\bbilling[ _](?:details|hard[ _]limit)"),
        ("payment required", r"\bpayment required\b"),
    ),
    _rule(
        "usage-limit", Reason.USAGE_LIMIT, (("usage limit", "usage_limit"), r"\busage[ _]limit\b")
    ),
)

_RULES = _NUMERIC_RULES + _UPSTREAM_WORDING + _ACCOUNT_LIMITS

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _lowered(text: str) -> str:
    """`text` lowered with every character kept in place (offsets stay valid)."""
    low = text.lower()
    # lower() never drops a character, so equal lengths mean a one-to-one mapping; the rare
    # character that expands (U+0130) falls back to ASCII-only lowering.
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def is_upstream_status(code: int) -> bool:
    """True for an HTTP status that means the vendor refused: 429 or 500..599."""
    return code == 429 or 500 <= code <= 599


def _line_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    return line_start, len(text) if line_end < 0 else line_end


def _evidence(text: str, start: int, end: int) -> str:
    """The line around a match, cut to `EVIDENCE_CHARS` around the match."""
    line_start, line_end = _line_bounds(text, start, end)
    line = text[line_start:line_end].strip()
    if len(line) <= EVIDENCE_CHARS:
        return line
    # Centre a window on the match; a match longer than the window keeps its head.
    slack = max(0, EVIDENCE_CHARS - (end - start))
    lo = max(line_start, start - slack // 2)
    hi = min(line_end, lo + EVIDENCE_CHARS)
    lo = max(line_start, hi - EVIDENCE_CHARS)
    return text[lo:hi].strip()


@attrs.frozen
class _Hit:
    rule: str
    start: int
    end: int
    reason: str


class _Scan:
    """One lowered tail, and the lines that are retry notices other output followed."""

    def __init__(self, tail: str) -> None:
        self.low = _lowered(tail)
        self._notice_starts, self._notice_ends = self._stale_notices()

    def _stale_notices(self) -> tuple[list[int], list[int]]:
        # One pass: each search resumes after the line it found, so even a single huge line
        # full of "retrying" costs linear time.
        low = self.low
        last_line_start = low.rstrip().rfind("\n") + 1
        starts: list[int] = []
        ends: list[int] = []
        position = 0
        while (found := low.find("retrying", position, last_line_start)) >= 0:
            line_start = low.rfind("\n", position, found) + 1 or position
            line_end = low.find("\n", found)
            starts.append(line_start)
            ends.append(line_end)
            position = line_end + 1
        return starts, ends

    def is_stale_notice(self, start: int) -> bool:
        """True when `start` lies on a retry notice that more output followed."""
        index = bisect.bisect_right(self._notice_starts, start) - 1
        return index >= 0 and start <= self._notice_ends[index]

    def last_hit(self, rule: _Rule, *, skip_notices: bool) -> _Hit | None:
        """The rule's counted match nearest the end (an upstream status, not a stale notice)."""
        best: _Hit | None = None
        for alternative in rule.alternatives:
            if not any(keyword in self.low for keyword in alternative.keywords):
                continue
            for match in alternative.pattern.finditer(self.low):
                if best is not None and match.end() <= best.end:
                    continue
                if rule.reason is None:
                    code = int(match.group("code"))
                    if not is_upstream_status(code):
                        continue
                    reason = f"http {code}"
                else:
                    reason = rule.reason
                if skip_notices and self.is_stale_notice(match.start()):
                    continue
                best = _Hit(rule.name, match.start(), match.end(), reason)
        return best

    def latest(self, rules: tuple[_Rule, ...], *, skip_notices: bool) -> _Hit | None:
        """The counted match nearest the end over `rules`; rule order breaks ties."""
        best: _Hit | None = None
        for rule in rules:
            hit = self.last_hit(rule, skip_notices=skip_notices)
            if hit is not None and (best is None or hit.end > best.end):
                best = hit
        return best


def _decide(tail: str) -> tuple[FailureClass, _Hit] | None:
    """The deciding match in `tail`: an account-limit veto (work), else upstream, else None."""
    scan = _Scan(tail)
    veto = scan.latest(_ACCOUNT_LIMITS, skip_notices=False)
    if veto is not None:
        return FailureClass.WORK, veto
    hit = scan.latest(_NUMERIC_RULES, skip_notices=True) or scan.latest(
        _UPSTREAM_WORDING, skip_notices=True
    )
    return None if hit is None else (FailureClass.UPSTREAM, hit)


def _check_tail_chars(tail_chars: int) -> None:
    integer_arg("tail_chars", tail_chars, 1)


def classify_text(text: str, *, tail_chars: int = TAIL_CHARS) -> Classification:
    """Upstream when the last `tail_chars` of `text` match the documented list, else work.

    Never environment: that class comes only from structure (`classify`). Work carries
    reason `default`, or the account-limit row that vetoed upstream. Raises `InvalidInput`
    for a `tail_chars` below 1 or a `text` that is not a str.
    """
    _check_tail_chars(tail_chars)
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a str, got {type(text).__name__}", field="text")
    tail = text[-tail_chars:]
    decided = _decide(tail)
    if decided is None:
        return Classification(FailureClass.WORK, Reason.DEFAULT)
    failure_class, hit = decided
    return Classification(failure_class, hit.reason, _evidence(tail, hit.start, hit.end))


def _errno_name(number: int) -> str:
    return errno.errorcode.get(number, str(number))


def _spawn_evidence(result: SpawnResult) -> str | None:
    if not result.spawn_error:
        return None
    return result.spawn_error.strip()[:EVIDENCE_CHARS] or None


def classify(result: SpawnResult, *, tail_chars: int = TAIL_CHARS) -> Classification | None:
    """Class one spawn's failure; None when it succeeded (`result.ok`).

    Structural rules first (spawn errno), then `classify_text` over the last `tail_chars`
    of `result.failure_text()`, then work (`timeout` or `default`). Raises `InvalidInput`
    for a `tail_chars` below 1.
    """
    _check_tail_chars(tail_chars)
    if result.ok:
        return None
    if result.spawn_errno is not None:
        evidence = _spawn_evidence(result)
        if result.spawn_errno == errno.ENOENT:
            missing_cwd = result.spawn_failure is SpawnFailure.CWD_NOT_FOUND
            reason = Reason.MISSING_CWD if missing_cwd else Reason.MISSING_BINARY
            return Classification(FailureClass.ENVIRONMENT, reason, evidence)
        # Never started, so no vendor spoke: nothing upstream to find in the text.
        return Classification(
            FailureClass.WORK, f"spawn errno {_errno_name(result.spawn_errno)}", evidence
        )
    verdict = classify_text(result.failure_text(tail_chars), tail_chars=tail_chars)
    if verdict.failure_class is FailureClass.UPSTREAM or not result.timed_out:
        return verdict
    return Classification(FailureClass.WORK, Reason.TIMEOUT)


def classification_fields(result: SpawnResult) -> dict[str, str | None]:
    """`classify(result).to_dict()`, or all three keys None for a run that succeeded.

    The shape `execkit run --json` merges into its output.
    """
    verdict = classify(result)
    return dict(_NO_CLASSIFICATION) if verdict is None else verdict.to_dict()
