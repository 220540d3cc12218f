"""Simon Willison's `llm` (PyPI): `llm prompt [--model M] PROMPT`, text only.

The reply is stdout; a failure is one line on stderr, `Error: <message>`, and exit 1
(llm 0.36, recorded in fixtures/recorded/llm against an OpenAI-compatible model in
`extra-openai-models.yaml`). Its fixed renderings: `Error: Error code: <status> - <body>`
(the OpenAI SDK's status error: that status; the vendor's fixed sentences in the body
name its kind), `Error: Connection error.` (unreachable), `Error: No key found - ...`
(credentials). A cut stream is printed as a short reply with exit 0: llm cannot tell.
"""

from __future__ import annotations

import re
import time

import attrs

from adapters._vendor_errors import sentence_kind
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import ErrorKind, http_status, parse_retry_after, request_argv

__all__ = ["LlmAdapter"]

_ERROR = re.compile(r"^Error: (?P<message>.+)$", re.M)
_STATUS = re.compile(r"^Error code: (?P<code>[1-5]\d\d) - (?P<body>.*)$", re.S)
_FIXED = (
    ("No key found", ErrorKind.CREDENTIALS),
    ("Connection error.", ErrorKind.UNREACHABLE),
)


def _read(stderr: str, now: float) -> Envelope:
    errors = _ERROR.findall(stderr)
    if not errors:
        return Envelope()
    message = errors[-1].strip()
    found = _STATUS.match(message)
    status = http_status(float(found.group("code"))) if found else None
    body = found.group("body") if found else message
    kind = next((k for prefix, k in _FIXED if body.startswith(prefix)), None)
    return Envelope(
        found=True,
        is_error=True,
        error_message=message,
        http_status=status,
        error_kind=kind or sentence_kind(body),
        retry_after_s=parse_retry_after(message, now=now),
    )


@attrs.frozen
class LlmAdapter:
    """`llm prompt [--model M] ARGS... PROMPT` (no working-directory or turn flags)."""

    name: str = "llm"
    binary: str = "llm"
    install_hint: str = "python -m pip install llm"
    login_hint: str | None = "llm keys set openai"
    credential_env: tuple[str, ...] = ("OPENAI_API_KEY",)
    credential_files: tuple[str, ...] = ("~/.config/io.datasette.llm/keys.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "prompt"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stderr_tail, time.time()))
