"""Charm's crush: `crush run --quiet PROMPT` (text only).

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import request_argv

__all__ = ["CrushAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class CrushAdapter:
    """`crush run --quiet PROMPT` (text only)."""

    name: str = "crush"
    binary: str = "crush"
    install_hint: str = (
        "npm install -g @charmland/crush (its launcher downloads the crush binary from "
        "GitHub on first run), or go install github.com/charmbracelet/crush@latest"
    )
    login_hint: str | None = "run `crush` once and pick a provider"
    credential_env: tuple[str, ...] = (
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "OPENROUTER_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.local/share/crush/crush.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "run", "--quiet"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
