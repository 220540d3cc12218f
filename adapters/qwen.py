"""Qwen Code (`@qwen-code/qwen-code`, a gemini-cli fork): `qwen --output-format stream-json`.

One JSON event per line (qwen-code 0.24, recorded in fixtures/recorded/qwen, pointed at an
OpenAI-compatible API): `assistant` messages, `system` events (`subtype` `retry`: a
retry notice, without the error) and a final `result` (`subtype` `success` with
`result`, or `error_during_execution` with `is_error` and `error.message`). stream-json,
not json: a run killed mid-retry has still printed its events.

`error.message` is qwen's own rendering `[API Error: <status> <message>]` (the status the
OpenAI SDK put in front, read as the HTTP status), `[API Error: Connection error. (cause:
...)]` (the SDK's unreachable API), `[API Error: Model stream ended without a finish
reason.]` (a cut stream) or `[API Error: Overloaded]`; its fixed start-up refusals
`Missing API key ...` and `No auth type is selected ...` are credential errors. While it
retries it prints `Retrying in Ns (attempt a/b): [API Error: ...]` on stderr: a run
killed after one with no result was still retrying that error (`pending`).

The same events in its other modes: `--output-format json` prints them as one JSON array
on stdout (the `result` element carries the same `error.message`), or, when it fails
before that array, a gemini-style `{"error": {"type", "message", "code"}}` object on
stderr; text mode (no `--output-format`) prints the reply on stdout and the error alone on
stderr, `[API Error: ...]` or a start-up refusal, with exit 1. Each is read the same way.

Its retry loops (qwen-code 0.24, `packages/core`): a failed call is first retried by
`retryWithBackoff`, 7 attempts, no setting, sleeping a 429's or 503's `Retry-After` in full
(up to 24.8 days) and printing nothing (its log goes to a debug file), so no watch can see
it; then its rate-limit loop, `model.generationConfig.maxRetries` /
`retryInitialDelayMs` / `retryMaxDelayMs` in `~/.qwen/settings.json` (default 10 tries
from 60 s, doubling to 5 min, at least the `Retry-After`), announces each sleep as
`Retrying in Ns (attempt a/b): [API Error: ...]` on stderr. With
`QWEN_CODE_UNATTENDED_RETRY=1` a 429 or 529 is retried for up to 6 h and its sleep
announced every 30 s as `[qwen-code] Waiting for API capacity... attempt N, retry in Ns`.
`watch` ends the attempt on either announcement of more than `LONG_WAIT_S`, upstream with
that wait as its reset. Lower the settings so that a refusal is reported before the
runner's timeout.
"""

from __future__ import annotations

import re
import time
from typing import Any

import attrs

from adapters._vendor_errors import sentence_kind
from adapters.claude import usage_of as claude_usage_of
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import (
    LONG_WAIT_S,
    ErrorKind,
    Line,
    Usage,
    UsageEvent,
    http_status,
    iter_json_objects,
    last_json_value,
    load_json_document,
    parse_retry_after,
    read_usage,
    request_argv,
    str_field,
)

__all__ = ["QwenAdapter"]

_API_ERROR = re.compile(r"\[API Error: (?:(?P<code>[1-5]\d\d) )?(?P<rest>.*?)\]?\s*$", re.S)
_NOTICE = re.compile(r"^Retrying in \d+s \(attempt \d+/\d+\): (?P<error>\[API Error: .*)$", re.M)
# The rate-limit loop's announcement, with the error it waits out when there is one.
_RETRY_IN = re.compile(r"Retrying in (?P<s>\d{1,9})s \(attempt \d+/\d+\)(?:: (?P<error>.*))?")
# QWEN_CODE_UNATTENDED_RETRY's heartbeat while it waits for a 429 or 529 to lift.
_CAPACITY = re.compile(
    r"\[qwen-code\] Waiting for API capacity\.\.\. attempt \d+, retry in (?P<s>\d{1,9})s"
)
_CAPACITY_NOTICE = re.compile(r"^\[qwen-code\] Waiting for API capacity\.\.\..*$", re.M)
# How text mode's error starts: qwen's own rendering, or a start-up refusal.
_TEXT_ERROR = ("[API Error: ", "Missing API key", "No auth type is selected")
_FIXED = (
    ("Missing API key", ErrorKind.CREDENTIALS),
    ("No auth type is selected", ErrorKind.CREDENTIALS),
    ("Connection error.", ErrorKind.UNREACHABLE),
    ("Model stream ended without a finish reason", ErrorKind.STREAM_FAILED),
    ("Overloaded", ErrorKind.OVERLOADED),
)


def _error(message: str, now: float, *, pending: bool = False) -> Envelope:
    found = _API_ERROR.search(message)
    status = http_status(float(found.group("code"))) if found and found.group("code") else None
    rest = found.group("rest") if found else message
    kind = next((k for prefix, k in _FIXED if rest.startswith(prefix)), None)
    kind = kind or sentence_kind(rest)
    return Envelope(
        found=True,
        is_error=True,
        error_message=message,
        http_status=status,
        error_kind=kind,
        retry_after_s=parse_retry_after(message, now=now),
        pending=pending,
    )


def _events(stdout: str) -> list[dict[str, Any]]:
    """stream-json's events, one a line; else json mode's one array of them."""
    events = list(iter_json_objects(stdout))
    if events:
        return events
    document = load_json_document(stdout)
    if isinstance(document, list):
        return [event for event in document if isinstance(event, dict)]
    return []


def _stderr_error(stderr: str) -> str | None:
    """json mode's error object on stderr (`{"error": {"type", "message", "code"}}`), when
    it failed before printing its array: the message."""
    document = last_json_value(stderr)
    error = document.get("error") if isinstance(document, dict) else None
    return str_field(error, "message") if isinstance(error, dict) else None


def _text_error(stderr: str) -> tuple[int, str] | None:
    """Text mode's error: (where it starts, the text from its first line to the end)."""
    at = len(stderr)
    while at > 0:
        start = stderr.rfind("\n", 0, at - 1) + 1
        if stderr[start:at].lstrip().startswith(_TEXT_ERROR):
            return start, stderr[start:].strip()
        at = start
    return None


def _pending(stderr: str, now: float, session_id: str | None) -> Envelope | None:
    """A retry announcement with nothing final after it: the error it was waiting out."""
    notice = None
    for notice in _NOTICE.finditer(stderr):  # noqa: B007 - the last one is wanted
        continue
    capacity = None
    for capacity in _CAPACITY_NOTICE.finditer(stderr):  # noqa: B007 - the last one too
        continue
    if capacity is not None and (notice is None or capacity.start() > notice.start()):
        waiting = attrs.evolve(_capacity(capacity.group(0)), pending=True)
        return attrs.evolve(waiting, session_id=session_id)
    if notice is None:
        return None
    return attrs.evolve(_error(notice.group("error"), now, pending=True), session_id=session_id)


def _capacity(line: str) -> Envelope:
    found = _CAPACITY.search(line)
    return Envelope(
        found=True,
        is_error=True,
        error_message=line.strip(),
        error_kind=ErrorKind.RATE_LIMITED,
        retry_after_s=float(found.group("s")) if found else None,
        reset_structured=found is not None,
    )


def _read(stdout: str, stderr: str, now: float, failed: bool = False) -> Envelope:
    result: dict[str, Any] | None = None
    session_id: str | None = None
    for event in _events(stdout):
        session_id = str_field(event, "session_id") or session_id
        if event.get("type") == "result":
            result = event
    if result is None:
        said = _stderr_error(stderr)
        if said is not None:
            return attrs.evolve(_error(said, now), session_id=session_id)
        # A run that exited 0 with its reply (text mode) recovered from what it retried.
        pending = _pending(stderr, now, session_id) if failed else None
        final = _text_error(stderr) if failed else None
        if final is not None and (pending is None or final[0] > _last_notice(stderr)):
            return attrs.evolve(_error(final[1], now), session_id=session_id)
        return pending or Envelope(session_id=session_id)
    failed = result.get("is_error") is True or (str_field(result, "subtype") or "").startswith(
        "error"
    )
    if not failed:
        return Envelope(found=True, text=str_field(result, "result") or "", session_id=session_id)
    message = (
        str_field(result.get("error"), "message")
        or str_field(result, "result", "subtype")
        or "qwen reported an error"
    )
    return attrs.evolve(_error(message, now), session_id=session_id)


def _last_notice(stderr: str) -> int:
    """Where the last retry announcement starts (-1: none)."""
    return max(
        stderr.rfind("\nRetrying in "),
        stderr.rfind("\n[qwen-code] Waiting for API capacity"),
        0 if stderr.startswith(("Retrying in ", "[qwen-code] Waiting")) else -1,
    )


@attrs.frozen
class QwenAdapter:
    """`qwen --output-format stream-json [--model M] ARGS... PROMPT` (the spawn's cwd)."""

    name: str = "qwen"
    binary: str = "qwen"
    install_hint: str = "npm install -g @qwen-code/qwen-code"
    login_hint: str | None = "run `qwen` once and pick an auth type"
    credential_env: tuple[str, ...] = (
        "OPENAI_API_KEY",
        "DASHSCOPE_API_KEY",
        "GEMINI_API_KEY",
        "ANTHROPIC_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.qwen/oauth_creds.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "--output-format", "stream-json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        envelope = _read(result.stdout_tail, result.stderr_tail, time.time(), not result.ok)
        usage = read_usage(result.stdout_tail, claude_usage_of)
        return map_result(self, result, attrs.evolve(envelope, usage=usage))

    def usage_of(self, line: Line) -> Usage | UsageEvent | None:
        """The usage one stream-json line reports, read as claude's (qwen prints the same
        `assistant` and `result` usage, tokens only), for the live meter."""
        return claude_usage_of(line)

    def watch(self, line: Line) -> Envelope | None:
        """A retry announcement on stderr of a sleep longer than `LONG_WAIT_S`: the error
        it would sleep out, to end the attempt with (else None)."""
        if line.stream != "stderr":
            return None
        text = line.text
        if text.startswith("Retrying in "):
            found = _RETRY_IN.match(text)
            if found is None or int(found.group("s")) <= LONG_WAIT_S:
                return None
            envelope = _error(found.group("error") or text, time.time())
            return attrs.evolve(
                envelope,
                error_kind=envelope.error_kind
                or (None if envelope.http_status else ErrorKind.RATE_LIMITED),
                retry_after_s=float(found.group("s")),
                # qwen's own fixed announcement of the sleep it is about to take.
                reset_structured=True,
            )
        if text.startswith("[qwen-code] Waiting for API capacity"):
            waiting = _capacity(text)
            wait = waiting.retry_after_s
            return waiting if wait is not None and wait > LONG_WAIT_S else None
        return None
