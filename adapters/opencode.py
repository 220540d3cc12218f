"""opencode: `opencode run --format json`, one JSON event per line on stdout.

Events carry `type`, `sessionID` and a `part`: `text` parts make the reply (the last
step's text), `step_finish` parts carry `cost`, and an `error` event carries
`error: {"name", "data": {"message", "statusCode"?}}`; `statusCode` is the HTTP status.
"""

from __future__ import annotations

from typing import Any

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import http_status, iter_json_objects, number_field, request_argv, str_field

__all__ = ["OpencodeAdapter"]


def _error_of(event: dict[str, Any]) -> tuple[str, int | None]:
    error = event.get("error")
    if isinstance(error, str):
        return error, None
    data = error.get("data") if isinstance(error, dict) else None
    message = (
        str_field(data, "message")
        or str_field(error, "message", "name")
        or str_field(event, "message")
        or "opencode reported an error"
    )
    code = number_field(data, "statusCode", "status") or number_field(error, "statusCode")
    return message, http_status(code)


def _read(stdout: str) -> Envelope:
    session_id: str | None = None
    step_text: list[str] = []
    cost: float | None = None
    error: tuple[str, int | None] | None = None
    finished = False
    for event in iter_json_objects(stdout):
        kind = event.get("type")
        session_id = str_field(event, "sessionID", "session_id") or session_id
        part = event.get("part")
        if kind == "step_start":
            step_text = []
        elif kind == "text":
            text = str_field(part, "text")
            if text:
                step_text.append(text)
        elif kind == "step_finish":
            finished = True
            step_cost = number_field(part, "cost")
            if step_cost is not None:
                cost = (cost or 0.0) + step_cost
        elif kind == "error":
            error = _error_of(event)
    if error is not None:
        message, status = error
        return Envelope(
            found=True,
            is_error=True,
            session_id=session_id,
            cost_usd=cost,
            error_message=message,
            http_status=status,
        )
    return Envelope(
        found=finished,
        text="".join(step_text).strip() if finished else None,
        session_id=session_id,
        cost_usd=cost,
    )


@attrs.frozen
class OpencodeAdapter:
    """`opencode run --format json [--model provider/model] ARGS... PROMPT`.

    The working directory is the spawn's cwd; opencode has no max-turns flag.
    """

    name: str = "opencode"
    binary: str = "opencode"
    install_hint: str = "npm install -g opencode-ai"
    login_hint: str | None = "opencode auth login"

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "run", "--format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stdout_tail))
