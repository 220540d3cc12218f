"""Amp (`@ampcode/cli`, was `@sourcegraph/amp`): `amp --stream-json --execute PROMPT`.

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import request_argv

__all__ = ["AmpAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class AmpAdapter:
    """`amp --stream-json --execute PROMPT`."""

    name: str = "amp"
    binary: str = "amp"
    install_hint: str = "npm install -g @ampcode/cli"
    login_hint: str | None = "amp login"
    credential_env: tuple[str, ...] = ("AMP_API_KEY",)
    credential_files: tuple[str, ...] = ("~/.local/share/amp/secrets.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv(
            [self.binary, "--stream-json", "--execute"], request, prompt=[request.prompt]
        )

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
