"""Attempt budgets as pure policies over one immutable attempt history (ADR 0046, 0033, 015).

Everything here is a function of its arguments (the one impure default is `now`, which
falls back to `time.time()`); no I/O. The ledger and the dispatcher call `decide` with the
stored history and act on the `Decision`.

The three meanings of "max attempts" are three policies over the same history:

- `WorkBudget.max_attempts` bounds CHARGED attempts (informative about the work);
  `WorkBudget.max_uncharged_attempts` bounds CONSECUTIVE upstream attempts (ADR 0046).
- `ExplicitLimit` bounds EVERY admitted attempt and replaces the charged bound (ADR 0033).
- `DispatchCap` bounds every dispatch of a board issue (ADR 015).

How each attempt is read:

- succeeded: the history is done (nothing may follow it); it is never classed and counts
  as charged (it was informative).
- failed: charged unless positively classed `environment` or `upstream`; no class = work.
- abandoned: charged whatever class it carries, because its owner died mid-work and no
  proof of what happened was recorded (default to charging).
- running: not yet charged (its outcome is unknown); while one runs the decision is `wait`.

Uncharged streak: the consecutive upstream attempts at the end of the history. A charged
attempt (work failure, abandoned, succeeded) resets it. An environment attempt neither adds
to it nor resets it: it says nothing about the outside service, so an outage that spans an
operator's environment fix and forced retry stays bounded by the same ceiling.

When several bounds hold at once the decision names the most specific one, in this order:
environment, attempt_limit, upstream, work, dispatch_cap. Environment first because only a
human can fix it; the explicit limit before the class bounds because it is the operator's
own setting and raising it is the documented way out; the dispatch cap last because it is
the coarsest backstop.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from attrs.validators import ge, instance_of, le

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._classify import FailureClass
from execkit._errors import HistoryError, InvalidInput
from execkit._json import to_json
from execkit._validate import (
    checked,
    finite,
    integer,
    integer_arg,
    is_integer,
    is_number,
    opt_checked,
    truth,
)

__all__ = [
    "EXPLICIT_LIMIT_MAX",
    "MAX_UNCHARGED_REPLANS",
    "Attempt",
    "AttemptStatus",
    "Backoff",
    "BlockedOn",
    "Decision",
    "DecisionState",
    "DispatchCap",
    "ExplicitLimit",
    "NextAction",
    "Plan",
    "ReplanDecision",
    "WorkBudget",
    "decide",
    "decide_replans",
    "validate_history",
]

MAX_UNCHARGED_REPLANS = 3

EXPLICIT_LIMIT_MAX = 10000


class AttemptStatus(enum.StrEnum):
    """How one admitted attempt (a ledger run) stands."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABANDONED = "abandoned"


class DecisionState(enum.StrEnum):
    """What the policies say about a history now."""

    READY = "ready"
    RUNNING = "running"
    BACKOFF = "backoff"
    DONE = "done"
    BLOCKED = "blocked"


class BlockedOn(enum.StrEnum):
    """Which bound stopped a blocked history, most specific first (see `decide`)."""

    ENVIRONMENT = "environment"
    ATTEMPT_LIMIT = "attempt_limit"
    UPSTREAM = "upstream"
    WORK = "work"
    DISPATCH_CAP = "dispatch_cap"


class NextAction(enum.StrEnum):
    """What the caller should do next."""

    RUN = "run"
    WAIT = "wait"
    NONE = "none"


# --- converters -----------------------------------------------------------------------


def _to_enum(kind: type[enum.StrEnum], field: str, extra: str = "") -> Callable[[Any], Any]:
    """A converter from the enum or its string value; InvalidInput naming `field` else."""

    def convert(value: Any) -> Any:
        if isinstance(value, kind) or (value is None and extra):
            return value
        if isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
        raise InvalidInput(
            f"{field}: {value!r} is not one of {', '.join(kind)}{extra}", field=field
        )

    return convert


_attempt_status = _to_enum(AttemptStatus, "status")
_failure_class = _to_enum(FailureClass, "failure_class", " (or null for work)")


def _to_status(value: AttemptStatus | str) -> AttemptStatus:
    status: AttemptStatus = _attempt_status(value)
    return status


def _to_class(value: FailureClass | str | None) -> FailureClass | None:
    klass: FailureClass | None = _failure_class(value)
    return klass


def _to_time(value: float | None) -> float | None:
    # Store ints as floats; anything else is left for the validator to reject by name.
    if is_integer(value):
        return float(value)
    return value


_AT_LEAST_ONE = checked("an integer >= 1", integer, ge(1))
_TIME = opt_checked("a finite number of POSIX seconds", finite)
_OPT_TEXT = opt_checked("a string", instance_of(str))


def _time_field() -> Any:
    return attrs.field(default=None, converter=_to_time, validator=_TIME)


# --- value types -----------------------------------------------------------------------


@attrs.frozen
class Attempt:
    """One admitted attempt. Times are POSIX seconds (float).

    `status` and `failure_class` accept their enum or its string value. A failed attempt
    with `failure_class=None` is a work failure. Bad values raise `InvalidInput` naming the
    field and what is allowed.
    """

    number: int = attrs.field(validator=_AT_LEAST_ONE)
    status: AttemptStatus = attrs.field(converter=_to_status)
    failure_class: FailureClass | None = attrs.field(default=None, converter=_to_class)
    reason: str | None = attrs.field(
        default=None, validator=opt_checked("a string", instance_of(str))
    )
    started_at: float | None = _time_field()
    ended_at: float | None = _time_field()
    forced: bool = attrs.field(default=False, validator=checked("true or false", truth))


@attrs.frozen
class WorkBudget:
    """The ADR 0046 budget: charged attempts and consecutive upstream attempts (each >= 1)."""

    max_attempts: int = attrs.field(default=3, validator=_AT_LEAST_ONE)
    max_uncharged_attempts: int = attrs.field(default=3, validator=_AT_LEAST_ONE)


@attrs.frozen
class ExplicitLimit:
    """An ADR 0033 task limit: every admitted run counts; 1..10000 else `InvalidInput`."""

    max_attempts: int = attrs.field(
        validator=checked(
            f"an integer in 1..{EXPLICIT_LIMIT_MAX} (an explicit attempt limit)",
            integer,
            ge(1),
            le(EXPLICIT_LIMIT_MAX),
        )
    )


@attrs.frozen
class DispatchCap:
    """The ADR 015 cap on total dispatches of one item.

    Zero or negative means no cap (the ADR's "retry forever" escape hatch maps a negative
    setting to 0 = no cap, so both read the same here).
    """

    max_attempts: int = attrs.field(default=10, validator=checked("an integer", integer))

    @property
    def capped(self) -> bool:
        return self.max_attempts > 0


@attrs.frozen
class Decision:
    """What the policies say about the next attempt; `to_dict()` is JSON-safe."""

    state: DecisionState
    blocked_on: BlockedOn | None
    next_action: NextAction
    next_attempt_at: float | None
    reason: str | None
    attempts_used: int
    charged_attempts: int
    uncharged_streak: int
    remaining: int | None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


# --- history ---------------------------------------------------------------------------


def _check_history(
    items: Sequence[Attempt | Plan], item_type: type[Attempt] | type[Plan], kind: str
) -> None:
    running: int | None = None
    for index, item in enumerate(items):
        if not isinstance(item, item_type):
            raise HistoryError(
                f"{kind} history item {index}: expected {item_type.__name__}, "
                f"got {type(item).__name__}"
            )
        if item.number != index + 1:
            raise HistoryError(
                f"{kind} history item {index}: number is {item.number}, expected {index + 1} "
                "(numbers must be gapless 1..N in order)"
            )
        if item.status is AttemptStatus.RUNNING:
            if running is not None:
                raise HistoryError(
                    f"{kind} history: {kind}s {running} and {item.number} are both running "
                    "(at most one may run)"
                )
            running = item.number
        if item.status is AttemptStatus.SUCCEEDED and index != len(items) - 1:
            raise HistoryError(
                f"{kind} history: {kind} {item.number} succeeded but {kind} "
                f"{items[index + 1].number} follows it (nothing may follow a success)"
            )


def validate_history(attempts: Sequence[Attempt]) -> None:
    """Raise `HistoryError` unless the attempts are numbered gapless 1..N in order, at most
    one is running, and nothing follows a succeeded attempt."""
    _check_history(attempts, Attempt, "attempt")


def _charged(status: AttemptStatus, failure_class: FailureClass | None) -> bool:
    if status is AttemptStatus.FAILED:
        return failure_class is None or failure_class.charged
    # Abandoned: the owner died mid-work, nothing identified it as uninformative.
    return status in (AttemptStatus.SUCCEEDED, AttemptStatus.ABANDONED)


def _is_upstream(status: AttemptStatus, failure_class: FailureClass | None) -> bool:
    return status is AttemptStatus.FAILED and failure_class is FailureClass.UPSTREAM


def _is_environment(status: AttemptStatus, failure_class: FailureClass | None) -> bool:
    return status is AttemptStatus.FAILED and failure_class is FailureClass.ENVIRONMENT


def _streak(items: Sequence[Attempt | Plan]) -> tuple[int, str | None]:
    """Consecutive upstream failures at the end, and the latest one's reason.

    Environment and running items are transparent (see the module docstring).
    """
    streak = 0
    latest_reason: str | None = None
    for item in reversed(items):
        if _is_upstream(item.status, item.failure_class):
            if streak == 0:
                latest_reason = item.reason
            streak += 1
        elif item.status is AttemptStatus.RUNNING or _is_environment(
            item.status, item.failure_class
        ):
            continue
        else:
            break
    return streak, latest_reason


def _state_before_bounds(
    items: Sequence[Attempt] | Sequence[Plan], *, empty: str, succeeded: str, running: str
) -> tuple[DecisionState, NextAction, str] | None:
    """(state, next_action, reason) when no bound is read, else None.

    An empty history is ready (every bound is >= 1, so nothing can bind it); a last item
    that succeeded is done; an item still running makes the caller wait. `succeeded` and
    `running` are formats of that item's number.
    """
    if not items:
        return DecisionState.READY, NextAction.RUN, empty
    last = items[-1]
    if last.status is AttemptStatus.SUCCEEDED:
        # Finished stays finished: raising a limit never reopens it (ADR 0033).
        return DecisionState.DONE, NextAction.NONE, succeeded.format(last.number)
    active = next((item for item in items if item.status is AttemptStatus.RUNNING), None)
    if active is not None:
        return DecisionState.RUNNING, NextAction.WAIT, running.format(active.number)
    return None


def _environment_reason(reason: str | None) -> str:
    if reason:
        return f"environment: {reason}"
    return "environment: a precondition is missing (no reason recorded); fix it, then force a retry"


def _upstream_reason(reason: str | None, streak: int) -> str:
    what = f": {reason}" if reason else ""
    return f"waiting on an outside service{what} ({streak} consecutive upstream attempts)"


def decide(
    attempts: Sequence[Attempt],
    budget: WorkBudget = WorkBudget(),
    limit: ExplicitLimit | None = None,
    backoff: Backoff = SCHEDULER_BACKOFF,
    now: float | None = None,
    cap: DispatchCap | None = None,
    *,
    force: bool = False,
) -> Decision:
    """Project the history onto a Decision about the next attempt.

    `force=True` asks on behalf of an operator who fixed the environment: it lifts the
    environment stop and nothing else (every other bound and the backoff still apply), so a
    forced retry runs with the budget intact but cannot outrun it. Once recorded (with
    `forced=True`), that attempt is evaluated like any other.

    Raises `HistoryError` for a history that `validate_history` rejects and `InvalidInput`
    for a non-finite `now`.
    """
    validate_history(attempts)
    if now is None:
        now = time.time()
    elif not is_number(now):
        raise InvalidInput(
            f"now: must be a finite number of POSIX seconds, got {now!r}", field="now"
        )

    used = len(attempts)
    charged = sum(1 for a in attempts if _charged(a.status, a.failure_class))
    streak, upstream_reason = _streak(attempts)
    if limit is not None:
        remaining = max(0, limit.max_attempts - used)
    else:
        remaining = max(0, budget.max_attempts - charged)

    def result(
        state: DecisionState,
        next_action: NextAction,
        reason: str | None,
        blocked_on: BlockedOn | None = None,
        next_attempt_at: float | None = None,
    ) -> Decision:
        return Decision(
            state=state,
            blocked_on=blocked_on,
            next_action=next_action,
            next_attempt_at=next_attempt_at,
            reason=reason,
            attempts_used=used,
            charged_attempts=charged,
            uncharged_streak=streak,
            remaining=remaining,
        )

    early = _state_before_bounds(
        attempts,
        empty="no attempts yet",
        succeeded="succeeded on attempt {}",
        running="attempt {} is running",
    )
    if early is not None:
        return result(*early)

    last = attempts[-1]
    blocked = _blocked(used, charged, streak, budget, limit, cap, last, upstream_reason, force)
    if blocked is not None:
        return result(DecisionState.BLOCKED, NextAction.NONE, blocked[1], blocked_on=blocked[0])

    # Every attempt here ended without success, so the failure run is the whole history.
    reference = last.ended_at if last.ended_at is not None else last.started_at
    if reference is None:  # a legacy record without times: nothing to wait from
        return result(DecisionState.READY, NextAction.RUN, f"retry after attempt {last.number}")
    seed = f"{last.number}:{last.started_at!r}"
    next_at = reference + backoff.delay(used, seed)
    if now < next_at:
        return result(
            DecisionState.BACKOFF,
            NextAction.WAIT,
            f"backing off after {used} consecutive failed attempt{'' if used == 1 else 's'}",
            next_attempt_at=next_at,
        )
    return result(
        DecisionState.READY,
        NextAction.RUN,
        f"retry after attempt {last.number}",
        next_attempt_at=next_at,
    )


def _blocked(
    used: int,
    charged: int,
    streak: int,
    budget: WorkBudget,
    limit: ExplicitLimit | None,
    cap: DispatchCap | None,
    last: Attempt,
    upstream_reason: str | None,
    force: bool,
) -> tuple[BlockedOn, str] | None:
    """The most specific bound that holds, as (blocked_on, reason), or None."""
    if not force and _is_environment(last.status, last.failure_class):
        return BlockedOn.ENVIRONMENT, _environment_reason(last.reason)
    if limit is not None and used >= limit.max_attempts:
        return (
            BlockedOn.ATTEMPT_LIMIT,
            f"attempt limit reached: {used} of {limit.max_attempts} runs",
        )
    if streak >= budget.max_uncharged_attempts:
        return BlockedOn.UPSTREAM, _upstream_reason(upstream_reason, streak)
    if limit is None and charged >= budget.max_attempts:
        reason = f"charged budget spent: {charged} of {budget.max_attempts} attempts"
        return BlockedOn.WORK, reason
    if cap is not None and cap.capped and used >= cap.max_attempts:
        return (
            BlockedOn.DISPATCH_CAP,
            f"dispatch cap reached: {used} of {cap.max_attempts} dispatches",
        )
    return None


# --- the governor's replan budget ------------------------------------------------------


@attrs.frozen
class Plan:
    """One plan record of a goal; the replan analogue of `Attempt`."""

    number: int = attrs.field(validator=_AT_LEAST_ONE)
    status: AttemptStatus = attrs.field(converter=_to_status)
    failure_class: FailureClass | None = attrs.field(default=None, converter=_to_class)
    reason: str | None = attrs.field(
        default=None, validator=opt_checked("a string", instance_of(str))
    )


@attrs.frozen
class ReplanDecision:
    """What the replan budget says about planning again; `to_dict()` is JSON-safe."""

    state: DecisionState  # never backoff
    blocked_on: BlockedOn | None  # None | environment | upstream | work
    next_action: NextAction
    reason: str | None
    replans_used: int
    charged_replans: int
    uncharged_streak: int
    remaining: int

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def decide_replans(plans: Sequence[Plan], max_replans: int) -> ReplanDecision:
    """The ADR 0046 projection over a goal's plan records.

    `max_replans` (>= 1) bounds charged plans exactly as `WorkBudget.max_attempts` bounds
    charged attempts; `MAX_UNCHARGED_REPLANS` bounds consecutive upstream plan failures; an
    environment plan failure stops the goal and names the precondition. Raises
    `HistoryError` for a bad plan history and `InvalidInput` for a bad `max_replans`.
    """
    integer_arg("max_replans", max_replans, 1)
    _check_history(plans, Plan, "plan")
    used = len(plans)
    charged = sum(1 for p in plans if _charged(p.status, p.failure_class))
    streak, upstream_reason = _streak(plans)

    def result(
        state: DecisionState,
        next_action: NextAction,
        reason: str | None,
        blocked_on: BlockedOn | None = None,
    ) -> ReplanDecision:
        return ReplanDecision(
            state=state,
            blocked_on=blocked_on,
            next_action=next_action,
            reason=reason,
            replans_used=used,
            charged_replans=charged,
            uncharged_streak=streak,
            remaining=max(0, max_replans - charged),
        )

    early = _state_before_bounds(
        plans, empty="no plans yet", succeeded="plan {} succeeded", running="plan {} is running"
    )
    if early is not None:
        return result(*early)
    last = plans[-1]
    if _is_environment(last.status, last.failure_class):
        return result(
            DecisionState.BLOCKED,
            NextAction.NONE,
            _environment_reason(last.reason),
            BlockedOn.ENVIRONMENT,
        )
    if streak >= MAX_UNCHARGED_REPLANS:
        return result(
            DecisionState.BLOCKED,
            NextAction.NONE,
            _upstream_reason(upstream_reason, streak),
            BlockedOn.UPSTREAM,
        )
    if charged >= max_replans:
        return result(
            DecisionState.BLOCKED,
            NextAction.NONE,
            f"charged replan budget spent: {charged} of {max_replans} replans",
            BlockedOn.WORK,
        )
    return result(DecisionState.READY, NextAction.RUN, f"replan after plan {last.number}")
