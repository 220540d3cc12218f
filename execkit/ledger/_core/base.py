"""What every ledger operation shares: the store, the budget policies, the lookups that
raise NotFound, the idempotency replay, the decision on a task's summary and the `Task`
it is shown as, and who holds which role.

`CoreBase` holds the store and the policies (`budget`, `backoff`); each concern's
operations subclass it (`tasks`, `runs`, `leases`, `roles`, `inspection`) and `LedgerCore`
is composed from them. The helpers here open no transaction: each takes the `Tx` of the
operation that calls it, so an operation stays one transaction whatever it reuses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import (
    Attempt,
    Decision,
    DecisionFields,
    DispatchCap,
    HistorySummary,
    LastAttempt,
    TaskState,
    WorkBudget,
    decision_values,
    summarize,
)
from execkit._errors import Conflict, HistoryError, NotFound, StorageError
from execkit._lanes import LaneConfigHistory
from execkit.ledger._core.store import (
    _ATTEMPT_STATUSES,
    _FAILURE_CLASSES,
    _TASK_STATUSES,
    StaleCopy,
    Store,
    TaskRecord,
    Tx,
)
from execkit.ledger._model import (
    KNOWN_ROLES,
    Actor,
    AuditAction,
    NotifyKind,
    Run,
    Task,
    TaskStatus,
    TaskValues,
)

__all__ = [
    "DEFAULT_BUDGET",
    "FINISHED_STATUSES",
    "SYSTEM_ACTOR",
    "CoreBase",
    "attempt_from_run",
    "when",
]

FINISHED_STATUSES = (TaskStatus.DONE, TaskStatus.CANCELLED)
# The state each finished status shows (`_project`): its own name.
_FINISHED_STATES = {status: TaskState(status) for status in FINISHED_STATUSES}
# `_task_values` makes a task's `TaskValues` as a tuple of its fields in their order (a
# NamedTuple's own constructor costs twice as much, once a listed task).
_values_of = functools.partial(tuple.__new__, TaskValues)
DEFAULT_BUDGET = WorkBudget()
# The actor of what the ledger does by itself (abandoning an expired run, a repair).
SYSTEM_ACTOR = "execkit"


def when(at: float) -> str:
    """`at` as a message words it (`execkit._stamp.utc_stamp`, loaded by the first message
    that names a time: a listing names none)."""
    from execkit._stamp import utc_stamp

    return utc_stamp(at)


def attempt_from_run(run: Run) -> Attempt:
    """A stored run as the `Attempt` the budget policies read."""
    return Attempt(
        number=run.attempt,
        status=run.status,
        failure_class=run.failure_class,
        reason=run.reason,
        started_at=run.started_at,
        ended_at=run.ended_at,
        forced=run.forced,
        not_before=run.not_before,
        stopped=run.stopped,
        lane_held=run.lane_held,
    )


_T = TypeVar("_T")


class CoreBase:
    """The store and the policies every concern's operations read (see the module
    docstring). Not thread-safe: one per thread or process, as its store."""

    def __init__(
        self,
        store: Store,
        *,
        budget: WorkBudget = DEFAULT_BUDGET,
        backoff: Backoff = SCHEDULER_BACKOFF,
    ) -> None:
        self._store = store
        self.budget = budget
        self.backoff = backoff
        # The lanes' configuration lives in the ledger (every host folds lane events with
        # the same one); the last stored text read and its parse, so an unchanged one is
        # not parsed again at each lane event.
        self._lane_settings: tuple[str | None, LaneConfigHistory] = (None, LaneConfigHistory())
        # Issue #45: each lane's reservation estimate as last read (when, the 90th
        # percentile of its recent USD and tokens), kept `ESTIMATE_TTL_S` (`spend.py`).
        self._estimates: dict[str | None, tuple[float, float | None, int | None]] = {}
        # The caps of the last admission's (configuration, lane, time) and their windows:
        # PostgreSQL's plan of the spend reads and the gate after them ask the same
        # (`SpendOps._applying`); one entry, replaced whole (threads share a handle).
        self._last_applying: tuple[Any, ...] = ()
        # Whether a spend configuration this handle read said some task has its own cap
        # (it never goes back to False in a ledger): a result's check of the task's cap,
        # for what a person is told, is read only then (`RunOps.finish_run`), so a ledger
        # with no task cap keeps its result to the same round trips.
        self._task_budgets_seen = False

    @staticmethod
    def _copy_first(transaction: Callable[[StaleCopy | None], _T]) -> _T:
        """`transaction(None)`: its write transaction may decide on the store's copy of the
        rows (`Store.write(remembered=True)`); run again on rows read under the lock
        (`transaction(stale)`: `Store.write(after=stale)`, within what is left of the
        caller's wait) when that copy was stale (nothing written) or its connection was
        lost, so `transaction` must be idempotent (`Store.write`). When the first one's
        outcome is unknown and the second fails on the storage too, the caller hears the
        first one's doubt: what the second found says nothing of what the first did."""
        try:
            return transaction(None)
        except StaleCopy as raised:
            stale = raised
        if stale.in_doubt is None:
            return transaction(stale)
        doubt = stale.in_doubt
        try:
            return transaction(stale)
        except StorageError as again:
            raise StorageError(
                f"{doubt.message}; reading it back failed too: {again.message}"
            ) from None

    def _task(self, tx: Tx, task_id: str, *, lock: bool = False) -> TaskRecord:
        task = tx.task(task_id, lock=lock)
        if task is None:
            raise NotFound(f"no task {task_id!r}")
        return task

    def _run(self, tx: Tx, run_id: str) -> Run:
        run = tx.run(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        return run

    def _replayed(
        self, tx: Tx, scope: AuditAction, key: str | None, fingerprint: str
    ) -> dict[str, Any] | None:
        """The stored response for (scope, key); Conflict when the request differs.

        A key's scope is the action the keyed request records (its value is the stored
        scope), so one key may serve a creation and a limit change without meeting."""
        if key is None:
            return None
        found = tx.idempotent(scope, key)
        if found is None:
            return None
        stored_fingerprint, response = found
        if stored_fingerprint != fingerprint:
            raise Conflict(
                f"idempotency key {key!r} was already used for a different {scope} request"
            )
        return response

    def _remember(
        self,
        tx: Tx,
        scope: AuditAction,
        key: str | None,
        fingerprint: str,
        response: dict[str, Any],
        at: float,
    ) -> None:
        if key is not None:
            tx.remember(scope, key, fingerprint, response, at)

    def _decide(
        self,
        task: TaskRecord,
        now: float,
        cap: DispatchCap | None,
        *,
        force: bool = False,
        ignore_backoff: bool = False,
    ) -> Decision:
        return Decision(
            *self._decision_fields(task, now, cap, force=force, ignore_backoff=ignore_backoff)
        )

    def _decision_fields(
        self,
        task: TaskRecord,
        now: float,
        cap: DispatchCap | None,
        *,
        force: bool = False,
        ignore_backoff: bool = False,
        timed: bool = True,
    ) -> DecisionFields:
        """The decision on `task`'s summary, as `decision_fields` gives it, read from the
        record's columns (`decision_values`: no summary, attempt, limit or budget built; a
        listing decides on every open task it shows; `timed` as `decision_values` takes
        it). A stored status or class outside its enum is a StorageError naming the row,
        as `TaskRecord.last` raises it."""
        (
            _, _, _, _, _, limit, ceiling, retry_requested_by, _, used, charged, streak,
            streak_reason, running, number, last_status, last_class, last_reason, started_at,
            ended_at, _, not_before, stopped, _,
        ) = task  # fmt: skip
        # An operator's pending retry is forced and runs when the operator asked, not after
        # the backoff: it is what the next admission does, so it is what the task shows.
        pending = retry_requested_by is not None
        budget = self.budget
        if ceiling is None:
            ceiling = budget.max_uncharged_attempts
        last: LastAttempt | None = None
        if used is None:  # no summary row (a left join): no history yet
            used = charged = streak = 0
        elif number is not None:
            # The last attempt as `decision_values` reads it (`TaskRecord.last`'s values,
            # without the Attempt): its status and class by one lookup each (a listing
            # decides on every open task), `last_kind` naming a value outside its enum.
            kind = _ATTEMPT_STATUSES.get(last_status)
            klass = None if last_class is None else _FAILURE_CLASSES.get(last_class)
            if kind is None or (klass is None and last_class is not None):
                kind, klass = task.last_kind()
            last = (
                number, kind, klass, last_reason, started_at, ended_at, not_before,
                bool(stopped),
            )  # fmt: skip
        return decision_values(
            used, charged or 0, streak or 0, streak_reason, running, last,
            budget.max_attempts, ceiling, limit, self.backoff, now, cap,
            force=force or pending, ignore_backoff=ignore_backoff or pending, timed=timed,
        )  # fmt: skip

    def _project(
        self, task: TaskRecord, now: float, cap: DispatchCap | None, *, force: bool = False
    ) -> Task:
        """The `Task` that `task` shows at `now`: `Task(*self._task_values(...))`."""
        return Task(*self._task_values(task, now, cap, force=force))

    def _task_values(
        self, task: TaskRecord, now: float, cap: DispatchCap | None, *, force: bool = False
    ) -> TaskValues:
        """The fields of the `Task` that `task` shows at `now`: `_page_values` of it alone."""
        return self._page_values((task,), now, cap, force=force)[0]

    def _page_values(
        self,
        records: Sequence[TaskRecord],
        now: float,
        cap: DispatchCap | None,
        *,
        force: bool = False,
        timed: bool = True,
    ) -> list[TaskValues]:
        """The fields of the `Task` each record shows at `now`, in order: the one mapping
        from a stored task to what every surface prints (`get_task`, the listings, the
        dashboard). A done or cancelled task shows its status with nothing to decide (no
        bound, reason or next time: the policies' verdict on it is not shown), so no
        decision is made for it; an open one shows the decision on its summary, as
        `_decision_fields` reads it (its columns, no summary or attempt built).
        `timed=False`: a ready task's `next_attempt_at` may be None, as `decision_values`
        says (for a caller that shows no time for a ready task).

        A page at a time (a listing's `LIST_PAGE`): the policies are read once a page and
        each record is unpacked once, since a listing of 100,000 tasks is this loop. Raises
        as `_decision_fields` does: a stored status or class outside its enum is a
        StorageError naming the row."""
        budget = self.budget
        max_attempts, budget_ceiling = budget.max_attempts, budget.max_uncharged_attempts
        statuses, finished_states = _TASK_STATUSES, _FINISHED_STATES
        ready_state = TaskState.READY
        decision_fields = self._decision_fields
        values: list[TaskValues] = []
        append = values.append
        for task in records:
            (
                task_id, title, stored_status, created_by, created_at, limit, ceiling,
                retry_requested_by, gave_up, used, charged, streak,
                # The rest `_decision_fields` reads, for an open task.
                _, _, _, _, _, _, _, _, _, _, _, _,
            ) = task  # fmt: skip
            # The stored status as its member (one lookup; `task.status` names a bad one).
            status = statuses.get(stored_status) or task.status
            pending = retry_requested_by is not None
            if ceiling is None:
                ceiling = budget_ceiling
            finished = finished_states.get(status)
            if finished is not None:
                # Read from the record's columns (no summary built). What `decide_summary`
                # counts for any history: an explicit limit bounds runs started, the budget
                # bounds charged attempts.
                used, charged = used or 0, charged or 0
                append(
                    _values_of(  # in `TaskValues` order
                        (
                            task_id, title, status, finished,
                            None,  # blocked_on
                            None,  # reason
                            False,  # ready
                            limit, used, charged,
                            streak or 0,  # uncharged_streak
                            max(0, limit - used if limit else max_attempts - charged),
                            None,  # next_attempt_at
                            created_by, created_at, ceiling, pending, gave_up,
                        )
                    )
                )  # fmt: skip
                continue
            decided = decision_fields(task, now, cap, force=force, timed=timed)
            state, blocked_on, _, next_attempt_at, reason, used, charged, streak, remaining = (
                decided
            )
            if pending and state is ready_state:
                reason = f"an operator's forced retry is pending ({retry_requested_by})"
            append(
                _values_of(  # in `TaskValues` order
                    (
                        task_id, title, status, state, blocked_on, reason,
                        # ADR 0033: `ready` includes that an attempt is still available, and
                        # here it is exactly what admission does now: a task in backoff is
                        # not ready.
                        state is ready_state,
                        limit, used, charged, streak, remaining, next_attempt_at, created_by,
                        created_at, ceiling, pending, gave_up,
                    )
                )
            )  # fmt: skip
        return values

    def _load_task(
        self, tx: Tx, task_id: str, now: float, cap: DispatchCap | None, *, force: bool = False
    ) -> Task:
        return self._project(self._task(tx, task_id), now, cap, force=force)

    def _roles(self, tx: Tx, actor: Actor) -> frozenset[str]:
        """The roles `actor` holds: its grants; the ledger's owner holds every role (it
        can rewrite the storage anyway, so pretending otherwise would protect nothing)."""
        if actor.name == self._store.owner():
            return KNOWN_ROLES
        return frozenset(grant.role for grant in tx.grants(actor.name))

    def _notify(
        self, tx: Tx, kind: NotifyKind, subject: str, payload: Mapping[str, Any], at: float
    ) -> str:
        """Write one notification event (issue #49) in `tx`, the transaction of the change
        it reports, so neither commits without the other; its stable id. Every string of
        `payload` is masked (`check_json`)."""
        import json
        import uuid

        from execkit.ledger._core.inputs import check_json

        event_id = f"evt_{uuid.uuid4().hex}"
        body = check_json("payload", payload, 64 * 1024)
        tx.add_notify_event(event_id, str(kind), subject, json.dumps(body, sort_keys=True), at)
        return event_id

    def _notify_blocked(
        self, tx: Tx, task: TaskRecord, decision: Decision, at: float, state: str | None
    ) -> None:
        """`issue.blocked` for `task` (its record as it now stands), once per attempt count:
        the result that blocked it writes it, and a dispatcher's give-up of the same
        history (which moves the board's card) writes none again (a marker in the
        idempotency table, in this transaction)."""
        attempts = task.attempts_used or 0
        marker = f"{task.id}#{attempts}"
        if tx.idempotent("notify.blocked", marker) is not None:
            return
        tx.remember("notify.blocked", marker, "notify", {"at": at}, at)
        environment = task.last_class == "environment"
        self._notify(
            tx,
            NotifyKind.ISSUE_BLOCKED,
            task.id,
            {
                "task_id": task.id,
                "title": task.title,
                "state": state,
                "attempts": attempts,
                "class": task.last_class,
                "reason": task.last_reason,
                "blocked_on": decision.blocked_on,
                # An environment failure's reason names its fix (ADR 015).
                "fix": task.last_reason if environment else None,
                "decision": decision.reason,
            },
            at,
        )

    def _summary_after(self, tx: Tx, task: TaskRecord, ended: Run) -> HistorySummary:
        """The task's summary once `ended` (its running run) finished, written back."""
        try:
            summary = task.summary.finished(attempt_from_run(ended))
        except HistoryError:
            # The stored summary disagrees with the history: rebuild it from the runs
            # (the history is the truth; `db check` reports how they differed).
            summary = summarize([attempt_from_run(run) for run in tx.runs(task.id)])
        tx.write_summary(task.id, summary)
        return summary
