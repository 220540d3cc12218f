"""The documented text list: what `classify_text` counts as upstream, and what vetoes it.

This docstring is the list the README condenses and docs/architecture.md points to. The
tuples below are the same table in code, row for row and in the same order (the order
breaks ties); tests/test_classify.py checks that the two agree: the rules, their order,
class and reason, and that every example here classifies as its row says. How a pattern is
written so that it runs in linear time is in patterns.py; how the matches decide (the
veto, the last status) is in scan.py.

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
| | | | `You've hit your limit`, `You've hit your 5-hour limit` |
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
"""

from __future__ import annotations

import re

from execkit._classify.patterns import Alternative, Rule
from execkit._classify.verdict import Reason

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


def _rule(name: str, reason: str | None, *alternatives: tuple[str | tuple[str, ...], str]) -> Rule:
    return Rule(
        name,
        reason,
        tuple(
            Alternative((kw,) if isinstance(kw, str) else kw, pattern)
            for kw, pattern in alternatives
        ),
    )


NUMERIC_RULES = (
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
"""The numeric rows (class upstream, reason `http N`): a status presented as one."""

_RATE_LIMIT = ("rate limit", "rate-limit")

UPSTREAM_WORDING = (
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
"""The wording rows (class upstream): a vendor-shaped sentence, name or JSON value."""

ACCOUNT_LIMITS = (
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
        "usage-limit",
        Reason.USAGE_LIMIT,
        (("usage limit", "usage_limit"), r"\busage[ _]limit\b"),
        # claude's own words for its plan's limits (`You've hit your limit · resets 1pm`).
        (
            "hit your",
            r"\bhit your (?:session |weekly |daily |monthly |5-hour |opus |sonnet )?limit\b",
        ),
    ),
)
"""The account-limit rows (class work): each vetoes upstream unless a reset follows it."""

RULES = NUMERIC_RULES + UPSTREAM_WORDING + ACCOUNT_LIMITS
"""Every row of the list, in its order (the order of the table in this docstring)."""

PER_MINUTE = next(rule for rule in UPSTREAM_WORDING if rule.name == "per-minute-quota")
"""The row that lifts a quota or billing veto: Google's per-minute quota is a rate limit."""


def is_upstream_status(code: int) -> bool:
    """True for an HTTP status that means the vendor refused: 429 or 500..599."""
    return code == 429 or 500 <= code <= 599


def is_http_status(code: int) -> bool:
    """True for any HTTP status, 100..599: the last one presented decides (scan.py)."""
    return 100 <= code <= 599
