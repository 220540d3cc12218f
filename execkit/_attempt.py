"""One attempt of a ledger task, end to end: the runner author's one call (issue #32).

`run_attempt(ledger, task_id, adapter, request)` does what the dispatcher does for one issue,
without a board:

1. admit: `start_run` with a request key (deterministic per attempt unless one is given:
   `attempt:<task>:<n>`), a lease and the run's vendor lane, in the ledger's one
   transaction. A run the key replays that is not this process's to run (another runner
   admitted it) is a `Conflict`; nothing is written for it;
2. run: `run_agent` with the lease kept alive by one renewer (a storage hiccup is logged
   and left to the next beat; a `Conflict`, the run abandoned meanwhile, stops the agent);
3. finish: `finish_run` with the class, the reason (the precondition for environment,
   else the class reason and the last line of the error), the vendor's reset time
   (`not_before`), what the vendor's structure said of the lane and the vendor session the
   agent ran in (`session_id`, issue #46: the task's next attempt, in any process, resumes
   it after an upstream refusal, `resumable_session`), as the proof carries them
   (`outcome_of`, written by `record_outcome`);
4. tell: an `AttemptOutcome` with the run's result and what the ledger decided next
   (done; retry at `next_attempt_at`; blocked on what, with the fix).

Failures of the agent are outcomes, never exceptions. What raises:

- the ledger's refusals, before anything runs and with nothing written: `NotFound` (no such
  task), `TaskFinished`, `TaskBlocked`, `AttemptLimitReached`, `TaskBackingOff`,
  `LaneWaiting` and `LaneStopped` (the run's vendor lane does not admit), and
  `Conflict` (a request key that admitted a run of another task or another actor, or a
  run another runner is running);
- `SpawnCancelled` (sync) or `asyncio.CancelledError` (async) after a cancel: the agent's
  whole tree was killed and the run finished `abandoned` with the stop's reason;
- anything a hook, the adapter or the lease renewal raised mid-run, after the run was
  finished as a charged work failure (reason `runner error`) where the ledger still
  takes it; a ledger that cannot take the result (`StorageError`) leaves the run to its
  lease, and the next admission abandons it.

The dispatcher runs each issue through the same pieces (`attempt_agent`, `outcome_of`,
`record_outcome`, `record_stopped`, `runner_error`, `adapter_lane`): it adds the board,
not another way to turn a proof into a ledger write.

The async forms run the same code in a thread of their own (the ledger and the agent block),
so an asyncio runner needs no executor of its own; cancelling the awaiting task stops the
agent through a `Cancellation` and waits for the tree to be gone before `CancelledError`
propagates.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from typing import Any, Literal

import attrs
from attrs.validators import ge, gt, instance_of, is_callable, le, optional

from execkit._adapter import (
    Adapter,
    AgentRequest,
    credential_env_of,
    credential_files_of,
    resume_refused,
    resumes_sessions,
)
from execkit._agent import (
    MAX_AGENT_ATTEMPTS,
    RunRecorder,
    cancellable_sleep,
    run_agent,
    run_in_thread,
)
from execkit._backoff import AGENT_BACKOFF, Backoff
from execkit._budget import AttemptStatus, BlockedOn, DispatchCap, TaskState
from execkit._classify import FailureClass, Reason
from execkit._errors import Conflict, ExecKitError, InvalidInput, StorageError
from execkit._exec import DEFAULT_KILL_GRACE_S, Cancellation, ProcessStarter, SpawnCancelled
from execkit._lanes import LaneKey, lane_for
from execkit._meter import SPEND_LIMIT_REASON, UsageLimit
from execkit._proof import AgentFailed, AgentProof, RunStatus
from execkit._redact import redact
from execkit._usage import Usage
from execkit._validate import checked, finite, integer, opt_checked
from execkit.ledger import (
    DEFAULT_LEASE_S,
    LANES_CAPABILITY,
    SESSIONS_CAPABILITY,
    SPEND_CAPABILITY,
    SPEND_ROOM_CAPABILITY,
    Actor,
    Ledger,
    Run,
    RunOwner,
    SpendRoom,
    Task,
    current_owner,
)

__all__ = [
    "AUTO_LANE",
    "CANCELLED_REASON",
    "RUNNER_ACTOR",
    "AttemptOptions",
    "AttemptOutcome",
    "RunOutcome",
    "SpendGuard",
    "adapter_lane",
    "announced",
    "attempt_agent",
    "attempt_resuming",
    "failure_detail",
    "lane_cause",
    "last_line",
    "outcome_of",
    "record_outcome",
    "record_stopped",
    "resumable_session",
    "resume_line",
    "resumed_after",
    "run_attempt",
    "run_attempt_async",
    "runner_error",
    "session_after",
    "spend_guard",
    "with_spend_stop",
]

_log = logging.getLogger("execkit.attempt")

RUNNER_ACTOR = "runner"
"""The actor `run_attempt` records on the runs it starts unless told another."""

CANCELLED_REASON = "cancelled by its caller"
"""The reason recorded on a run whose agent was stopped through `cancel=` (or a cancelled
asyncio task), unless the caller names its own (`stop_reason=`)."""

_MAX_DETAIL = 160


def last_line(text: str | None) -> str | None:
    """The last non-blank line of `text`, cut to 160 characters: the detail kept with a
    failure's reason (for the operator, not for parsing)."""
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    return line if len(line) <= _MAX_DETAIL else line[: _MAX_DETAIL - 1] + "…"


@attrs.frozen
class AttemptOutcome:
    """How one attempt ended, and what the ledger decided next.

    About the run: `status` (succeeded, failed or abandoned), `failure_class` (None for a
    success; an unclassed failure is recorded as work), `charged`, `reason` as stored,
    `precondition` (environment: what is missing and how to fix it), `not_before` (the
    vendor's reset time, POSIX seconds) and the agent's `proof` (a stopped agent makes none:
    it raises instead of returning an outcome).

    About the task, read back after the run was finished: `state` (done, ready, backoff or
    blocked), `blocked_on`, `next_attempt_at` and `decision` (the ledger's reason for the
    state). `retry_at` and `fix` say the same as a runner needs it.
    """

    task_id: str
    run_id: str
    attempt: int
    status: AttemptStatus
    failure_class: FailureClass | None
    charged: bool
    reason: str | None
    precondition: str | None
    not_before: float | None
    proof: AgentProof
    state: TaskState
    blocked_on: BlockedOn | None
    next_attempt_at: float | None
    decision: str | None

    @property
    def succeeded(self) -> bool:
        return self.status is AttemptStatus.SUCCEEDED

    @property
    def retry_at(self) -> float | None:
        """When the next attempt may be admitted (POSIX seconds), or None when the task is
        done or blocked. A ready task may start now: its `next_attempt_at`."""
        if self.state in (TaskState.READY, TaskState.BACKOFF):
            return self.next_attempt_at
        return None

    @property
    def fix(self) -> str | None:
        """What a human must do before the task runs again, when it is blocked: the
        precondition for an environment stop, else the ledger's reason (which names the
        bound and how to lift it). None when the task is not blocked."""
        if self.state is not TaskState.BLOCKED:
            return None
        if self.blocked_on is BlockedOn.ENVIRONMENT and self.precondition:
            return self.precondition
        return self.decision


def _to_status(value: object) -> RunStatus:
    if isinstance(value, str) and value in RunStatus.__members__.values():
        return RunStatus(value)
    raise InvalidInput(f"status must be 'succeeded' or 'failed', got {value!r}", field="status")


def _redact_text(value: str | None) -> str | None:
    return redact(value) if isinstance(value, str) else value


@attrs.frozen
class RunOutcome:
    """How one run of an agent ended, as the ledger records it: the one value both
    `run_attempt` and the dispatcher's runners produce and `record_outcome` writes.

    `failure_class` is None for a success; a failure with no class is a charged work
    failure. `precondition` names what is missing (environment: binary and install hint).
    `detail` is a short line of the failure text, kept for the operator. `not_before` is the
    vendor's reset time, when it named one: the next attempt is not before it.
    `lane_cause` is what the vendor's structure said of the run's vendor lane (the ledger
    parks or stops the lane on it: `reset`, `credentials`, `billing`, `binary_missing`);
    never set from free text. `session_id` is the vendor session the agent ran in (its
    proof's), which the next attempt resumes after an upstream refusal (issue #46);
    `resumed_session` the session this attempt resumed, and `resume_refused` that the vendor
    refused it (unknown or expired) and the attempt started fresh instead, uncharged.
    `window_stop` is why a spend window's cap stopped the run while it ran (issue #45,
    `with_spend_stop`): the run is recorded as stopped by its runner (abandoned,
    uncharged), with its cost, and its task waits for the window to reopen.
    """

    status: RunStatus = attrs.field(converter=_to_status)
    failure_class: FailureClass | None = None
    # Redacted here: a custom runner's text reaches events and logs, not only the ledger.
    reason: str | None = attrs.field(default=None, converter=_redact_text)
    precondition: str | None = attrs.field(default=None, converter=_redact_text)
    detail: str | None = attrs.field(default=None, converter=_redact_text)
    not_before: float | None = None
    lane_cause: str | None = None
    # What the run cost, as its CLI reported it (issue #45), failed runs included; None
    # when nothing was read (a custom runner's outcome, an agent that never started).
    usage: Usage | None = attrs.field(default=None, validator=optional(instance_of(Usage)))
    session_id: str | None = None
    resumed_session: str | None = None
    resume_refused: bool = False
    window_stop: str | None = attrs.field(default=None, converter=_redact_text)

    def __attrs_post_init__(self) -> None:
        if self.status is RunStatus.SUCCEEDED and self.failure_class is not None:
            raise InvalidInput(
                "failure_class must be None for a succeeded outcome", field="failure_class"
            )

    @property
    def charged(self) -> bool:
        """True unless the failure is positively classed as uncharged (ADR 0046) or a
        spend window stopped the run."""
        if self.window_stop is not None:
            return False
        return self.failure_class is None or self.failure_class.charged

    def ledger_reason(self) -> str | None:
        """The reason stored on the run: the precondition for environment (what to fix),
        else the class reason with the detail line."""
        if self.status is RunStatus.SUCCEEDED:
            return None
        if self.window_stop is not None:
            return self.window_stop
        if self.precondition:
            return self.precondition
        parts = [p for p in (self.reason, self.detail) if p]
        return ": ".join(parts) or None


# Environment reasons that belong to the vendor lane (the account or the host), not the task.
_LANE_STOPS = {
    Reason.CREDENTIALS: "credentials",
    "http 401": "credentials",
    "http 403": "credentials",
    Reason.BILLING: "billing",
    "http 402": "billing",
    Reason.MISSING_BINARY: "binary_missing",
}


def lane_cause(adapter: Adapter, proof: AgentProof, not_before: float | None) -> str | None:
    """What a failed agent's proof says of its vendor lane, from structure only: a reset
    from the vendor's own field parks it; refused credentials, billing, or the vendor's
    CLI missing on this host stop it. The generic adapter runs any program, so a missing
    one is that issue's alone."""
    klass = proof.effective_class
    if klass is FailureClass.UPSTREAM:
        return "reset" if not_before is not None and proof.reset_from_structure else None
    if klass is not FailureClass.ENVIRONMENT or proof.reason is None:
        return None
    cause = _LANE_STOPS.get(proof.reason)
    if cause == "binary_missing" and adapter.name == "generic":
        return None
    return cause


def failure_detail(proof: AgentProof) -> str | None:
    """The line kept with a failed agent's reason: the line its class was read from
    (`AgentProof.evidence`), cut to 160 characters; when no line decided (a timeout, a
    failure nothing identified), the failure's last line. Never a line beside the one that
    decided: a start-up diagnostic printed after a usage limit is not its reason."""
    if proof.evidence:
        return last_line(proof.evidence)
    return last_line(proof.error)


def outcome_of(adapter: Adapter, proof: AgentProof, clock: Callable[[], float]) -> RunOutcome:
    """The run's outcome from the agent's proof: its class, reason, precondition, the line
    the class was read from (`failure_detail`), the vendor's reset as a time (`clock() +
    retry_after_s`, upstream only) and what it says of the lane."""
    if proof.productive:
        return RunOutcome(RunStatus.SUCCEEDED, usage=proof.usage, session_id=proof.session_id)
    failure_class = proof.effective_class
    wait = proof.retry_after_s
    not_before = None
    if failure_class is FailureClass.UPSTREAM and wait is not None:
        not_before = clock() + wait
    return RunOutcome(
        RunStatus.FAILED,
        failure_class=failure_class,
        reason=proof.reason,
        precondition=proof.precondition,
        detail=failure_detail(proof),
        not_before=not_before,
        lane_cause=lane_cause(adapter, proof, not_before),
        usage=proof.usage,
        session_id=proof.session_id,
    )


def resumed_after(runs: Iterable[Run], run: Run) -> str | None:
    """What the session `run` resumed was stopped by (issue #46): the class reason of the
    task's previous attempt ("usage limit", "overloaded"), without its detail line; None
    for a run that resumed nothing or whose previous attempt is not in `runs`."""
    if run.resumed_session is None:
        return None
    before = [r for r in runs if r.attempt < run.attempt and r.reason]
    if not before:
        return None
    reason = max(before, key=lambda r: r.attempt).reason or ""
    return reason.split(": ", 1)[0] or None


def session_after(runs: Sequence[Run]) -> str | None:
    """The vendor session the task's next attempt resumes, read from its history alone
    (issue #46): the session its last run ran in (`Run.session_id`) when that run ended
    on an `upstream` refusal; None after anything else (a `work` failure starts clean, an
    `environment` one too, a success needs none, an abandoned or stopped run proved
    nothing) and when the run named no session. Exactly once per refusal: the refusal's
    run is the last one, so no attempt resumed it yet; the attempt that does is the last
    run after it, and only its own refusal (a new one) is resumed again. `runs` in attempt
    order, as `Ledger.runs` gives them."""
    if not runs:
        return None
    last = runs[-1]
    upstream = (
        last.status is AttemptStatus.FAILED
        and last.failure_class is FailureClass.UPSTREAM
        and not last.stopped
    )
    return last.session_id if upstream else None


def resumable_session(ledger: Ledger, task_id: str, adapter: str, *, now: float) -> str | None:
    """The vendor session an attempt of `task_id` on `adapter` resumes, decided from the
    ledger (issue #46), so whichever process runs the attempt (a restarted dispatcher,
    another host, `run_attempt`) resumes it alike: `session_after` the task's runs, on the
    adapter its refusal was met on only (a vendor session never crosses vendors: the
    adapter of the last run's lane; a ledger without lanes records none, and then the
    session is the issue's one adapter's). None when there is nothing to resume."""
    session = session_after(ledger.runs(task_id))
    if session is None:
        return None
    if LANES_CAPABILITY in ledger.capabilities():
        lane = ledger.task_lane(task_id, now=now)
        if lane is not None and LaneKey.parse(lane.lane).adapter != adapter:
            return None
    return session


def attempt_resuming(
    adapter: Adapter,
    request: AgentRequest,
    resume: str | None,
    attempt: Callable[[AgentRequest], AgentProof],
) -> tuple[AgentProof, str | None, bool]:
    """Run one attempt's agent (`attempt(request)`), resuming the vendor session `resume`
    when the adapter can (`resumes_sessions`): the proof, the session actually resumed
    (None for a fresh start) and whether the vendor refused it (unknown or expired: the
    adapter's `resume_refused` reads its words), in which case the same attempt started
    fresh and only that fresh start is the proof (the refused spawn is not the attempt's
    outcome: uncharged). The dispatcher's runner and `run_attempt` alike."""
    resume = resume if resumes_sessions(adapter) else None
    proof = attempt(attrs.evolve(request, resume_session=resume))
    refused = (
        resume is not None
        and not proof.productive
        and resume_refused(adapter, "\n".join(t for t in (proof.error, proof.evidence) if t))
    )
    if refused:
        proof = attempt(attrs.evolve(request, resume_session=None))
    return proof, resume, refused


def resume_line(session_id: str, after: str | None, *, refused: bool = False) -> str:
    """The operator's words for a resumed run: "resumed session ID after the usage limit"
    (and, when the vendor refused it, that the attempt started fresh)."""
    # "after the usage limit", "after the rate limit", "after http 429"
    after = "rate limit" if after == "rate limited" else after
    words = (
        ""
        if not after
        else f" after {after}"
        if after.startswith("http ")
        else f" after the {after}"
    )
    said = f"resumed session {session_id}{words}"
    if refused:
        said += " (the vendor refused it: started fresh, uncharged)"
    return said


def announced(runs: Iterable[Run], run: Run) -> list[str]:
    """What `run`, of the task whose runs are `runs`, said of itself for the operator
    (issue #46): the fallback it was (`Run.fell_back`), then the session it resumed and
    after what (`resume_line`); nothing for a run that did neither. `task show` says it
    for each run, `status` for an active issue's latest."""
    said = [run.fell_back] if run.fell_back is not None else []
    if run.resumed_session is not None:
        said.append(resume_line(run.resumed_session, resumed_after(runs, run)))
    return said


def runner_error(exc: BaseException) -> RunOutcome:
    """The outcome of a run whose runner, hook or adapter raised: not positively identified
    as uninformative, so a charged work failure (ADR 0046) with the error's last line."""
    return RunOutcome(
        RunStatus.FAILED,
        failure_class=FailureClass.WORK,
        reason="runner error",
        detail=last_line(f"{type(exc).__name__}: {exc}"),
    )


def record_outcome(ledger: Ledger, run_id: str, outcome: RunOutcome, *, now: float) -> Run:
    """Finish `run_id` with `outcome`: the one write of a run's result, for `run_attempt`
    and the dispatcher alike. Raises what `finish_run` raises (`Conflict` for a run that
    ended meanwhile, `StorageError`)."""
    failed = outcome.status is RunStatus.FAILED
    usage = outcome.usage if outcome.usage is not None and outcome.usage.known else None
    if usage is not None and SPEND_CAPABILITY not in ledger.capabilities():
        usage = None  # a server older than spend keeps the result, not its cost
    session = outcome.session_id
    if session is not None and SESSIONS_CAPABILITY not in ledger.capabilities():
        session = None  # an older server keeps the result; the resume is this process's
    if outcome.window_stop is not None:
        # Stopped by a window's cap, not by the work: uncharged, as its runner stopped it.
        return ledger.finish_run(
            run_id,
            AttemptStatus.ABANDONED,
            reason=outcome.window_stop,
            now=now,
            stopped=True,
            usage=usage,
            session_id=session,
        )
    return ledger.finish_run(
        run_id,
        AttemptStatus(outcome.status),
        failure_class=outcome.failure_class if failed else None,
        reason=outcome.ledger_reason(),
        not_before=outcome.not_before if failed else None,
        now=now,
        lane_cause=outcome.lane_cause if failed else None,
        usage=usage,
        session_id=session,
    )


def record_stopped(ledger: Ledger, run_id: str, reason: str, *, now: float) -> None:
    """Finish a run its own runner stopped before the agent ended: `abandoned`, `stopped`,
    uncharged. A ledger that cannot take it leaves the run to its lease (the next admission
    abandons it), so nothing is raised."""
    with suppress(ExecKitError):
        ledger.finish_run(run_id, AttemptStatus.ABANDONED, reason=reason, now=now, stopped=True)


class SpendGuard:
    """A running run held to its spend caps while it runs (issue #45): `crossed` is the
    `usage_limit` its agent's meter asks after each usage event.

    It knows the run's room (`SpendRoom`: its reservation); while the run's spend stays
    within it, nothing is asked. Past it, the ledger is asked once (`spend_room`): it
    grows the reservation when every cap still has room, or answers the stop, kept in
    `stopped`, and `crossed` says True: the meter stops the whole tree within that event.
    A ledger that cannot answer (`StorageError`) is logged and asked again at the next
    event (a hiccup must not kill a run); anything else it raises (`Conflict`: the run
    is no longer running) propagates and stops the agent.
    """

    __slots__ = ("_clock", "_ledger", "_run_id", "asked", "room", "stopped")

    def __init__(
        self, ledger: Ledger, run_id: str, room: SpendRoom, clock: Callable[[], float]
    ) -> None:
        self._ledger = ledger
        self._run_id = run_id
        self._clock = clock
        self.room = room
        self.stopped: SpendRoom | None = None
        self.asked = 0  # calls to the ledger past the room (the first one's not counted)

    def crossed(self, spent: Usage) -> bool:
        if self.stopped is not None:
            return True
        if self.room.allows(spent.usd, spent.tokens):
            return False
        self.asked += 1
        try:
            room = self._ledger.spend_room(self._run_id, spent=spent, now=self._clock())
        except StorageError as exc:
            _log.warning("run %s: its spend was not checked: %s", self._run_id, exc.message)
            return False
        self.room = room
        if room.stop is None:
            return False
        self.stopped = room
        return True


def spend_guard(ledger: Ledger, run_id: str, clock: Callable[[], float]) -> SpendGuard | None:
    """The `SpendGuard` of admitted run `run_id`, or None when no cap applies to it (or
    the ledger cannot hold caps while a run goes: an older server): then the run is not
    metered at all. One read of the ledger; what it raises propagates (the caller has
    not started the agent)."""
    if SPEND_ROOM_CAPABILITY not in ledger.capabilities():
        return None
    room = ledger.spend_room(run_id, now=clock())
    return None if room.unlimited else SpendGuard(ledger, run_id, room, clock)


def with_spend_stop(outcome: RunOutcome, guard: SpendGuard | None) -> RunOutcome:
    """`outcome` as the cap that stopped its run says (issue #45): the task's own budget
    keeps it a charged work failure, its detail naming the budget and the command that
    raises it (the task is then blocked on `spend`); a window's cap makes it a stop
    (`window_stop`, uncharged), the task waiting for the window. Any other outcome is
    returned as it is."""
    stop = None if guard is None else guard.stopped
    if stop is None or stop.stop is None or outcome.reason != SPEND_LIMIT_REASON:
        return outcome
    if stop.by_task:
        return attrs.evolve(outcome, detail=stop.stop, not_before=None, lane_cause=None)
    return attrs.evolve(
        outcome,
        failure_class=None,
        detail=None,
        not_before=None,
        lane_cause=None,
        window_stop=f"stopped: {stop.stop}",
    )


def adapter_lane(adapter: Adapter, *, ledger_id: str, env: Mapping[str, str]) -> str:
    """The vendor lane a run of `adapter` with `env` uses on the ledger `ledger_id`: the
    adapter's name and the keyed fingerprint of the credentials it would read (never the
    credentials themselves)."""
    return str(
        lane_for(
            adapter.name,
            key=ledger_id,
            env=env,
            credential_env=credential_env_of(adapter),
            credential_files=credential_files_of(adapter),
        )
    )


AUTO_LANE: Literal["auto"] = "auto"
"""`run_attempt(lane=AUTO_LANE)`, the default: the adapter's lane on this ledger, when the
ledger keeps lanes (`vendor.lanes`); no lane otherwise."""


def _no_bool(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool):
        raise TypeError(f"{attribute.name}: a bool")


def _seconds(bound: str, *limits: Any) -> Any:
    return checked(f"a finite number of seconds {bound}", _no_bool, finite, *limits)


def _callable(kind: str) -> Any:
    return checked(kind, is_callable())


def _actor_like(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, Actor | str) or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{attribute.name}: not an actor")


@attrs.frozen
class AttemptOptions:
    """How an attempt is run, as one checked value (issue #46): what `run_attempt`,
    `run_attempt_async` and the dispatcher's `AdapterRunner` share, built once and passed
    whole (`run_attempt(ledger, task_id, adapter, request, options)`), changed with
    `attrs.evolve`. Every field has the default the keywords had.

    Admission: `actor`, `forced`, `lease_s` (> 0; renewed every `lease_s / 3`), `cap` (also
    applied when the decision is read back) and `lane` (`AUTO_LANE`: the adapter's lane on
    this ledger when it keeps lanes; None for none; or a lane's name). The agent:
    `agent_attempts` (1..100, `run_agent`'s `max_attempts`: the ledger owns retries, so
    the in-agent loop does not also re-spawn by default), `validate`, `label`, `backoff`,
    `kill_grace` (>= 0 s), `stall_timeout_s` (None, or > 0 s: no byte on stdout or stderr
    for that long stops the agent's whole tree, the attempt `work` with reason "stalled:
    no output for S s" unless the adapter read that a vendor request was in flight, then
    `upstream`; None takes the adapter's own `stall_timeout_s`, if it has one) and
    `start` (`spawn`'s seam). `stop_reason` is recorded on a run stopped through a
    cancel. The clocks: `clock` (POSIX seconds, dates every ledger call and the vendor's
    reset), `sleep` and `rng` (the in-agent backoff's; `run_attempt_async` makes a
    cancellable wait of the default `sleep`).

    Raises `InvalidInput` naming the field (and what it allows) for a value out of range.
    """

    actor: Actor | str = attrs.field(
        default=RUNNER_ACTOR, validator=checked("an Actor or a non-blank name", _actor_like)
    )
    forced: bool = attrs.field(default=False, validator=checked("a bool", instance_of(bool)))
    lease_s: float = attrs.field(default=DEFAULT_LEASE_S, validator=_seconds("> 0", gt(0)))
    cap: DispatchCap | None = attrs.field(
        default=None, validator=opt_checked("a DispatchCap", instance_of(DispatchCap))
    )
    agent_attempts: int = attrs.field(
        default=1,
        validator=checked(
            f"an integer between 1 and {MAX_AGENT_ATTEMPTS}",
            integer,
            ge(1),
            le(MAX_AGENT_ATTEMPTS),
        ),
    )
    validate: Callable[[str], str | None] | None = attrs.field(
        default=None, validator=opt_checked("callable", is_callable())
    )
    label: str | None = attrs.field(default=None, validator=opt_checked("a str", instance_of(str)))
    stop_reason: str = attrs.field(
        default=CANCELLED_REASON, validator=checked("a str", instance_of(str))
    )
    backoff: Backoff = attrs.field(
        default=AGENT_BACKOFF, validator=checked("a Backoff", instance_of(Backoff))
    )
    kill_grace: float = attrs.field(default=DEFAULT_KILL_GRACE_S, validator=_seconds(">= 0", ge(0)))
    stall_timeout_s: float | None = attrs.field(
        default=None,
        validator=opt_checked("a finite number of seconds > 0", _no_bool, finite, gt(0)),
    )
    start: ProcessStarter = attrs.field(
        default=subprocess.Popen, validator=_callable("a callable like subprocess.Popen")
    )
    clock: Callable[[], float] = attrs.field(default=time.time, validator=_callable("callable"))
    sleep: Callable[[float], None] = attrs.field(
        default=time.sleep, validator=_callable("callable")
    )
    rng: Callable[[], float] = attrs.field(default=random.random, validator=_callable("callable"))
    lane: str | None = attrs.field(
        default=AUTO_LANE, validator=opt_checked("a lane name", instance_of(str))
    )


_OPTION_NAMES = frozenset(field.name for field in attrs.fields(AttemptOptions))


def options_with(
    options: AttemptOptions | None, legacy: Mapping[str, Any], where: str
) -> AttemptOptions:
    """`options` (default `AttemptOptions()`) with the keywords of the older signature
    applied, each one named in a `DeprecationWarning` (they go in the next release). A
    keyword that was never an option is a TypeError, as Python words one."""
    base = AttemptOptions() if options is None else options
    if not isinstance(base, AttemptOptions):
        raise TypeError(f"options must be an AttemptOptions, got {type(base).__name__}")
    if not legacy:
        return base
    unknown = sorted(set(legacy) - _OPTION_NAMES)
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
    given = sorted(legacy)
    names = ", ".join(f"{name}=" for name in given)
    instead = ", ".join(f"{name}=..." for name in given)
    warnings.warn(
        f"{where}(..., {names}) is deprecated and goes in the next release: pass "
        f"options=AttemptOptions({instead})",
        DeprecationWarning,
        stacklevel=3,
    )
    return attrs.evolve(base, **legacy)


def _lane_for_call(
    ledger: Ledger, adapter: Adapter, request: AgentRequest, lane: str | None
) -> str | None:
    if lane != AUTO_LANE:
        return lane
    if LANES_CAPABILITY not in ledger.capabilities():
        return None
    # The lane is the credentials the agent will see: the inherited environment with the
    # request's additions.
    env = {**os.environ, **(request.env or {})}
    return adapter_lane(adapter, ledger_id=ledger.ledger_id(), env=env)


def _claim(run: Run, owner: RunOwner) -> None:
    """Take the admitted run as this call's, or raise Conflict: a replayed key's run is only
    ours while it runs and was admitted with this call's owner identity (each call draws its
    own instance unless the caller passes one)."""
    if run.status is AttemptStatus.RUNNING and run.owner_instance == owner.instance:
        return
    raise Conflict(
        f"request key {run.request_key!r} admitted attempt {run.attempt} of task "
        f"{run.task_id} (run {run.id}, {run.status}) for another runner "
        f"({run.owner_host} pid {run.owner_pid}); it is not this call's to run"
    )


def _renewer(
    ledger: Ledger, run_id: str, lease_s: float, clock: Callable[[], float]
) -> Callable[[], None]:
    """The one lease renewer, called by the agent's spawn loop every `lease_s / 3`. A storage
    hiccup is logged and left to the next beat (the lease outlasts two missed beats);
    anything else (the run was abandoned meanwhile: `Conflict`) propagates, and the agent
    stops: nothing it produces could be recorded."""

    def renew() -> None:
        try:
            ledger.heartbeat(run_id, lease_s=lease_s, now=clock())
        except StorageError as exc:
            _log.warning("run %s: its lease was not renewed: %s", run_id, exc.message)

    return renew


def run_attempt(
    ledger: Ledger,
    task_id: str,
    adapter: Adapter,
    request: AgentRequest,
    options: AttemptOptions | None = None,
    *,
    request_key: str | None = None,
    recorder: RunRecorder | None = None,
    cancel: Cancellation | None = None,
    owner: RunOwner | None = None,
    **deprecated: Any,
) -> AttemptOutcome:
    """Run one attempt of `task_id` through `adapter` and record it; see the module
    docstring for the steps, the outcome and what raises.

    `options` is how (`AttemptOptions`: admission, the agent, the clocks); the keywords
    are this call's own. `request_key` makes the admission idempotent (default
    `attempt:<task id>:<n>`, n the attempt this call expects to start). `recorder` collects
    the agent's proof (`run_agent`'s). `cancel` stops the agent from another thread: its
    tree is killed, the run is finished `abandoned` with `options.stop_reason`, and
    `SpawnCancelled` propagates. `owner` is who runs it (`RunOwner`); by default this
    process with an instance drawn for this call, so a replay of the key by another call
    is refused.

    The lane (`options.lane`, issue #28): a lane that does not admit refuses before
    anything is written (`LaneWaiting`, `LaneStopped`), and what the vendor's structure
    says of the lane (a stated reset, refused credentials, billing, the CLI missing) is
    recorded with the run, as the dispatcher does.

    The vendor session (issue #46): when the task's last run ended on an `upstream`
    refusal in a session (`Run.session_id`, on this adapter) and the adapter can resume
    (`resumes_sessions`), this attempt resumes it, once, recorded on the run
    (`Run.resumed_session`); decided from the ledger, so a new process resumes what an
    ended one was refused in. A resume the vendor refuses starts fresh in the same
    attempt. A `request` that names its own `resume_session` is left as it is.

    The options as keywords (`run_attempt(..., clock=c, start=s)`, the older signature)
    still work for one release, with a `DeprecationWarning`.
    """
    options = options_with(options, deprecated, "run_attempt")
    owner = current_owner() if owner is None else owner
    clock = options.clock
    if request_key is None:
        # NotFound here, before anything is written, for a task that does not exist.
        expected = ledger.get_task(task_id, now=clock(), cap=options.cap).attempts_started + 1
        request_key = f"attempt:{task_id}:{expected}"
    resume = request.resume_session
    if resume is None and resumes_sessions(adapter):
        resume = resumable_session(ledger, task_id, adapter.name, now=clock())
    run = ledger.start_run(
        task_id,
        request_key=request_key,
        actor=options.actor,
        forced=options.forced,
        lease_s=options.lease_s,
        now=clock(),
        cap=options.cap,
        owner=owner,
        lane=_lane_for_call(ledger, adapter, request, options.lane),
        resumed_session=resume,
    )
    _claim(run, owner)
    request = attrs.evolve(request, resume_session=resume)
    return _run_admitted(ledger, run, adapter, request, options, recorder=recorder, cancel=cancel)


def _run_admitted(
    ledger: Ledger,
    run: Run,
    adapter: Adapter,
    request: AgentRequest,
    options: AttemptOptions,
    *,
    recorder: RunRecorder | None,
    cancel: Cancellation | None,
) -> AttemptOutcome:
    """Steps 2 to 4 for a run this call admitted and claimed."""
    clock = options.clock
    renew = _renewer(ledger, run.id, options.lease_s, clock)
    # Before the agent starts: a ledger that cannot say the run's room leaves the run to
    # its lease (abandoned, uncharged) rather than running it unguarded.
    guard = spend_guard(ledger, run.id, clock)
    try:
        proof, resumed, refused = attempt_resuming(
            adapter,
            attrs.evolve(request, resume_session=None),
            request.resume_session,
            lambda asked: attempt_agent(
                adapter,
                asked,
                options,
                heartbeat=renew,
                heartbeat_s=options.lease_s / 3,
                cancel=cancel,
                recorder=recorder,
                usage_limit=None if guard is None else guard.crossed,
            ),
        )
    except SpawnCancelled:
        # Stopped by its caller: the tree is gone; the run says so.
        record_stopped(ledger, run.id, options.stop_reason, now=clock())
        raise
    except Exception as exc:
        # Recorded before the error propagates; a ledger that cannot take it leaves the
        # run to its lease.
        with suppress(ExecKitError):
            record_outcome(ledger, run.id, runner_error(exc), now=clock())
        raise
    outcome = attrs.evolve(
        with_spend_stop(outcome_of(adapter, proof, clock), guard),
        resumed_session=resumed,
        resume_refused=refused,
    )
    ended = record_outcome(ledger, run.id, outcome, now=clock())
    after = ledger.get_task(run.task_id, now=clock(), cap=options.cap)
    return _attempt_outcome(ended, after, outcome, proof)


def attempt_agent(
    adapter: Adapter,
    request: AgentRequest,
    options: AttemptOptions,
    *,
    heartbeat: Callable[[], object] | None,
    heartbeat_s: float,
    cancel: Cancellation | None,
    recorder: RunRecorder | None = None,
    usage_limit: UsageLimit | None = None,
) -> AgentProof:
    """Run the agent of an admitted run and return its proof, failed or not: the one call
    `run_attempt` and the dispatcher's `AdapterRunner` make, with the agent's part of
    `options`. `heartbeat` renews the run's lease every `heartbeat_s` seconds; `cancel`
    stops the whole tree (`SpawnCancelled` propagates, as does anything a hook, the
    adapter or the heartbeat raised); `usage_limit` is the run's `SpendGuard.crossed`
    (its caps held while it runs), None for none."""
    try:
        return run_agent(
            adapter,
            request,
            max_attempts=options.agent_attempts,
            backoff=options.backoff,
            sleep=options.sleep,
            rng=options.rng,
            validate=options.validate,
            recorder=recorder,
            label=options.label,
            kill_grace=options.kill_grace,
            stall_timeout_s=options.stall_timeout_s,
            heartbeat=heartbeat,
            heartbeat_s=heartbeat_s,
            start=options.start,
            cancel=cancel,
            clock=options.clock,
            usage_limit=usage_limit,
        )
    except AgentFailed as failed:
        return failed.proof


def _attempt_outcome(
    run: Run, task: Task, outcome: RunOutcome, proof: AgentProof
) -> AttemptOutcome:
    failed = run.status is not AttemptStatus.SUCCEEDED
    return AttemptOutcome(
        task_id=run.task_id,
        run_id=run.id,
        attempt=run.attempt,
        status=run.status,
        failure_class=run.failure_class,
        # A run its runner stopped (a spend window's stop) is uncharged, as the ledger says.
        charged=not run.stopped
        and (not failed or run.failure_class is None or run.failure_class.charged),
        reason=run.reason,
        precondition=outcome.precondition,
        not_before=run.not_before,
        proof=proof,
        state=task.state,
        blocked_on=task.blocked_on,
        next_attempt_at=task.next_attempt_at,
        decision=task.reason,
    )


async def run_attempt_async(
    ledger: Ledger,
    task_id: str,
    adapter: Adapter,
    request: AgentRequest,
    options: AttemptOptions | None = None,
    *,
    request_key: str | None = None,
    recorder: RunRecorder | None = None,
    owner: RunOwner | None = None,
    **deprecated: Any,
) -> AttemptOutcome:
    """`run_attempt` for asyncio runners: same arguments (but `cancel`), same outcome, same
    errors, run in a thread of its own.

    Cancelling the awaiting task stops the attempt: the agent's whole tree is killed, the
    run is finished `abandoned` with `options.stop_reason`, and only then does
    `CancelledError` propagate. Unless `options` names its own `sleep`, the in-agent
    backoff waits in a way that a cancel ends.
    """
    if "sleep" in deprecated and deprecated["sleep"] is None:
        # The older signature's way of asking for the cancellable default.
        deprecated = {name: value for name, value in deprecated.items() if name != "sleep"}
    explicit_sleep = "sleep" in deprecated or (
        options is not None and options.sleep is not time.sleep
    )
    options = options_with(options, deprecated, "run_attempt_async")
    cancel = Cancellation()
    if not explicit_sleep:
        options = attrs.evolve(options, sleep=cancellable_sleep(cancel))
    chosen = options
    try:
        return await run_in_thread(
            lambda: run_attempt(
                ledger,
                task_id,
                adapter,
                request,
                chosen,
                request_key=request_key,
                recorder=recorder,
                cancel=cancel,
                owner=owner,
            ),
            cancel,
        )
    finally:
        cancel.close()
