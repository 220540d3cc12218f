"""The ledger's wire shapes and the `Ledger` interface every backend implements.

The dispatcher and the CLI code against this module only; a backend (SQLite here,
PostgreSQL later) implements `Ledger` with all of its SQL kept in its own module.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from execkit._budget import (
    EXPLICIT_LIMIT_MAX,
    Attempt,
    AttemptStatus,
    Backoff,
    BlockedOn,
    DispatchCap,
    WorkBudget,
)
from execkit._classify import FailureClass
from execkit._json import to_json

__all__ = [
    "CAPABILITIES",
    "MAX_ATTEMPT_LIMIT",
    "OPERATE_ROLE",
    "AuditEvent",
    "Ledger",
    "Run",
    "Task",
    "TaskState",
    "TaskStatus",
]

CAPABILITIES = frozenset({"tasks.attempt_limits"})

# ADR 0033: an explicit limit is 1..10000 total task-bound runs; 0 means "no explicit limit".
MAX_ATTEMPT_LIMIT = EXPLICIT_LIMIT_MAX

# ADR 0033: after the first run, changing a task's limit needs this role.
OPERATE_ROLE = "agent.operate"


class TaskStatus(enum.StrEnum):
    """What is stored about a task itself: open until a run succeeds or it is cancelled."""

    OPEN = "open"
    DONE = "done"
    CANCELLED = "cancelled"


class TaskState(enum.StrEnum):
    """A task's state as derived from its status and its run history (`Decision.state`)."""

    READY = "ready"
    RUNNING = "running"
    BACKOFF = "backoff"
    DONE = "done"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"


@attrs.frozen
class Run:
    """One admitted run: a row of the immutable history.

    `owner_host`/`owner_pid` name the process that owns a running run, so that a run whose
    owner died can be marked abandoned (`Ledger.abandon_stale_runs`).
    """

    id: str
    task_id: str
    attempt: int  # gapless 1..N per task
    status: AttemptStatus
    failure_class: FailureClass | None
    reason: str | None
    request_key: str
    actor: str
    forced: bool
    started_at: float
    ended_at: float | None
    owner_host: str = ""
    owner_pid: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe wire shape (`failure_class` as its string value or None)."""
        return to_json(self)


@attrs.frozen
class Task:
    """The Task wire shape (ADR 0033), with the budget projection of its history."""

    id: str
    title: str
    status: TaskStatus  # stored
    state: TaskState  # derived
    blocked_on: BlockedOn | None
    reason: str | None
    ready: bool  # state == ready, including that an attempt is still available
    max_attempts: int  # 0 = no explicit limit
    attempts_started: int
    charged_attempts: int
    uncharged_streak: int
    remaining: int | None
    next_attempt_at: float | None
    created_by: str
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe wire shape (every field is a str, int, float, bool or None)."""
        return to_json(self)


@attrs.frozen
class AuditEvent:
    """One audit record: who changed what, when (detail is a JSON-safe mapping)."""

    id: int
    at: float
    actor: str
    action: str  # task.create | task.set_attempt_limit | task.cancel | run.start | ...
    task_id: str | None
    run_id: str | None
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)  # `detail` is copied: the event stays immutable


class Ledger(Protocol):
    """Durable tasks and runs. Every method is one transaction; errors are ExecKitError."""

    budget: WorkBudget
    backoff: Backoff

    def capabilities(self) -> frozenset[str]: ...
    def schema_version(self) -> int: ...

    def create_task(
        self,
        title: str,
        *,
        max_attempts: int = 0,
        idempotency_key: str | None = None,
        actor: str,
    ) -> Task: ...

    def get_task(
        self, task_id: str, *, now: float | None = None, cap: DispatchCap | None = None
    ) -> Task: ...
    def list_tasks(self, *, now: float | None = None) -> list[Task]: ...
    def runs(self, task_id: str) -> list[Run]: ...
    def history(self, task_id: str) -> list[Attempt]: ...

    def start_run(
        self,
        task_id: str,
        *,
        request_key: str,
        actor: str,
        forced: bool = False,
        now: float | None = None,
        cap: DispatchCap | None = None,
    ) -> Run: ...

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        now: float | None = None,
    ) -> Run: ...

    def abandon_stale_runs(self, *, now: float | None = None) -> list[Run]: ...

    def set_attempt_limit(
        self,
        task_id: str,
        max_attempts: int,
        *,
        expected_max_attempts: int,
        actor: str,
        roles: Sequence[str] = (),
        idempotency_key: str | None = None,
    ) -> Task: ...

    def cancel_task(self, task_id: str, *, actor: str) -> Task: ...
    def audit_events(self, task_id: str | None = None) -> list[AuditEvent]: ...
    def validate(self) -> list[str]: ...
    def close(self) -> None: ...
