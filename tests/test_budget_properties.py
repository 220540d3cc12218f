"""Hypothesis proofs of the budget invariants (issue 5, ADR 0046 / 0033 / 015)."""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from execkit._budget import (
    MAX_UNCHARGED_REPLANS,
    Attempt,
    AttemptStatus,
    Backoff,
    Decision,
    DispatchCap,
    ExplicitLimit,
    Plan,
    TaskState,
    WorkBudget,
    decide,
    decide_replans,
    decision_values,
    validate_history,
)
from execkit._classify import FailureClass
from execkit._errors import HistoryError

# (status, class) outcomes an admitted attempt can end with.
OUTCOMES = [
    (AttemptStatus.FAILED, None),
    (AttemptStatus.FAILED, FailureClass.WORK),
    (AttemptStatus.FAILED, FailureClass.UPSTREAM),
    (AttemptStatus.FAILED, FailureClass.ENVIRONMENT),
    (AttemptStatus.ABANDONED, None),
    (AttemptStatus.SUCCEEDED, None),
]
outcomes = st.sampled_from(OUTCOMES)
times = st.floats(min_value=0, max_value=2e9, allow_nan=False)


def is_charged(a: Attempt) -> bool:
    if a.status is AttemptStatus.FAILED:
        return a.failure_class in (None, FailureClass.WORK)
    return a.status in (AttemptStatus.ABANDONED, AttemptStatus.SUCCEEDED)


def upstream_run(history: list[Attempt]) -> int:
    """The run of upstream attempts at the end, environment attempts skipped, counted from
    the latest forced attempt (an operator's retry starts a fresh run)."""
    run = 0
    for a in history:
        if a.forced:
            run = 0
        if a.failure_class is FailureClass.UPSTREAM and a.status is AttemptStatus.FAILED:
            run += 1
        elif not (a.failure_class is FailureClass.ENVIRONMENT and a.status is AttemptStatus.FAILED):
            run = 0
    return run


class Scheduler(RuleBasedStateMachine):
    """A ledger in miniature: it admits an attempt only when `decide` says run."""

    @initialize(
        max_attempts=st.integers(1, 5),
        max_uncharged=st.integers(1, 4),
        limit=st.none() | st.integers(1, 12),
        cap=st.none() | st.integers(-1, 15),
        jitter=st.sampled_from([0.0, 0.1, 0.5]),
    )
    def setup(
        self,
        max_attempts: int,
        max_uncharged: int,
        limit: int | None,
        cap: int | None,
        jitter: float,
    ) -> None:
        self.budget = WorkBudget(max_attempts, max_uncharged)
        self.limit = ExplicitLimit(limit) if limit is not None else None
        self.cap = DispatchCap(cap) if cap is not None else None
        self.backoff = Backoff(base_s=5, factor=2, max_s=60, jitter=jitter)
        self.history: list[Attempt] = []
        self.clock = 1000.0

    def ask(self, *, force: bool = False) -> Decision:
        return decide(
            self.history,
            budget=self.budget,
            limit=self.limit,
            backoff=self.backoff,
            now=self.clock,
            cap=self.cap,
            force=force,
        )

    def admit(self, forced: bool) -> None:
        self.history.append(
            Attempt(
                len(self.history) + 1,
                AttemptStatus.RUNNING,
                None,
                None,
                self.clock,
                None,
                forced=forced,
            )
        )

    @rule()
    def try_to_run(self) -> None:
        d = self.ask()
        assert d.next_action in ("run", "wait", "none")
        if d.next_action == "run":
            self.admit(forced=False)

    @rule()
    def operator_forces_a_retry(self) -> None:
        d = self.ask(force=True)
        if d.next_action == "run":
            self.admit(forced=True)

    @precondition(lambda self: bool(self.history) and self.history[-1].ended_at is None)
    @rule(outcome=outcomes, duration=st.floats(0, 30), reason=st.sampled_from(["503", "x"]))
    def finish(
        self, outcome: tuple[AttemptStatus, FailureClass | None], duration: float, reason: str
    ) -> None:
        assert self.ask().state == "running"
        status, cls = outcome
        self.clock += duration
        self.history[-1] = attrs.evolve(
            self.history[-1],
            status=status,
            failure_class=cls,
            reason=reason,
            ended_at=self.clock,
        )

    @rule(seconds=st.floats(0, 120))
    def time_passes(self, seconds: float) -> None:
        self.clock += seconds

    @invariant()
    def history_stays_valid(self) -> None:
        validate_history(self.history)

    # The bounds hold for every attempt the scheduler admitted on its own: before each
    # unforced attempt, the history had charged less than the budget, met fewer upstream
    # refusals in a row than the ceiling, and dispatched fewer times than the cap. Only an
    # operator's forced retry (one attempt each) may pass them, never the explicit limit.

    @invariant()
    def charged_runs_within_budget(self) -> None:
        # A negative dispatch cap is the operator's "retry forever": it lifts the charged
        # budget on purpose (execkit/_budget.py, decide), so only the other bounds hold.
        retry_forever = self.cap is not None and self.cap.unbounded
        if self.limit is None and not retry_forever:
            for k, attempt in enumerate(self.history):
                if not attempt.forced:
                    assert sum(map(is_charged, self.history[:k])) < self.budget.max_attempts

    @invariant()
    def consecutive_upstream_within_bound(self) -> None:
        for k, attempt in enumerate(self.history):
            if not attempt.forced:
                assert upstream_run(self.history[:k]) < self.budget.max_uncharged_attempts

    @invariant()
    def environment_never_followed_by_an_unforced_attempt(self) -> None:
        for prev, nxt in zip(self.history, self.history[1:], strict=False):
            if prev.failure_class is FailureClass.ENVIRONMENT:
                assert nxt.forced

    @invariant()
    def explicit_limit_and_cap_hold(self) -> None:
        if self.limit is not None:
            assert len(self.history) <= self.limit.max_attempts
        if self.cap is not None and self.cap.max_attempts > 0:
            for k, attempt in enumerate(self.history):
                assert attempt.forced or k < self.cap.max_attempts

    @invariant()
    def decision_is_consistent(self) -> None:
        d = self.ask()
        assert (d.state == "blocked") == (d.blocked_on is not None)
        assert d.remaining is not None and d.remaining >= 0
        if d.state == "backoff":
            assert d.next_attempt_at is not None and d.next_attempt_at > self.clock


TestScheduler = Scheduler.TestCase
TestScheduler.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# --- histories -------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn, max_size: int = 12) -> list[Attempt]:
    """Valid histories: any failures, optionally ending in a success or a running attempt."""
    n = draw(st.integers(0, max_size))
    out = []
    t = draw(times)
    for i in range(1, n + 1):
        status, cls = draw(st.sampled_from(OUTCOMES[:5]))
        end = t + draw(st.floats(0, 100))
        out.append(
            Attempt(
                i,
                status,
                cls,
                draw(st.sampled_from([None, "r"])),
                t,
                end,
                forced=draw(st.booleans()),
            )
        )
        t = end + draw(st.floats(0, 1000))
    tail = draw(st.sampled_from([None, AttemptStatus.SUCCEEDED, AttemptStatus.RUNNING]))
    if tail is not None:
        out.append(
            Attempt(n + 1, tail, None, None, t, None if tail is AttemptStatus.RUNNING else t)
        )
    return out


budgets = st.builds(WorkBudget, st.integers(1, 6), st.integers(1, 6))
limits = st.none() | st.builds(ExplicitLimit, st.integers(1, 20))
backoffs = st.builds(
    lambda base, mult, factor, jitter: Backoff(base, factor, base * mult, jitter),
    st.floats(0.001, 1000),
    st.floats(1, 1000),
    st.floats(1, 10),
    st.floats(0, 0.999),
)


@settings(max_examples=200)
@given(histories(), budgets, limits, backoffs, times)
def test_decide_is_a_deterministic_function_of_the_history(
    history: list[Attempt],
    budget: WorkBudget,
    limit: ExplicitLimit | None,
    backoff: Backoff,
    now: float,
) -> None:
    first = decide(history, budget, limit, backoff, now)
    # A "restart": the same history rebuilt from its stored values, asked again.
    rebuilt = [Attempt(**attrs.asdict(a, recurse=False)) for a in history]
    assert decide(rebuilt, budget, limit, backoff, now) == first
    assert decide(tuple(history), budget, limit, backoff, now) == first


@settings(max_examples=200)
@given(
    st.lists(st.sampled_from([AttemptStatus.FAILED, AttemptStatus.ABANDONED]), max_size=15),
    st.integers(1, 8),
)
def test_unclassed_histories_give_exactly_the_legacy_answer(
    statuses: list[AttemptStatus], max_attempts: int
) -> None:
    history = [
        Attempt(i, s, None, "exit 1", 10.0 * i, 10.0 * i + 1)
        for i, s in enumerate(statuses, start=1)
    ]
    d = decide(history, WorkBudget(max_attempts=max_attempts), now=1e12)
    legacy_blocked = len(history) >= max_attempts
    assert d.charged_attempts == len(history) == d.attempts_used
    assert d.uncharged_streak == 0
    assert d.remaining == max(0, max_attempts - len(history))
    if legacy_blocked:
        assert (d.state, d.blocked_on, d.next_action) == ("blocked", "work", "none")
    else:
        assert (d.state, d.blocked_on, d.next_action) == ("ready", None, "run")


@settings(max_examples=300)
@given(backoffs, st.integers(1, 20000), st.text(max_size=20))
def test_backoff_never_exceeds_max_s(backoff: Backoff, failures: int, seed: str) -> None:
    delay = backoff.delay(failures, seed)
    # Reference undelayed value, computed in log space so the test itself cannot overflow.
    log_raw = math.log(backoff.base_s) + (failures - 1) * math.log(backoff.factor)
    raw = min(backoff.max_s, math.exp(min(log_raw, math.log(backoff.max_s) + 1)))
    assert 0 < delay <= backoff.max_s
    assert delay >= raw * (1 - backoff.jitter) * (1 - 1e-9)
    assert math.isfinite(delay)


@settings(max_examples=200)
@given(histories(max_size=20), backoffs)
def test_next_attempt_is_never_later_than_max_s_after_the_last_failure(
    history: list[Attempt], backoff: Backoff
) -> None:
    d = decide(history, WorkBudget(50, 50), ExplicitLimit(10000), backoff, now=0.0)
    if d.next_attempt_at is not None:
        last = history[-1]
        assert last.ended_at is not None
        assert last.ended_at < d.next_attempt_at <= last.ended_at + backoff.max_s


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(1, 6), st.sampled_from(list(AttemptStatus))), max_size=6))
def test_validate_history_accepts_exactly_the_gapless_histories(
    rows: list[tuple[int, AttemptStatus]],
) -> None:
    attempts = [Attempt(n, s) for n, s in rows]
    statuses = [s for _, s in rows]
    expected_ok = (
        [n for n, _ in rows] == list(range(1, len(rows) + 1))
        and statuses.count(AttemptStatus.RUNNING) <= 1
        and AttemptStatus.SUCCEEDED not in statuses[:-1]
    )
    try:
        validate_history(attempts)
    except HistoryError:
        assert not expected_ok
    else:
        assert expected_ok


@settings(max_examples=200)
@given(histories(), budgets, limits, times)
def test_no_class_behaves_exactly_as_a_work_failure(
    history: list[Attempt], budget: WorkBudget, limit: ExplicitLimit | None, now: float
) -> None:
    as_work = [
        attrs.evolve(a, failure_class=FailureClass.WORK)
        if a.status is AttemptStatus.FAILED and a.failure_class is None
        else a
        for a in history
    ]
    assert decide(history, budget, limit, now=now) == decide(as_work, budget, limit, now=now)


@settings(max_examples=200)
@given(histories(), st.integers(1, 6))
def test_replans_are_the_same_projection_as_attempts(
    history: list[Attempt], max_replans: int
) -> None:
    plans = [Plan(a.number, a.status, a.failure_class, a.reason) for a in history]
    # A plan has no times and is never forced: compare with attempts that have neither.
    untimed = [attrs.evolve(a, started_at=None, ended_at=None, forced=False) for a in history]
    r = decide_replans(plans, max_replans)
    d = decide(untimed, WorkBudget(max_replans, MAX_UNCHARGED_REPLANS), now=0.0)
    assert (r.state, r.blocked_on, r.next_action) == (d.state, d.blocked_on, d.next_action)
    assert (r.replans_used, r.charged_replans, r.uncharged_streak, r.remaining) == (
        d.attempts_used,
        d.charged_attempts,
        d.uncharged_streak,
        d.remaining,
    )


# Backoffs whose wait is at or near their `max_s` (a small multiple of the base, little or
# no jitter), and where `now` stands about the end of the longest wait, as shares of it.
near_max_backoffs = st.builds(
    lambda base, mult, jitter: Backoff(base, 2.0, base * mult, jitter),
    st.floats(0.001, 1000),
    st.sampled_from([1.0, 1.5, 4.0, 100.0]),
    st.sampled_from([0.0, 0.1, 0.9]),
)
shares = st.sampled_from([-1.0, 0.0, 0.5, 0.9, 0.999999, 1.0, 1.000001, 3.0])


@settings(max_examples=500)
@given(
    st.integers(1, 12),
    st.sampled_from(OUTCOMES[:5]),
    st.none() | times,
    near_max_backoffs | backoffs,
    shares,
    st.none() | shares,
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_an_untimed_decision_differs_only_by_a_ready_tasks_time(
    used: int,
    outcome: tuple[AttemptStatus, FailureClass | None],
    started: float | None,
    backoff: Backoff,
    share: float,
    vendor_share: float | None,
    ended: bool,
    force: bool,
    ignore_backoff: bool,
) -> None:
    """`decision_values(timed=False)` (a dashboard's: it shows a time only for a task
    backing off) decides a task whose last attempt failed as `timed=True` does, field by
    field, but for a ready task's time, which is the same or None. The budget never binds
    here, so the backoff decides; `now` stands about the end of the longest wait the
    backoff allows (`share` of `max_s` after the attempt), the vendor's time about it too."""
    status, klass = outcome
    ended_at = None if started is None or not ended else started + 1.0
    reference = ended_at if ended_at is not None else started
    base = 0.0 if reference is None else reference
    now = base + share * backoff.max_s
    not_before = None if vendor_share is None else base + vendor_share * backoff.max_s
    last = (used, status, klass, "r", started, ended_at, not_before, False)

    def decided(timed: bool) -> tuple[object, ...]:
        return decision_values(
            used, used, 0, None, None, last, 1000, 1000, 0, backoff, now, None,
            force=force, ignore_backoff=ignore_backoff, timed=timed,
        )  # fmt: skip

    timed, untimed = decided(True), decided(False)
    assert untimed[:3] == timed[:3] and untimed[4:] == timed[4:]
    if untimed[3] != timed[3]:
        assert timed[0] is TaskState.READY and untimed[3] is None


class _LongerThanItsCap(Backoff):
    """A backoff of a caller's own whose wait runs past its `max_s` (the untimed shortcut
    may not assume the cap of execkit's own `Backoff` for it)."""

    def delay(
        self,
        failures: int,
        seed: str | None = None,
        *,
        rng: Callable[[], float] | None = None,
        retry_after_s: float | None = None,
    ) -> float:
        return self.max_s * 10.0


def test_an_untimed_decision_computes_the_wait_of_a_backoff_it_does_not_know() -> None:
    """The shortcut is taken only for execkit's `Backoff`, whose wait is at most its
    `max_s`: a task whose wait of another kind runs past it stays backing off."""
    backoff = _LongerThanItsCap(1.0, 2.0, 60.0, 0.0)
    now = 1_000.0 + 2 * backoff.max_s  # past the cap, before the wait this one asks for
    last = (1, AttemptStatus.FAILED, FailureClass.WORK, "r", 999.0, 1_000.0, None, False)

    def decided(timed: bool) -> tuple[object, ...]:
        return decision_values(
            1, 1, 0, None, None, last, 1000, 1000, 0, backoff, now, None,
            force=False, ignore_backoff=False, timed=timed,
        )  # fmt: skip

    assert decided(True)[0] is TaskState.BACKOFF
    assert decided(False) == decided(True)
