"""Charm's crush (`@charmland/crush`): `crush run --quiet PROMPT`, text only.

The npm package holds no binary: its launcher downloads crush from GitHub releases the
first time it runs, which fails where GitHub cannot be reached (here: the recording's
proxy refuses it). So crush was recorded once, as npm installs it
(fixtures/recorded/crush/not_installed): the launcher prints `Error: Installation failed:
...` and exits 1, read as its program not being installed. With the binary in place,
crush's `run` prints the reply as text and a failure as text: the shared text rules.
"""

from __future__ import annotations

import attrs

from adapters._fixed_lines import first_fixed
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import ErrorKind, request_argv

__all__ = ["CrushAdapter"]

# The GoReleaser npm launcher's own fixed sentence when it could not fetch the binary.
_FIXED = (("Error: Installation failed:", ErrorKind.NOT_INSTALLED),)


def _read(stderr: str) -> Envelope:
    fixed = first_fixed(stderr, _FIXED)
    if fixed is None:
        return Envelope()
    return Envelope(found=True, is_error=True, error_message=fixed[0], error_kind=fixed[1])


@attrs.frozen
class CrushAdapter:
    """`crush run --quiet [--model M] ARGS... PROMPT` (the spawn's cwd)."""

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
        return map_result(self, result, _read(result.stderr_tail))
