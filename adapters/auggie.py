"""Augment Code's auggie: `auggie --print --output-format json PROMPT`.

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import request_argv

__all__ = ["AuggieAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class AuggieAdapter:
    """`auggie --print --output-format json PROMPT`."""

    name: str = "auggie"
    binary: str = "auggie"
    install_hint: str = "npm install -g @augmentcode/auggie"
    login_hint: str | None = "auggie login"
    credential_env: tuple[str, ...] = ("AUGMENT_SESSION_AUTH",)
    credential_files: tuple[str, ...] = ("~/.augment/session.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "--print", "--output-format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
