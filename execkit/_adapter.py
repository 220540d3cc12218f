"""The adapter contract, and the mapping from a spawn to a classed result every vendor shares.

A vendor adapter (the top-level `adapters` package, or any package registered under the
`execkit.adapters` entry points) only builds argv and parses its own output envelope into
an `Envelope`; `map_result` turns a spawn plus that envelope into a `MappedResult` the
same way for every vendor: the structural spawn facts first (ENOENT is environment, with
the install hint), then the vendor's structured error fields (an HTTP status 429 or
500-599 is upstream), then the shared text list of the classifier. Upstream wording never
lives in a vendor module.
"""

from __future__ import annotations

import errno as errno_names
import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs
from attrs.validators import deep_iterable, gt, instance_of, optional

from execkit._classify import (
    ACCOUNT_LIMIT_REASONS,
    FailureClass,
    Reason,
    classify,
    classify_text,
    is_upstream_status,
)
from execkit._errors import InvalidInput
from execkit._exec import SpawnResult
from execkit._json import json_key, to_json
from execkit._redact import redact
from execkit._validate import checked, finite, integer, opt_checked
from execkit.adapterkit import parse_retry_after

__all__ = [
    "NO_ENVELOPE",
    "Adapter",
    "AgentRequest",
    "Envelope",
    "MappedResult",
    "map_result",
    "precondition_for",
]

# How much failure text a mapped result keeps: the tail, where the cause usually is.
_ERROR_CHARS = 2000


def _as_args(value: Iterable[str]) -> tuple[str, ...]:
    # A typed converter (not bare `tuple`) so that type checkers see what __init__ takes;
    # a lone string would otherwise become one argument per character.
    if isinstance(value, str | bytes):
        raise InvalidInput(
            f"extra_args must be a list of strings, not one string: {value!r}", field="extra_args"
        )
    return tuple(value)


@attrs.frozen
class AgentRequest:
    """One agent invocation, vendor-neutral.

    `timeout_s` is enforced by execkit (the process tree is killed), not by the vendor.
    `max_turns` is passed only to vendors that have such a flag. `extra_args` go before
    the prompt, verbatim. `env` is added to the inherited environment.
    Raises InvalidInput naming the field for a value out of range.
    """

    prompt: str = attrs.field(validator=checked("a string", instance_of(str)))
    model: str | None = None
    cwd: str | None = None
    timeout_s: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number of seconds > 0", finite, gt(0))
    )
    max_turns: int | None = attrs.field(
        default=None, validator=opt_checked("an integer >= 1", integer, gt(0))
    )
    extra_args: tuple[str, ...] = attrs.field(
        default=(),
        converter=_as_args,
        validator=checked("only strings", deep_iterable(instance_of(str))),
    )
    env: Mapping[str, str] | None = attrs.field(default=None, eq=False, hash=False)

    def with_prompt(self, prompt: str) -> AgentRequest:
        """The same request with another prompt (the schema gate appends to it)."""
        return attrs.evolve(self, prompt=prompt)


def _check_ok_has_no_class(
    inst: MappedResult, _attr: attrs.Attribute[Any], value: FailureClass | None
) -> None:
    if inst.ok and value is not None:
        raise InvalidInput("failure_class must be None when ok", field="failure_class")
    if not inst.ok and value is None:
        raise InvalidInput(
            "a failed result must carry a failure_class (work by default)", field="failure_class"
        )


@attrs.frozen
class MappedResult:
    """One spawn of a vendor CLI mapped to what execkit acts on: its envelope unwrapped and
    its failure classed.

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
    failure_class: FailureClass | None = attrs.field(
        default=None,
        validator=[optional(instance_of(FailureClass)), _check_ok_has_no_class],
        metadata=json_key("class"),
    )
    reason: str | None = None
    precondition: str | None = None
    retry_after_s: float | None = None
    timed_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe mapping; the class is under `"class"`."""
        return to_json(self)


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

    def parse(self, result: SpawnResult) -> MappedResult: ...


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


def _failed(
    result: SpawnResult,
    envelope: Envelope,
    failure_class: FailureClass,
    reason: str,
    error: str,
    precondition: str | None = None,
) -> MappedResult:
    error = redact(_tail(error))
    return MappedResult(
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


def map_result(
    adapter: Adapter, result: SpawnResult, envelope: Envelope = NO_ENVELOPE
) -> MappedResult:
    """Map one spawn and the vendor's parsed envelope to a `MappedResult`.

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
                if verdict.reason == Reason.MISSING_CWD
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
        account_limit = verdict.reason in ACCOUNT_LIMIT_REASONS
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
    return MappedResult(
        ok=True,
        text=text,
        session_id=envelope.session_id,
        cost_usd=envelope.cost_usd,
        duration_s=result.duration_s,
    )
