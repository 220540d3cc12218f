"""The adapter contract and the mapping every vendor shares.

A vendor module only builds argv and parses its own output envelope into an `Envelope`;
`finish` turns that into an `AdapterRawResult` the same way for every vendor: the
structural spawn errno first (ENOENT is environment, with the install hint), then the
vendor's structured error fields (an HTTP status 429 or 500-599 is upstream), then the
shared text list in `execkit.classify`. Upstream wording never lives in a vendor module.
"""

from __future__ import annotations

import errno as errno_names
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from execkit.classify import FailureClass, classify, classify_text, is_upstream_status
from execkit.errors import InvalidInput
from execkit.exec import SpawnResult
from execkit.redact import redact

__all__ = [
    "NO_ENVELOPE",
    "Adapter",
    "AdapterRawResult",
    "AgentRequest",
    "Envelope",
    "finish",
    "http_status",
    "iter_json_objects",
    "load_json_document",
    "number_field",
    "parse_retry_after",
    "precondition_for",
    "prompt_args",
    "request_argv",
    "str_field",
]

# How much failure text a raw result keeps: the tail, where the cause usually is.
_ERROR_CHARS = 2000


def _check_timeout(_inst: object, _attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not value > 0:
        raise InvalidInput(f"timeout_s must be > 0 seconds (or None for no limit), got {value!r}")


def _check_max_turns(_inst: object, _attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidInput(f"max_turns must be an integer >= 1 (or None), got {value!r}")


def _check_prompt(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str):
        raise InvalidInput(f"prompt must be a string, got {type(value).__name__}")


def _as_args(value: Iterable[str]) -> tuple[str, ...]:
    # A typed converter (not bare `tuple`) so that type checkers see what __init__ takes;
    # a lone string would otherwise become one argument per character.
    if isinstance(value, str | bytes):
        raise InvalidInput(f"extra_args must be a list of strings, not one string: {value!r}")
    return tuple(value)


def _check_extra_args(_inst: object, _attr: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    for arg in value:
        if not isinstance(arg, str):
            raise InvalidInput(f"extra_args must all be strings, got {arg!r}")


@attrs.frozen
class AgentRequest:
    """One agent invocation, vendor-neutral.

    `timeout_s` is enforced by execkit (the process tree is killed), not by the vendor.
    `max_turns` is passed only to vendors that have such a flag. `extra_args` go before
    the prompt, verbatim. `env` is added to the inherited environment.
    Raises InvalidInput naming the field for a value out of range.
    """

    prompt: str = attrs.field(validator=_check_prompt)
    model: str | None = None
    cwd: str | None = None
    timeout_s: float | None = attrs.field(default=None, validator=_check_timeout)
    max_turns: int | None = attrs.field(default=None, validator=_check_max_turns)
    extra_args: tuple[str, ...] = attrs.field(
        default=(), converter=_as_args, validator=_check_extra_args
    )
    env: Mapping[str, str] | None = attrs.field(default=None, eq=False, hash=False)

    def with_prompt(self, prompt: str) -> AgentRequest:
        """The same request with another prompt (the schema gate appends to it)."""
        return attrs.evolve(self, prompt=prompt)


def _check_ok_has_no_class(
    inst: AdapterRawResult, _attr: attrs.Attribute[Any], value: FailureClass | None
) -> None:
    if inst.ok and value is not None:
        raise InvalidInput("failure_class must be None when ok")
    if not inst.ok and value is None:
        raise InvalidInput("a failed result must carry a failure_class (work by default)")


@attrs.frozen
class AdapterRawResult:
    """One spawn of a vendor CLI, its envelope unwrapped and its failure classed.

    `text` is the final reply (envelope unwrapped); `error` the tail of the failure text;
    `failure_class` is None exactly when `ok`; `precondition` names the missing binary
    and how to install (and log in) for environment; `retry_after_s` is a wait the
    vendor asked for, if it printed one.
    """

    ok: bool
    text: str | None = None
    session_id: str | None = None
    cost_usd: float | None = None
    duration_s: float = 0.0
    error: str | None = None
    spawn_errno: int | None = None
    failure_class: FailureClass | None = attrs.field(default=None, validator=_check_ok_has_no_class)
    reason: str | None = None
    precondition: str | None = None
    retry_after_s: float | None = None
    timed_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        del data["failure_class"]
        data["class"] = self.failure_class.value if self.failure_class else None
        return data


@runtime_checkable
class Adapter(Protocol):
    """A vendor CLI: how to call it and how to read what it printed.

    `build_argv` raises InvalidInput for a request the vendor cannot express.
    `parse` never raises for vendor output, however malformed: unknown shapes are
    charged work failures (or plain-text success on exit 0).
    """

    @property
    def name(self) -> str: ...

    @property
    def binary(self) -> str: ...

    @property
    def install_hint(self) -> str: ...

    @property
    def login_hint(self) -> str | None: ...

    def build_argv(self, request: AgentRequest) -> list[str]: ...

    def parse(self, result: SpawnResult) -> AdapterRawResult: ...


@attrs.frozen
class Envelope:
    """What a vendor's output said about itself, before any classing.

    `found`: a result envelope was recognised. `is_error`: the envelope reported failure
    (whatever the exit code). `http_status`: a structured status field, when the vendor
    has one. `error_message`: the vendor's own error text.
    """

    found: bool = False
    is_error: bool = False
    text: str | None = None
    session_id: str | None = None
    cost_usd: float | None = None
    error_message: str | None = None
    http_status: int | None = None


NO_ENVELOPE = Envelope()


def _tail(text: str, max_chars: int = _ERROR_CHARS) -> str:
    return text if len(text) <= max_chars else "…" + text[-(max_chars - 1) :]


def precondition_for(adapter: Adapter, result: SpawnResult) -> str:
    """Name the binary that could not be started and how to fix it.

    `codex CLI not found on PATH; install: npm install -g @openai/codex; then log in: ...`
    """
    binary = adapter.binary or (os.path.basename(result.argv[0]) if result.argv else "the")
    fix = f"install: {adapter.install_hint}"
    if adapter.login_hint:
        fix += f"; then log in: {adapter.login_hint}"
    if result.spawn_errno == errno_names.ENOENT:
        return f"{binary} CLI not found on PATH; {fix}"
    code = errno_names.errorcode.get(result.spawn_errno or 0, str(result.spawn_errno))
    return f"{binary} CLI could not be started ({code}); {fix}"


# Every gap is bounded, so a long run of spaces after the keyword costs linear time.
_RETRY_AFTER = re.compile(
    r"(?:retry[-_ ]?after|(?:try again|retry) in)[\"']?\s{0,4}[:=]?\s{0,4}"
    r"(\d{1,9}(?:\.\d{1,6})?)\s{0,2}"
    r"(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?)?\b",
    re.IGNORECASE,
)


def parse_retry_after(text: str | None) -> float | None:
    """The last wait (seconds) a vendor asked for: `Retry-After: 30`, `try again in 14.0s`.

    Units default to seconds; `ms`, minutes and hours are converted. None when absent.
    """
    if not text:
        return None
    found = None
    for match in _RETRY_AFTER.finditer(text):
        found = match
    if found is None:
        return None
    unit = (found.group(2) or "s").lower()
    if unit.startswith(("ms", "milli")):
        factor = 0.001
    elif unit.startswith("m"):
        factor = 60.0
    elif unit.startswith("h"):
        factor = 3600.0
    else:
        factor = 1.0
    return float(found.group(1)) * factor


def iter_json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Each line of `text` that is a JSON object (JSONL); other lines are skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def load_json_document(text: str) -> Any:
    """The JSON document in `text`: the whole text, else its last JSON line, else None.

    Vendors print banners or warnings around their envelope; this finds it anyway.
    """
    body = text.strip()
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        pass
    for line in reversed(body.splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except ValueError:
                continue
    start = body.find("{")
    if start > 0:
        try:
            return json.loads(body[start:])
        except ValueError:
            return None
    return None


def str_field(obj: object, *keys: str) -> str | None:
    """The first of `keys` in a mapping whose value is a non-empty string."""
    if isinstance(obj, Mapping):
        for key in keys:
            value = obj.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def number_field(obj: object, *keys: str) -> float | None:
    """The first of `keys` in a mapping whose value is a number (bools are not)."""
    if isinstance(obj, Mapping):
        for key in keys:
            value = obj.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    return None


def prompt_args(prompt: str) -> list[str]:
    """The prompt as the final positional argument, never mistaken for a flag."""
    return ["--", prompt] if prompt.startswith("-") else [prompt]


def request_argv(
    head: Sequence[str],
    request: AgentRequest,
    *,
    options: Sequence[str] = (),
    prompt: Sequence[str] | None = None,
) -> list[str]:
    """`head`, `--model M` (when the request names one), `options`, `extra_args`, the prompt.

    The request's `extra_args` go in verbatim; the prompt is `prompt_args` unless the
    vendor passes it in its own form as `prompt`.
    """
    model = ["--model", request.model] if request.model else []
    tail = prompt_args(request.prompt) if prompt is None else prompt
    return [*head, *model, *options, *request.extra_args, *tail]


def http_status(code: float | None) -> int | None:
    """A vendor's numeric status field as an HTTP status: None unless it is a whole number
    in 100..599 (a NaN, an infinity or 503.5 is not a status, and must not raise)."""
    if code is None or not 100 <= code <= 599 or code != int(code):
        return None
    return int(code)


def _failed(
    result: SpawnResult,
    envelope: Envelope,
    failure_class: FailureClass,
    reason: str,
    error: str,
    precondition: str | None = None,
) -> AdapterRawResult:
    error = redact(_tail(error))
    return AdapterRawResult(
        ok=False,
        text=envelope.text,
        session_id=envelope.session_id,
        cost_usd=envelope.cost_usd,
        duration_s=result.duration_s,
        error=error or None,
        spawn_errno=result.spawn_errno,
        failure_class=failure_class,
        reason=reason,
        precondition=precondition,
        retry_after_s=parse_retry_after(error),
        timed_out=result.timed_out,
    )


def finish(
    adapter: Adapter, result: SpawnResult, envelope: Envelope = NO_ENVELOPE
) -> AdapterRawResult:
    """Map one spawn and the vendor's parsed envelope to an `AdapterRawResult`.

    Order, most durable signal first:
    1. a spawn errno (never started): the classifier's structural rule; ENOENT is
       environment with `precondition_for`.
    2. a timeout or a signal: the classifier's verdict on the process.
    3. the envelope reported an error, or the process failed and the envelope carried an
       error message: a structured HTTP status decides (429 or 500-599 is upstream,
       `http N`; any other status is work) unless the message names an account limit
       (quota, billing: work, as `classify_text` says); without a status,
       `classify_text` on the vendor's message.
    4. the process failed otherwise: the classifier on the tail of its output.
    5. exit 0 and no envelope error: success; the reply is the envelope text, or stdout.
    """
    if result.spawn_errno is not None or result.timed_out or result.signal is not None:
        verdict = classify(result)
        if verdict is None:  # pragma: no cover - the classifier classes every failure
            return _failed(result, envelope, FailureClass.WORK, "failed", result.failure_text())
        precondition = None
        if result.spawn_errno is not None and verdict.failure_class is FailureClass.ENVIRONMENT:
            precondition = (
                (result.spawn_error or "working directory not found").strip()
                if verdict.reason == "missing working directory"
                else precondition_for(adapter, result)
            )
        error = result.failure_text(_ERROR_CHARS)
        if precondition and not error:
            error = precondition
        return _failed(result, envelope, verdict.failure_class, verdict.reason, error, precondition)

    if envelope.is_error or (not result.ok and envelope.error_message):
        message = envelope.error_message or result.failure_text(_ERROR_CHARS)
        verdict = classify_text(message)
        status = envelope.http_status
        account_limit = verdict.failure_class is FailureClass.WORK and verdict.reason != "default"
        if status is not None and not account_limit:
            # The structured field is the vendor's own word: it decides, except where the
            # text names an account limit (quota, billing), which no backoff will cure.
            status_class = (
                FailureClass.UPSTREAM if is_upstream_status(status) else FailureClass.WORK
            )
            return _failed(result, envelope, status_class, f"http {status}", message)
        return _failed(result, envelope, verdict.failure_class, verdict.reason, message)

    if not result.ok:
        verdict = classify(result)
        if verdict is None:  # pragma: no cover - not ok always classes
            return _failed(result, envelope, FailureClass.WORK, "failed", result.failure_text())
        return _failed(
            result,
            envelope,
            verdict.failure_class,
            verdict.reason,
            result.failure_text(_ERROR_CHARS),
        )

    text = envelope.text if envelope.found else result.stdout_tail.strip()
    return AdapterRawResult(
        ok=True,
        text=text,
        session_id=envelope.session_id,
        cost_usd=envelope.cost_usd,
        duration_s=result.duration_s,
    )
