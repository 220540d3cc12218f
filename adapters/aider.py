"""aider (PyPI `aider-chat`): `aider --message PROMPT --yes-always ...`, text only.

Structure read: see `_read`.
"""

from __future__ import annotations

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result

__all__ = ["AiderAdapter"]


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    return Envelope()


@attrs.frozen
class AiderAdapter:
    """`aider --message PROMPT --yes-always --no-pretty ... [--model M] ARGS...`."""

    name: str = "aider"
    binary: str = "aider"
    install_hint: str = "python -m pip install aider-chat"
    login_hint: str | None = None
    credential_env: tuple[str, ...] = (
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "GEMINI_API_KEY",
        "OPENROUTER_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.aider.conf.yml",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        model = ["--model", request.model] if request.model else []
        # `--message=` keeps a prompt that starts with "-" from reading as a flag.
        return [
            self.binary,
            f"--message={request.prompt}",
            "--yes-always",
            "--no-pretty",
            "--no-stream",
            "--no-check-update",
            "--no-analytics",
            "--no-show-release-notes",
            *model,
            *request.extra_args,
        ]

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )
