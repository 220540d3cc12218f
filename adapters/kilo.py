"""Kilo Code CLI (`@kilocode/cli`, opencode-derived): `kilo run --format json PROMPT`.

Its event stream is opencode's (`adapters.opencode.read_events`): `text`, `step_finish`
and `error` events with `{"name", "data": {"message", "statusCode", "responseBody",
"responseHeaders"...}}` (kilo 7.7, recorded in fixtures/recorded/kilo). Its own retries
are bounded by `KILO_SESSION_RETRY_LIMIT`; set it low in the runner's environment so that a
429 or 5xx is reported before the runner's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from adapters.opencode import read_events, usage_of
from execkit import AgentRequest, MappedResult, SpawnResult, map_result
from execkit.adapterkit import Line, Usage, request_argv

__all__ = ["KiloAdapter"]


@attrs.frozen
class KiloAdapter:
    """`kilo run --format json [--model provider/model] ARGS... PROMPT`."""

    name: str = "kilo"
    binary: str = "kilo"
    install_hint: str = "npm install -g @kilocode/cli"
    login_hint: str | None = "kilo auth login"
    credential_env: tuple[str, ...] = (
        "KILO_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENROUTER_API_KEY",
    )
    credential_files: tuple[str, ...] = ("~/.local/share/kilo/auth.json",)
    # The clock a stated reset is read against (epoch seconds): `time.time`, or a recording's
    # own time when one is replayed.
    clock: Callable[[], float] = attrs.field(default=time.time, eq=False, repr=False)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "run", "--format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        now = self.clock()
        return map_result(self, result, read_events(result.stdout_tail, now), now=now)

    def usage_of(self, line: Line) -> Usage | None:
        """The usage one printed line reports (opencode's `step_finish`), for the meter."""
        return usage_of(line)
