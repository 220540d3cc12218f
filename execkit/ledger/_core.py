"""The ledger's rules, once, over any storage backend (ADR 0033).

`LedgerCore` implements every `Ledger` operation: it checks the input, opens one
transaction of its `Store`, reads what the rule needs, decides with the budget policies and
writes. A backend (SQLite here, PostgreSQL beside it) implements only `Store` and `Tx`: its
own SQL, its own locking and its own migrations, so the two stay peers rather than ports of
each other, and neither can drift from the rules (the contract tests run both).

What a backend promises (`Store.write()`): everything inside one `with` block is one
transaction that commits at the end or rolls back on any exception, and no other writer can
interleave with it for the same task (SQLite takes the database write lock at BEGIN
IMMEDIATE; PostgreSQL locks the task row). Reads (`Store.read()`) see one snapshot.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import socket
import time
from typing import Any, Protocol

import attrs

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import (
    Attempt,
    AttemptStatus,
    BlockedOn,
    Decision,
    DispatchCap,
    ExplicitLimit,
    HistorySummary,
    TaskState,
    WorkBudget,
    decide_summary,
    summarize,
    validate_history,
)
from execkit._classify import FailureClass
from execkit._errors import (
    AdmissionRefused,
    AttemptLimitReached,
    Conflict,
    ExecKitError,
    Forbidden,
    HistoryError,
    InvalidInput,
    NotFound,
    TaskBackingOff,
    TaskBlocked,
    TaskFinished,
)
from execkit._redact import redact
from execkit._validate import is_integer, is_number
from execkit.ledger._model import (
    ADMIN_ROLE,
    CAPABILITIES,
    DEFAULT_LEASE_S,
    KNOWN_ROLES,
    MAX_ATTEMPT_LIMIT,
    MAX_LEASE_S,
    MAX_UNCHARGED_LIMIT,
    OPERATE_ROLE,
    Actor,
    AuditAction,
    AuditEntry,
    AuditEvent,
    Grant,
    Run,
    Task,
    TaskStatus,
)

__all__ = ["LedgerCore", "Store", "TaskRecord", "Tx", "attempt_from_run"]


@attrs.frozen
class TaskRecord:
    """What a backend stores of a task: the task row, its limit and its history's summary."""

    id: str
    title: str
    status: TaskStatus = attrs.field(converter=TaskStatus)
    created_by: str
    created_at: float
    max_attempts: int  # 0 = no explicit limit
    max_uncharged_attempts: int | None  # None = the ledger's budget
    retry_requested_by: str | None  # an operator's pending forced retry, if any
    gave_up_at_attempt: int | None  # a dispatcher moved it to a terminal state here
    summary: HistorySummary


class Tx(Protocol):
    """One open transaction of a backend: typed reads and writes, no rules.

    `task(..., lock=True)` is the read an admission decides on: a backend that does not
    serialise whole transactions (PostgreSQL) locks the task row with it.
    """

    def task(self, task_id: str, *, lock: bool = False) -> TaskRecord | None: ...
    def tasks(self) -> list[TaskRecord]: ...
    def runs(self, task_id: str) -> list[Run]: ...
    def all_runs(self) -> list[Run]: ...
    def run(self, run_id: str) -> Run | None: ...
    def run_at(self, task_id: str, attempt: int) -> Run | None: ...
    def expired_runs(self, now: float) -> list[Run]: ...

    def insert_task(
        self, title: str, actor: str, at: float, max_uncharged_attempts: int | None
    ) -> str: ...
    def set_task_status(self, task_id: str, status: TaskStatus, at: float) -> None: ...
    def set_retry(self, task_id: str, requested_by: str | None, at: float | None) -> None: ...
    def set_gave_up(self, task_id: str, attempts: int | None) -> None: ...
    def upsert_limit(self, task_id: str, max_attempts: int, actor: str, at: float) -> None: ...
    def write_summary(self, task_id: str, summary: HistorySummary) -> None: ...
    def insert_run(self, run: Run, lease_s: float) -> Run: ...
    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus,
        failure_class: FailureClass | None,
        reason: str | None,
        not_before: float | None,
        at: float,
    ) -> bool: ...
    def renew_lease(self, run_id: str, expires_at: float, lease_s: float | None) -> bool: ...
    def lease_of(self, run_id: str) -> float: ...

    def audit(self, entry: AuditEntry) -> None: ...
    def audit_events(self, task_id: str | None) -> list[AuditEvent]: ...
    def idempotent(self, scope: str, key: str) -> tuple[str, dict[str, Any]] | None: ...
    def remember(
        self, scope: str, key: str, fingerprint: str, response: dict[str, Any], at: float
    ) -> None: ...

    def grants(self, principal: str | None) -> list[Grant]: ...
    def put_grant(self, grant: Grant) -> bool: ...
    def delete_grant(self, principal: str, role: str) -> bool: ...
    def meta(self, key: str) -> str | None: ...


class Store(Protocol):
    """A backend: transactions over its storage, its schema and its own checks."""

    def read(self) -> contextlib.AbstractContextManager[Tx]: ...
    def write(self) -> contextlib.AbstractContextManager[Tx]: ...
    def schema_version(self) -> int: ...
    def location(self) -> str: ...
    def owner(self) -> str | None: ...
    def storage_problems(self) -> list[str]: ...
    def close(self) -> None: ...


# --- input checks ---------------------------------------------------------------------

_FINISHED_STATUSES = (TaskStatus.DONE, TaskStatus.CANCELLED)
_FINAL_RUN_STATUSES = (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.ABANDONED)
_MAX_TITLE = 1000
_MAX_KEY = 200
_MAX_REASON = 4000
_DEFAULT_BUDGET = WorkBudget()
# The actor of what the ledger does by itself (abandoning an expired run, a repair).
_SYSTEM = "execkit"


def _check_text(field: str, value: object, max_len: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{field} must be a non-empty string", field=field)
    if len(value) > max_len:
        raise InvalidInput(
            f"{field} must be at most {max_len} characters, got {len(value)}", field=field
        )
    return value


def _check_limit(field: str, value: object, *, allow_zero: bool) -> int:
    low = 0 if allow_zero else 1
    allowed = f"1..{MAX_ATTEMPT_LIMIT}"
    if allow_zero:
        allowed = f"0 (no explicit limit) or {allowed}"
    if not is_integer(value):
        raise InvalidInput(
            f"{field} must be a whole number in {allowed}, got {value!r}", field=field
        )
    if not low <= value <= MAX_ATTEMPT_LIMIT:
        raise InvalidInput(f"{field} must be {allowed}, got {value}", field=field)
    return value


def _check_uncharged(value: object) -> int | None:
    if value is None:
        return None
    if not is_integer(value) or not 1 <= value <= MAX_UNCHARGED_LIMIT:
        raise InvalidInput(
            f"max_uncharged_attempts must be a whole number in 1..{MAX_UNCHARGED_LIMIT} "
            f"(or None for the ledger's budget), got {value!r}",
            field="max_uncharged_attempts",
        )
    return value


def _check_lease(field: str, value: object) -> float:
    if not is_number(value) or not 0 < value <= MAX_LEASE_S:
        raise InvalidInput(
            f"{field} must be a number of seconds in (0, {MAX_LEASE_S:g}], got {value!r}",
            field=field,
        )
    return float(value)


def _check_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        # Anything truthy would lift a stop: only a real True may.
        raise InvalidInput(f"{field} must be true or false, got {value!r}", field=field)
    return value


def _actor(value: object) -> Actor:
    if isinstance(value, Actor):
        return value
    _check_text("actor", value, _MAX_KEY)
    assert isinstance(value, str)
    return Actor(value)


def _moment(now: float | None) -> float:
    """`now`, or the clock; a time that is not a finite number is refused before any write
    (a NaN stored as a start or end time would make the task's history unreadable)."""
    if now is None:
        return time.time()
    if not is_number(now):
        raise InvalidInput(
            f"now must be a finite number of POSIX seconds, got {now!r}", field="now"
        )
    return float(now)


def _optional_time(field: str, value: object) -> float | None:
    if value is None:
        return None
    if not is_number(value):
        raise InvalidInput(
            f"{field} must be a finite number of POSIX seconds or None, got {value!r}",
            field=field,
        )
    return float(value)


def _clean_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise InvalidInput(
            f"reason must be a string or None, got {type(reason).__name__}", field="reason"
        )
    cleaned = redact(reason)
    if len(cleaned) > _MAX_REASON:
        # Keep the end: the last lines of a failure say the most about it.
        cleaned = "…" + cleaned[-(_MAX_REASON - 1) :]
    return cleaned


def _failure_class(value: FailureClass | str | None) -> FailureClass | None:
    if value is None or isinstance(value, FailureClass):
        return value
    try:
        return FailureClass(value)
    except ValueError:
        allowed = ", ".join(FailureClass)
        raise InvalidInput(
            f"failure_class must be one of {allowed}, got {value!r}", field="failure_class"
        ) from None


def _fingerprint(request: dict[str, Any]) -> str:
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _creation_fingerprint(title: str, max_attempts: int, max_uncharged: int | None) -> str:
    # ADR 0033: the legacy fingerprint (title only) is unchanged when there is no limit;
    # explicit limits (and a per-task uncharged ceiling) extend it.
    request: dict[str, Any] = {"title": title}
    if max_attempts:
        request["max_attempts"] = max_attempts
    if max_uncharged is not None:
        request["max_uncharged_attempts"] = max_uncharged
    return _fingerprint(request)


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, tz=datetime.UTC).isoformat(timespec="seconds")


# --- rules -----------------------------------------------------------------------------


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
    )


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


class LedgerCore:
    """Every ledger operation, written once over a `Store` (see the module docstring).

    Each public method is one transaction; errors are `ExecKitError`s. Not thread-safe:
    one per thread or process, as its store.
    """

    def __init__(
        self,
        store: Store,
        *,
        budget: WorkBudget = _DEFAULT_BUDGET,
        backoff: Backoff = SCHEDULER_BACKOFF,
    ) -> None:
        self._store = store
        self.budget = budget
        self.backoff = backoff

    # -- plumbing ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the backend's connection; the ledger is unusable afterwards."""
        self._store.close()

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

    def _budget_for(self, task: TaskRecord) -> WorkBudget:
        if task.max_uncharged_attempts is None:
            return self.budget
        return attrs.evolve(self.budget, max_uncharged_attempts=task.max_uncharged_attempts)

    def _decide(
        self,
        task: TaskRecord,
        now: float,
        cap: DispatchCap | None,
        *,
        force: bool = False,
        ignore_backoff: bool = False,
    ) -> Decision:
        limit = ExplicitLimit(task.max_attempts) if task.max_attempts else None
        # An operator's pending retry is forced and runs when the operator asked, not after
        # the backoff: it is what the next admission does, so it is what the task shows.
        pending = task.retry_requested_by is not None
        return decide_summary(
            task.summary,
            self._budget_for(task),
            limit,
            self.backoff,
            now,
            cap,
            force=force or pending,
            ignore_backoff=ignore_backoff or pending,
        )

    def _project(
        self, task: TaskRecord, now: float, cap: DispatchCap | None, *, force: bool = False
    ) -> Task:
        pending = task.retry_requested_by is not None
        decision = self._decide(task, now, cap, force=force)
        if task.status in _FINISHED_STATUSES:
            state, blocked_on, reason, next_at = TaskState(task.status), None, None, None
        else:
            state, blocked_on = decision.state, decision.blocked_on
            reason, next_at = decision.reason, decision.next_attempt_at
            if pending and state is TaskState.READY:
                reason = f"an operator's forced retry is pending ({task.retry_requested_by})"
        return Task(
            id=task.id,
            title=task.title,
            status=task.status,
            state=state,
            blocked_on=blocked_on,
            reason=reason,
            # ADR 0033: `ready` includes that an attempt is still available, and here it is
            # exactly what admission does now: a task in backoff is not ready.
            ready=state is TaskState.READY,
            max_attempts=task.max_attempts,
            attempts_started=task.summary.attempts_used,
            charged_attempts=decision.charged_attempts,
            uncharged_streak=decision.uncharged_streak,
            remaining=decision.remaining,
            next_attempt_at=next_at,
            created_by=task.created_by,
            created_at=task.created_at,
            max_uncharged_attempts=self._budget_for(task).max_uncharged_attempts,
            retry_pending=pending,
            gave_up_at_attempt=task.gave_up_at_attempt,
        )

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

    def _abandon(self, tx: Tx, task: TaskRecord, run: Run, at: float, why: str) -> TaskRecord:
        """Mark a running run abandoned (it counts and charges, ADR 0033/0046) and return
        the task with its summary brought up to date."""
        if not tx.finish_run(run.id, AttemptStatus.ABANDONED, None, why, None, at):
            current = tx.task(task.id)
            return task if current is None else current
        ended = attrs.evolve(run, status=AttemptStatus.ABANDONED, reason=why, ended_at=at)
        summary = self._summary_after(tx, task, ended)
        tx.audit(
            AuditEntry(
                at=at,
                actor=_SYSTEM,
                action=AuditAction.RUN_ABANDON,
                task_id=task.id,
                run_id=run.id,
                detail={"reason": why},
            )
        )
        return attrs.evolve(task, summary=summary)

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

    def _expired_running_run(self, tx: Tx, task: TaskRecord, at: float) -> Run | None:
        if task.summary.running is None:
            return None
        run = tx.run_at(task.id, task.summary.running)
        if run is None or run.status is not AttemptStatus.RUNNING:
            return None
        if run.lease_expires_at is not None and run.lease_expires_at <= at:
            return run
        return None

    # -- the Ledger interface --------------------------------------------------------

    def capabilities(self) -> frozenset[str]:
        """What this ledger enforces; includes "tasks.attempt_limits"."""
        return CAPABILITIES

    def schema_version(self) -> int:
        return self._store.schema_version()

    def location(self) -> str:
        """Where this ledger is, as an operator would give it back (`--db`), credentials
        left out: a file path, or a server URL without its password."""
        return self._store.location()

    def ledger_id(self) -> str:
        """This ledger's identity (stable across restarts and hosts): boards remember it."""
        with self._store.read() as tx:
            found = tx.meta("ledger_id")
        if found is None:  # pragma: no cover - every schema >= 3 writes one
            raise ExecKitError("this ledger has no id; run `execkit db migrate`")
        return found

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
        _check_text("title", title, _MAX_TITLE)
        _check_limit("max_attempts", max_attempts, allow_zero=True)
        uncharged = _check_uncharged(max_uncharged_attempts)
        who = _actor(actor)
        if idempotency_key is not None:
            _check_text("idempotency_key", idempotency_key, _MAX_KEY)
        at = _moment(now)
        fingerprint = _creation_fingerprint(title, max_attempts, uncharged)
        with self._store.write() as tx:
            replay = self._replayed(tx, AuditAction.TASK_CREATE, idempotency_key, fingerprint)
            if replay is not None:
                return self._load_task(tx, replay["task_id"], at, None)
            task_id = tx.insert_task(title, str(who), at, uncharged)
            if max_attempts:
                tx.upsert_limit(task_id, max_attempts, str(who), at)
            detail: dict[str, Any] = {"title": title, "max_attempts": max_attempts}
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
        """
        _check_bool("force", force)
        at = _moment(now)
        with self._store.read() as tx:
            return self._load_task(tx, task_id, at, cap, force=force)

    def list_tasks(self, *, now: float | None = None) -> list[Task]:
        """Every task in creation order (each from its summary: no history is read)."""
        at = _moment(now)
        with self._store.read() as tx:
            tasks = tx.tasks()
        return [self._project(task, at, None) for task in tasks]

    def runs(self, task_id: str) -> list[Run]:
        """The task's runs in creation order (attempt 1..N); NotFound if no such task."""
        with self._store.read() as tx:
            self._task(tx, task_id)
            return tx.runs(task_id)

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
        ones it is a Conflict.
        """
        _check_text("request_key", request_key, _MAX_KEY)
        who = _actor(actor)
        _check_bool("forced", forced)
        _check_bool("ignore_backoff", ignore_backoff)
        lease = _check_lease("lease_s", lease_s)
        at = _moment(now)
        fingerprint = _fingerprint({"task_id": task_id, "actor": str(who), "forced": forced})
        refused: AdmissionRefused | None = None
        with self._store.write() as tx:
            found = tx.idempotent(AuditAction.RUN_START, request_key)
            if found is not None:
                return self._replay_start(tx, request_key, found, task_id, who, forced)
            task = self._task(tx, task_id, lock=True)
            if task.status in _FINISHED_STATUSES:
                raise TaskFinished(f"task {task_id} is {task.status}; it admits no more runs")
            expired = self._expired_running_run(tx, task, at)
            if expired is not None:
                why = f"lease expired at {_when(expired.lease_expires_at or at)}: not renewed"
                task = self._abandon(tx, task, expired, at, why)
            # Decided once: the refusal and the admission's audit read the same decision.
            decision = self._decide(task, at, cap, force=forced)
            refused = self._admission_refusal(task, decision, at, ignore_backoff)
            if refused is None:
                return self._admit(
                    tx, task, decision, at, who, request_key, fingerprint, forced, lease
                )
            if expired is None:
                raise refused
            # Leaving the block commits the abandonment: it stands whether or not this
            # admission goes ahead, or an expired run could never be abandoned by one.
        raise refused

    def _admission_refusal(
        self, task: TaskRecord, decision: Decision, at: float, ignore_backoff: bool
    ) -> AdmissionRefused | None:
        refusal = _refusal(task, decision)
        if refusal is not None:
            return refusal
        if decision.state is TaskState.BACKOFF and not ignore_backoff:
            ready_at = decision.next_attempt_at or at
            return TaskBackingOff(
                f"task {task.id} is {decision.reason}; it is ready at {_when(ready_at)} "
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
                owner_host=socket.gethostname(),
                owner_pid=os.getpid(),
                lease_expires_at=at + lease,
            ),
            lease,
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

    def heartbeat(
        self, run_id: str, *, lease_s: float | None = None, now: float | None = None
    ) -> Run:
        """Renew a running run's lease for `lease_s` seconds (default: the lease it was
        started with). Conflict when the run is no longer running (e.g. abandoned after its
        lease expired: its result can no longer be recorded)."""
        lease = None if lease_s is None else _check_lease("lease_s", lease_s)
        at = _moment(now)
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

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        not_before: float | None = None,
        now: float | None = None,
    ) -> Run:
        """Record how a running run ended: succeeded | failed | abandoned.

        A succeeded run is never classed and marks its task done. The reason is redacted
        before it is stored. `not_before` (failed runs) is the vendor's reset time: the next
        attempt is not scheduled before it. Finishing a finished run again with the same
        values returns it unchanged; with different values it is a Conflict (an abandoned
        run's lease expired: its runner's late result cannot rewrite the history).
        """
        if status not in _FINAL_RUN_STATUSES:
            raise InvalidInput(
                f"status must be one of {', '.join(_FINAL_RUN_STATUSES)}, got {status!r}",
                field="status",
            )
        final = AttemptStatus(status)
        klass = _failure_class(failure_class)
        if final is AttemptStatus.SUCCEEDED and klass is not None:
            raise InvalidInput(
                "failure_class must be empty for a succeeded run", field="failure_class"
            )
        reset = _optional_time("not_before", not_before)
        if final is not AttemptStatus.FAILED:
            reset = None
        stored_reason = _clean_reason(reason)
        at = _moment(now)
        with self._store.write() as tx:
            run = self._run(tx, run_id)
            if run.status is not AttemptStatus.RUNNING:
                if (run.status, run.failure_class, run.reason) == (final, klass, stored_reason):
                    return run
                shown = run.failure_class.value if run.failure_class else "-"
                raise Conflict(
                    f"run {run_id} already finished as {run.status} (class {shown}); "
                    "a finished run is immutable"
                    + (f" ({run.reason})" if run.status is AttemptStatus.ABANDONED else "")
                )
            task = self._task(tx, run.task_id, lock=True)
            tx.finish_run(run_id, final, klass, stored_reason, reset, at)
            ended = attrs.evolve(
                run,
                status=final,
                failure_class=klass,
                reason=stored_reason,
                ended_at=at,
                not_before=reset,
            )
            self._summary_after(tx, task, ended)
            if final is AttemptStatus.SUCCEEDED and task.status is TaskStatus.OPEN:
                tx.set_task_status(run.task_id, TaskStatus.DONE, at)
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=run.actor,
                    action=AuditAction.RUN_FINISH,
                    task_id=run.task_id,
                    run_id=run_id,
                    detail={"status": final, "failure_class": klass.value if klass else None},
                )
            )
            return ended

    def abandon_expired_runs(self, *, now: float | None = None) -> list[Run]:
        """Abandon every running run whose lease has expired, on any host (they count
        against every limit and charge as unclassed failures). Returns them."""
        at = _moment(now)
        abandoned: list[Run] = []
        with self._store.write() as tx:
            for run in tx.expired_runs(at):
                task = self._task(tx, run.task_id, lock=True)
                why = f"lease expired at {_when(run.lease_expires_at or at)}: not renewed"
                self._abandon(tx, task, run, at, why)
                abandoned.append(self._run(tx, run.id))
        return abandoned

    def retry_task(
        self,
        task_id: str,
        *,
        actor: Actor | str,
        reason: str | None = None,
        force: bool = False,
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
        """
        who = _actor(actor)
        _check_bool("force", force)
        note = _clean_reason(reason)
        at = _moment(now)
        with self._store.write() as tx:
            task = self._task(tx, task_id, lock=True)
            if task.status in _FINISHED_STATUSES:
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
            return self._load_task(tx, task_id, at, None)

    def record_give_up(
        self, task_id: str, *, state: str, actor: Actor | str, now: float | None = None
    ) -> Task:
        """A dispatcher moved the task's board issue to terminal `state` after its history
        stopped it (ADR 015): remembered with the attempt count, so that finding the issue
        back in an eligible state later means an operator re-opened it (a forced retry)."""
        _check_text("state", state, _MAX_KEY)
        who = _actor(actor)
        at = _moment(now)
        with self._store.write() as tx:
            task = self._task(tx, task_id, lock=True)
            attempts = task.summary.attempts_used
            tx.set_gave_up(task_id, attempts)
            decision = self._decide(task, at, None)
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
            return self._load_task(tx, task_id, at, None)

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
        _check_limit("max_attempts", max_attempts, allow_zero=False)
        _check_limit("expected_max_attempts", expected_max_attempts, allow_zero=True)
        who = _actor(actor)
        if idempotency_key is not None:
            _check_text("idempotency_key", idempotency_key, _MAX_KEY)
        at = _moment(now)
        fingerprint = _fingerprint(
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
            if task.status in _FINISHED_STATUSES:
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
        who = _actor(actor)
        at = _moment(now)
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

    # -- roles ------------------------------------------------------------------------

    def _check_role_change(self, tx: Tx, who: Actor, principal: object, role: object) -> None:
        _check_text("principal", principal, _MAX_KEY)
        if role not in KNOWN_ROLES:
            raise InvalidInput(
                f"role must be one of {', '.join(sorted(KNOWN_ROLES))}, got {role!r}",
                field="role",
            )
        if ADMIN_ROLE not in self._roles(tx, who):
            raise Forbidden(
                f"changing roles needs the ledger's owner ({self._store.owner() or 'unknown'}) "
                f"or the role {ADMIN_ROLE}; {who.name} has neither"
            )

    def grant_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> Grant:
        """Grant `role` to `principal` (idempotent: an existing grant is returned).

        Only the ledger's owner or a holder of `ledger.admin` may; Forbidden otherwise.
        """
        who = _actor(actor)
        at = _moment(now)
        with self._store.write() as tx:
            self._check_role_change(tx, who, principal, role)
            grant = Grant(principal=principal, role=role, granted_by=str(who), granted_at=at)
            if not tx.put_grant(grant):
                return next(g for g in tx.grants(principal) if g.role == role)
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.ROLE_GRANT,
                    detail={"principal": principal, "role": role},
                )
            )
            return grant

    def revoke_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> bool:
        """Revoke a grant; True when there was one. Same authority as `grant_role`."""
        who = _actor(actor)
        at = _moment(now)
        with self._store.write() as tx:
            self._check_role_change(tx, who, principal, role)
            removed = tx.delete_grant(principal, role)
            if removed:
                detail = {"principal": principal, "role": role}
                tx.audit(
                    AuditEntry(at=at, actor=str(who), action=AuditAction.ROLE_REVOKE, detail=detail)
                )
            return removed

    def grants(self, principal: str | None = None) -> list[Grant]:
        """Every grant (or one principal's), sorted by principal then role."""
        with self._store.read() as tx:
            return tx.grants(principal)

    # -- inspection -------------------------------------------------------------------

    def audit_events(self, task_id: str | None = None) -> list[AuditEvent]:
        """Audit records in order, all or one task's."""
        with self._store.read() as tx:
            return tx.audit_events(task_id)

    def validate(self, *, now: float | None = None) -> list[str]:
        """Every problem found, none fixed: storage integrity and rows outside their domain
        (the backend's own checks), `validate_history` on every task, each stored summary
        against the one its history gives, and running runs whose lease has expired."""
        at = _moment(now)
        problems = self._store.storage_problems()
        if problems:
            return problems  # rows the code cannot read: the checks below would only crash
        with self._store.read() as tx:
            tasks = tx.tasks()
            runs_by_task: dict[str, list[Run]] = {task.id: [] for task in tasks}
            for run in tx.all_runs():
                runs_by_task.setdefault(run.task_id, []).append(run)
        for task in tasks:
            problems.extend(self._task_problems(task, runs_by_task[task.id], at))
        return problems

    def _task_problems(self, task: TaskRecord, runs: list[Run], at: float) -> list[str]:
        problems: list[str] = []
        history: list[Attempt] = []
        for run in runs:
            try:
                history.append(attempt_from_run(run))
            except InvalidInput as exc:  # a stored value of the wrong shape
                problems.append(f"{task.id}: run {run.id}: {exc.message}")
        if problems:
            return problems
        try:
            validate_history(history)
        except HistoryError as exc:
            return [f"{task.id}: {exc.message}"]
        expected = summarize(history)
        if expected != task.summary:
            problems.append(
                f"{task.id}: its stored summary differs from its history "
                f"(stored {_summary_text(task.summary)}; history {_summary_text(expected)}); "
                "`execkit db check --repair` rebuilds it"
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
                    f"{_when(run.lease_expires_at)}; `execkit db check --repair` abandons it"
                )
        return problems

    def repair(self, *, now: float | None = None) -> list[str]:
        """Fix what `validate` can fix and say what was done: abandon running runs whose
        lease expired (one transaction, as an admission would), then rebuild every stored
        summary that differs from its history (a second; the history is the truth). Each
        step is whole on its own, so a failure between them leaves a valid ledger that a
        second `repair` finishes. A broken history is not touched."""
        at = _moment(now)
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
                            actor=_SYSTEM,
                            action=AuditAction.TASK_REPAIR_SUMMARY,
                            task_id=task.id,
                        )
                    )
                    done.append(f"{task.id}: rebuilt its summary from its history")
        return done


def _summary_text(summary: HistorySummary) -> str:
    return (
        f"{summary.attempts_used} attempts, {summary.charged_attempts} charged, "
        f"streak {summary.uncharged_streak}, running {summary.running}"
    )
