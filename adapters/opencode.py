"""opencode: `opencode run --format json`, one JSON event per line on stdout.

Events carry `type`, `sessionID` and a `part`: `text` parts make the reply (the last
step's text), `step_finish` parts carry `cost`, and an `error` event carries
`error: {"name", "data": {"message", "statusCode"?, "isRetryable"?, "responseHeaders"?,
"responseBody"?}}`; `statusCode` is the HTTP status.

Structure read (opencode 1.18, recorded in fixtures/recorded/opencode):

- `name` `ProviderAuthError` is opencode's own credential error; `ContextOverflowError`
  a request too long for the model (charged).
- `APIError` with no `statusCode` whose message is opencode's `Cannot connect to API: ...`
  is its connection-error event: the API is unreachable.
- `responseBody` is the provider's error body: its `error.type` / `error.code`
  (`insufficient_quota`, `invalid_api_key`, `usage_limit_reached`, `rate_limit_exceeded`,
  `server_error`...) names the kind, and `resets_in_seconds` / `resets_at` the reset;
  `responseHeaders` carry `retry-after`.
- `UnknownError` whose message is itself a JSON error (`{"message", "type", "code": 503}`)
  is an error chunk the provider sent mid-stream.
- A last `step_finish` whose `reason` is `unknown` ended on a provider stream cut before
  its finish reason; opencode then loops on it until killed: a stream failure it was
  still retrying (`pending`).
- An `error` event line that no longer parses because masking a credential-like value
  inside it (a key in a vendor's hint `Authorization: Bearer <key>).`) ate a quote is still
  read for its `name` and `statusCode` (`_salvage`): execkit masks every kept byte before
  an adapter sees it, so the adapter reads what survives rather than falling back to text.

Usage (issue #45): each `step_finish` part's `tokens` (`input`, `output`, `reasoning`,
`cache.read`, `cache.write`) and `cost` (USD opencode computes from its own model list:
`reported`; a 0 beside tokens is a model it has no price for, so `unknown`), the steps
summed; `usage_of` reads the same per line for the live meter.

`read_events` and `usage_of` are shared with the opencode-derived kilo adapter.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import (
    ErrorKind,
    Line,
    Usage,
    count_field,
    header_wait_s,
    http_status,
    iter_json_objects,
    json_object,
    number_field,
    read_usage,
    reported_usage,
    request_argv,
    reset_wait_s,
    str_field,
)

__all__ = ["OpencodeAdapter"]

_ERROR_NAMES = {"ProviderAuthError": ErrorKind.CREDENTIALS}
# A step_finish whose reason is this ended on a stream with no finish reason.
_NO_FINISH_REASON = "unknown"
_CONNECTION_FAILED = "Cannot connect to API"
# OpenAI-compatible error `code` / `type` values in the provider's body.
_BODY_KINDS = {
    "invalid_api_key": ErrorKind.CREDENTIALS,
    "insufficient_quota": ErrorKind.BILLING,
    "payment_required": ErrorKind.BILLING,
    "usage_limit_reached": ErrorKind.USAGE_LIMIT,
    "rate_limit_exceeded": ErrorKind.RATE_LIMITED,
    "rate_limit_error": ErrorKind.RATE_LIMITED,
    "overloaded": ErrorKind.OVERLOADED,
    "overloaded_error": ErrorKind.OVERLOADED,
    "server_error": ErrorKind.SERVER_ERROR,
    "authentication_error": ErrorKind.CREDENTIALS,
    "billing_error": ErrorKind.BILLING,
}


@attrs.frozen
class _Error:
    message: str
    status: int | None = None
    kind: ErrorKind | None = None
    wait: float | None = None


def _body_kind(body: dict[str, Any] | None) -> ErrorKind | None:
    if body is None:
        return None
    error = body.get("error", body)
    for key in ("code", "type"):
        value = str_field(error, key)
        if value in _BODY_KINDS:
            return _BODY_KINDS[value]
    return None


def _body_wait(body: dict[str, Any] | None, now: float) -> float | None:
    error = body.get("error", body) if body is not None else None
    seconds = number_field(error, "resets_in_seconds")
    if seconds is not None:
        return max(0.0, seconds)
    return reset_wait_s(number_field(error, "resets_at"), now=now)


def _error_of(event: dict[str, Any], now: float) -> _Error:
    error = event.get("error")
    if isinstance(error, str):
        return _Error(error)
    data = error.get("data") if isinstance(error, dict) else None
    message = (
        str_field(data, "message")
        or str_field(error, "message", "name")
        or str_field(event, "message")
        or "opencode reported an error"
    )
    name = str_field(error, "name") or ""
    code = number_field(data, "statusCode", "status") or number_field(error, "statusCode")
    status = http_status(code)
    body = json_object(str_field(data, "responseBody"))
    chunk = json_object(message)  # an error chunk whose message is the provider's JSON
    if status is None and chunk is not None:
        status = http_status(number_field(chunk.get("error", chunk), "code", "status"))
    kind = _ERROR_NAMES.get(name) or _body_kind(body) or _body_kind(chunk)
    if kind is None and status is None and message.startswith(_CONNECTION_FAILED):
        kind = ErrorKind.UNREACHABLE
    headers = data.get("responseHeaders") if isinstance(data, dict) else None
    wait = _body_wait(body, now)
    if wait is None:
        wait = header_wait_s(headers, now=now)
    return _Error(message, status, kind, wait)


# What an error event line still says after masking broke its JSON.
_ERROR_LINE = re.compile(r'^\{\s*"type"\s*:\s*"error"')
_SALVAGED = {
    "name": re.compile(r'"name"\s*:\s*"(?P<value>[A-Za-z]{1,64})"'),
    "statusCode": re.compile(r'"statusCode"\s*:\s*(?P<value>[1-5]\d\d)\b'),
    "message": re.compile(r'"message"\s*:\s*"(?P<value>(?:[^"\\]|\\.){0,2000})'),
}


def _salvage(line: str) -> dict[str, Any] | None:
    """An error event rebuilt from the fields a broken line still shows, or None."""
    if not _ERROR_LINE.match(line):
        return None
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        pass
    else:
        return None  # it parses: iter_json_objects has it
    data: dict[str, Any] = {}
    for key, pattern in _SALVAGED.items():
        found = pattern.search(line)
        if found is not None:
            value = found.group("value")
            data[key] = int(value) if key == "statusCode" else value
    if not data:
        return None
    return {"type": "error", "error": {"name": data.pop("name", "UnknownError"), "data": data}}


def _events(stdout: str) -> list[dict[str, Any]]:
    events = list(iter_json_objects(stdout))
    if '"type":"error"' in stdout.replace(" ", "") and not any(
        event.get("type") == "error" for event in events
    ):
        for line in stdout.splitlines():
            salvaged = _salvage(line.strip())
            if salvaged is not None:
                events.append(salvaged)
    return events


def _step_usage(part: object) -> Usage | None:
    """A `step_finish` part's usage: its `tokens` (input, output + reasoning, cache read
    and write; opencode keeps cached tokens out of `input`) and its `cost`, a USD opencode
    computed from its own model list (reported; a 0 beside tokens is a model it has no
    price for: unknown)."""
    if not isinstance(part, dict):
        return None
    tokens = part.get("tokens")
    cost = number_field(part, "cost")
    if not isinstance(tokens, dict) and cost is None:
        return None
    cache = tokens.get("cache") if isinstance(tokens, dict) else None
    return reported_usage(
        input_tokens=count_field(tokens, "input"),
        output_tokens=count_field(tokens, "output", "reasoning"),
        cache_read_tokens=count_field(cache, "read"),
        cache_write_tokens=count_field(cache, "write"),
        usd=cost,
        model=str_field(part, "modelID"),
    )


def usage_of(line: Line) -> Usage | None:
    """The usage one `--format json` line reports: a `step_finish` event's (each step
    adds)."""
    text = line.text
    if line.stream != "stdout" or '"step_finish"' not in text:
        return None
    event = json_object(text)
    if event is None or event.get("type") != "step_finish":
        return None
    return _step_usage(event.get("part"))


def read_events(stdout: str, now: float) -> Envelope:
    """The envelope of an opencode-style `run --format json` event stream."""
    envelope = _read_events(stdout, now)
    return attrs.evolve(envelope, usage=read_usage(stdout, usage_of))


def _read_events(stdout: str, now: float) -> Envelope:
    session_id: str | None = None
    step_text: list[str] = []
    cost: float | None = None
    error: _Error | None = None
    finished = False
    finish_reason: str | None = None
    for event in _events(stdout):
        kind = event.get("type")
        session_id = str_field(event, "sessionID", "session_id") or session_id
        part = event.get("part")
        if kind == "step_start":
            step_text = []
        elif kind == "text":
            text = str_field(part, "text")
            if text:
                step_text.append(text)
        elif kind == "step_finish":
            finished = True
            finish_reason = str_field(part, "reason")
            step_cost = number_field(part, "cost")
            if step_cost is not None:
                cost = (cost or 0.0) + step_cost
        elif kind == "error":
            error = _error_of(event, now)
    if error is not None:
        return Envelope(
            found=True,
            is_error=True,
            session_id=session_id,
            cost_usd=cost,
            error_message=error.message,
            http_status=error.status,
            error_kind=error.kind,
            retry_after_s=error.wait,
        )
    if finish_reason == _NO_FINISH_REASON:
        # The provider's stream ended with no finish reason (cut mid-answer): opencode
        # starts another step on the same cut stream, again and again. Not an error it
        # gives up on; a run killed then was still retrying a broken vendor stream.
        return Envelope(
            found=True,
            text="".join(step_text).strip(),
            session_id=session_id,
            cost_usd=cost,
            error_message="the model's stream ended without a finish reason (step_finish "
            "reason unknown)",
            error_kind=ErrorKind.STREAM_FAILED,
            pending=True,
        )
    return Envelope(
        found=finished,
        text="".join(step_text).strip() if finished else None,
        session_id=session_id,
        cost_usd=cost,
    )


@attrs.frozen
class OpencodeAdapter:
    """`opencode run --format json [--model provider/model] ARGS... PROMPT`.

    The working directory is the spawn's cwd; opencode has no max-turns flag.
    """

    name: str = "opencode"
    binary: str = "opencode"
    install_hint: str = "npm install -g opencode-ai"
    login_hint: str | None = "opencode auth login"
    # opencode reads the configured provider's own variable; these are the common ones.
    credential_env: tuple[str, ...] = (
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "OPENROUTER_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.local/share/opencode/auth.json",)
    # The clock a stated reset is read against (epoch seconds): `time.time`, or a recording's
    # own time when one is replayed.
    clock: Callable[[], float] = attrs.field(default=time.time, eq=False, repr=False)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "run", "--format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        now = self.clock()
        return map_result(self, result, read_events(result.stdout_tail, now), now=now)

    def usage_of(self, line: Line) -> Usage | None:
        """The usage one printed line reports, for the live meter."""
        return usage_of(line)
