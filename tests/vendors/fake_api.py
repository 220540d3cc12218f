"""A loopback fake of the vendor model APIs the real CLIs call (stdlib only).

One `FakeAPI` serves one recording: it binds 127.0.0.1 on a free port, answers every
model call with the next step of its `Scenario` (success, a vendor-shaped error, a hang,
a stream that fails midway), answers the calls a CLI makes around the model call (model
lists, token counts) and logs every request (method, path, the status it returned).

It speaks just enough of four wire protocols for a real CLI to finish a one-turn prompt:

- Anthropic Messages: `POST /v1/messages` (SSE when `"stream": true`, else JSON),
  `POST /v1/messages/count_tokens`, `GET /v1/models`.
- OpenAI Responses: `POST /v1/responses` (SSE), and Chat Completions:
  `POST /v1/chat/completions` (SSE chunks when `"stream": true`), `GET /v1/models`.
- Google Gemini: `POST /v1beta/models/M:generateContent`, `:streamGenerateContent?alt=sse`,
  `:countTokens`, `GET /v1beta/models`.

Error bodies follow each vendor's published shape: Anthropic
`{"type":"error","error":{"type","message"}}`, OpenAI `{"error":{"message","type","param",
"code"}}`, Google `{"error":{"code","message","status","details"}}`; plus what a proxy in
front of them prints (an nginx HTML 502 page, a plain-text 503).

It is also the sink of every other connection: the recorder points HTTP(S)_PROXY at it,
so a CLI's telemetry, update check or login flow arrives as `CONNECT host:443` (or an
absolute-URI request), is logged as `external` and refused with 403; nothing is forwarded.

Bounded: at most `max_requests` requests, and it stops itself `lifetime_s` after start;
a hanging reply waits at most until then. Run `python tests/vendors/fake_api.py --help`
to serve one scenario by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import sys
import threading
import time
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, cast
from urllib.parse import urlsplit

__all__ = [
    "ERROR_KINDS",
    "SCENARIOS",
    "VENDORS",
    "FakeAPI",
    "Reply",
    "Scenario",
    "SceneHook",
    "dead_port",
    "error_reply",
]

Vendor = Literal["anthropic", "openai", "google"]
VENDORS: tuple[Vendor, ...] = ("anthropic", "openai", "google")

# What the fake model says on success, so a recording shows the reply came from here.
REPLY_TEXT = "pong from the execkit fake API"
# What a stream cut mid-answer sends before the connection closes.
_CUT_TEXT = "pong from the"
# The largest request body read (a CLI's first turn carries its system prompt and tools).
MAX_BODY = 16 * 1024 * 1024
# A reset time for usage limits: two hours from now, on the hour (not stable bytes, but
# no machine path either).
USAGE_RESET_S = 2 * 3600


@dataclass(frozen=True)
class Reply:
    """A canned HTTP answer."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


class SceneHook(typing.Protocol):
    """A timeline that answers in place of a `Scenario`'s steps (tests/vendors/scenes.py).

    `step(body, helper)` is the step of a model call arriving now (its request body; a
    CLI's helper call still succeeds) and the fields its log entry gets (the phase, the
    time); `reply(vendor, step)` the error reply for that step (a usage limit's reset is
    the timeline's own); `aux(method, path)` answers a path of its own, logged as a model
    call with the fields it returns (None: not one of its paths; no fields: not logged)."""

    def step(self, body: bytes, helper: bool) -> tuple[str, dict[str, object]]: ...

    def reply(self, vendor: Vendor, step: str) -> Reply: ...

    def aux(self, method: str, path: str) -> tuple[Reply, dict[str, object] | None] | None: ...


@dataclass(frozen=True)
class Scenario:
    """What one recording does.

    `steps` are the answers to the model calls in order; the last one repeats. A step is
    `success`, `hang` (read the request, never answer), `midstream_error` (200, the first
    events, then the vendor's in-stream error), or an error kind of `error_reply`.
    `refused`: the CLI is pointed at a port nobody listens on. `keep_retries`: the CLI
    keeps its own default retry policy (the recorder lowers it otherwise) and
    `timeout_s` is then the recorder's timeout that kills it while it retries.
    A CLI's helper calls (gemini's model router, opencode's title call) succeed unless
    `helpers_fail`: they then get the step the next main call gets, without using it up
    (a CLI whose router retries an error for minutes never reaches its main call).

    How the recorder sets the CLI up (tests/vendors/record.py reads these):
    `endpoint`: `fake` (this API), `refused` (a port nobody listens on), `dns` (a host
    name the resolver refuses before any query leaves the machine: a label longer than
    63 characters), `tls` (`https://` to this plain-HTTP API: the handshake fails).
    `no_key`: the CLI's credential variable and files are left out. `logged_out`: the CLI
    is not pointed at any API either (its default vendor, which the proxy refuses).
    `untrusted`: the working directory is not marked trusted (only for CLIs that ask).
    `gateway`: the CLI signs in as an enterprise gateway session and streams its events
    (only claude: the sign-in under which claude-code 2.1 reads the vendor's unified
    rate-limit headers and prints a `rate_limit_event`; with an API key it never does).
    `stream_json`: the CLI streams its events with its API key (only claude:
    `--output-format stream-json --verbose`, where its assistant message carries the SDK's
    `error` field, `authentication_failed` or `billing_error`).
    `clis`: the CLIs the scenario is recorded for (None: every CLI it applies to).
    `cli_attempts`: the CLI's own attempts per call, where a setting says it (gemini
    `general.maxAttempts`; qwen and pi one more than their `maxRetries`), its retry delays
    left at their defaults.
    `output`: the CLI's output mode instead of the adapter's (`text`: none asked for, what
    `pi -p` or a bare `qwen PROMPT` prints; `json`: qwen's one JSON array).
    `version`: the CLI's version for this cell instead of the pinned one (an older release
    whose output differs), installed under tests/vendors/older/.
    `cli_env`: variables added to the CLI's environment (a setting only a variable sets).
    `sdk_retries`: the retries of the provider SDK inside the CLI, where a setting says it
    (pi `retry.provider.maxRetries`).
    """

    name: str
    description: str
    steps: tuple[str, ...] = ("success",)
    refused: bool = False
    keep_retries: bool = False
    timeout_s: float | None = None
    helpers_fail: bool = False
    endpoint: Literal["fake", "refused", "dns", "tls"] = "fake"
    no_key: bool = False
    logged_out: bool = False
    untrusted: bool = False
    gateway: bool = False
    stream_json: bool = False
    clis: frozenset[str] | None = None
    cli_attempts: int | None = None
    output: Literal["text", "json"] | None = None
    version: str | None = None
    cli_env: tuple[tuple[str, str], ...] = ()
    sdk_retries: int | None = None

    @property
    def reaches_api(self) -> bool:
        """Whether the CLI is pointed at this API at all (so steps can be answered)."""
        return self.endpoint == "fake" and not self.logged_out


ERROR_KINDS = (
    "server_500",
    "bad_gateway_502",
    "unavailable_503",
    "overloaded_529",
    "proxy_502_html",
    "proxy_503_text",
    "rate_limit_429",
    "usage_limit",
    "bad_request_400",
    "auth_401",
    "forbidden_403",
    "not_found_404",
    "billing",
    "payment_402",
    "context_length",
    "expired_401",
    "quota_per_day",
    "usage_limit_this_minute",
    "usage_limit_later_minute",
    "usage_limit_on_minute",
    "usage_limit_298",
)
# Steps that answer 200 and then fail inside the stream.
STREAM_FAILURES = ("midstream_error", "overloaded_in_stream", "stream_cut")

_SCENARIO_LIST: tuple[Scenario, ...] = (
    Scenario("success", "a one-turn reply"),
    Scenario("server_500", "500 in the vendor's own error shape", ("server_500",)),
    Scenario("bad_gateway_502", "502 in the vendor's own error shape", ("bad_gateway_502",)),
    Scenario("unavailable_503", "503 in the vendor's own error shape", ("unavailable_503",)),
    Scenario("overloaded_529", "529 overloaded in the vendor's own shape", ("overloaded_529",)),
    Scenario("proxy_502_html", "an nginx HTML 502 page from a proxy", ("proxy_502_html",)),
    Scenario("proxy_503_text", "a plain-text 503 from a proxy", ("proxy_503_text",)),
    Scenario(
        "rate_limit_429",
        "429 with Retry-After, rate-limit headers and the vendor's rate-limit body",
        ("rate_limit_429",),
    ),
    Scenario("usage_limit", "a plan or daily usage limit with a reset time", ("usage_limit",)),
    Scenario("bad_request_400", "400 invalid request", ("bad_request_400",)),
    Scenario("auth_401", "401 invalid API key", ("auth_401",)),
    Scenario("forbidden_403", "403 permission denied", ("forbidden_403",)),
    Scenario("not_found_404", "404 model not found", ("not_found_404",)),
    Scenario(
        "billing",
        "credit balance or quota exhausted, as each vendor sends it (no reset time)",
        ("billing",),
    ),
    Scenario("payment_402", "402 payment required in the vendor's shape", ("payment_402",)),
    Scenario("context_length", "400 context length exceeded", ("context_length",)),
    Scenario(
        "midstream_error",
        "200, the first stream events, then the vendor's in-stream overload/server error",
        ("midstream_error",),
    ),
    Scenario(
        "flaky_503_then_400", "503, then 400 on the retry", ("unavailable_503", "bad_request_400")
    ),
    Scenario(
        "flaky_503_then_success", "503, then success on the retry", ("unavailable_503", "success")
    ),
    Scenario(
        "connection_refused",
        "the base URL's port has no listener",
        refused=True,
        endpoint="refused",
    ),
    Scenario(
        "hang",
        "the API accepts and never answers; the recorder's timeout kills the CLI",
        ("hang",),
        timeout_s=20.0,
        helpers_fail=True,
    ),
    Scenario(
        "retrying_503_killed",
        "503 on every call with the CLI's default retries; killed by the timeout mid-retry",
        ("unavailable_503",),
        keep_retries=True,
        timeout_s=30.0,
        helpers_fail=True,
    ),
)
_WIDER = (
    Scenario(
        "no_credentials",
        "the CLI's key variable is not set (its base URL still points here)",
        ("auth_401",),
        no_key=True,
    ),
    Scenario(
        "not_logged_in",
        "no key and no base URL: the CLI's own default vendor, which the proxy refuses",
        ("auth_401",),
        no_key=True,
        logged_out=True,
    ),
    Scenario(
        "expired_credential",
        "the vendor says the key or token expired or was revoked",
        ("expired_401",),
    ),
    Scenario(
        "usage_limit_gateway",
        "a usage limit with its reset, to a gateway session that streams its events "
        "(claude's stream-json `rate_limit_event`)",
        ("usage_limit",),
        gateway=True,
    ),
    Scenario(
        "auth_401_stream",
        "401 invalid API key, to a CLI that streams its events (claude's stream-json)",
        ("auth_401",),
        stream_json=True,
    ),
    Scenario(
        "payment_402_stream",
        "402 payment required, to a CLI that streams its events (claude's stream-json)",
        ("payment_402",),
        stream_json=True,
    ),
    Scenario(
        "untrusted_workspace",
        "the working directory is not marked trusted (CLIs that ask for trust)",
        untrusted=True,
    ),
    Scenario(
        "quota_per_day",
        "a per-day quota (Google: a PerDay quota id, no retry delay; OpenAI: requests per "
        "day with its wait; Anthropic: the seven-day limit with its reset)",
        ("quota_per_day",),
    ),
    Scenario(
        "overloaded_in_stream",
        "200, then an overloaded error as the stream's first event",
        ("overloaded_in_stream",),
    ),
    Scenario(
        "stream_cut",
        "200, the first words of the answer, then the connection closes with no end event",
        ("stream_cut",),
    ),
    Scenario("dns_failure", "the base URL's host name cannot be resolved", endpoint="dns"),
    Scenario("tls_failure", "https:// to a server that speaks plain HTTP", endpoint="tls"),
    Scenario(
        "not_installed",
        "the npm package is there but its binary is not (a shim that fetches it at first run)",
        logged_out=True,
    ),
)
# Issue 52: codex prints its usage-limit reset rounded down to the minute; the reset falls
# inside the current minute, later in a coming minute, or exactly on one. Issue 44: claude's
# retries of a 529 that end in a dropped connection.
_RESETS_AND_LADDERS: tuple[Scenario, ...] = (
    Scenario(
        "usage_limit_this_minute",
        "a usage limit whose reset falls inside the current minute (printed to the minute, "
        "that minute is already under way)",
        ("usage_limit_this_minute",),
        clis=frozenset({"codex"}),
    ),
    Scenario(
        "usage_limit_later_minute",
        "a usage limit whose reset is 40 s into the minute after next",
        ("usage_limit_later_minute",),
        clis=frozenset({"codex"}),
    ),
    Scenario(
        "usage_limit_on_minute",
        "a usage limit whose reset is exactly on the minute after next",
        ("usage_limit_on_minute",),
        clis=frozenset({"codex"}),
    ),
    Scenario(
        "overloaded_529_then_dropped",
        "529 overloaded, then every retry's connection closed with no answer",
        ("overloaded_529", "connection_drop"),
        clis=frozenset({"claude"}),
    ),
)
# Issue 52: a limit a CLI sleeps out itself. 298 s is within gemini-cli's own patience
# (it retries a quota error whose delay is at most 300 s, sleeping the delay plus up to 20%
# jitter) and qwen's (its rate-limit loop waits the Retry-After, up to 5 minutes), and far
# beyond the recorder's 60 s timeout: a CLI that sleeps it out is killed mid-sleep.
_LONG_LIMIT = "a usage limit that lifts in 298 s (Google: RetryInfo 298s on an hourly quota; "
_LONG_LIMIT += (
    "OpenAI and Anthropic: 429 with Retry-After: 298), longer than the run's 60 s timeout"
)
_SLEEPERS = (
    Scenario(
        "limit_longer_than_timeout",
        _LONG_LIMIT + "; the CLI's own retries as docs/vendors.md sets them (2 attempts)",
        ("usage_limit_298",),
        cli_attempts=2,
        clis=frozenset({"gemini", "qwen", "pi"}),
    ),
    Scenario(
        "limit_longer_than_timeout_no_sdk_retries",
        _LONG_LIMIT + "; pi with retry.provider.maxRetries 0, so its OpenAI client does not "
        "sleep the Retry-After itself",
        ("usage_limit_298",),
        cli_attempts=2,
        sdk_retries=0,
        clis=frozenset({"pi"}),
    ),
    Scenario(
        "limit_longer_than_timeout_one_attempt",
        _LONG_LIMIT + "; gemini's general.maxAttempts 1 (it then reports the limit at once)",
        ("usage_limit_298",),
        cli_attempts=1,
        clis=frozenset({"gemini"}),
    ),
    Scenario(
        "limit_longer_than_timeout_unattended",
        _LONG_LIMIT + "; qwen with QWEN_CODE_UNATTENDED_RETRY=1, which announces its wait "
        "every 30 s",
        ("usage_limit_298",),
        cli_attempts=2,
        clis=frozenset({"qwen"}),
        cli_env=(("QWEN_CODE_UNATTENDED_RETRY", "1"),),
    ),
)


def _in_mode(name: str, output: Literal["text", "json"], clis: set[str]) -> Scenario:
    """Scenario `name` with the CLI asked for another output mode (issue 44: a runner that
    passes its own argv gets these)."""
    base = next(s for s in _SCENARIO_LIST + _WIDER if s.name == name)
    said = "its text mode (no output format asked for)" if output == "text" else "json mode"
    return replace(
        base,
        name=f"{name}_{output}",
        description=f"{base.description}; the CLI in {said}",
        output=output,
        clis=frozenset(clis),
    )


_MODES = (
    _in_mode("auth_401", "text", {"pi", "qwen"}),
    _in_mode("no_credentials", "text", {"pi", "qwen"}),
    _in_mode("server_500", "text", {"pi", "qwen"}),
    _in_mode("connection_refused", "text", {"pi", "qwen"}),
    # pi's OpenAI client waits the 17 s Retry-After twice on each of its own two tries.
    replace(_in_mode("rate_limit_429", "text", {"pi"}), timeout_s=120.0),
    _in_mode("auth_401", "json", {"qwen"}),
    _in_mode("no_credentials", "json", {"qwen"}),
    _in_mode("server_500", "json", {"qwen"}),
    _in_mode("connection_refused", "json", {"qwen"}),
)
# Older gemini-cli releases give up on an unreachable API at once, printing the error
# object as `[object Object]` (issue 44). They send even loopback calls through
# HTTP(S)_PROXY, which the recorder points here (CONNECT, refused): only a scenario that
# never reaches an API records them as they behave without one.
_OLDER = tuple(
    replace(
        next(s for s in _SCENARIO_LIST if s.name == "connection_refused"),
        name=f"connection_refused_gemini_{version.rsplit('.', 1)[0].replace('.', '_')}",
        description=f"the base URL's port has no listener; gemini-cli {version}",
        clis=frozenset({"gemini"}),
        version=version,
    )
    for version in ("0.20.2", "0.30.1")
)
_SCENARIO_LIST = _SCENARIO_LIST + _WIDER + _RESETS_AND_LADDERS + _SLEEPERS + _MODES + _OLDER
SCENARIOS: dict[str, Scenario] = {s.name: s for s in _SCENARIO_LIST}


# --------------------------------------------------------------------------- error bodies


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _anthropic_error(status: int, kind: str, message: str, *headers: tuple[str, str]) -> Reply:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    request_id = ("request-id", "req_011CFakeExeckit0000000000")
    return Reply(status, _json(body), headers=(request_id, *headers))


def _openai_error(
    status: int,
    message: str,
    kind: str | None,
    code: str | None,
    param: str | None = None,
    *headers: tuple[str, str],
    **extra: object,
) -> Reply:
    error: dict[str, object] = {"message": message, "type": kind, "param": param, "code": code}
    error.update(extra)
    request_id = ("x-request-id", "req_fakeexeckit00000000000000000000")
    return Reply(status, _json({"error": error}), headers=(request_id, *headers))


def _google_error(
    status: int, code_name: str, message: str, *details: dict[str, object], retry: str = ""
) -> Reply:
    error: dict[str, object] = {"code": status, "message": message, "status": code_name}
    listed = list(details)
    if retry:
        listed.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry})
    if listed:
        error["details"] = listed
    return Reply(status, _json({"error": error}))


_NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)

_RATE_HEADERS_OPENAI = (
    ("retry-after", "17"),
    ("x-ratelimit-limit-requests", "500"),
    ("x-ratelimit-limit-tokens", "30000"),
    ("x-ratelimit-remaining-requests", "499"),
    ("x-ratelimit-remaining-tokens", "0"),
    ("x-ratelimit-reset-requests", "120ms"),
    ("x-ratelimit-reset-tokens", "17s"),
)


def _reset_epoch() -> int:
    return (int(time.time()) // 3600) * 3600 + USAGE_RESET_S


def _minute_reset(kind: str) -> int:
    """The reset of a `usage_limit_*_minute` kind, in whole seconds as the API states it:
    inside the current minute (half-way to its end), 40 s into the minute after next, or
    exactly on the minute after next."""
    now = time.time()
    minute = int(now // 60) * 60
    if kind == "usage_limit_this_minute":
        return int(now) + max(1, (minute + 59 - int(now)) // 2)
    if kind == "usage_limit_later_minute":
        return minute + 160
    return minute + 120


def _rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _google_quota(quota_id: str, metric: str, limit: int) -> dict[str, object]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
            {
                "quotaMetric": f"generativelanguage.googleapis.com/{metric}",
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": "gemini-2.5-pro"},
                "quotaValue": str(limit),
            }
        ],
    }


_GOOGLE_HELP: dict[str, object] = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [
        {
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
        }
    ],
}


def _anthropic_reply(kind: str) -> Reply:
    now = time.time()
    if kind == "server_500":
        return _anthropic_error(500, "api_error", "Internal server error")
    if kind == "bad_gateway_502":
        return _anthropic_error(502, "api_error", "Bad gateway")
    if kind == "unavailable_503":
        return _anthropic_error(503, "api_error", "Service unavailable")
    if kind == "overloaded_529":
        return _anthropic_error(529, "overloaded_error", "Overloaded")
    if kind == "rate_limit_429":
        return _anthropic_error(
            429,
            "rate_limit_error",
            "This request would exceed the rate limit for your organization "
            "(fake-org) of 30,000 input tokens per minute. For details, refer to: "
            "https://docs.claude.com/en/api/rate-limits. You can see the response headers "
            "for current usage. Please reduce the prompt length or the maximum tokens "
            "requested, or try again later.",
            ("retry-after", "17"),
            ("anthropic-ratelimit-input-tokens-limit", "30000"),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            ("anthropic-ratelimit-input-tokens-reset", _rfc3339(now + 17)),
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", _rfc3339(now + 1)),
        )
    if kind == "usage_limit":
        reset = str(_reset_epoch())
        return _anthropic_error(
            429,
            "rate_limit_error",
            "This request would exceed your account's rate limit. Please try again later.",
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-reset", reset),
            ("anthropic-ratelimit-unified-5h-status", "rejected"),
            ("anthropic-ratelimit-unified-5h-reset", reset),
            ("anthropic-ratelimit-unified-representative-claim", "five_hour"),
            ("anthropic-ratelimit-unified-fallback", "unavailable"),
            ("anthropic-ratelimit-unified-overage-status", "rejected"),
            ("anthropic-ratelimit-unified-overage-disabled-reason", "org_level_disabled"),
        )
    if kind == "bad_request_400":
        return _anthropic_error(
            400,
            "invalid_request_error",
            "messages.0.content.0.text: text content blocks must be non-empty",
        )
    if kind == "auth_401":
        return _anthropic_error(401, "authentication_error", "invalid x-api-key")
    if kind == "forbidden_403":
        return _anthropic_error(
            403,
            "permission_error",
            "Your API key does not have permission to use the specified resource.",
        )
    if kind == "not_found_404":
        return _anthropic_error(404, "not_found_error", "model: claude-fake-model")
    if kind == "billing":
        return _anthropic_error(
            400,
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to "
            "Plans & Billing to upgrade or purchase credits.",
        )
    if kind == "payment_402":
        return _anthropic_error(
            402,
            "billing_error",
            "Your credit balance is too low to access the Anthropic API. Please go to "
            "Plans & Billing to upgrade or purchase credits.",
        )
    if kind == "context_length":
        return _anthropic_error(
            400, "invalid_request_error", "prompt is too long: 215034 tokens > 200000 maximum"
        )
    if kind == "expired_401":
        return _anthropic_error(
            401,
            "authentication_error",
            "OAuth token has expired. Please obtain a new token or refresh your existing token.",
        )
    if kind == "quota_per_day":
        reset = str(_reset_epoch() + 2 * 86400)
        return _anthropic_error(
            429,
            "rate_limit_error",
            "This request would exceed your account's rate limit. Please try again later.",
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-reset", reset),
            ("anthropic-ratelimit-unified-7d-status", "rejected"),
            ("anthropic-ratelimit-unified-7d-reset", reset),
            ("anthropic-ratelimit-unified-representative-claim", "seven_day"),
        )
    if kind == "usage_limit_298":
        return _anthropic_error(
            429,
            "rate_limit_error",
            "This request would exceed your account's rate limit. Please try again later.",
            ("retry-after", "298"),
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-reset", str(int(now) + 298)),
        )
    raise KeyError(kind)


_MINUTE_KINDS = ("usage_limit_this_minute", "usage_limit_later_minute", "usage_limit_on_minute")


def _openai_reply(kind: str) -> Reply:
    if kind == "server_500":
        return _openai_error(
            500,
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
            None,
        )
    if kind == "bad_gateway_502":
        return _openai_error(502, "Bad gateway.", "server_error", None)
    if kind == "unavailable_503":
        return _openai_error(
            503, "The server is overloaded or not ready yet.", "server_error", None
        )
    if kind == "overloaded_529":
        return _openai_error(529, "Overloaded", "server_error", "overloaded")
    if kind == "rate_limit_429":
        return _openai_error(
            429,
            "Rate limit reached for gpt-fake in organization org-fakeexeckit on tokens per "
            "min (TPM): Limit 30000, Used 30000, Requested 1024. Please try again in 17s. "
            "Visit https://platform.openai.com/account/rate-limits to learn more.",
            "tokens",
            "rate_limit_exceeded",
            None,
            *_RATE_HEADERS_OPENAI,
        )
    if kind in ("usage_limit", *_MINUTE_KINDS):
        reset = _reset_epoch() if kind == "usage_limit" else _minute_reset(kind)
        return _openai_error(
            429,
            "The usage limit has been reached",
            "usage_limit_reached",
            None,
            None,
            plan_type="plus",
            resets_at=reset,
            resets_in_seconds=max(0, reset - int(time.time())),
        )
    if kind == "bad_request_400":
        return _openai_error(
            400,
            "Unsupported parameter: 'temperature' is not supported with this model.",
            "invalid_request_error",
            "unsupported_parameter",
            "temperature",
        )
    if kind == "auth_401":
        return _openai_error(
            401,
            "Incorrect API key provided: sk-test-********0000. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
            "invalid_api_key",
        )
    if kind == "forbidden_403":
        return _openai_error(
            403,
            "Country, region, or territory not supported",
            "request_forbidden",
            "unsupported_country_region_territory",
        )
    if kind == "not_found_404":
        return _openai_error(
            404,
            "The model `gpt-fake` does not exist or you do not have access to it.",
            "invalid_request_error",
            "model_not_found",
        )
    if kind == "billing":
        return _openai_error(
            429,
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "insufficient_quota",
            "insufficient_quota",
        )
    if kind == "payment_402":
        # OpenAI documents no 402; OpenAI-compatible gateways answer credits this way.
        return _openai_error(
            402,
            "Insufficient credits. Add more credits to your account to continue.",
            "insufficient_quota",
            "payment_required",
        )
    if kind == "context_length":
        return _openai_error(
            400,
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again.",
            "invalid_request_error",
            "context_length_exceeded",
            "input",
        )
    if kind == "expired_401":
        return _openai_error(
            401,
            "Your authentication token has expired. Please try signing in again.",
            "invalid_request_error",
            "token_expired",
        )
    if kind == "quota_per_day":
        return _openai_error(
            429,
            "Rate limit reached for gpt-fake in organization org-fakeexeckit on requests per "
            "day (RPD): Limit 200, Used 200, Requested 1. Please try again in 7m12s. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            "requests",
            "rate_limit_exceeded",
            None,
            ("retry-after", "432"),
            ("x-ratelimit-limit-requests", "200"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "7m12s"),
        )
    if kind == "usage_limit_298":
        return _openai_error(
            429,
            "Rate limit reached for gpt-fake in organization org-fakeexeckit on requests per "
            "hour (RPH): Limit 100, Used 100, Requested 1. Please try again in 4m58s. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            "requests",
            "rate_limit_exceeded",
            None,
            ("retry-after", "298"),
            ("x-ratelimit-limit-requests", "100"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "4m58s"),
        )
    raise KeyError(kind)


def _google_reply(kind: str) -> Reply:
    if kind == "server_500":
        return _google_error(
            500,
            "INTERNAL",
            "An internal error has occurred. Please retry or report in "
            "https://developers.generativeai.google/guide/troubleshooting",
        )
    if kind == "bad_gateway_502":
        return _google_error(502, "UNAVAILABLE", "Bad Gateway")
    if kind == "unavailable_503":
        return _google_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")
    if kind == "overloaded_529":
        return _google_error(529, "UNAVAILABLE", "The model is overloaded. Please try again later.")
    if kind == "rate_limit_429":
        return _google_error(
            429,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: "
            "generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 2, "
            "model: gemini-2.5-pro\nPlease retry in 17.0s.",
            _google_quota(
                "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                "generate_content_free_tier_requests",
                2,
            ),
            _GOOGLE_HELP,
            retry="17s",
        )
    if kind == "usage_limit":
        return _google_error(
            429,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: "
            "generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 50, "
            "model: gemini-2.5-pro\nPlease retry in 7200.0s.",
            _google_quota(
                "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                "generate_content_free_tier_requests",
                50,
            ),
            _GOOGLE_HELP,
            retry="7200s",
        )
    if kind == "bad_request_400":
        return _google_error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
    if kind == "auth_401":
        return _google_error(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token, "
            "login cookie or other valid authentication credential. See "
            "https://developers.google.com/identity/sign-in/web/devconsole-project.",
        )
    if kind == "forbidden_403":
        return _google_error(403, "PERMISSION_DENIED", "The caller does not have permission")
    if kind == "not_found_404":
        return _google_error(
            404,
            "NOT_FOUND",
            "models/gemini-fake is not found for API version v1beta, or is not supported for "
            "generateContent. Call ListModels to see the list of available models and their "
            "supported methods.",
        )
    if kind == "billing":
        return _google_error(
            400,
            "FAILED_PRECONDITION",
            "Gemini API free tier is not available in your country. Please enable billing "
            "on your project in Google AI Studio.",
        )
    if kind == "payment_402":
        return _google_error(
            402, "FAILED_PRECONDITION", "Payment required: enable billing for this project."
        )
    if kind == "context_length":
        return _google_error(
            400,
            "INVALID_ARGUMENT",
            "The input token count (1215034) exceeds the maximum number of tokens allowed "
            "(1048576).",
        )
    if kind == "expired_401":
        # What the Gemini API answers for an expired key: 400, with the reason in details.
        return _google_error(
            400,
            "INVALID_ARGUMENT",
            "API key expired. Please renew the API key.",
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            },
        )
    if kind == "quota_per_day":
        return _google_error(
            429,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: "
            "generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 50, "
            "model: gemini-2.5-pro",
            _google_quota(
                "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                "generate_content_free_tier_requests",
                50,
            ),
            _GOOGLE_HELP,
        )
    if kind == "usage_limit_298":
        # Neither a per-day nor a per-minute quota id: gemini-cli reads the RetryInfo delay
        # and, at most 300 s, retries after it (sleeping it out).
        return _google_error(
            429,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: "
            "generativelanguage.googleapis.com/generate_content_requests, limit: 100, "
            "model: gemini-2.5-pro\nPlease retry in 298.0s.",
            _google_quota(
                "GenerateRequestsPerHourPerProjectPerModel",
                "generate_content_requests",
                100,
            ),
            _GOOGLE_HELP,
            retry="298s",
        )
    raise KeyError(kind)


def error_reply(vendor: Vendor, kind: str) -> Reply:
    """The canned error `kind` (one of `ERROR_KINDS`) as `vendor`'s API sends it."""
    if kind == "proxy_502_html":
        return Reply(502, _NGINX_502, "text/html", (("server", "nginx"),))
    if kind == "proxy_503_text":
        return Reply(503, b"503 Service Unavailable\n", "text/plain")
    if vendor == "anthropic":
        return _anthropic_reply(kind)
    if vendor == "openai":
        return _openai_reply(kind)
    return _google_reply(kind)


# --------------------------------------------------------------------------- success bodies

Protocol = Literal["messages", "responses", "chat", "google"]


def _ids() -> str:
    return uuid.uuid4().hex[:24]


def _sse(event: str | None, data: object) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {payload}\n\n".encode()


def _messages_events(model: str, fail: str | None) -> Iterator[bytes]:
    message_id = f"msg_fake{_ids()}"
    usage = {"input_tokens": 12, "output_tokens": 1}
    message: dict[str, object] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    yield _sse("message_start", {"type": "message_start", "message": message})
    if fail in ("midstream_error", "overloaded_in_stream"):
        error = {"type": "overloaded_error", "message": "Overloaded"}
        yield _sse("error", {"type": "error", "error": error})
        return
    block = {"type": "text", "text": ""}
    yield _sse(
        "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
    )
    yield _sse("ping", {"type": "ping"})
    delta = {"type": "text_delta", "text": REPLY_TEXT if fail is None else _CUT_TEXT}
    yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    if fail == "stream_cut":
        return
    yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 7},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


def _message_json(model: str) -> bytes:
    return _json(
        {
            "id": f"msg_fake{_ids()}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": REPLY_TEXT}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 7},
        }
    )


def _response_object(model: str, response_id: str, status: str, output: list[Any]) -> Any:
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 19,
    }
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "usage": usage if status == "completed" else None,
        "error": None,
    }


def _responses_events(model: str, fail: str | None) -> Iterator[bytes]:
    response_id = f"resp_fake{_ids()}"
    item_id = f"msg_fake{_ids()}"
    seq = iter(range(1_000))

    def event(kind: str, **fields: object) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

    created = _response_object(model, response_id, "in_progress", [])
    yield event("response.created", response=created)
    yield event("response.in_progress", response=created)
    if fail in ("midstream_error", "overloaded_in_stream"):
        failed = _response_object(model, response_id, "failed", [])
        failed["error"] = (
            {
                "code": "server_error",
                "message": "The server had an error processing your request. Sorry about that!",
            }
            if fail == "midstream_error"
            else {"code": "server_is_overloaded", "message": "Overloaded"}
        )
        yield event("response.failed", response=failed)
        return
    empty = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant"}
    yield event("response.output_item.added", output_index=0, item={**empty, "content": []})
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield event("response.content_part.added", **where, part=part)
    if fail == "stream_cut":
        yield event("response.output_text.delta", **where, delta=_CUT_TEXT, logprobs=[])
        return
    yield event("response.output_text.delta", **where, delta=REPLY_TEXT, logprobs=[])
    yield event("response.output_text.done", **where, text=REPLY_TEXT, logprobs=[])
    done_part = {"type": "output_text", "text": REPLY_TEXT, "annotations": []}
    yield event("response.content_part.done", **where, part=done_part)
    item = {**empty, "status": "completed", "content": [done_part]}
    yield event("response.output_item.done", output_index=0, item=item)
    yield event(
        "response.completed", response=_response_object(model, response_id, "completed", [item])
    )


def _chat_events(model: str, fail: str | None) -> Iterator[bytes]:
    chunk_id = f"chatcmpl-fake{_ids()}"
    created = int(time.time())

    def chunk(delta: dict[str, object], finish: str | None, **extra: object) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
            **extra,
        }
        return _sse(None, body)

    yield chunk({"role": "assistant", "content": ""}, None)
    if fail in ("midstream_error", "overloaded_in_stream"):
        # OpenAI-compatible gateways report a failure after the 200 as an error chunk.
        error: dict[str, object] = (
            {"message": "Overloaded", "type": "server_error", "code": 503}
            if fail == "midstream_error"
            else {"message": "Overloaded", "type": "overloaded_error", "code": "overloaded"}
        )
        yield _sse(None, {"id": chunk_id, "object": "chat.completion.chunk", "error": error})
        return
    if fail == "stream_cut":
        yield chunk({"content": _CUT_TEXT}, None)
        return
    yield chunk({"content": REPLY_TEXT}, None)
    usage = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
    yield chunk({}, "stop", usage=usage)
    yield _sse(None, "[DONE]")


def _chat_json(model: str) -> bytes:
    return _json(
        {
            "id": f"chatcmpl-fake{_ids()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY_TEXT},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        }
    )


def _fill_schema(schema: object, depth: int = 0) -> object:
    """A small value that satisfies a JSON schema (OpenAPI- or JSON-Schema-style types)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = str(schema.get("type") or "").lower()
    if kind == "object" or isinstance(schema.get("properties"), dict):
        properties = schema.get("properties")
        props = properties if isinstance(properties, dict) else {}
        return {name: _fill_schema(sub, depth + 1) for name, sub in list(props.items())[:50]}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        minimum = schema.get("minimum")
        return minimum if isinstance(minimum, int | float) else 10
    if kind == "boolean":
        return False
    return "fake"


def _json_mode(request: dict[str, Any]) -> object | None:
    """The schema of a Gemini JSON-mode call (a CLI's own routing/checking call), if any."""
    config = request.get("generationConfig")
    if not isinstance(config, dict) or config.get("responseMimeType") != "application/json":
        return None
    return config.get("responseJsonSchema") or config.get("responseSchema") or {}


def _google_chunk(model: str, text: str, finish: str | None) -> dict[str, object]:
    candidate: dict[str, object] = {"content": {"parts": [{"text": text}], "role": "model"}}
    if finish:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    return {
        "candidates": [candidate],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19},
        "modelVersion": model,
        "responseId": f"fake{_ids()}",
    }


def _google_events(model: str, fail: str | None) -> Iterator[bytes]:
    if fail == "stream_cut":
        yield _sse(None, _google_chunk(model, _CUT_TEXT, None))
        return
    if fail == "overloaded_in_stream":
        error = {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}
        yield _sse(None, {"error": error})
        return
    if fail:
        yield _sse(None, _google_chunk(model, "pong", None))
        error = {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}
        yield _sse(None, {"error": error})
        return
    yield _sse(None, _google_chunk(model, REPLY_TEXT, "STOP"))


# --------------------------------------------------------------------------- the server


@dataclass
class _State:
    scenario: Scenario
    vendor: Vendor
    max_requests: int
    deadline: float
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    log: list[dict[str, Any]] = field(default_factory=list)
    model_calls: int = 0
    requests: int = 0
    dump_dir: str | None = None
    tool_less_helpers: bool = True
    scene: SceneHook | None = None


_NON_STREAM_FAILURE: dict[Vendor, str] = {
    "anthropic": "overloaded_529",
    "openai": "server_500",
    "google": "unavailable_503",
}


def _protocol_of(path: str) -> Protocol | None:
    bare = urlsplit(path).path.rstrip("/")
    if bare.endswith("/messages"):
        return "messages"
    if bare.endswith("/responses"):
        return "responses"
    if bare.endswith("/chat/completions"):
        return "chat"
    if bare.endswith((":generateContent", ":streamGenerateContent")):
        return "google"
    return None


_GOOGLE_MODEL = re.compile(r"/models/([^/:]+):")


def _scrub_query(path: str) -> str:
    # A Gemini key can travel as ?key=...; the log never keeps it.
    return re.sub(r"([?&]key=)[^&]*", r"\1<KEY>", path)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "execkit-fake-api"
    sys_version = ""
    # An idle keep-alive connection is closed after this long (each read is bounded).
    timeout = 15

    # -- plumbing

    def log_message(self, format: str, *args: Any) -> None:
        return  # the request log is kept in memory, not printed

    def _state(self) -> _State:
        return self.server.state

    def _record(self, role: str, status: int | None, **extra: object) -> None:
        state = self._state()
        entry: dict[str, Any] = {
            "method": self.command,
            "path": _scrub_query(self.path),
            "status": status,
            "role": role,
        }
        retry = self.headers.get("x-stainless-retry-count")
        if retry is not None:
            entry["retry_count"] = retry
        entry.update(extra)
        with state.lock:
            state.log.append(entry)

    def _read_body(self) -> bytes:
        length = self.headers.get("content-length")
        if length is not None:
            try:
                size = min(int(length), MAX_BODY)
            except ValueError:
                size = 0
            return self.rfile.read(size) if size > 0 else b""
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            chunks: list[bytes] = []
            total = 0
            for _ in range(100_000):
                line = self.rfile.readline(1024).strip()
                size = int(line.split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline(1024)
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline(1024)
                total += size
                if total > MAX_BODY:
                    break
            return b"".join(chunks)
        return b""

    def _dump(self, body: bytes) -> None:
        """With `dump_dir` (debugging only), keep each request's headers and body."""
        state = self._state()
        if state.dump_dir is None:
            return
        with state.lock:
            number = state.requests
        name = f"{number:03d}-{self.command}-{re.sub(r'[^A-Za-z0-9.]+', '_', self.path)[:80]}"
        head = f"{self.command} {self.path}\n{self.headers}".encode()
        with open(f"{state.dump_dir}/{name}", "wb") as dump:
            dump.write(head + b"\n" + body)

    def _send(self, reply: Reply, *, close: bool = False) -> None:
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header("content-length", str(len(reply.body)))
        for name, value in reply.headers:
            self.send_header(name, value)
        if close:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(reply.body)
        self.wfile.flush()

    def _send_stream(self, events: Iterator[bytes], *, cut: bool = False) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.close_connection = True
        self.end_headers()
        for chunk in events:
            self.wfile.write(chunk)
            self.wfile.flush()
        if cut:
            with contextlib.suppress(OSError):  # the peer may have gone already
                self.connection.shutdown(socket.SHUT_RDWR)

    # -- routing

    def _gate(self) -> bool:
        """Count the request; False (and a 503 of the fake's own) past the request cap."""
        state = self._state()
        with state.lock:
            state.requests += 1
            over = state.requests > state.max_requests
        if over:
            state.stop.set()
            self._record("over-limit", 503)
            self._send(Reply(503, b"fake_api: request limit reached\n", "text/plain"), close=True)
        return not over

    def _external(self) -> None:
        target = self.path if self.command != "CONNECT" else f"{self.path}"
        host = target.split("://", 1)[-1].split("/", 1)[0]
        self._read_body()
        self._record("external", 403, host=host)
        self._send(Reply(403, b"fake_api: outside traffic is refused\n", "text/plain"), close=True)

    def do_CONNECT(self) -> None:
        if self._gate():
            self._external()

    def do_GET(self) -> None:
        if not self._gate():
            return
        if self.path.startswith(("http://", "https://")):
            self._external()
            return
        self._aux(b"")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_DELETE(self) -> None:
        self.do_GET()

    def do_PUT(self) -> None:
        self.do_POST()

    def do_PATCH(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        if not self._gate():
            return
        if self.path.startswith(("http://", "https://")):
            self._external()
            return
        body = self._read_body()
        self._dump(body)
        protocol = _protocol_of(self.path)
        if protocol is None:
            self._aux(body)
            return
        self._model_call(protocol, body)

    def _aux(self, body: bytes) -> None:
        """The calls around the model call: model lists, token counts, anything else."""
        state = self._state()
        path = urlsplit(self.path).path.rstrip("/")
        answer = None if state.scene is None else state.scene.aux(self.command, self.path)
        if answer is not None:
            if answer[1] is not None:
                self._record("model", answer[0].status, **answer[1])
            self._send(answer[0])
            return
        if self.command == "GET" and path.endswith("/models"):
            reply = Reply(200, _json(self._models_list()))
        elif path.endswith("/messages/count_tokens"):
            reply = Reply(200, _json({"input_tokens": 12}))
        elif path.endswith(":countTokens"):
            reply = Reply(200, _json({"totalTokens": 12}))
        elif state.vendor == "anthropic":
            reply = _anthropic_error(404, "not_found_error", f"Not found: {path}")
        elif state.vendor == "openai":
            reply = _openai_error(404, f"Unknown path {path}", "invalid_request_error", None)
        else:
            reply = _google_error(404, "NOT_FOUND", f"Unknown path {path}")
        self._record("aux", reply.status)
        self._send(reply)

    def _models_list(self) -> object:
        vendor = self._state().vendor
        if vendor == "anthropic":
            model = {
                "type": "model",
                "id": "claude-fake-model",
                "display_name": "Claude Fake",
                "created_at": "2025-01-01T00:00:00Z",
            }
            return {
                "data": [model],
                "has_more": False,
                "first_id": "claude-fake-model",
                "last_id": "claude-fake-model",
            }
        if vendor == "openai":
            listed = {
                "id": "gpt-fake",
                "object": "model",
                "created": 1735689600,
                "owned_by": "fake",
            }
            return {"object": "list", "data": [listed]}
        return {
            "models": [
                {
                    "name": "models/gemini-2.5-pro",
                    "displayName": "Gemini Fake",
                    "supportedGenerationMethods": ["generateContent", "countTokens"],
                }
            ]
        }

    def _model_call(self, protocol: Protocol, body: bytes) -> None:
        state = self._state()
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        if not isinstance(request, dict):
            request = {}
        schema = _json_mode(request) if protocol == "google" else None
        # A CLI's own helper call: gemini's JSON-mode model router, opencode's title call
        # (chat or messages with no tools offered; codex's Responses calls carry their
        # tools inside `input`). It never uses up a step (see `Scenario`).
        helper = schema is not None or (
            state.tool_less_helpers
            and protocol in ("chat", "messages")
            and not request.get("tools")
        )
        with state.lock:
            index = state.model_calls
            if not helper:
                state.model_calls += 1
        steps = state.scenario.steps
        step = steps[min(index, len(steps) - 1)]
        scene_fields: dict[str, object] = {}
        if state.scene is not None:
            step, scene_fields = state.scene.step(body, helper)
        if helper and not state.scenario.helpers_fail:
            step = "success"
        model = str(request.get("model") or "")
        if protocol == "google":
            found = _GOOGLE_MODEL.search(self.path)
            model = found.group(1) if found else "gemini-fake"
        stream = bool(request.get("stream")) or protocol == "responses"
        if protocol == "google":
            stream = ":streamGenerateContent" in self.path
        info: dict[str, object] = {"step": step, "call": index + 1, "model": model}
        if helper:
            info["helper"] = True
        info.update(scene_fields)
        if step == "hang":
            self._record("model", None, **info)
            remaining = max(0.0, state.deadline - time.monotonic())
            state.stop.wait(remaining)
            self.close_connection = True
            return
        if step == "connection_drop":
            # The request is read, then the connection closes with no answer at all.
            self._record("model", None, **info)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if step in ("midstream_error", "overloaded_in_stream") and not stream:
            # A non-streaming request (a CLI's fallback after the failed stream) cannot
            # fail midway: it gets the vendor's plain overload/server error instead.
            step = _NON_STREAM_FAILURE[state.vendor]
            info["step"] = step
        if step == "stream_cut" and not stream:
            # Not streamed: the body is cut off halfway and the connection closed.
            self._record("model", 200, **info, stream=False)
            body = _json(_google_chunk(model, REPLY_TEXT, "STOP"))
            self._send_cut(Reply(200, body))
            return
        if step in ("success", *STREAM_FAILURES):
            fail = None if step == "success" else step
            self._record("model", 200, **info, stream=stream)
            if schema is not None and not fail:
                text = json.dumps(_fill_schema(schema))
                self._send(Reply(200, _json(_google_chunk(model, text, "STOP"))))
                return
            self._success(protocol, model or "fake-model", stream, fail)
            return
        if state.scene is not None:
            reply = state.scene.reply(state.vendor, step)
        else:
            reply = error_reply(state.vendor, step)
        self._record("model", reply.status, **info)
        self._send(reply)

    def _send_cut(self, reply: Reply) -> None:
        """The headers of `reply` and half its body, then the connection closes."""
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header("content-length", str(len(reply.body)))
        self.send_header("connection", "close")
        self.close_connection = True
        self.end_headers()
        self.wfile.write(reply.body[: len(reply.body) // 2])
        self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _success(self, protocol: Protocol, model: str, stream: bool, fail: str | None) -> None:
        if protocol == "messages":
            if stream or fail:
                self._send_stream(_messages_events(model, fail), cut=fail == "stream_cut")
            else:
                self._send(Reply(200, _message_json(model)))
        elif protocol == "responses":
            if stream or fail:
                self._send_stream(_responses_events(model, fail), cut=fail == "stream_cut")
            else:
                events = list(_responses_events(model, fail=None))
                completed = json.loads(events[-1].decode().split("data: ", 1)[1])
                self._send(Reply(200, _json(completed["response"])))
        elif protocol == "chat":
            if stream or fail:
                self._send_stream(_chat_events(model, fail), cut=fail is not None)
            else:
                self._send(Reply(200, _chat_json(model)))
        elif stream or fail:
            self._send_stream(_google_events(model, fail), cut=fail is not None)
        else:
            self._send(Reply(200, _json(_google_chunk(model, REPLY_TEXT, "STOP"))))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    state: _State

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A CLI that hangs up mid-answer (killed, or done with a refused CONNECT) is normal.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class FakeAPI:
    """One bounded fake vendor API on 127.0.0.1 (a context manager).

    `url` is `http://127.0.0.1:PORT`; `requests()` a copy of the log. Stops after
    `lifetime_s` or `max_requests` on its own, and on `close()`. With `scene`, a
    timeline answers the model calls in place of the scenario's steps (`SceneHook`).
    """

    def __init__(
        self,
        vendor: Vendor,
        scenario: Scenario,
        *,
        lifetime_s: float = 180.0,
        max_requests: int = 2000,
        dump_dir: str | None = None,
        tool_less_helpers: bool = True,
        scene: SceneHook | None = None,
    ) -> None:
        self.vendor = vendor
        self.scenario = scenario
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = _State(
            scenario=scenario,
            vendor=vendor,
            max_requests=max_requests,
            deadline=time.monotonic() + lifetime_s,
            dump_dir=dump_dir,
            tool_less_helpers=tool_less_helpers,
            scene=scene,
        )
        self._lifetime_s = lifetime_s
        self._serving = threading.Thread(target=self._serve, name="fake-api", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="fake-api-watch", daemon=True)
        self._closed = False

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeAPI:
        self._serving.start()
        self._watchdog.start()
        return self

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.1)

    def _watch(self) -> None:
        state = self._server.state
        state.stop.wait(self._lifetime_s)
        state.stop.set()
        self._server.shutdown()

    def wait(self, timeout_s: float) -> bool:
        """Wait until the server stopped itself (lifetime or request cap) or `timeout_s`."""
        return self._server.state.stop.wait(timeout_s)

    def requests(self) -> list[dict[str, Any]]:
        state = self._server.state
        with state.lock:
            return [dict(entry) for entry in state.log]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.state.stop.set()
        if self._watchdog.is_alive():
            self._watchdog.join(timeout=10)
        self._server.server_close()

    def __enter__(self) -> FakeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def dead_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return cast(int, sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve one fake vendor API scenario.")
    parser.add_argument("vendor", choices=VENDORS)
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--lifetime", type=float, default=120.0, help="seconds (default 120)")
    args = parser.parse_args(argv)
    vendor = cast(Vendor, args.vendor)
    with FakeAPI(vendor, SCENARIOS[args.scenario], lifetime_s=args.lifetime) as api:
        print(api.url, flush=True)
        api.wait(args.lifetime)
        for entry in api.requests():
            print(json.dumps(entry), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
