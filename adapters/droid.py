"""Factory's droid (`@factory/cli`): `droid exec --output-format json PROMPT`.

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import request_argv

__all__ = ["DroidAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class DroidAdapter:
    """`droid exec --output-format json PROMPT`."""

    name: str = "droid"
    binary: str = "droid"
    install_hint: str = "npm install -g @factory/cli"
    login_hint: str | None = "run `droid`, then /login"
    credential_env: tuple[str, ...] = ("FACTORY_API_KEY",)
    credential_files: tuple[str, ...] = ("~/.factory/auth.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "exec", "--output-format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
