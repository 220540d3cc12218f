"""OpenAI Codex CLI: `codex exec --json`, one JSON event per line on stdout.

Events read: `thread.started` (thread_id is the session), `item.completed` with an
`agent_message` item (the reply), `turn.completed`, `turn.failed` (error.message) and
top-level `error` events. An `error` event followed by `turn.completed` was a transient
reconnect the CLI recovered from, so only an error the turn did not recover from counts.
"""

from __future__ import annotations

from typing import Any

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import iter_json_objects, request_argv, str_field

__all__ = ["CodexAdapter"]


def _item_text(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("type") or item.get("item_type")
    if kind not in ("agent_message", "assistant_message"):
        return None
    return str_field(item, "text", "message")


def _read(stdout: str) -> Envelope:
    session_id: str | None = None
    reply: str | None = None
    completed = False
    failed_message: str | None = None
    pending_error: str | None = None
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
        elif kind == "turn.completed":
            completed = True
            pending_error = None
        elif kind == "turn.failed":
            failed_message = str_field(event.get("error"), "message") or "turn failed"
        elif kind == "error":
            pending_error = str_field(event, "message") or str_field(event.get("error"), "message")
    error = failed_message or pending_error
    return Envelope(
        found=seen and (completed or error is not None),
        is_error=failed_message is not None or (pending_error is not None and not completed),
        text=reply,
        session_id=session_id,
        error_message=error,
    )


@attrs.frozen
class CodexAdapter:
    """`codex exec --json [--model M] [--cd DIR] ARGS... PROMPT` (no max-turns flag)."""

    name: str = "codex"
    binary: str = "codex"
    install_hint: str = "npm install -g @openai/codex"
    login_hint: str | None = "codex login"

    def build_argv(self, request: AgentRequest) -> list[str]:
        cd = ["--cd", request.cwd] if request.cwd else []
        return request_argv([self.binary, "exec", "--json"], request, options=cd)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stdout_tail))
