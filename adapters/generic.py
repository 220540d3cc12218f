"""Any CLI, text only: stdout is the reply, the exit code and errno are the verdict.

The command comes from the adapter (`GenericAdapter(command=("mytool", "--flag"))`) or
from the request's `extra_args`; the prompt, when not empty, is the last argument.
Failures are classed by the shared rules only (errno, then the text list).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from execkit import AgentRequest, InvalidInput, MappedResult, SpawnResult, map_result

__all__ = ["GenericAdapter"]


def _to_command(value: Iterable[str]) -> tuple[str, ...]:
    # A typed converter (not bare `tuple`) so that type checkers see what __init__ takes.
    return tuple(value)


@attrs.frozen
class GenericAdapter:
    """`COMMAND... EXTRA_ARGS... [PROMPT]` for a CLI execkit has no envelope parser for."""

    command: tuple[str, ...] = attrs.field(default=(), converter=_to_command)
    name: str = "generic"
    install_hint: str = "put the program on PATH (or give its full path in argv)"
    login_hint: str | None = None

    @property
    def binary(self) -> str:
        """The command's program, or "" when it comes with each request."""
        return self.command[0] if self.command else ""

    def build_argv(self, request: AgentRequest) -> list[str]:
        argv = [*self.command, *request.extra_args]
        if not argv:
            raise InvalidInput(
                "the generic adapter needs a command: give GenericAdapter(command=...) "
                "or the request's extra_args (program first)",
                field="extra_args",
            )
        # Verbatim: execkit cannot know whether an unknown CLI understands "--".
        return argv + ([request.prompt] if request.prompt else [])

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result)
