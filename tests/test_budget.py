"""One test per budget rule (issue 5, ADR 0046 / 0033 / 015). Properties: test_budget_properties."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execkit._budget import (
    MAX_UNCHARGED_REPLANS,
    Attempt,
    AttemptStatus,
    Backoff,
    Decision,
    DispatchCap,
    ExplicitLimit,
    HistorySummary,
    Plan,
    WorkBudget,
    decide,
    decide_replans,
    summarize,
    validate_history,
)
from execkit._classify import FailureClass
from execkit._errors import HistoryError, InvalidInput

FAR = 1e12  # a `now` after every backoff in these histories
NOT_FOUND = "codex CLI not found on PATH; install: npm i -g @openai/codex"


def hist(*outcomes: str, forced: tuple[int, ...] = ()) -> list[Attempt]:
    """Attempts from short codes: W work, N unclassed, U upstream, E environment,
    A abandoned, S succeeded, R running. Attempt i starts at 100*i and ends 1 s later."""
    table = {
        "W": (AttemptStatus.FAILED, FailureClass.WORK, "tests failed"),
        "N": (AttemptStatus.FAILED, None, "exit 1"),
        "U": (AttemptStatus.FAILED, FailureClass.UPSTREAM, "http 503"),
        "E": (AttemptStatus.FAILED, FailureClass.ENVIRONMENT, NOT_FOUND),
        "A": (AttemptStatus.ABANDONED, None, "owner lost"),
        "S": (AttemptStatus.SUCCEEDED, None, None),
        "R": (AttemptStatus.RUNNING, None, None),
    }
    out = []
    for i, code in enumerate(outcomes, start=1):
        status, cls, reason = table[code]
        ended = None if code == "R" else 100.0 * i + 1
        out.append(Attempt(i, status, cls, reason, 100.0 * i, ended, forced=i in forced))
    return out


def at_far(attempts: list[Attempt], **kw: object) -> Decision:
    return decide(attempts, now=FAR, **kw)  # type: ignore[arg-type]


# --- value types -------------------------------------------------------------------------


def test_attempt_converts_status_and_class_strings() -> None:
    a = Attempt(1, "failed", "upstream", "http 503", 1, 2)
    assert a.status is AttemptStatus.FAILED
    assert a.failure_class is FailureClass.UPSTREAM
    assert isinstance(a.started_at, float) and a.ended_at == 2.0
    assert Attempt(1, AttemptStatus.FAILED, None).failure_class is None


@pytest.mark.parametrize(
    ("kwargs", "field", "hint"),
    [
        ({"number": 0}, "number", ">= 1"),
        ({"number": True}, "number", ">= 1"),
        ({"number": "1"}, "number", ">= 1"),
        ({"status": "crashed"}, "status", "running, succeeded, failed, abandoned"),
        ({"status": 3}, "status", "running, succeeded, failed, abandoned"),
        ({"failure_class": "transient"}, "failure_class", "work, environment, upstream"),
        ({"reason": 5}, "reason", "string"),
        ({"started_at": math.nan}, "started_at", "finite"),
        ({"ended_at": True}, "ended_at", "finite"),
        ({"ended_at": "noon"}, "ended_at", "finite"),
        ({"forced": "yes"}, "forced", "true or false"),
    ],
)
def test_attempt_rejects_bad_fields_naming_them(
    kwargs: dict[str, object], field: str, hint: str
) -> None:
    base: dict[str, object] = {"number": 1, "status": "failed"}
    with pytest.raises(InvalidInput) as info:
        Attempt(**{**base, **kwargs})  # type: ignore[arg-type]
    assert field in info.value.message and hint in info.value.message


@pytest.mark.parametrize("bad", [0, -1, 10001, True, 1.5, "5", None])
def test_explicit_limit_range_is_1_to_10000(bad: object) -> None:
    with pytest.raises(ValueError, match=r"1\.\.10000"):
        ExplicitLimit(bad)  # type: ignore[arg-type]


def test_explicit_limit_bounds_are_inclusive() -> None:
    assert ExplicitLimit(1).max_attempts == 1
    assert ExplicitLimit(10000).max_attempts == 10000


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"max_uncharged_attempts": 0}, {"max_attempts": False}]
)
def test_work_budget_bounds_are_at_least_one(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInput, match=f"{next(iter(kwargs))}.*>= 1"):
        WorkBudget(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base_s": 0}, "base_s"),
        ({"factor": 0.5}, "factor"),
        ({"base_s": 10, "max_s": 5}, "max_s"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"max_s": math.inf}, "max_s"),
        ({"factor": True}, "factor"),
    ],
)
def test_backoff_rejects_bad_parameters(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_dispatch_cap_rejects_non_integers() -> None:
    with pytest.raises(InvalidInput, match="max_attempts"):
        DispatchCap(2.5)  # type: ignore[arg-type]


# --- validate_history ---------------------------------------------------------------------


def test_validate_history_accepts_gapless_histories() -> None:
    validate_history([])
    validate_history(hist("U", "W", "E", "R"))
    validate_history(hist("N", "A", "S"))


@pytest.mark.parametrize(
    ("numbers_statuses", "needle"),
    [
        ([(2, "failed")], "expected 1"),
        ([(1, "failed"), (3, "failed")], "expected 2"),
        ([(1, "failed"), (1, "failed")], "expected 2"),
        ([(2, "failed"), (1, "failed")], "expected 1"),
        ([(1, "running"), (2, "running")], "at most one may run"),
        ([(1, "succeeded"), (2, "failed")], "nothing may follow a success"),
    ],
)
def test_validate_history_rejects_broken_histories(
    numbers_statuses: list[tuple[int, str]], needle: str
) -> None:
    attempts = [Attempt(n, s) for n, s in numbers_statuses]
    with pytest.raises(HistoryError, match=needle):
        validate_history(attempts)
    with pytest.raises(HistoryError):  # decide refuses it too
        decide(attempts, now=FAR)


def test_validate_history_rejects_foreign_items() -> None:
    with pytest.raises(HistoryError, match="expected Attempt"):
        validate_history([{"number": 1, "status": "failed"}])  # type: ignore[list-item]


# --- decide: the rules -------------------------------------------------------------------


def test_empty_history_is_ready() -> None:
    d = at_far([])
    assert (d.state, d.next_action, d.blocked_on, d.remaining) == ("ready", "run", None, 3)
    assert d.next_attempt_at is None


def test_environment_stops_at_once_and_names_the_precondition() -> None:
    d = at_far(hist("E"))
    assert (d.state, d.blocked_on, d.next_action) == ("blocked", "environment", "none")
    assert d.next_attempt_at is None
    assert d.reason == f"environment: {NOT_FOUND}"
    assert d.charged_attempts == 0 and d.remaining == 3


def test_environment_without_a_recorded_reason_still_says_environment() -> None:
    d = at_far([Attempt(1, "failed", "environment", None, 1, 2)])
    assert d.blocked_on == "environment" and d.reason is not None
    assert d.reason.startswith("environment: ")


def test_upstream_is_uncharged_and_retried_below_the_bound() -> None:
    d = at_far(hist("U", "U"))
    assert (d.state, d.next_action) == ("ready", "run")
    assert d.charged_attempts == 0 and d.uncharged_streak == 2 and d.remaining == 3


def test_upstream_blocks_at_max_uncharged_consecutive_attempts() -> None:
    d = at_far(hist("U", "U", "U"))
    assert (d.state, d.blocked_on, d.next_action) == ("blocked", "upstream", "none")
    assert d.reason == "waiting on an outside service: http 503 (3 consecutive upstream attempts)"
    assert at_far(hist("U", "U"), budget=WorkBudget(max_uncharged_attempts=2)).blocked_on == (
        "upstream"
    )


def test_a_work_attempt_resets_the_uncharged_streak() -> None:
    d = at_far(hist("U", "U", "W", "U", "U"))
    assert d.uncharged_streak == 2 and d.state == "ready"
    assert d.charged_attempts == 1


def test_environment_in_the_middle_neither_adds_to_nor_resets_the_streak() -> None:
    # Documented choice: an environment stop says nothing about the outside service.
    d = at_far(hist("U", "U", "E", "U"))
    assert d.uncharged_streak == 3 and d.blocked_on == "upstream"


def test_a_forced_retry_starts_a_fresh_uncharged_streak() -> None:
    # ADR 015 "the operator re-opens them once the host recovers": the ceiling that
    # stopped the item is not held against the operator's retry.
    d = at_far(hist("U", "U", "E", "U", forced=(4,)))
    assert (d.uncharged_streak, d.state) == (1, "ready")
    d = at_far(hist("U", "U", "U", "U", forced=(4,)))
    assert (d.uncharged_streak, d.state) == (1, "ready")
    assert at_far(hist("U", "U", "U", "U", "U", "U", forced=(4,))).blocked_on == "upstream"


def test_unclassed_failures_are_charged_and_spend_the_budget() -> None:
    assert at_far(hist("N", "N")).state == "ready"
    d = at_far(hist("N", "N", "N"))
    assert (d.state, d.blocked_on, d.next_action) == ("blocked", "work", "none")
    assert d.reason == "charged budget spent: 3 of 3 attempts"
    assert d.charged_attempts == 3 and d.remaining == 0


def test_abandoned_attempts_are_charged_whatever_their_class() -> None:
    abandoned_upstream = Attempt(2, "abandoned", "upstream", "lost", 200, 201)
    d = at_far([*hist("A"), abandoned_upstream])
    assert d.charged_attempts == 2 and d.uncharged_streak == 0


def test_success_is_done_and_never_reopened() -> None:
    d = at_far(hist("W", "S"))
    assert (d.state, d.next_action, d.blocked_on) == ("done", "none", None)
    # Even with the limit exhausted, and raising it does not reopen it (ADR 0033).
    assert at_far(hist("W", "S"), limit=ExplicitLimit(2)).state == "done"
    assert at_far(hist("W", "S"), limit=ExplicitLimit(50)).state == "done"


def test_running_attempt_means_wait() -> None:
    d = at_far(hist("U", "R"))
    assert (d.state, d.next_action, d.next_attempt_at) == ("running", "wait", None)
    # Lowering the limit under a running attempt does not stop it (ADR 0033).
    assert at_far(hist("U", "R"), limit=ExplicitLimit(1)).state == "running"


def test_explicit_limit_counts_every_admitted_attempt() -> None:
    limit = ExplicitLimit(4)
    d = at_far(hist("U", "A", "N", "U"), limit=limit)
    assert (d.state, d.blocked_on, d.next_action) == ("blocked", "attempt_limit", "none")
    assert d.reason == "attempt limit reached: 4 of 4 runs"
    assert d.remaining == 0 and d.attempts_used == 4
    assert at_far(hist("U", "A", "N"), limit=limit).remaining == 1


def test_explicit_limit_replaces_the_charged_bound() -> None:
    d = at_far(hist("W", "W", "W", "W"), limit=ExplicitLimit(6))
    assert (d.state, d.next_action, d.remaining) == ("ready", "run", 2)
    assert d.charged_attempts == 4


def test_raising_the_limit_makes_the_same_history_ready_again() -> None:
    history = hist("W", "N", "A", "W", "W")
    assert at_far(history, limit=ExplicitLimit(5)).blocked_on == "attempt_limit"
    d = at_far(history, limit=ExplicitLimit(6))
    assert (d.state, d.next_action, d.remaining) == ("ready", "run", 1)


def test_explicit_limit_keeps_the_environment_stop_and_uncharged_bound() -> None:
    limit = ExplicitLimit(100)
    assert at_far(hist("W", "E"), limit=limit).blocked_on == "environment"
    assert at_far(hist("U", "U", "U"), limit=limit).blocked_on == "upstream"


def test_forced_retry_after_environment_runs_with_the_budget_intact() -> None:
    stopped = hist("W", "E")
    assert at_far(stopped).blocked_on == "environment"
    lifted = at_far(stopped, force=True)
    assert (lifted.state, lifted.next_action, lifted.remaining) == ("ready", "run", 2)
    # The forced attempt is recorded; evaluation continues with the charged budget intact.
    d = at_far(hist("W", "E", "W", forced=(3,)))
    assert (d.state, d.charged_attempts, d.remaining) == ("ready", 2, 1)
    # A forced retry that hits the environment again stops again.
    assert at_far(hist("W", "E", "E", forced=(3,))).blocked_on == "environment"


def test_force_lifts_every_stop_but_the_explicit_limit() -> None:
    # An operator's retry runs once past the environment stop, the uncharged ceiling, the
    # spent charged budget and the dispatch cap (ADR 0046, ADR 015) - never past an
    # explicit limit (ADR 0033: raising it is the way to admit more).
    assert at_far(hist("W", "W", "W", "E"), force=True).state == "ready"
    assert at_far(hist("U", "U", "U"), force=True).state == "ready"
    assert at_far(hist("W", "W", "W"), force=True).state == "ready"
    assert at_far(hist("W", "U"), cap=DispatchCap(2), force=True).state == "ready"
    assert at_far(hist("W", "E"), limit=ExplicitLimit(2), force=True).blocked_on == (
        "attempt_limit"
    )
    # Once recorded, the forced attempt is evaluated like any other: it ran once.
    assert at_far(hist("W", "W", "W", "W", forced=(4,))).blocked_on == "work"


def test_dispatch_cap_counts_every_dispatch() -> None:
    d = at_far(hist("U", "W"), cap=DispatchCap(2))
    assert (d.state, d.blocked_on, d.next_action) == ("blocked", "dispatch_cap", "none")
    assert d.reason == "dispatch cap reached: 2 of 2 dispatches"
    assert at_far(hist("U", "W"), cap=DispatchCap(3)).state == "ready"


def test_negative_cap_lifts_the_charged_budget_but_not_the_uncharged_ceiling() -> None:
    # The example hypothesis found (tests/test_budget_properties.py, Scheduler): with a
    # budget of one charged attempt and cap -1, a charged failure does not block; the
    # operator asked for "retry forever" on work failures (ADR 015). A cap of 0 does not.
    budget = WorkBudget(1, 1)
    spent = hist("W")
    assert at_far(spent, budget=budget).blocked_on == "work"
    assert at_far(spent, budget=budget, cap=DispatchCap(0)).blocked_on == "work"
    d = at_far(spent, budget=budget, cap=DispatchCap(-1))
    assert (d.state, d.charged_attempts) == ("ready", 1)
    # Nothing uninformative retries without end: the upstream ceiling still binds.
    assert at_far(hist("W", "U"), budget=budget, cap=DispatchCap(-1)).blocked_on == "upstream"


@pytest.mark.parametrize("no_cap", [-1, 0])
def test_dispatch_cap_negative_or_zero_means_no_cap(no_cap: int) -> None:
    history = hist(*("U", "W") * 20)
    d = at_far(
        history, limit=ExplicitLimit(10000), budget=WorkBudget(3, 3), cap=DispatchCap(no_cap)
    )
    assert d.state == "ready"


@pytest.mark.parametrize(
    ("codes", "kwargs", "expected"),
    [
        (("U", "U", "E"), {"limit": ExplicitLimit(3), "cap": DispatchCap(1)}, "environment"),
        (("U", "U", "U"), {"limit": ExplicitLimit(3), "cap": DispatchCap(1)}, "attempt_limit"),
        (("W", "W", "W", "U", "U", "U"), {"cap": DispatchCap(1)}, "upstream"),
        (("W", "W", "W"), {"cap": DispatchCap(1)}, "work"),
    ],
)
def test_most_specific_bound_wins(
    codes: tuple[str, ...], kwargs: dict[str, object], expected: str
) -> None:
    assert at_far(hist(*codes), **kwargs).blocked_on == expected


def test_remaining_is_never_negative() -> None:
    # A legacy history recorded under a larger budget than today's.
    d = at_far(hist("W", "W", "W", "W", "W"), budget=WorkBudget(max_attempts=2))
    assert d.remaining == 0 and d.blocked_on == "work"


def test_backoff_waits_from_the_last_failure_end() -> None:
    backoff = Backoff(base_s=10, factor=2, max_s=300, jitter=0)
    history = hist("W", "U")  # last ended at 201.0, two consecutive failures
    d = decide(history, backoff=backoff, now=205.0)
    assert (d.state, d.next_action, d.next_attempt_at) == ("backoff", "wait", 221.0)
    assert d.blocked_on is None
    ready = decide(history, backoff=backoff, now=221.0)
    assert (ready.state, ready.next_action, ready.next_attempt_at) == ("ready", "run", 221.0)


def test_backoff_grows_with_consecutive_failures_and_is_capped() -> None:
    backoff = Backoff(base_s=10, factor=2, max_s=50, jitter=0)
    limit = ExplicitLimit(100)
    delays = []
    for n in range(1, 6):
        history = hist(*["U"] * n) if n < 3 else hist(*["U", "W"] * n)[:n]
        d = decide(history, backoff=backoff, limit=limit, now=0.0)
        assert d.next_attempt_at is not None
        delays.append(d.next_attempt_at - (100.0 * n + 1))
    assert delays == pytest.approx([10, 20, 40, 50, 50])


def test_backoff_survives_a_restart_with_jitter() -> None:
    history = hist("W", "U")
    here = decide(history, now=0.0).next_attempt_at
    assert here == decide(list(history), now=0.0).next_attempt_at
    script = (
        "from execkit._budget import Attempt, decide\n"
        "h = [Attempt(1, 'failed', 'work', 'x', 100.0, 101.0),"
        " Attempt(2, 'failed', 'upstream', 'y', 200.0, 201.0)]\n"
        "print(repr(decide(h, now=0.0).next_attempt_at))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == here


def test_jitter_stays_within_its_band() -> None:
    backoff = Backoff(base_s=100, factor=1, max_s=1000, jitter=0.1)
    delays = {backoff.delay(1, f"seed-{i}") for i in range(200)}
    assert all(90 <= x <= 110 for x in delays)
    assert len(delays) > 100  # jitter actually varies across histories


def test_backoff_falls_back_to_started_at_then_to_no_wait() -> None:
    backoff = Backoff(jitter=0)
    d = decide([Attempt(1, "abandoned", None, None, 50.0, None)], backoff=backoff, now=55.0)
    assert (d.state, d.next_attempt_at) == ("backoff", 60.0)
    legacy = decide([Attempt(1, "failed")], backoff=backoff, now=0.0)
    assert (legacy.state, legacy.next_attempt_at) == ("ready", None)


def test_now_defaults_to_the_clock() -> None:
    t = time.time()
    d = decide(
        [Attempt(1, "failed", "upstream", "503", t, t)], backoff=Backoff(base_s=3600, max_s=3600)
    )
    assert d.state == "backoff"


@pytest.mark.parametrize("bad", [math.nan, math.inf, True])
def test_decide_rejects_a_bad_now(bad: object) -> None:
    with pytest.raises(InvalidInput, match="now"):
        decide([], now=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "codes", [(), ("E",), ("U", "U", "U"), ("W",), ("W", "S"), ("W", "R"), ("N", "N", "N")]
)
def test_decision_to_dict_is_json_safe(codes: tuple[str, ...]) -> None:
    data = decide(hist(*codes), now=150.0).to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert set(data) == {
        "state",
        "blocked_on",
        "next_action",
        "next_attempt_at",
        "reason",
        "attempts_used",
        "charged_attempts",
        "uncharged_streak",
        "remaining",
    }


# --- decide_replans ------------------------------------------------------------------------


def plans(*codes: str) -> list[Plan]:
    return [Plan(a.number, a.status, a.failure_class, a.reason) for a in hist(*codes)]


def test_replans_environment_stops_the_goal_naming_the_precondition() -> None:
    d = decide_replans(plans("W", "E"), max_replans=5)
    assert (d.state, d.blocked_on, d.next_action) == ("blocked", "environment", "none")
    assert d.reason == f"environment: {NOT_FOUND}"
    assert (d.replans_used, d.charged_replans) == (2, 1)


def test_replans_upstream_is_uncharged_and_bounded_by_the_constant() -> None:
    below = decide_replans(plans(*["U"] * (MAX_UNCHARGED_REPLANS - 1)), max_replans=1)
    assert (below.state, below.charged_replans, below.remaining) == ("ready", 0, 1)
    at = decide_replans(plans(*["U"] * MAX_UNCHARGED_REPLANS), max_replans=1)
    assert (at.state, at.blocked_on) == ("blocked", "upstream")
    assert at.uncharged_streak == MAX_UNCHARGED_REPLANS
    assert at.reason is not None and "outside service: http 503" in at.reason


def test_replans_charged_bound_and_counters() -> None:
    d = decide_replans(plans("N", "U", "W"), max_replans=2)
    assert (d.state, d.blocked_on, d.replans_used, d.charged_replans, d.remaining) == (
        "blocked",
        "work",
        3,
        2,
        0,
    )
    assert d.reason == "charged replan budget spent: 2 of 2 replans"
    assert decide_replans(plans("N", "U"), max_replans=2).state == "ready"


def test_replans_running_done_and_empty() -> None:
    assert decide_replans([], 1).state == "ready"
    assert decide_replans(plans("U", "R"), 1).next_action == "wait"
    assert decide_replans(plans("U", "S"), 1).state == "done"


@pytest.mark.parametrize("bad", [0, -3, True, 2.0])
def test_replans_reject_a_bad_max(bad: object) -> None:
    with pytest.raises(InvalidInput, match="max_replans"):
        decide_replans([], bad)  # type: ignore[arg-type]


def test_replans_reject_a_broken_history() -> None:
    with pytest.raises(HistoryError, match="plan"):
        decide_replans([Plan(2, "failed")], 3)


def test_replan_decision_to_dict_is_json_safe() -> None:
    data = decide_replans(plans("U", "E"), 3).to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data


def test_the_vendors_reset_time_is_the_earliest_next_attempt() -> None:
    # ADR 0046 upstream: "retry, ... at no earlier than any reset time the vendor gave".
    reset = 100.0 + 1 + 3600.0
    refused = Attempt(1, "failed", "upstream", "http 429", 100.0, 101.0, not_before=reset)
    early = decide([refused], backoff=Backoff(jitter=0), now=101.0 + 60)
    assert (early.state, early.next_attempt_at) == ("backoff", reset)
    assert "reset time" in (early.reason or "")
    assert decide([refused], backoff=Backoff(jitter=0), now=reset).state == "ready"
    # A reset time sooner than the backoff does not shorten it.
    soon = attrs.evolve(refused, not_before=101.5)
    assert decide([soon], backoff=Backoff(jitter=0), now=102.0).next_attempt_at == 111.0
    # Forcing lifts stops, not the wait; an operator deciding when may skip the wait too.
    assert decide([refused], now=102.0, force=True).state == "backoff"
    assert decide([refused], now=102.0, ignore_backoff=True).state == "ready"


@settings(max_examples=300)
@given(st.lists(st.sampled_from("WNUEA"), max_size=12), st.sets(st.integers(1, 12)), st.booleans())
def test_prop_the_summary_folded_step_by_step_is_summarize(
    codes: list[str], forced: set[int], running_last: bool
) -> None:
    # The ledger keeps the summary by `started` then `finished` as each run is written;
    # that must be exactly `summarize` of the history it ends up with.
    history = hist(*codes, *(["R"] if running_last else []), forced=tuple(sorted(forced)))
    summary = HistorySummary()
    for attempt in history:
        summary = summary.started(attrs.evolve(attempt, status="running", failure_class=None))
        if attempt.status is not AttemptStatus.RUNNING:
            summary = summary.finished(attempt)
    assert summary == summarize(history)
