"""Factory's droid (`@factory/cli`): `droid exec --output-format json PROMPT`.

One claude-like result object (droid 0.225, recorded in fixtures/recorded/droid):
`{"type": "result", "subtype": "success" | "failure", "is_error", "result",
"session_id"...}`, read by `adapters.claude.read_result`. droid's own fixed sentences in
`result`: `Authentication failed. ...` (no key, an invalid or expired key) is a credential
error; a `result` that starts with a status (`403 Country, region...`) is the API's
answer passed through, that status. A connection failure is only `Exec failed`, which
names nothing: it stays work.
droid retries a 429 or 5xx silently (nothing printed until it gives up, past a minute):
a runner's timeout then sees nothing, and charges it as a timeout.
"""

from __future__ import annotations

import attrs

from adapters._vendor_errors import sentence_kind, split_status
from adapters.claude import read_result
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import ErrorKind, http_status, request_argv

__all__ = ["DroidAdapter"]

_FIXED_PREFIXES = (("Authentication failed.", ErrorKind.CREDENTIALS),)


def _read(stdout: str) -> Envelope:
    envelope = read_result(stdout)
    if not envelope.is_error or envelope.error_kind is not None:
        return envelope
    message = envelope.error_message or ""
    kind = next((k for prefix, k in _FIXED_PREFIXES if message.startswith(prefix)), None)
    status, _ = split_status(message)  # `403 Country, region...`: the SDK's status first
    return attrs.evolve(
        envelope,
        error_kind=kind or sentence_kind(message),
        http_status=envelope.http_status or http_status(None if status is None else status),
    )


@attrs.frozen
class DroidAdapter:
    """`droid exec --output-format json [--model M] ARGS... PROMPT` (the spawn's cwd)."""

    name: str = "droid"
    binary: str = "droid"
    install_hint: str = "npm install -g @factory/cli"
    login_hint: str | None = "run `droid`, then /login"
    credential_env: tuple[str, ...] = ("FACTORY_API_KEY",)
    credential_files: tuple[str, ...] = ("~/.factory/auth.json",)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return request_argv([self.binary, "exec", "--output-format", "json"], request)

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result, _read(result.stdout_tail))
