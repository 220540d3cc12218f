"""Admission and runs: `start_run` admits one run of a task or refuses it, `finish_run`
records how it ended, and the run history is read back (`runs`, `run`, `history`).

Admission is one write transaction (ADR 0033: the count is checked in the transaction that
starts the run; a failed transaction consumes no attempt): the task locked, a running run
whose lease expired abandoned first, the policies decided once on the task's summary, then
the run, the new summary, the audit record and the request key written together; last,
the spend caps (issue #45, `spend.py`), when the ledger has any. Replaying
an accepted request key returns the run it admitted and creates none. The refusals are
`AdmissionRefused`s (`TaskFinished`, `AttemptLimitReached`, `TaskBlocked`,
`TaskBackingOff`, `SpendCapReached`), each caught by type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from execkit._budget import Attempt, AttemptStatus, BlockedOn, Decision, DispatchCap, TaskState
from execkit._classify import FailureClass, stalled_for
from execkit._errors import (
    AdmissionRefused,
    AttemptLimitReached,
    Conflict,
    InvalidInput,
    LaneStopped,
    LaneWaiting,
    SpendCapReached,
    StorageError,
    TaskBackingOff,
    TaskBlocked,
    TaskFinished,
)
from execkit._lanes import LaneCause, LaneState
from execkit._mask import mask_text
from execkit._usage import Usage
from execkit.ledger._core.base import FINISHED_STATUSES, attempt_from_run, when
from execkit.ledger._core.inputs import (
    MAX_KEY,
    as_actor,
    as_failure_class,
    check_bool,
    check_lease,
    check_name,
    check_session,
    check_task_ids,
    check_text,
    clean_reason,
    fingerprint_of,
    moment,
    optional_time,
)
from execkit.ledger._core.lanes import check_lane, check_lane_cause
from execkit.ledger._core.leases import LeaseOps
from execkit.ledger._core.spend import Reservation, SpendOps, check_usage, with_usage
from execkit.ledger._core.store import StaleCopy, TaskRecord, Tx
from execkit.ledger._model import (
    DEFAULT_LEASE_S,
    Actor,
    AuditAction,
    AuditEntry,
    NotifyKind,
    Run,
    RunOwner,
    TaskStatus,
)
from execkit.ledger._owner import process_owner
from execkit.ledger._spend import window_bounds

__all__ = ["RunOps"]

_FINAL_RUN_STATUSES = (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.ABANDONED)
# `LaneConfig.max_park_s`'s lower bound: a stated reset nearer than this is within every
# configuration's longest park, so it needs neither the cap nor a read of the configuration.
_SHORTEST_PARK_S = 60.0


def _refusal(task: TaskRecord, decision: Decision) -> AdmissionRefused | None:
    """Why `decision` admits no run now, as the error `start_run` raises; None to admit."""
    if decision.state is TaskState.DONE:
        return TaskFinished(f"task {task.id} already succeeded")
    if decision.state is TaskState.RUNNING:
        return TaskBlocked(
            f"attempt {task.summary.running} of task {task.id} is still running; finish it, "
            "or let its lease expire (abandoned runs count), before starting another"
        )
    if decision.state is TaskState.BLOCKED:
        if decision.blocked_on is BlockedOn.ATTEMPT_LIMIT:
            return AttemptLimitReached(
                f"{decision.reason} of task {task.id}; an operator can raise it (set-attempt-limit)"
            )
        return TaskBlocked(decision.reason or f"task {task.id} is blocked on {decision.blocked_on}")
    return None


# A path (`start_run(workspace=...)`): Linux's PATH_MAX.
MAX_WORKSPACE = 4096
# A vendor session id (`start_run(resumed_session=...)`): uuids and thread ids are far
# shorter; `AgentRequest.resume_session` takes the same bound.
MAX_SESSION = 200
# A fallback's announcement (`start_run(fell_back=...)`): a few lane names and their waits.
MAX_FALLBACK = 2000


class RunOps(LeaseOps, SpendOps):
    """Admitting, finishing and reading runs; an expired lease met on the way is
    abandoned (`LeaseOps`)."""

    def runs(self, task_id: str) -> list[Run]:
        """The task's runs in creation order (attempt 1..N); NotFound if no such task."""
        with self._store.read() as tx:
            self._task(tx, task_id)
            return tx.runs(task_id)

    def announced_runs(self, task_ids: Sequence[str]) -> dict[str, list[Run]]:
        """For each of `task_ids` (at most `LIST_PAGE`; InvalidInput beyond, or for an id
        that is not text) whose latest run resumed a vendor session (`Run.resumed_session`)
        or fell back to a later adapter (`Run.fell_back`) (issue #46), its runs in creation
        order; every other task, and one that is not there, left out. One read whatever
        the count: what `execkit status` asks of a page of active tasks, where a read a
        task made it three times slower at 100,000 tasks."""
        ids = check_task_ids(task_ids)
        if not ids:
            return {}
        found: dict[str, list[Run]] = {}
        with self._store.read() as tx:
            for run in tx.announced_runs(ids):
                found.setdefault(run.task_id, []).append(run)
        return found

    def run(self, run_id: str) -> Run:
        """One run by id; NotFound if absent."""
        with self._store.read() as tx:
            return self._run(tx, run_id)

    def history(self, task_id: str) -> list[Attempt]:
        """The task's runs as the `Attempt` history the budget policies read."""
        return [attempt_from_run(run) for run in self.runs(task_id)]

    def start_run(
        self,
        task_id: str,
        *,
        request_key: str,
        actor: Actor | str,
        forced: bool = False,
        ignore_backoff: bool = False,
        lease_s: float = DEFAULT_LEASE_S,
        now: float | None = None,
        cap: DispatchCap | None = None,
        owner: RunOwner | None = None,
        lane: str | None = None,
        workspace: str | None = None,
        resumed_session: str | None = None,
        fell_back: str | None = None,
    ) -> Run:
        """Admit one run of the task, in one transaction, or refuse with AdmissionRefused.

        First, a running run whose lease expired is abandoned (it counts and charges). Then
        the policies decide; refusals: `TaskFinished` (done or cancelled),
        `AttemptLimitReached` (the explicit limit is used up), `TaskBlocked` (a run is still
        running, or a budget/environment/upstream/dispatch-cap bound holds; when several
        hold, the one `get_task` shows as `blocked_on`), `TaskBackingOff` (its backoff, or
        the vendor's reset time, has not passed; `ignore_backoff=True` admits anyway and the
        audit records it). `forced` is an operator's retry (ADR 0046/015): it lifts every
        stop but an explicit limit, once, audited; a retry an operator asked for with
        `retry_task` is forced the same way. The run holds a lease of `lease_s` seconds
        that its runner renews with `heartbeat`. Replaying an accepted `request_key` with
        the same actor and force returns the same run and creates none; with different
        ones it is a Conflict. `owner` is the process that will run it (a dispatcher's
        `RunOwner`); by default the calling process.

        `lane` (`ADAPTER/CREDENTIAL`, issue #28) binds the run to its vendor lane: the
        lane, and the same lane on the owner's host (`owner.host`: a dispatcher's own,
        through a server too; the host name only names the lane, it proves nothing), are
        read in this transaction after the task's own refusals, and one that does not
        admit refuses with `LaneWaiting` or `LaneStopped` (before a backoff's refusal);
        nothing is written. Neither `forced` nor `ignore_backoff` lifts a lane: an operator
        resumes it (`resume_lane`). Without a lane, admission is as it was.

        `workspace` (issue #46) is where the run's agent will work (a dispatcher's workspace
        of the issue, a path of at most 4096 characters): kept on the run (`Run.workspace`),
        masked as text. `resumed_session` (issue #46) is the vendor session the run's agent
        continues (at most 200 characters), kept on the run (`Run.resumed_session`).
        `fell_back` (issue #46) is a dispatcher's announcement that the run went to a later
        adapter of its issue's order (at most 2000 characters), kept on the run
        (`Run.fell_back`), masked as text.
        """
        request_key = check_name("request_key", request_key, MAX_KEY)
        place = None if workspace is None else check_text("workspace", workspace, MAX_WORKSPACE)
        session = (
            None
            if resumed_session is None
            else check_text("resumed_session", resumed_session, MAX_SESSION)
        )
        fallback = None if fell_back is None else check_text("fell_back", fell_back, MAX_FALLBACK)
        lane_name = check_lane(lane)
        if owner is not None and not isinstance(owner, RunOwner):
            raise InvalidInput(
                f"owner: must be a RunOwner, got {type(owner).__name__}", field="owner"
            )
        if owner is not None:
            # Its words come from whoever calls (a server's client): stored masked.
            owner = attrs.evolve(
                owner,
                host=mask_text(owner.host),
                boot_id=mask_text(owner.boot_id),
                instance=mask_text(owner.instance),
            )
        # The process that will run it: the host-local lane (a missing binary) is its
        # host's, so a server admits a remote dispatcher's run on that dispatcher's host.
        runner = owner or process_owner()
        who = as_actor(actor)
        check_bool("forced", forced)
        check_bool("ignore_backoff", ignore_backoff)
        lease = check_lease("lease_s", lease_s)
        at = moment(now)
        fingerprint = fingerprint_of({"task_id": task_id, "actor": str(who), "forced": forced})

        spend_refused: list[AdmissionRefused] = []  # the spend gate's refusal, if it refused

        def admit(after: StaleCopy | None) -> Run | AdmissionRefused:
            """The admission, or the refusal to raise once its transaction committed."""
            refused: AdmissionRefused | None = None
            spend_refused.clear()
            with self._store.write(remembered=after is None, after=after) as tx:
                lanes = () if lane_name is None else self._gate_names(lane_name, runner.host)
                spend = self._spend_plan(lane_name, at)
                tx.expect_admission(AuditAction.RUN_START, request_key, task_id, lanes, spend)
                found = tx.idempotent(AuditAction.RUN_START, request_key)
                if found is not None:
                    return self._replay_start(tx, request_key, found, task_id, who, forced)
                task = self._task(tx, task_id, lock=True)
                if task.status in FINISHED_STATUSES:
                    raise TaskFinished(f"task {task_id} is {task.status}; it admits no more runs")
                expired = self._expired_running_run(tx, task, at)
                if expired is not None:
                    why = f"lease expired at {when(expired.lease_expires_at or at)}: not renewed"
                    task = self._abandon(tx, task, expired, at, why)
                # Decided once: the refusal and the admission's audit read the same decision.
                decision = self._decide(task, at, cap, force=forced)
                refused = _refusal(task, decision)
                probes: list[str] = []
                if refused is None and lane_name is not None:
                    try:
                        probes = self._lane_gate(tx, lane_name, task.id, at, runner.host)
                    except (LaneWaiting, LaneStopped) as lane_refusal:
                        refused = lane_refusal
                if refused is None:
                    refused = self._admission_refusal(task, decision, at, ignore_backoff)
                reservation: Reservation | None = None
                if refused is None:
                    # Spend last (issue #45): the one check that reads other tasks' runs,
                    # so a run another check refuses never waits for the spend lock.
                    gate = self._spend_gate(tx, task, lane_name, at)
                    if isinstance(gate, AdmissionRefused):
                        refused = gate
                        spend_refused.append(gate)
                    else:
                        reservation = gate
                if refused is None:
                    run = self._admit(
                        tx,
                        task,
                        decision,
                        at,
                        who,
                        request_key,
                        fingerprint,
                        forced,
                        lease,
                        runner,
                        place,
                        session,
                        fallback,
                        None if reservation is None else (reservation.usd, reservation.tokens),
                    )
                    if lane_name is not None:
                        self._lane_admitted(tx, lane_name, probes, run, at)
                    if reservation is not None:
                        self._spend_admitted(tx, run, reservation, at)
                    return run
                if expired is None:
                    raise refused
                # Leaving the block commits the abandonment: it stands whether or not this
                # admission goes ahead, or an expired run could never be abandoned by one.
            return refused

        try:
            outcome = self._copy_first(admit)
        except AdmissionRefused as raised:
            outcome = raised
        if isinstance(outcome, AdmissionRefused):
            if spend_refused and outcome is spend_refused[0]:
                self._spend_refused(task_id, lane_name, outcome, at)
            raise outcome
        return outcome

    def _spend_refused(
        self, task_id: str, lane: str | None, refusal: AdmissionRefused, at: float
    ) -> None:
        """Issue #49: a spend refusal (a window's cap, or the task's own budget) is told as
        `spend.capped`, once a window, in a small write transaction of its own: the refused
        admission's rolled back. A write that fails leaves the refusal as it was; the next
        refused admission writes it (its once-a-window row was not written either)."""
        try:
            with self._store.write() as tx:
                config = self._spend_config(tx)
                if config is None:
                    return
                if isinstance(refusal, SpendCapReached):
                    for cap in config.applying(lane):
                        if cap.name == refusal.cap:
                            start, _reopens = window_bounds(cap, at)
                            self._note_capped(
                                tx, cap, start, at, task_id, None, reason=refusal.message
                            )
                    return
                budget = tx.task_budget(task_id)
                if budget is not None:
                    self._note_capped(tx, budget, 0.0, at, task_id, None, reason=refusal.message)
        except StorageError:
            return

    def _admission_refusal(
        self, task: TaskRecord, decision: Decision, at: float, ignore_backoff: bool
    ) -> AdmissionRefused | None:
        refusal = _refusal(task, decision)
        if refusal is not None:
            return refusal
        if decision.state is TaskState.BACKOFF and not ignore_backoff:
            ready_at = decision.next_attempt_at or at
            return TaskBackingOff(
                f"task {task.id} is {decision.reason}; it is ready at {when(ready_at)} "
                "(wait, or override the backoff: that is audited)",
                ready_at=ready_at,
            )
        return None

    def _admit(
        self,
        tx: Tx,
        task: TaskRecord,
        decision: Decision,
        at: float,
        who: Actor,
        request_key: str,
        fingerprint: str,
        forced: bool,
        lease: float,
        owner: RunOwner,
        workspace: str | None = None,
        resumed_session: str | None = None,
        fell_back: str | None = None,
        reserved: tuple[float, int] | None = None,
    ) -> Run:
        pending = task.retry_requested_by
        force = forced or pending is not None
        run = tx.insert_run(
            Run(
                id="",
                task_id=task.id,
                attempt=task.summary.attempts_used + 1,
                status=AttemptStatus.RUNNING,
                failure_class=None,
                reason=None,
                request_key=request_key,
                actor=str(who),
                forced=force,
                started_at=at,
                ended_at=None,
                owner_host=owner.host,
                owner_pid=owner.pid,
                lease_expires_at=at + lease,
                owner_boot_id=owner.boot_id,
                owner_pid_namespace=owner.pid_namespace,
                owner_pid_started_at=owner.pid_started_at,
                owner_instance=owner.instance,
                workspace=workspace,
                resumed_session=resumed_session,
                fell_back=fell_back,
            ),
            lease,
            reserved,
        )
        tx.write_summary(task.id, task.summary.started(attempt_from_run(run)))
        detail: dict[str, Any] = {
            "attempt": run.attempt,
            "forced": force,
            "state_before": decision.state,
            "request_key": request_key,
            "lease_s": lease,
        }
        if pending is not None:
            tx.set_retry(task.id, None, None)
            detail["retry_requested_by"] = pending
        if decision.state is TaskState.BACKOFF:
            detail["ignored_backoff_until"] = decision.next_attempt_at
        # Issue #46: a fallback is announced in the audit too, and a resumed session named.
        if run.fell_back is not None:
            detail["fell_back"] = run.fell_back
        if run.resumed_session is not None:
            detail["resumed_session"] = run.resumed_session
        tx.audit(
            AuditEntry(
                at=at,
                actor=str(who),
                action=AuditAction.RUN_START,
                task_id=task.id,
                run_id=run.id,
                detail=detail,
            )
        )
        tx.remember(AuditAction.RUN_START, request_key, fingerprint, {"run_id": run.id}, at)
        return run

    def _replay_start(
        self,
        tx: Tx,
        key: str,
        found: tuple[str, dict[str, Any]],
        task_id: str,
        who: Actor,
        forced: bool,
    ) -> Run:
        """The run an accepted `request_key` created, when the request is the same one."""
        run = self._run(tx, found[1]["run_id"])
        # Compared with the run itself, so keys stored before the fingerprint named the
        # actor and the force still replay when (and only when) the request matches.
        if (run.task_id, run.actor) != (task_id, str(who)) or (forced and not run.forced):
            raise Conflict(
                f"request key {key!r} already admitted run {run.id} of task {run.task_id} "
                f"for {run.actor} (forced {str(run.forced).lower()}); a different request "
                "needs its own key"
            )
        return run

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        not_before: float | None = None,
        now: float | None = None,
        stopped: bool = False,
        lane_cause: str | None = None,
        usage: Usage | None = None,
        session_id: str | None = None,
    ) -> Run:
        """Record how a running run ended: succeeded | failed | abandoned.

        `session_id` (issue #46) is the vendor session the run's agent ran in, as its
        proof read it (at most 200 characters, no control character; kept verbatim, never
        masked: a resume hands it back to the vendor). Stored on the run
        (`Run.session_id`): the task's next attempt resumes it after an upstream refusal,
        from whichever dispatcher or host runs it. Otherwise InvalidInput naming
        `session_id`, nothing written.

        `usage` (issue #45) is what the run cost, as its adapter read it from the CLI's
        structure (a failed, stopped or killed run's too: what it printed before it
        ended); stored on the run, it replaces the reservation its admission held. None
        (and every run ended otherwise: abandoned by a lease's expiry or an operator)
        leaves it unknown, never zero. Not a `Usage`: InvalidInput naming `usage`.

        `stopped=True` (abandoned only) says its own runner stopped it on purpose (a
        dispatcher shutting down, a cancelled task): the attempt is uncharged and sets no
        backoff, and it still counts against an explicit limit.

        A succeeded run is never classed and marks its task done. The reason is redacted
        before it is stored. `not_before` (failed runs) is the vendor's reset time: the next
        attempt is not scheduled before it. Finishing a finished run again with the same
        values returns it unchanged; with different values it is a Conflict (an abandoned
        run's lease expired: its runner's late result cannot rewrite the history).

        A `not_before` further than the lanes' longest park (`LaneConfig.max_park_s`, a
        day by default) is stored at that bound, as its lane's park is: a vendor's absurd
        reset never strands a task.

        A run bound to a lane feeds it (issue #28). `lane_cause` is what the adapter read
        from the vendor's structure, never from free text: `reset` (an upstream failure
        whose `not_before` the vendor stated: the lane parks until then), `credentials`,
        `billing` or `binary_missing` (an environment failure that stops the lane; the
        reason is its fix; a missing binary stops the lane on the run's host only).
        Without it an upstream failure counts toward the lane's breaker. A cause that does
        not fit the class is InvalidInput, nothing written.
        """
        if status not in _FINAL_RUN_STATUSES:
            raise InvalidInput(
                f"status must be one of {', '.join(_FINAL_RUN_STATUSES)}, got {status!r}",
                field="status",
            )
        final = AttemptStatus(status)
        klass = as_failure_class(failure_class)
        if final is AttemptStatus.SUCCEEDED and klass is not None:
            raise InvalidInput(
                "failure_class must be empty for a succeeded run", field="failure_class"
            )
        check_bool("stopped", stopped)
        if stopped and final is not AttemptStatus.ABANDONED:
            raise InvalidInput(
                f"stopped: only an abandoned run can be stopped, not a {final} one",
                field="stopped",
            )
        if stopped and klass is not None:
            raise InvalidInput(
                "failure_class must be empty for a stopped run", field="failure_class"
            )
        reset = optional_time("not_before", not_before)
        if final is not AttemptStatus.FAILED:
            reset = None
        cause = check_lane_cause(lane_cause)
        if cause is not None and not (
            (cause is LaneCause.RESET and klass is FailureClass.UPSTREAM and reset is not None)
            or (cause is not LaneCause.RESET and klass is FailureClass.ENVIRONMENT)
        ):
            raise InvalidInput(
                f"lane_cause {cause} needs a failed run of class "
                + ("upstream with not_before" if cause is LaneCause.RESET else "environment")
                + f", got {final} ({klass or 'no class'})",
                field="lane_cause",
            )
        stored_reason = clean_reason(reason)
        cost = check_usage(usage)
        session = (
            None if session_id is None else check_session("session_id", session_id, MAX_SESSION)
        )
        at = moment(now)

        def finish(after: StaleCopy | None) -> Run:
            with self._store.write(remembered=after is None, after=after) as tx:
                return self._finish(
                    tx,
                    run_id,
                    final,
                    klass,
                    stored_reason,
                    reset,
                    stopped,
                    cause,
                    at,
                    cost,
                    session,
                )

        return self._copy_first(finish)

    def _notify_stalled(self, tx: Tx, ended: Run, at: float) -> None:
        """Issue #49: `run.stalled` for a failed run its stall watchdog stopped (its reason
        is `stall_reason`'s, which every client that finishes a run sends as it is: a
        local runner, a dispatcher, a server's), in the transaction of its result."""
        seconds = stalled_for(ended.reason)
        if seconds is None or ended.failure_class not in (
            FailureClass.WORK,
            FailureClass.UPSTREAM,
        ):
            return
        lane = tx.run_lane(ended.id)
        self._notify(
            tx,
            NotifyKind.RUN_STALLED,
            ended.task_id,
            {
                "task_id": ended.task_id,
                "run_id": ended.id,
                "attempt": ended.attempt,
                "lane": lane,
                # A lane is ADAPTER/CREDENTIAL; a run bound to none names no adapter.
                "adapter": None if lane is None else lane.partition("/")[0],
                "seconds": seconds,
                "class": ended.failure_class.value if ended.failure_class else None,
                "reason": ended.reason,
            },
            at,
        )

    def _finish(
        self,
        tx: Tx,
        run_id: str,
        final: AttemptStatus,
        klass: FailureClass | None,
        stored_reason: str | None,
        reset: float | None,
        stopped: bool,
        cause: LaneCause | None,
        at: float,
        cost: Usage | None = None,
        session: str | None = None,
    ) -> Run:
        """`finish_run` in its transaction, its arguments checked."""
        tx.expect_result(run_id)
        run = self._run(tx, run_id)
        if run.status is not AttemptStatus.RUNNING:
            if (
                (run.status, run.failure_class, run.reason, run.stopped)
                == (
                    final,
                    klass,
                    stored_reason,
                    stopped,
                )
                and (cost is None or cost == run.usage)
                and session in (None, run.session_id)
            ):
                return run
            shown = run.failure_class.value if run.failure_class else "-"
            raise Conflict(
                f"run {run_id} already finished as {run.status} (class {shown}); "
                "a finished run is immutable"
                + (f" ({run.reason})" if run.status is AttemptStatus.ABANDONED else "")
            )
        task = self._task(tx, run.task_id, lock=True)
        stated = reset
        if reset is not None and reset - at > _SHORTEST_PARK_S:
            # A vendor's reset is bounded as its lane's park is: a task never waits longer
            # than the lanes' longest park (an absurd `resetsAt` would strand it for ever).
            # Its lane is told the reset as stated: the lane's fold caps it and says so.
            reset = min(reset, at + self._lane_configs(tx).current.max_park_s)
        ended = attrs.evolve(
            run,
            status=final,
            failure_class=klass,
            reason=stored_reason,
            ended_at=at,
            not_before=reset,
            stopped=stopped,
            session_id=session,
        )
        if cost is not None:
            ended = with_usage(ended, cost)
        # The lane first: whether its lane absorbed an upstream failure decides whether the
        # failure moves the task's streak. A failure that met its lane closed (in flight when
        # another's result closed it, or the probe that found it closed still) was the
        # lane's; the one that closes an open lane is the task's own, so a lone task's
        # refusals still reach its ceiling as ADR 0046 bounds them.
        met = self._lane_result(tx, ended, cause, at, stated)
        if met is not None and met.state is not LaneState.OPEN and klass is FailureClass.UPSTREAM:
            ended = attrs.evolve(ended, lane_held=True)
        tx.finish_run(
            run_id, final, klass, stored_reason, reset, at, stopped, ended.lane_held, cost, session
        )
        summary = self._summary_after(tx, task, ended)
        if final is AttemptStatus.FAILED:
            self._notify_stalled(tx, ended, at)
        if final is AttemptStatus.FAILED and task.status is TaskStatus.OPEN:
            # Issue #49: a failure that leaves the task blocked (a person must act: the
            # environment, its limit, its ceiling, its budget) is told in this transaction.
            after = task.with_summary(summary)
            decision = self._decide(after, at, None)
            if self._task_budgets_seen:  # a ledger with no task cap: no read for it
                decision = self._spend_decision(tx, task.id, decision)
            if decision.state is TaskState.BLOCKED:
                self._notify_blocked(tx, after, decision, at, None)
        if final is AttemptStatus.SUCCEEDED and task.status is TaskStatus.OPEN:
            tx.set_task_status(run.task_id, TaskStatus.DONE, at)
        tx.audit(
            AuditEntry(
                at=at,
                actor=run.actor,
                action=AuditAction.RUN_FINISH,
                task_id=run.task_id,
                run_id=run_id,
                detail={
                    "status": final,
                    "failure_class": klass.value if klass else None,
                    **({"stopped": True, "reason": stored_reason} if stopped else {}),
                },
            )
        )
        return ended
