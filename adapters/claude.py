"""Anthropic Claude Code: `claude -p --output-format stream-json --verbose`, its events.

The default argv runs the output format that carries the most structure (issue 51): only
stream-json (which needs `--verbose` with `-p`) prints the `rate_limit_event` with its
`resetsAt` (for a claude.ai or gateway sign-in; with an API key no output format states a
reset), the `api_retry` events of its own retries and the refusal as an `assistant` event;
its last event is the same result envelope `--output-format json` prints alone, so a run
given `--output-format json` in its argv is read the same way.

The envelope is `{"type": "result", "subtype", "is_error", "result", "session_id",
"total_cost_usd", "api_error_status"?, "api_error_type"?, "api_error"?...}`; with `--verbose`
the CLI prints a list of messages whose last `result` entry is the envelope. An error
subtype (`error_max_turns`, `error_during_execution`) is a failure even when `is_error` is
false.

Structured error fields read (claude-code 2.1, recorded in fixtures/recorded/claude):
`api_error_status` is the HTTP status of the API's final answer; `api_error_type` is the
Anthropic error type (`authentication_error`, `permission_error`, `billing_error`,
`rate_limit_error`, `overloaded_error`, `api_error`...); `api_error: "connection_failed"`
marks a request that never reached the API. The CLI also renders some errors as fixed
sentences of its own, matched whole: `Credit balance is too low` (its billing error, sent
with type `invalid_request_error`), `Not logged in · Please run /login`, and the
`Claude AI usage limit reached|<epoch>` form whose epoch is the reset. Its connection
errors, when `api_error` is not set (claude-code 2.1.332: a TLS failure), are its fixed
sentences `API Error: Unable to connect to API (...)`, `API Error: Connection refused —
...`, `API Error: Can't reach the API server ...` and `API Error: Connection to the API
was lost ...`, matched by prefix.

An error subtype's envelope has no `result`: its `errors` (a list of sentences, such as
`Reached maximum number of turns (12)`) are the message.

In `--output-format stream-json` (recorded: `claude/auth_401_stream`,
`claude/payment_402_stream`) the API's refusal is also an `assistant` event with
`is_api_error_message: true`, its `error` (`authentication_failed`, `billing_error`,
`rate_limit`, `server_error`, ...) and `api_error_status`: read when the result envelope
names no error type, and in place of the envelope when the stream ends before its
`result` (a run killed after the refusal), so a refused credential or billing still stops
the lane with its fix named. A stream that ends (killed on timeout) while its last event
is an `api_retry` (`{"type": "system", "subtype": "api_retry", "attempt", "max_retries",
"error_status", "error"}`) was still retrying that status: `ErrorKind.RETRYING`, upstream.

Resets read from structure (issue #28: only these park a vendor lane): a `rate_limit_event`
(stream-json or `--verbose`: `{"type": "rate_limit_event", "rate_limit_info": {"status",
"resetsAt", "rateLimitType"}}`) whose status is not `allowed`/`allowed_warning` gives the
reset epoch `resetsAt`; the `Claude AI usage limit reached|<epoch>` form gives its epoch.
A reset named only in prose is left to the shared text rules (it waits, never parks).

Usage (issue #45): the `result` event's `usage` (`input_tokens`, `output_tokens`,
`cache_read_input_tokens`, `cache_creation_input_tokens`) and `total_cost_usd` (USD source
`reported`; the CLI prices it at list price even for a subscription session), the model
the one key of its `modelUsage`. Before the result (a run killed or still going), each
stream-json `assistant` event carries its message's `usage` as it stood then, repeated on
every content block of that message: `usage_of` reports it under the message id, so each
message counts once at its latest figure (tokens only); the `result` is the CLI's own
total and replaces that sum. An event longer than the line hook's `LINE_BYTES` is cut
before its usage (which follows the content): that message is then counted by the result.
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
    UsageEvent,
    count_field,
    embedded_object,
    http_status,
    load_json_document,
    number_field,
    read_usage,
    reported_usage,
    request_argv,
    reset_wait_s,
    str_field,
)

__all__ = ["ClaudeAdapter"]

_ERROR_TYPES = {
    "authentication_error": ErrorKind.CREDENTIALS,
    "permission_error": ErrorKind.CREDENTIALS,
    "billing_error": ErrorKind.BILLING,
    "rate_limit_error": ErrorKind.RATE_LIMITED,
    "overloaded_error": ErrorKind.OVERLOADED,
    "api_error": ErrorKind.SERVER_ERROR,
}
# The stream-json `assistant` event's `error` (the Agent SDK's `SDKAssistantMessageError`).
_STREAM_ERRORS = {
    "authentication_failed": ErrorKind.CREDENTIALS,
    "billing_error": ErrorKind.BILLING,
    "rate_limit": ErrorKind.RATE_LIMITED,
    "server_error": ErrorKind.SERVER_ERROR,
}
# `api_error` values the CLI sets when the request never reached the API.
_CONNECTION_ERRORS = frozenset({"connection_failed", "connection_error"})
# The CLI's own fixed sentences for its error variants (the whole `result`).
_FIXED_RESULTS = {
    "Credit balance is too low": ErrorKind.BILLING,
    "Not logged in · Please run /login": ErrorKind.CREDENTIALS,
    "Invalid API key · Please run /login": ErrorKind.CREDENTIALS,
    "Invalid API key · Fix external API key": ErrorKind.CREDENTIALS,
}
# The CLI's fixed sentences for a request that never reached the API (or lost it).
_CONNECTION_PREFIXES = (
    "API Error: Unable to connect to API",
    "API Error: Connection refused",
    "API Error: Can't reach the API server",
    "API Error: Connection to the API was lost",
)
# `<sentence>|<epoch>`: the CLI's machine-readable usage limit with its reset.
_USAGE_LIMIT = re.compile(r"^Claude AI usage limit reached\|\d{9,11}$")


def _result_object(document: Any) -> dict[str, Any] | None:
    if isinstance(document, list):
        for entry in reversed(document):
            if isinstance(entry, dict) and entry.get("type") == "result":
                return entry
        return None
    if isinstance(document, dict) and ("result" in document or document.get("type") == "result"):
        return document
    return None


def _kind(envelope: dict[str, Any], result_text: str | None) -> ErrorKind | None:
    if str_field(envelope, "api_error") in _CONNECTION_ERRORS:
        return ErrorKind.UNREACHABLE
    fixed = (result_text or "").strip()
    if fixed in _FIXED_RESULTS:
        return _FIXED_RESULTS[fixed]
    if _USAGE_LIMIT.match(fixed):
        return ErrorKind.USAGE_LIMIT
    if fixed.startswith(_CONNECTION_PREFIXES):
        return ErrorKind.UNREACHABLE
    return _ERROR_TYPES.get(str_field(envelope, "api_error_type") or "")


def _rate_limit_events(stdout: str, document: Any) -> list[dict[str, Any]]:
    """Every `rate_limit_info` of a `rate_limit_event`, in order: from a `--verbose` list,
    else from stream-json lines."""
    entries: list[Any] = list(document) if isinstance(document, list) else []
    if not entries and "rate_limit_event" in stdout:
        for line in stdout.splitlines():
            line = line.strip()
            if line.startswith("{") and "rate_limit_event" in line:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    continue
    return [
        entry["rate_limit_info"]
        for entry in entries
        if isinstance(entry, dict)
        and entry.get("type") == "rate_limit_event"
        and isinstance(entry.get("rate_limit_info"), dict)
    ]


def _stream_api_error(stdout: str, document: Any) -> dict[str, Any] | None:
    """The last stream-json `assistant` event that is the API's refusal
    (`is_api_error_message` with an `error` the CLI names), or None."""
    if isinstance(document, list) or '"is_api_error_message"' not in stdout:
        return None
    found = None
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{") or '"is_api_error_message"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(entry, dict)
            and entry.get("type") == "assistant"
            and entry.get("is_api_error_message") is True
            and isinstance(entry.get("error"), str)
        ):
            found = entry
    return found


def _last_event(stdout: str, document: Any) -> dict[str, Any] | None:
    """The last stream-json event (a JSON object line with a `type`), or None."""
    if isinstance(document, list):
        return None
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("type"), str):
            return entry
    return None


def _retry_notice_envelope(event: dict[str, Any]) -> Envelope | None:
    """A stream whose last event is the CLI's own `api_retry`: it was still retrying."""
    if event.get("type") != "system" or event.get("subtype") != "api_retry":
        return None
    status = http_status(number_field(event, "error_status"))
    error = str_field(event, "error") or "api error"
    said = f"{status} " if status is not None else ""
    attempt = number_field(event, "attempt")
    most = number_field(event, "max_retries")
    count = f" (attempt {attempt:g}/{most:g})" if attempt is not None and most else ""
    return Envelope(
        found=True,
        is_error=True,
        error_message=f"API Error: {said}{error}; still retrying{count}",
        http_status=status,
        error_kind=ErrorKind.RETRYING,
    )


def _message_text(event: dict[str, Any]) -> str | None:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return None
    texts = [
        part["text"]
        for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    return " ".join(texts) or None


def _stream_error_envelope(event: dict[str, Any]) -> Envelope:
    """A stream that ended before its `result`, from its refusal event alone."""
    text = _message_text(event)
    return Envelope(
        found=True,
        is_error=True,
        error_message=text or str(event["error"]),
        http_status=http_status(number_field(event, "api_error_status")),
        error_kind=_STREAM_ERRORS.get(str(event["error"]))
        or _ERROR_TYPES.get(str_field(event, "api_error_type") or ""),
    )


def _stated_reset(stdout: str, document: Any, result_text: str | None) -> float | None:
    """The reset epoch the CLI's structure states: its last refusing `rate_limit_event`'s
    `resetsAt`, else the epoch of its `usage limit reached|<epoch>` form; None otherwise."""
    for info in reversed(_rate_limit_events(stdout, document)):
        status = str_field(info, "status") or ""
        reset = number_field(info, "resetsAt")
        if status not in ("allowed", "allowed_warning") and reset is not None:
            return float(reset)
    fixed = (result_text or "").strip()
    if _USAGE_LIMIT.match(fixed):
        return float(fixed.rsplit("|", 1)[1])
    return None


def _usage_fields(usage: object, usd: float | None, model: str | None) -> Usage:
    return reported_usage(
        input_tokens=count_field(usage, "input_tokens"),
        output_tokens=count_field(usage, "output_tokens"),
        cache_read_tokens=count_field(usage, "cache_read_input_tokens"),
        cache_write_tokens=count_field(usage, "cache_creation_input_tokens"),
        usd=usd,
        model=model,
    )


def _result_usage(envelope: dict[str, Any]) -> Usage | None:
    """The run's total from a claude-style `result` event: its `usage` and its
    `total_cost_usd` (reported); None when it carries neither."""
    usage = envelope.get("usage")
    usd = number_field(envelope, "total_cost_usd", "cost_usd")
    if not isinstance(usage, dict) and usd is None:
        return None
    models = envelope.get("modelUsage")
    model = next(iter(models)) if isinstance(models, dict) and len(models) == 1 else None
    return _usage_fields(usage, usd, model if isinstance(model, str) else None)


_ASSISTANT = '{"type":"assistant","message":{"id":"'
_USAGE_KEY = '"usage":{'
# The last assistant event read: the CLI repeats it once per content block of a message.
# Shared by every meter (threads included): it is returned only for the same message id
# and the same usage text, which read to the same event whichever run printed them.
_last_assistant: list[tuple[str, str, UsageEvent]] = []


def _object_end(text: str, start: int) -> int:
    """The index after the `}` closing the object that opens at `text[start]` (a usage
    object holds numbers, plain words and nested objects: no brace inside a string), or
    the text's length when it does not close."""
    depth = 1
    at = start + 1
    while depth:
        close = text.find("}", at)
        if close < 0:
            return len(text)
        depth += text.count("{", at, close) - 1
        at = close + 1
    return at


def _assistant_usage(text: str) -> UsageEvent | None:
    """An `assistant` event in the CLI's own key order (type, then message.id): its id
    and its usage object are read alone, not the whole event (its content can be
    kilobytes), and a repeat of the last message at the same figure is the same event."""
    end = text.find('"', len(_ASSISTANT))
    at = text.rfind(_USAGE_KEY)
    if end < 0 or at < 0:
        return None
    message = text[len(_ASSISTANT) : end]
    said = text[at : _object_end(text, at + len(_USAGE_KEY) - 1)]
    if _last_assistant:
        last_message, last_said, last_event = _last_assistant[0]
        if last_message == message and last_said == said:
            return last_event
    usage = embedded_object(text, "usage")
    if usage is None:
        return None
    model_at = text.find('"model":"', end)
    model = None
    if model_at >= 0:
        model_end = text.find('"', model_at + 9)
        model = text[model_at + 9 : model_end] if model_end > 0 else None
    event = UsageEvent(_usage_fields(usage, None, model), message=message)
    _last_assistant[:] = [(message, said, event)]
    return event


def usage_of(line: Line) -> Usage | UsageEvent | None:
    """The usage one stream-json line reports (see the module docstring): an `assistant`
    event's message usage under its message id, or the `result` event's run total."""
    text = line.text
    if line.stream != "stdout" or '"usage":{' not in text:
        return None
    if text.startswith(_ASSISTANT):
        return _assistant_usage(text)
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):
        return _cut_result(text) if line.cut else None
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind == "result":
        total = _result_usage(event)
        return None if total is None else UsageEvent(total, final=True)
    said = event.get("message")
    if kind == "assistant" and isinstance(said, dict) and isinstance(said.get("usage"), dict):
        return UsageEvent(
            _usage_fields(said["usage"], None, str_field(said, "model")),
            message=str_field(said, "id"),
        )
    return None


_TOTAL_COST = re.compile(r'"total_cost_usd":(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)[,}]')


def _cut_result(text: str) -> UsageEvent | None:
    """The start of a `result` event longer than a hooked line (its `result` text, the
    final reply, can be long): the CLI prints `total_cost_usd` and `usage` before it, and
    only the result envelope has `total_cost_usd`. Its run total, or None."""
    cost = _TOTAL_COST.search(text)
    usage = embedded_object(text, "usage")
    if cost is None or usage is None:
        return None
    return UsageEvent(_usage_fields(usage, float(cost.group(1)), None), final=True)


def _usage(stdout: str, document: Any, envelope: dict[str, Any] | None) -> Usage | None:
    """What the run cost: the result's total, else the stream's messages summed."""
    if envelope is not None:
        total = _result_usage(envelope)
        if total is not None:
            return total
    if isinstance(document, list):
        return None
    return read_usage(stdout, usage_of)


def read_result(stdout: str, *, now: float | None = None) -> Envelope:
    """The envelope of a claude-style `result` object (the last JSON value of `stdout`);
    shared with the claude-compatible CLIs (droid, amp, qwen). `now` is the clock a
    stated reset is read against (default `time.time()`)."""
    document = load_json_document(stdout)
    envelope = _result_object(document)
    if envelope is None:
        # Killed before its result: what its messages reported so far still cost.
        usage = _usage(stdout, document, None)
        refusal = _stream_api_error(stdout, document)
        if refusal is not None:
            return attrs.evolve(_stream_error_envelope(refusal), usage=usage)
        last = _last_event(stdout, document)
        retrying = None if last is None else _retry_notice_envelope(last)
        return Envelope(usage=usage) if retrying is None else attrs.evolve(retrying, usage=usage)
    subtype = str_field(envelope, "subtype") or ""
    is_error = envelope.get("is_error") is True or subtype.startswith("error")
    result_text = str_field(envelope, "result")
    errors = envelope.get("errors")
    said = (
        "; ".join(e for e in errors if isinstance(e, str) and e.strip())
        if isinstance(errors, list)
        else ""
    )
    kind = _kind(envelope, result_text) if is_error else None
    if is_error and kind is None:
        refusal = _stream_api_error(stdout, document)
        if refusal is not None:
            kind = _STREAM_ERRORS.get(str(refusal["error"]))
    reset = _stated_reset(stdout, document, result_text) if is_error else None
    # To the end of the stated second; a reset already past states no wait (None, not 0):
    # the refusal stays the account's limit, and the lane's breaker and backoff apply.
    wait = reset_wait_s(reset, now=now)
    if reset is not None and kind in (None, ErrorKind.RATE_LIMITED):
        kind = ErrorKind.USAGE_LIMIT  # a refusal with its reset: the account's limit
    return Envelope(
        found=True,
        is_error=is_error,
        text=None if is_error else (result_text or ""),
        session_id=str_field(envelope, "session_id"),
        cost_usd=number_field(envelope, "total_cost_usd", "cost_usd"),
        error_message=(result_text or said or subtype or "claude reported an error")
        if is_error
        else None,
        http_status=http_status(number_field(envelope, "api_error_status")),
        error_kind=kind,
        retry_after_s=wait,
        reset_structured=wait is not None,
        usage=_usage(stdout, document, envelope),
    )


@attrs.frozen
class ClaudeAdapter:
    """`claude -p --output-format stream-json --verbose [--model M] [--resume ID]
    [--max-turns N] [--max-budget-usd USD] ARGS... PROMPT`.

    The working directory is the spawn's cwd (claude has no directory flag). ARGS that
    name another `--output-format` (claude takes the last one) are read too: `json` prints
    the same envelope alone.
    """

    name: str = "claude"
    binary: str = "claude"
    install_hint: str = "npm install -g @anthropic-ai/claude-code"
    login_hint: str | None = "run `claude`, then /login"
    credential_env: tuple[str, ...] = (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
    )
    credential_files: tuple[str, ...] = ("~/.claude/.credentials.json",)
    # The stall watchdog's default (issue #46): claude's own Bash tool stops a command after
    # 10 minutes at most, and every other step prints an event, so 15 silent minutes are
    # not work in progress (claude-code #75613: a stream that hangs without a byte).
    stall_timeout_s: float | None = 900.0
    # Issue #46: `--resume ID` continues a session (`AgentRequest.resume_session`).
    resumes_sessions: bool = True
    # The clock a stated reset is read against (epoch seconds): `time.time`, or a recording's
    # own time when one is replayed.
    clock: Callable[[], float] = attrs.field(default=time.time, eq=False, repr=False)

    def build_argv(self, request: AgentRequest) -> list[str]:
        turns = [] if request.max_turns is None else ["--max-turns", str(request.max_turns)]
        # The CLI's own spend bound (by its `total_cost_usd`), beside execkit's meter.
        budget = request.max_budget_usd
        spend = [] if budget is None else ["--max-budget-usd", f"{budget:g}"]
        head = [self.binary, "-p", "--output-format", "stream-json", "--verbose"]
        resume = [] if request.resume_session is None else ["--resume", request.resume_session]
        return request_argv(head, request, options=[*resume, *turns, *spend])

    def resume_refused(self, failure_text: str) -> bool:
        """The CLI refused the session it was asked to resume: claude-code 2.1.332 prints
        `error_during_execution` with `errors: ["No conversation found with session ID:
        <id>"]` and exits 1 before any request (recorded against the loopback API)."""
        return "No conversation found with session ID" in failure_text

    def request_in_flight(self, line: Line) -> bool | None:
        """Whether a request to the API is open after this stream-json event (the stall
        watchdog's question): True after `system` `init` (the first request goes out) or
        `api_retry`, and after a `user` event (tool results sent back: the next request);
        False after an `assistant` event or the `result` (the answer came, or a tool runs
        next); None for any other line."""
        text = line.text
        if line.stream != "stdout" or not text.startswith("{"):
            return None
        try:
            event = json.loads(text)
        except ValueError:
            return None
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "system":
            return True if event.get("subtype") in ("init", "api_retry") else None
        if kind == "user":
            return True
        if kind in ("assistant", "result"):
            return False
        return None

    def parse(self, result: SpawnResult) -> MappedResult:
        now = self.clock()
        return map_result(self, result, read_result(result.stdout_tail, now=now), now=now)

    def usage_of(self, line: Line) -> Usage | UsageEvent | None:
        """The usage one printed line reports (stream-json), for the live meter."""
        return usage_of(line)
