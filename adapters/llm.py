"""Simon Willison's `llm` (PyPI): `llm prompt PROMPT` (text only).

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import request_argv

__all__ = ["LlmAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class LlmAdapter:
    """`llm prompt PROMPT` (text only)."""

    name: str = "llm"
    binary: str = "llm"
    install_hint: str = "python -m pip install llm"
    login_hint: str | None = "llm keys set openai"
    credential_env: tuple[str, ...] = ("OPENAI_API_KEY",)
    credential_files: tuple[str, ...] = ("~/.config/io.datasette.llm/keys.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "prompt"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
