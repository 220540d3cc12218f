"""Google Gemini CLI: `gemini --output-format json --prompt=...`, one JSON object.

The object is `{"session_id"?, "response", "stats", "error"?: {"type", "message", "code"}}`;
`code` is an HTTP status when it is a number in 100..599. A failing CLI prints the error
object, pretty-printed, at the END of stderr, after terminal warnings and a node stack
trace full of `{`, so it is found as the last complete JSON value of either stream.

Structure read (gemini-cli 0.61, recorded in fixtures/recorded/gemini):

- `error.message` is often the API's own error body serialized (`{"error": {"code": 401,
  "status": "UNAUTHENTICATED"}}`): its Google status names the kind (`UNAUTHENTICATED`,
  `PERMISSION_DENIED`: credentials; `FAILED_PRECONDITION`: billing, as the Gemini API uses
  it for "enable billing"; `RESOURCE_EXHAUSTED`: a rate limit; `UNAVAILABLE`: overloaded;
  `INTERNAL`, `DEADLINE_EXCEEDED`: a server error).
- `error.type` `INVALID_STREAM` with the `NO_FINISH_REASON` error in `stats` (or its fixed
  message) is a stream the API cut off; `FatalAuthenticationError` is a credential error.
- The exit code is the HTTP status mod 256 (145 = 401, 147 = 403), 41 is the CLI's
  FatalAuthenticationError (no key: `you must specify the GEMINI_API_KEY environment
  variable`) and 55 its untrusted-workspace error: read when no error object was printed;
  an error object whose `code` is 41 or 55 says the same.
- An API error body whose `details` carry an `ErrorInfo` with reason `API_KEY_INVALID` or
  `API_KEY_EXPIRED` is a credential error, whatever its status (an expired key is a 400).
- `You have exhausted your daily quota` is the CLI's fixed sentence for a per-day quota
  (its TerminalQuotaError): billing, which waits for the reset when one is stated.
- An exit 0 whose `response` is empty while `stats` counts a `NO_FINISH_REASON` error is a
  stream the CLI gave up on (an overload sent inside a 200 stream): it failed.
- `Attempt N failed[ with status S]. Retrying with backoff...` (with its stack trace) is a
  retry notice, never the final error; a run that ends (timeout) on one was still
  retrying (`fetch failed`: the API is unreachable). The reset of a quota error is its
  `retryDelayMs`, else the `Please retry in Ns` of the final error.
- `Attempt N failed: <message>. Retrying after Xms...` is its quota retry (a
  RetryableQuotaError: a 429/499/503 whose RetryInfo delay, or `Please retry in`, is at
  most 300 s; the message's last line, `Suggested retry after Ns.`, quotes the vendor's
  delay): it then sleeps X ms, the delay plus up to 20% jitter. `watch` stops a CLI that
  announces more than `LONG_WAIT_S` (with `general.maxAttempts` 2, a limit lifting in
  298 s held the slot for 310 s, and `--timeout` killed it mid-sleep): the attempt is
  upstream with the vendor's delay as its reset, from the CLI's fixed announcement, so
  the lane parks. A run killed (timeout) during a shorter announced sleep is read the
  same way (`pending`).
- An unreachable API is gemini's fixed rendering of undici's failure, `exception
  TypeError: fetch failed sending request`: in 0.61 only in its retry notices; older
  releases (0.20, 0.30) give up at once with an error object whose message is the
  unprintable `[object Object]` (code 1), the cause on the final error's line (0.30) or
  only on the failed routing call's (0.20). The rendering, in the message or beside such
  a message, is the unreachable kind, and the line it is on becomes the message.

Usage (issue #45), tokens only (gemini prints no money): `stats.models.<model>.tokens`
(`prompt` or `input`, `cached`, `candidates`, `thoughts`, `tool`) per model, each model
priced on its own from the price table and then summed (a run uses a router model and a
main one); stream-json's `result` event's `stats` totals (`input_tokens`, `cached`,
`output_tokens`) name no model. The default argv (`json`) prints usage only at the end.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from execkit import AgentRequest, Envelope, MappedResult, SpawnResult, map_result
from execkit.adapterkit import (
    LONG_WAIT_S,
    ErrorKind,
    Line,
    Usage,
    UsageEvent,
    count_field,
    http_status,
    json_object,
    last_json_value,
    load_json_document,
    number_field,
    parse_retry_after,
    priced,
    reported_usage,
    request_argv,
    str_field,
)

__all__ = ["GeminiAdapter"]

_GOOGLE_STATUS = {
    "UNAUTHENTICATED": ErrorKind.CREDENTIALS,
    "PERMISSION_DENIED": ErrorKind.CREDENTIALS,
    "FAILED_PRECONDITION": ErrorKind.BILLING,
    "RESOURCE_EXHAUSTED": ErrorKind.RATE_LIMITED,
    "UNAVAILABLE": ErrorKind.OVERLOADED,
    "INTERNAL": ErrorKind.SERVER_ERROR,
    "DEADLINE_EXCEEDED": ErrorKind.SERVER_ERROR,
}
_ERROR_TYPES = {"FatalAuthenticationError": ErrorKind.CREDENTIALS}
# The CLI's own exit codes, also put in an error object's `code`.
_CODE_KINDS = {41: ErrorKind.CREDENTIALS, 55: ErrorKind.UNTRUSTED}
_KEY_REASONS = frozenset({"API_KEY_INVALID", "API_KEY_EXPIRED"})
_DAILY_QUOTA = "You have exhausted your daily quota"
# undici's connection failure as gemini-cli renders it (`exception TypeError: fetch failed
# sending request`), and what older releases print for an error object they cannot show.
_FETCH_FAILED = "fetch failed sending request"
_UNPRINTABLE = "[object Object]"
_NO_FINISH = "Model stream ended without a finish reason."
# gemini-cli exits with the HTTP status mod 256, and 41 for FatalAuthenticationError.
_EXIT_STATUS = {145: 401, 147: 403}

_NOTICE = re.compile(r"^Attempt \d+ failed(?: with status (?P<code>\d{3}))?[.:].*$", re.M)
_FINAL = "Error when talking to Gemini API"
_RETRY_DELAY_MS = re.compile(r"^\s*retryDelayMs: (\d{1,9}),?$", re.M)
# The quota retry's announcement, ending the line its message's last line is printed on.
_ANNOUNCED = "Retrying after "
_ANNOUNCEMENT = re.compile(r"^.*Retrying after (?P<ms>\d{1,12})ms\.\.\.[ \t]*$", re.M)
_SUGGESTED = re.compile(r"Suggested retry after (?P<s>\d{1,9}(?:\.\d{1,6})?)s\.")


def _envelope_of(document: Any) -> dict[str, Any] | None:
    # The CLI's own object, not an API error body ({"error": {"code", "status"}}) from a
    # notice line: it has a session, a response or stats, or an error with a `type`.
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    if any(key in document for key in ("response", "session_id", "sessionId", "stats")):
        return document
    if isinstance(error, dict) and "type" in error:
        return document
    return None


def _stream_cut(envelope: dict[str, Any], error: dict[str, Any]) -> bool:
    if str_field(error, "type") != "INVALID_STREAM":
        return False
    if str_field(error, "message") == _NO_FINISH:
        return True
    return _no_finish_counted(envelope)


def _no_finish_counted(envelope: dict[str, Any]) -> bool:
    stats = envelope.get("stats")
    models = stats.get("models") if isinstance(stats, dict) else None
    if not isinstance(models, dict):
        return False
    for model in models.values():
        api = model.get("api") if isinstance(model, dict) else None
        errors = api.get("errorsByType") if isinstance(api, dict) else None
        if isinstance(errors, dict) and "NO_FINISH_REASON" in errors:
            return True
    return False


def _kind(envelope: dict[str, Any], error: dict[str, Any], message: str | None) -> ErrorKind | None:
    if _stream_cut(envelope, error):
        return ErrorKind.STREAM_FAILED
    named = _ERROR_TYPES.get(str_field(error, "type") or "")
    if named is None:
        code = number_field(error, "code")
        named = _CODE_KINDS.get(int(code)) if code is not None and code.is_integer() else None
    if named is not None:
        return named
    if (message or "").startswith(_DAILY_QUOTA):
        return ErrorKind.BILLING
    if _FETCH_FAILED in (message or ""):
        return ErrorKind.UNREACHABLE
    body = json_object(message)
    api_error = body.get("error") if body is not None else None
    details = api_error.get("details") if isinstance(api_error, dict) else None
    if isinstance(details, list) and any(
        str_field(item, "reason") in _KEY_REASONS for item in details
    ):
        return ErrorKind.CREDENTIALS
    return _GOOGLE_STATUS.get(str_field(api_error, "status") or "")


def _final_block(stderr: str) -> str:
    at = stderr.rfind(_FINAL)
    return "" if at < 0 else stderr[at:]


def _stated_wait(message: str | None, stderr: str) -> float | None:
    block = _final_block(stderr)
    delays = _RETRY_DELAY_MS.findall(block)
    if delays:
        return int(delays[-1]) / 1000.0
    return parse_retry_after(message) or parse_retry_after(block)


def _structured_delay(stderr: str) -> bool:
    """Whether the wait is the error's own `RetryInfo` delay (`retryDelayMs`), the
    vendor's structure (issue #28: only it parks a vendor lane), not a time in prose."""
    return bool(_RETRY_DELAY_MS.findall(_final_block(stderr)))


def _announced(line: str) -> Envelope | None:
    """The quota retry announcement `line` as the error it waits out: rate limited, its
    reset the vendor's delay the CLI quotes (`Suggested retry after Ns.`), else the sleep
    it announces; None when `line` is no announcement."""
    found = _ANNOUNCEMENT.match(line)
    if found is None:
        return None
    suggested = _SUGGESTED.search(line)
    wait = float(suggested.group("s")) if suggested else int(found.group("ms")) / 1000.0
    return Envelope(
        found=True,
        is_error=True,
        error_message=line.strip(),
        error_kind=ErrorKind.RATE_LIMITED,
        retry_after_s=wait,
        # The CLI's fixed announcement of the delay it read from the vendor's RetryInfo.
        reset_structured=True,
    )


def _still_pending(after: str) -> bool:
    """Whether only a notice's own stack frames and inspected error (indented, or the `}`
    closing it) and the CLI's startup timing lines follow it: it was still pending."""
    for later in after.splitlines():
        if later.strip() and not later.startswith((" ", "\t", "}", "[STARTUP]")):
            return False
    return True


def _retrying(stderr: str) -> Envelope | None:
    """The last retry notice, when nothing final came after it (the CLI was still at it)."""
    notice = None
    for notice in _NOTICE.finditer(stderr):  # noqa: B007 - the last one is wanted
        continue
    announced = None
    for announced in _ANNOUNCEMENT.finditer(stderr):  # noqa: B007 - the last one is wanted
        continue
    if announced is not None and (notice is None or announced.end() >= notice.end()):
        # A quota retry, sleeping when the run ended: its message ran onto this line.
        waiting = _announced(announced.group(0))
        if waiting is not None and _still_pending(stderr[announced.end() :]):
            return attrs.evolve(waiting, pending=True)
        return None
    if notice is None or "Retrying" not in notice.group(0):
        return None
    if not _still_pending(stderr[notice.end() :]):
        return None
    line = notice.group(0)
    kind = ErrorKind.UNREACHABLE if "fetch failed" in line else ErrorKind.RETRYING
    code = notice.group("code")
    return Envelope(
        found=True,
        is_error=True,
        error_message=line,
        http_status=http_status(float(code)) if code else None,
        error_kind=kind,
    )


def _cause_line(stderr: str) -> str | None:
    """For an error object older releases print as `[object Object]`: the line of stderr
    that renders its cause, the final error's own first, else the last one that renders an
    unreachable API (a routing call's failure, the only cause 0.20 prints)."""
    block = _final_block(stderr)
    first = block.splitlines()[0] if block else ""
    if _FETCH_FAILED in first:
        return first.strip()
    for line in reversed(stderr.splitlines()):
        if _FETCH_FAILED in line:
            return line.strip()
    return None


def _model_usage(model: str, tokens: object) -> Usage:
    """One model's `stats.models.<model>.tokens`: `prompt` counts the cached tokens too,
    `input` (when printed) does not; `thoughts` are billed as output, `tool` (tool-use
    prompt) as input."""
    cached = count_field(tokens, "cached")
    if isinstance(tokens, dict) and "input" in tokens:
        fresh = count_field(tokens, "input")
    else:
        fresh = max(0, count_field(tokens, "prompt") - cached)
    return reported_usage(
        input_tokens=fresh + count_field(tokens, "tool"),
        output_tokens=count_field(tokens, "candidates", "thoughts"),
        cache_read_tokens=cached,
        model=model,
    )


def _stats_usage(stats: object) -> Usage | None:
    """The run's usage from its `stats`, tokens only: `--output-format json` breaks it
    down per model (each model priced on its own, then summed); stream-json's `result`
    prints totals (`input_tokens` with the cached ones in it, `cached`, `output_tokens`)."""
    if not isinstance(stats, dict):
        return None
    models = stats.get("models")
    if isinstance(models, dict):
        parts = [
            priced(_model_usage(name, entry.get("tokens")))
            for name, entry in models.items()
            if isinstance(entry, dict) and isinstance(entry.get("tokens"), dict)
        ]
        if not parts:
            return None
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total
    if "input_tokens" not in stats and "output_tokens" not in stats:
        return None
    cached = count_field(stats, "cached")
    return reported_usage(
        input_tokens=max(0, count_field(stats, "input_tokens") - cached),
        output_tokens=count_field(stats, "output_tokens"),
        cache_read_tokens=cached,
    )


def usage_of(line: Line) -> Usage | UsageEvent | None:
    """The usage one stream-json line reports: the `result` event's `stats`, the CLI's
    own total for the run (it prints no per-message usage)."""
    text = line.text
    if line.stream != "stdout" or '"stats"' not in text or not text.startswith("{"):
        return None
    event = json_object(text)
    if event is None or event.get("type") != "result":
        return None
    usage = _stats_usage(event.get("stats"))
    return None if usage is None else UsageEvent(usage, final=True)


def _read(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    envelope = _read_envelope(stdout, stderr, exit_code)
    document = _envelope_of(load_json_document(stdout))
    usage = None if document is None else _stats_usage(document.get("stats"))
    return envelope if usage is None else attrs.evolve(envelope, usage=usage)


def _read_envelope(stdout: str, stderr: str, exit_code: int | None) -> Envelope:
    envelope = _envelope_of(load_json_document(stdout)) or _envelope_of(last_json_value(stderr))
    if envelope is None:
        said = stderr.strip()[-2000:] or f"gemini exited {exit_code}"
        if exit_code in _CODE_KINDS:
            return Envelope(error_message=said, error_kind=_CODE_KINDS[exit_code])
        if exit_code in _EXIT_STATUS:
            return Envelope(error_message=said, http_status=_EXIT_STATUS[exit_code])
        return _retrying(stderr) or Envelope()
    error = envelope.get("error")
    session_id = str_field(envelope, "session_id", "sessionId")
    if isinstance(error, dict | str):
        message = error if isinstance(error, str) else str_field(error, "message", "type")
        if message == _UNPRINTABLE:
            message = _cause_line(stderr) or message
        fields = error if isinstance(error, dict) else {}
        status = http_status(number_field(fields, "code", "status"))
        return Envelope(
            found=True,
            is_error=True,
            session_id=session_id,
            error_message=message or "gemini reported an error",
            http_status=status,
            error_kind=_kind(envelope, fields, message),
            retry_after_s=_stated_wait(message, stderr),
            reset_structured=_structured_delay(stderr),
        )
    reply = str_field(envelope, "response") or ""
    if not reply.strip() and _no_finish_counted(envelope):
        return Envelope(
            found=True,
            is_error=True,
            session_id=session_id,
            error_message=_NO_FINISH,
            error_kind=ErrorKind.STREAM_FAILED,
        )
    return Envelope(found=True, text=reply, session_id=session_id)


@attrs.frozen
class GeminiAdapter:
    """`gemini --output-format json [--model M] [--resume ID] ARGS... --prompt=PROMPT` (no
    max-turns flag).

    The working directory is the spawn's cwd.
    """

    name: str = "gemini"
    binary: str = "gemini"
    install_hint: str = "npm install -g @google/gemini-cli"
    login_hint: str | None = "run `gemini` once to sign in with Google"
    credential_env: tuple[str, ...] = (
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    )
    credential_files: tuple[str, ...] = ("~/.gemini/oauth_creds.json",)
    trust_hint: str = (
        "set GEMINI_CLI_TRUST_WORKSPACE=true, pass --skip-trust, or trust the folder in "
        "interactive mode"
    )
    # Issue #46: `--resume ID` (a session's uuid) continues it (`AgentRequest.resume_session`).
    resumes_sessions: bool = True

    def build_argv(self, request: AgentRequest) -> list[str]:
        # `--prompt=VALUE` keeps a prompt that starts with "-" from reading as a flag.
        prompt = [f"--prompt={request.prompt}"]
        resume = [] if request.resume_session is None else ["--resume", request.resume_session]
        head = [self.binary, "--output-format", "json"]
        return request_argv(head, request, options=resume, prompt=prompt)

    def resume_refused(self, failure_text: str) -> bool:
        """The CLI refused the session it was asked to resume (its bundle's fixed words:
        `Invalid session identifier "<id>"`, `Error resuming session:`)."""
        return "Invalid session identifier" in failure_text or (
            "Error resuming session" in failure_text
        )

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(
            self, result, _read(result.stdout_tail, result.stderr_tail, result.exit_code)
        )

    def usage_of(self, line: Line) -> Usage | UsageEvent | None:
        """The usage one printed line reports (stream-json's `result`), for the meter."""
        return usage_of(line)

    def watch(self, line: Line) -> Envelope | None:
        """The CLI announced a quota retry longer than `LONG_WAIT_S` on stderr: the
        error it would sleep out, to end the attempt with (else None)."""
        if line.stream != "stderr" or _ANNOUNCED not in line.text:
            return None
        waiting = _announced(line.text)
        if waiting is None or waiting.retry_after_s is None:
            return None
        return waiting if waiting.retry_after_s > LONG_WAIT_S else None
