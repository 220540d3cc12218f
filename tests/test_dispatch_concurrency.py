"""The dispatcher runs agents side by side: caps, refills, per-issue adapters, stops.

Real threads (the default `ThreadPerSlot`) and a real SQLite ledger. Nothing is timed:
runners block on events the test sets, so "A still runs while B and C finish" is a fact
the test arranges, not a race it hopes to win.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import a_slot

from execkit._attempt import AttemptOptions
from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit.dispatch import (
    STOPPED_REASON,
    AdapterRunner,
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    InMemoryBoard,
    RunOutcome,
    Slot,
)
from execkit.ledger import SqliteLedger, open_ledger

BOUND_S = 60.0  # every wait below is bounded: a broken dispatcher fails, never hangs


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    with open_ledger(tmp_path / "ledger.db") as opened:
        yield opened


class GatedRunner:
    """Each issue's run waits until its gate opens (or its slot is cancelled); tracks how
    many run at once, overall and per adapter."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.running: dict[str, str] = {}  # issue -> adapter
        self.most_at_once = 0
        self.most_per_adapter: dict[str, int] = {}
        self.order: list[str] = []

    def gate(self, issue_id: str) -> threading.Event:
        return self.gates.setdefault(issue_id, threading.Event())

    def has_started(self, issue_id: str) -> threading.Event:
        return self.started.setdefault(issue_id, threading.Event())

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        with self.lock:
            self.running[issue.id] = slot.adapter
            self.order.append(issue.id)
            self.most_at_once = max(self.most_at_once, len(self.running))
            on_adapter = sum(1 for a in self.running.values() if a == slot.adapter)
            self.most_per_adapter[slot.adapter] = max(
                self.most_per_adapter.get(slot.adapter, 0), on_adapter
            )
        self.has_started(issue.id).set()
        try:
            gate = self.gate(issue.id)
            while not gate.is_set():
                if slot.cancel.wait(0.01):
                    from execkit import SpawnCancelled

                    raise SpawnCancelled("stopped")
            return RunOutcome("succeeded")
        finally:
            with self.lock:
                del self.running[issue.id]


def board_of(*ids: str, adapter: dict[str, str] | None = None) -> InMemoryBoard:
    adapter = adapter or {}
    return InMemoryBoard([BoardIssue(i, i, "todo", adapter=adapter.get(i)) for i in ids])


def test_at_most_max_concurrent_agents_run_at_once(ledger: SqliteLedger) -> None:
    runner = GatedRunner()
    ids = [f"I{n}" for n in range(7)]
    for issue_id in ids:
        runner.gate(issue_id).set()
    dispatcher = Dispatcher(board_of(*ids), runner, ledger, DispatchConfig(max_concurrent_agents=3))
    events = dispatcher.tick()
    assert [e.issue_id for e in events] == ids  # reported in the board's order
    assert all(e.moved_to == "done" for e in events)
    assert 1 <= runner.most_at_once <= 3


def test_a_long_agent_never_delays_another_issue(ledger: SqliteLedger) -> None:
    # A holds its slot; B, C and D go through the other slot one after the other, each
    # started as soon as the one before it ended, while A still runs.
    runner = GatedRunner()
    for issue_id in "BCD":
        runner.gate(issue_id).set()
    board = board_of("A", "B", "C", "D")
    movers: set[int] = set()  # the threads that moved a card
    move = board.move

    def moved(issue_id: str, state: str) -> bool:
        movers.add(threading.get_ident())
        return move(issue_id, state)

    board.move = moved  # type: ignore[method-assign]
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_concurrent_agents=2))
    done = threading.Event()
    result: list[object] = []

    def tick() -> None:
        result.extend(dispatcher.tick())
        done.set()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    for issue_id in "BCD":
        assert runner.has_started(issue_id).wait(BOUND_S)
    # D ran to its end while A is still running: the slot was refilled at once.
    assert runner.has_started("A").is_set() and "A" in runner.running
    runner.gate("A").set()
    assert done.wait(BOUND_S)
    assert {board.get(i).state for i in "ABCD"} == {"done"}
    # Cards move in the dispatcher's thread only, never in an agent's slot. (Whether D's
    # moves before A ends is a race between the two threads: not asserted.)
    assert movers == {ticker.ident}
    assert runner.most_at_once == 2


def test_the_per_adapter_cap_holds_beside_the_global_one(ledger: SqliteLedger) -> None:
    runner = GatedRunner()
    ids = [f"C{n}" for n in range(4)] + [f"G{n}" for n in range(2)]
    for issue_id in ids:
        runner.gate(issue_id).set()
    adapters = {i: "claude" for i in ids if i.startswith("C")}
    config = DispatchConfig(max_concurrent_agents=4, max_concurrent_per_adapter={"claude": 1})
    events = Dispatcher(board_of(*ids, adapter=adapters), runner, ledger, config).tick()
    assert len(events) == 6 and all(e.moved_to == "done" for e in events)
    assert runner.most_per_adapter["claude"] == 1
    assert runner.most_per_adapter.get("generic", 0) <= 2


@pytest.mark.parametrize("bad", [0, -1, 257, 10**9, True, 2.0, "4"])
def test_a_concurrency_outside_1_to_256_is_refused_naming_the_range(bad: object) -> None:
    with pytest.raises(InvalidInput, match="1 to 256") as refused:
        DispatchConfig(max_concurrent_agents=bad)  # type: ignore[arg-type]
    assert refused.value.field == "max_concurrent_agents"
    with pytest.raises(InvalidInput, match="1 to 256") as refused:
        DispatchConfig(max_concurrent_per_adapter={"claude": bad})
    assert refused.value.field == "max_concurrent_per_adapter.claude"


class EchoAdapter:
    """An adapter that needs no binary: it runs `echo` with its name and the model."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.binary = "echo"
        self.install_hint = "-"
        self.login_hint = None

    def build_argv(self, request: object) -> list[str]:
        model = getattr(request, "model", None) or "-"
        return ["echo", self.name, model]

    def parse(self, result: object) -> object:
        from execkit import map_result

        return map_result(self, result)  # type: ignore[arg-type]


def test_each_issue_runs_on_its_own_adapter_and_model(ledger: SqliteLedger) -> None:
    used: list[tuple[str, str | None]] = []
    known = {"alpha": EchoAdapter("alpha"), "beta": EchoAdapter("beta")}

    def find(name: str) -> object:
        from execkit._errors import UnknownAdapter

        if name not in known:
            raise UnknownAdapter(f"no adapter {name!r}")
        return known[name]

    class Recording(AdapterRunner):
        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            used.append((slot.adapter, issue.model))
            return super().run(issue, slot)

    runner = Recording(find=find, known=lambda: sorted(known))  # type: ignore[arg-type]
    board = InMemoryBoard(
        [
            BoardIssue("A", "a", "todo", adapter="beta", model="m-1"),
            BoardIssue("B", "b", "todo"),
            BoardIssue("C", "c", "todo", adapter="nope"),
        ]
    )
    config = DispatchConfig(default_adapter="alpha")
    events = {e.issue_id: e for e in Dispatcher(board, runner, ledger, config).tick()}
    assert sorted(used) == [("alpha", None), ("beta", "m-1"), ("nope", None)]
    assert events["A"].moved_to == "done" and events["B"].moved_to == "done"
    # The unknown adapter stops that issue alone, on environment, naming the field and
    # the adapters it could have named; nothing was charged.
    stopped = events["C"]
    assert stopped.failure_class is FailureClass.ENVIRONMENT and stopped.charged is False
    assert stopped.moved_to == "blocked"
    assert "issues[C].adapter" in (stopped.precondition or "")
    assert "alpha, beta" in (stopped.precondition or "")


def test_a_vendor_cli_through_the_generic_adapter_is_refused_naming_its_adapter() -> None:
    from execkit import get_adapter

    claude = get_adapter("claude")
    runner = AdapterRunner(get_adapter("generic"))
    issue = BoardIssue("V", "v", "todo", argv=[claude.binary, "-p", "hi"])
    spawned: list[object] = []

    def start(*args: object, **kwargs: object) -> object:
        spawned.append(args)
        raise AssertionError("nothing may be spawned")

    runner = AdapterRunner(get_adapter("generic"), AttemptOptions(start=start))  # type: ignore[arg-type]
    outcome = runner.run(issue, a_slot(1, "generic"))
    assert outcome.failure_class is FailureClass.ENVIRONMENT
    assert 'set "adapter": "claude"' in (outcome.precondition or "")
    assert "issues[V].adapter" in (outcome.precondition or "")
    assert spawned == []


def test_shutdown_drains_then_stops_the_running_agents(ledger: SqliteLedger) -> None:
    runner = GatedRunner()
    runner.gate("QUICK").set()
    board = board_of("SLOW", "QUICK")
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_concurrent_agents=2))
    dispatcher.pass_once()  # starts both; returns at once
    assert runner.has_started("SLOW").wait(BOUND_S)
    assert runner.has_started("QUICK").wait(BOUND_S)
    dispatcher.request_stop()
    dispatcher.shutdown(0.0)  # no drain time: SLOW is stopped now, QUICK had ended
    assert dispatcher.running == ()
    assert board.get("QUICK").state == "done"  # what ended is reported and moved
    task = next(t for t in ledger.list_tasks() if t.title == "board:SLOW")
    (run,) = ledger.runs(task.id)
    assert (run.status, run.reason) == ("abandoned", STOPPED_REASON)
    assert board.get("SLOW").state == "todo"  # the card stays where it was


class _SetIn(threading.Event):
    """An Event that records which thread each `set` ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.set_in: list[threading.Thread] = []

    def set(self) -> None:
        self.set_in.append(threading.current_thread())
        super().set()


def test_a_stop_asked_in_the_main_thread_takes_no_lock(ledger: SqliteLedger) -> None:
    # Python runs a signal handler in the main thread between any two of its steps, inside
    # `Event.set` or `clear` too; a handler that set the same Event then waited for the lock
    # its own thread held: a second Ctrl-C hung `execkit dispatch` for good.
    runner = GatedRunner()
    dispatcher = Dispatcher(board_of("SLOW"), runner, ledger)
    woken = dispatcher._slot_done = _SetIn()
    dispatcher.pass_once()
    assert runner.has_started("SLOW").wait(BOUND_S)
    dispatcher.request_stop()
    dispatcher.request_stop(hurry=True)
    assert threading.main_thread() not in woken.set_in
    asked = threading.Thread(target=dispatcher.request_stop)  # another thread: it wakes
    asked.start()
    asked.join(BOUND_S)
    assert woken.set_in[-1] is asked
    dispatcher.shutdown(0.0)
    assert dispatcher.running == ()


def test_a_wait_ends_on_a_stop_asked_by_a_signal_handler(ledger: SqliteLedger) -> None:
    # The main thread waits for a slot; the handler runs in it and wakes nothing, so the
    # wait sees the stop at its next step (`_SIGNAL_CHECK_S`). A thread sends the signal,
    # and wakes the wait itself only if it is still waiting much later: then it failed.
    runner = GatedRunner()
    dispatcher = Dispatcher(board_of("SLOW"), runner, ledger)
    dispatcher.pass_once()
    assert runner.has_started("SLOW").wait(BOUND_S)
    returned = threading.Event()
    rescued: list[bool] = []

    def signal_then_rescue() -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        if not returned.wait(BOUND_S):
            rescued.append(True)
            dispatcher._slot_done.set()

    before = signal.signal(signal.SIGUSR1, lambda _n, _f: dispatcher.request_stop())
    try:
        sender = threading.Thread(target=signal_then_rescue)
        sender.start()
        dispatcher._wait_for_a_slot(None)
        returned.set()
        sender.join(BOUND_S)
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert rescued == [] and dispatcher.stopping
    dispatcher.shutdown(0.0)


def test_a_stopped_dispatcher_admits_nothing(ledger: SqliteLedger) -> None:
    runner = GatedRunner()
    dispatcher = Dispatcher(board_of("A"), runner, ledger, executor=InlineExecutor())
    dispatcher.request_stop()
    assert dispatcher.tick() == []
    assert ledger.list_tasks() == [] or all(not ledger.runs(t.id) for t in ledger.list_tasks())
