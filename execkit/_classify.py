"""The failure classifier (ADR 0046): did a failed attempt produce information about the work?

`classify(result)` answers for a `SpawnResult`, in order of durability:

1. A succeeded run is never classed (None).
2. Structure: a spawn errno that means the run never started is **environment**, each with
   its own reason (the adapter layer turns each into its own precondition):

   | spawn fact | reason |
   |---|---|
   | ENOENT, the program is not there | `spawn errno ENOENT` |
   | ENOENT, its `#!` interpreter is not there | `missing interpreter` |
   | the working directory does not exist | `missing working directory` |
   | the working directory is a file or cannot be entered | `unusable working directory` |
   | EACCES (not executable), ENOEXEC (not a program) | `spawn errno <NAME>` |
   | ENOTDIR (its path runs through a file) | `spawn errno ENOTDIR` |

   Any other spawn errno (E2BIG, EMFILE, ENOMEM...) is **work**, reason `spawn errno <NAME>`:
   it is not positively identified, so it charges. A bare exit 127 with no errno is work: a
   shell exits 127 legitimately. Nothing is environment because of what the text says.
3. Text: `classify_text` over the last `TAIL_CHARS` (8 KiB) of `failure_text()`.
4. Otherwise **work**: reason `timeout` for a timed-out run, else `default`.

`classify_text(text)` is upstream or work, never environment. It reads only the tail and is
linear time: every gap is bounded (`{0,n}`) and no quantifier is nested without a bound, so
Python's backtracking engine does constant work per start position, and a pattern runs at
all only when its literal keyword occurs in the tail. An upstream verdict carries
`retry_after_s` when the tail states when to retry (see "Reset times" below).

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
| `sdk-status` | upstream | `http N` | `RateLimitError: 429 {"type":"error"}` |
| | | | `InternalServerError: 529 {}` |
| | | | `google.api_core.exceptions.ResourceExhausted: 429 Quota exceeded` |
| | | | `google.genai.errors.ClientError: 429 RESOURCE_EXHAUSTED` |
| | | | `ServiceUnavailable: 503 The service is currently unavailable.` |
| `no-body` | upstream | `http N` | `Error: 503 status code (no body)` |
| | | | `APIError: 429 status code (no body)` |
| `circuit` | upstream | `circuit open` | `circuit open`, `circuit breaker is open` |
| | | | `circuit-breaker opened`, `CircuitBreakerOpenError` |
| `overloaded` | upstream | `overloaded` | `"overloaded_error"`, `"Overloaded"` |
| | | | `model is overloaded`, `currently overloaded`, `APICallError: Overloaded` |
| | | | `Overloaded`, `HTTP 200: Overloaded` (a whole message that is only that word) |
| `high-demand` | upstream | `overloaded` | `high demand, which may cause temporary errors` |
| | | | `We're currently experiencing high demand, which may cause temporary errors.` |
| `unavailable` | upstream | `service unavailable` | `Service Unavailable` |
| | | | `Service Temporarily Unavailable`, `"service_unavailable"` |
| | | | `"status": "UNAVAILABLE"` |
| `rate-limit` | upstream | `rate limited` | `rate limit exceeded`, `Rate limit reached for gpt-5` |
| | | | `rate limiting detected`, `"rate_limit_error"`, `Too Many Requests` |
| | | | `would exceed the rate limit`, `being rate limited`, `Error: rate limited` |
| | | | `"status": "RESOURCE_EXHAUSTED"` |
| `unreachable` | upstream | `vendor unreachable` | `APIConnectionError: Connection error.` |
| | | | `anthropic.APIConnectionError: Connection error.` |
| | | | `openai.APIConnectionError: Connection error.` |
| | | | `litellm.APIConnectionError: OpenAIException - Connection error.` |
| | | | `API Error: Connection refused — a firewall or proxy may be blocking it` |
| | | | `API Error: Unable to connect to API (ConnectionRefused)` |
| `sdk-server-error` | upstream | `server error` | `openai.InternalServerError: upstream down` |
| | | | `litellm.InternalServerError: AnthropicException - Overloaded` |
| | | | `litellm.ServiceUnavailableError: OpenAIException - busy` |
| | | | `google.genai.errors.ServerError: UNAVAILABLE` |
| | | | `AI_APICallError: Internal server error` |
| `sdk-rate-limit` | upstream | `rate limited` | `openai.RateLimitError: slow down` |
| | | | `litellm.RateLimitError: AnthropicException - slow down` |
| `per-minute-quota` | upstream | `rate limited` | `"quotaId": "GenerateRequestsPerMinute"` |
| | | | `limit 'Generate requests per minute per project'` (lifts a quota veto) |
| `quota` | work | `insufficient quota` | `insufficient_quota`, `exceeded your current quota` |
| `billing` | work | `billing` | `credit balance is too low`, `check your plan and billing` |
| | | | `billing_hard_limit_reached`, `402 Payment Required` |
| `usage-limit` | work | `usage limit` | `Claude AI usage limit reached` |
| | | | `You've hit your usage limit` |
| `retry-notice` | ignored | | `status 503; retrying 1/5` with more output after that line |
| | | | `Reconnecting... 1/5 (unexpected status 503 ...)` with more output after it |
| (none) | work | `default` | `HTTP 404`, `401 Unauthorized`, `400 invalid_request_error` |
| | | | `context_length_exceeded`, `processed 500 files`, `line 503` |
| | | | `max_tokens: 4290`, `port 5000`, `Connection refused`, `Request timed out` |
| | | | `assert resp.status == 503`, `fetch failed`, `Unable to connect to API` |

Why the rows are as they are:

- A numeric status counts only where the text presents it as one (after `HTTP`, `status`,
  `API Error`, `error code`, a JSON `"code"` key, an SDK's exception name, or before its
  reason phrase), and only 429 or 500-599. Word boundaries keep `4290`, `5000` and `1503`
  from matching.
- **The last status decides.** Every presented status (any 100-599) is read, and when the
  one nearest the end is not an upstream one (`400`, `401`...), every upstream signal
  before it is discarded: a CLI that retried a 503 and then got a 400 failed on the 400.
- A status followed by `/`, `%` or `of` is a progress count (`status: 500/1000`), not HTTP.
  A status compared with `==` is code or a test assertion an agent printed
  (`assert resp.status_code == 429`), not a response.
- The SDK exception rows without a status are the clients' exception names that mean one
  kind of vendor failure whatever the body says, qualified by their module as a traceback
  or LiteLLM's `str()` prints them: `openai.`/`anthropic.`/`litellm.` `InternalServerError`
  and `ServiceUnavailableError` (a 5xx), `RateLimitError` (a 429), `APIConnectionError`
  (unreachable); google-genai's `errors.ServerError`; the Vercel AI SDK's
  `AI_APICallError` only with the 5xx sentence `Internal server error`. An `except`
  clause, an import or a bare class name stays work.
- A whole error message that is only `Overloaded` (a line of its own, or after a status
  and `: ` as in `HTTP 200: Overloaded`, an overload sent inside a stream that began with
  200) is an overload; the word inside a sentence (`method overloaded`) or after another
  label (`candidate: overloaded`) is not.
- A quota whose id or limit names a per-minute window (Google's `RESOURCE_EXHAUSTED` with
  `quotaId` `...PerMinute...`) is a rate limit, even though Google words it "You exceeded
  your current quota, please check your plan and billing details": it lifts the quota and
  billing veto. A per-day quota keeps the veto (it is `work` from text; an adapter may
  read it as `environment` from structure).
- claude's `API Error: Connection refused` and `API Error: Unable to connect to API` name
  the API, so they are the `unreachable` row; a bare `ECONNREFUSED`, `fetch failed` or
  `Cannot connect to API` stays work (nothing says a vendor was being called, or the
  adapter reads its CLI's own event).
- The SDK rows are the official clients' own renderings, read in their source: the
  TypeScript SDKs of OpenAI and Anthropic print `RateLimitError: 429 {...}`,
  `InternalServerError: 529 {...}` and, for an empty body, `503 status code (no body)`;
  their Python SDKs print `Error code: 429 - {...}` (the `error-code` row) and
  `anthropic.APIConnectionError: Connection error.` when the API cannot be reached;
  google-api-core prints `ResourceExhausted: 429 ...`; Google's JSON errors carry
  `"status": "RESOURCE_EXHAUSTED"` / `"UNAVAILABLE"`; the Vercel AI SDK's
  `AI_APICallError` carries `statusCode: 503` (the `status` row) or the provider's words.
  The SDK exception names count only in the `Name: <status>` shape, so the agent's own
  `class RateLimitError(Exception)` or `RateLimitError: too many widgets` stay work.
  `high-demand` is codex's fixed sentence for a 5xx it retried (`CodexErr::InternalServerError`),
  matched whole with its clause, so "we are experiencing high demand" alone stays work.
- Wording rules need a vendor-shaped context: C++'s `call of overloaded 'f'`, a test named
  `test_rate_limit_exceeded`, `HTTPStatus.SERVICE_UNAVAILABLE` or errno EAGAIN's `Resource
  temporarily unavailable` are work, so snake_case forms count only when quoted (a JSON
  value) and no identifier may run into the front of a phrase.
- The account-limit rows (`quota`, `billing`, `usage-limit`) veto upstream wherever they
  appear in the tail, even next to a 429: an exhausted quota, an unpaid bill or a plan's
  usage cap does not recover within a retry backoff, so going uncharged would only spin
  until the uncharged bound. They need a person, and they charge as before. **Unless the
  text states a reset after them** (`Please retry in 17.0s`, `try again at 4:00 PM`,
  `usage limit reached|1753459200`): then it is a limit that lifts at a known time, the
  verdict is upstream (the status if one is presented, else `usage limit`) and carries
  `retry_after_s`, so the scheduler waits for the reset instead of charging.
- A vendor CLI announces a transient failure it is about to retry (`...; retrying 1/5`,
  `Retrying in 1 seconds`, codex's `Reconnecting... 1/5 (...)`, gemini's `Attempt 1 failed
  with status 503. Retrying with backoff...` with its stack trace). If the retry then
  succeeded and the work failed later, that notice must not excuse the work, so a notice
  (with the stack frames and the inspected error object printed under it) counts only when
  it is the last thing in the text (the run ended while still retrying). When every retry
  fails, the CLI's final line says so.
- Network failures (connection refused or reset, DNS, TLS, `fetch failed`) and client-side
  timeouts are not on the list: in plain text nothing says a vendor was being called. The
  adapters read the CLIs' own connection-error events instead (execkit/_adapter.py).
- When several upstream signals appear, a numeric status beats wording (it is more
  specific), and within each kind the one nearest the end wins (transcripts put the reason
  last).

Reset times (`stated_wait_s`): `Retry-After: 30`, `retry-after-ms: 1500`, `"retryDelay":
"17s"`, `retryDelayMs: 17000`, `try again in 14.036s`, `Please retry in 7200.0s`, `try again
in 4 days 10 hours 3 minutes`, `reset after 2h52m39s`, `"resets_in_seconds": 4123`,
`"resets_at": 1796313600` and `usage limit reached|1753459200` (epoch seconds), and codex's
`try again at 4:00 PM` / `try again at Dec 4th, 2026 4:00 PM` (the local time of this
machine, which is the CLI's: codex prints the bare time only for a reset later the same
day). The last one in the text wins; a reset already past waits 0. A CLI's own backoff
(`Retrying in 8 seconds`, `Retrying after 17268ms`) is not the vendor's reset and is not read.
"""

from __future__ import annotations

import bisect
import enum
import errno
import functools
import math
import re
import string
import time

import attrs
from attrs.validators import ge, instance_of, max_len

from execkit._errors import InvalidInput
from execkit._exec import SpawnFailure, SpawnResult
from execkit._json import json_key, to_json
from execkit._redact import redact
from execkit._validate import checked, finite, integer_arg, non_blank, opt_checked

__all__ = [
    "ACCOUNT_LIMIT_REASONS",
    "ENVIRONMENT_ERRNOS",
    "EVIDENCE_CHARS",
    "TAIL_CHARS",
    "Classification",
    "FailureClass",
    "Reason",
    "classification_fields",
    "classify",
    "classify_text",
    "is_upstream_status",
    "stated_wait_s",
]

TAIL_CHARS = 8192
"""How much of the failure text the text rules read: its last 8 KiB (characters)."""

EVIDENCE_CHARS = 200
"""The longest evidence snippet a `Classification` carries."""

_MAX_REASON_CHARS = 64

ENVIRONMENT_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR})
"""Spawn errnos that mean the program never started: a precondition is missing."""


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
    MISSING_INTERPRETER = "missing interpreter"  # environment: its #! interpreter is not there
    MISSING_CWD = "missing working directory"  # environment: the cwd is not there
    UNUSABLE_CWD = "unusable working directory"  # environment: the cwd is a file or locked
    CIRCUIT_OPEN = "circuit open"
    OVERLOADED = "overloaded"
    SERVICE_UNAVAILABLE = "service unavailable"
    RATE_LIMITED = "rate limited"
    UNREACHABLE = "vendor unreachable"  # upstream: the CLI could not connect to its API
    SERVER_ERROR = "server error"  # upstream: the vendor's own error type said so
    STREAM_FAILED = "stream failed"  # upstream: the vendor's stream broke off mid-answer
    STILL_RETRYING = "still retrying"  # upstream: it ended while retrying a vendor failure
    CREDENTIALS = "credentials"  # environment: the vendor refused the credentials
    INSUFFICIENT_QUOTA = "insufficient quota"  # an account limit: work, never upstream
    BILLING = "billing"
    USAGE_LIMIT = "usage limit"
    UNTRUSTED = "untrusted workspace"  # environment: the CLI refuses the directory


_NOT_STARTED_REASONS = frozenset(
    {Reason.MISSING_INTERPRETER, Reason.MISSING_CWD, Reason.UNUSABLE_CWD}
)


def never_started(reason: str | None) -> bool:
    """Whether a classification's `reason` says the program never started (any spawn
    errno, a missing interpreter or working directory), as opposed to a run that started
    and failed, a refused credential included."""
    return reason is not None and (
        reason.startswith("spawn errno ") or reason in _NOT_STARTED_REASONS
    )


ACCOUNT_LIMIT_REASONS = frozenset({Reason.INSUFFICIENT_QUOTA, Reason.BILLING, Reason.USAGE_LIMIT})
"""Reasons that name an account limit: no backoff cures them, so they veto upstream."""


def _redacted_evidence(value: str | None) -> str | None:
    # Evidence is printed and stored: its credentials are masked here, and masking never
    # pushes an evidence that fit past EVIDENCE_CHARS.
    if not isinstance(value, str):
        return value
    masked = redact(value)
    return masked[:EVIDENCE_CHARS] if len(value) <= EVIDENCE_CHARS else masked


@attrs.frozen
class Classification:
    """Why one failed attempt failed.

    `reason` is short and stable (`http 503`, `spawn errno ENOENT`, `default`); `evidence`
    is the text that decided it (at most `EVIDENCE_CHARS`, credentials masked), or None
    when nothing matched; `retry_after_s` is the wait until a reset the vendor stated
    (upstream only), or None.
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
        converter=_redacted_evidence,
        validator=opt_checked(
            f"a string of at most {EVIDENCE_CHARS} characters",
            instance_of(str),
            max_len(EVIDENCE_CHARS),
        ),
    )
    retry_after_s: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number of seconds >= 0", finite, ge(0))
    )

    @property
    def charged(self) -> bool:
        """True when the attempt spends the charged budget (class work)."""
        return self.failure_class.charged

    def to_dict(self) -> dict[str, str | float | None]:
        """`{"class", "reason", "evidence", "retry_after_s"}`, JSON-safe."""
        return to_json(self)


_NO_CLASSIFICATION: dict[str, str | float | None] = {
    "class": None,
    "reason": None,
    "evidence": None,
    "retry_after_s": None,
}


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

# Exception names the official SDKs print as `Name: <status> <body>` (lowered): the
# OpenAI and Anthropic TypeScript SDKs' status errors and google-api-core's exceptions.
_SDK_STATUS_ERRORS = (
    "badrequesterror",
    "authenticationerror",
    "permissiondeniederror",
    "notfounderror",
    "conflicterror",
    "unprocessableentityerror",
    "ratelimiterror",
    "internalservererror",
    "apistatuserror",
    # google-genai's `ServerError: 503 UNAVAILABLE`, `ClientError: 429 RESOURCE_EXHAUSTED`.
    "servererror",
    "clienterror",
    "invalidargument",
    "failedprecondition",
    "unauthenticated",
    "permissiondenied",
    "resourceexhausted",
    "toomanyrequests",
    "serviceunavailable",
    "badgateway",
    "gatewaytimeout",
    "deadlineexceeded",
)


@functools.cache
def _compiled(source: str) -> re.Pattern[str]:
    return re.compile(source, _FLAGS)


@attrs.frozen
class _Alternative:
    keywords: tuple[str, ...]
    source: str

    @property
    def pattern(self) -> re.Pattern[str]:
        """The compiled pattern: compiled on first use, not at import (start-up time)."""
        return _compiled(self.source)


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
            _Alternative((kw,) if isinstance(kw, str) else kw, pattern)
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
    _rule(
        "sdk-status",
        None,
        (
            # What every name ends with, so a tail is checked for few keywords.
            (
                "error:",
                "exhausted:",
                "requests:",
                "unavailable:",
                "gateway:",
                "timeout:",
                "exceeded:",
                "unauthenticated:",
                "denied:",
                "argument:",
                "precondition:",
            ),
            rf"(?<![\w])(?:{'|'.join(_SDK_STATUS_ERRORS)}):[ \t]{{1,2}}"
            rf"(?:error code:[ \t]{{0,2}})?{_CODE}{_CODE_END}",
        ),
    ),
    _rule(
        "no-body",
        None,
        (
            "status code (no body)",
            rf"(?:[:\]][ \t]{{1,2}}|^[ \t]{{0,4}}){_CODE} status code \(no body\)",
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
        # A whole message that is only the word: a line of its own, or after `: `.
        ("overloaded", r"^[ \t]{0,8}overloaded[.!]?[ \t]*$"),
        ("overloaded", r"overloaded(?<=\d: overloaded)[.!]?[ \t]*$"),
    ),
    _rule(
        "high-demand",
        Reason.OVERLOADED,
        (
            "high demand",
            r"\bhigh demand, which may cause temporary errors",
        ),
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
        (
            "resource_exhausted",
            rf"status(?<![a-z0-9]status){_Q}{_SEP}\\?[\"']resource_exhausted\\?[\"']",
        ),
    ),
    _rule(
        "unreachable",
        Reason.UNREACHABLE,
        (
            "apiconnectionerror",
            r"(?<![\w.])(?<!except )(?:openai|anthropic|litellm)\.apiconnectionerror:[ \t]"
            r"|^[ \t]{0,8}apiconnectionerror: connection error\.",
        ),
        (
            "api error",
            r"(?<![\w.])api error: (?:connection refused\b|unable to connect to api\b)",
        ),
    ),
    _rule(
        "sdk-server-error",
        Reason.SERVER_ERROR,
        (
            ("internalservererror", "serviceunavailableerror"),
            r"(?<![\w.])(?<!except )(?:openai|anthropic|litellm)\."
            r"(?:internalservererror|serviceunavailableerror):[ \t]",
        ),
        ("errors.servererror", r"(?<![\w.])(?:google\.)?genai\.errors\.servererror:[ \t]"),
        ("ai_apicallerror", r"(?<![\w])ai_apicallerror: internal server error\b"),
    ),
    _rule(
        "sdk-rate-limit",
        Reason.RATE_LIMITED,
        (
            "ratelimiterror",
            r"(?<![\w.])(?<!except )(?:openai|anthropic|litellm)\.ratelimiterror:[ \t]",
        ),
    ),
    _rule(
        "per-minute-quota",
        Reason.RATE_LIMITED,
        ("perminute", rf"quota_?id{_Q}{_SEP}{_Q}[a-z0-9_-]{{0,80}}perminute"),
        ("per minute", r"\blimit '[a-z ]{0,60}\bper minute\b"),
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
_PER_MINUTE = next(rule for rule in _UPSTREAM_WORDING if rule.name == "per-minute-quota")

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


def _is_http_status(code: int) -> bool:
    return 100 <= code <= 599


# --- reset times ----------------------------------------------------------------------------

_UNIT = (
    r"(?:milliseconds?|msecs?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)"
    r"(?![a-z])"
)
_NUMBER = r"\d{1,9}(?:\.\d{1,6})?"
# One to four `<number><unit>` parts (`4 days 10 hours 3 minutes`, `2h52m39s`), or one bare
# number (seconds, or milliseconds after an `-ms` key) not followed by a word.
_DURATION = (
    rf"(?P<dur>(?:{_NUMBER}[ \t]{{0,2}}{_UNIT}(?:,?[ \t]{{0,2}}(?:and[ \t]{{1,2}})?)){{1,4}}"
    rf"|{_NUMBER}(?![ \t]{{0,2}}[a-z\d.]))"
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WAIT_SEP = r"[\"']?[ \t]{0,4}[:=]?[ \t]{0,4}[\"']?"
# Each pattern starts with a literal, so the engine finds candidates with a fast prefix
# search (one alternation over all of them would try every position).
_WAIT_SOURCES = (
    # A relative wait after a key or phrase.
    r"retry(?:[-_ ]?after(?P<ms1>[-_]?ms)?|[-_ ]?delay(?P<ms2>[-_]?ms)?| (?:in|after))"
    rf"{_WAIT_SEP}{_DURATION}",
    r"reset(?:s? (?:in|after)|s?_in_seconds)"
    rf"{_WAIT_SEP}{_DURATION}"
    # An absolute reset in epoch seconds.
    r"|resets?_at[\"']?[ \t]{0,2}[:=][ \t]{0,2}[\"']?(?P<epoch>\d{9,11})(?!\d)",
    r"usage limit reached\|(?P<epoch>\d{9,11})(?!\d)",
    # codex's local wall-clock reset (with the date when it is not today), or a duration.
    rf"try again (?:(?:in|after){_WAIT_SEP}{_DURATION}"
    rf"|at (?:(?P<mon>{'|'.join(_MONTHS)})[a-z]{{0,6}}\.? (?P<day>\d{{1,2}})"
    r"(?:st|nd|rd|th)?,? (?P<year>\d{4}),? )?(?P<hour>\d{1,2}):(?P<minute>\d{2})"
    r"[ \t]{0,2}(?P<ampm>am|pm)\b)",
)
_PART_SOURCE = rf"({_NUMBER})[ \t]{{0,2}}({_UNIT})?"


def _unit_seconds(unit: str | None, default: float) -> float:
    if not unit:
        return default
    if unit.startswith(("ms", "msec", "milli")):
        return 0.001
    if unit.startswith("s"):
        return 1.0
    if unit.startswith("m"):
        return 60.0
    if unit.startswith("h"):
        return 3600.0
    return 86400.0


def _duration_seconds(text: str, default_unit: float) -> float:
    return sum(
        float(part.group(1)) * _unit_seconds(part.group(2), default_unit)
        for part in _compiled(_PART_SOURCE).finditer(text)
    )


def _clock_reset(match: re.Match[str], now: float) -> float | None:
    """The epoch of codex's `try again at [Mon Dth, YYYY ]H:MM AM|PM`, in local time."""
    hour, minute = int(match.group("hour")), int(match.group("minute"))
    if not (1 <= hour <= 12 and minute <= 59):
        return None
    hour = hour % 12 + (12 if match.group("ampm") == "pm" else 0)
    if match.group("mon"):
        year = int(match.group("year"))
        month = _MONTHS.index(match.group("mon")) + 1
        day = int(match.group("day"))
    else:
        today = time.localtime(now)
        year, month, day = today.tm_year, today.tm_mon, today.tm_mday
    try:
        return time.mktime((year, month, day, hour, minute, 0, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def _wait_of(match: re.Match[str], now: float) -> float | None:
    groups = match.groupdict()
    duration = groups.get("dur")
    if duration is not None:
        millis = bool(groups.get("ms1") or groups.get("ms2"))
        return _duration_seconds(duration, 0.001 if millis else 1.0)
    if groups.get("epoch") is not None:
        return float(groups["epoch"]) - now
    if groups.get("hour") is None:
        return None
    reset = _clock_reset(match, now)
    return None if reset is None else reset - now


def _last_wait(low: str, now: float, skip: _NoticeIndex | None = None) -> tuple[int, float] | None:
    """(offset, seconds) of the last reset stated in lowered `low`, stale notices skipped."""
    found: tuple[int, float] | None = None
    for source in _WAIT_SOURCES:
        for match in _compiled(source).finditer(low):
            if found is not None and match.start() <= found[0]:
                continue
            if skip is not None and skip.is_stale_notice(match.start()):
                continue
            wait = _wait_of(match, now)
            if wait is not None and math.isfinite(wait):
                found = (match.start(), max(0.0, wait))
    return found


def stated_wait_s(text: str | None, *, now: float | None = None) -> float | None:
    """Seconds until the last reset `text` states (see "Reset times"); None when none.

    `now` is the clock for absolute resets (epoch seconds, default `time.time()`); a reset
    already past is 0. Linear time; never raises for any str.
    """
    if not text:
        return None
    found = _last_wait(_lowered(text), time.time() if now is None else now)
    return None if found is None else found[1]


# --- scanning -------------------------------------------------------------------------------


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
    code: int | None = None


_NOTICE_WORDS = ("retrying", "reconnecting")


def _next_line(low: str, line_end: int) -> tuple[int, int]:
    """(start, end) of the line after the one ending at `line_end` (a newline or the end)."""
    start = line_end + 1
    end = low.find("\n", start)
    return start, len(low) if end < 0 else end


def _continuation_end(low: str, line_start: int, line_end: int) -> int:
    """Where a notice's printout ends: its stack frames (`    at ...`) and the inspected
    error object a frame opens with `{` (indented lines up to a closing `}`) belong to it."""
    in_block = low[line_start:line_end].rstrip().endswith("{")
    end = line_end
    while end < len(low):
        start, next_end = _next_line(low, end)
        line = low[start:next_end]
        if in_block:
            if line.startswith("}"):
                in_block = False
            elif not line.startswith((" ", "\t")):
                break
        elif line.startswith((" ", "\t")) and line.lstrip().startswith("at "):
            in_block = line.rstrip().endswith("{")
        else:
            break
        end = next_end
    return end


class _NoticeIndex:
    """The retry notices of a lowered tail that more output followed (stale ones)."""

    def __init__(self, low: str) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        content_end = len(low.rstrip())
        position = 0
        upcoming = [low.find(word) for word in _NOTICE_WORDS]
        while True:
            # Each keyword's next occurrence is searched again only once passed: linear.
            upcoming = [
                found if found < 0 or found >= position else low.find(word, position)
                for word, found in zip(_NOTICE_WORDS, upcoming, strict=True)
            ]
            live = [found for found in upcoming if found >= 0]
            if not live:
                break
            found = min(live)
            line_start = low.rfind("\n", position, found) + 1 or position
            line_end = low.find("\n", found)
            line_end = len(low) if line_end < 0 else line_end
            end = _continuation_end(low, line_start, line_end)
            if end < content_end:  # output followed: the retry went on
                self._starts.append(line_start)
                self._ends.append(end)
            position = end + 1

    def is_stale_notice(self, start: int) -> bool:
        """True when `start` lies on a retry notice that more output followed."""
        index = bisect.bisect_right(self._starts, start) - 1
        return index >= 0 and start <= self._ends[index]


class _Scan:
    """One lowered tail, and the lines that are retry notices other output followed."""

    def __init__(self, tail: str) -> None:
        self.low = _lowered(tail)
        self.notices = _NoticeIndex(self.low)

    def last_hit(self, rule: _Rule, *, skip_notices: bool, any_status: bool = False) -> _Hit | None:
        """The rule's counted match nearest the end (an upstream status, not a stale notice;
        with `any_status`, any HTTP status 100..599)."""
        best: _Hit | None = None
        for alternative in rule.alternatives:
            if not any(keyword in self.low for keyword in alternative.keywords):
                continue
            for match in alternative.pattern.finditer(self.low):
                if best is not None and match.end() <= best.end:
                    continue
                code = None
                if rule.reason is None:
                    code = int(match.group("code"))
                    wanted = _is_http_status(code) if any_status else is_upstream_status(code)
                    if not wanted:
                        continue
                    reason = f"http {code}"
                else:
                    reason = rule.reason
                if skip_notices and self.notices.is_stale_notice(match.start()):
                    continue
                best = _Hit(rule.name, match.start(), match.end(), reason, code)
        return best

    def latest(
        self, rules: tuple[_Rule, ...], *, skip_notices: bool, any_status: bool = False
    ) -> _Hit | None:
        """The counted match nearest the end over `rules`; rule order breaks ties."""
        best: _Hit | None = None
        for rule in rules:
            hit = self.last_hit(rule, skip_notices=skip_notices, any_status=any_status)
            if hit is not None and (best is None or hit.end > best.end):
                best = hit
        return best

    def upstream(self) -> _Hit | None:
        """The deciding upstream signal: the last presented status when it is an upstream
        one, else wording after it (the last status, when not upstream, bars all before)."""
        status = self.latest(_NUMERIC_RULES, skip_notices=True, any_status=True)
        if status is not None and status.code is not None and is_upstream_status(status.code):
            return status
        barrier = -1 if status is None else status.end
        wording = self.latest(_UPSTREAM_WORDING, skip_notices=True)
        return wording if wording is not None and wording.start >= barrier else None


def _decide(tail: str, now: float | None = None) -> tuple[FailureClass, _Hit] | None:
    """The deciding match in `tail`: an account-limit veto (work), else upstream, else None."""
    return _decide_scan(_Scan(tail), now)[0]


def _decide_scan(
    scan: _Scan, now: float | None
) -> tuple[tuple[FailureClass, _Hit] | None, float | None]:
    """The deciding match and, for upstream, the wait until a stated reset."""
    clock = time.time() if now is None else now
    veto = scan.latest(_ACCOUNT_LIMITS, skip_notices=False)
    if veto is not None and veto.reason != Reason.USAGE_LIMIT and _per_minute(scan):
        veto = None  # Google words a per-minute rate limit as an exceeded quota
    reset = None
    if veto is not None:
        reset = _last_wait(scan.low, clock, scan.notices)
        if reset is None or reset[0] < veto.start:
            return (FailureClass.WORK, veto), None
    # No account limit, or one that lifts at a time stated after it: upstream may decide.
    hit = scan.upstream()
    if hit is None:
        if veto is None:
            return None, None
        hit = attrs.evolve(veto, reason=Reason.USAGE_LIMIT)
    if reset is None:
        reset = _last_wait(scan.low, clock, scan.notices)
    return (FailureClass.UPSTREAM, hit), None if reset is None else reset[1]


def _per_minute(scan: _Scan) -> bool:
    return scan.last_hit(_PER_MINUTE, skip_notices=False) is not None


def _check_tail_chars(tail_chars: int) -> None:
    integer_arg("tail_chars", tail_chars, 1)


def classify_text(
    text: str, *, tail_chars: int = TAIL_CHARS, now: float | None = None
) -> Classification:
    """Upstream when the last `tail_chars` of `text` match the documented list, else work.

    Never environment: that class comes only from structure (`classify`). Work carries
    reason `default`, or the account-limit row that vetoed upstream; upstream carries
    `retry_after_s` when the text states a reset (`now`: the clock for absolute resets,
    default `time.time()`). Raises `InvalidInput` for a `tail_chars` below 1 or a `text`
    that is not a str.
    """
    _check_tail_chars(tail_chars)
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a str, got {type(text).__name__}", field="text")
    tail = text[-tail_chars:]
    decided, wait = _decide_scan(_Scan(tail), now)
    if decided is None:
        return Classification(FailureClass.WORK, Reason.DEFAULT)
    failure_class, hit = decided
    return Classification(failure_class, hit.reason, _evidence(tail, hit.start, hit.end), wait)


def _errno_name(number: int) -> str:
    return errno.errorcode.get(number, str(number))


def _spawn_evidence(result: SpawnResult) -> str | None:
    if not result.spawn_error:
        return None
    return result.spawn_error.strip()[:EVIDENCE_CHARS] or None


_CWD_REASONS = {
    SpawnFailure.CWD_NOT_FOUND: Reason.MISSING_CWD,
    SpawnFailure.CWD_NOT_DIRECTORY: Reason.UNUSABLE_CWD,
    SpawnFailure.CWD_UNUSABLE: Reason.UNUSABLE_CWD,
}


def _spawn_verdict(result: SpawnResult, number: int) -> Classification:
    """A run that never started: environment when its errno means a missing precondition."""
    evidence = _spawn_evidence(result)
    failure = result.spawn_failure
    if failure in _CWD_REASONS:
        return Classification(FailureClass.ENVIRONMENT, _CWD_REASONS[failure], evidence)
    if number in ENVIRONMENT_ERRNOS:
        if failure is SpawnFailure.INTERPRETER_NOT_FOUND:
            reason: str = Reason.MISSING_INTERPRETER
        elif number == errno.ENOENT:
            reason = Reason.MISSING_BINARY
        else:
            reason = f"spawn errno {_errno_name(number)}"
        return Classification(FailureClass.ENVIRONMENT, reason, evidence)
    # Never started, so no vendor spoke: nothing upstream to find in the text.
    return Classification(FailureClass.WORK, f"spawn errno {_errno_name(number)}", evidence)


def classify(
    result: SpawnResult, *, tail_chars: int = TAIL_CHARS, now: float | None = None
) -> Classification | None:
    """Class one spawn's failure; None when it succeeded (`result.ok`).

    Structural rules first (spawn errno), then `classify_text` over the last `tail_chars`
    of `result.failure_text()` (`now` as there), then work (`timeout` or `default`).
    Raises `InvalidInput` for a `tail_chars` below 1.
    """
    _check_tail_chars(tail_chars)
    if result.ok:
        return None
    if result.spawn_errno is not None:
        return _spawn_verdict(result, result.spawn_errno)
    verdict = classify_text(result.failure_text(tail_chars), tail_chars=tail_chars, now=now)
    if verdict.failure_class is FailureClass.UPSTREAM or not result.timed_out:
        return verdict
    return Classification(FailureClass.WORK, Reason.TIMEOUT)


def classification_fields(result: SpawnResult) -> dict[str, str | float | None]:
    """`classify(result).to_dict()`, or all four keys None for a run that succeeded.

    The shape `execkit run --json` merges into its output.
    """
    verdict = classify(result)
    return dict(_NO_CLASSIFICATION) if verdict is None else verdict.to_dict()
