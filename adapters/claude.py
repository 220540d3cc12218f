"""Anthropic Claude Code: `claude -p --output-format json`, one result envelope.

The envelope is `{"type": "result", "subtype", "is_error", "result", "session_id",
"total_cost_usd", "api_error_status"?...}`; with `--verbose` the CLI prints a list of
messages whose last `result` entry is the envelope. An error subtype
(`error_max_turns`, `error_during_execution`) is a failure even when `is_error` is false.
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

__all__ = ["ClaudeAdapter"]


def _result_object(document: Any) -> dict[str, Any] | None:
    if isinstance(document, list):
        for entry in reversed(document):
            if isinstance(entry, dict) and entry.get("type") == "result":
                return entry
        return None
    if isinstance(document, dict) and ("result" in document or document.get("type") == "result"):
        return document
    return None


def _read(stdout: str) -> Envelope:
    envelope = _result_object(load_json_document(stdout))
    if envelope is None:
        return Envelope()
    subtype = str_field(envelope, "subtype") or ""
    is_error = envelope.get("is_error") is True or subtype.startswith("error")
    result_text = str_field(envelope, "result")
    return Envelope(
        found=True,
        is_error=is_error,
        text=None if is_error else (result_text or ""),
        session_id=str_field(envelope, "session_id"),
        cost_usd=number_field(envelope, "total_cost_usd", "cost_usd"),
        error_message=(result_text or subtype or "claude reported an error") if is_error else None,
        http_status=http_status(number_field(envelope, "api_error_status")),
    )


@attrs.frozen
class ClaudeAdapter:
    """`claude -p --output-format json [--model M] [--max-turns N] ARGS... PROMPT`.

    The working directory is the spawn's cwd (claude has no directory flag).
    """

    name: str = "claude"
    binary: str = "claude"
    install_hint: str = "npm install -g @anthropic-ai/claude-code"
    login_hint: str | None = "run `claude` and /login, or set ANTHROPIC_API_KEY"

    def build_argv(self, request: AgentRequest) -> list[str]:
        turns = [] if request.max_turns is None else ["--max-turns", str(request.max_turns)]
        return request_argv([self.binary, "-p", "--output-format", "json"], request, options=turns)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stdout_tail))
