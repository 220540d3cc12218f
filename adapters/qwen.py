"""Qwen Code (a gemini-cli fork): `qwen --output-format json PROMPT`.

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import request_argv

__all__ = ["QwenAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class QwenAdapter:
    """`qwen --output-format json PROMPT`."""

    name: str = "qwen"
    binary: str = "qwen"
    install_hint: str = "npm install -g @qwen-code/qwen-code"
    login_hint: str | None = "run `qwen` once and pick an auth type"
    credential_env: tuple[str, ...] = (
        "OPENAI_API_KEY",
        "DASHSCOPE_API_KEY",
        "GEMINI_API_KEY",
        "ANTHROPIC_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.qwen/oauth_creds.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "--output-format", "stream-json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
