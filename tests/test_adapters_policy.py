"""The failure policy `map_result` applies for every vendor (DESIGN.md "The three classes"),
and what each vendor adapter reads from its CLI's structured output to feed it.

Environment only from structure (a 401/403, the CLI's own credential error, a billing
error type with no reset), each naming its fix; rate and usage limits upstream with the
vendor's reset as `retry_after_s`; the CLI's own connection-error events and a timeout on
a retry notice upstream; text alone keeps defaulting to work.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from _support import spawn_result

import adapters
from execkit import Envelope, get_adapter, map_result
from execkit._adapter import credential_env_of, credential_files_of
from execkit._classify import FailureClass
from execkit.adapterkit import ErrorKind

ENV, UP, WORK = FailureClass.ENVIRONMENT, FailureClass.UPSTREAM, FailureClass.WORK
FAILED = spawn_result(("codex", "exec"), exit_code=1)


def mapped(envelope: Envelope, vendor: str = "codex", **result: Any) -> Any:
    base = {"exit_code": 1, **result}
    return map_result(get_adapter(vendor), spawn_result((vendor,), **base), envelope)


def error(**fields: Any) -> Envelope:
    return Envelope(found=True, is_error=True, **fields)


# --- credentials ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("envelope", "reason"),
    [
        (error(error_message="Incorrect API key", http_status=401), "http 401"),
        (error(error_message="Country not supported", http_status=403), "http 403"),
        (error(error_message="invalid x-api-key", error_kind=ErrorKind.CREDENTIALS), "credentials"),
        # The kind wins over a status that would say otherwise.
        (
            error(error_message="x", http_status=400, error_kind=ErrorKind.CREDENTIALS),
            "credentials",
        ),
    ],
)
def test_structured_credentials_are_environment_naming_the_variable_and_login(
    envelope: Envelope, reason: str
) -> None:
    raw = mapped(envelope)
    assert (raw.failure_class, raw.reason) == (ENV, reason)
    assert raw.precondition is not None
    assert "OPENAI_API_KEY" in raw.precondition
    assert "log in: codex login" in raw.precondition
    assert raw.retry_after_s is None


@pytest.mark.parametrize(
    "text",
    [
        "unexpected status 401 Unauthorized: Incorrect API key provided",
        "Error: 403 Forbidden",
        "Invalid API key · Please run /login",
        "Please set an Auth method in your settings.json",
    ],
)
def test_credential_text_alone_stays_work(text: str) -> None:
    # No envelope: only the text path, which never yields environment.
    for vendor in ("generic", "codex", "claude", "gemini", "opencode"):
        adapter = adapters.GenericAdapter(command=("t",)) if vendor == "generic" else None
        result = spawn_result((vendor,), exit_code=1, stderr=text)
        raw = (adapter or get_adapter(vendor)).parse(result)
        assert raw.failure_class is WORK, (vendor, text)
        assert raw.precondition is None


# --- billing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("envelope", "reason"),
    [
        (error(error_message="Insufficient credits", http_status=402), "http 402"),
        (error(error_message="Credit balance is too low", error_kind=ErrorKind.BILLING), "billing"),
        (
            error(error_message="quota", http_status=429, error_kind=ErrorKind.BILLING),
            "billing",
        ),
    ],
)
def test_billing_with_no_reset_is_environment_naming_the_fix(
    envelope: Envelope, reason: str
) -> None:
    raw = mapped(envelope, "claude")
    assert (raw.failure_class, raw.reason) == (ENV, reason)
    assert raw.precondition is not None
    assert raw.precondition.startswith(
        "billing: add credits or raise the quota for the claude account"
    )


def test_billing_with_a_stated_reset_waits_for_it_uncharged() -> None:
    structured = mapped(
        error(error_message="quota", error_kind=ErrorKind.BILLING, retry_after_s=60)
    )
    assert (structured.failure_class, structured.reason) == (UP, "usage limit")
    assert structured.retry_after_s == 60.0
    worded = mapped(error(error_message="Quota hit; try again in 2 hours", http_status=402))
    assert (worded.failure_class, worded.retry_after_s) == (UP, 7200.0)


def test_billing_text_without_a_kind_still_charges() -> None:
    raw = mapped(error(error_message="Your credit balance is too low", http_status=429))
    assert (raw.failure_class, raw.reason) == (WORK, "billing")
    assert raw.precondition is None


# --- rate and usage limits, resets ----------------------------------------------------------


@pytest.mark.parametrize(
    ("envelope", "reason", "wait"),
    [
        (error(error_message="slow down", http_status=429, retry_after_s=17.0), "http 429", 17.0),
        (error(error_message="Please try again in 20s", http_status=429), "http 429", 20.0),
        (error(error_message="x", error_kind=ErrorKind.RATE_LIMITED), "rate limited", None),
        (
            error(error_message="limit", error_kind=ErrorKind.USAGE_LIMIT, retry_after_s=4123),
            "usage limit",
            4123.0,
        ),
        # Google's 429 says billing, but states its reset: a limit that lifts, upstream.
        (
            error(
                error_message="You exceeded your current quota, please check your plan and "
                "billing details.\nPlease retry in 17.0s.",
                http_status=429,
            ),
            "http 429",
            17.0,
        ),
    ],
)
def test_limits_are_upstream_with_the_vendors_reset(
    envelope: Envelope, reason: str, wait: float | None
) -> None:
    raw = mapped(envelope)
    assert (raw.failure_class, raw.reason, raw.retry_after_s) == (UP, reason, wait)
    assert raw.precondition is None


def test_a_work_failure_never_carries_a_reset() -> None:
    raw = mapped(error(error_message="bad request; retry after 30", http_status=400))
    assert (raw.failure_class, raw.retry_after_s) == (WORK, None)


@pytest.mark.parametrize(
    "kind",
    [
        ErrorKind.OVERLOADED,
        ErrorKind.SERVER_ERROR,
        ErrorKind.STREAM_FAILED,
        ErrorKind.UNREACHABLE,
        ErrorKind.RETRYING,
    ],
)
def test_every_upstream_kind_is_upstream(kind: ErrorKind) -> None:
    raw = mapped(error(error_message="x", error_kind=kind))
    assert raw.failure_class is UP
    with_status = mapped(error(error_message="x", error_kind=kind, http_status=503))
    assert with_status.reason == "http 503"


# --- timeouts -------------------------------------------------------------------------------


def test_a_timeout_on_a_retry_notice_is_upstream_and_a_silent_one_is_work() -> None:
    timed: dict[str, Any] = {"exit_code": None, "signal": 15, "timed_out": True}
    retrying = Envelope(
        found=True, is_error=True, error_message="Reconnecting...", error_kind=ErrorKind.RETRYING
    )
    assert mapped(retrying, **timed).failure_class is UP
    unreachable = attrs.evolve(retrying, error_kind=ErrorKind.UNREACHABLE)
    assert mapped(unreachable, **timed).reason == "vendor unreachable"
    assert mapped(Envelope(), **timed).reason == "timeout"
    # A timeout whose last event was a final error (not a retry) is the classifier's call.
    final = attrs.evolve(retrying, error_kind=ErrorKind.OVERLOADED)
    assert mapped(final, **timed).failure_class is WORK


# --- each vendor's structure ----------------------------------------------------------------


def _claude(**fields: Any) -> Any:
    body = {"type": "result", "subtype": "success", "is_error": True, "result": "x", **fields}
    return get_adapter("claude").parse(
        spawn_result(("claude",), exit_code=1, stdout=json.dumps(body))
    )


@pytest.mark.parametrize(
    ("fields", "cls", "reason"),
    [
        ({"api_error_status": 401, "api_error_type": "authentication_error"}, ENV, "http 401"),
        ({"api_error_type": "permission_error"}, ENV, "credentials"),
        ({"api_error_status": 402, "api_error_type": "billing_error"}, ENV, "http 402"),
        ({"api_error_status": 400, "result": "Credit balance is too low"}, ENV, "billing"),
        ({"result": "Not logged in · Please run /login"}, ENV, "credentials"),
        ({"api_error_status": 529, "api_error_type": "overloaded_error"}, UP, "http 529"),
        ({"api_error_type": "overloaded_error"}, UP, "overloaded"),
        ({"api_error_status": None, "api_error": "connection_failed"}, UP, "vendor unreachable"),
        ({"result": "Claude AI usage limit reached|1753459200"}, UP, "usage limit"),
        # The CLI's words in a longer text are not its fixed sentence: text, so work.
        ({"result": "note: Credit balance is too low?"}, WORK, "billing"),
        ({"api_error_status": 400, "api_error_type": "invalid_request_error"}, WORK, "http 400"),
    ],
)
def test_claude_reads_its_error_fields(
    fields: dict[str, Any], cls: FailureClass, reason: str
) -> None:
    raw = _claude(**fields)
    assert (raw.failure_class, raw.reason) == (cls, reason)


def _codex(*events: dict[str, Any], timed_out: bool = False) -> Any:
    stdout = "\n".join(
        json.dumps(e) for e in [{"type": "thread.started", "thread_id": "t"}, *events]
    )
    result = spawn_result(
        ("codex",),
        exit_code=None if timed_out else 1,
        signal=15 if timed_out else None,
        timed_out=timed_out,
        stdout=stdout,
    )
    return get_adapter("codex").parse(result)


def _failed(message: str) -> dict[str, Any]:
    return {"type": "turn.failed", "error": {"message": message}}


def _notice(message: str) -> dict[str, Any]:
    return {"type": "error", "message": message}


@pytest.mark.parametrize(
    ("message", "cls", "reason"),
    [
        ("unexpected status 401 Unauthorized: Incorrect API key", ENV, "http 401"),
        ("exceeded retry limit, last status: 429 Too Many Requests", UP, "http 429"),
        ("Quota exceeded. Check your plan and billing details.", ENV, "billing"),
        ("You’ve hit your usage limit. Try again at 4:00 PM.", UP, "usage limit"),
        (
            "We’re currently experiencing high demand, which may cause temporary errors.",
            UP,
            "overloaded",
        ),
        ("Selected model is at capacity. Please try a different model.", UP, "overloaded"),
        ("stream disconnected before completion: boom", UP, "stream failed"),
        ("Connection failed: error sending request", UP, "vendor unreachable"),
        (
            "Your access token could not be refreshed. Please log out and sign in again.",
            ENV,
            "credentials",
        ),
        ('{"error":{"message":"x","type":"insufficient_quota"}}', ENV, "billing"),
        (
            '{"error":{"message":"Unsupported parameter","type":"invalid_request_error"}}',
            WORK,
            "default",
        ),
        # Only at the start is it codex's rendering; quoted later it is just text.
        ("tool said: unexpected status 401", WORK, "default"),
    ],
)
def test_codex_reads_its_fixed_error_renderings(
    message: str, cls: FailureClass, reason: str
) -> None:
    raw = _codex(_notice(message), _failed(message))
    assert (raw.failure_class, raw.reason) == (cls, reason)


def test_codex_reconnect_notices_are_never_the_final_error() -> None:
    banner = _notice("Reconnecting... 1/1 (unexpected status 503 Service Unavailable: busy)")
    raw = _codex(banner, _failed("unexpected status 400 Bad Request: no"))
    assert (raw.failure_class, raw.reason) == (WORK, "http 400")
    # Killed on timeout with the notice last: it was still retrying.
    killed = _codex(banner, timed_out=True)
    assert (killed.failure_class, killed.reason) == (UP, "http 503")
    waiting = _codex(
        _notice("Reconnecting... waiting for network (Connection failed: refused)"), timed_out=True
    )
    assert (waiting.failure_class, waiting.reason) == (UP, "vendor unreachable")
    # A hang with nothing but the turn start is a charged timeout.
    assert _codex({"type": "turn.started"}, timed_out=True).reason == "timeout"


_GEMINI_NOTICE = (
    "Attempt 1 failed with status 503. Retrying with backoff... _ApiError: {}\n"
    "    at retryWithBackoff (file:///x.js:1:2) {\n"
    "  status: 503\n"
    "}\n"
)


def _gemini(stderr: str, exit_code: int | None = 1, **result: Any) -> Any:
    return get_adapter("gemini").parse(
        spawn_result(("gemini",), exit_code=exit_code, stderr=stderr, **result)
    )


def _gemini_envelope(**error: Any) -> str:
    return json.dumps({"session_id": "s", "error": {"type": "Error", **error}}, indent=2)


@pytest.mark.parametrize(
    ("message", "code", "cls", "reason"),
    [
        ('{"error":{"code":401,"status":"UNAUTHENTICATED"}}', 401, ENV, "http 401"),
        ('{"error":{"code":400,"status":"FAILED_PRECONDITION"}}', 400, ENV, "billing"),
        ('{"error":{"code":429,"status":"RESOURCE_EXHAUSTED"}}', 429, UP, "http 429"),
        ('{"error":{"code":503,"status":"UNAVAILABLE"}}', 503, UP, "http 503"),
        ('{"error":{"code":400,"status":"INVALID_ARGUMENT"}}', 400, WORK, "http 400"),
    ],
)
def test_gemini_reads_the_envelope_at_the_end_of_stderr(
    message: str, code: int, cls: FailureClass, reason: str
) -> None:
    stderr = "Warning: TERM=dumb\n" + _GEMINI_NOTICE + _gemini_envelope(message=message, code=code)
    raw = _gemini(stderr, exit_code=code % 256)
    assert (raw.failure_class, raw.reason) == (cls, reason)


def test_gemini_exit_codes_and_notices() -> None:
    # The documented exit codes when no envelope was printed: 145 = 401 mod 256, 41 auth.
    assert (_gemini("boom", exit_code=145).failure_class, _gemini("x", 145).reason) == (
        ENV,
        "http 401",
    )
    assert _gemini("Please set an Auth method", exit_code=41).reason == "credentials"
    assert _gemini("boom", exit_code=144).failure_class is WORK
    # Killed while its last event was a retry notice: still retrying.
    timed = {"timed_out": True, "exit_code": 0}
    assert _gemini(_GEMINI_NOTICE, **timed).reason == "http 503"
    refused = "Attempt 4 failed. Retrying with backoff... Error: TypeError: fetch failed\n"
    assert _gemini(refused, **timed).reason == "vendor unreachable"
    # Something else followed the notice: not still retrying.
    assert _gemini(_GEMINI_NOTICE + "Error: tool crashed\n", **timed).reason == "timeout"
    # A cut stream is the vendor's failure even when gemini exits 0 with partial text.
    cut = json.dumps(
        {
            "response": "pong",
            "error": {
                "type": "INVALID_STREAM",
                "message": "Model stream ended without a finish reason.",
            },
        }
    )
    raw = get_adapter("gemini").parse(spawn_result(("gemini",), exit_code=0, stdout=cut))
    assert (raw.failure_class, raw.reason) == (UP, "stream failed")


def test_gemini_reads_the_reset_of_a_quota_error() -> None:
    stderr = (
        "Error when talking to Gemini API Full report available at: /tmp/r.json "
        "TerminalQuotaError: You have exhausted your daily quota on this model.\n"
        "    at classifyGoogleError (file:///x.js:1:2) {\n"
        "  cause: {\n    message: 'Please retry in 7200.0s.'\n  },\n"
        "  retryDelayMs: undefined,\n  status: 429\n}\n"
    ) + _gemini_envelope(message="You have exhausted your daily quota on this model.", code=429)
    raw = _gemini(stderr, exit_code=173)
    assert (raw.failure_class, raw.reason, raw.retry_after_s) == (UP, "http 429", 7200.0)
    delayed = stderr.replace("retryDelayMs: undefined", "retryDelayMs: 17000")
    assert _gemini(delayed, exit_code=173).retry_after_s == 17.0


def _opencode(error: dict[str, Any]) -> Any:
    event = {"type": "error", "sessionID": "ses_x", "error": error}
    return get_adapter("opencode").parse(
        spawn_result(("opencode",), exit_code=1, stdout=json.dumps(event))
    )


def _api_error(
    status: int | None, body: dict[str, Any] | None = None, **data: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {"message": "m", **data}
    if status is not None:
        fields["statusCode"] = status
    if body is not None:
        fields["responseBody"] = json.dumps({"error": body})
    return {"name": "APIError", "data": fields}


@pytest.mark.parametrize(
    ("error", "cls", "reason", "wait"),
    [
        (
            {"name": "ProviderAuthError", "data": {"message": "invalid x-api-key"}},
            ENV,
            "credentials",
            None,
        ),
        (_api_error(429, {"type": "insufficient_quota"}), ENV, "billing", None),
        (_api_error(402, {"code": "payment_required"}), ENV, "http 402", None),
        (
            _api_error(429, {"type": "usage_limit_reached", "resets_in_seconds": 4123}),
            UP,
            "http 429",
            4123.0,
        ),
        (
            _api_error(429, {"code": "rate_limit_exceeded"}, responseHeaders={"retry-after": "17"}),
            UP,
            "http 429",
            17.0,
        ),
        (
            _api_error(None, message="Cannot connect to API: Unable to connect."),
            UP,
            "vendor unreachable",
            None,
        ),
        (
            {"name": "UnknownError", "data": {"message": '{"message":"Overloaded","code":503}'}},
            UP,
            "http 503",
            None,
        ),
        ({"name": "ContextOverflowError", "data": {"message": "too long"}}, WORK, "default", None),
        # A status wins over the connection wording: the API did answer.
        (_api_error(400, message="Cannot connect to API? no: bad request"), WORK, "http 400", None),
    ],
)
def test_opencode_reads_its_error_events(
    error: dict[str, Any], cls: FailureClass, reason: str, wait: float | None
) -> None:
    raw = _opencode(error)
    assert (raw.failure_class, raw.reason, raw.retry_after_s) == (cls, reason, wait)


# --- the optional credential attributes -----------------------------------------------------


def test_the_builtin_adapters_document_their_credentials() -> None:
    for name in ("claude", "codex", "gemini", "opencode"):
        adapter = get_adapter(name)
        assert credential_env_of(adapter), name
        assert all(path.startswith("~/") for path in credential_files_of(adapter)), name
        assert adapter.login_hint
    assert credential_env_of(get_adapter("generic")) == ()


def test_a_third_party_adapter_without_credential_attributes_still_works() -> None:
    @attrs.frozen
    class Acme:
        name: str = "acme"
        binary: str = "acme"
        install_hint: str = "pip install acme"
        login_hint: str | None = None

        def build_argv(self, request: Any) -> list[str]:
            return ["acme"]

        def parse(self, result: Any) -> Any:
            return map_result(self, result, error(error_message="no", http_status=401))

    acme = Acme()
    assert credential_env_of(acme) == () and credential_files_of(acme) == ()
    raw = acme.parse(FAILED)
    assert raw.failure_class is ENV
    assert raw.precondition == (
        "acme: the vendor refused the credentials or their permission (http 401); "
        "check the credentials it is configured with"
    )
