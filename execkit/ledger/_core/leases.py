"""Leases: a running run holds one, its runner renews it (`heartbeat`), and a run whose
lease expired is abandoned, by the next admission on its task, by `abandon_expired_runs`
(any host) or by a repair. A run whose owner is known to be gone (a dispatcher that found,
on its own host, that the process which admitted it no longer exists) is abandoned at once
by `abandon_run`, without waiting out its lease. `running_runs` lists what runs where.

An abandoned run counts against every limit and charges as an unclassed failure (ADR
0033/0046): a runner that vanished told nothing about its vendor. Its late result cannot
rewrite the history: finishing it with another outcome is a Conflict, and so is renewing
its lease.
"""

from __future__ import annotations

import attrs

from execkit._budget import AttemptStatus
from execkit._errors import Conflict, InvalidInput
from execkit.ledger._core.base import SYSTEM_ACTOR, when
from execkit.ledger._core.inputs import as_actor, check_lease, clean_reason, moment
from execkit.ledger._core.lanes import LaneOps
from execkit.ledger._core.store import TaskRecord, Tx
from execkit.ledger._model import Actor, AuditAction, AuditEntry, Run

__all__ = ["LeaseOps"]


class LeaseOps(LaneOps):
    """Renewing a run's lease, and abandoning a run whose lease expired (which frees its
    lane's probe slot when it was the probe)."""

    def _abandon(
        self, tx: Tx, task: TaskRecord, run: Run, at: float, why: str, actor: str = SYSTEM_ACTOR
    ) -> TaskRecord:
        """Mark a running run abandoned (it counts and charges, ADR 0033/0046) and return
        the task with its summary brought up to date; audited as done by `actor`."""
        if not tx.finish_run(run.id, AttemptStatus.ABANDONED, None, why, None, at):
            current = tx.task(task.id)
            return task if current is None else current
        ended = attrs.evolve(run, status=AttemptStatus.ABANDONED, reason=why, ended_at=at)
        summary = self._summary_after(tx, task, ended)
        self._lane_result(tx, ended, None, at)
        tx.audit(
            AuditEntry(
                at=at,
                actor=actor,
                action=AuditAction.RUN_ABANDON,
                task_id=task.id,
                run_id=run.id,
                detail={"reason": why},
            )
        )
        return task.with_summary(summary)

    def _expired_running_run(self, tx: Tx, task: TaskRecord, at: float) -> Run | None:
        if task.summary.running is None:
            return None
        run = tx.run_at(task.id, task.summary.running)
        if run is None or run.status is not AttemptStatus.RUNNING:
            return None
        if run.lease_expires_at is not None and run.lease_expires_at <= at:
            return run
        return None

    def heartbeat(
        self, run_id: str, *, lease_s: float | None = None, now: float | None = None
    ) -> Run:
        """Renew a running run's lease for `lease_s` seconds (default: the lease it was
        started with). Conflict when the run is no longer running (e.g. abandoned after its
        lease expired: its result can no longer be recorded)."""
        lease = None if lease_s is None else check_lease("lease_s", lease_s)
        at = moment(now)
        with self._store.write() as tx:
            run = self._run(tx, run_id)
            if run.status is not AttemptStatus.RUNNING:
                raise Conflict(
                    f"run {run_id} is {run.status}, not running: it holds no lease to renew"
                    + (f" ({run.reason})" if run.reason else "")
                )
            length = lease if lease is not None else tx.lease_of(run_id)
            tx.renew_lease(run_id, at + length, lease)
            return attrs.evolve(run, lease_expires_at=at + length)

    def abandon_expired_runs(self, *, now: float | None = None) -> list[Run]:
        """Abandon every running run whose lease has expired, on any host (they count
        against every limit and charge as unclassed failures). Returns them."""
        at = moment(now)
        abandoned: list[Run] = []
        with self._store.write() as tx:
            for run in tx.expired_runs(at):
                task = self._task(tx, run.task_id, lock=True)
                why = f"lease expired at {when(run.lease_expires_at or at)}: not renewed"
                self._abandon(tx, task, run, at, why)
                abandoned.append(self._run(tx, run.id))
        return abandoned

    def running_runs(self) -> list[Run]:
        """Every running run, oldest first: where it runs (its owner) and until when its
        lease holds."""
        with self._store.read() as tx:
            return tx.running_runs()

    def abandon_run(
        self, run_id: str, *, reason: str, actor: Actor | str, now: float | None = None
    ) -> Run:
        """Abandon a running run at once because its owner is known to be gone (`reason`
        says how it is known; it is redacted and stored). It counts and charges as an
        abandoned run (nothing identified it as uninformative), audited with `actor`.
        Abandoning it again with the same reason returns it unchanged (a retried request:
        as `finish_run` with the same values); Conflict when the run ended otherwise;
        NotFound when there is none."""
        who = as_actor(actor)
        why = clean_reason(reason)
        if not why:
            raise InvalidInput("reason: say why the run is abandoned", field="reason")
        at = moment(now)
        with self._store.write() as tx:
            run = self._run(tx, run_id)
            if run.status is not AttemptStatus.RUNNING:
                if run.status is AttemptStatus.ABANDONED and run.reason == why:
                    return run
                raise Conflict(f"run {run_id} is {run.status}, not running: nothing to abandon")
            task = self._task(tx, run.task_id, lock=True)
            self._abandon(tx, task, run, at, why, str(who))
            return self._run(tx, run_id)
