"""The adapter contract, and the mapping from a spawn to a classed result every vendor shares.

A vendor adapter (the top-level `adapters` package, or any package registered under the
`execkit.adapters` entry points) only builds argv and parses its own output envelope into
an `Envelope`; `map_result` turns a spawn plus that envelope into a `MappedResult` the
same way for every vendor: the structural spawn facts first (a program that never started
is environment, each kind of start failure with its own precondition), then the vendor's
structured error fields (`http_status`, `error_kind`, `retry_after_s`), then the shared
text list of the classifier. Upstream wording never lives in a vendor module, and text
alone never yields environment: credentials and billing stop a run only when an adapter
read them from the vendor's structure.

Besides the `Adapter` protocol's members, the contract reads optional attributes with
`getattr` defaults, so an adapter that lacks them needs no change: `credential_env` (the
environment variables the vendor CLI takes credentials from) and `credential_files` (its
credential files, `~` allowed) name what to fix in an environment precondition and let
`execkit adapters` say whether credentials look present (their values are never read);
`trust_hint` words the untrusted-workspace fix; `watch(line)` reads the CLI's output as
it is printed (`AdapterWatch`): a CLI that announces it will sleep out a limit longer
than `LONG_WAIT_S` is stopped there, and the attempt ends as `upstream` with the
announced reset, so the slot is freed and the vendor lane parks instead.
"""

from __future__ import annotations

import enum
import errno as errno_names
import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs
from attrs.validators import deep_iterable, ge, gt, instance_of, optional

from execkit._backoff import AGENT_BACKOFF
from execkit._classify import (
    ACCOUNT_LIMIT_REASONS,
    EVIDENCE_CHARS,
    Classification,
    FailureClass,
    Reason,
    classify,
    classify_text,
    is_upstream_status,
    stated_wait_s,
)
from execkit._errors import InvalidInput
from execkit._exec import Line, SpawnFailure, SpawnResult, StopTree
from execkit._json import json_key, to_json
from execkit._prices import load_prices, price
from execkit._redact import redact
from execkit._usage import Usage, UsdSource
from execkit._validate import checked, finite, integer, is_number, opt_checked

__all__ = [
    "LONG_WAIT_S",
    "NO_ENVELOPE",
    "Adapter",
    "AdapterWatch",
    "AgentRequest",
    "Envelope",
    "ErrorKind",
    "MappedResult",
    "adapter_watch",
    "billing_precondition",
    "credential_env_of",
    "credential_files_of",
    "credentials_precondition",
    "headline",
    "install_precondition",
    "map_result",
    "precondition_for",
    "priced",
    "resume_refused",
    "resumes_sessions",
    "trust_precondition",
    "usage_of",
]


class ErrorKind(enum.StrEnum):
    """What a vendor's structured output said a failure was (`Envelope.error_kind`).

    Only for what the adapter read from structure (an error type field, the CLI's own
    fixed error event), never from searching free text: `map_result` acts on it.

    | kind | class | meaning |
    |---|---|---|
    | `credentials` | environment | the vendor refused or lacks the credentials |
    | `billing` | environment | credit or quota exhausted (upstream if a reset is stated) |
    | `rate_limited` | upstream | a rate limit |
    | `usage_limit` | upstream | a plan's usage limit (waits for its reset when stated) |
    | `overloaded` | upstream | the vendor is at capacity |
    | `server_error` | upstream | the vendor's own server error type |
    | `stream_failed` | upstream | the vendor's stream broke off before it completed |
    | `unreachable` | upstream | the CLI's own connection-error event |
    | `retrying` | upstream | the CLI's last event was a retry notice (it ended retrying) |
    | `not_installed` | environment | the CLI's own launcher ran but says its program is not there |
    | `untrusted` | environment | the CLI refuses to work in a directory it does not trust |

    `not_installed` is for an npm or pip launcher that starts and then reports, in its own
    fixed words, that the platform binary it wraps is missing (crush's, amp's, droid's
    shims): the same precondition as a program not found on PATH, named with the install
    hint.
    """

    CREDENTIALS = "credentials"
    BILLING = "billing"
    RATE_LIMITED = "rate_limited"
    USAGE_LIMIT = "usage_limit"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    STREAM_FAILED = "stream_failed"
    UNREACHABLE = "unreachable"
    RETRYING = "retrying"
    NOT_INSTALLED = "not_installed"
    UNTRUSTED = "untrusted"


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


def _session_id(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    # A vendor session id goes into argv as one argument: no whitespace, no option look.
    if not (
        isinstance(value, str)
        and 0 < len(value) <= 200
        and value.isprintable()
        and not any(c.isspace() for c in value)
        and not value.startswith("-")
    ):
        raise ValueError(value)


@attrs.frozen
class AgentRequest:
    """One agent invocation, vendor-neutral.

    `timeout_s` is enforced by execkit (the process tree is killed), not by the vendor.
    `max_turns` is passed only to vendors that have such a flag; so is `max_budget_usd`
    (the most the CLI may spend, by its own count: claude's `--max-budget-usd`), a bound
    the CLI keeps itself, beside execkit's own (`run_agent(usage_limit=...)`).
    `extra_args` go before the prompt, verbatim. `env` is added to the inherited environment.
    `resume_session` is a vendor session id to continue (issue #46): an adapter that can
    resume (`resumes_sessions`) turns it into its CLI's own flag (claude `--resume ID`,
    codex `exec resume ID`); one that cannot ignores it and starts fresh.
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
    max_budget_usd: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number of USD > 0", finite, gt(0))
    )
    extra_args: tuple[str, ...] = attrs.field(
        default=(),
        converter=_as_args,
        validator=checked("only strings", deep_iterable(instance_of(str))),
    )
    env: Mapping[str, str] | None = attrs.field(default=None, eq=False, hash=False)
    resume_session: str | None = attrs.field(
        default=None,
        validator=opt_checked(
            "a session id: 1..200 printable characters, no whitespace", _session_id
        ),
    )

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
    `failure_class` is None exactly when `ok`; `precondition` names what is missing and
    how to fix it for environment (the binary and how to install it, the credentials and
    how to log in, the billing); `retry_after_s` is, for upstream only, the wait until a
    reset the vendor stated, if it stated one. `evidence` is the line the class was read
    from (masked, at most `EVIDENCE_CHARS`): the line of the output a text rule matched,
    the first line of the vendor's structured error (`Envelope.error_message`), the start
    failure; None when no line decided (a timeout or a failure nothing identified).
    `usage` is what the spawn cost as its CLI reported it (`Usage`: tokens by kind, USD and
    its source), failed, timed-out and killed spawns included (what the CLI printed before
    it ended); None when the CLI reported nothing. `cost_usd` is `usage.usd` when that is
    known (kept for callers that read only the money).
    """

    ok: bool
    # The vendor's words are stored and printed: redacted on construction.
    text: str | None = attrs.field(default=None, converter=attrs.converters.optional(redact))
    session_id: str | None = None
    cost_usd: float | None = None
    duration_s: float = 0.0
    error: str | None = attrs.field(default=None, converter=attrs.converters.optional(redact))
    spawn_errno: int | None = None
    failure_class: FailureClass | None = attrs.field(
        default=None,
        validator=[optional(instance_of(FailureClass)), _check_ok_has_no_class],
        metadata=json_key("class"),
    )
    reason: str | None = None
    precondition: str | None = attrs.field(
        default=None, converter=attrs.converters.optional(redact)
    )
    retry_after_s: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number of seconds >= 0", finite, ge(0))
    )
    timed_out: bool = False
    # `retry_after_s` came from the vendor's own reset field (`Envelope.reset_structured`).
    reset_from_structure: bool = False
    evidence: str | None = attrs.field(default=None, converter=attrs.converters.optional(redact))
    usage: Usage | None = attrs.field(default=None, validator=optional(instance_of(Usage)))

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
    has one (the final one: a retried status the CLI recovered from is not it).
    `error_message`: the vendor's own error text. `error_kind`: what the vendor's
    structured output said the failure was (`execkit.adapterkit.ErrorKind`: credentials,
    billing, a rate limit, a connection failure, a retry in progress...); set it only from
    structure, never from searching text. `retry_after_s`: a wait the vendor stated in a
    structured field (a `Retry-After` header, `resets_in_seconds`, `retryDelay`).
    `usage`: what the run cost as the CLI reported it (`Usage`, read from structure only:
    claude's `total_cost_usd` and `usage`, codex's `turn.completed` usage...); an adapter
    that sets only `cost_usd` gets a usage of that reported USD.
    `pending`: the error is one the CLI printed and had not given up on when its output
    ended (its last event was a retry or wait notice carrying a refusal: a rate limit it
    waits out, a 5xx it retries; or it stopped to ask for a login): a run killed on
    timeout then ended in the middle of that error, and the error's structure classes it
    (upstream, environment), not a silent timeout. Set it only from the CLI's own events.
    """

    found: bool = False
    is_error: bool = False
    text: str | None = None
    session_id: str | None = None
    cost_usd: float | None = None
    error_message: str | None = None
    http_status: int | None = None
    error_kind: ErrorKind | None = None
    retry_after_s: float | None = None
    pending: bool = False
    # The wait is the vendor's own reset field (Claude's `rate_limit_event.resetsAt`,
    # Gemini's `RetryInfo.retryDelay`, Codex's `resets_in_seconds`), not a time read from
    # its message: only such a reset may park a vendor lane (issue #28).
    reset_structured: bool = False
    # What the run cost as the CLI's structure reported it (tokens, USD): read from every
    # event the CLI printed, a failed or killed run's included. None: it reported nothing.
    usage: Usage | None = None


NO_ENVELOPE = Envelope()


def usage_of(envelope: Envelope) -> Usage | None:
    """The usage a mapped result carries: the envelope's `usage`; for an adapter that set
    only `cost_usd`, that USD as `reported`; None when the envelope says nothing of cost.
    A USD the adapter read into `cost_usd` but not into its usage is added to it as
    reported (the vendor printed it). Tokens reported without money are priced from the
    price table in force (`priced`), when it knows the model."""
    usage = _reported(envelope)
    return None if usage is None else priced(usage)


def priced(usage: Usage) -> Usage:
    """`usage` priced from the table in force (`execkit._prices.load_prices`: the built-in
    table and `EXECKIT_PRICES`). A price file that does not load leaves it unpriced here
    (the agent loop refuses that file before it spawns anything, with the error naming the
    key): a spawn that ran is never lost to it."""
    if usage.usd is not None or usage.tokens == 0:
        return usage
    try:
        table = load_prices()
    except InvalidInput:
        return usage
    return price(usage, table)


def _reported(envelope: Envelope) -> Usage | None:
    usage = envelope.usage
    cost = envelope.cost_usd
    if cost is not None and not (is_number(cost) and cost >= 0):
        cost = None  # not a figure we can store: the usage says what it knows without it
    if cost == 0 and usage is not None and usage.tokens > 0:
        cost = None  # a 0 beside tokens is a CLI that did not price them: unknown, not free
    if usage is None:
        return None if cost is None else Usage(usd=float(cost), usd_source=UsdSource.REPORTED)
    if usage.usd is None and cost is not None:
        return attrs.evolve(usage, usd=float(cost), usd_source=UsdSource.REPORTED)
    return usage


def _cost(envelope: Envelope, usage: Usage | None) -> float | None:
    """`MappedResult.cost_usd`: the usage's USD (None when unknown) when there is a usage,
    else what the adapter set."""
    if usage is not None:
        return usage.usd
    return envelope.cost_usd


def _tail(text: str, max_chars: int = _ERROR_CHARS) -> str:
    return text if len(text) <= max_chars else "…" + text[-(max_chars - 1) :]


def credential_env_of(adapter: object) -> tuple[str, ...]:
    """The adapter's `credential_env` (variable names), or () when it has none."""
    return _names(getattr(adapter, "credential_env", ()))


def resumes_sessions(adapter: object) -> bool:
    """Whether the adapter turns `AgentRequest.resume_session` into its CLI's resume flag
    (its optional `resumes_sessions` attribute; False when it has none: it starts fresh)."""
    return getattr(adapter, "resumes_sessions", False) is True


def resume_refused(adapter: object, failure_text: str | None) -> bool:
    """Whether a failed resumed run's text is the vendor refusing the session itself
    (unknown or expired id: the adapter's optional `resume_refused(text)`, read from the
    CLI's own fixed words); False when the adapter has no such method or it raises."""
    read = getattr(adapter, "resume_refused", None)
    if not callable(read) or not failure_text:
        return False
    try:
        return read(failure_text) is True
    except Exception:  # an adapter's bug must not turn a failure into a fresh start
        return False


def credential_files_of(adapter: object) -> tuple[str, ...]:
    """The adapter's `credential_files` (paths, `~` allowed), or () when it has none."""
    return _names(getattr(adapter, "credential_files", ()))


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, Iterable):
        return ()
    return tuple(item for item in value if isinstance(item, str) and item)


def _adapter_name(adapter: Adapter) -> str:
    return adapter.name or adapter.binary or "the vendor CLI"


def credentials_precondition(adapter: Adapter, reason: str) -> str:
    """What to fix when the vendor refused the credentials: its variables and login.

    `claude: the vendor refused the credentials or their permission (http 401); set
    ANTHROPIC_API_KEY, or log in: run `claude`, then /login`
    """
    fixes = []
    names = credential_env_of(adapter)
    if names:
        fixes.append("set " + " or ".join(names))
    if adapter.login_hint:
        fixes.append(f"log in: {adapter.login_hint}")
    fix = ", or ".join(fixes) or "check the credentials it is configured with"
    said = "" if reason == Reason.CREDENTIALS else f" ({reason})"
    return (
        f"{_adapter_name(adapter)}: the vendor refused the credentials or their "
        f"permission{said}; {fix}"
    )


def billing_precondition(adapter: Adapter, reason: str) -> str:
    """What to fix when the vendor's account has no credit or quota left (no reset).

    `billing: add credits or raise the quota for the claude account (http 402), then retry`
    """
    said = "" if reason == Reason.BILLING else f" ({reason})"
    return (
        f"billing: add credits or raise the quota for the {_adapter_name(adapter)} "
        f"account{said}, then retry"
    )


def install_precondition(adapter: Adapter) -> str:
    """What to fix when the CLI's launcher ran but its program is not installed.

    `crush CLI is not installed (its launcher ran, its program is missing); install: ...`
    """
    binary = adapter.binary or _adapter_name(adapter)
    fix = f"install: {adapter.install_hint}"
    if adapter.login_hint:
        fix += f"; then log in: {adapter.login_hint}"
    return f"{binary} CLI is not installed (its launcher ran, its program is missing); {fix}"


def trust_precondition(adapter: Adapter) -> str:
    """What to fix when the CLI refuses a working directory it does not trust: the
    adapter's optional `trust_hint`, else a generic sentence.

    `gemini: the CLI does not trust the working directory; set GEMINI_CLI_TRUST_WORKSPACE=true`
    """
    hint = getattr(adapter, "trust_hint", None)
    fix = hint if isinstance(hint, str) and hint else "mark it trusted in the CLI's settings"
    return f"{_adapter_name(adapter)}: the CLI does not trust the working directory; {fix}"


def precondition_for(adapter: Adapter, result: SpawnResult) -> str:
    """Name the program that could not be started, why, and how to fix it.

    `codex CLI not found on PATH; install: npm install -g @openai/codex; then log in: ...`;
    a program that is there but whose `#!` interpreter is missing, that is not executable
    (EACCES), not a program (ENOEXEC) or reached through a file (ENOTDIR) says so instead.
    """
    binary = adapter.binary or (os.path.basename(result.argv[0]) if result.argv else "the")
    install = f"install: {adapter.install_hint}"
    fix = install + (f"; then log in: {adapter.login_hint}" if adapter.login_hint else "")
    detail = (result.spawn_error or "").strip()
    seen = f": {detail}" if detail else ""
    failure = result.spawn_failure
    number = result.spawn_errno
    if failure is SpawnFailure.INTERPRETER_NOT_FOUND:
        return (
            f"{binary} CLI is installed but its interpreter is missing{seen}; install the "
            f"interpreter its #! line names (an npm-installed CLI needs node on PATH), or "
            f"reinstall: {adapter.install_hint}"
        )
    if failure is SpawnFailure.PERMISSION_DENIED or number == errno_names.EACCES:
        return (
            f"{binary} CLI is not executable (EACCES){seen}; make it executable "
            f"(chmod +x) or reinstall: {adapter.install_hint}"
        )
    if failure is SpawnFailure.EXEC_FORMAT or number == errno_names.ENOEXEC:
        return (
            f"{binary} CLI is not a program this machine can run (ENOEXEC){seen}; reinstall "
            f"it for this platform: {adapter.install_hint}"
        )
    if number == errno_names.ENOTDIR:
        return (
            f"{binary} CLI path runs through a file, not a directory (ENOTDIR){seen}; fix "
            f"the path or PATH, or {install}"
        )
    if number == errno_names.ENOENT:
        return f"{binary} CLI not found on PATH; {fix}"
    code = errno_names.errorcode.get(number or 0, str(number))
    return f"{binary} CLI could not be started ({code}); {fix}"


def headline(message: str | None) -> str | None:
    """The first non-blank line of a vendor's error message, cut to `EVIDENCE_CHARS`: the
    line a structured error is read from (its status, its type, its fixed sentence), never
    a later one (a stack frame, a help link, a retry notice)."""
    for line in (message or "").splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= EVIDENCE_CHARS else line[: EVIDENCE_CHARS - 1] + "…"
    return None


def _failed(
    result: SpawnResult,
    envelope: Envelope,
    failure_class: FailureClass,
    reason: str,
    error: str,
    precondition: str | None = None,
    retry_after_s: float | None = None,
    evidence: str | None = None,
) -> MappedResult:
    error = redact(_tail(error))
    upstream = failure_class is FailureClass.UPSTREAM
    usage = usage_of(envelope)
    return MappedResult(
        ok=False,
        text=envelope.text,
        session_id=envelope.session_id,
        cost_usd=_cost(envelope, usage),
        usage=usage,
        duration_s=result.duration_s,
        error=error or None,
        spawn_errno=result.spawn_errno,
        failure_class=failure_class,
        reason=reason,
        precondition=precondition,
        retry_after_s=retry_after_s if upstream else None,
        timed_out=result.timed_out,
        # Both callers take the envelope's wait first: when it has one, the wait is it.
        reset_from_structure=upstream
        and retry_after_s is not None
        and envelope.retry_after_s is not None
        and envelope.reset_structured,
        evidence=evidence,
    )


def _from_verdict(
    result: SpawnResult, envelope: Envelope, verdict: Classification, error: str
) -> MappedResult:
    # The classifier's evidence is the line its deciding rule matched (None: nothing did).
    return _failed(
        result,
        envelope,
        verdict.failure_class,
        verdict.reason,
        error,
        retry_after_s=verdict.retry_after_s,
        evidence=verdict.evidence,
    )


def _not_started(adapter: Adapter, result: SpawnResult, envelope: Envelope) -> MappedResult:
    verdict = classify(result)
    if verdict is None:  # pragma: no cover - the classifier classes every failure
        return _failed(result, envelope, FailureClass.WORK, "failed", result.failure_text())
    precondition = None
    if verdict.failure_class is FailureClass.ENVIRONMENT:
        cwd = verdict.reason in (Reason.MISSING_CWD, Reason.UNUSABLE_CWD)
        precondition = (
            (result.spawn_error or "working directory not usable").strip()
            if cwd
            else precondition_for(adapter, result)
        )
    error = result.failure_text(_ERROR_CHARS) or (precondition or "")
    return _failed(
        result,
        envelope,
        verdict.failure_class,
        verdict.reason,
        error,
        precondition,
        evidence=headline(result.spawn_error),
    )


# The upstream kinds and the reason each gives when no upstream status is there to name.
_UPSTREAM_KINDS = {
    ErrorKind.RATE_LIMITED: Reason.RATE_LIMITED,
    ErrorKind.USAGE_LIMIT: Reason.USAGE_LIMIT,
    ErrorKind.OVERLOADED: Reason.OVERLOADED,
    ErrorKind.SERVER_ERROR: Reason.SERVER_ERROR,
    ErrorKind.STREAM_FAILED: Reason.STREAM_FAILED,
    ErrorKind.UNREACHABLE: Reason.UNREACHABLE,
    ErrorKind.RETRYING: Reason.STILL_RETRYING,
}
# A CLI killed on timeout while its last event was one of these was still retrying.
_STILL_TRYING = frozenset({ErrorKind.RETRYING, ErrorKind.UNREACHABLE})


def _status_class(status: int) -> FailureClass:
    if status in (401, 402, 403):
        return FailureClass.ENVIRONMENT
    return FailureClass.UPSTREAM if is_upstream_status(status) else FailureClass.WORK


def _reason(status: int | None, failure_class: FailureClass, otherwise: str) -> str:
    """`http N` when the status itself says this class, else the kind's own reason."""
    if status is not None and _status_class(status) is failure_class:
        return f"http {status}"
    return otherwise


@attrs.frozen
class _Decided:
    failure_class: FailureClass
    reason: str
    precondition: str | None = None  # "credentials", "billing", "install" or "trust"


def _structured(
    kind: ErrorKind | None, status: int | None, text: Classification, wait: float | None
) -> _Decided | None:
    """The class the vendor's structured fields give, or None when they give none."""
    env, up, work = FailureClass.ENVIRONMENT, FailureClass.UPSTREAM, FailureClass.WORK
    if kind is ErrorKind.NOT_INSTALLED:
        return _Decided(env, Reason.MISSING_BINARY, "install")
    if kind is ErrorKind.UNTRUSTED:
        return _Decided(env, Reason.UNTRUSTED, "trust")
    if kind is ErrorKind.CREDENTIALS or status in (401, 403):
        return _Decided(env, _reason(status, env, Reason.CREDENTIALS), "credentials")
    if kind is ErrorKind.BILLING or status == 402:
        if wait is not None:  # a quota that resets at a stated time: wait for it
            return _Decided(up, _reason(status, up, Reason.USAGE_LIMIT))
        return _Decided(env, _reason(status, env, Reason.BILLING), "billing")
    if kind in _UPSTREAM_KINDS:
        return _Decided(up, _reason(status, up, _UPSTREAM_KINDS[kind]))
    if status is None:
        return None
    if text.failure_class is work and text.reason in ACCOUNT_LIMIT_REASONS:
        # The message names an account limit and states no reset: no backoff cures it and
        # nothing structured said billing, so it charges (as the text list says).
        return _Decided(work, text.reason)
    return _Decided(up if is_upstream_status(status) else work, f"http {status}")


def map_result(
    adapter: Adapter,
    result: SpawnResult,
    envelope: Envelope = NO_ENVELOPE,
    *,
    now: float | None = None,
) -> MappedResult:
    """Map one spawn and the vendor's parsed envelope to a `MappedResult`.

    Order, most durable signal first:
    1. a spawn errno (never started): the classifier's structural rule; environment
       (ENOENT, EACCES, ENOEXEC, ENOTDIR, a missing working directory) carries
       `precondition_for` (or the working directory's own sentence).
    2. a timeout or a signal: upstream when the CLI was killed on timeout while its last
       event was a retry or reconnect notice (`error_kind` retrying or unreachable: the
       uncharged ceiling bounds it); an error the envelope marks `pending` (the CLI was
       still waiting out a refusal, or waiting for a login, when it was killed), and the
       envelope of an adapter's `watch` that stopped the CLI (`result.stopped_by`: it
       announced a wait longer than `LONG_WAIT_S`), go on to step 3 as if the CLI had
       reported it; else the classifier's verdict.
    3. the envelope reported an error (or the failed process's envelope carried one): the
       structured fields decide. Credentials (`error_kind` credentials, status 401/403) are
       environment naming the vendor's variables and login; billing (`error_kind` billing,
       status 402) is environment naming the billing fix, unless a reset is stated (then
       upstream, waiting for it); the other kinds are upstream; a status 429 or 500-599 is
       upstream and any other status work, except that a message naming an account limit
       with no reset charges; `not_installed` is environment naming the install. Without
       any of them, `classify_text` on the vendor's message. This holds whatever the exit
       code: a CLI that exits 0 after a refusal (`is_error` set) has failed.
    4. the process failed otherwise: the classifier on the tail of its output.
    5. exit 0 and no envelope error: success; the reply is the envelope text, or stdout.

    An upstream result carries `retry_after_s`: the envelope's structured wait, else a
    reset the message states (`now` is the clock for absolute resets, default now).
    """
    if result.spawn_errno is not None:
        return _not_started(adapter, result, envelope)

    # A CLI killed on timeout while its last words were an error it had not given up on
    # (`pending`: a refusal it was waiting out or retrying, a login it stopped to ask for)
    # ended in the middle of that error: its structure decides, below.
    pending = result.timed_out and envelope.pending
    pending = pending and (envelope.error_kind is not None or envelope.http_status is not None)
    # Stopped by the adapter's own watch: the envelope it read from the line is the error.
    pending = pending or (result.stopped_by is not None and envelope.is_error)
    if (result.timed_out or result.signal is not None) and not pending:
        if result.timed_out and envelope.error_kind in _STILL_TRYING:
            message = envelope.error_message or result.failure_text(_ERROR_CHARS)
            status = envelope.http_status
            kind_reason = _UPSTREAM_KINDS[envelope.error_kind]
            up = FailureClass.UPSTREAM
            wait = envelope.retry_after_s
            return _failed(
                result,
                envelope,
                up,
                _reason(status, up, kind_reason),
                message,
                None,
                wait,
                headline(envelope.error_message),
            )
        verdict = classify(result, now=now)
        if verdict is None:  # pragma: no cover - the classifier classes every failure
            return _failed(result, envelope, FailureClass.WORK, "failed", result.failure_text())
        return _from_verdict(result, envelope, verdict, result.failure_text(_ERROR_CHARS))

    failed_envelope = envelope.error_message or envelope.error_kind is not None
    if envelope.is_error or (not result.ok and failed_envelope):
        message = envelope.error_message or result.failure_text(_ERROR_CHARS)
        verdict = classify_text(message, now=now)
        wait = envelope.retry_after_s
        if wait is None:
            wait = stated_wait_s(message, now=now)
        decided = _structured(envelope.error_kind, envelope.http_status, verdict, wait)
        if decided is None:
            return _from_verdict(result, envelope, verdict, message)
        precondition = None
        if decided.precondition == "credentials":
            precondition = credentials_precondition(adapter, decided.reason)
        elif decided.precondition == "billing":
            precondition = billing_precondition(adapter, decided.reason)
        elif decided.precondition == "install":
            precondition = install_precondition(adapter)
        elif decided.precondition == "trust":
            precondition = trust_precondition(adapter)
        return _failed(
            result,
            envelope,
            decided.failure_class,
            decided.reason,
            message,
            precondition,
            wait,
            # Read from the vendor's structure: its error's own first line says it.
            headline(envelope.error_message) or verdict.evidence,
        )

    if not result.ok:
        verdict = classify(result, now=now)
        if verdict is None:  # pragma: no cover - not ok always classes
            return _failed(result, envelope, FailureClass.WORK, "failed", result.failure_text())
        return _from_verdict(result, envelope, verdict, result.failure_text(_ERROR_CHARS))

    text = envelope.text if envelope.found else result.stdout_tail.strip()
    usage = usage_of(envelope)
    return MappedResult(
        ok=True,
        text=text,
        session_id=envelope.session_id,
        cost_usd=_cost(envelope, usage),
        duration_s=result.duration_s,
        usage=usage,
    )


# --- reading the output as it is printed --------------------------------------------------

LONG_WAIT_S = AGENT_BACKOFF.max_s
"""The longest wait a CLI may sleep out inside an attempt (60 s): an adapter's `watch`
ends the attempt when its CLI announces a longer one.

Why this bound: it is the in-agent loop's own backoff ceiling (`AGENT_BACKOFF.max_s`),
beyond which `run_agent` hands a vendor's stated wait to the durable scheduler instead of
sleeping it. A CLI's own short retry is worth keeping (it keeps its session, its context
and its place in the turn, and costs no new admission); a longer one holds a slot, and the
vendor lane stays open, for as long as the vendor asked every caller to wait: a daily limit
would hold every slot for hours. Handed back, the attempt is `upstream` with that reset and
the lane parks until it."""


def _watch_of(adapter: object) -> Any:
    watch = getattr(adapter, "watch", None)
    return watch if callable(watch) else None


@attrs.define
class AdapterWatch:
    """One spawn of an adapter that reads its CLI's output as it is printed.

    `on_line` is the spawn's line hook (`spawn(on_line=...)`): each line goes to the
    adapter's `watch(line)`, which returns None, or an `Envelope` saying the CLI announced
    a wait it should not sleep out in the attempt (`is_error`, the kind, `retry_after_s`
    and, when the wait is the vendor's or the CLI's fixed announcement of it,
    `reset_structured`). The first envelope stops the tree (`StopTree`), and `parse` maps
    the stopped spawn from that envelope (with the usage the adapter's own `parse` reads
    from the output, when the envelope carries none); any other spawn is the adapter's own
    `parse`.
    An adapter's `watch` that raises is the spawn's exception (the tree is killed first).
    """

    adapter: Adapter
    _watch: Any
    envelope: Envelope | None = None

    def on_line(self, line: Line) -> StopTree | None:
        """The line hook: the adapter reads `line`; its first envelope stops the tree."""
        if self.envelope is not None:
            return None
        envelope = self._watch(line)
        if envelope is None:
            return None
        if not isinstance(envelope, Envelope) or not envelope.is_error:
            raise TypeError(
                f"{_adapter_name(self.adapter)}.watch must return None or an Envelope with "
                f"is_error set, got {envelope!r}"
            )
        self.envelope = envelope
        wait = envelope.retry_after_s
        said = "" if wait is None else f" of {wait:g} s"
        return StopTree(
            f"{_adapter_name(self.adapter)} announced a wait{said}, longer than an attempt "
            f"sleeps ({LONG_WAIT_S:g} s): stopped to hand it back"
        )

    def parse(self, result: SpawnResult) -> MappedResult:
        """The stopped spawn mapped from the watch's envelope; else the adapter's `parse`."""
        if result.stopped_by is not None and self.envelope is not None:
            # The watch's envelope is the error; what the CLI cost before it announced the
            # wait is in its output, read as the adapter reads it.
            spent = self.envelope.usage or self.adapter.parse(result).usage
            return map_result(self.adapter, result, attrs.evolve(self.envelope, usage=spent))
        return self.adapter.parse(result)


def adapter_watch(adapter: Adapter) -> AdapterWatch | None:
    """The `AdapterWatch` of an adapter with a `watch` method, else None (the spawn then
    takes no line hook and costs what it did)."""
    watch = _watch_of(adapter)
    return None if watch is None else AdapterWatch(adapter, watch)
