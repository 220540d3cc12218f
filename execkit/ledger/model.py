"""The ledger's wire shapes and the `Ledger` interface every backend implements.

SKELETON: the contract the dispatcher and the CLI code against. The helper implementing
issue 6 fills in the SQLite backend and may add fields, but keeps these names and
signatures (adding keyword-only parameters with defaults is fine).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from execkit.budget import Attempt, Backoff, DispatchCap, WorkBudget
from execkit.classify import FailureClass

__all__ = ["CAPABILITIES", "Ledger", "Run", "Task"]

CAPABILITIES = frozenset({"tasks.attempt_limits"})


@attrs.frozen
class Run:
    """One admitted run: a row of the immutable history."""

    id: str
    task_id: str
    attempt: int  # gapless 1..N per task
    status: str  # running | succeeded | failed | abandoned
    failure_class: FailureClass | None
    reason: str | None
    request_key: str
    actor: str
    forced: bool
    started_at: float
    ended_at: float | None

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["failure_class"] = self.failure_class.value if self.failure_class else None
        return data


@attrs.frozen
class Task:
    """The Task wire shape (ADR 0033), with the budget projection of its history."""

    id: str
    title: str
    status: str  # open | done | cancelled   (stored)
    state: str  # ready | running | backoff | done | blocked | cancelled   (derived)
    blocked_on: str | None
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
        return attrs.asdict(self)


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
        status: str,
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
    def validate(self) -> list[str]: ...
    def close(self) -> None: ...
