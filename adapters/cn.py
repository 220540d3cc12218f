"""Continue's `cn` (`@continuedev/cli`): `cn -p --format json PROMPT`.

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import request_argv

__all__ = ["ContinueAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class ContinueAdapter:
    """`cn -p --format json PROMPT`."""

    name: str = "cn"
    binary: str = "cn"
    install_hint: str = "npm install -g @continuedev/cli"
    login_hint: str | None = "cn login"
    credential_env: tuple[str, ...] = ("CONTINUE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    credential_files: tuple[str, ...] = ("~/.continue/config.yaml",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "-p", "--format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
