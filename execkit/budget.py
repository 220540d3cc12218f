"""Attempt budgets as pure policies over one immutable attempt history.

SKELETON: the types and signatures below are the contract other modules code against.
The helper implementing issue 5 fills in the logic (and may add private helpers), but
keeps these public names, fields and signatures.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import attrs

from execkit.classify import FailureClass

__all__ = [
    "MAX_UNCHARGED_REPLANS",
    "Attempt",
    "AttemptStatus",
    "Backoff",
    "Decision",
    "DispatchCap",
    "ExplicitLimit",
    "Plan",
    "ReplanDecision",
    "WorkBudget",
    "decide",
    "decide_replans",
    "validate_history",
]

MAX_UNCHARGED_REPLANS = 3


class AttemptStatus(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABANDONED = "abandoned"


@attrs.frozen
class Attempt:
    """One admitted attempt. Times are POSIX seconds (float)."""

    number: int
    status: AttemptStatus
    failure_class: FailureClass | None = None
    reason: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    forced: bool = False


@attrs.frozen
class WorkBudget:
    max_attempts: int = 3
    max_uncharged_attempts: int = 3


@attrs.frozen
class ExplicitLimit:
    max_attempts: int  # 1..10000, else ValueError naming the range


@attrs.frozen
class DispatchCap:
    max_attempts: int = 10  # total dispatches; negative = no cap (ADR 015)


@attrs.frozen
class Backoff:
    base_s: float = 10.0
    factor: float = 2.0
    max_s: float = 300.0
    jitter: float = 0.1


@attrs.frozen
class Decision:
    state: str  # ready | running | backoff | done | blocked
    blocked_on: str | None  # None | environment | upstream | work | attempt_limit | dispatch_cap
    next_action: str  # run | wait | none
    next_attempt_at: float | None
    reason: str | None
    attempts_used: int
    charged_attempts: int
    uncharged_streak: int
    remaining: int | None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def validate_history(attempts: Sequence[Attempt]) -> None:
    raise NotImplementedError


def decide(
    attempts: Sequence[Attempt],
    budget: WorkBudget = WorkBudget(),
    limit: ExplicitLimit | None = None,
    backoff: Backoff = Backoff(),
    now: float | None = None,
    cap: DispatchCap | None = None,
) -> Decision:
    raise NotImplementedError


@attrs.frozen
class Plan:
    number: int
    status: AttemptStatus
    failure_class: FailureClass | None = None
    reason: str | None = None


@attrs.frozen
class ReplanDecision:
    state: str
    blocked_on: str | None
    next_action: str
    reason: str | None
    replans_used: int
    charged_replans: int
    uncharged_streak: int
    remaining: int


def decide_replans(plans: Sequence[Plan], max_replans: int) -> ReplanDecision:
    raise NotImplementedError
