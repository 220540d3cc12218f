"""Augment Code's auggie (`@augmentcode/auggie`): `auggie --print --output-format json PROMPT`.

auggie talks only to Augment's own service and takes no base URL, so it was recorded
only not logged in (auggie 0.36, fixtures/recorded/auggie): it prints its fixed sentence
`❌ No auth provided. Please log in with `auggie login` ...` on stderr and exits 1, read
as a credential error. On success `--output-format json` prints a claude-like result
(`adapters.claude.read_result`).
"""

from __future__ import annotations

import attrs

from adapters._fixed_lines import first_fixed
from adapters.claude import read_result
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import ErrorKind, request_argv

__all__ = ["AuggieAdapter"]

_FIXED = (
    ("No auth provided.", ErrorKind.CREDENTIALS),
    ("Authentication failed", ErrorKind.CREDENTIALS),
)


def _read(stdout: str, stderr: str) -> Envelope:
    envelope = read_result(stdout)
    if envelope.found:
        return envelope
    fixed = first_fixed(stderr, _FIXED)
    if fixed is None:
        return envelope
    return Envelope(found=True, is_error=True, error_message=fixed[0], error_kind=fixed[1])


@attrs.frozen
class AuggieAdapter:
    """`auggie --print --output-format json [--model M] [--max-turns N] ARGS... PROMPT`."""

    name: str = "auggie"
    binary: str = "auggie"
    install_hint: str = "npm install -g @augmentcode/auggie"
    login_hint: str | None = "auggie login"
    credential_env: tuple[str, ...] = ("AUGMENT_SESSION_AUTH",)
    credential_files: tuple[str, ...] = ("~/.augment/session.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        turns = [] if request.max_turns is None else ["--max-turns", str(request.max_turns)]
        head = [self.binary, "--print", "--output-format", "json"]
        return request_argv(head, request, options=turns)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stdout_tail, result.stderr_tail))
