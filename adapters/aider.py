"""aider (PyPI `aider-chat`): `aider --message=PROMPT --yes-always ...`, text only.

aider exits 0 when it gives up on the vendor and when the vendor refuses the key (aider
0.86, recorded in fixtures/recorded/aider): the failure is only in what it printed, so the
transcript is read whatever the exit code. It prints each failed call as LiteLLM's
exception, `litellm.<Name>: [<Name>: ]<Provider>Exception - <message>` (wrapped over
lines), then a fixed sentence of its own, then `Retrying in N seconds...` while it
retries (up to about a minute). The exception name is LiteLLM's type for the failure,
read as structure: `AuthenticationError`/`PermissionDeniedError` (credentials),
`RateLimitError` (rate limited; the vendor's quota or usage-limit sentence in the message
names those), `InternalServerError`/`ServiceUnavailableError`/`BadGatewayError` (a
server error; `Connection error.` in it is an unreachable API), `APIConnectionError`
(unreachable); others (`BadRequestError`, `NotFoundError`...) say only that it failed.

The last exception is the failure when nothing but aider's own follow-up lines came after
it (a reply ends with its `Tokens: ...` line); a run killed while the last line is
`Retrying in N seconds...` was still retrying it (`pending`). Started with no model or
key, aider waits for an OpenRouter login in the browser (`Please open this URL in your
browser to connect Aider with OpenRouter`): a missing login it is still waiting on.
"""

from __future__ import annotations

import re
import time

import attrs

from adapters._vendor_errors import sentence_kind
from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import ErrorKind, parse_retry_after

__all__ = ["AiderAdapter"]

_EXCEPTION = re.compile(r"^litellm\.(?P<name>[A-Za-z]+): ", re.M)
_NAMES = {
    "AuthenticationError": ErrorKind.CREDENTIALS,
    "PermissionDeniedError": ErrorKind.CREDENTIALS,
    "RateLimitError": ErrorKind.RATE_LIMITED,
    "InternalServerError": ErrorKind.SERVER_ERROR,
    "ServiceUnavailableError": ErrorKind.SERVER_ERROR,
    "BadGatewayError": ErrorKind.SERVER_ERROR,
    "APIConnectionError": ErrorKind.UNREACHABLE,
}
# `<Name>: <Provider>Exception - ` before the vendor's message.
_PREFIX = re.compile(r"^(?:[A-Za-z]+: )?[A-Za-z]*Exception - ")
_REPLY_DONE = re.compile(r"^Tokens: ", re.M)
_RETRYING = re.compile(r"^Retrying in [\d.]+ seconds\.\.\.\s*$")
_LOGIN = "Please open this URL in your browser to connect Aider with"


def _read(stdout: str, now: float) -> Envelope:
    if _LOGIN in stdout and not _REPLY_DONE.search(stdout):
        return Envelope(
            found=True,
            is_error=True,
            error_message=_LOGIN + " OpenRouter (waiting for a login)",
            error_kind=ErrorKind.CREDENTIALS,
            pending=True,
        )
    exceptions = list(_EXCEPTION.finditer(stdout))
    if not exceptions:
        return Envelope()
    last = exceptions[-1]
    after = stdout[last.end() :]
    if _REPLY_DONE.search(after):
        return Envelope()  # a reply came after it: the retry worked
    lines = [line.strip() for line in after.splitlines()]
    body_lines: list[str] = []
    for line in lines:
        if not line or line.startswith("The API provider") or _RETRYING.match(line):
            break
        body_lines.append(line)
    body = _PREFIX.sub("", " ".join(body_lines))
    name = last.group("name")
    kind = sentence_kind(body) or _NAMES.get(name)
    if kind is ErrorKind.SERVER_ERROR and body.startswith("Connection error."):
        kind = ErrorKind.UNREACHABLE
    tail = [line for line in lines if line]
    retrying = bool(tail) and _RETRYING.match(tail[-1]) is not None
    message = f"litellm.{name}: {body}"
    return Envelope(
        found=True,
        is_error=True,
        error_message=message,
        error_kind=kind,
        retry_after_s=parse_retry_after(body, now=now),
        pending=retrying,
    )


@attrs.frozen
class AiderAdapter:
    """`aider --message=PROMPT --yes-always --no-pretty --no-stream ... [--model M] ARGS...`.

    `--message=` keeps a prompt that starts with "-" from reading as a flag. aider retries
    a failed call for about a minute with no setting to lower it: give it a longer
    timeout than that, or its last words are a retry notice.
    """

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
        return map_result(self, result, _read(result.stdout_tail, time.time()))
