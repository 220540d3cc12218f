"""Amp (`@ampcode/cli`, was `@sourcegraph/amp`): `amp --stream-json --execute PROMPT`.

Amp talks to its own service (`AMP_URL`, default ampcode.com), not to a model API, so it
was recorded only where no service is needed (amp 0.0.1790142911, fixtures/recorded/amp):
without a key, and with the service unreachable. On success `--stream-json` prints
claude-compatible events whose last is the `result` (`adapters.claude.read_result`).

Its own fixed sentences: `No API key found. Starting login flow...` (it then waits for a
pasted code: a credential error it is still waiting on, `pending`, so a runner's timeout
classes it as the missing login it is), `Error: Couldn't connect to the Amp server at
...` (unreachable), and its launcher's `Amp native binary not installed` (not installed).
A TLS failure prints only `Error: TypeError: unknown certificate verification error`,
which names no service: it stays work.
"""

from __future__ import annotations

import attrs

from adapters._fixed_lines import first_fixed
from adapters.claude import read_result
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import ErrorKind

__all__ = ["AmpAdapter"]

_FIXED = (
    ("No API key found.", ErrorKind.CREDENTIALS),
    ("Error: Couldn't connect to the Amp server", ErrorKind.UNREACHABLE),
    ("Error: Amp native binary not installed", ErrorKind.NOT_INSTALLED),
)


def _read(stdout: str, stderr: str) -> Envelope:
    envelope = read_result(stdout)
    if envelope.found:
        return envelope
    fixed = first_fixed(stderr, _FIXED) or first_fixed(stdout, _FIXED)
    if fixed is None:
        return envelope
    line, kind = fixed
    # The login flow waits for input: still waiting when a runner's timeout kills it.
    return Envelope(
        found=True,
        is_error=True,
        error_message=line,
        error_kind=kind,
        pending=kind is ErrorKind.CREDENTIALS,
    )


@attrs.frozen
class AmpAdapter:
    """`amp --stream-json --execute PROMPT` (no model flag: Amp picks its model)."""

    name: str = "amp"
    binary: str = "amp"
    install_hint: str = "npm install -g @ampcode/cli"
    login_hint: str | None = "amp login"
    credential_env: tuple[str, ...] = ("AMP_API_KEY",)
    credential_files: tuple[str, ...] = ("~/.local/share/amp/secrets.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return [self.binary, "--stream-json", *request.extra_args, "--execute", request.prompt]

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stdout_tail, result.stderr_tail))
