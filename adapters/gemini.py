"""Google Gemini CLI: `gemini --output-format json --prompt=...`, one JSON object.

The object is `{"response", "stats", "error"?: {"type", "message", "code"}}`; `code`
is an HTTP status when it is a number in 100..599. A failing CLI may print the error
object on stderr instead of stdout, so both are read.
"""

from __future__ import annotations

from typing import Any

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import (
    http_status,
    load_json_document,
    number_field,
    request_argv,
    str_field,
)

__all__ = ["GeminiAdapter"]


def _envelope_of(document: Any) -> dict[str, Any] | None:
    if isinstance(document, dict) and ("response" in document or "error" in document):
        return document
    return None


def _read(stdout: str, stderr: str) -> Envelope:
    envelope = _envelope_of(load_json_document(stdout)) or _envelope_of(load_json_document(stderr))
    if envelope is None:
        return Envelope()
    error = envelope.get("error")
    session_id = str_field(envelope, "session_id", "sessionId")
    if isinstance(error, dict | str):
        status = http_status(number_field(error, "code", "status"))
        message = error if isinstance(error, str) else str_field(error, "message", "type")
        return Envelope(
            found=True,
            is_error=True,
            session_id=session_id,
            error_message=message or "gemini reported an error",
            http_status=status,
        )
    return Envelope(
        found=True,
        text=str_field(envelope, "response") or "",
        session_id=session_id,
    )


@attrs.frozen
class GeminiAdapter:
    """`gemini --output-format json [--model M] ARGS... --prompt=PROMPT` (no max-turns flag).

    The working directory is the spawn's cwd.
    """

    name: str = "gemini"
    binary: str = "gemini"
    install_hint: str = "npm install -g @google/gemini-cli"
    login_hint: str | None = "run `gemini` once to sign in, or set GEMINI_API_KEY"

    def build_argv(self, request: AgentRequest) -> list[str]:
        # `--prompt=VALUE` keeps a prompt that starts with "-" from reading as a flag.
        prompt = [f"--prompt={request.prompt}"]
        return request_argv([self.binary, "--output-format", "json"], request, prompt=prompt)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stdout_tail, result.stderr_tail))
