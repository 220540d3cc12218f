"""Continue's `cn` (`@continuedev/cli`): `cn -p --format json PROMPT`, one JSON object.

`{"response", "status": "success"}` on stdout on success, `{"status": "error",
"message"}` on stderr on failure (cn 1.5, recorded in fixtures/recorded/cn). `message`
is the OpenAI SDK's rendering: `<status> <message>` (`401 Incorrect API key
provided...`) or `Connection error.` for an unreachable API. The model, its API base
and key come from `--config FILE` (a request's `extra_args`). cn retries a 429 or 5xx
silently until it is killed (nothing printed, exit 0 on SIGTERM): a runner's timeout
charges that as a timeout.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from adapters._vendor_errors import sentence_kind, split_status
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import (
    ErrorKind,
    http_status,
    load_json_document,
    parse_retry_after,
    request_argv,
    str_field,
)

__all__ = ["ContinueAdapter"]

_UNREACHABLE = ("Connection error.",)


def _document(text: str) -> dict[str, Any] | None:
    document = load_json_document(text)
    return document if isinstance(document, dict) and "status" in document else None


def _read(stdout: str, stderr: str, now: float) -> Envelope:
    # The reply goes to stdout, the error object to stderr.
    document = _document(stdout) or _document(stderr)
    if document is None:
        return Envelope()
    if str_field(document, "status") != "error":
        return Envelope(found=True, text=str_field(document, "response") or "")
    message = str_field(document, "message", "error") or "cn reported an error"
    code, rest = split_status(message)
    kind = sentence_kind(message)
    if kind is None and code is None and rest.startswith(_UNREACHABLE):
        kind = ErrorKind.UNREACHABLE
    return Envelope(
        found=True,
        is_error=True,
        error_message=message,
        http_status=http_status(None if code is None else float(code)),
        error_kind=kind,
        retry_after_s=parse_retry_after(message, now=now),
    )


@attrs.frozen
class ContinueAdapter:
    """`cn -p --format json [--model SLUG] ARGS... PROMPT` (the spawn's cwd)."""

    name: str = "cn"
    binary: str = "cn"
    install_hint: str = "npm install -g @continuedev/cli"
    login_hint: str | None = "cn login"
    credential_env: tuple[str, ...] = ("CONTINUE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    credential_files: tuple[str, ...] = ("~/.continue/config.yaml",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "-p", "--format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        envelope = _read(result.stdout_tail, result.stderr_tail, time.time())
        return map_result(self, result, envelope)
