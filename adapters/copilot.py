"""GitHub Copilot CLI: `copilot --output-format json --allow-all-tools --prompt=PROMPT`.

One JSON event per line (copilot 1.0, recorded in fixtures/recorded/copilot in its
bring-your-own-key mode): `{"type", "data", "id", "timestamp"...}`.

Events read:

- `assistant.message` (`data.content`): the reply; `result` (`sessionId`, `exitCode`).
- `session.error` (`data.errorType`, `data.message`, `data.statusCode`): the failure the
  run ended on. `errorType` `authentication` is a credential error (copilot exits 4 for
  "authentication required", `gh copilot`'s documented code, read when nothing else was
  printed); `statusCode` is the HTTP status of the last failed model call.
- copilot's own fixed sentences: `Could not connect to local model provider at ...` and
  `Failed native model HTTP request: error sending request ...` (unreachable), `Failed to
  finalize chat-completions stream: ...` (a cut stream), `Error: No authentication
  information found.` on stderr before any event (not logged in).
- `model.call_failure` (`data.statusCode`, `data.retryAttempt`) and `session.info` with
  `infoType` `model_retry`: copilot's retry notices. A run that ends (a timeout) while the
  last of them is the last event was still retrying that status.

The vendor's own fixed sentences inside `message` name its kind
(`adapters._vendor_errors`), and a reset it states (`try again in 7m12s`) is the wait.

Usage (issue #45): copilot prints no tokens and no money. Its `result` event's
`usage.premiumRequests` (the plan's billing unit, a count of premium model requests) is
kept as `Usage.premium_requests` (fractional: a model's multiplier counts one request as
0.33 of one), never turned into USD (its USD stays `unknown`); the
model is the one its `session.tools_updated` / `model.call_start` events name.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from adapters._vendor_errors import sentence_kind
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import (
    ErrorKind,
    Line,
    Usage,
    http_status,
    iter_json_objects,
    json_object,
    number_field,
    parse_retry_after,
    reported_usage,
    request_argv,
    str_field,
)

__all__ = ["CopilotAdapter"]

_ERROR_TYPES = {
    "authentication": ErrorKind.CREDENTIALS,
    "authorization": ErrorKind.CREDENTIALS,
    "rate_limit": ErrorKind.RATE_LIMITED,
    "quota": ErrorKind.BILLING,
}
# copilot's documented exit code for "authentication required".
_AUTH_EXIT = 4
_AUTH = ErrorKind.CREDENTIALS
# copilot's own fixed sentences, at the start of the message or after `Last error: `.
_FIXED = (
    ("Could not connect to local model provider", ErrorKind.UNREACHABLE),
    ("Failed native model HTTP request: error sending request", ErrorKind.UNREACHABLE),
    ("Failed to finalize chat-completions stream", ErrorKind.STREAM_FAILED),
    ("Error: No authentication information found", ErrorKind.CREDENTIALS),
)


@attrs.frozen
class _Error:
    message: str
    status: int | None = None
    kind: ErrorKind | None = None


def _data(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


def _session_error(data: dict[str, Any]) -> _Error:
    message = str_field(data, "message") or "copilot reported an error"
    status = http_status(number_field(data, "statusCode"))
    last = message.rsplit("Last error: ", 1)[-1]
    kind = _ERROR_TYPES.get(str_field(data, "errorType") or "") or sentence_kind(last)
    if kind is None:
        kind = _fixed_kind(message) or _fixed_kind(last)
    return _Error(message, status, kind)


def _fixed_kind(message: str) -> ErrorKind | None:
    return next((kind for prefix, kind in _FIXED if message.startswith(prefix)), None)


def _result_usage(event: dict[str, Any]) -> Usage | None:
    """A `result` event's `usage.premiumRequests`, as premium requests (no tokens, no USD)."""
    usage = event.get("usage")
    if event.get("type") != "result" or not isinstance(usage, dict):
        return None
    premium = number_field(usage, "premiumRequests")
    if premium is None:
        return None
    return reported_usage(premium_requests=premium)


def usage_of(line: Line) -> Usage | None:
    """The usage one printed line reports: the `result` event's premium requests."""
    text = line.text
    if line.stream != "stdout" or '"premiumRequests"' not in text:
        return None
    event = json_object(text)
    return None if event is None else _result_usage(event)


def _read_usage(events: list[dict[str, Any]]) -> Usage | None:
    model = None
    usage = None
    for event in events:
        if event.get("type") in ("session.tools_updated", "model.call_start"):
            model = str_field(_data(event), "model") or model
        found = _result_usage(event)
        if found is not None:
            usage = found if usage is None else usage + found
    if usage is None:
        return None
    return attrs.evolve(usage, model=model)


def _read(stdout: str, stderr: str, exit_code: int | None, now: float) -> Envelope:
    envelope = _read_events(stdout, stderr, exit_code, now)
    usage = _read_usage(list(iter_json_objects(stdout))) if "premiumRequests" in stdout else None
    return attrs.evolve(envelope, usage=usage)


def _read_events(stdout: str, stderr: str, exit_code: int | None, now: float) -> Envelope:
    session_id: str | None = None
    reply: str | None = None
    error: _Error | None = None
    notice: _Error | None = None
    seen = False
    for event in iter_json_objects(stdout):
        kind = event.get("type")
        if not isinstance(kind, str):
            continue
        seen = True
        data = _data(event)
        if kind == "result":
            session_id = str_field(event, "sessionId") or session_id
        elif kind == "assistant.message":
            reply = str_field(data, "content") or reply
            notice = None
        elif kind == "session.error":
            error, notice = _session_error(data), None
        elif kind == "model.call_failure":
            status = http_status(number_field(data, "statusCode"))
            notice = _Error(f"model call failed (status {status})", status, ErrorKind.RETRYING)
        elif kind == "session.info" and str_field(data, "infoType") == "model_retry":
            said = str_field(data, "message") or "retrying"
            status = notice.status if notice is not None else None
            notice = _Error(said, status, ErrorKind.RETRYING)
        elif kind == "model.call_finished" and str_field(data, "outcome") == "success":
            notice = None
    final = error or notice
    if final is None and not seen:
        said = stderr.strip()
        if _fixed_kind(said) is ErrorKind.CREDENTIALS or exit_code == _AUTH_EXIT:
            final = _Error(said[:2000] or "copilot: authentication required", None, _AUTH)
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
class CopilotAdapter:
    """`copilot --output-format json --allow-all-tools [--model M] ARGS... --prompt=PROMPT`.

    `--prompt=VALUE` keeps a prompt that starts with "-" from reading as a flag; the
    working directory is the spawn's cwd.
    """

    name: str = "copilot"
    binary: str = "copilot"
    install_hint: str = "npm install -g @github/copilot"
    login_hint: str | None = "run `copilot`, then /login (or set COPILOT_GITHUB_TOKEN)"
    credential_env: tuple[str, ...] = (
        "COPILOT_GITHUB_TOKEN",
        "GH_TOKEN",
        "GITHUB_TOKEN",
        "COPILOT_PROVIDER_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.copilot/config.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        head = [self.binary, "--output-format", "json", "--allow-all-tools"]
        return request_argv(head, request, prompt=[f"--prompt={request.prompt}"])

    def parse(self, result: SpawnResult) -> MappedResult:
        envelope = _read(result.stdout_tail, result.stderr_tail, result.exit_code, time.time())
        return map_result(self, result, envelope)

    def usage_of(self, line: Line) -> Usage | None:
        """The usage one printed line reports, for the live meter."""
        return usage_of(line)
