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
import functools
import hashlib
import json
import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import (
    Attempt,
    AttemptStatus,
    BlockedOn,
    Decision,
    DecisionState,
    DispatchCap,
    ExplicitLimit,
    WorkBudget,
    decide,
    validate_history,
)
from execkit._classify import FailureClass
from execkit._errors import (
    AdmissionRefused,
    AttemptLimitReached,
    Conflict,
    Forbidden,
    HistoryError,
    InvalidInput,
    NotFound,
    TaskBlocked,
    TaskFinished,
)
from execkit._redact import redact
from execkit._validate import is_integer, is_number
from execkit.ledger._model import (
    CAPABILITIES,
    MAX_ATTEMPT_LIMIT,
    OPERATE_ROLE,
    AuditEvent,
    Run,
    Task,
    TaskState,
    TaskStatus,
)

__all__ = ["LedgerCore", "Store", "TaskRecord", "Tx"]

_FINISHED_STATUSES = (TaskStatus.DONE, TaskStatus.CANCELLED)
_FINAL_RUN_STATUSES = (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.ABANDONED)
_MAX_TITLE = 1000
_MAX_KEY = 200
_MAX_REASON = 4000
_DEFAULT_BUDGET = WorkBudget()


@attrs.frozen
class TaskRecord:
    """What a backend stores of a task itself (its runs are separate rows)."""

    id: str
    title: str
    status: TaskStatus = attrs.field(converter=TaskStatus)
    created_by: str
    created_at: float
    max_attempts: int  # 0 = no explicit limit


class Tx(Protocol):
    """One open transaction of a backend: typed reads and writes, no rules."""

    def task(self, task_id: str) -> TaskRecord | None: ...
    def tasks(self) -> list[TaskRecord]: ...
    def runs(self, task_id: str) -> list[Run]: ...
    def all_runs(self) -> list[Run]: ...
    def run(self, run_id: str) -> Run | None: ...
    def running_runs(self, host: str) -> list[tuple[Run, float | None]]: ...
    def run_count(self, task_id: str) -> int: ...

    def insert_task(self, title: str, actor: str, at: float) -> str: ...
    def set_task_status(self, task_id: str, status: TaskStatus, at: float) -> None: ...
    def upsert_limit(self, task_id: str, max_attempts: int, actor: str, at: float) -> None: ...
    def insert_run(self, run: Run, owner_started_at: float | None) -> Run: ...
    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus,
        failure_class: FailureClass | None,
        reason: str | None,
        at: float,
    ) -> bool: ...

    def audit(
        self,
        at: float,
        actor: str,
        action: str,
        task_id: str | None,
        run_id: str | None,
        detail: dict[str, Any],
    ) -> None: ...
    def audit_events(self, task_id: str | None) -> list[AuditEvent]: ...
    def idempotent(self, scope: str, key: str) -> tuple[str, dict[str, Any]] | None: ...
    def remember(
        self, scope: str, key: str, fingerprint: str, response: dict[str, Any], at: float
    ) -> None: ...


class Store(Protocol):
    """A backend: transactions over its storage, its schema and its own checks."""

    def read(self) -> contextlib.AbstractContextManager[Tx]: ...
    def write(self) -> contextlib.AbstractContextManager[Tx]: ...
    def schema_version(self) -> int: ...
    def storage_problems(self) -> list[str]: ...
    def close(self) -> None: ...


# --- input checks ---------------------------------------------------------------------


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
    allowed = (
        f"0 (no explicit limit) or 1..{MAX_ATTEMPT_LIMIT}"
        if allow_zero
        else f"1..{MAX_ATTEMPT_LIMIT}"
    )
    if not is_integer(value):
        raise InvalidInput(
            f"{field} must be a whole number in {allowed}, got {value!r}", field=field
        )
    if not low <= value <= MAX_ATTEMPT_LIMIT:
        raise InvalidInput(f"{field} must be {allowed}, got {value}", field=field)
    return value


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


def _check_roles(roles: Sequence[str]) -> tuple[str, ...]:
    # A bare string would turn the role check into a substring test ("agent.operate" is
    # "in" "not-agent.operate"), so only a collection of names is accepted.
    if not isinstance(roles, str):
        with contextlib.suppress(TypeError):
            names = tuple(roles)
            if all(isinstance(name, str) for name in names):
                return names
    raise InvalidInput(f"roles must be a list of role names, got {roles!r}", field="roles")


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


def _creation_fingerprint(title: str, max_attempts: int) -> str:
    # ADR 0033: the legacy fingerprint (title only) is unchanged when there is no limit.
    if max_attempts == 0:
        return _fingerprint({"title": title})
    return _fingerprint({"title": title, "max_attempts": max_attempts})


# --- owners ----------------------------------------------------------------------------


def _process_started_at(pid: int) -> float | None:
    import psutil  # only admissions that name an owner process need it

    if pid == os.getpid():
        return _own_start_time(pid)
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@functools.lru_cache(maxsize=1)
def _own_start_time(pid: int) -> float:
    import psutil

    # Keyed by pid so a forked child asks again; saves two /proc reads per admission.
    return psutil.Process(pid).create_time()


def _owner_alive(pid: int, started_at: float | None) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # A different start time means the pid was reused by another process.
        return started_at is None or abs(proc.create_time() - started_at) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists; we may not look at it, so we must not abandon its run


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
    )


def _refusal(task_id: str, runs: Sequence[Run], decision: Decision) -> AdmissionRefused | None:
    """Why `decision` admits no run now, as the error `start_run` raises; None to admit.

    Backoff does not refuse: waiting is the scheduler's business.
    """
    if decision.state is DecisionState.DONE:
        return TaskFinished(f"task {task_id} already succeeded")
    if decision.state is DecisionState.RUNNING:
        active = next(run for run in runs if run.status is AttemptStatus.RUNNING)
        return TaskBlocked(
            f"run {active.id} (attempt {active.attempt}) of task {task_id} is still running; "
            "finish it (or abandon it) before starting another",
        )
    if decision.state is not DecisionState.BLOCKED:
        return None
    if decision.blocked_on is BlockedOn.ATTEMPT_LIMIT:
        return AttemptLimitReached(
            f"{decision.reason} of task {task_id}; an operator can raise it (set-attempt-limit)",
        )
    return TaskBlocked(decision.reason or f"task {task_id} is blocked on {decision.blocked_on}")


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

    def _task(self, tx: Tx, task_id: str) -> TaskRecord:
        task = tx.task(task_id)
        if task is None:
            raise NotFound(f"no task {task_id!r}")
        return task

    def _run(self, tx: Tx, run_id: str) -> Run:
        run = tx.run(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        return run

    def _replayed(
        self, tx: Tx, scope: str, key: str | None, fingerprint: str
    ) -> dict[str, Any] | None:
        """The stored response for (scope, key); Conflict when the request differs."""
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
        scope: str,
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
        runs: Sequence[Run],
        now: float,
        cap: DispatchCap | None,
        *,
        force: bool = False,
    ) -> Decision:
        limit = ExplicitLimit(task.max_attempts) if task.max_attempts else None
        history = [attempt_from_run(run) for run in runs]
        return decide(history, self.budget, limit, self.backoff, now, cap, force=force)

    def _project(
        self, task: TaskRecord, runs: Sequence[Run], now: float, cap: DispatchCap | None
    ) -> Task:
        decision = self._decide(task, runs, now, cap)
        if task.status in _FINISHED_STATUSES:
            state, blocked_on, reason, next_at = TaskState(task.status), None, None, None
        else:
            state, blocked_on = TaskState(decision.state), decision.blocked_on
            reason, next_at = decision.reason, decision.next_attempt_at
        return Task(
            id=task.id,
            title=task.title,
            status=task.status,
            state=state,
            blocked_on=blocked_on,
            reason=reason,
            # ADR 0033: `ready` includes that an attempt is still available: a used-up
            # limit is the policy's `attempt_limit` bound, never `ready`.
            ready=state is TaskState.READY,
            max_attempts=task.max_attempts,
            attempts_started=len(runs),
            charged_attempts=decision.charged_attempts,
            uncharged_streak=decision.uncharged_streak,
            remaining=decision.remaining,
            next_attempt_at=next_at,
            created_by=task.created_by,
            created_at=task.created_at,
        )

    def _load_task(self, tx: Tx, task_id: str, now: float, cap: DispatchCap | None) -> Task:
        return self._project(self._task(tx, task_id), tx.runs(task_id), now, cap)

    # -- the Ledger interface --------------------------------------------------------

    def capabilities(self) -> frozenset[str]:
        """What this ledger enforces; includes "tasks.attempt_limits"."""
        return CAPABILITIES

    def schema_version(self) -> int:
        return self._store.schema_version()

    def create_task(
        self,
        title: str,
        *,
        max_attempts: int = 0,
        idempotency_key: str | None = None,
        actor: str,
        now: float | None = None,
    ) -> Task:
        """Create an open task; `max_attempts` 0 = no explicit limit, else 1..10000.

        Replaying `idempotency_key` with the same request returns the same task (as it is
        now); with a different request it is a Conflict. InvalidInput changes nothing.
        """
        _check_text("title", title, _MAX_TITLE)
        _check_limit("max_attempts", max_attempts, allow_zero=True)
        _check_text("actor", actor, _MAX_KEY)
        if idempotency_key is not None:
            _check_text("idempotency_key", idempotency_key, _MAX_KEY)
        at = _moment(now)
        fingerprint = _creation_fingerprint(title, max_attempts)
        with self._store.write() as tx:
            replay = self._replayed(tx, "task.create", idempotency_key, fingerprint)
            if replay is not None:
                return self._load_task(tx, replay["task_id"], at, None)
            task_id = tx.insert_task(title, actor, at)
            if max_attempts:
                tx.upsert_limit(task_id, max_attempts, actor, at)
            tx.audit(
                at,
                actor,
                "task.create",
                task_id,
                None,
                {"title": title, "max_attempts": max_attempts},
            )
            self._remember(
                tx, "task.create", idempotency_key, fingerprint, {"task_id": task_id}, at
            )
            return self._load_task(tx, task_id, at, None)

    def get_task(
        self, task_id: str, *, now: float | None = None, cap: DispatchCap | None = None
    ) -> Task:
        """The task with the budget projection of its history at `now`; NotFound if absent."""
        at = _moment(now)
        with self._store.read() as tx:
            return self._load_task(tx, task_id, at, cap)

    def list_tasks(self, *, now: float | None = None) -> list[Task]:
        """Every task in creation order."""
        at = _moment(now)
        with self._store.read() as tx:
            tasks = tx.tasks()
            runs_by_task: dict[str, list[Run]] = {task.id: [] for task in tasks}
            for run in tx.all_runs():
                runs_by_task.setdefault(run.task_id, []).append(run)
        return [self._project(task, runs_by_task[task.id], at, None) for task in tasks]

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
        actor: str,
        forced: bool = False,
        now: float | None = None,
        cap: DispatchCap | None = None,
        owner_pid: int | None = None,
    ) -> Run:
        """Admit one run of the task, in one transaction, or refuse with AdmissionRefused.

        Refusals: `TaskFinished` (task done or cancelled), `AttemptLimitReached` (the
        explicit limit is used up), `TaskBlocked` (a run is still running, or the
        budget/environment/upstream/dispatch-cap bound holds); when several hold, the one
        `get_task` shows as `blocked_on` (the policy's order). Backoff does not refuse:
        waiting is the scheduler's business. `forced` lets an operator start past an
        environment stop (audited), never past a limit. Replaying an accepted
        `request_key` returns the same run and creates none. `owner_pid` (default: this
        process) names the process whose death makes the run abandoned
        (`abandon_stale_runs`).
        """
        _check_text("request_key", request_key, _MAX_KEY)
        _check_text("actor", actor, _MAX_KEY)
        if not isinstance(forced, bool):
            # Anything truthy would lift an environment stop: only a real True may.
            raise InvalidInput(f"forced must be true or false, got {forced!r}", field="forced")
        owner = os.getpid() if owner_pid is None else owner_pid
        owner_started_at = _process_started_at(owner)
        if owner_started_at is None:
            raise InvalidInput(f"owner_pid {owner} is not a running process", field="owner_pid")
        at = _moment(now)
        fingerprint = _fingerprint({"task_id": task_id})
        with self._store.write() as tx:
            replay = self._replayed(tx, "run.start", request_key, fingerprint)
            if replay is not None:
                return self._run(tx, replay["run_id"])
            task = self._task(tx, task_id)
            if task.status in _FINISHED_STATUSES:
                raise TaskFinished(f"task {task_id} is {task.status}; it admits no more runs")
            runs = tx.runs(task_id)
            # One rule set: the policy's decision, `force` lifting the environment stop and
            # nothing else, so not even a forced start passes the explicit limit.
            decision = self._decide(task, runs, at, cap, force=forced)
            refusal = _refusal(task_id, runs, decision)
            if refusal is not None:
                raise refusal
            run = tx.insert_run(
                Run(
                    id="",
                    task_id=task_id,
                    attempt=len(runs) + 1,
                    status=AttemptStatus.RUNNING,
                    failure_class=None,
                    reason=None,
                    request_key=request_key,
                    actor=actor,
                    forced=forced,
                    started_at=at,
                    ended_at=None,
                    owner_host=socket.gethostname(),
                    owner_pid=owner,
                ),
                owner_started_at,
            )
            tx.audit(
                at,
                actor,
                "run.start",
                task_id,
                run.id,
                {
                    "attempt": run.attempt,
                    "forced": run.forced,
                    "state_before": decision.state,
                    "request_key": request_key,
                },
            )
            self._remember(tx, "run.start", request_key, fingerprint, {"run_id": run.id}, at)
            return run

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        now: float | None = None,
    ) -> Run:
        """Record how a running run ended: succeeded | failed | abandoned.

        A succeeded run is never classed and marks its task done. The reason is redacted
        before it is stored. Finishing a finished run again with the same values returns
        it unchanged; with different values it is a Conflict.
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
                )
            tx.finish_run(run_id, final, klass, stored_reason, at)
            if final is AttemptStatus.SUCCEEDED:
                task = self._task(tx, run.task_id)
                if task.status is TaskStatus.OPEN:
                    tx.set_task_status(run.task_id, TaskStatus.DONE, at)
            tx.audit(
                at,
                run.actor,
                "run.finish",
                run.task_id,
                run_id,
                {"status": final, "failure_class": klass.value if klass else None},
            )
            return attrs.evolve(
                run, status=final, failure_class=klass, reason=stored_reason, ended_at=at
            )

    def abandon_stale_runs(self, *, now: float | None = None) -> list[Run]:
        """Mark abandoned the running runs whose owner process on this host is gone.

        Abandoned runs still count against every limit. Runs owned by other hosts are left
        alone (their liveness cannot be seen from here).
        """
        at = _moment(now)
        host = socket.gethostname()
        with self._store.read() as tx:
            candidates = tx.running_runs(host)
        dead = [run for run, started in candidates if not _owner_alive(run.owner_pid, started)]
        if not dead:
            return []
        abandoned: list[Run] = []
        with self._store.write() as tx:
            for stale in dead:
                reason = (
                    f"owner process {stale.owner_pid} on {host} exited while the run was running"
                )
                if not tx.finish_run(stale.id, AttemptStatus.ABANDONED, None, reason, at):
                    continue  # finished meanwhile by someone else
                run = self._run(tx, stale.id)
                tx.audit(
                    at,
                    "execkit",
                    "run.abandon",
                    run.task_id,
                    run.id,
                    {"owner_pid": stale.owner_pid, "owner_host": host},
                )
                abandoned.append(run)
        return abandoned

    def set_attempt_limit(
        self,
        task_id: str,
        max_attempts: int,
        *,
        expected_max_attempts: int,
        actor: str,
        roles: Sequence[str] = (),
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Task:
        """Compare-and-set the task's explicit limit (1..10000).

        `expected_max_attempts` must equal the current limit (0 = none), else Conflict
        naming the current value. The creator may change it before the first run;
        afterwards the actor needs the role `agent.operate` (Forbidden). A done or
        cancelled task refuses (`TaskFinished`). Limit, audit event and keyed response
        are written in one transaction. Lowering never touches a running run; raising
        makes an `attempt_limit` task ready again with its history intact.
        """
        _check_limit("max_attempts", max_attempts, allow_zero=False)
        _check_limit("expected_max_attempts", expected_max_attempts, allow_zero=True)
        _check_text("actor", actor, _MAX_KEY)
        held_roles = _check_roles(roles)
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
            replay = self._replayed(tx, "task.set_attempt_limit", idempotency_key, fingerprint)
            if replay is not None:
                return self._load_task(tx, replay["task_id"], at, None)
            task = self._task(tx, task_id)
            if task.status in _FINISHED_STATUSES:
                raise TaskFinished(
                    f"task {task_id} is {task.status}; its attempt policy can no longer change"
                )
            started = tx.run_count(task_id)
            creator_before_first_run = started == 0 and actor == task.created_by
            if not creator_before_first_run and OPERATE_ROLE not in held_roles:
                who = "after its first run" if started else "by anyone but its creator"
                raise Forbidden(
                    f"changing the attempt limit of task {task_id} {who} needs the role "
                    f"{OPERATE_ROLE}"
                )
            if task.max_attempts != expected_max_attempts:
                raise Conflict(
                    f"expected_max_attempts {expected_max_attempts} does not match the current "
                    f"limit of task {task_id}: {task.max_attempts}"
                )
            tx.upsert_limit(task_id, max_attempts, actor, at)
            tx.audit(
                at,
                actor,
                "task.set_attempt_limit",
                task_id,
                None,
                {
                    "from": task.max_attempts,
                    "to": max_attempts,
                    "attempts_started": started,
                    "roles": sorted(held_roles),
                },
            )
            self._remember(
                tx,
                "task.set_attempt_limit",
                idempotency_key,
                fingerprint,
                {"task_id": task_id, "max_attempts": max_attempts},
                at,
            )
            return self._load_task(tx, task_id, at, None)

    def cancel_task(self, task_id: str, *, actor: str, now: float | None = None) -> Task:
        """Cancel an open task (idempotent); a done task refuses with `TaskFinished`.

        A running run is not touched: it finishes and is recorded as usual.
        """
        _check_text("actor", actor, _MAX_KEY)
        at = _moment(now)
        with self._store.write() as tx:
            task = self._task(tx, task_id)
            if task.status is TaskStatus.DONE:
                raise TaskFinished(f"task {task_id} is done; it cannot be cancelled")
            if task.status is TaskStatus.OPEN:
                tx.set_task_status(task_id, TaskStatus.CANCELLED, at)
                tx.audit(at, actor, "task.cancel", task_id, None, {})
            return self._load_task(tx, task_id, at, None)

    def audit_events(self, task_id: str | None = None) -> list[AuditEvent]:
        """Audit records in order, all or one task's."""
        with self._store.read() as tx:
            return tx.audit_events(task_id)

    def validate(self) -> list[str]:
        """Every problem found: storage integrity, and `validate_history` on every task."""
        problems = self._store.storage_problems()
        with self._store.read() as tx:
            tasks = tx.tasks()
            runs_by_task: dict[str, list[Run]] = {task.id: [] for task in tasks}
            for run in tx.all_runs():
                runs_by_task.setdefault(run.task_id, []).append(run)
        for task in tasks:
            runs = runs_by_task[task.id]
            try:
                validate_history([attempt_from_run(run) for run in runs])
            except HistoryError as exc:
                problems.append(f"{task.id}: {exc.message}")
            succeeded = any(run.status is AttemptStatus.SUCCEEDED for run in runs)
            if task.status is TaskStatus.DONE and not succeeded:
                problems.append(f"{task.id}: task is done but no run succeeded")
            if task.status is TaskStatus.OPEN and succeeded:
                problems.append(f"{task.id}: a run succeeded but the task is still open")
        return problems
