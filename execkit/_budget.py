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
  proof of what happened was recorded (default to charging). The one exception is a run
  its own runner stopped on purpose (`stopped`: a dispatcher shutting down, a cancelled
  asyncio task): it said nothing about the work or the vendor, so it is uncharged, moves
  no streak and sets no backoff; it still counts against an explicit limit, as every
  admitted run does (ADR 0033).
- running: not yet charged (its outcome is unknown); while one runs the decision is `wait`.

Uncharged streak: the consecutive upstream attempts at the end of the history. A charged
attempt (work failure, abandoned, succeeded) resets it. An environment attempt neither adds
to it nor resets it: it says nothing about the outside service. Nor does an upstream
failure its vendor lane absorbed (`lane_held`: it met the lane closed, in flight when
another result closed it, or it was the probe that found it closed still): that refusal was
the lane's, which bounds it by its own waits and stops after `LaneConfig.max_trips` closings
in a row, so a task is stopped on `upstream` only by refusals that were its own. The refusal
that closes an open lane is its task's own: a lone task's refusals still reach its ceiling.
A forced attempt (an operator's retry after a stop) starts a fresh streak: the operator has
looked and decided to try again, so the ceiling applies anew to what follows it.

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
    "DecisionFields",
    "DecisionState",
    "DispatchCap",
    "ExplicitLimit",
    "HistorySummary",
    "LastAttempt",
    "NextAction",
    "Plan",
    "ReplanDecision",
    "TaskState",
    "WorkBudget",
    "counted_after",
    "decide",
    "decide_replans",
    "decide_summary",
    "decision_fields",
    "decision_values",
    "summarize",
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


class TaskState(enum.StrEnum):
    """A task's state: what the policies say about its history now (`Decision.state`), or
    `cancelled`.

    The policies return the first five; `cancelled` is never a decision (no history ends in
    it): only the ledger sets it, for a task an operator cancelled (`Task.state`). One enum
    for both, so the dispatcher and the CLI compare a decision and a task with the same
    members. It lives here, below the ledger that also uses it, because the policies are
    where a state is decided. `DecisionState` is the same class under its older name.
    """

    READY = "ready"
    RUNNING = "running"
    BACKOFF = "backoff"
    DONE = "done"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"


DecisionState = TaskState
"""The name `Decision.state` was first published under (public API, in the docs): the
very same enum, so `TaskState.BLOCKED is TaskState.BLOCKED`."""


class BlockedOn(enum.StrEnum):
    """Which bound stopped a blocked history, most specific first (see `decide`)."""

    ENVIRONMENT = "environment"
    ATTEMPT_LIMIT = "attempt_limit"
    UPSTREAM = "upstream"
    WORK = "work"
    DISPATCH_CAP = "dispatch_cap"
    # Issue #45: the task's own spend cap has no room for another run. Not one of the
    # policies' bounds (`decide` never names it): the ledger shows it on a task whose
    # budget its runs have spent (`get_task`), and admission refuses such a run.
    SPEND = "spend"


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
    # The earliest time the vendor said it would take another request (a reset time or a
    # Retry-After); the next attempt is never scheduled before it.
    not_before: float | None = _time_field()
    # Abandoned by its own runner on purpose (see the module docstring): uncharged.
    stopped: bool = attrs.field(default=False, validator=checked("true or false", truth))
    # An upstream failure its vendor lane absorbed (see the module docstring): it moves
    # no streak.
    lane_held: bool = attrs.field(default=False, validator=checked("true or false", truth))

    def __attrs_post_init__(self) -> None:
        if self.stopped and self.status is not AttemptStatus.ABANDONED:
            raise InvalidInput(
                f"stopped: only an abandoned attempt can be stopped, not a {self.status} one",
                field="stopped",
            )
        if self.lane_held and not _is_upstream(self.status, self.failure_class):
            raise InvalidInput(
                "lane_held: only an upstream failure can be held by its lane, "
                f"not a {self.status} one ({self.failure_class or 'no class'})",
                field="lane_held",
            )


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

    Zero means no cap. Negative is the ADR's explicit "retry forever" escape hatch: no cap,
    and the charged work budget is lifted too (see `decide_summary`).
    """

    max_attempts: int = attrs.field(default=10, validator=checked("an integer", integer))

    @property
    def capped(self) -> bool:
        return self.max_attempts > 0

    @property
    def unbounded(self) -> bool:
        """The operator asked for work failures to be retried without end."""
        return self.max_attempts < 0


@attrs.frozen
class Decision:
    """What the policies say about the next attempt; `to_dict()` is JSON-safe."""

    state: TaskState  # never cancelled
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


def _charged(status: AttemptStatus, failure_class: FailureClass | None, stopped: bool) -> bool:
    if stopped:
        return False  # stopped by its own runner: it said nothing about the work
    if status is AttemptStatus.FAILED:
        return failure_class is None or failure_class.charged
    # Abandoned: the owner died mid-work, nothing identified it as uninformative.
    return status in (AttemptStatus.SUCCEEDED, AttemptStatus.ABANDONED)


def _is_upstream(status: AttemptStatus, failure_class: FailureClass | None) -> bool:
    return status is AttemptStatus.FAILED and failure_class is FailureClass.UPSTREAM


def _is_environment(status: AttemptStatus, failure_class: FailureClass | None) -> bool:
    return status is AttemptStatus.FAILED and failure_class is FailureClass.ENVIRONMENT


def counted_after(
    charged: int,
    streak: int,
    streak_reason: str | None,
    status: AttemptStatus,
    failure_class: FailureClass | None,
    reason: str | None,
    forced: bool,
    stopped: bool,
    lane_held: bool = False,
) -> tuple[int, int, str | None]:
    """The charged count, the uncharged streak and its reason after an ended attempt
    (`status`, `failure_class`, `reason`, `forced`, `stopped`, `lane_held`) follows a
    history that had `charged`, `streak` and `streak_reason`: the one fold rule, which
    `HistorySummary` applies (see its `_counted`) and `db check` applies to the stored
    runs' values as they are read."""
    charged += _charged(status, failure_class, stopped)
    if forced:
        streak, streak_reason = 0, None
    if _is_upstream(status, failure_class):
        if lane_held:
            return charged, streak, streak_reason  # the lane's refusal, not the task's
        return charged, streak + 1, reason
    if not (stopped or _is_environment(status, failure_class)):
        return charged, 0, None
    return charged, streak, streak_reason


@attrs.frozen
class HistorySummary:
    """Everything the policies read of a history, folded attempt by attempt.

    `summarize(history)` and the ledger's stored per-task summary (updated by `started` and
    `finished` in the transaction that writes the run) are the same value for the same
    history; `decide` is a function of it, so admission reads one row, not every run.
    `last` is the latest attempt; `running` the number of the one running, if any.
    """

    attempts_used: int = 0
    charged_attempts: int = 0
    uncharged_streak: int = 0
    streak_reason: str | None = None
    running: int | None = None
    last: Attempt | None = None

    def started(self, attempt: Attempt) -> HistorySummary:
        """The summary after `attempt` (number attempts_used + 1) was appended."""
        if attempt.number != self.attempts_used + 1:
            raise HistoryError(
                f"attempt {attempt.number} cannot follow {self.attempts_used} attempts "
                "(numbers must be gapless 1..N in order)"
            )
        if self.running is not None and attempt.status is AttemptStatus.RUNNING:
            raise HistoryError(
                f"attempts {self.running} and {attempt.number} are both running "
                "(at most one may run)"
            )
        if self.last is not None and self.last.status is AttemptStatus.SUCCEEDED:
            raise HistoryError(
                f"attempt {self.last.number} succeeded but attempt {attempt.number} follows "
                "it (nothing may follow a success)"
            )
        if attempt.status is AttemptStatus.RUNNING:
            # A running attempt is transparent: it neither charges nor moves the streak.
            return HistorySummary(
                attempts_used=attempt.number,
                charged_attempts=self.charged_attempts,
                uncharged_streak=self.uncharged_streak,
                streak_reason=self.streak_reason,
                running=attempt.number,
                last=attempt,
            )
        return self._counted(attempt, attempts_used=attempt.number, running=self.running)

    def finished(self, attempt: Attempt) -> HistorySummary:
        """The summary after the running attempt (the latest) ended as `attempt`."""
        if self.last is None or self.running != attempt.number != self.last.number:
            raise HistoryError(f"attempt {attempt.number} is not the running attempt")
        if attempt.status is AttemptStatus.RUNNING:
            raise HistoryError(f"attempt {attempt.number} has not ended")
        return self._counted(attempt, attempts_used=self.attempts_used, running=None)

    def _counted(
        self, attempt: Attempt, *, attempts_used: int, running: int | None
    ) -> HistorySummary:
        """The summary with `attempt` (ended) last, `attempts_used` and `running`: charge
        and streak after it. Built directly, not by `attrs.evolve` (`db check` folds every
        run of the ledger through here, and evolve cost more than the rest of the fold).

        A forced attempt (an operator's retry) starts a fresh streak: it counts itself if
        it met the vendor refusing, but the ceiling that stopped the item is not held
        against it. An environment failure neither adds to the streak nor resets it; any
        charged attempt ends it. A stopped attempt (its runner stopped it on purpose)
        neither charges nor moves the streak, as it met neither the work nor the vendor.
        """
        charged, streak, reason = counted_after(
            self.charged_attempts,
            self.uncharged_streak,
            self.streak_reason,
            attempt.status,
            attempt.failure_class,
            attempt.reason,
            attempt.forced,
            attempt.stopped,
            attempt.lane_held,
        )
        return HistorySummary(
            attempts_used=attempts_used,
            charged_attempts=charged,
            uncharged_streak=streak,
            streak_reason=reason,
            running=running,
            last=attempt,
        )


def summarize(attempts: Sequence[Attempt]) -> HistorySummary:
    """Fold a history into its `HistorySummary`; `HistoryError` for a broken history."""
    summary = HistorySummary()
    for index, attempt in enumerate(attempts):
        if not isinstance(attempt, Attempt):
            raise HistoryError(
                f"attempt history item {index}: expected Attempt, got {type(attempt).__name__}"
            )
        summary = summary.started(attempt)
    return summary


def _environment_reason(reason: str | None) -> str:
    if reason:
        return f"environment: {reason}"
    return (
        "environment: a precondition is missing (no reason recorded); fix it, then retry the "
        "task (execkit task retry)"
    )


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
    ignore_backoff: bool = False,
) -> Decision:
    """Project the history onto a Decision about the next attempt.

    `decide_summary(summarize(attempts), ...)`: see there. Raises `HistoryError` for a
    history that `validate_history` rejects and `InvalidInput` for a non-finite `now`.
    """
    validate_history(attempts)
    return decide_summary(
        summarize(attempts),
        budget,
        limit,
        backoff,
        now,
        cap,
        force=force,
        ignore_backoff=ignore_backoff,
    )


def decide_summary(
    summary: HistorySummary,
    budget: WorkBudget = WorkBudget(),
    limit: ExplicitLimit | None = None,
    backoff: Backoff = SCHEDULER_BACKOFF,
    now: float | None = None,
    cap: DispatchCap | None = None,
    *,
    force: bool = False,
    ignore_backoff: bool = False,
) -> Decision:
    """The Decision about the next attempt, from a history's summary.

    `force=True` asks on behalf of an operator who retries after a stop (ADR 0046: "a human
    who fixes the environment can still force a retry"; ADR 015: "the operator re-opens
    them once the host recovers"): it lifts the environment stop, the uncharged ceiling,
    the spent charged budget and the dispatch cap for this one admission, and never the
    explicit limit (ADR 0033: only raising it admits more). Once recorded (with
    `forced=True`) that attempt is evaluated like any other, so a forced retry runs once
    and the bounds apply again to what it returns. `ignore_backoff=True` does not wait for
    the backoff or the vendor's reset time (an operator deciding when).

    A negative dispatch cap (ADR 015's "retry forever" escape hatch) lifts the dispatch
    cap and the charged work budget: work failures are retried without end, as the
    operator asked. The environment stop and the uncharged ceiling still hold (ADR 0046:
    nothing that was not informative retries without end).

    Raises `InvalidInput` for a non-finite `now`.
    """
    # Positional, in the field order: the admission path decides once per admission.
    return Decision(
        *decision_fields(
            summary, budget, limit, backoff, now, cap, force=force, ignore_backoff=ignore_backoff
        )
    )


def decision_fields(
    summary: HistorySummary,
    budget: WorkBudget,
    limit: ExplicitLimit | None,
    backoff: Backoff,
    now: float | None,
    cap: DispatchCap | None,
    *,
    force: bool,
    ignore_backoff: bool,
) -> DecisionFields:
    """`decide_summary`'s Decision as the tuple of its fields, in their order (`state`,
    `blocked_on`, `next_action`, `next_attempt_at`, `reason`, `attempts_used`,
    `charged_attempts`, `uncharged_streak`, `remaining`), without the Decision: the
    summary read as `decision_values` reads it. Raises as `decide_summary` does."""
    last = summary.last
    return decision_values(
        summary.attempts_used,
        summary.charged_attempts,
        summary.uncharged_streak,
        summary.streak_reason,
        summary.running,
        None
        if last is None
        else (
            last.number,
            last.status,
            last.failure_class,
            last.reason,
            last.started_at,
            last.ended_at,
            last.not_before,
            last.stopped,
        ),
        budget.max_attempts,
        budget.max_uncharged_attempts,
        0 if limit is None else limit.max_attempts,
        backoff,
        now,
        cap,
        force=force,
        ignore_backoff=ignore_backoff,
    )


# A history's last attempt as `decision_values` reads it: number, status, failure class,
# reason, start, end, the vendor's not-before time, stopped (no `forced`: nothing decided
# on it reads it).
LastAttempt = tuple[
    int,
    "AttemptStatus",
    "FailureClass | None",
    "str | None",
    "float | None",
    "float | None",
    "float | None",
    bool,
]
DecisionFields = tuple[
    "TaskState", "BlockedOn | None", "NextAction", "float | None", "str | None", int, int, int, int
]


def decision_values(
    used: int,
    charged: int,
    streak: int,
    streak_reason: str | None,
    running: int | None,
    last: LastAttempt | None,
    max_attempts: int,
    max_uncharged_attempts: int,
    limit: int,
    backoff: Backoff,
    now: float | None,
    cap: DispatchCap | None,
    *,
    force: bool,
    ignore_backoff: bool,
    timed: bool = True,
) -> DecisionFields:
    """The one decision rule (`decide_summary` and every listing decide through it), on a
    summary given as its values: `used`, `charged`, `streak` (and its reason) and `running`
    as `HistorySummary` holds them, its `last` attempt (`LastAttempt`, None for an empty
    history), the budget's two bounds, the explicit limit (0: none), the backoff, `now`,
    the dispatch cap. A ledger decides on a stored task's columns with no summary or
    attempt built (a listing decides on every open task it shows). The values are trusted
    as a summary's (the caller read them from one, or from a stored one); `now` is checked:
    InvalidInput for a non-finite one. Returns the Decision's fields in its order.

    `timed=False`, for a caller that shows no time for a ready task (a dashboard shows one
    only for a task backing off): a task that is ready again after a failure has None for
    its `next_attempt_at` when its time was not needed to tell it from one backing off
    (its wait, at most `backoff.max_s`, and any vendor's time are behind `now`), so its
    backoff is not computed (a hash of its start); every other field is the same."""
    if now is None:
        now = time.time()
    # A float is checked with one comparison; anything else as `is_number` checks it.
    elif (type(now) is not float or not -_INF < now < _INF) and not is_number(now):
        raise InvalidInput(
            f"now: must be a finite number of POSIX seconds, got {now!r}", field="now"
        )
    remaining = max(0, limit - used if limit else max_attempts - charged)
    if last is None:
        # Every bound is >= 1, so nothing can bind an empty history.
        return (
            _READY, None, _RUN, None, "no attempts yet",
            used, charged, streak, remaining,
        )  # fmt: skip
    number, status, failure_class, last_reason, started_at, ended_at, not_before, stopped = last
    if status is _SUCCEEDED:
        # Finished stays finished: raising a limit never reopens it (ADR 0033).
        return (
            _DONE, None, _NONE, None, f"succeeded on attempt {number}",
            used, charged, streak, remaining,
        )  # fmt: skip
    if running is not None:
        return (
            _RUNNING, None, _WAIT, None, f"attempt {running} is running",
            used, charged, streak, remaining,
        )  # fmt: skip

    # The most specific bound that holds, in the module docstring's order.
    blocked_on: BlockedOn | None = None
    reason: str | None = None
    if not force and status is _FAILED and failure_class is _ENVIRONMENT:
        blocked_on, reason = BlockedOn.ENVIRONMENT, _environment_reason(last_reason)
    elif limit and used >= limit:
        blocked_on = BlockedOn.ATTEMPT_LIMIT
        reason = f"attempt limit reached: {used} of {limit} runs"
    elif force:
        pass
    elif streak >= max_uncharged_attempts:
        blocked_on, reason = BlockedOn.UPSTREAM, _upstream_reason(streak_reason, streak)
    elif not limit and not (cap is not None and cap.unbounded) and charged >= max_attempts:
        blocked_on = BlockedOn.WORK
        reason = f"charged budget spent: {charged} of {max_attempts} attempts"
    elif cap is not None and cap.capped and used >= cap.max_attempts:
        blocked_on = BlockedOn.DISPATCH_CAP
        reason = f"dispatch cap reached: {used} of {cap.max_attempts} dispatches"
    if blocked_on is not None:
        return (
            _BLOCKED, blocked_on, _NONE, None, reason,
            used, charged, streak, remaining,
        )  # fmt: skip

    if stopped:
        # Stopped by its own runner: nothing was learnt, so nothing to back off from.
        return (
            _READY, None, _RUN, None,
            f"retry after attempt {number} (stopped)", used, charged, streak, remaining,
        )  # fmt: skip
    # Every attempt here ended without success, so the failure run is the whole history.
    reference = ended_at if ended_at is not None else started_at
    if (
        not timed
        and reference.__class__ is float
        and used.__class__ is int
        and used >= 1  # `backoff.delay` takes it, as below
        and backoff.__class__ is Backoff  # whose delay is at most its `max_s`
        and (not_before is None or not_before.__class__ is float)
        and (
            ignore_backoff
            or (now >= reference + backoff.max_s and (not_before is None or now >= not_before))
        )
    ):
        # Ready whatever the backoff's jitter: the wait and the vendor's time both ended by
        # `now` (a float sum grows with what is added: reference + delay <= reference +
        # max_s). A NaN time compares false, so it is decided below, as ever.
        return (
            _READY, None, _RUN, None, f"retry after attempt {number}",
            used, charged, streak, remaining,
        )  # fmt: skip
    next_at = None
    if reference is not None:
        next_at = reference + backoff.delay(used, f"{number}:{started_at!r}")
    vendor = not_before is not None and (next_at is None or not_before > next_at)
    if vendor:
        # The vendor named the time it takes requests again: never earlier than that.
        next_at = not_before
    if next_at is None:  # a legacy record without times: nothing to wait from
        return (
            _READY, None, _RUN, None, f"retry after attempt {number}",
            used, charged, streak, remaining,
        )  # fmt: skip
    if now < next_at and not ignore_backoff:
        waiting = (
            f"waiting for the vendor's reset time after attempt {number}"
            if vendor
            else f"backing off after {used} consecutive failed attempt{'' if used == 1 else 's'}"
        )
        return (
            _BACKOFF, None, _WAIT, next_at, waiting,
            used, charged, streak, remaining,
        )  # fmt: skip
    return (
        _READY, None, _RUN, next_at, f"retry after attempt {number}",
        used, charged, streak, remaining,
    )  # fmt: skip


_INF = float("inf")
# The members `decision_values` returns and compares with, as names of this module (a
# module name is one lookup, an enum's member two: a listing decides once an open task).
_READY, _DONE, _RUNNING = TaskState.READY, TaskState.DONE, TaskState.RUNNING
_BLOCKED, _BACKOFF = TaskState.BLOCKED, TaskState.BACKOFF
_RUN, _NONE, _WAIT = NextAction.RUN, NextAction.NONE, NextAction.WAIT
_SUCCEEDED, _FAILED = AttemptStatus.SUCCEEDED, AttemptStatus.FAILED
_ENVIRONMENT = FailureClass.ENVIRONMENT


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

    state: TaskState  # never backoff or cancelled
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
    # The same fold as attempts: a plan is an attempt of the governor's replanning.
    summary = summarize([Attempt(p.number, p.status, p.failure_class, p.reason) for p in plans])
    used, charged = summary.attempts_used, summary.charged_attempts
    streak, upstream_reason = summary.uncharged_streak, summary.streak_reason

    def result(
        state: TaskState,
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

    last = summary.last
    if last is None:
        return result(TaskState.READY, NextAction.RUN, "no plans yet")
    if last.status is AttemptStatus.SUCCEEDED:
        return result(TaskState.DONE, NextAction.NONE, f"plan {last.number} succeeded")
    if summary.running is not None:
        return result(TaskState.RUNNING, NextAction.WAIT, f"plan {summary.running} is running")
    if _is_environment(last.status, last.failure_class):
        return result(
            TaskState.BLOCKED,
            NextAction.NONE,
            _environment_reason(last.reason),
            BlockedOn.ENVIRONMENT,
        )
    if streak >= MAX_UNCHARGED_REPLANS:
        return result(
            TaskState.BLOCKED,
            NextAction.NONE,
            _upstream_reason(upstream_reason, streak),
            BlockedOn.UPSTREAM,
        )
    if charged >= max_replans:
        return result(
            TaskState.BLOCKED,
            NextAction.NONE,
            f"charged replan budget spent: {charged} of {max_replans} replans",
            BlockedOn.WORK,
        )
    return result(TaskState.READY, NextAction.RUN, f"replan after plan {last.number}")
