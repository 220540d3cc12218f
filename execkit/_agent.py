"""The in-agent loop: one agent, a few spawns, and the proof of what happened (ADR 0046).

`run_agent` retries a spawn-level failure up to its own `max_attempts`:

- environment breaks the loop at once: a missing binary is never re-spawned in one run;
- upstream retries after a capped exponential backoff with jitter, or after the wait the
  vendor asked for (`Retry-After`, "try again in N s") when that wait is within the
  backoff's `max_s`; a longer one (a usage limit resetting in hours) stops the loop at
  once and the proof carries `retry_after_s`, so the durable scheduler waits instead;
- work retries straight away; a schema-gate failure (`validate` rejected the reply)
  retries with the validation error appended to the original prompt.

The try after an uncharged failure is told its prior was `lost`, never `workflow_error`,
and gets no cause derived from the failed proof: a 503's text is not "your code errored".

The proof is recorded (on the explicit `recorder`, else the current `RunRecorder`) before
`AgentFailed` is raised, so a caller that swallows the failure cannot erase its class. An
exception from inside the loop (a hook, the adapter) is recorded as a charged work failure
before it propagates, for the same reason.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import os
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from execkit._adapter import Adapter, AgentRequest, MappedResult, adapter_watch
from execkit._backoff import AGENT_BACKOFF, Backoff
from execkit._classify import FailureClass, stall_reason
from execkit._errors import InvalidInput
from execkit._exec import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KILL_GRACE_S,
    Cancellation,
    Line,
    LineHook,
    ProcessStarter,
    SpawnCancelled,
    SpawnResult,
    StopTree,
    spawn,
)
from execkit._meter import (
    SPEND_LIMIT_REASON,
    STOPPED_BY_METER,
    UsageLimit,
    UsageMeter,
    usage_reader,
)
from execkit._prices import PriceTable, load_prices, price
from execkit._proof import (
    AgentFailed,
    AgentProof,
    AgentStatus,
    RunProof,
    RunStatus,
    agent_failure,
)
from execkit._redact import redact, secret_env_values
from execkit._trace import attempt_span
from execkit._usage import Usage, UsdSource
from execkit._validate import integer_arg, number_arg

if TYPE_CHECKING:
    from collections.abc import Awaitable

__all__ = [
    "MAX_AGENT_ATTEMPTS",
    "AttemptContext",
    "PriorOutcome",
    "RunRecorder",
    "cancellable_sleep",
    "context_after",
    "current_recorder",
    "run_agent",
    "run_agent_async",
    "run_command",
    "run_in_thread",
    "stall_timeout_of",
]

_T = TypeVar("_T")

MAX_AGENT_ATTEMPTS = 100

# Vendors print whole JSON envelopes; keep enough of stdout that a large reply still parses.
_ENVELOPE_TAIL_BYTES = 4 * 1024 * 1024
# How much of a failed try's error the next try may be told (workflow_error only), and
# how much of an exception raised inside the loop its proof keeps.
_CAUSE_CHARS = 2000

_SCHEMA_RETRY = (
    "\n\nYour previous reply was rejected by the output schema check:\n{error}\n"
    "Reply again, following the required format exactly."
)


# --- attempt context --------------------------------------------------------------------


class PriorOutcome(enum.StrEnum):
    """What the previous try of this agent told us, as handed to the next try."""

    LOST = "lost"  # uncharged: it never touched the work (environment, upstream)
    WORKFLOW_ERROR = "workflow_error"  # charged: the agent ran and its result failed


@attrs.frozen
class AttemptContext:
    """What one try is told about the tries before it.

    `prior_cause` is set only for `workflow_error`: an uncharged prior carries no cause,
    because its text (a 503 page, a missing binary) says nothing about the work.
    """

    attempt: int
    max_attempts: int
    prior_outcome: PriorOutcome | None = None
    prior_cause: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.prior_outcome is not PriorOutcome.WORKFLOW_ERROR and self.prior_cause:
            raise InvalidInput(
                "prior_cause is only given for a workflow_error prior", field="prior_cause"
            )

    ENV_NAMES = (
        "EXECKIT_ATTEMPT",
        "EXECKIT_MAX_ATTEMPTS",
        "EXECKIT_PRIOR_OUTCOME",
        "EXECKIT_PRIOR_CAUSE",
    )
    """Every variable `to_env` may set."""

    def to_env(self) -> dict[str, str]:
        """`EXECKIT_ATTEMPT`, `EXECKIT_MAX_ATTEMPTS`, `EXECKIT_PRIOR_OUTCOME` and, for a
        workflow_error prior, `EXECKIT_PRIOR_CAUSE`: what the spawned agent can read."""
        env = {
            "EXECKIT_ATTEMPT": str(self.attempt),
            "EXECKIT_MAX_ATTEMPTS": str(self.max_attempts),
        }
        if self.prior_outcome is not None:
            env["EXECKIT_PRIOR_OUTCOME"] = self.prior_outcome.value
        if self.prior_cause:
            env["EXECKIT_PRIOR_CAUSE"] = self.prior_cause
        return env


def context_after(
    failure_class: FailureClass | None,
    cause: str | None,
    *,
    attempt: int,
    max_attempts: int,
) -> AttemptContext:
    """The context for try `attempt`, given how the previous try failed.

    A work failure (or an unclassed one: it charges) is `workflow_error` with its cause,
    redacted and tail-bounded; any uncharged class is `lost` with no cause; no prior
    failure (`failure_class` None and no cause) gives no prior outcome.
    """
    if failure_class is None and cause is None:
        return AttemptContext(attempt, max_attempts)
    if failure_class is not None and not failure_class.charged:
        return AttemptContext(attempt, max_attempts, PriorOutcome.LOST, None)
    bounded = None
    if cause:
        bounded = redact(cause if len(cause) <= _CAUSE_CHARS else "…" + cause[-_CAUSE_CHARS:])
    return AttemptContext(attempt, max_attempts, PriorOutcome.WORKFLOW_ERROR, bounded)


# --- run recorder -----------------------------------------------------------------------

_CURRENT: contextvars.ContextVar[RunRecorder | None] = contextvars.ContextVar(
    "execkit_run_recorder", default=None
)


def current_recorder() -> RunRecorder | None:
    """The recorder of the innermost `with RunRecorder():` block in this context."""
    return _CURRENT.get()


class RunRecorder:
    """Collects the proof of every agent of one run, as each is made (thread-safe).

    Use it as a context manager to make it the default for `run_agent` in this context
    (threads started inside do not inherit it: pass `recorder=` or copy the context).
    `finish` builds the RunProof whose class is derived from what was recorded.
    """

    def __init__(self, run_id: str | None = None) -> None:
        self.id = run_id or uuid.uuid4().hex
        self._agents: list[AgentProof] = []
        self._lock = threading.Lock()
        self._tokens: list[contextvars.Token[RunRecorder | None]] = []

    def record(self, proof: AgentProof) -> None:
        with self._lock:
            self._agents.append(proof)

    @property
    def agents(self) -> tuple[AgentProof, ...]:
        with self._lock:
            return tuple(self._agents)

    def finish(self, error: BaseException | str | None = None) -> RunProof:
        """The run's proof: failed with `error` when one is given, else succeeded."""
        if error is None:
            return RunProof(id=self.id, status=RunStatus.SUCCEEDED, agents=self.agents)
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return RunProof(id=self.id, status=RunStatus.FAILED, agents=self.agents, error=message)

    def __enter__(self) -> RunRecorder:
        self._tokens.append(_CURRENT.set(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _CURRENT.reset(self._tokens.pop())


# --- the loop ---------------------------------------------------------------------------


@attrs.frozen
class _Try:
    """One spawn's outcome as the loop sees it (a schema rejection turns ok into work)."""

    raw: MappedResult
    failure_class: FailureClass | None
    reason: str | None
    error: str | None
    schema_error: str | None = None


def _judge(raw: MappedResult, validate: Callable[[str], str | None] | None) -> _Try:
    if not raw.ok:
        return _Try(raw, raw.failure_class or FailureClass.WORK, raw.reason, raw.error)
    if validate is not None:
        problem = validate(raw.text or "")
        if problem:
            return _Try(raw, FailureClass.WORK, "schema", problem, schema_error=problem)
    return _Try(raw, None, None, None)


def _child_env(request: AgentRequest, context: AttemptContext) -> dict[str, str]:
    env = {**os.environ, **(request.env or {})}
    # An execkit run inside an agent inherits that agent's context: a stale prior outcome
    # or cause must not reach this try, so the context variables are all replaced.
    for name in AttemptContext.ENV_NAMES:
        env.pop(name, None)
    env.update(context.to_env())
    return env


@attrs.frozen
class _Spend:
    """What a run's tries know of its cost: the price table in force (checked before the
    first spawn), the request's model (prices a CLI's tokens when its events name none),
    and the caller's `usage_limit` with what earlier tries spent."""

    table: PriceTable
    model: str | None = None
    limit: UsageLimit | None = None
    spent: Usage | None = None

    def price(self, usage: Usage) -> Usage:
        """`usage` priced from the table, by its own model or else the request's."""
        if usage.usd is not None or usage.tokens == 0:
            return usage
        if usage.model is None and self.model:
            usage = attrs.evolve(usage, model=self.model)
        return price(usage, self.table)

    def crossed(self, so_far: Usage) -> bool:
        """The limit on the agent's spend: earlier tries' plus this try's so far, priced."""
        assert self.limit is not None
        total = so_far if self.spent is None else self.spent + so_far
        return bool(self.limit(self.price(total)))


def _hooks(*hooks: LineHook | None) -> LineHook | None:
    """One line hook that calls each of `hooks` in turn; the first `StopTree` is the
    answer (every hook still reads the line)."""
    present = [hook for hook in hooks if hook is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def both(line: Line) -> StopTree | None:
        answer = None
        for hook in present:
            said = hook(line)
            if answer is None:
                answer = said
        return answer

    return both


class _InFlight:
    """Whether the CLI has a vendor request in flight, as its adapter reads the stream.

    The adapter's optional `request_in_flight(line)` answers True (from this line on a
    request to the vendor is open: the CLI sent it and nothing of the answer came back),
    False (the vendor answered, or the CLI went on to other work) or None (the line says
    neither); the last answer stands. An adapter without the method never says so: a
    stalled run of it is `work`.
    """

    def __init__(self, read: Callable[[Line], object]) -> None:
        self._read = read
        self.open = False

    def on_line(self, line: Line) -> StopTree | None:
        said = self._read(line)
        if said is not None:
            self.open = said is True
        return None


def _in_flight_reader(adapter: Adapter) -> _InFlight | None:
    read = getattr(adapter, "request_in_flight", None)
    return _InFlight(read) if callable(read) else None


def stall_timeout_of(adapter: Adapter, asked: float | None) -> float | None:
    """The stall timeout a spawn of `adapter` gets: `asked` (the options'), else the
    adapter's own default (`stall_timeout_s`, None or > 0), else none. Raises
    `InvalidInput` naming the adapter's attribute when its default is not a number > 0."""
    if asked is not None:
        return asked
    default = getattr(adapter, "stall_timeout_s", None)
    if default is None:
        return None
    return number_arg(f"{adapter.name}.stall_timeout_s", default, allow_zero=False)


def _stalled(raw: MappedResult, result: SpawnResult, in_flight: bool) -> MappedResult:
    """A spawn its stall watchdog stopped: `work` (charged: nothing identified why it fell
    silent) unless its adapter read that a vendor request was in flight, then `upstream`
    (the vendor left it waiting). What the adapter's parse kept (session, usage) stays."""
    assert result.stalled_after_s is not None
    reason = stall_reason(result.stalled_after_s)
    if in_flight:
        reason += " (a vendor request in flight)"
    return attrs.evolve(
        raw,
        ok=False,
        text=None,
        duration_s=result.duration_s,
        error=f"{reason}\n{result.failure_text(_CAUSE_CHARS)}".strip(),
        failure_class=FailureClass.UPSTREAM if in_flight else FailureClass.WORK,
        reason=reason,
        retry_after_s=None,
        reset_from_structure=False,
        precondition=None,
        evidence=None,
    )


def _spawn_once(
    adapter: Adapter,
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout_s: float | None,
    kill_grace: float,
    start: ProcessStarter,
    beat: _Beat | None = None,
    cancel: Cancellation | None = None,
    spend: _Spend | None = None,
    stall_timeout_s: float | None = None,
) -> MappedResult:
    # An adapter that reads its CLI's output as it is printed (`watch`) stops a CLI that
    # announces it will sleep out a long limit; others take no line hook at all, unless
    # a stall watchdog runs and the adapter reads whether a vendor request is in flight.
    watching = adapter_watch(adapter)
    in_flight = None if stall_timeout_s is None else _in_flight_reader(adapter)
    # With a spend limit, an adapter that reads usage per line (`usage_of`) is metered
    # as it runs and stopped within one usage event of crossing it; without one, the
    # usage is read once, from the output, at the end (no per-line cost).
    read = usage_reader(adapter)
    meter = None
    if spend is not None and spend.limit is not None and read is not None:
        meter = UsageMeter(read, spend.crossed)
    result = spawn(
        list(argv),
        cwd=cwd,
        env=env,
        timeout=timeout_s,
        kill_grace=kill_grace,
        tail_bytes=_ENVELOPE_TAIL_BYTES,
        on_line=_hooks(
            None if watching is None else watching.on_line,
            None if meter is None else meter.on_line,
            None if in_flight is None else in_flight.on_line,
        ),
        heartbeat=None if beat is None else beat.renew,
        heartbeat_s=DEFAULT_HEARTBEAT_S if beat is None else beat.every_s,
        start=start,
        cancel=cancel,
        stall_timeout=stall_timeout_s,
    )
    raw = adapter.parse(result) if watching is None else watching.parse(result)
    if result.stalled_after_s is not None:
        raw = _stalled(raw, result, in_flight is not None and in_flight.open)
    # Stopped by the meter, not by the watch, nor crossing only as the CLI ended by itself
    # (a stop asked after the exit changes nothing: the try keeps its own outcome).
    stopped = meter is not None and meter.crossed is not None
    stopped = stopped and (result.stopped_by or "").startswith(STOPPED_BY_METER)
    return _with_usage(raw, meter, spend, stopped=stopped)


def _with_usage(
    raw: MappedResult, meter: UsageMeter | None, spend: _Spend | None, *, stopped: bool
) -> MappedResult:
    """The try's result with its usage: the meter's or the parse's, whichever counted
    more tokens, priced; a try the limit `stopped` is a charged work failure with reason
    `SPEND_LIMIT_REASON` (the caller's cap decides what it means)."""
    usage = raw.usage
    # The meter read every line, the parse the output's tail (long runs' early events may
    # be gone) whole (a hooked line is cut at 8 KiB): the larger reading is the one that
    # missed less.
    if meter is not None and meter.events and (usage is None or meter.total.tokens > usage.tokens):
        usage = meter.total
    if usage is not None and spend is not None:
        usage = spend.price(usage)
    if usage is raw.usage and not stopped:
        return raw
    cost = raw.cost_usd if usage is None else usage.usd
    if not stopped or meter is None or meter.crossed is None:
        return attrs.evolve(raw, usage=usage, cost_usd=cost)
    crossed = spend.price(meter.crossed) if spend is not None else meter.crossed
    return attrs.evolve(
        raw,
        ok=False,
        failure_class=FailureClass.WORK,
        reason=SPEND_LIMIT_REASON,
        error=f"stopped: the spend limit was crossed at {_spent(crossed)}",
        retry_after_s=None,
        reset_from_structure=False,
        precondition=None,
        evidence=None,
        usage=usage,
        cost_usd=cost,
    )


def _spent(usage: Usage) -> str:
    money = "unknown USD" if usage.usd is None else f"${usage.usd:.4f} ({usage.usd_source})"
    return f"{money}, {usage.tokens} tokens"


@attrs.frozen
class _Beat:
    """A run's lease renewal: `renew()` every `every_s` while a try runs or waits."""

    renew: Callable[[], object]
    every_s: float

    def sleep(self, sleep: Callable[[float], None], seconds: float) -> None:
        """`sleep(seconds)` in slices of at most `every_s`, renewing before each, so a
        backoff longer than a lease does not let it lapse."""
        left = seconds
        while True:
            self.renew()
            if left <= 0:
                return
            piece = min(left, self.every_s)
            sleep(piece)
            left -= piece


def _check_limit(limit: object) -> UsageLimit | None:
    if limit is not None and not callable(limit):
        raise TypeError(f"usage_limit must be callable or None, got {type(limit).__name__}")
    return limit


def _check_beat(heartbeat: object, heartbeat_s: object) -> _Beat | None:
    if heartbeat is None:
        return None
    if not callable(heartbeat):
        raise TypeError(f"heartbeat must be callable or None, got {type(heartbeat).__name__}")
    return _Beat(heartbeat, number_arg("heartbeat_s", heartbeat_s, allow_zero=False))


def _sum_costs(tries: Sequence[_Try]) -> float | None:
    costs = [t.raw.cost_usd for t in tries if t.raw.cost_usd is not None]
    return sum(costs) if costs else None


def _sum_usage(tries: Sequence[_Try]) -> Usage | None:
    """What the agent's spawns cost together; None when none reported any.

    A spawn that started and reported nothing (its CLI prints no usage, or it was killed
    before it printed any) cost an unknown amount: the sum's USD source is then `unknown`
    (the known part kept), never a total that reads as complete."""
    reported = [t.raw.usage for t in tries if t.raw.usage is not None]
    if not reported:
        return None
    total = reported[0]
    for usage in reported[1:]:
        total = total + usage
    silent = any(t.raw.usage is None and t.raw.spawn_errno is None for t in tries)
    if silent and total.usd_source is not UsdSource.UNKNOWN:
        total = attrs.evolve(total, usd_source=UsdSource.UNKNOWN)
    return total


def _proof(
    adapter: Adapter,
    tries: Sequence[_Try],
    *,
    model: str | None,
    label: str | None,
    started: float,
    secrets: Sequence[str],
) -> AgentProof:
    last = tries[-1]
    common: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "harness": adapter.name,
        "label": label,
        "model": model,
        "attempts": len(tries),
        "duration_s": max(0.0, time.monotonic() - started),
        "cost_usd": _sum_costs(tries),
        "usage": _sum_usage(tries),
        "session_id": next((t.raw.session_id for t in reversed(tries) if t.raw.session_id), None),
    }
    if last.failure_class is None:
        return AgentProof(status=AgentStatus.SUCCEEDED, output=last.raw.text, **common)
    # Any try that touched the work makes the agent's failure informative: it charges.
    classes = [t.failure_class for t in tries]
    agent_class = FailureClass.WORK if FailureClass.WORK in classes else last.failure_class
    decisive = next(t for t in reversed(tries) if t.failure_class is agent_class)
    # A precondition is what to fix before retrying: it belongs only to an agent that
    # stopped on the environment, never to a charged one (a consumer acts on it).
    precondition = decisive.raw.precondition if agent_class is FailureClass.ENVIRONMENT else None
    # A reset the vendor stated is when to retry: only an uncharged upstream agent has one.
    wait = decisive.raw.retry_after_s if agent_class is FailureClass.UPSTREAM else None
    error = decisive.error
    # The line the class was read from; a schema rejection's reason is its own message.
    evidence = decisive.raw.evidence if decisive.schema_error is None else None
    return AgentProof(
        status=AgentStatus.FAILED,
        failure_class=agent_class,
        reason=decisive.reason,
        error=redact(error, secrets) if error else None,
        precondition=precondition,
        retry_after_s=wait,
        reset_from_structure=wait is not None and decisive.raw.reset_from_structure,
        evidence=redact(evidence, secrets) if evidence else None,
        **common,
    )


def _record(proof: AgentProof, recorder: RunRecorder | None) -> None:
    target = recorder if recorder is not None else current_recorder()
    if target is not None:
        target.record(proof)


def _settle(
    proof: AgentProof, recorder: RunRecorder | None, clock: Callable[[], float] = time.time
) -> AgentProof:
    """Record first, then raise: the class must survive a caller that swallows the error.
    The error is the subclass of the proof's class (`agent_failure`); `clock` dates an
    upstream failure's `reset_at`."""
    _record(proof, recorder)
    if proof.status is AgentStatus.FAILED:
        raise agent_failure(proof, now=clock())
    return proof


def run_agent(
    adapter: Adapter,
    request: AgentRequest,
    *,
    max_attempts: int = 2,
    backoff: Backoff = AGENT_BACKOFF,
    sleep: Callable[[float], None] = time.sleep,
    rng: Callable[[], float] = random.random,
    validate: Callable[[str], str | None] | None = None,
    prepare: Callable[[AgentRequest, AttemptContext], AgentRequest] | None = None,
    recorder: RunRecorder | None = None,
    label: str | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    heartbeat: Callable[[], object] | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    start: ProcessStarter = subprocess.Popen,
    cancel: Cancellation | None = None,
    clock: Callable[[], float] = time.time,
    usage_limit: UsageLimit | None = None,
    stall_timeout_s: float | None = None,
) -> AgentProof:
    """Run one agent through `adapter`, retrying spawn-level failures; return its proof.

    `validate(reply)` is the schema gate: it returns an error message to reject a reply
    (retried with the message appended to the prompt) or None to accept it. `prepare`
    may rewrite the request for each try given its `AttemptContext` (the spawned agent
    also sees the context as `EXECKIT_*` environment variables). `sleep` and `rng` are
    injectable so tests neither sleep nor depend on chance; `start` is how each try's
    process is started (`spawn`'s seam: a test passes `fake_vendor.start`).
    `heartbeat` renews the ledger run this agent works for (`lambda:
    ledger.heartbeat(run.id)`): it is called every `heartbeat_s` (> 0) while a try runs
    and through every backoff wait between tries, so the run's lease never lapses while
    the agent is alive; if it raises, the running try is ended and the error propagates
    like a hook's (below).

    `stall_timeout_s` (None or > 0; None takes the adapter's `stall_timeout_s`, if any):
    a try that prints no byte on stdout or stderr for that long has its whole tree
    stopped, and is `work` ("stalled: no output for S s") unless the adapter read from
    the stream that a vendor request was in flight (its `request_in_flight(line)`), then
    `upstream`.

    `cancel` (a `Cancellation`) stops the agent from another thread: the running try's
    whole tree is killed, no further try starts, and `SpawnCancelled` propagates with
    nothing recorded (the caller knows why it stopped the agent).

    `usage_limit(usage) -> bool` bounds what the agent may spend while it runs: each try
    of an adapter that reads usage per printed line (`usage_of`) is metered as its CLI
    prints (a `UsageMeter` on the spawn's line hook), and after each usage event the limit
    is asked about the agent's usage so far (earlier tries included; tokens priced from
    the price table, by the event's model or the request's); True stops the try's whole
    tree within that one event, and the agent ends there: a failed work proof with reason
    `"spend limit"` and the usage it reached (the caller's cap decides whether that
    charges). An adapter without `usage_of` is bounded only at the end of each try.
    Every proof carries the agent's `usage` (every try's, summed; see `AgentProof`).

    Raises `AgentFailed` (carrying the proof, already recorded) when the last try
    failed: always the subclass of the proof's class, `WorkFailure`, `EnvironmentFailure`
    or `UpstreamFailure` (whose `reset_at` is `clock()` plus the vendor's stated wait, in
    POSIX seconds); `InvalidInput` for `max_attempts` outside 1..100, `heartbeat_s` <= 0
    or a price file (`EXECKIT_PRICES`) that does not load (naming the key), before
    anything runs.
    Anything else that raises inside the loop (`validate`, `prepare`, the adapter, a
    request the adapter cannot express) propagates unchanged, after a failed work proof
    (reason `error`) is recorded.
    """
    integer_arg("max_attempts", max_attempts, 1, MAX_AGENT_ATTEMPTS)
    beat = _check_beat(heartbeat, heartbeat_s)
    if stall_timeout_s is not None:
        number_arg("stall_timeout_s", stall_timeout_s, allow_zero=False)
    stall = stall_timeout_of(adapter, stall_timeout_s)
    spend = _Spend(load_prices(), request.model, _check_limit(usage_limit))
    started = time.monotonic()
    secrets = secret_env_values({**os.environ, **(request.env or {})})
    tries: list[_Try] = []
    try:
        _try_until_settled(
            adapter,
            request,
            tries,
            max_attempts=max_attempts,
            backoff=backoff,
            sleep=sleep,
            rng=rng,
            validate=validate,
            prepare=prepare,
            kill_grace=kill_grace,
            start=start,
            beat=beat,
            cancel=cancel,
            spend=spend,
            stall_timeout_s=stall,
        )
    except SpawnCancelled:
        # Stopped from outside (a dispatcher's shutdown, a cancelled task): the try that
        # was running says nothing about the work, and the caller decides what to record.
        raise
    except Exception as exc:
        # A hook, an adapter or the request broke mid-loop. Nothing identified the failure
        # as uncharged, so the agent is recorded as a charged work failure before the
        # error propagates: a caller that swallows it cannot leave the run without it.
        tries.append(_crashed(exc))
        _record(
            _proof(
                adapter, tries, model=request.model, label=label, started=started, secrets=secrets
            ),
            recorder,
        )
        raise
    proof = _proof(
        adapter, tries, model=request.model, label=label, started=started, secrets=secrets
    )
    return _settle(proof, recorder, clock)


def run_agent_async(
    adapter: Adapter,
    request: AgentRequest,
    *,
    max_attempts: int = 2,
    backoff: Backoff = AGENT_BACKOFF,
    sleep: Callable[[float], None] | None = None,
    rng: Callable[[], float] = random.random,
    validate: Callable[[str], str | None] | None = None,
    prepare: Callable[[AgentRequest, AttemptContext], AgentRequest] | None = None,
    recorder: RunRecorder | None = None,
    label: str | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    heartbeat: Callable[[], object] | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    start: ProcessStarter = subprocess.Popen,
    clock: Callable[[], float] = time.time,
    usage_limit: UsageLimit | None = None,
    stall_timeout_s: float | None = None,
) -> Awaitable[AgentProof]:
    """`run_agent` for asyncio runners: same arguments (but `cancel`), same proof, same
    errors; the loop runs in a thread of its own (the hooks, `heartbeat` too, run there),
    in a copy of the caller's context, so the current `RunRecorder` still records.

    Cancelling the awaiting task stops the agent: the running try's whole tree is killed,
    no further try starts, and `CancelledError` propagates once the tree is gone, with
    nothing recorded (as `run_agent` after a cancel). `sleep` (the backoff between tries)
    defaults to a wait that the cancel ends. Arguments are checked before the coroutine is
    returned: InvalidInput raises at the call, not at the await.
    """
    integer_arg("max_attempts", max_attempts, 1, MAX_AGENT_ATTEMPTS)
    _check_beat(heartbeat, heartbeat_s)
    load_prices()
    _check_limit(usage_limit)
    if stall_timeout_s is not None:
        number_arg("stall_timeout_s", stall_timeout_s, allow_zero=False)
    cancel = Cancellation()
    context = contextvars.copy_context()

    def call() -> AgentProof:
        return context.run(
            run_agent,
            adapter,
            request,
            max_attempts=max_attempts,
            backoff=backoff,
            sleep=cancellable_sleep(cancel) if sleep is None else sleep,
            rng=rng,
            validate=validate,
            prepare=prepare,
            recorder=recorder,
            label=label,
            kill_grace=kill_grace,
            heartbeat=heartbeat,
            heartbeat_s=heartbeat_s,
            start=start,
            cancel=cancel,
            clock=clock,
            usage_limit=usage_limit,
            stall_timeout_s=stall_timeout_s,
        )

    async def running() -> AgentProof:
        try:
            return await run_in_thread(call, cancel)
        finally:
            cancel.close()

    return running()


def cancellable_sleep(cancel: Cancellation) -> Callable[[float], None]:
    """A `sleep` that ends early when `cancel` is cancelled (the next try then does not
    start): the async forms' default backoff wait."""

    def nap(seconds: float) -> None:
        cancel.wait(seconds)

    return nap


async def run_in_thread(call: Callable[[], _T], cancel: Cancellation) -> _T:
    """Await `call()` run in a thread of its own (not the loop's executor: an agent holds
    its thread for minutes, and a runner may run many at once).

    Cancelling the awaiting task cancels `cancel` and waits for the thread to end (the
    work stops its tree and raises `SpawnCancelled`), then raises `CancelledError`: when
    it propagates, nothing of the agent is left running. A second cancel while waiting
    stops the wait, not the stop. What `call` raises is raised here.
    """
    import asyncio  # only asyncio runners pay for importing it

    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def deliver(result: _T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]  # set only on success

    def work() -> None:
        result: _T | None = None
        error: BaseException | None = None
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting task, never lost
            error = exc
        # The loop may be closed by now (its task was abandoned): nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=work, name="execkit-agent", daemon=True).start()
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancel.cancel()
        # Wait for the tree to be gone (the work raises SpawnCancelled, or ends anyway).
        with contextlib.suppress(BaseException):
            await asyncio.shield(future)
        raise


def _crashed(exc: Exception) -> _Try:
    # The head names the exception; a hook's message may be as long as the reply it quotes.
    error = f"{type(exc).__name__}: {exc}"[:_CAUSE_CHARS]
    raw = MappedResult(ok=False, error=error, failure_class=FailureClass.WORK, reason="error")
    return _Try(raw, FailureClass.WORK, "error", error)


def _try_until_settled(
    adapter: Adapter,
    request: AgentRequest,
    tries: list[_Try],
    *,
    max_attempts: int,
    backoff: Backoff,
    sleep: Callable[[float], None],
    rng: Callable[[], float],
    validate: Callable[[str], str | None] | None,
    prepare: Callable[[AgentRequest, AttemptContext], AgentRequest] | None,
    kill_grace: float,
    start: ProcessStarter,
    beat: _Beat | None = None,
    cancel: Cancellation | None = None,
    spend: _Spend | None = None,
    stall_timeout_s: float | None = None,
) -> None:
    """Spawn tries, appending each to `tries`, until one settles the agent.

    Settled: a success, an environment failure (never re-spawned), an upstream failure
    whose vendor asked for a wait longer than `backoff.max_s` (the scheduler waits for
    it, not this loop), or `max_attempts` tries. Upstream waits `backoff` (or the
    vendor's asked-for wait, when within `max_s`) first.
    """
    current = request
    context = AttemptContext(1, max_attempts)
    upstream_retries = 0
    while True:
        if cancel is not None and cancel.cancelled:
            raise SpawnCancelled(f"cancelled before try {len(tries) + 1}")
        attempt_request = prepare(current, context) if prepare is not None else current
        # A span per try for runners that trace (_trace: a no-op without OpenTelemetry).
        with attempt_span(adapter.name, len(tries) + 1, max_attempts) as span:
            raw = _spawn_once(
                adapter,
                adapter.build_argv(attempt_request),
                cwd=attempt_request.cwd,
                env=_child_env(attempt_request, context),
                timeout_s=attempt_request.timeout_s,
                kill_grace=kill_grace,
                start=start,
                beat=beat,
                cancel=cancel,
                spend=spend,
                stall_timeout_s=stall_timeout_s,
            )
            outcome = _judge(raw, validate)
            failure = outcome.failure_class
            span.outcome(
                failure.value if failure else None,
                failure is None or failure.charged,
                outcome.reason,
            )
        tries.append(outcome)
        if failure is None or failure is FailureClass.ENVIRONMENT or len(tries) >= max_attempts:
            return
        if raw.reason == SPEND_LIMIT_REASON and raw.failure_class is FailureClass.WORK:
            return  # stopped by the spend limit: another try would spend past it again
        if spend is not None and raw.usage is not None:
            spend = attrs.evolve(
                spend, spent=raw.usage if spend.spent is None else spend.spent + raw.usage
            )
        if failure is FailureClass.UPSTREAM:
            wait = raw.retry_after_s
            if wait is not None and wait > backoff.max_s:
                return  # a reset beyond this loop's patience: the proof carries it
            upstream_retries += 1
            delay = backoff.delay(upstream_retries, retry_after_s=wait, rng=rng)
            if beat is None:
                sleep(delay)
            else:
                beat.sleep(sleep, delay)
        # A schema rejection re-asks the original prompt with the latest error appended;
        # any other failure re-asks the original prompt unchanged.
        current = (
            request.with_prompt(request.prompt + _SCHEMA_RETRY.format(error=outcome.schema_error))
            if outcome.schema_error
            else request
        )
        context = context_after(
            failure, outcome.error, attempt=len(tries) + 1, max_attempts=max_attempts
        )


def run_command(
    adapter: Adapter,
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    timeout_s: float | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    label: str | None = None,
    recorder: RunRecorder | None = None,
    start: ProcessStarter = subprocess.Popen,
    stall_timeout_s: float | None = None,
) -> AgentProof:
    """Spawn `argv` once as given (no retry), read it through `adapter`; return the proof.

    For surfaces that pass vendor arguments through (`execkit run --adapter`). `start`
    is how the process is started (`spawn`'s seam); `stall_timeout_s` is `run_agent`'s.
    Never raises for a failed agent: the
    proof's status and class say what happened. Raises InvalidInput for an empty argv or
    a timeout that is not > 0.
    """
    if not argv:
        raise InvalidInput(
            "argv must not be empty: it needs at least the program to run", field="argv"
        )
    if timeout_s is not None:
        number_arg("timeout_s", timeout_s, allow_zero=False)
    if stall_timeout_s is not None:
        number_arg("stall_timeout_s", stall_timeout_s, allow_zero=False)
    started = time.monotonic()
    raw = _spawn_once(
        adapter,
        argv,
        cwd=cwd,
        env=None,
        timeout_s=timeout_s,
        kill_grace=kill_grace,
        start=start,
        stall_timeout_s=stall_timeout_of(adapter, stall_timeout_s),
    )
    proof = _proof(
        adapter,
        [_judge(raw, None)],
        model=None,
        label=label,
        started=started,
        secrets=secret_env_values(os.environ),
    )
    try:
        return _settle(proof, recorder)
    except AgentFailed as failed:
        return failed.proof
