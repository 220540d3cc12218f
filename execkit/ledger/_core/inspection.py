"""What an operator reads and repairs: the audit trail, `db check` (`validate`) and
`db check --repair` (`repair`).

`validate` finds every problem and fixes none: the backend's own storage checks first (rows
the code cannot read stop it there), then each task's history validated, its stored summary
compared with the one its history gives, running runs whose lease expired, and every role
grant against the audit: a grant row with no `role.grant` event of the same principal, role,
granter and time was not made through execkit (another user with write access to the file
inserting one for themselves) and is reported, never honoured silently. `repair`
fixes what can be fixed without guessing: it abandons expired runs and rebuilds a summary
from its history (the history is the truth); a broken history is reported, never touched.
`validate` reads every task with its runs in one streamed statement (`Tx.history_rows`:
only the columns the fold reads, a row at a time, so memory does not grow with the ledger)
and folds each history from the values as stored (`_history_is_clean`: no run, attempt or
summary built). A task it doubts, plainly wrong or merely unusual, is read again in the
same snapshot (its record, and its runs a page of `LIST_PAGE` doubtful tasks a statement)
and checked the validating way (`_task_problems`), which names every problem: so a problem
is named the same whichever way it was first seen.
"""

from __future__ import annotations

from itertools import groupby
from operator import itemgetter
from typing import Any

from execkit._budget import (
    Attempt,
    AttemptStatus,
    HistorySummary,
    counted_after,
    summarize,
    validate_history,
)
from execkit._classify import FailureClass
from execkit._errors import HistoryError, InvalidInput
from execkit.ledger._core.base import SYSTEM_ACTOR, attempt_from_run, when
from execkit.ledger._core.inputs import moment
from execkit.ledger._core.leases import LeaseOps
from execkit.ledger._core.store import (
    _ATTEMPT_STATUSES,
    _FAILURE_CLASSES,
    _TASK_STATUSES,
    HISTORY_ROW,
    SUMMARY_AT,
    TaskRecord,
    stored_attempt,
    summary_values,
)
from execkit.ledger._model import LIST_PAGE, AuditAction, AuditEntry, AuditEvent, Run, TaskStatus

__all__ = ["InspectionOps"]


class InspectionOps(LeaseOps):
    """The audit trail, the ledger's check and its repair."""

    def audit_events(self, task_id: str | None = None) -> list[AuditEvent]:
        """Audit records in order, all or one task's."""
        with self._store.read() as tx:
            return tx.audit_events(task_id)

    def validate(self, *, now: float | None = None) -> list[str]:
        """Every problem found, none fixed: storage integrity and rows outside their domain
        (the backend's own checks), `validate_history` on every task, each stored summary
        against the one its history gives, running runs whose lease has expired, and every
        vendor lane's stored state against the fold of its history."""
        at = moment(now)
        problems = self._store.storage_problems()
        if problems:
            return problems  # rows the code cannot read: the checks below would only crash
        with self._store.read() as tx:  # one snapshot: the stream, then its doubtful tasks
            doubtful = [
                task_id
                for task_id, rows in groupby(tx.history_rows(), _TASK_OF_ROW)
                if not _history_is_clean(list(rows), at)
            ]
            for start in range(0, len(doubtful), LIST_PAGE):
                page = doubtful[start : start + LIST_PAGE]
                runs_by_task: dict[str, list[Run]] = {task_id: [] for task_id in page}
                for run in tx.runs_of(page):
                    runs_by_task[run.task_id].append(run)
                for task_id in page:
                    task = tx.task(task_id)
                    if task is not None:  # read in the same snapshot as the stream
                        problems.extend(self._task_problems(task, runs_by_task[task_id], at))
        with self._store.read() as tx:
            grants = tx.grants(None)
            audited = {
                (str(e.detail.get("principal")), str(e.detail.get("role")), e.actor, e.at)
                for e in tx.audit_events(None)
                if e.action == AuditAction.ROLE_GRANT
            }
        for grant in grants:
            made = (grant.principal, grant.role, grant.granted_by, grant.granted_at)
            if made not in audited:
                problems.append(
                    f"grant: {grant.principal} holds {grant.role} (granted by "
                    f"{grant.granted_by} at {when(grant.granted_at)}) with no role.grant in "
                    "the audit: it was not made through execkit; revoke it (execkit role "
                    "revoke) unless you know who wrote it"
                )
        problems.extend(self._lane_problems())
        return problems

    def _task_problems(self, task: TaskRecord, runs: list[Run], at: float) -> list[str]:
        """Every problem of `task` and its `runs`, each named as the validating constructors
        and `summarize` name it: the check of a task `_history_is_clean` doubts."""
        problems: list[str] = []
        history: list[Attempt] = []
        for run in runs:
            try:
                history.append(_checked_attempt(run))
            except InvalidInput as exc:  # a stored value of the wrong shape
                problems.append(f"{task.id}: run {run.id}: {exc.message}")
        if problems:
            return problems
        try:
            validate_history(history)
        except HistoryError as exc:
            return [f"{task.id}: {exc.message}"]
        expected = summarize(history)
        if not _stored_as(task, expected):
            problems.append(
                f"{task.id}: its stored summary differs from its history "
                f"(stored {_summary_text(task.summary)}; history "
                f"{_summary_text(expected)}); `execkit db check --repair` rebuilds it"
            )
        succeeded = any(run.status is AttemptStatus.SUCCEEDED for run in runs)
        if task.status is TaskStatus.DONE and not succeeded:
            problems.append(f"{task.id}: task is done but no run succeeded")
        if task.status is TaskStatus.OPEN and succeeded:
            problems.append(f"{task.id}: a run succeeded but the task is still open")
        for run in runs:
            if (
                run.status is AttemptStatus.RUNNING
                and run.lease_expires_at is not None
                and run.lease_expires_at <= at
            ):
                problems.append(
                    f"{task.id}: run {run.id} is running but its lease expired at "
                    f"{when(run.lease_expires_at)}; `execkit db check --repair` abandons it"
                )
        return problems

    def repair(self, *, now: float | None = None) -> list[str]:
        """Fix what `validate` can fix and say what was done: abandon running runs whose
        lease expired (one transaction, as an admission would), then rebuild every stored
        summary (and lane state) that differs from its history (a second; the history is
        the truth). Each
        step is whole on its own, so a failure between them leaves a valid ledger that a
        second `repair` finishes. A broken history is not touched."""
        at = moment(now)
        done = [
            f"{run.task_id}: abandoned run {run.id} (lease expired)"
            for run in self.abandon_expired_runs(now=at)
        ]
        with self._store.write() as tx:
            for task in tx.tasks():
                history = [attempt_from_run(run) for run in tx.runs(task.id)]
                try:
                    validate_history(history)
                except HistoryError:
                    continue
                expected = summarize(history)
                if expected != task.summary:
                    tx.write_summary(task.id, expected)
                    tx.audit(
                        AuditEntry(
                            at=at,
                            actor=SYSTEM_ACTOR,
                            action=AuditAction.TASK_REPAIR_SUMMARY,
                            task_id=task.id,
                        )
                    )
                    done.append(f"{task.id}: rebuilt its summary from its history")
            done.extend(self._repair_lanes(tx))
        return done


_ABANDONED = AttemptStatus.ABANDONED
_EMPTY_SUMMARY = HistorySummary()
_EMPTY_VALUES = summary_values(_EMPTY_SUMMARY)


def _stored_as(task: TaskRecord, expected: HistorySummary) -> bool:
    """Whether `task`'s stored summary is `expected` (`task.summary == expected`), compared
    column by column as `summary_values` gives it (no summary built a task: `db check`
    compares every task's). A task with no summary row holds the empty summary."""
    if task.attempts_used is None:
        return expected == _EMPTY_SUMMARY
    return task[SUMMARY_AT:] == summary_values(expected)


def _plainly_sound(run: Run) -> bool:
    """Whether `run`'s fields are plainly what `Attempt` accepts as they are: the number an
    int >= 1, each time a finite float or None, the reason a str or None, the flags bools,
    the enums read through `domain` already, stopped only when abandoned."""
    number, reason = run.attempt, run.reason
    started, ended, not_before = run.started_at, run.ended_at, run.not_before
    return (
        type(number) is int
        and number >= 1
        and type(run.status) is AttemptStatus
        and (run.failure_class is None or type(run.failure_class) is FailureClass)
        and (reason is None or type(reason) is str)
        and (started is None or (type(started) is float and started - started == 0))
        and (ended is None or (type(ended) is float and ended - ended == 0))
        and (not_before is None or (type(not_before) is float and not_before - not_before == 0))
        and type(run.forced) is bool
        and type(run.stopped) is bool
        and (not run.stopped or run.status is _ABANDONED)
        and type(run.lane_held) is bool
        and (
            not run.lane_held
            or (run.status is AttemptStatus.FAILED and run.failure_class is FailureClass.UPSTREAM)
        )
    )


def _checked_attempt(run: Run) -> Attempt:
    """`attempt_from_run(run)`, which validates every field, in fewer steps for a run that
    is plainly sound (`_plainly_sound`). Anything else goes through `attempt_from_run`,
    so a run it refuses is refused with its own message."""
    if _plainly_sound(run):
        return stored_attempt(
            run.attempt,
            run.status,
            run.failure_class,
            run.reason,
            run.started_at,
            run.ended_at,
            run.forced,
            run.not_before,
            run.stopped,
            run.lane_held,
        )
    return attempt_from_run(run)


_RUNNING = AttemptStatus.RUNNING
_SUCCEEDED = AttemptStatus.SUCCEEDED
_FAILED = AttemptStatus.FAILED
_UPSTREAM = FailureClass.UPSTREAM
_TASK_OF_ROW = itemgetter(HISTORY_ROW.index("task_id"))
_TASK_STATUS_AT = HISTORY_ROW.index("task_status")
_SUMMARY = slice(HISTORY_ROW.index("attempts_used"), HISTORY_ROW.index("run_id"))
_RUN_AT = HISTORY_ROW.index("run_id")
_LEASE_AT = HISTORY_ROW.index("lease_expires_at")
_STOPPED_AT = HISTORY_ROW.index("stopped")
_LANE_HELD_AT = HISTORY_ROW.index("lane_held")
# Where the folded values (`summary_values`' order) hold the running number and the last
# attempt's status.
_RUNNING_AT = TaskRecord._fields[SUMMARY_AT:].index("running")
_LAST_STATUS_AT = TaskRecord._fields[SUMMARY_AT:].index("last_status")


def _history_is_clean(rows: list[tuple[Any, ...]], at: float) -> bool:
    """Whether one task's rows of `Tx.history_rows` (its runs in order) are plainly free of
    every problem `_task_problems` names: each run plainly sound, the history one
    `validate_history` accepts, the stored summary the one its history folds to, the task's
    status agreeing with a success, no running run's lease expired at `at`. Read from the
    values as stored (no run, attempt or summary built: `db check` reads every run of the
    ledger). False for anything else, plainly wrong or merely unusual (a value of another
    type, a status this execkit does not know): the caller reads that task again and
    checks it the validating way, which names what is wrong."""
    first = rows[0]
    if first[_RUN_AT] is None:  # no run
        folded: tuple[Any, ...] | None = _EMPTY_VALUES
    else:
        folded = _sound_summary_values(rows)
        if folded is None:
            return False
    stored = first[_SUMMARY]
    if stored[0] is None:  # no summary row: the empty summary
        if folded != _EMPTY_VALUES:
            return False
    elif stored != folded:
        return False
    # A history `validate_history` accepts can only succeed at its last attempt.
    succeeded = folded[_LAST_STATUS_AT] == _SUCCEEDED
    status = _TASK_STATUSES.get(first[_TASK_STATUS_AT])
    if status is None:
        return False  # not a status this execkit knows: `TaskRecord.status` names it
    if status is not TaskStatus.CANCELLED and (status is TaskStatus.DONE) is not succeeded:
        return False  # done with no success, or open after one
    running = folded[_RUNNING_AT]
    if running is not None:  # the one running run, its number its place
        lease = rows[running - 1][_LEASE_AT]
        if lease is not None and (type(lease) is not float or lease <= at):
            return False
    return True


def _sound_summary_values(rows: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    """`summary_values(summarize(history))` of one task's runs (its rows of
    `Tx.history_rows`, in order), folded from their values (`counted_after`, the fold
    `summarize` makes; no Attempt or summary built: `db check` folds every run of the
    ledger), when every run is plainly what `Attempt` accepts as the ledger reads it (the
    number an int equal to its place, the status and class known, the reason a str or
    None, each time a finite float or None, stopped only when abandoned) and the history
    is what `validate_history` accepts (numbered 1..N, at most one running, nothing after
    a success); else None, and the caller checks them the validating way."""
    charged = streak = 0
    streak_reason: str | None = None
    running: int | None = None
    last: tuple[Any, ...] = ()
    status: AttemptStatus | None = None
    klass: FailureClass | None = None
    for number, row in enumerate(rows, 1):
        if status is _SUCCEEDED:
            return None  # nothing may follow a success
        (_, attempt, raw_status, raw_class, reason, forced, started, ended, not_before) = row[
            _RUN_AT : _RUN_AT + 9
        ]
        stopped = bool(row[_STOPPED_AT])
        lane_held = bool(row[_LANE_HELD_AT])
        status = _ATTEMPT_STATUSES.get(raw_status)
        klass = None if raw_class is None else _FAILURE_CLASSES.get(raw_class)
        if not (
            type(attempt) is int
            and attempt == number
            and status is not None
            and (klass is not None or raw_class is None)
            and (reason is None or type(reason) is str)
            and (started is None or (type(started) is float and started - started == 0))
            and (ended is None or (type(ended) is float and ended - ended == 0))
            and (not_before is None or (type(not_before) is float and not_before - not_before == 0))
            and (not stopped or status is _ABANDONED)
            and (not lane_held or (status is _FAILED and klass is _UPSTREAM))
        ):
            return None
        if status is _RUNNING:
            if running is not None:
                return None  # two running
            running = number  # a running attempt neither charges nor moves the streak
        else:
            charged, streak, streak_reason = counted_after(
                charged, streak, streak_reason, status, klass, reason, bool(forced), stopped,
                lane_held,
            )  # fmt: skip
        last = row
    if not last:
        return _EMPTY_VALUES
    (_, number, _, _, reason, forced, started, ended, not_before) = last[_RUN_AT : _RUN_AT + 9]
    return (
        len(rows),
        charged,
        streak,
        streak_reason,
        running,
        number,
        str(status),
        None if klass is None else str(klass),
        reason,
        started,
        ended,
        bool(forced),
        not_before,
        bool(last[_STOPPED_AT]),
        bool(last[_LANE_HELD_AT]),
    )


def _summary_text(summary: HistorySummary) -> str:
    return (
        f"{summary.attempts_used} attempts, {summary.charged_attempts} charged, "
        f"streak {summary.uncharged_streak}, running {summary.running}"
    )
