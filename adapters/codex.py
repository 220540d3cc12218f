"""OpenAI Codex CLI: `codex exec --json`, one JSON event per line on stdout.

Events read: `thread.started` (thread_id is the session), `item.completed` with an
`agent_message` item (the reply), `turn.completed`, `turn.failed` (error.message) and
top-level `error` events. An `error` event followed by `turn.completed` was a transient
reconnect the CLI recovered from, so only an error the turn did not recover from counts.

`Reconnecting... N/M (<error>)` and `Reconnecting... waiting for network (<error>)` error
events are codex's retry notices, never the final error: the final one is the error after
them (or `turn.failed`). When the run ends (a timeout) with a notice as the last event, it
was still retrying: `ErrorKind.RETRYING`, or `UNREACHABLE` for a connection failure.

codex renders each of its error variants in a fixed shape (codex-rs `CodexErr`), read here
as structure: `unexpected status <N> <reason>: <body>` and `exceeded retry limit, last
status: <N> ...` carry the HTTP status; `Quota exceeded. Check your plan and billing
details.` is its quota error; `You've hit your usage limit. ... try again at <time>.` its
usage limit (with the reset); `Selected model is at capacity...` and `We're currently
experiencing high demand...` its overload and 5xx errors; `stream disconnected before
completion: ...` and `Error while reading the server response: ...` a broken stream;
`Connection failed: ...` an unreachable API; `Your access token could not be refreshed
...` and `Missing environment variable: `OPENAI_API_KEY`` (no key: it never calls) a
credential failure. A message that is a JSON error body is read for its type.

Usage (issue #45): each `turn.completed` event's `usage` (tokens only: `input_tokens`,
`cached_input_tokens`, `cache_write_input_tokens`, `output_tokens`), the turns summed; the
events name no model (the request's model prices them, when the price table knows it).
"""

from __future__ import annotations

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
    iter_json_objects,
    json_object,
    parse_retry_after,
    reported_usage,
    request_argv,
    str_field,
)

__all__ = ["CodexAdapter"]

_NOTICE = re.compile(
    r"^Reconnecting\.\.\. (?:\d+/\d+|waiting for network) \((?P<inner>.*)\)$", re.S
)
_STATUS = re.compile(r"^(?:unexpected status|exceeded retry limit, last status:) (?P<code>\d{3})\b")
_FIXED_PREFIXES = (
    ("Quota exceeded. Check your plan and billing details.", ErrorKind.BILLING),
    ("You've hit your usage limit", ErrorKind.USAGE_LIMIT),
    ("You\u2019ve hit your usage limit", ErrorKind.USAGE_LIMIT),
    ("Selected model is at capacity.", ErrorKind.OVERLOADED),
    ("We're currently experiencing high demand", ErrorKind.OVERLOADED),
    ("We\u2019re currently experiencing high demand", ErrorKind.OVERLOADED),
    ("stream disconnected before completion:", ErrorKind.STREAM_FAILED),
    ("Error while reading the server response:", ErrorKind.STREAM_FAILED),
    ("Connection failed:", ErrorKind.UNREACHABLE),
    ("Your access token could not be refreshed", ErrorKind.CREDENTIALS),
    ("Missing environment variable:", ErrorKind.CREDENTIALS),
)
# OpenAI error `type`/`code` values in a JSON body codex passed through.
_BODY_KINDS = {
    "insufficient_quota": ErrorKind.BILLING,
    "invalid_api_key": ErrorKind.CREDENTIALS,
    "usage_limit_reached": ErrorKind.USAGE_LIMIT,
    "rate_limit_exceeded": ErrorKind.RATE_LIMITED,
    "server_error": ErrorKind.SERVER_ERROR,
}


@attrs.frozen
class _Error:
    """One codex error, read from its fixed rendering."""

    message: str
    status: int | None = None
    kind: ErrorKind | None = None


def _read_error(message: str) -> _Error:
    status_match = _STATUS.match(message)
    status = int(status_match.group("code")) if status_match else None
    kind = next((kind for prefix, kind in _FIXED_PREFIXES if message.startswith(prefix)), None)
    body = json_object(message)
    if kind is None and body is not None:
        error = body.get("error")
        for key in ("code", "type"):
            value = str_field(error, key)
            if value in _BODY_KINDS:
                kind = _BODY_KINDS[value]
                break
    return _Error(message, status if status is not None and 100 <= status <= 599 else None, kind)


def _notice_error(message: str) -> _Error | None:
    """The error inside a `Reconnecting...` notice, kind `retrying` (or `unreachable`)."""
    found = _NOTICE.match(message)
    if found is None:
        return None
    inner = _read_error(found.group("inner"))
    waiting = "waiting for network" in message[: message.find("(")]
    unreachable = waiting or inner.kind is ErrorKind.UNREACHABLE
    kind = ErrorKind.UNREACHABLE if unreachable else ErrorKind.RETRYING
    return _Error(inner.message, inner.status, kind)


def _item_text(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("type") or item.get("item_type")
    if kind not in ("agent_message", "assistant_message"):
        return None
    return str_field(item, "text", "message")


def _turn_usage(event: dict[str, Any]) -> Usage | None:
    """A `turn.completed` event's usage, tokens only (codex prints no money).

    OpenAI's counts overlap: `input_tokens` includes the `cached_input_tokens` (and the
    `cache_write_input_tokens`), `output_tokens` includes the `reasoning_output_tokens`;
    each token is counted once here, under its kind."""
    if event.get("type") != "turn.completed":
        return None
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return None
    cached = count_field(usage, "cached_input_tokens")
    written = count_field(usage, "cache_write_input_tokens")
    return reported_usage(
        input_tokens=max(0, count_field(usage, "input_tokens") - cached - written),
        output_tokens=count_field(usage, "output_tokens"),
        cache_read_tokens=cached,
        cache_write_tokens=written,
    )


def usage_of(line: Line) -> Usage | None:
    """The usage one `--json` line reports: a `turn.completed` event's (each turn adds)."""
    text = line.text
    if line.stream != "stdout" or '"turn.completed"' not in text:
        return None
    event = json_object(text)
    return None if event is None else _turn_usage(event)


def _read(stdout: str, now: float) -> Envelope:
    session_id: str | None = None
    usage: Usage | None = None
    reply: str | None = None
    completed = False
    failed: _Error | None = None
    pending: _Error | None = None  # an error event the turn has not recovered from
    notice: _Error | None = None  # the last event was a retry notice
    seen = False
    for event in iter_json_objects(stdout):
        kind = event.get("type")
        if not isinstance(kind, str):
            continue
        seen = True
        if kind in ("thread.started", "thread.resumed"):
            session_id = str_field(event, "thread_id") or session_id
        elif kind == "item.completed":
            reply = _item_text(event.get("item")) or reply
            notice = None
        elif kind == "turn.completed":
            completed = True
            pending = notice = None
            turn = _turn_usage(event)
            if turn is not None:
                usage = turn if usage is None else usage + turn
        elif kind == "turn.failed":
            failed = _read_error(str_field(event.get("error"), "message") or "turn failed")
            notice = None
        elif kind == "error":
            message = str_field(event, "message") or str_field(event.get("error"), "message")
            if message is None:
                continue
            retrying = _notice_error(message)
            if retrying is not None:
                notice = retrying
            else:
                pending, notice = _read_error(message), None
    error = failed or pending or notice
    # The CLI's fixed usage-limit sentence carries its reset ("... try again at 3:05 PM"):
    # its own rendering of the account's limit, so the time in it is the vendor's word
    # (issue #28: it parks the vendor lane; a time in any other message does not).
    wait = None
    if error is not None and error.kind is ErrorKind.USAGE_LIMIT:
        wait = parse_retry_after(error.message, now=now)
    return Envelope(
        found=seen and (completed or error is not None),
        is_error=failed is not None or (error is not None and not completed),
        text=reply,
        session_id=session_id,
        error_message=None if error is None else error.message,
        http_status=None if error is None else error.status,
        error_kind=None if error is None else error.kind,
        retry_after_s=wait,
        reset_structured=wait is not None,
        usage=usage,
    )


@attrs.frozen
class CodexAdapter:
    """`codex exec --json [--cd DIR] [resume ID] [--model M] ARGS... PROMPT` (no max-turns
    flag)."""

    name: str = "codex"
    binary: str = "codex"
    install_hint: str = "npm install -g @openai/codex"
    login_hint: str | None = "codex login"
    credential_env: tuple[str, ...] = ("OPENAI_API_KEY", "CODEX_API_KEY")
    credential_files: tuple[str, ...] = ("~/.codex/auth.json",)
    # Issue #46: `codex exec resume ID` continues a session (`AgentRequest.resume_session`).
    resumes_sessions: bool = True
    # The clock a stated reset is read against (epoch seconds): `time.time`, or a recording's
    # own time when one is replayed.
    clock: Callable[[], float] = attrs.field(default=time.time, eq=False, repr=False)

    def build_argv(self, request: AgentRequest) -> list[str]:
        cd = ["--cd", request.cwd] if request.cwd else []
        if request.resume_session is None:
            return request_argv([self.binary, "exec", "--json"], request, options=cd)
        # `exec`'s own options go before the `resume` subcommand (codex-cli 0.x parses them
        # there); the session id is resume's first argument, the prompt its second.
        head = [self.binary, "exec", "--json", *cd, "resume", request.resume_session]
        return request_argv(head, request)

    def resume_refused(self, failure_text: str) -> bool:
        """The CLI refused the session it was asked to resume: codex prints `thread/resume
        failed: no rollout found for thread id <id>` and exits 1 before any request."""
        return "no rollout found for thread id" in failure_text

    def parse(self, result: SpawnResult) -> MappedResult:
        now = self.clock()
        return map_result(self, result, _read(result.stdout_tail, now), now=now)

    def usage_of(self, line: Line) -> Usage | None:
        """The usage one printed line reports, for the live meter."""
        return usage_of(line)
