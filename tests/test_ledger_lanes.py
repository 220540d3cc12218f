"""Vendor lanes in the ledger (issue #28), on both backends: admission consults the lane in
its transaction and a refusal writes nothing; a run's result feeds the lane; the half-open
probe; operators park and resume (role, audit); `db check` recomputes every lane from its
history; a lane is shared by processes on one ledger and survives a restart."""

from __future__ import annotations

import contextlib
import getpass
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from ledger_backends import AnyLedger, Opener, RawSql

from execkit._errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    LaneStopped,
    LaneWaiting,
    NotFound,
)
from execkit._lanes import LaneConfig, LaneState, fold
from execkit.ledger import LIST_PAGE, OPERATE_ROLE

LANE = "claude/default"
OWNER = getpass.getuser()


def _counts(ledger: AnyLedger, task_id: str) -> tuple[Any, ...]:
    shown = ledger.get_task(task_id, now=10**9)
    return (
        len(ledger.runs(task_id)),
        shown.attempts_started,
        shown.charged_attempts,
        shown.uncharged_streak,
    )


def _park(ledger: AnyLedger, task_id: str, *, at: float, reset: float, key: str = "p") -> float:
    """Park the lane with a usage limit whose reset is stated for `reset`; when it opens:
    the probe goes a margin past the stated second (2 s, plus a jitter of up to 2 s)."""
    run = ledger.start_run(task_id, request_key=key, actor="d", lane=LANE, now=at)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="upstream",  # type: ignore[arg-type]
        reason="usage limit reached",
        not_before=reset,
        lane_cause="reset",
        now=at + 1,
    )
    lane = ledger.get_lane(LANE, now=at + 1)
    opens = lane.opens_at
    assert opens is not None and (lane.capped or reset + 2 <= opens < reset + 4)
    return opens


def test_a_parked_lane_refuses_other_tasks_without_a_trace(
    ledger: AnyLedger, raw_sql: RawSql
) -> None:
    first = ledger.create_task("first", actor="d", now=0)
    second = ledger.create_task("second", actor="d", now=0)
    opens = _park(ledger, first.id, at=10, reset=70)
    before = _counts(ledger, second.id)
    audits = len(ledger.audit_events())
    events = raw_sql("SELECT COUNT(*) FROM lane_events")
    with pytest.raises(LaneWaiting) as refused:
        ledger.start_run(second.id, request_key="s1", actor="d", lane=LANE, now=20)
    assert refused.value.lane == LANE and refused.value.opens_at == opens
    assert refused.value.exit_code == 16 and refused.value.code == "lane_waiting"
    assert "until" in refused.value.message and "usage limit" in refused.value.message
    # No run, no attempt, nothing charged, counters unchanged, nothing written at all.
    assert _counts(ledger, second.id) == before
    assert len(ledger.audit_events()) == audits
    assert raw_sql("SELECT COUNT(*) FROM lane_events") == events
    # A run without a lane behaves as today.
    assert ledger.start_run(second.id, request_key="s2", actor="d", now=21).attempt == 1


def test_the_lane_opens_at_the_reset_with_one_probe_first(ledger: AnyLedger) -> None:
    tasks = [ledger.create_task(f"t{n}", actor="d", now=0).id for n in range(3)]
    opens = _park(ledger, tasks[0], at=10, reset=70)
    # Not on the second the vendor named: a vendor lifts its limit a little after it.
    with pytest.raises(LaneWaiting):
        ledger.start_run(tasks[1], request_key="early", actor="d", lane=LANE, now=70)
    probe = ledger.start_run(tasks[1], request_key="probe", actor="d", lane=LANE, now=opens)
    with pytest.raises(LaneWaiting) as waiting:
        ledger.start_run(tasks[2], request_key="x", actor="d", lane=LANE, now=opens + 1)
    assert waiting.value.opens_at is None and "probe" in waiting.value.message
    assert ledger.get_lane(LANE, now=opens + 1).state is LaneState.HALF_OPEN
    ledger.finish_run(probe.id, "succeeded", now=opens + 2)
    assert ledger.get_lane(LANE, now=opens + 2).state is LaneState.OPEN
    again = ledger.start_run(tasks[2], request_key="x2", actor="d", lane=LANE, now=opens + 3)
    assert again.attempt == 1
    assert ledger.validate(now=80) == []


def test_a_failed_probe_after_a_stated_reset_waits_a_short_recheck(ledger: AnyLedger) -> None:
    # The vendor still refuses at the probe: its limit lifted late. The lane parks again
    # for the recheck (5 s), not the breaker's doubled cool (60 s), and the probe's own
    # task spends nothing of its streak on it: the refusal was the lane's.
    a = ledger.create_task("a", actor="d", now=0).id
    b = ledger.create_task("b", actor="d", now=0).id
    opens = _park(ledger, a, at=0, reset=10)
    probe = ledger.start_run(b, request_key="probe", actor="d", lane=LANE, now=opens)
    ledger.finish_run(probe.id, "failed", failure_class="upstream", now=opens + 1)  # type: ignore[arg-type]
    again = ledger.get_lane(LANE, now=opens + 2)
    assert again.state is LaneState.PARKED
    assert again.opens_at == opens + 1 + 5.0
    assert ledger.runs(b)[-1].lane_held and ledger.get_task(b, now=opens + 2).uncharged_streak == 0
    assert ledger.validate(now=opens + 2) == []


def _upstream(ledger: AnyLedger, task_id: str, key: str, at: float) -> None:
    run = ledger.start_run(task_id, request_key=key, actor="d", lane=LANE, now=at)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="upstream",  # type: ignore[arg-type]
        reason="overloaded",
        now=at + 0.5,
    )


@pytest.mark.parametrize("k", [2, 5])
def test_a_configured_k_trips_the_breaker_at_k_across_tasks_not_before(
    opener: Opener, k: int
) -> None:
    with opener() as ledger:
        configured = ledger.set_lane_config(actor=OWNER, breaker_k=k, breaker_window_s=60, now=0)
        assert configured == LaneConfig(breaker_k=k, breaker_window_s=60)
    # Another process (another host) opening the same ledger folds with the same K.
    with opener() as ledger:
        assert ledger.lane_config().breaker_k == k
        tasks = [ledger.create_task(f"t{n}", actor="d", now=0).id for n in range(k + 1)]
        for n, task in enumerate(tasks[: k - 1]):
            _upstream(ledger, task, f"k{n}", n)
        # K-1 failures: still open, the next task is admitted.
        assert ledger.get_lane(LANE, now=k).state is LaneState.OPEN
        _upstream(ledger, tasks[k - 1], f"k{k - 1}", k - 1)
        # The K-th, across tasks: cooling, the last task is refused.
        with pytest.raises(LaneWaiting, match=f"breaker: {k} upstream failures"):
            ledger.start_run(tasks[k], request_key="last", actor="d", lane=LANE, now=k)
        assert ledger.validate(now=k) == []


def test_db_check_agrees_after_a_config_change_each_event_with_its_own(
    opener: Opener, raw_sql: RawSql
) -> None:
    with opener() as ledger:
        tasks = [ledger.create_task(f"t{n}", actor="d", now=0).id for n in range(6)]
        # Two failures under the default K (3): open, two failures in the window.
        _upstream(ledger, tasks[0], "a", 1)
        _upstream(ledger, tasks[1], "b", 2)
        ledger.set_lane_config(actor=OWNER, breaker_k=2, now=3)
        # The next failure folds with K=2: it trips with the two before it in the window.
        _upstream(ledger, tasks[2], "c", 4)
        assert ledger.get_lane(LANE, now=5).state is LaneState.COOLING
        assert ledger.validate(now=5) == []
        # Raising K again does not reopen the lane: history keeps its configuration.
        ledger.set_lane_config(actor=OWNER, breaker_k=10, now=6)
        assert ledger.get_lane(LANE, now=6).state is LaneState.COOLING
        assert ledger.validate(now=6) == []
        # Folding the whole history with today's K=10 would say open: check finds damage.
        raw_sql("UPDATE lane_summaries SET state = 'open', until_at = NULL")
        assert any("lane claude/default" in p for p in ledger.validate(now=6))
        assert ledger.repair(now=6)
        assert ledger.get_lane(LANE, now=6).state is LaneState.COOLING
        assert ledger.validate(now=6) == []


def test_lane_config_changes_are_operators_audited_and_bad_values_change_nothing(
    ledger: AnyLedger,
) -> None:
    before = ledger.lane_config()
    assert before == LaneConfig()
    audits = len(ledger.audit_events())
    with pytest.raises(Forbidden, match=r"agent\.operate"):
        ledger.set_lane_config(actor="someone", breaker_k=4)
    for field, value, shown in (
        ("breaker_k", 0, "1..1000"),
        ("breaker_k", 1001, "1..1000"),
        ("breaker_k", 2.5, "1..1000"),
        ("breaker_window_s", 0.5, "1..86400"),
        ("cool_base_s", 3601, "1..3600"),
        ("cool_max_s", 10, ">= cool_base_s"),
        ("max_park_s", 59, "60..2592000"),
        ("max_park_s", float("nan"), "60..2592000"),
        ("breaker_k", "3", "a number"),
    ):
        with pytest.raises(InvalidInput, match=shown) as bad:
            ledger.set_lane_config(actor=OWNER, **{field: value})  # type: ignore[arg-type]
        assert bad.value.field == field
    assert ledger.lane_config() == before
    assert len(ledger.audit_events()) == audits
    changed = ledger.set_lane_config(actor=OWNER, breaker_k=4, cool_max_s=600, now=5)
    assert (changed.breaker_k, changed.cool_max_s, changed.cool_base_s) == (4, 600, 30)
    # The same values again: a no-op that writes nothing.
    assert ledger.set_lane_config(actor=OWNER, breaker_k=4, now=6) == changed
    entries = [e for e in ledger.audit_events() if e.action == "lane.config"]
    assert len(entries) == 1
    assert entries[0].detail["from"]["breaker_k"] == 3 and entries[0].detail["to"]["breaker_k"] == 4


def test_lane_environment_stops_it_until_an_operator_resumes(
    ledger: AnyLedger,
) -> None:
    hit = ledger.create_task("hit", actor="d", now=0).id
    held = ledger.create_task("held", actor="d", now=0).id
    run = ledger.start_run(hit, request_key="1", actor="d", lane=LANE, now=1)
    fix = "claude: credentials refused; run `claude /login`"
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="environment",  # type: ignore[arg-type]
        reason=fix,
        lane_cause="credentials",
        now=2,
    )
    with pytest.raises(LaneStopped) as stopped:
        ledger.start_run(held, request_key="2", actor="d", lane=LANE, now=3)
    assert stopped.value.fix == fix and stopped.value.exit_code == 17
    assert "lane resume" in stopped.value.message
    # Time does not open it.
    with pytest.raises(LaneStopped):
        ledger.start_run(held, request_key="3", actor="d", lane=LANE, now=10**8)
    # The role, then the resume: audited, the held task runs, the blocked one once.
    with pytest.raises(Forbidden):
        ledger.resume_lane(LANE, actor="someone", now=4)
    resumed = ledger.resume_lane(LANE, actor=OWNER, reason="logged in again", now=5)
    assert resumed.state is LaneState.OPEN
    assert ledger.get_task(hit, now=6).retry_pending
    audit = ledger.audit_events()[-1]
    assert (audit.action, audit.task_id, audit.detail["lane"]) == ("lane.resume", hit, LANE)
    assert audit.detail["retried_tasks"] == [hit]
    assert ledger.start_run(held, request_key="4", actor="d", lane=LANE, now=6).attempt == 1
    assert ledger.start_run(hit, request_key="5", actor="d", lane=LANE, now=6).forced
    # Resume on an open lane: a documented no-op, nothing written.
    count = len(ledger.audit_events())
    assert ledger.resume_lane(LANE, actor=OWNER, now=7).state is LaneState.OPEN
    assert len(ledger.audit_events()) == count
    assert ledger.validate(now=8) == []


def test_a_resume_retries_every_task_the_stop_blocked_not_only_the_first(
    ledger: AnyLedger,
) -> None:
    # Four runs admitted at once on one lane all meet refused credentials: the first stops
    # the lane, the other three meet the stop after it (blocked on environment each). One
    # resume gives each of the four one forced retry (only the first got it: the other
    # three stayed blocked until their cards were moved by hand). A task that moved on
    # since (it succeeded on another lane) gets none, nor does one never blocked by it.
    tasks = [ledger.create_task(f"t{n}", actor="d", now=0).id for n in range(5)]
    runs = [
        ledger.start_run(task, request_key=f"k{n}", actor="d", lane=LANE, now=1)
        for n, task in enumerate(tasks[:4])
    ]
    fix = "claude: credentials refused; run `claude /login`"
    for n, run in enumerate(runs):
        ledger.finish_run(
            run.id,
            "failed",
            failure_class="environment",  # type: ignore[arg-type]
            reason=fix,
            lane_cause="credentials",
            now=2 + n,
        )
    assert all(ledger.get_task(task, now=9).state == "blocked" for task in tasks[:4])
    # t3 moves on: retried by hand and done on another lane before the resume.
    ledger.retry_task(tasks[3], actor=OWNER, force=True, now=10)
    moved_on = ledger.start_run(
        tasks[3], request_key="other", actor="d", lane="codex/default", now=11
    )
    ledger.finish_run(moved_on.id, "succeeded", now=12)
    ledger.resume_lane(LANE, actor=OWNER, reason="logged in again", now=20)
    pending = [ledger.get_task(task, now=21).retry_pending for task in tasks]
    assert pending == [True, True, True, False, False]
    audit = ledger.audit_events()[-1]
    assert audit.action == "lane.resume"
    assert audit.detail["retried_tasks"] == tasks[:3]
    for n, task in enumerate(tasks[:3]):
        assert ledger.start_run(task, request_key=f"again{n}", actor="d", lane=LANE, now=22).forced
    assert ledger.validate(now=23) == []


def test_a_missing_binary_stops_the_lane_on_that_host_only(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="d", now=0).id
    run = ledger.start_run(task, request_key="1", actor="d", lane=LANE, now=1)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="environment",  # type: ignore[arg-type]
        reason="claude CLI not found on PATH; install it",
        lane_cause="binary_missing",
        now=2,
    )
    host_lane = f"{LANE}@{socket.gethostname()}"
    assert ledger.get_lane(host_lane, now=3).state is LaneState.STOPPED
    with pytest.raises(NotFound):
        ledger.get_lane(LANE)  # the vendor lane itself saw nothing
    other = ledger.create_task("u", actor="d", now=0).id
    with pytest.raises(LaneStopped, match="not found on PATH"):
        ledger.start_run(other, request_key="2", actor="d", lane=LANE, now=3)


def test_bad_input_is_refused_and_changes_nothing(ledger: AnyLedger, raw_sql: RawSql) -> None:
    task = ledger.create_task("t", actor="d", now=0).id
    for bad in ("claude", "claude/secret", "claude/default@host", 7):
        with pytest.raises(InvalidInput) as caught:
            ledger.start_run(task, request_key="x", actor="d", lane=bad, now=1)  # type: ignore[arg-type]
        assert caught.value.field == "lane"
    run = ledger.start_run(task, request_key="ok", actor="d", lane=LANE, now=1)
    with pytest.raises(InvalidInput, match="lane_cause"):
        ledger.finish_run(run.id, "failed", failure_class="work", lane_cause="reset", now=2)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="lane_cause"):
        ledger.finish_run(run.id, "failed", failure_class="upstream", lane_cause="reset", now=2)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="lane_cause"):
        ledger.finish_run(run.id, "failed", failure_class="upstream", lane_cause="nonsense", now=2)  # type: ignore[arg-type]
    assert ledger.run(run.id).status == "running"
    with pytest.raises(NotFound):
        ledger.get_lane("gemini/default")
    with pytest.raises(NotFound):
        ledger.resume_lane("gemini/default", actor=OWNER)
    with pytest.raises(InvalidInput, match="future"):
        ledger.park_lane(LANE, until=0.5, actor=OWNER, now=1)
    with pytest.raises(InvalidInput, match="within"):
        ledger.park_lane(LANE, until=1e12, actor=OWNER, now=1)
    with pytest.raises(InvalidInput):
        ledger.park_lane(LANE, until=float("nan"), actor=OWNER, now=1)
    with pytest.raises(Forbidden):
        ledger.park_lane(LANE, until=100, actor="someone", now=1)
    # A stated reset in the past opens the lane; one absurdly far away is capped, reported.
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="upstream",  # type: ignore[arg-type]
        not_before=10**12,
        lane_cause="reset",
        now=2,
    )
    capped = ledger.get_lane(LANE, now=3)
    assert capped.capped and capped.opens_at == 2 + ledger.lane_config().max_park_s
    assert ledger.validate(now=3) == []


def test_an_operator_parks_a_lane_and_a_stopped_one_must_be_resumed(ledger: AnyLedger) -> None:
    ledger.grant_role("op", OPERATE_ROLE, actor=OWNER)
    parked = ledger.park_lane(LANE, until=500, actor="op", reason="maintenance", now=100)
    assert (parked.state, parked.opens_at, parked.reason) == (LaneState.PARKED, 500, "maintenance")
    assert ledger.audit_events()[-1].action == "lane.park"
    task = ledger.create_task("t", actor="d", now=0).id
    with pytest.raises(LaneWaiting, match="maintenance"):
        ledger.start_run(task, request_key="1", actor="d", lane=LANE, now=200)
    assert [lane.lane for lane in ledger.list_lanes(now=200)] == [LANE]
    run = ledger.start_run(task, request_key="2", actor="d", lane=LANE, now=500)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="environment",  # type: ignore[arg-type]
        reason="no credit",
        lane_cause="billing",
        now=501,
    )
    with pytest.raises(Conflict, match="resume"):
        ledger.park_lane(LANE, until=900, actor="op", now=502)
    assert ledger.task_lane(task, now=502) is not None


def test_db_check_finds_a_lane_that_drifted_and_repair_rebuilds_it(
    ledger: AnyLedger, raw_sql: RawSql
) -> None:
    task = ledger.create_task("t", actor="d", now=0).id
    _park(ledger, task, at=0, reset=100)
    raw_sql("UPDATE lane_summaries SET state = 'open'")
    (problem,) = ledger.validate(now=1)
    assert "lane claude/default" in problem and "differs from its history" in problem
    assert ledger.repair(now=1) == ["lane claude/default: rebuilt its state from its history"]
    assert ledger.validate(now=1) == []
    assert ledger.get_lane(LANE, now=1).state is LaneState.PARKED


def test_a_parked_lane_survives_a_restart(opener: Opener) -> None:
    with opener() as ledger:
        task = ledger.create_task("t", actor="d", now=0).id
        other = ledger.create_task("u", actor="d", now=0).id
        opens = _park(ledger, task, at=0, reset=3600)
    with opener() as reopened:
        with pytest.raises(LaneWaiting):
            reopened.start_run(other, request_key="x", actor="d", lane=LANE, now=60)
        assert reopened.get_lane(LANE, now=60).opens_at == opens


_OTHER_PROCESS = r"""
import json, sys
from execkit.ledger import open_ledger
from execkit._errors import LaneWaiting
target, task_id = sys.argv[1:3]
with open_ledger(target) as ledger:
    try:
        ledger.start_run(task_id, request_key="other", actor="d2", lane="claude/default", now=30)
        print(json.dumps({"admitted": True}))
    except LaneWaiting as exc:
        print(json.dumps({"admitted": False, "opens_at": exc.opens_at}))
"""


def test_two_processes_on_one_ledger_share_a_lane(opener: Opener, ledger_target: str) -> None:
    with opener() as ledger:
        task = ledger.create_task("t", actor="d", now=0).id
        other = ledger.create_task("u", actor="d", now=0).id
        opens = _park(ledger, task, at=0, reset=120)
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, ledger_target, other],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == {"admitted": False, "opens_at": opens}
    with opener() as ledger:
        assert ledger.runs(other) == []


# -- properties: any interleaving of results on one lane ------------------------------------

_STEPS = st.lists(
    st.tuples(
        st.integers(0, 3),  # which task
        st.sampled_from(["succeeded", "work", "upstream", "reset", "credentials", "resume"]),
        st.integers(1, 90),  # seconds later
    ),
    max_size=25,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=_STEPS)
def test_any_interleaving_folds_to_the_stored_lane_and_refusals_never_charge(
    opener: Opener, raw_sql: RawSql, steps: list[tuple[int, str, int]]
) -> None:
    with opener() as ledger:
        raw_sql("DELETE FROM lane_events")
        raw_sql("DELETE FROM lane_summaries")
        tasks = [ledger.create_task(f"t{n}", actor="d", now=0).id for n in range(4)]
        at = 1000.0 * (1 + len(ledger.list_tasks(now=0)))  # past every earlier example
        for n, (which, outcome, later) in enumerate(steps):
            at += later
            task = tasks[which]
            if outcome == "resume":
                with contextlib.suppress(NotFound):
                    ledger.resume_lane(LANE, actor=OWNER, now=at)
                continue
            before = _counts(ledger, task)
            try:
                run = ledger.start_run(
                    task, request_key=f"{at}-{n}", actor="d", lane=LANE, now=at, ignore_backoff=True
                )
            except (LaneWaiting, LaneStopped):
                assert _counts(ledger, task) == before  # a lane refusal never charges
                continue
            except Exception:  # the task's own refusals (blocked, finished): not the lane's
                continue
            if outcome == "succeeded":
                ledger.finish_run(run.id, "succeeded", now=at + 0.5)
            elif outcome == "work":
                ledger.finish_run(run.id, "failed", failure_class="work", now=at + 0.5)  # type: ignore[arg-type]
            elif outcome == "upstream":
                ledger.finish_run(run.id, "failed", failure_class="upstream", now=at + 0.5)  # type: ignore[arg-type]
            elif outcome == "reset":
                ledger.finish_run(
                    run.id,
                    "failed",
                    failure_class="upstream",  # type: ignore[arg-type]
                    not_before=at + later * 2,
                    lane_cause="reset",
                    now=at + 0.5,
                )
            else:
                ledger.finish_run(
                    run.id,
                    "failed",
                    failure_class="environment",  # type: ignore[arg-type]
                    reason="log in",
                    lane_cause="credentials",
                    now=at + 0.5,
                )
        assert [p for p in ledger.validate(now=at + 1) if "lane" in p] == []
        lanes = ledger.list_lanes(now=at + 1)
        if lanes:
            history = ledger.lane_history(LANE)
            assert fold(LANE, history, ledger.lane_config()).events == len(history)


def test_a_lane_adds_two_statements_to_an_admission_and_reads_no_whole_row(
    tmp_path: Path,
) -> None:
    """Counted, not timed: on an open lane with its stored row (as every lane a dispatcher
    has used), admission adds one read of the lane's gate columns and the run's binding;
    the lane's whole row (its failures' JSON) is read only to word a refusal."""
    from execkit.ledger import SqliteLedger

    with SqliteLedger(tmp_path / "l.db") as ledger:
        seed = ledger.create_task("seed", actor="d").id
        ledger.finish_run(
            ledger.start_run(seed, request_key="s", actor="d", lane=LANE).id, "succeeded"
        )
        tasks = [ledger.create_task(f"t{n}", actor="d").id for n in range(2)]
        counted: dict[str | None, list[str]] = {}
        for task_id, lane in zip(tasks, (None, LANE), strict=True):
            statements: list[str] = []
            ledger._sqlite._conn.set_trace_callback(statements.append)
            ledger.start_run(task_id, request_key=f"k-{task_id}", actor="d", lane=lane)
            ledger._sqlite._conn.set_trace_callback(None)
            counted[lane] = statements
    assert len(counted[LANE]) == len(counted[None]) + 2
    assert not [s for s in counted[LANE] if "failures" in s]


def _held_back_then_done(ledger_target: str, opener: Opener, in_flight: Any, locktype: str) -> None:
    """A lane configuration change, in a thread, waits (seen in pg_locks: a `locktype`
    lock not granted) while `in_flight`'s transaction is open, and is made once it
    commits."""
    import threading

    import psycopg

    done: list[object] = []

    def change() -> None:
        with opener() as own:
            done.append(own.set_lane_config(actor=OWNER, breaker_k=7))

    changer = threading.Thread(target=change)
    changer.start()
    waiting = False
    with psycopg.connect(ledger_target, autocommit=True) as watcher:
        for _ in range(2000):  # a bound, not a timing: until the change waits
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = %s", (locktype,)
            ).fetchone()
            if row is not None and row[0] > 0:
                waiting = True
                break
            changer.join(timeout=0.01)
            if not changer.is_alive():
                break
    assert waiting and done == []  # held back by the transaction in flight
    in_flight.commit()
    changer.join(timeout=60)
    assert not changer.is_alive() and len(done) == 1


def test_a_config_change_on_postgres_waits_out_a_lane_event_in_flight(
    backend: str, ledger_target: str, opener: Opener
) -> None:
    """A lane event's transaction still open (its row inserted, not committed) holds a
    configuration change back: the change numbers its epoch after that event, so the
    event keeps the configuration it was folded with. Observed through PostgreSQL's own
    lock view, not a clock."""
    if backend != "postgres":
        pytest.skip("SQLite serialises every write transaction: nothing to wait out")

    import psycopg

    with opener() as ledger:
        task = ledger.create_task("t", actor="d").id
        _upstream(ledger, task, "a", 1)  # one event: seq 1
    in_flight = psycopg.connect(ledger_target)
    try:
        seq = in_flight.execute(
            "INSERT INTO lane_events (lane, kind, at, actor) "
            "VALUES ('claude/default', 'upstream', 2, 'd') RETURNING seq"
        ).fetchone()
        assert seq is not None
        _held_back_then_done(ledger_target, opener, in_flight, "relation")
    finally:
        in_flight.close()
    with psycopg.connect(ledger_target, autocommit=True) as reader:
        row = reader.execute("SELECT value FROM ledger_meta WHERE key = 'lane_config'").fetchone()
    assert row is not None
    [epoch] = json.loads(row[0])
    assert epoch["breaker_k"] == 7 and epoch["from_seq"] == seq[0] + 1


def test_a_config_change_on_postgres_waits_for_a_result_that_read_it_ahead(
    backend: str, ledger_target: str, opener: Opener
) -> None:
    """A run's result on a lane reads the configuration in its first batch, before its
    lane event exists, under the configuration's lock held shared: a change waits for
    that transaction (seen in PostgreSQL's lock view), so the event it folds is numbered
    before the change's epoch."""
    if backend != "postgres":
        pytest.skip("SQLite serialises every write transaction: nothing to wait out")

    import psycopg

    from execkit.ledger._postgres.tx import _LANE_CONFIG_LOCK

    with opener() as ledger:
        ledger.create_task("t", actor="d")
    in_flight = psycopg.connect(ledger_target)
    try:
        in_flight.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", _LANE_CONFIG_LOCK)
        _held_back_then_done(ledger_target, opener, in_flight, "advisory")
    finally:
        in_flight.close()


def test_a_result_on_a_lane_holds_the_configuration_lock_from_its_first_batch(
    backend: str, ledger_target: str, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the test above waits on is taken by the result itself: right after its first
    batch, a lane-bound result holds the configuration's lock shared; one without a lane
    takes none."""
    if backend != "postgres":
        pytest.skip("a PostgreSQL lock")
    import psycopg

    import execkit.ledger._postgres.tx as pg_tx

    held: list[int] = []
    read_ahead = pg_tx.PostgresTx._expect_result

    def spied(tx: pg_tx.PostgresTx, run_id: str) -> None:
        read_ahead(tx, run_id)
        with psycopg.connect(ledger_target, autocommit=True) as watcher:
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND mode = 'ShareLock' AND classid = %s AND objid = %s",
                pg_tx._LANE_CONFIG_LOCK,
            ).fetchone()
        held.append(0 if row is None else int(row[0]))

    monkeypatch.setattr(pg_tx.PostgresTx, "_expect_result", spied)
    for n, lane in enumerate((LANE, None)):
        with opener() as ledger:
            task = ledger.create_task(f"t{n}", actor="d")
            run = ledger.start_run(task.id, actor="d", request_key=f"k{n}", now=1000.0, lane=lane)
        with opener() as ledger:  # another store: no copy of the run to finish it on
            ledger.finish_run(run.id, "succeeded", now=1001.0)
    assert held == [1, 0]


def test_task_lanes_reads_each_tasks_lane_as_task_lane_does(ledger: AnyLedger) -> None:
    # Tasks that never ran, ran on no lane, ran on a lane that parked, on an open one, on
    # one whose host lane stopped, and on a lane then on none (its last run with a lane
    # counts): read together, each is what `task_lane` says of it alone.
    def ran(title: str, *lanes: str | None, cause: str | None = None) -> str:
        task = ledger.create_task(title, actor="d", now=0).id
        for n, lane in enumerate(lanes):
            at = n * 1000.0
            run = ledger.start_run(task, request_key=f"{title}{n}", actor="d", lane=lane, now=at)
            ledger.finish_run(
                run.id,
                "failed",
                failure_class="environment" if cause else "work",  # type: ignore[arg-type]
                reason="no binary" if cause else "wrong",
                lane_cause=cause,
                now=at + 0.5,
            )
        return task

    never = ran("never")
    plain = ran("plain", None)
    parked = ledger.create_task("parked", actor="d", now=0).id
    _park(ledger, parked, at=0, reset=10**6)
    opened = ran("opened", "codex/default")
    hosted = ran("hosted", "gemini/default", cause="binary_missing")
    earlier = ran("earlier", "codex/default", None)
    ids = [never, plain, parked, opened, hosted, earlier, "t-999999"]
    alone = {task: ledger.task_lane(task, now=5000) for task in ids[:-1]}
    together = ledger.task_lanes(ids, now=5000)
    assert together == {task: lane for task, lane in alone.items() if lane is not None}
    assert set(together) == {parked, opened, hosted, earlier}
    assert together[parked].state is LaneState.PARKED and not together[parked].admits
    assert together[opened].admits and together[earlier].lane == "codex/default"
    assert ledger.task_lanes([], now=5000) == {}
    with pytest.raises(InvalidInput, match=r"task_ids: at most 1000 .*0\.\.1000"):
        ledger.task_lanes([parked] * (LIST_PAGE + 1))
    with pytest.raises(InvalidInput, match="task_ids"):
        ledger.task_lanes([7])  # type: ignore[list-item]
