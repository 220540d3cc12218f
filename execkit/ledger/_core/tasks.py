"""Tasks and their attempt policy: creating, reading and cancelling a task, its explicit
attempt limit (a compare-and-set), an operator's forced retry, and a dispatcher's give-up.

A task's state (ready, running, backing off, blocked) is never stored: it is decided from
its history's summary each time the task is read (`CoreBase._project`). What is stored are
the facts an operator or a dispatcher adds: the limit (with who set it), a pending forced
retry, the attempt a dispatcher gave up at. Each change is one transaction with its audit
record, and a keyed change (creation, a limit) with its stored response, so replaying the
key returns the same task.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from execkit._budget import Attempt, BlockedOn, DispatchCap, TaskState
from execkit._errors import AttemptLimitReached, Conflict, Forbidden, TaskBlocked, TaskFinished
from execkit.ledger._core.base import FINISHED_STATUSES
from execkit.ledger._core.inputs import (
    MAX_KEY,
    MAX_TITLE,
    as_actor,
    as_task_state,
    check_bool,
    check_limit,
    check_name,
    check_text,
    check_uncharged,
    clean_reason,
    creation_fingerprint,
    fingerprint_of,
    moment,
)
from execkit.ledger._core.spend import SpendOps
from execkit.ledger._core.store import _ATTEMPT_STATUSES, _FAILURE_CLASSES, TaskRecord
from execkit.ledger._model import (
    LIST_PAGE,
    OPERATE_ROLE,
    Actor,
    AuditAction,
    AuditEntry,
    LastOutcome,
    Ledger,
    Task,
    TaskStatus,
    TaskValues,
    last_outcome,
    task_values,
)

__all__ = ["TaskOps", "iter_task_values", "iter_task_values_with_last"]

# Where a task's values hold its state (a page is filtered by it).
_STATE = TaskValues._fields.index("state")


class TaskOps(SpendOps):
    """Creating, reading and cancelling tasks; attempt limits, retries and give-ups."""

    def create_task(
        self,
        title: str,
        *,
        max_attempts: int = 0,
        max_uncharged_attempts: int | None = None,
        idempotency_key: str | None = None,
        actor: Actor | str,
        now: float | None = None,
    ) -> Task:
        """Create an open task.

        `max_attempts`: 0 = no explicit limit, else 1..10000 admitted runs (ADR 0033).
        `max_uncharged_attempts`: this task's ceiling on consecutive upstream attempts,
        1..1000, or None for the ledger's budget (ADR 0046's per-item field). Replaying
        `idempotency_key` with the same request returns the same task (as it is now);
        with a different request it is a Conflict. InvalidInput changes nothing.
        """
        stored_title = check_text("title", title, MAX_TITLE)
        check_limit("max_attempts", max_attempts, allow_zero=True)
        uncharged = check_uncharged(max_uncharged_attempts)
        who = as_actor(actor)
        if idempotency_key is not None:
            idempotency_key = check_name("idempotency_key", idempotency_key, MAX_KEY)
        at = moment(now)
        # What was asked, before masking: two titles that differ only in a credential are
        # two requests (only the hash is stored).
        fingerprint = creation_fingerprint(title, max_attempts, uncharged)
        with self._store.write() as tx:
            replay = self._replayed(tx, AuditAction.TASK_CREATE, idempotency_key, fingerprint)
            if replay is not None:
                return self._load_task(tx, replay["task_id"], at, None)
            task_id = tx.insert_task(stored_title, str(who), at, uncharged)
            if max_attempts:
                tx.upsert_limit(task_id, max_attempts, str(who), at)
            detail: dict[str, Any] = {"title": stored_title, "max_attempts": max_attempts}
            if uncharged is not None:
                detail["max_uncharged_attempts"] = uncharged
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.TASK_CREATE,
                    task_id=task_id,
                    detail=detail,
                )
            )
            response = {"task_id": task_id}
            self._remember(tx, AuditAction.TASK_CREATE, idempotency_key, fingerprint, response, at)
            return self._load_task(tx, task_id, at, None)

    def get_task(
        self,
        task_id: str,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        force: bool = False,
    ) -> Task:
        """The task with the budget projection of its history at `now`; NotFound if absent.

        `cap` adds a dispatch cap to the bounds; `force=True` shows what a forced admission
        would meet (every stop lifted but an explicit limit; the backoff still applies).
        A task whose own spend cap has no room left shows blocked on `spend` (issue #45),
        here and in every listing (read with each page).
        """
        check_bool("force", force)
        at = moment(now)
        with self._store.read() as tx:
            return self._spend_block(tx, self._load_task(tx, task_id, at, cap, force=force))

    def list_tasks(
        self,
        *,
        now: float | None = None,
        state: TaskState | str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[Task]:
        """Tasks in creation order (each from its summary: no history is read): every one,
        or those in `state` (a `TaskState`), at most `limit` (1..10000), after task `after`
        (the last id of the previous page). InvalidInput for a bad filter, NotFound for an
        `after` that is no task."""
        if limit is not None:
            limit = check_limit("limit", limit, allow_zero=False)
        return list(itertools.islice(self.iter_tasks(now=now, state=state, after=after), limit))

    def iter_tasks(
        self,
        *,
        now: float | None = None,
        state: TaskState | str | None = None,
        after: str | None = None,
    ) -> Iterator[Task]:
        """`list_tasks` as it is read: `LIST_PAGE` rows at a time, each page its own read,
        so a listing of any length holds one page in memory. All are projected at one
        `now`; a task created meanwhile is listed if its page is read after it."""
        for values in self.iter_task_values(now=now, state=state, after=after):
            yield Task(*values)

    def iter_task_values(
        self,
        *,
        now: float | None = None,
        state: TaskState | str | None = None,
        after: str | None = None,
    ) -> Iterator[TaskValues]:
        """`iter_tasks`, each task as its `TaskValues` (no Task built): what a listing
        writes each task from. Raises as `iter_tasks` does, at the first task read."""
        # The pages' values chained (a task at a time without a generator's step each).
        return itertools.chain.from_iterable(self._value_pages(now, state, after))

    def _value_pages(
        self, now: float | None, state: TaskState | str | None, after: str | None
    ) -> Iterator[Iterable[TaskValues]]:
        """`iter_task_values`'s tasks, a page at a time (its arguments checked at the
        first page)."""
        at = moment(now)
        wanted = None if state is None else as_task_state(state)
        # done and cancelled are stored; every other state is an open task's projection.
        status = (
            None
            if wanted is None
            else TaskStatus(wanted)
            if wanted in (TaskState.DONE, TaskState.CANCELLED)
            else TaskStatus.OPEN
        )
        for page, held in self._task_pages(after, status):
            values = self._spend_held_values(self._projected(page, at, None), held)
            if wanted is None:
                yield values
            else:
                yield (task for task in values if task[_STATE] is wanted)

    def list_tasks_with_last(
        self,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        title_prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[tuple[Task, Attempt | None]]:
        """`iter_tasks_with_last` as a page: at most `limit` (1..10000) of its tasks, after
        task `after` (the last id of the previous page; it need not start with
        `title_prefix`). InvalidInput for a bad limit, prefix or `after`, NotFound for an
        `after` that is no task. What a client of a server reads a page a request."""
        if limit is not None:
            limit = check_limit("limit", limit, allow_zero=False)
        if title_prefix is not None:  # masked as a stored title is, so the two compare
            title_prefix = check_text("title_prefix", title_prefix, MAX_TITLE)
        return list(itertools.islice(self._with_last(now, cap, title_prefix, after), limit))

    def iter_tasks_with_last(
        self,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        title_prefix: str | None = None,
    ) -> Iterator[tuple[Task, Attempt | None]]:
        """Every task in creation order (whose title starts with `title_prefix`, if given),
        projected at one `now` with `cap` (as `get_task` does), beside its last attempt as
        its summary holds it (no history is read; `db check` compares each summary with
        its history). Read `LIST_PAGE` tasks at a time, as `iter_tasks`: what a dashboard
        of every dispatched task reads in one pass."""
        if title_prefix is not None:  # masked as a stored title is, so the two compare
            title_prefix = check_text("title_prefix", title_prefix, MAX_TITLE)
        return self._with_last(now, cap, title_prefix, None)

    def _with_last(
        self,
        now: float | None,
        cap: DispatchCap | None,
        title_prefix: str | None,
        after: str | None,
    ) -> Iterator[tuple[Task, Attempt | None]]:
        """`iter_tasks_with_last`'s tasks after task `after` (`title_prefix` checked by the
        caller; `now` and `after` at the first task read)."""
        at = moment(now)
        for values, records in self._titled(at, cap, title_prefix, after=after):
            for task, record in zip(values, records, strict=True):
                yield Task(*task), record.last

    def iter_task_values_with_last(
        self,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        title_prefix: str | None = None,
        ready_times: bool = True,
    ) -> Iterator[tuple[TaskValues, LastOutcome | None]]:
        """`iter_tasks_with_last`, each task as its `TaskValues` and its last attempt as
        its `LastOutcome` (no Task or Attempt built). Raises as `iter_tasks_with_last`.

        `ready_times=False`, for a reader that shows no time for a ready task (a dashboard
        shows one only for a task backing off): a ready task's `next_attempt_at` may be
        None where its time was not needed to decide its state (`decision_values`'s
        `timed`), which spares computing it; every other value is the same."""
        at = moment(now)
        if title_prefix is not None:  # masked as a stored title is, so the two compare
            title_prefix = check_text("title_prefix", title_prefix, MAX_TITLE)
        return itertools.chain.from_iterable(
            zip(values, _last_outcomes(records), strict=True)
            for values, records in self._titled(at, cap, title_prefix, ready_times)
        )

    def _titled(
        self,
        at: float,
        cap: DispatchCap | None,
        title_prefix: str | None,
        timed: bool = True,
        *,
        after: str | None = None,
    ) -> Iterator[tuple[Iterable[TaskValues], list[TaskRecord]]]:
        """The stored tasks after task `after` whose title starts with `title_prefix`
        (checked), a page at a time: their values at `at` (`timed`: as `_page_values` takes
        it) beside their records."""
        for page, held in self._task_pages(after, None):
            if title_prefix is not None:
                page = [record for record in page if record.title.startswith(title_prefix)]
            yield self._spend_held_values(self._projected(page, at, cap, timed), held), page

    def _projected(
        self, page: list[TaskRecord], at: float, cap: DispatchCap | None, timed: bool = True
    ) -> Iterable[TaskValues]:
        """`_page_values` of `page`; when one of its records raises (a value outside its
        enum), the page a task at a time instead, so that the tasks before that one are
        listed and then its error raised, as a listing a task at a time would."""
        try:
            return self._page_values(page, at, cap, timed=timed)
        except Exception:
            return (self._page_values((record,), at, cap, timed=timed)[0] for record in page)

    def _task_pages(
        self, after: str | None, status: TaskStatus | None
    ) -> Iterator[tuple[list[TaskRecord], dict[str, str]]]:
        """The stored tasks after task `after` (NotFound if it is no task), of `status`, a
        page of `LIST_PAGE` a read, each page as it is read, beside the open ones of it
        their own budget holds (`_spend_held`, read with it): a listing shows a task as
        `get_task` does."""
        if after is not None:
            after = check_text("after", after, MAX_KEY)
            with self._store.read() as tx:
                self._task(tx, after)  # NotFound: no page follows a task that is not there
        while True:
            with self._store.read() as tx:
                page = tx.task_page(after, LIST_PAGE, status)
                held = self._spend_held(tx, (r.id for r in page if r.stored_status == "open"))
            yield page, held
            if len(page) < LIST_PAGE:
                return
            after = page[-1].id

    def set_attempt_limit(
        self,
        task_id: str,
        max_attempts: int,
        *,
        expected_max_attempts: int,
        actor: Actor | str,
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Task:
        """Compare-and-set the task's explicit limit (1..10000).

        `expected_max_attempts` must equal the current limit (0 = none), else Conflict
        naming the current value. The creator may change it before the first run;
        afterwards the actor needs the role `agent.operate`, granted in the ledger
        (Forbidden). A done or cancelled task refuses (`TaskFinished`). Limit, audit event
        and keyed response are written in one transaction. Lowering never touches a
        running run; raising makes an `attempt_limit` task ready again with its history.
        """
        check_limit("max_attempts", max_attempts, allow_zero=False)
        check_limit("expected_max_attempts", expected_max_attempts, allow_zero=True)
        who = as_actor(actor)
        if idempotency_key is not None:
            idempotency_key = check_name("idempotency_key", idempotency_key, MAX_KEY)
        at = moment(now)
        fingerprint = fingerprint_of(
            {
                "task_id": task_id,
                "max_attempts": max_attempts,
                "expected_max_attempts": expected_max_attempts,
            }
        )
        with self._store.write() as tx:
            replay = self._replayed(
                tx, AuditAction.TASK_SET_ATTEMPT_LIMIT, idempotency_key, fingerprint
            )
            if replay is not None:
                return self._load_task(tx, replay["task_id"], at, None)
            task = self._task(tx, task_id, lock=True)
            if task.status in FINISHED_STATUSES:
                raise TaskFinished(
                    f"task {task_id} is {task.status}; its attempt policy can no longer change"
                )
            started = task.summary.attempts_used
            roles = self._roles(tx, who)
            creator_before_first_run = started == 0 and who.name == task.created_by
            if not creator_before_first_run and OPERATE_ROLE not in roles:
                whom = "after its first run" if started else "by anyone but its creator"
                raise Forbidden(
                    f"changing the attempt limit of task {task_id} {whom} needs the role "
                    f"{OPERATE_ROLE} (execkit role grant {who.name} {OPERATE_ROLE})"
                )
            if task.max_attempts != expected_max_attempts:
                raise Conflict(
                    f"expected_max_attempts {expected_max_attempts} does not match the current "
                    f"limit of task {task_id}: {task.max_attempts}"
                )
            tx.upsert_limit(task_id, max_attempts, str(who), at)
            if max_attempts == 0 or max_attempts > task.max_attempts:
                self._wake(tx)  # raised (or lifted): a task held at its limit may run
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.TASK_SET_ATTEMPT_LIMIT,
                    task_id=task_id,
                    detail={
                        "from": task.max_attempts,
                        "to": max_attempts,
                        "attempts_started": started,
                        "roles": sorted(roles),
                    },
                )
            )
            self._remember(
                tx,
                AuditAction.TASK_SET_ATTEMPT_LIMIT,
                idempotency_key,
                fingerprint,
                {"task_id": task_id, "max_attempts": max_attempts},
                at,
            )
            return self._load_task(tx, task_id, at, None)

    def cancel_task(self, task_id: str, *, actor: Actor | str, now: float | None = None) -> Task:
        """Cancel an open task (idempotent); a done task refuses with `TaskFinished`.

        A running run is not touched: it finishes and is recorded as usual.
        """
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            task = self._task(tx, task_id, lock=True)
            if task.status is TaskStatus.DONE:
                raise TaskFinished(f"task {task_id} is done; it cannot be cancelled")
            if task.status is TaskStatus.OPEN:
                tx.set_task_status(task_id, TaskStatus.CANCELLED, at)
                tx.audit(
                    AuditEntry(
                        at=at, actor=str(who), action=AuditAction.TASK_CANCEL, task_id=task_id
                    )
                )
            return self._load_task(tx, task_id, at, None)

    def retry_task(
        self,
        task_id: str,
        *,
        actor: Actor | str,
        reason: str | None = None,
        force: bool = False,
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Task:
        """An operator asks for one forced retry of a stopped task; the next admission (by
        the dispatcher or `start_run`) is forced and clears the request.

        After an environment or upstream stop (uncharged: the budget is intact) nothing
        more is needed. After a work stop (the charged budget is spent) it needs
        `force=True`. After an explicit limit is used up it needs `force=True` and the role
        `agent.operate`, and raises the limit by one (ADR 0033: a run never passes the
        limit; the operator extends it). A running, done or cancelled task refuses.
        Everything is audited with the actor and `reason` (redacted).

        Replaying `idempotency_key` with the same request returns the task (as it is now)
        and asks for nothing more, even after the retry it asked for was admitted; with a
        different request it is a Conflict. Without a key every call asks again.
        """
        who = as_actor(actor)
        check_bool("force", force)
        note = clean_reason(reason)
        if idempotency_key is not None:
            idempotency_key = check_name("idempotency_key", idempotency_key, MAX_KEY)
        at = moment(now)
        # The reason as given (only the hash is stored), the actor, and the force: a key
        # reused by another operator, or with another force, is another request.
        fingerprint = fingerprint_of(
            {"task_id": task_id, "actor": str(who), "force": force, "reason": reason}
        )
        with self._store.write() as tx:
            replay = self._replayed(tx, AuditAction.TASK_RETRY, idempotency_key, fingerprint)
            if replay is not None:
                return self._load_task(tx, replay["task_id"], at, None)
            task = self._task(tx, task_id, lock=True)
            if task.status in FINISHED_STATUSES:
                raise TaskFinished(f"task {task_id} is {task.status}; there is nothing to retry")
            decision = self._decide(task, at, None)
            if decision.state is TaskState.RUNNING:
                raise TaskBlocked(f"task {task_id} has a run in progress; nothing to retry yet")
            stopped_on = decision.blocked_on
            if stopped_on is BlockedOn.WORK and not force:
                raise TaskBlocked(
                    f"task {task_id} stopped on work ({decision.reason}): the attempts told "
                    "something about the work, so another one needs --force (it is audited)"
                )
            if stopped_on is BlockedOn.ATTEMPT_LIMIT:
                if not force:
                    raise AttemptLimitReached(
                        f"task {task_id} used its explicit limit ({decision.reason}); raise it "
                        "with set-attempt-limit, or retry with --force, which raises it by one"
                    )
                if OPERATE_ROLE not in self._roles(tx, who):
                    raise Forbidden(
                        f"retrying task {task_id} past its explicit limit raises the limit, "
                        f"which needs the role {OPERATE_ROLE}"
                    )
                tx.upsert_limit(task_id, task.max_attempts + 1, str(who), at)
                tx.audit(
                    AuditEntry(
                        at=at,
                        actor=str(who),
                        action=AuditAction.TASK_SET_ATTEMPT_LIMIT,
                        task_id=task_id,
                        detail={
                            "from": task.max_attempts,
                            "to": task.max_attempts + 1,
                            "via": AuditAction.TASK_RETRY,
                        },
                    )
                )
            tx.set_retry(task_id, str(who), at)
            self._wake(tx)
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.TASK_RETRY,
                    task_id=task_id,
                    detail={
                        "reason": note,
                        "force": force,
                        "blocked_on": stopped_on,
                        "state": decision.state,
                    },
                )
            )
            self._remember(
                tx, AuditAction.TASK_RETRY, idempotency_key, fingerprint, {"task_id": task_id}, at
            )
            return self._load_task(tx, task_id, at, None)

    def record_give_up(
        self, task_id: str, *, state: str, actor: Actor | str, now: float | None = None
    ) -> Task:
        """A dispatcher moved the task's board issue to terminal `state` after its history
        stopped it (ADR 015): remembered with the attempt count, so that finding the issue
        back in an eligible state later means an operator re-opened it (a forced retry)."""
        state = check_text("state", state, MAX_KEY)
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            task = self._task(tx, task_id, lock=True)
            attempts = task.summary.attempts_used
            tx.set_gave_up(task_id, attempts)
            decision = self._spend_decision(tx, task_id, self._decide(task, at, None))
            detail = {"state": state, "attempts": attempts, "blocked_on": decision.blocked_on}
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.TASK_GIVE_UP,
                    task_id=task_id,
                    detail=detail,
                )
            )
            # Issue #49: a person is told, in this transaction (never one without the other),
            # unless the result that blocked it told them already.
            self._notify_blocked(tx, task, decision, at, state)
            return self._load_task(tx, task_id, at, None)


def iter_task_values(
    ledger: Ledger,
    *,
    now: float | None = None,
    state: TaskState | str | None = None,
    after: str | None = None,
) -> Iterator[TaskValues]:
    """`ledger.iter_tasks(...)`, each task as its `TaskValues`: a ledger of this process
    makes them from its rows with no Task built (`TaskOps.iter_task_values`); any other
    (a server's, through `execkit.remote`) lists its Tasks, each read as its values. What
    a listing writes is then one function of the values, whichever ledger it read."""
    if isinstance(ledger, TaskOps):
        return ledger.iter_task_values(now=now, state=state, after=after)
    return map(task_values, ledger.iter_tasks(now=now, state=state, after=after))


def iter_task_values_with_last(
    ledger: Ledger,
    *,
    now: float | None = None,
    cap: DispatchCap | None = None,
    title_prefix: str | None = None,
    ready_times: bool = True,
) -> Iterator[tuple[TaskValues, LastOutcome | None]]:
    """`ledger.iter_tasks_with_last(...)`, each task as its `TaskValues` and its last
    attempt as its `LastOutcome`, as `iter_task_values` reads them: from the rows of a
    ledger of this process (`ready_times` as `TaskOps.iter_task_values_with_last` takes
    it), else from the Tasks and Attempts of any other (each with its times)."""
    if isinstance(ledger, TaskOps):
        return ledger.iter_task_values_with_last(
            now=now, cap=cap, title_prefix=title_prefix, ready_times=ready_times
        )
    return (
        (task_values(task), last_outcome(last))
        for task, last in ledger.iter_tasks_with_last(now=now, cap=cap, title_prefix=title_prefix)
    )


def _last_outcomes(records: Iterable[TaskRecord]) -> Iterator[LastOutcome | None]:
    """Each record's last attempt's outcome, from its summary columns (`record.last`'s
    status, class and reason; a value outside its enum is the StorageError `last_kind`
    raises, when its record is reached)."""
    statuses, classes = _ATTEMPT_STATUSES, _FAILURE_CLASSES
    for record in records:
        number, status, stored_class, reason = record[_LAST_NUMBER:_LAST_REASON_END]
        if number is None:
            yield None
            continue
        kind = statuses.get(status)
        klass = None if stored_class is None else classes.get(stored_class)
        if kind is None or (klass is None and stored_class is not None):
            kind, klass = record.last_kind()
        yield _outcome_of((kind, klass, reason))


# Where a record's last attempt's number, status, class and reason are, in that order.
_LAST_NUMBER = TaskRecord._fields.index("last_number")
_LAST_REASON_END = TaskRecord._fields.index("last_reason") + 1
_LAST = ("last_number", "last_status", "last_class", "last_reason")
if TaskRecord._fields[_LAST_NUMBER:_LAST_REASON_END] != _LAST:  # pragma: no cover
    raise ImportError(f"TaskRecord holds {_LAST} apart: _last_outcomes reads them in a row")
_outcome_of = functools.partial(tuple.__new__, LastOutcome)
