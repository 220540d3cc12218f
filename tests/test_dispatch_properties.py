"""Property tests of the dispatcher's invariants (ADR 015, 0033, 0046) over a real SQLite ledger.

One model-based test drives a board issue through a drawn sequence of outcomes, budgets and
dispatch cap, restarting the dispatcher (a new ledger connection, nothing carried over) at
a drawn pass and probing for an early dispatch inside every backoff. A small reference
model of the three bounds says how many dispatches there must be and where the issue ends.
"""

from __future__ import annotations

import os
import pwd

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execkit._budget import WorkBudget
from execkit._classify import FailureClass
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    DispatchEvent,
    InMemoryBoard,
    RunOutcome,
    Slot,
)
from execkit.ledger import open_ledger

ME = pwd.getpwuid(os.geteuid()).pw_name

T0 = 1_700_000_000.0

OUTCOMES = {
    "ok": RunOutcome("succeeded"),
    "work": RunOutcome("failed", FailureClass.WORK, "default", detail="wrong"),
    "upstream": RunOutcome("failed", FailureClass.UPSTREAM, "http 503"),
    "environment": RunOutcome(
        "failed", FailureClass.ENVIRONMENT, "spawn errno ENOENT", precondition="acme missing"
    ),
}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class ByAttempt:
    """Returns the outcome drawn for the attempt number (the last one repeats)."""

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.attempts: list[int] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        attempt = slot.attempt
        self.attempts.append(attempt)
        return OUTCOMES[self.kinds[min(attempt, len(self.kinds)) - 1]]


HORIZON = 12  # dispatches watched where nothing but success stops the issue


def expected_end(
    kinds: list[str], budget: WorkBudget, cap: int, failed_state: str | None
) -> tuple[int, str]:
    """(dispatches, what stops the issue) by the rules, without the ledger.

    With a failed state to move to, the bounds stop the issue (ADR 0046's classes, ADR 015's
    cap). Without one, ADR 015's "never strand" keeps the legacy retry: only a success
    stops it (watched for HORIZON dispatches). A negative cap is the operator's explicit
    "retry forever": it lifts the cap and the charged work budget, not the uncharged stops.
    """
    charged = streak = 0
    attempt = 0
    while True:
        attempt += 1
        kind = kinds[min(attempt, len(kinds)) - 1]
        if kind == "ok":
            return attempt, "done"
        if failed_state is None:
            if attempt >= HORIZON:
                return attempt, "legacy"
            continue
        if kind == "environment":
            return attempt, "environment"
        if kind == "upstream":
            streak += 1
        else:
            charged, streak = charged + 1, 0
        if streak >= budget.max_uncharged_attempts:
            return attempt, "upstream"
        if cap >= 0 and charged >= budget.max_attempts:
            return attempt, "work"
        if 0 < cap <= attempt:
            return attempt, "dispatch_cap"
        if attempt >= HORIZON:
            return attempt, "unbounded"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=1, max_size=8),
    max_charged=st.integers(min_value=1, max_value=5),
    max_uncharged=st.integers(min_value=1, max_value=4),
    cap=st.sampled_from([-1, 1, 2, 3, 5, 8]),
    failed_state=st.sampled_from(["blocked", None]),
    base=st.floats(min_value=0.5, max_value=60),
    spread=st.floats(min_value=1, max_value=20),
    restart_at=st.integers(min_value=0, max_value=12),
    probe=st.floats(min_value=0, max_value=0.999),
)
def test_the_dispatcher_follows_the_bounds_across_a_restart(
    tmp_path_factory: pytest.TempPathFactory,
    kinds: list[str],
    max_charged: int,
    max_uncharged: int,
    cap: int,
    failed_state: str | None,
    base: float,
    spread: float,
    restart_at: int,
    probe: float,
) -> None:
    budget = WorkBudget(max_attempts=max_charged, max_uncharged_attempts=max_uncharged)
    config = DispatchConfig(
        max_attempts=cap,
        failed_state=failed_state,
        base_backoff_s=base,
        max_retry_backoff_s=base * spread,
    )
    want_dispatches, want_stop = expected_end(kinds, budget, cap, failed_state)
    db = tmp_path_factory.mktemp("prop") / "ledger.db"
    board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
    runner, clock = ByAttempt(kinds), Clock()
    events: list[DispatchEvent] = []
    not_before = T0  # the earliest a dispatch may happen: the last retry time announced

    ledger = open_ledger(db, budget=budget)
    try:
        # The task's own bounds, as a runner with no vendor lanes sees them: with lanes, a
        # lone task's upstream failures past the breaker's K are the lane's (the property
        # below), and this model would not hold.
        dispatcher = Dispatcher(board, runner, ledger, config, clock, lanes=False)
        for n in range(want_dispatches + 10):
            if want_stop in ("legacy", "unbounded") and len(runner.attempts) >= want_dispatches:
                break  # nothing but a success would stop it: watched long enough
            if n == restart_at:
                ledger.close()
                ledger = open_ledger(db, budget=budget)
                dispatcher = Dispatcher(board, runner, ledger, config, clock, lanes=False)
            for event in dispatcher.tick():
                if event.kind == "dispatched":
                    assert event.at >= not_before, "dispatched before its backoff ended"
                    if event.next_attempt_at is not None:
                        # Backoff never exceeds the cap, and is never zero.
                        assert event.at < event.next_attempt_at
                        assert event.next_attempt_at <= event.at + config.max_retry_backoff_s
                        not_before = event.next_attempt_at
                events.append(event)
            due = dispatcher.next_due()
            if due is None:
                continue
            # Inside the backoff nothing is dispatched, whoever asks.
            clock.now += (due - clock.now) * probe
            assert [e for e in dispatcher.tick() if e.kind == "dispatched"] == []
            clock.now = max(clock.now, due)
    finally:
        ledger.close()

    dispatched = [e for e in events if e.kind == "dispatched"]
    # Attempt numbers come from the history: 1, 2, 3 ... whatever restarted in between.
    assert runner.attempts == list(range(1, want_dispatches + 1))
    assert [e.attempt for e in dispatched] == runner.attempts
    # Only work failures (and the success) spend the charged budget.
    charged = [e.charged for e in dispatched]
    assert charged == [kinds[min(a, len(kinds)) - 1] in ("work", "ok") for a in runner.attempts]
    last = dispatched[-1]
    if want_stop in ("legacy", "unbounded"):
        # Retried past every bound with backoff, and never frozen: still eligible.
        assert board.get("ISS-1").state == "todo"
        assert board.moves == []
        return
    if want_stop == "done":
        assert (last.status, last.moved_to, board.get("ISS-1").state) == (
            "succeeded",
            "done",
            "done",
        )
        return
    assert last.blocked_on == want_stop
    if failed_state is None:
        assert board.get("ISS-1").state == "todo"  # never moved, never stranded silently
        assert board.moves == []
    else:
        assert (last.moved_to, board.get("ISS-1").state) == ("blocked", "blocked")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    breaker_k=st.integers(min_value=1, max_value=5),
    max_trips=st.integers(min_value=1, max_value=4),
    ceiling=st.integers(min_value=1, max_value=6),
    restart_at=st.integers(min_value=0, max_value=12),
)
def test_a_lone_task_on_a_lane_stops_at_its_ceiling_or_its_lane_stops(
    tmp_path_factory: pytest.TempPathFactory,
    breaker_k: int,
    max_trips: int,
    ceiling: int,
    restart_at: int,
) -> None:
    # How the task's bound and its lane's combine (docs/architecture.md): every attempt
    # refused upstream with no reset stated. The failures up to the one that trips the
    # breaker (K) are the task's own, so a ceiling within K blocks it on `upstream`;
    # past K each attempt is the lane's probe, held by the lane (`lane_held`), and the
    # lane stops itself after `max_trips` closings in a row: K + max_trips attempts, then
    # nothing until a person resumes the lane. Either way the retries end, and the lane's
    # state comes from the ledger, so a restart anywhere changes neither count.
    budget = WorkBudget(max_attempts=1, max_uncharged_attempts=ceiling)
    config = DispatchConfig(
        max_attempts=-1, failed_state="blocked", base_backoff_s=1.0, max_retry_backoff_s=1.0
    )
    db = tmp_path_factory.mktemp("lane") / "ledger.db"
    board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
    runner, clock = ByAttempt(["upstream"]), Clock()
    ledger = open_ledger(db, budget=budget)
    try:
        ledger.set_lane_config(actor=ME, breaker_k=breaker_k, max_trips=max_trips)
        dispatcher = Dispatcher(board, runner, ledger, config, clock)
        for n in range(200):  # far more than K + max_trips: the end is the lane's or the task's
            if n == restart_at:
                ledger.close()
                ledger = open_ledger(db, budget=budget)
                dispatcher = Dispatcher(board, runner, ledger, config, clock)
            dispatcher.tick()
            due = dispatcher.next_due()
            if due is None:
                break
            clock.now = max(clock.now, due)
        else:
            raise AssertionError(f"still retrying after {len(runner.attempts)} attempts")
        stopped_lanes = dispatcher.waiting_on_people()
    finally:
        ledger.close()
    assert runner.attempts == list(range(1, len(runner.attempts) + 1))
    if ceiling <= breaker_k:
        assert len(runner.attempts) == ceiling
        assert board.get("ISS-1").state == "blocked"
        assert stopped_lanes == []
    else:
        assert len(runner.attempts) == breaker_k + max_trips
        assert board.get("ISS-1").state == "todo"  # held by its stopped lane, not given up
        assert [held.lane for held in stopped_lanes] == ["generic/default"]
