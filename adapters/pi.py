"""pi (`@mariozechner/pi-coding-agent`): `pi -p --mode json --no-session PROMPT`, JSONL events.

pi exits 0 after the vendor refused (pi 0.73, recorded in fixtures/recorded/pi): the
failure is only in its event stream, so the envelope is read whatever the exit code.

Events read: `session` (its `id`), `message_end` of the assistant (`stopReason`: `stop`,
`length` or `toolUse` with the reply in `content` text parts; `error` or `aborted` with
`errorMessage`), `auto_retry_start` (a retry notice: `errorMessage`, `delayMs`) and
`auto_retry_end` (`success`; `false` carries `finalError`, the refusal it gave up on).

Before any event, pi refuses to start with `No API key found for the selected model.` on
stderr (exit 1): a credential error. The vendor's own fixed sentences inside an error
(OpenAI's quota and usage-limit messages...) name its kind (`adapters._vendor_errors`).

`errorMessage` is the provider SDK's own rendering of the failed call: the OpenAI and
Anthropic clients print a status error as `<status> <message>` (`500 The server had an
error...`, `429 Rate limit reached...`) and an unreachable API as `Connection error.`, read
here as that status and that kind. A run that ends (a timeout) while its last event is a
retry notice was still retrying.

Text mode (`pi -p PROMPT`, no `--mode json`: what a runner that passes its own argv, or
`--mode text` in `extra_args`, gets) prints the reply on stdout, and a failed turn's
`errorMessage` alone on stderr with exit 1 (its print mode's `console.error`): the same
SDK rendering, read the same way from the last stderr line that starts like one. The
adapter asks for `--mode json` (it carries the retry events and the session), and reads
either.

`auto_retry_start` announces pi's own retry sleep, `delayMs` (`retry.baseDelayMs`, 2 s by
default, doubling for `retry.maxRetries`, 3): `watch` ends the attempt on one longer than
`LONG_WAIT_S` (a runner that raised those settings), upstream with that wait as its
reset. The provider SDKs' own retries before it (the OpenAI client's two, which wait a
`Retry-After` of at most 60 s) print nothing, and text mode prints no retry at all.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import attrs

from adapters._vendor_errors import sentence_kind
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import (
    LONG_WAIT_S,
    ErrorKind,
    Line,
    Usage,
    count_field,
    http_status,
    iter_json_objects,
    json_object,
    number_field,
    parse_retry_after,
    read_usage,
    reported_usage,
    request_argv,
    str_field,
)

__all__ = ["PiAdapter"]

# `<status> <message>`: the OpenAI and Anthropic SDKs' rendering of an HTTP status error.
_SDK_STATUS = re.compile(r"^(?P<code>[1-5]\d\d) ")
# The SDKs' messages for a request that never got an answer.
_UNREACHABLE = ("Connection error.", "fetch failed")
_FIXED_PREFIXES = (
    ("No API key found", ErrorKind.CREDENTIALS),
    ("No API key for provider", ErrorKind.CREDENTIALS),
)
# How the retry announcement's JSON line starts (pi writes `JSON.stringify(event)`).
_RETRY_START = '{"type":"auto_retry_start"'


@attrs.frozen
class _Error:
    message: str
    kind: ErrorKind | None = None
    status: int | None = None


def _read_error(message: str, kind: ErrorKind | None = None) -> _Error:
    found = _SDK_STATUS.match(message)
    status = http_status(float(found.group("code"))) if found else None
    if kind is None:
        kind = next((k for prefix, k in _FIXED_PREFIXES if message.startswith(prefix)), None)
    if kind is None:
        kind = sentence_kind(message)
    if kind is None and status is None and message.strip().startswith(_UNREACHABLE):
        kind = ErrorKind.UNREACHABLE
    return _Error(message, kind, status)


def _reply(message: dict[str, Any]) -> str:
    content = message.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )


def _text_mode_error(stderr: str) -> _Error | None:
    """Text mode's failed turn: its `errorMessage` on stderr, from the last line that
    starts like the SDK's rendering (a status, an unreachable API) or a start-up refusal,
    to the end (an HTML error page runs on over several lines)."""
    lines = stderr.strip().splitlines()
    starts = tuple(prefix for prefix, _ in _FIXED_PREFIXES) + _UNREACHABLE
    for at in range(len(lines) - 1, -1, -1):
        line = lines[at].strip()
        if _SDK_STATUS.match(line) or line.startswith(starts):
            return _read_error("\n".join(lines[at:]).strip())
    return None


def _message_usage(message: object) -> Usage | None:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    usage = message.get("usage")
    if not isinstance(usage, dict):
        return None
    return reported_usage(
        input_tokens=count_field(usage, "input"),
        output_tokens=count_field(usage, "output"),
        cache_read_tokens=count_field(usage, "cacheRead"),
        cache_write_tokens=count_field(usage, "cacheWrite"),
        usd=number_field(usage.get("cost"), "total"),
        model=str_field(message, "model"),
    )


def usage_of(line: Line) -> Usage | None:
    """The usage one `--mode json` line reports: an assistant `message_end`'s."""
    text = line.text
    if line.stream != "stdout" or not text.startswith('{"type":"message_end"'):
        return None
    event = json_object(text)
    return None if event is None else _message_usage(event.get("message"))


def _read(stdout: str, stderr: str, now: float, failed: bool = False) -> Envelope:
    envelope = _read_events(stdout, stderr, now, failed)
    return attrs.evolve(envelope, usage=read_usage(stdout, usage_of))


def _read_events(stdout: str, stderr: str, now: float, failed: bool = False) -> Envelope:
    session_id: str | None = None
    reply: str | None = None
    error: _Error | None = None  # the last assistant turn's error, or the retry's final one
    notice: _Error | None = None  # the last event was a retry notice
    seen = False
    for event in iter_json_objects(stdout):
        kind = event.get("type")
        if not isinstance(kind, str):
            continue
        seen = True
        if kind == "session":
            session_id = str_field(event, "id") or session_id
        elif kind == "message_end":
            message = event.get("message")
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            notice = None
            if message.get("stopReason") in ("error", "aborted"):
                said = str_field(message, "errorMessage") or "pi reported an error"
                error = _read_error(said)
            else:
                reply, error = _reply(message), None
        elif kind == "auto_retry_start":
            said = str_field(event, "errorMessage") or "retrying"
            retrying = _read_error(said)
            notice = attrs.evolve(
                retrying,
                kind=ErrorKind.UNREACHABLE
                if retrying.kind is ErrorKind.UNREACHABLE
                else ErrorKind.RETRYING,
            )
        elif kind == "auto_retry_end":
            notice = None
            if event.get("success") is False:
                error = _read_error(str_field(event, "finalError") or "pi gave up retrying")
            else:
                error = None
    final = notice or error
    if final is None and reply is None:
        # Before any turn: pi's own start-up refusal on stderr (no key for the model).
        said = stderr.strip()
        if said.startswith(tuple(prefix for prefix, _ in _FIXED_PREFIXES)):
            final = _read_error(said.splitlines()[0])
        elif not seen and failed:
            final = _text_mode_error(stderr)
    if final is None:
        return Envelope(found=seen and reply is not None, text=reply, session_id=session_id)
    return Envelope(
        found=True,
        is_error=True,
        session_id=session_id,
        error_message=final.message,
        http_status=final.status,
        error_kind=final.kind,
        retry_after_s=parse_retry_after(final.message, now=now),
    )


@attrs.frozen
class PiAdapter:
    """`pi -p --mode json --no-session [--model M] ARGS... PROMPT`.

    Its retries are `retry.maxRetries` / `retry.baseDelayMs` in `~/.pi/agent/settings.json`
    (no flag); the working directory is the spawn's cwd.
    """

    name: str = "pi"
    binary: str = "pi"
    install_hint: str = "npm install -g @mariozechner/pi-coding-agent"
    login_hint: str | None = "run `pi`, then /login"
    credential_env: tuple[str, ...] = (
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "OPENROUTER_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.pi/agent/auth.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "-p", "--mode", "json", "--no-session"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        envelope = _read(result.stdout_tail, result.stderr_tail, time.time(), not result.ok)
        return map_result(self, result, envelope)

    def usage_of(self, line: Line) -> Usage | None:
        """The usage one printed line reports, for the live meter."""
        return usage_of(line)

    def watch(self, line: Line) -> Envelope | None:
        """An `auto_retry_start` event announcing a sleep longer than `LONG_WAIT_S`: the
        error it would sleep out, to end the attempt with (else None)."""
        if line.stream != "stdout" or not line.text.startswith(_RETRY_START):
            return None
        try:
            event = json.loads(line.text)
        except (ValueError, RecursionError):
            return None
        delay_ms = number_field(event, "delayMs")
        if delay_ms is None or delay_ms / 1000.0 <= LONG_WAIT_S:
            return None
        said = _read_error(str_field(event, "errorMessage") or "retrying")
        kind = said.kind
        if kind is None and said.status is None:
            kind = ErrorKind.RETRYING
        return Envelope(
            found=True,
            is_error=True,
            error_message=said.message,
            http_status=said.status,
            error_kind=kind,
            retry_after_s=delay_ms / 1000.0,
            # pi's own fixed retry event states the wait it is about to sleep.
            reset_structured=True,
        )
