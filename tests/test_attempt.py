"""`run_attempt`: one attempt of a ledger task end to end, on SQLite and PostgreSQL.

The measure of issue #32: fifty tasks driven through the one-attempt call against fake
vendors (success, 529, missing binary, bad key, wrong answer) end with the very ledger the
dispatcher leaves for the same fifty issues; the bad inputs raise their documented types
with nothing written; an asyncio cancel kills the agent's whole tree.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from _support import daemonizing_agent, kill_marked, marked_left, wait_gone, written_pids
from ledger_backends import AnyLedger, open_at

from adapters import GenericAdapter
from execkit import (
    AgentRequest,
    AttemptOutcome,
    Cancellation,
    Conflict,
    LaneStopped,
    LaneWaiting,
    NotFound,
    SpawnCancelled,
    TaskFinished,
    get_adapter,
    open_ledger,
    run_attempt,
    run_attempt_async,
    spawn,
)
from execkit._attempt import CANCELLED_REASON, AttemptOptions
from execkit._budget import AttemptStatus, BlockedOn, TaskState
from execkit._classify import FailureClass
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    InMemoryBoard,
)
from execkit.testing import FakeVendor

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "claude"
PY = [sys.executable, "-I", "-S"]

# The five fake vendors, each the claude CLI as it answers in one situation.
KINDS = ("success", "529", "missing", "bad key", "wrong answer")


def register(fake_vendor: FakeVendor, kind: str) -> None:
    """One start of `claude` that behaves as `kind`."""
    if kind == "missing":
        fake_vendor.register("claude", missing=True, occurrences=1)
        return
    fixture, code = {
        "success": ("success.json", 0),
        "529": ("overloaded.json", 1),
        "bad key": ("auth_failure.json", 1),
        "wrong answer": ("max_turns.json", 1),
        "rate limit": ("rate_limit.json", 1),
    }[kind]
    fake_vendor.register("claude", stdout=FIXTURES / fixture, exit_code=code, occurrences=1)


class Clock:
    """A virtual POSIX clock both sides read: the same history gets the same times."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ending(ledger: AnyLedger, task_id: str, now: float) -> tuple[Any, ...]:
    """What the ledger says of one task: its runs as the budgets read them and its decision
    (the request key, the actor and the title are the caller's own words, left out)."""
    runs = tuple(
        (
            r.attempt,
            r.status,
            r.failure_class,
            r.reason,
            r.not_before,
            r.started_at,
            r.ended_at,
            r.forced,
        )
        for r in ledger.runs(task_id)
    )
    t = ledger.get_task(task_id, now=now, cap=CONFIG.cap)
    decision = (
        t.status,
        t.state,
        t.blocked_on,
        t.reason,
        t.attempts_started,
        t.charged_attempts,
        t.uncharged_streak,
        t.next_attempt_at,
    )
    return runs, decision


CONFIG = DispatchConfig(default_adapter="claude", failed_state="blocked")


def test_fifty_tasks_end_as_the_dispatcher_leaves_them(
    new_target: Callable[[], str], fake_vendor: FakeVendor
) -> None:
    kinds = [KINDS[n % len(KINDS)] for n in range(50)]
    clock = Clock()
    claude = get_adapter("claude")
    request = AgentRequest(prompt="fix the failing test")

    # The one-attempt call, task by task, as a runner without a board would.
    mine = open_at(new_target())
    mine.backoff = CONFIG.backoff
    tasks = [mine.create_task(f"task {n}", actor="runner").id for n in range(50)]
    first: list[AttemptOutcome] = []
    for task_id, kind in zip(tasks, kinds, strict=True):
        register(fake_vendor, kind)
        first.append(
            run_attempt(
                mine,
                task_id,
                claude,
                request,
                AttemptOptions(cap=CONFIG.cap, clock=clock, start=fake_vendor.start, lane=None),
            )
        )

    # The dispatcher over a board of the same fifty issues, against the same fakes.
    clock_b = Clock()
    theirs = open_at(new_target())
    board = InMemoryBoard(
        [BoardIssue(f"ISS-{n}", f"task {n}", "todo", prompt=request.prompt) for n in range(50)]
    )
    runner = AdapterRunner(
        claude, AttemptOptions(start=fake_vendor.start, sleep=fake_vendor.sleep, clock=clock_b)
    )
    # Lanes off: they hold a whole lane's tasks after one vendor refusal, which is a layer
    # across tasks; this compares what one attempt of each task leaves in the ledger.
    dispatcher = Dispatcher(
        board, runner, theirs, CONFIG, clock_b, executor=InlineExecutor(), lanes=False
    )
    for kind in kinds:
        register(fake_vendor, kind)
    dispatcher.tick()
    by_title = {t.title: t.id for t in theirs.list_tasks()}  # "board:ISS-n"

    # Each class became what the ledger decided: done, retry at T, blocked with the fix.
    for outcome, kind in zip(first, kinds, strict=True):
        expected = {
            "success": (AttemptStatus.SUCCEEDED, None, TaskState.DONE),
            "529": (AttemptStatus.FAILED, FailureClass.UPSTREAM, TaskState.BACKOFF),
            "missing": (AttemptStatus.FAILED, FailureClass.ENVIRONMENT, TaskState.BLOCKED),
            "bad key": (AttemptStatus.FAILED, FailureClass.ENVIRONMENT, TaskState.BLOCKED),
            "wrong answer": (AttemptStatus.FAILED, FailureClass.WORK, TaskState.BACKOFF),
        }[kind]
        assert (outcome.status, outcome.failure_class, outcome.state) == expected, kind
        assert outcome.charged is (kind in ("success", "wrong answer"))
        if outcome.state is TaskState.BLOCKED:
            assert outcome.blocked_on is BlockedOn.ENVIRONMENT
            assert outcome.fix and outcome.fix == outcome.precondition == outcome.reason
        if outcome.state is TaskState.BACKOFF:
            assert outcome.retry_at is not None and outcome.retry_at > clock.now
    assert fake_vendor.call_count("claude") == 100  # one start per attempt, each side

    # Past every backoff: a second attempt of each task still open, on both sides.
    clock.now = clock_b.now = clock.now + 3600
    again = [
        (task_id, kind)
        for task_id, kind in zip(tasks, kinds, strict=True)
        if mine.get_task(task_id, now=clock.now, cap=CONFIG.cap).state is TaskState.READY
    ]
    assert [kind for _, kind in again] == [k for k in kinds if k in ("529", "wrong answer")]
    second = {"529": "success", "wrong answer": "wrong answer"}
    for task_id, kind in again:
        register(fake_vendor, second[kind])
        run_attempt(
            mine,
            task_id,
            claude,
            request,
            AttemptOptions(cap=CONFIG.cap, clock=clock, start=fake_vendor.start, lane=None),
        )
    for _, kind in again:
        register(fake_vendor, second[kind])
    dispatcher.tick()
    assert fake_vendor.call_count("claude") == 100 + 2 * len(again)

    for n, task_id in enumerate(tasks):
        assert ending(mine, task_id, clock.now) == ending(
            theirs, by_title[f"board:ISS-{n}"], clock.now
        ), kinds[n]


def lane_ending(ledger: AnyLedger) -> list[tuple[Any, ...]]:
    """Every lane's state and history, without the names (each ledger keys its own
    fingerprints) and the actors (the caller's own words)."""
    return [
        (
            view.state,
            view.reason,
            view.opens_at,
            [(e.kind, e.at, e.until, e.reason) for e in ledger.lane_history(view.lane)],
        )
        for view in ledger.list_lanes(now=0.0)
    ]


def test_with_lanes_one_attempt_a_task_ends_as_the_dispatcher_leaves_it(
    new_target: Callable[[], str], fake_vendor: FakeVendor
) -> None:
    """Lanes on, on both sides: the same vendor answers stop the same lane, the tasks behind
    it are refused before anything is written (run_attempt raises the lane's error, the
    dispatcher holds the issue), and both ledgers end alike, lanes included."""
    kinds = ["529", "success", "missing", "success", "bad key", "wrong answer"] * 3
    clock = Clock()
    claude = get_adapter("claude")
    request = AgentRequest(prompt="fix the failing test")

    mine = open_at(new_target())
    mine.backoff = CONFIG.backoff
    tasks = [mine.create_task(f"task {n}", actor="runner").id for n in range(len(kinds))]
    refused: list[str] = []
    for kind in kinds[:3]:  # what the vendor answers before the lane stops
        register(fake_vendor, kind)
    for task_id in tasks:
        try:
            run_attempt(
                mine,
                task_id,
                claude,
                request,
                AttemptOptions(cap=CONFIG.cap, clock=clock, start=fake_vendor.start),
            )
        except (LaneWaiting, LaneStopped) as refusal:
            refused.append(type(refusal).__name__)
    # The missing CLI stops the lane on this host: no task after it reaches the vendor.
    assert fake_vendor.call_count("claude") == 3
    assert refused == ["LaneStopped"] * (len(kinds) - 3)

    clock_b = Clock()
    theirs = open_at(new_target())
    board = InMemoryBoard(
        [
            BoardIssue(f"ISS-{n}", f"task {n}", "todo", prompt=request.prompt)
            for n in range(len(kinds))
        ]
    )
    runner = AdapterRunner(
        claude, AttemptOptions(start=fake_vendor.start, sleep=fake_vendor.sleep, clock=clock_b)
    )
    dispatcher = Dispatcher(board, runner, theirs, CONFIG, clock_b, executor=InlineExecutor())
    for kind in kinds[:3]:
        register(fake_vendor, kind)
    dispatcher.tick()
    assert fake_vendor.call_count("claude") == 3 + 3
    by_title = {t.title: t.id for t in theirs.list_tasks()}

    for n, task_id in enumerate(tasks):
        assert ending(mine, task_id, clock.now) == ending(
            theirs, by_title[f"board:ISS-{n}"], clock.now
        ), kinds[n]
    assert lane_ending(mine) == lane_ending(theirs)
    assert any(state == "stopped" for state, *_ in lane_ending(mine))


@pytest.fixture
def ledger_at(ledger_target: str) -> AnyLedger:
    return open_at(ledger_target)


def test_an_unknown_task_is_not_found_and_nothing_is_written(
    ledger_at: AnyLedger, fake_vendor: FakeVendor
) -> None:
    claude, request = get_adapter("claude"), AgentRequest(prompt="p")
    with pytest.raises(NotFound):
        run_attempt(
            ledger_at, "no-such-task", claude, request, AttemptOptions(start=fake_vendor.start)
        )
    with pytest.raises(NotFound):
        run_attempt(
            ledger_at,
            "no-such-task",
            claude,
            request,
            AttemptOptions(start=fake_vendor.start),
            request_key="k",
        )
    assert ledger_at.list_tasks() == []
    assert fake_vendor.call_count("claude") == 0


def test_a_finished_task_is_refused_and_nothing_is_written(
    ledger_at: AnyLedger, fake_vendor: FakeVendor
) -> None:
    claude, request = get_adapter("claude"), AgentRequest(prompt="p")
    task = ledger_at.create_task("t", actor="runner")
    register(fake_vendor, "success")
    done = run_attempt(ledger_at, task.id, claude, request, AttemptOptions(start=fake_vendor.start))
    assert (done.succeeded, done.state, done.retry_at, done.fix) == (True, "done", None, None)
    register(fake_vendor, "success")
    with pytest.raises(TaskFinished):
        run_attempt(ledger_at, task.id, claude, request, AttemptOptions(start=fake_vendor.start))
    assert [r.attempt for r in ledger_at.runs(task.id)] == [1]
    assert fake_vendor.call_count("claude") == 1


def test_a_request_key_reused_for_another_task_is_a_conflict(
    ledger_at: AnyLedger, fake_vendor: FakeVendor
) -> None:
    claude, request = get_adapter("claude"), AgentRequest(prompt="p")
    first = ledger_at.create_task("first", actor="runner")
    other = ledger_at.create_task("other", actor="runner")
    register(fake_vendor, "wrong answer")
    run_attempt(
        ledger_at,
        first.id,
        claude,
        request,
        AttemptOptions(start=fake_vendor.start),
        request_key="k",
    )
    with pytest.raises(Conflict, match="a different request needs its own key"):
        run_attempt(
            ledger_at,
            other.id,
            claude,
            request,
            AttemptOptions(start=fake_vendor.start),
            request_key="k",
        )
    # The same key again for the same task replays its finished run: not this call's.
    with pytest.raises(Conflict, match="not this call's to run"):
        run_attempt(
            ledger_at,
            first.id,
            claude,
            request,
            AttemptOptions(start=fake_vendor.start),
            request_key="k",
        )
    assert ledger_at.runs(other.id) == []
    assert len(ledger_at.runs(first.id)) == 1
    assert fake_vendor.call_count("claude") == 1


def test_a_vendor_reset_is_the_next_attempt_time(
    ledger_at: AnyLedger, fake_vendor: FakeVendor
) -> None:
    clock = Clock()
    task = ledger_at.create_task("t", actor="runner")
    register(fake_vendor, "rate limit")
    outcome = run_attempt(
        ledger_at,
        task.id,
        get_adapter("claude"),
        AgentRequest(prompt="p"),
        AttemptOptions(clock=clock, start=fake_vendor.start),
    )
    assert (outcome.failure_class, outcome.charged) == (FailureClass.UPSTREAM, False)
    assert outcome.not_before == clock.now + 37.0
    assert outcome.retry_at is not None and outcome.retry_at >= clock.now + 37.0


def test_a_cancel_abandons_the_run_with_the_stop_reason(
    ledger_at: AnyLedger, fake_vendor: FakeVendor
) -> None:
    task = ledger_at.create_task("t", actor="runner")
    with Cancellation() as cancel:
        cancel.cancel()
        with pytest.raises(SpawnCancelled):
            run_attempt(
                ledger_at,
                task.id,
                get_adapter("claude"),
                AgentRequest(prompt="p"),
                AttemptOptions(stop_reason="dispatcher stopped", start=fake_vendor.start),
                cancel=cancel,
            )
    (run,) = ledger_at.runs(task.id)
    assert (run.status, run.reason, run.stopped) == ("abandoned", "dispatcher stopped", True)
    assert fake_vendor.call_count("claude") == 0
    # Stopped by its own caller: uncharged, and the task is ready again at once.
    after = ledger_at.get_task(task.id)
    assert (after.charged_attempts, after.attempts_started, after.state) == (0, 1, "ready")


def test_a_cancelled_asyncio_task_kills_the_tree_and_abandons_the_run(
    ledger_at: AnyLedger, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    # The agent starts a grandchild that ignores SIGTERM, writes both pids, then sleeps.
    script = (
        "import os, signal, subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{kid.pid}}')\n"
        "time.sleep(600)\n"
    )
    task = ledger_at.create_task("t", actor="runner")
    request = AgentRequest(prompt="", extra_args=[*PY, "-c", script], timeout_s=300)

    async def main() -> None:
        attempt = asyncio.ensure_future(
            run_attempt_async(ledger_at, task.id, GenericAdapter(), request)
        )
        for _ in range(6000):  # bounded: the child is up within seconds
            if pids.exists() and pids.read_text():
                break
            await asyncio.sleep(0.01)
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt

    asyncio.run(main())
    child, grandchild = map(int, pids.read_text().split())
    assert wait_gone(child) and wait_gone(grandchild)
    (run,) = ledger_at.runs(task.id)
    assert (run.status, run.reason, run.stopped) == ("abandoned", CANCELLED_REASON, True)
    assert ledger_at.get_task(task.id).charged_attempts == 0


def test_a_hook_that_raises_is_a_charged_runner_error_then_propagates(
    ledger_at: AnyLedger, fake_vendor: FakeVendor
) -> None:
    task = ledger_at.create_task("t", actor="runner")
    register(fake_vendor, "success")

    def validate(reply: str) -> str | None:
        raise RuntimeError("the schema file is gone")

    with pytest.raises(RuntimeError, match="schema file"):
        run_attempt(
            ledger_at,
            task.id,
            get_adapter("claude"),
            AgentRequest(prompt="p"),
            AttemptOptions(validate=validate, start=fake_vendor.start),
        )
    (run,) = ledger_at.runs(task.id)
    assert (run.status, run.failure_class) == ("failed", FailureClass.WORK)
    assert run.reason == "runner error: RuntimeError: the schema file is gone"
    assert ledger_at.get_task(task.id).charged_attempts == 1


def test_the_lease_is_renewed_while_the_agent_runs(
    ledger_at: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = ledger_at.create_task("t", actor="runner")
    renewals: list[str] = []
    renew = ledger_at.heartbeat

    def counting(run_id: str, **kwargs: Any) -> Any:
        renewals.append(run_id)
        return renew(run_id, **kwargs)

    monkeypatch.setattr(ledger_at, "heartbeat", counting)
    # An agent that outlives several renewal periods (lease 0.6 s: a beat every 0.2 s).
    request = AgentRequest(prompt="", extra_args=[*PY, "-c", "import time; time.sleep(1.5)"])
    outcome = run_attempt(
        ledger_at, task.id, GenericAdapter(), request, AttemptOptions(lease_s=0.6)
    )
    assert outcome.succeeded
    assert len(renewals) >= 2 and set(renewals) == {outcome.run_id}


def test_lane_none_runs_each_task_on_its_own(ledger_at: AnyLedger, fake_vendor: FakeVendor) -> None:
    """Without a lane (`lane=None`) nothing is shared across tasks: the second task meets
    the missing CLI itself, and no lane is recorded."""
    claude = get_adapter("claude")
    request = AgentRequest(prompt="p")
    ends = []
    for n in range(2):
        task_id = ledger_at.create_task(f"t{n}", actor="runner").id
        register(fake_vendor, "missing")
        outcome = run_attempt(
            ledger_at, task_id, claude, request, AttemptOptions(lane=None, start=fake_vendor.start)
        )
        ends.append(outcome.state)
    assert ends == [TaskState.BLOCKED, TaskState.BLOCKED]
    assert fake_vendor.call_count("claude") == 2
    assert ledger_at.list_lanes() == []


def test_attempts_run_in_threads_each_end_the_daemon_their_agent_left(tmp_path: Path) -> None:
    # Issue 44, through the one-attempt call: four attempts at once from four threads, each
    # agent leaving a setsid daemon, and another spawn running throughout that started after
    # the daemons (so no attempt's spawn is ever alone). None of the daemons is left.
    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        tasks = [ledger.create_task(f"t{n}", actor="runner").id for n in range(4)]
    marker = f"execkit-attempt-orphan-{os.getpid()}-{os.urandom(4).hex()}"
    go, stop, keeper_up = tmp_path / "go", tmp_path / "stop", tmp_path / "keeper-up"
    pidfiles = [tmp_path / f"daemon-{n}" for n in range(4)]

    def wait_file(path: Path) -> str:
        return f'for _ in $(seq 3000); do [ -e "{path}" ] && exit 0; sleep 0.02; done'

    def attempt(n: int) -> AttemptOutcome:
        agent = daemonizing_agent(f"{marker}-{n}", pidfiles[n], wait_file(go))
        request = AgentRequest(prompt="", extra_args=["bash", "-c", agent])
        with open_ledger(db) as mine:
            return run_attempt(mine, tasks[n], GenericAdapter(), request, AttemptOptions(lane=None))

    def until(predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not predicate():
            assert time.monotonic() < deadline
            time.sleep(0.02)

    with ThreadPoolExecutor(max_workers=5) as pool:
        try:
            attempts = [pool.submit(attempt, n) for n in range(4)]
            until(lambda: len(written_pids(pidfiles)) == 4)
            keeper = pool.submit(
                spawn, ["bash", "-c", f': > "{keeper_up}"; {wait_file(stop)}'], timeout=120
            )
            until(keeper_up.exists)
            go.touch()
            outcomes = [future.result(timeout=120) for future in attempts]
            left = marked_left(marker)
            stop.touch()
            assert keeper.result(timeout=120).ok
        finally:
            go.touch()
            stop.touch()
            kill_marked(marker)
    assert all(outcome.succeeded for outcome in outcomes), outcomes
    assert left == [], f"{len(left)} of 4 daemons outlived their attempts"
