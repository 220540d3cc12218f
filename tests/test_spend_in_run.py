"""Caps held while a run goes (issue #45): `spend_room` grows a running run's reservation as
its CLI reports spend, or says which cap stops it; `run_attempt` and the dispatcher meter the
run against it and stop the whole tree within one usage event. On SQLite, PostgreSQL and
through `execkit serve`, with real processes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_backends import AnyLedger, open_at
from test_dispatch import ROOMY, Clock
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from adapters.opencode import OpencodeAdapter
from execkit import AgentRequest, MappedResult, SpawnResult
from execkit._attempt import AttemptOptions, SpendGuard, run_attempt, spend_guard
from execkit._classify import FailureClass
from execkit._errors import Conflict, Forbidden, InvalidInput, NotFound, SpendCapReached
from execkit._exec import Line
from execkit._usage import Usage, UsdSource
from execkit.cli._dispatch import describe_event
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    DispatchEvent,
    InMemoryBoard,
)
from execkit.ledger import SpendCap, SpendRoom, SpendWindow, open_ledger

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
MIDNIGHT = 1_799_971_200.0
TOMORROW = MIDNIGHT + 86400
LANE = "opencode/default"


def spent(usd: float | None, tokens: int = 0) -> Usage:
    source = UsdSource.REPORTED if usd is not None else UsdSource.UNKNOWN
    return Usage(output_tokens=tokens, usd=usd, usd_source=source)


# -- the ledger's answer -------------------------------------------------------------------


def test_the_room_grows_by_the_floor_up_to_the_cap_then_stops(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=2.0), actor=ME, floor_usd=0.5)
    task = ledger.create_task("t", actor=ME).id
    run = ledger.start_run(task, request_key="1", actor=ME, now=NOW)
    assert ledger.spend_room(run.id, now=NOW) == SpendRoom(usd=0.5)  # its reservation
    assert ledger.spend_room(run.id, spent=spent(0.3), now=NOW) == SpendRoom(usd=0.5)
    assert ledger.spend_room(run.id, spent=spent(0.7), now=NOW) == SpendRoom(usd=1.2)
    # The windows see the grown reservation at once.
    assert ledger.spend_windows(now=NOW)[0].usd == pytest.approx(1.2)
    assert ledger.spend_room(run.id, spent=spent(1.9), now=NOW) == SpendRoom(usd=2.0)
    stop = ledger.spend_room(run.id, spent=spent(2.05), now=NOW)
    assert (stop.cap, stop.by_task, stop.reopens_at) == ("the day's budget", False, TOMORROW)
    assert stop.stop is not None and "$2.00 is spent" in stop.stop and "$2.05" in stop.stop
    assert "nothing was charged" in stop.stop and not stop.unlimited
    # What it spent is what the window holds from now on.
    assert ledger.spend_windows(now=NOW)[0].usd == pytest.approx(2.05)
    # Told once a window (issue #49), in the transaction that answered the stop.
    ledger.spend_room(run.id, spent=spent(2.2), now=NOW)
    (capped,) = [e for e in ledger.notify_events() if e.kind == "spend.capped"]
    assert (capped.payload["cap"], capped.payload["run_id"]) == ("the day's budget", run.id)
    assert "this run reached $2.05" in capped.payload["reason"]


def test_runs_sharing_a_cap_never_together_pass_it_by_more_than_their_last_events(
    ledger: AnyLedger,
) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=2.0), actor=ME, floor_usd=0.5)
    a, b = (ledger.create_task(name, actor=ME).id for name in "ab")
    run_a = ledger.start_run(a, request_key="a", actor=ME, now=NOW)
    run_b = ledger.start_run(b, request_key="b", actor=ME, now=NOW)
    # A grows as far as B's reservation leaves: $2.00 - $0.50.
    assert ledger.spend_room(run_a.id, spent=spent(1.2), now=NOW) == SpendRoom(usd=1.5)
    # B, past its reservation, finds no room beside A's: stopped.
    stop = ledger.spend_room(run_b.id, spent=spent(0.6), now=NOW)
    assert stop.stop is not None and stop.cap == "the day's budget"
    ledger.finish_run(run_b.id, "abandoned", stopped=True, usage=spent(0.6), now=NOW + 1)
    # Within its room A asks nothing; past it, B's $0.60 leaves it $1.40: stopped.
    assert ledger.spend_room(run_a.id, spent=spent(1.45), now=NOW + 2) == SpendRoom(usd=1.5)
    stop = ledger.spend_room(run_a.id, spent=spent(1.55), now=NOW + 2)
    assert stop.stop is not None
    assert ledger.spend_windows(now=NOW + 2)[0].usd == pytest.approx(0.6 + 1.55)


def test_the_tasks_own_budget_stops_its_run_charged(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(actor=ME, floor_usd=0.2)
    task = ledger.create_task("t", actor=ME).id
    ledger.set_task_budget(
        task, usd=1.0, tokens=None, expected_usd=None, expected_tokens=None, actor=ME
    )
    first = ledger.start_run(task, request_key="1", actor=ME, now=NOW)
    ledger.finish_run(
        first.id, "failed", failure_class=FailureClass.WORK, usage=spent(0.3), now=NOW + 1
    )
    run = ledger.start_run(task, request_key="2", actor=ME, now=NOW + 62, ignore_backoff=True)
    # A minute later (ESTIMATE_TTL_S: the lane's estimate is read again), it reserved the
    # p90 of its lane's recent costs ($0.30, above the floor); it may grow
    # by the floor, up to what the task's first run left of its budget ($0.70).
    assert ledger.spend_room(run.id, now=NOW + 62) == SpendRoom(usd=0.3)
    assert ledger.spend_room(run.id, spent=spent(0.45), now=NOW + 62) == SpendRoom(usd=0.65)
    assert ledger.spend_room(run.id, spent=spent(0.69), now=NOW + 62).usd == pytest.approx(0.7)
    stop = ledger.spend_room(run.id, spent=spent(0.75), now=NOW + 63)
    assert (stop.by_task, stop.cap, stop.reopens_at) == (True, "the task's budget", None)
    assert stop.stop is not None and f"execkit task set-budget {task}" in stop.stop


def test_a_task_whose_lane_costs_more_than_its_budget_runs_held_to_the_budget(
    ledger: AnyLedger,
) -> None:
    ledger.set_spend_cap(actor=ME, floor_usd=0.2)
    costly = ledger.create_task("costly", actor=ME).id
    run = ledger.start_run(costly, request_key="c", actor=ME, now=NOW)
    ledger.finish_run(run.id, "succeeded", usage=spent(1.5), now=NOW + 1)  # the lane's p90
    task = ledger.create_task("t", actor=ME).id
    ledger.set_task_budget(
        task, usd=1.0, tokens=None, expected_usd=None, expected_tokens=None, actor=ME
    )
    # Admitted (its budget has room for the floor, as get_task shows it), a minute on (the
    # lane's estimate read again), it reserves the lane's $1.50 for the windows, but may
    # spend only what its budget leaves.
    assert ledger.get_task(task, now=NOW + 62).state == "ready"
    held = ledger.start_run(task, request_key="t", actor=ME, now=NOW + 62)
    assert ledger.spend_room(held.id, now=NOW + 62) == SpendRoom(usd=1.0)
    assert ledger.spend_room(held.id, spent=spent(0.9), now=NOW + 62) == SpendRoom(usd=1.0)
    stop = ledger.spend_room(held.id, spent=spent(1.05), now=NOW + 63)
    assert stop.by_task and stop.stop is not None


def test_tokens_are_held_when_the_usd_is_unknown(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(
        SpendCap(SpendWindow.DAY, usd=1.0, tokens=1000), actor=ME, floor_usd=0.1, floor_tokens=300
    )
    run = ledger.start_run(ledger.create_task("t", actor=ME).id, request_key="1", actor=ME, now=NOW)
    assert ledger.spend_room(run.id, now=NOW) == SpendRoom(usd=0.1, tokens=300)
    # USD unknown (tokens only, no price): the USD cap cannot check it, the tokens cap does.
    assert ledger.spend_room(run.id, spent=spent(None, 400), now=NOW) == SpendRoom(0.1, 700)
    stop = ledger.spend_room(run.id, spent=spent(None, 1001), now=NOW)
    assert stop.stop is not None and "1,000 tokens is spent" in stop.stop


def test_no_cap_for_the_run_is_unlimited_and_bad_calls_change_nothing(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor=ME).id
    run = ledger.start_run(task, request_key="1", actor=ME, now=NOW, lane=LANE)
    assert ledger.spend_room(run.id, now=NOW).unlimited  # no spend configuration
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, lane="claude/x", usd=1.0), actor=ME)
    assert ledger.spend_room(run.id, spent=spent(9.0), now=NOW).unlimited  # another lane's
    with pytest.raises(InvalidInput) as bad:
        ledger.spend_room(run.id, spent=3.0, now=NOW)  # type: ignore[arg-type]
    assert bad.value.field == "usage"
    with pytest.raises(NotFound):
        ledger.spend_room("no-such-run", now=NOW)
    ledger.finish_run(run.id, "succeeded", now=NOW + 1)
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME)
    with pytest.raises(Conflict, match="only a running run"):
        ledger.spend_room(run.id, spent=spent(5.0), now=NOW + 2)


def test_the_room_comes_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    client.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.25)
    run = client.start_run(client.create_task("t", actor=ME).id, request_key="1", actor=ME)
    assert client.spend_room(run.id) == SpendRoom(usd=0.25)
    assert client.spend_room(run.id, spent=spent(0.5)) == SpendRoom(usd=0.75)
    stop = client.spend_room(run.id, spent=spent(1.5))
    assert stop.stop is not None and stop.cap == "the day's budget"
    assert stop.reopens_at is not None and not stop.by_task
    assert remote.ledger.spend_windows()[0].usd == 1.5  # what it spent, held


def test_an_operators_override_lifts_a_cap_for_its_window_only(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.6)
    a, b, c, d = (ledger.create_task(name, actor=ME).id for name in "abcd")
    ledger.start_run(a, request_key="a", actor=ME, now=NOW)
    with pytest.raises(SpendCapReached):
        ledger.start_run(b, request_key="b", actor=ME, now=NOW + 1)
    config = ledger.override_spend_cap("day", actor=ME, now=NOW + 2)
    assert dict(config.overrides) == {"*|day": TOMORROW}
    run_b = ledger.start_run(b, request_key="b2", actor=ME, now=NOW + 3)
    # Not held while it runs either, and every surface says why.
    assert ledger.spend_room(run_b.id, spent=spent(5.0), now=NOW + 3).unlimited
    (use,) = ledger.spend_windows(now=NOW + 3)
    assert (use.overridden_until, use.full) == (TOMORROW, False)
    assert ledger.override_spend_cap("day", actor=ME, now=NOW + 4) == config  # nothing new
    (audited,) = [e for e in ledger.audit_events() if e.action == "spend.override"]
    assert (audited.detail["cap"], audited.detail["until"]) == ("the day's budget", TOMORROW)
    # The next day holds to the cap again.
    ledger.start_run(c, request_key="c", actor=ME, now=TOMORROW + 1)
    with pytest.raises(SpendCapReached):
        ledger.start_run(d, request_key="d", actor=ME, now=TOMORROW + 2)
    with pytest.raises(InvalidInput) as bad:
        ledger.override_spend_cap("week", actor=ME, now=NOW)
    assert bad.value.field == "window"
    with pytest.raises(Forbidden):
        ledger.override_spend_cap("day", actor="someone-else", now=NOW)


def test_a_subscription_lanes_usd_is_recorded_but_held_to_tokens_only(ledger: AnyLedger) -> None:
    sub, paid = "claude/default", "codex/default"
    day = SpendCap(SpendWindow.DAY, usd=1.0, tokens=10_000)
    ledger.set_spend_cap(day, actor=ME, floor_usd=0.4, floor_tokens=1000)
    config = ledger.set_subscription_lane(sub, True, actor=ME, now=NOW)
    assert config.subscription_lanes == (sub,)
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(5)]
    # The subscription's runs cost $5 each (the CLI prices them) and 1,000 tokens.
    for n in range(2):
        run = ledger.start_run(tasks[n], request_key=f"s{n}", actor=ME, now=NOW, lane=sub)
        assert ledger.spend_room(run.id, now=NOW) == SpendRoom(usd=None, tokens=1000)
        ledger.finish_run(run.id, "succeeded", usage=spent(5.0, 1000), now=NOW + 1)
    assert ledger.run(run.id).usd == 5.0  # recorded
    (use,) = ledger.spend_windows(now=NOW + 2)
    assert (use.usd, use.tokens, use.full) == (0.0, 2000, False)  # held in tokens only
    # The paid lane has the day's whole USD room: two runs reserving the $0.40 floor fit
    # in $1.00, a third does not.
    ledger.start_run(tasks[2], request_key="p", actor=ME, now=NOW + 2, lane=paid)
    ledger.start_run(tasks[3], request_key="q", actor=ME, now=NOW + 2, lane=paid)
    with pytest.raises(SpendCapReached):
        ledger.start_run(tasks[4], request_key="r", actor=ME, now=NOW + 3, lane=paid)
    with pytest.raises(InvalidInput) as bad:
        ledger.set_subscription_lane("no-slash", True, actor=ME, now=NOW)
    assert bad.value.field == "lane"
    with pytest.raises(Forbidden):
        ledger.set_subscription_lane(sub, False, actor="someone-else", now=NOW)
    assert ledger.set_subscription_lane(sub, False, actor=ME, now=NOW).subscription_lanes == ()


def test_each_ledger_wide_window_leaves_out_its_own_subscription_spend(
    ledger: AnyLedger,
) -> None:
    # The subscription lanes' USD in each ledger-wide window is read with the windows, in
    # one statement: the day's and the week's shares must each go to their own cap.
    subs, paid = ("claude/default", "gemini/default"), "codex/default"
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.4)
    ledger.set_spend_cap(SpendCap(SpendWindow.WEEK, usd=2.0), actor=ME)
    for lane in subs:
        ledger.set_subscription_lane(lane, True, actor=ME, now=NOW)

    def ran(lane: str, usd: float, at: float) -> None:
        task = ledger.create_task(f"{lane} {at}", actor=ME).id
        run = ledger.start_run(task, request_key=task, actor=ME, now=at, lane=lane)
        ledger.finish_run(run.id, "succeeded", usage=spent(usd, 10), now=at + 1)

    ran(subs[0], 3.0, NOW - 86_400)  # yesterday: the week's, not the day's
    ran(subs[0], 5.0, NOW)
    ran(subs[1], 5.0, NOW)
    ran(paid, 0.5, NOW)
    # Held: $0.50 of the day ($10.50 less $10.00) and of the week ($13.50 less $13.00). A
    # paid run reserves its lane's $0.50: one more fits the day's $1.00, a second does not.
    tasks = [ledger.create_task(f"p{n}", actor=ME).id for n in range(2)]
    ledger.start_run(tasks[0], request_key="p0", actor=ME, now=NOW + 10, lane=paid)
    with pytest.raises(SpendCapReached) as refused:
        ledger.start_run(tasks[1], request_key="p1", actor=ME, now=NOW + 11, lane=paid)
    assert "day" in refused.value.cap
    day, week = ledger.spend_windows(now=NOW + 12)
    assert (day.usd, week.usd) == pytest.approx((1.0, 1.0))
    assert (day.full, week.full) == (True, False)


def test_an_override_comes_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    client.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.75)
    client.start_run(client.create_task("a", actor=ME).id, request_key="a", actor=ME)
    held = client.create_task("b", actor=ME)
    with pytest.raises(SpendCapReached):
        client.start_run(held.id, request_key="b", actor=ME)
    config = client.override_spend_cap("day", actor=ME)
    assert config == remote.ledger.spend_config() and "*|day" in dict(config.overrides)
    assert client.start_run(held.id, request_key="b2", actor=ME).attempt == 1


# -- the invariant: concurrent runs stop within one event of what the cap leaves ------------


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    cap=st.sampled_from([1.0, 2.5, 10.0]),
    floor=st.sampled_from([0.05, 0.2, 0.5]),
    events=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=60),
)
def test_prop_concurrent_runs_pass_a_cap_by_at_most_their_crossing_events(
    tmp_path_factory: pytest.TempPathFactory,
    cap: float,
    floor: float,
    events: list[tuple[int, int]],
) -> None:
    target = str(tmp_path_factory.mktemp("prop") / "ledger.db")
    with open_at(target) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=cap), actor=ME, floor_usd=floor)
        guards: list[SpendGuard] = []
        totals: list[float] = []
        crossing: list[float] = []
        for n in range(4):
            task = ledger.create_task(f"t{n}", actor=ME).id
            try:
                run = ledger.start_run(task, request_key=str(n), actor=ME, now=NOW)
            except SpendCapReached:
                break
            guard = spend_guard(ledger, run.id, lambda: NOW)
            assert guard is not None
            guards.append(guard)
            totals.append(0.0)
            crossing.append(0.0)
        for who, cents in events:
            if who >= len(guards) or guards[who].stopped is not None:
                continue
            totals[who] += cents / 100
            if guards[who].crossed(spent(totals[who])):
                crossing[who] = cents / 100
        # Each run's spend is held in the window (its grown reservation, or what it spent).
        held = ledger.spend_windows(now=NOW)[0].usd
        assert held >= sum(totals) - 1e-9
        # Together they passed the cap by no more than the events that crossed it.
        assert sum(totals) <= cap + sum(crossing) + 1e-9
        for guard in guards:
            if guard.stopped is not None:
                # Stopped only once what it spent no longer fitted beside what the others
                # held (and nobody's holding shrinks while all run).
                assert guard.stopped.cap == "the day's budget"
                assert held > cap - 1e-9


# -- a real process stopped within one usage event ----------------------------------------

# Prints an opencode `step_finish` event every `interval` seconds, each costing `usd` and
# `tokens` output tokens, forever: only a stop ends it.
STREAMER = r"""
import json, sys, time
usd, tokens, interval = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
sys.stdout.write(json.dumps({"type": "step_start", "sessionID": "ses_1"}) + "\n")
while True:
    part = {"type": "step-finish", "cost": usd, "tokens": {"input": 0, "output": tokens,
            "reasoning": 0, "cache": {"read": 0, "write": 0}}, "modelID": "m"}
    sys.stdout.write(json.dumps({"type": "step_finish", "part": part}) + "\n")
    sys.stdout.flush()
    time.sleep(interval)
"""


class StreamingOpencode:
    """opencode's reading of a stand-in CLI that streams costed steps (a real process)."""

    name = "opencode"
    binary = sys.executable
    install_hint = "-"
    login_hint = None

    def __init__(self, usd: float = 0.1, tokens: int = 100, interval: float = 0.0) -> None:
        self.args = [str(usd), str(tokens), str(interval)]
        self.reader = OpencodeAdapter()

    def build_argv(self, request: AgentRequest) -> list[str]:
        return [sys.executable, "-c", STREAMER, *self.args]

    def parse(self, result: SpawnResult) -> MappedResult:
        return self.reader.parse(result)

    def usage_of(self, line: Line) -> Usage | None:
        return self.reader.usage_of(line)


OPTIONS = AttemptOptions(actor=ME, lane=None, clock=lambda: NOW)
REQUEST = AgentRequest(prompt="go", timeout_s=120)


def test_a_run_its_tasks_budget_stops_is_charged_and_blocks_the_task(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(actor=ME, floor_usd=0.25)
        task = ledger.create_task("t", actor=ME).id
        ledger.set_task_budget(
            task, usd=1.0, tokens=None, expected_usd=None, expected_tokens=None, actor=ME
        )
        outcome = run_attempt(ledger, task, StreamingOpencode(usd=0.1), REQUEST, OPTIONS)
        run = ledger.run(outcome.run_id)
        # Stopped at the event that crossed $1.00: the eleventh. What the CLI printed
        # before its tree was gone is read and counted too: the run's cost is all of it.
        assert outcome.reason is not None and "this run reached $1.10" in outcome.reason
        assert run.usd is not None and run.usd >= 1.1 - 1e-9
        assert (outcome.status, outcome.failure_class, outcome.charged) == ("failed", "work", True)
        assert outcome.reason is not None and outcome.reason.startswith("spend limit: ")
        assert "the task's budget of $1.00 is spent" in outcome.reason
        assert (outcome.state, outcome.blocked_on) == ("blocked", "spend")
        assert "execkit task set-budget" in (outcome.decision or "")


def test_a_run_a_window_stops_is_uncharged_and_its_task_waits_for_the_window(
    tmp_path: Path,
) -> None:
    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, tokens=1000), actor=ME, floor_tokens=200)
        task = ledger.create_task("t", actor=ME).id
        outcome = run_attempt(ledger, task, StreamingOpencode(tokens=100), REQUEST, OPTIONS)
        run = ledger.run(outcome.run_id)
        assert (run.status, run.stopped, run.failure_class) == ("abandoned", True, None)
        assert "this run reached 1,100 tokens" in (outcome.reason or "")
        assert run.usage.tokens >= 1100
        assert outcome.charged is False and outcome.reason is not None
        assert outcome.reason.startswith("stopped: the day's budget of 1,000 tokens is spent")
        shown = ledger.get_task(task, now=NOW)
        assert (shown.charged_attempts, shown.state) == (0, "ready")
        with pytest.raises(SpendCapReached) as waiting:
            run_attempt(ledger, task, StreamingOpencode(tokens=100), REQUEST, OPTIONS)
        assert waiting.value.reopens_at == TOMORROW


def test_a_run_with_room_is_not_stopped(tmp_path: Path) -> None:
    finite = [
        "import json; print(json.dumps({'type': 'step_finish', 'part': {'cost': 0.2, "
        "'tokens': {'output': 10}}}))"
    ]

    class OneStep(StreamingOpencode):
        def build_argv(self, request: AgentRequest) -> list[str]:
            return [sys.executable, "-c", *finite]

    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=5.0), actor=ME, floor_usd=0.1)
        task = ledger.create_task("t", actor=ME).id
        outcome = run_attempt(ledger, task, OneStep(), REQUEST, OPTIONS)
        assert outcome.reason is None or "spend" not in outcome.reason
        assert ledger.run(outcome.run_id).usd == pytest.approx(0.2)


def _dispatch(
    ledger: AnyLedger, board: InMemoryBoard, done: Callable[[list[DispatchEvent]], bool]
) -> list[DispatchEvent]:
    """The dispatcher's passes over `board`, $0.10 a step, until `done(events)` (at most
    40 passes): the events they said."""
    runner = AdapterRunner(StreamingOpencode(usd=0.1), timeout_s=120)
    clock = Clock(NOW)
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=3), clock)
    events: list[DispatchEvent] = []
    for _ in range(40):
        events += dispatcher.tick()
        if done(events):
            break
        clock.now += 0.05
    return events


def test_the_dispatcher_stops_a_run_at_its_issues_budget(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(actor=ME, floor_usd=0.25)
        board = InMemoryBoard(
            [BoardIssue("ISS-1", "one", "todo", prompt="go", budget_usd=0.5, adapter="opencode")]
        )
        events = _dispatch(ledger, board, lambda said: board.get("ISS-1").state == "blocked")
        (run,) = ledger.runs(ledger.list_tasks()[0].id)
        assert run.usd is not None and run.usd >= 0.6 - 1e-9
        assert "this run reached $0.60" in (run.reason or "")
        assert (run.status, run.failure_class) == ("failed", "work")
        dispatched = [e for e in events if e.kind == "dispatched"]
        assert dispatched[0].charged is True and dispatched[0].blocked_on == "spend"
        assert "the task's budget of $0.50 is spent" in (dispatched[0].reason or "")
        assert board.get("ISS-1").state == "blocked"
        # The line names the one fix, which brings the card back by itself.
        line = describe_event(dispatched[0], now=NOW)
        assert "execkit task set-budget" in line and "the raise brings the card back" in line
        assert "move the card back" not in line


def test_spend_stops_are_worded_for_the_operator(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=0.3), actor=ME, floor_usd=0.1)
        board = InMemoryBoard([BoardIssue("ISS-1", "one", "todo", prompt="go", adapter="opencode")])
        events = _dispatch(ledger, board, lambda said: any(e.kind == "waiting" for e in said))
        (stopped,) = [e for e in events if e.kind == "dispatched"]
        line = describe_event(stopped, now=NOW)
        assert "attempt 1/3  stopped (uncharged): stopped: the day's budget of $0.30" in line
        waiting = [e for e in events if e.kind == "waiting"]
        assert "waiting on the day's budget until 2027-01-16T00:00" in (waiting[0].reason or "")
        assert json.loads(json.dumps(stopped.to_dict()))["charged"] is False
