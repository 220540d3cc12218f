"""The announced fallback (issue #46): an issue that names adapters in order runs on the
next open one while the first's vendor lane is closed, and says so on the run, the
dispatch line, the board card, `task show` and `status`; never after a `work` failure,
never silently. Real processes: stand-in `claude` and `codex` that replay the recorded
CLIs (claude's refused credentials, codex's success), found on PATH as the real ones are."""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from pathlib import Path

import attrs
import pytest
from _support import REPO, run_execkit, write_board
from ledger_backends import AnyLedger

from adapters import ClaudeAdapter
from execkit import InvalidInput
from execkit._classify import FailureClass
from execkit.cli._dispatch import _describe
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    BoardReport,
    DispatchConfig,
    Dispatcher,
    DispatchEvent,
    EventKind,
    InlineExecutor,
    InMemoryBoard,
)
from execkit.ledger import open_ledger

RECORDED = REPO / "fixtures" / "recorded"

# Each call logged to calls.jsonl; prints the recording named by FAKE_<CLI> (a path under
# fixtures/recorded) and exits with its code.
_FAKE = f"""#!{sys.executable}
import json, os, pathlib, sys
name = pathlib.Path(sys.argv[0]).name
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({{"cli": name, "argv": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
rec = pathlib.Path({str(RECORDED)!r}) / os.environ["FAKE_" + name.upper()]
sys.stdout.write((rec / "stdout").read_text())
sys.stderr.write((rec / "stderr").read_text())
sys.exit(json.loads((rec / "meta.json").read_text())["exit_code"] or 0)
"""


class ReportedBoard(InMemoryBoard):
    """An in-memory board that shows work: what the dispatcher told each card."""

    def __init__(self, issues: list[BoardIssue]) -> None:
        super().__init__(issues)
        self.reports: list[tuple[str, BoardReport]] = []

    def report(self, issue_id: str, report: BoardReport) -> None:
        self.reports.append((issue_id, report))

    def catch_up(self) -> None:
        pass


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("claude", "codex"):
        (bin_dir / name).write_text(_FAKE)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setenv("FAKE_CLAUDE", "claude/auth_401")
    monkeypatch.setenv("FAKE_CODEX", "codex/success")
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CODEX_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return calls


def _settle(dispatcher: Dispatcher, board: InMemoryBoard) -> list[DispatchEvent]:
    events: list[DispatchEvent] = []
    for _ in range(50):  # bounded: each issue runs once or twice
        if not board.list_candidates():
            return events
        events.extend(dispatcher.tick())
    raise AssertionError("the board did not settle")


def _dispatcher(board: InMemoryBoard, ledger: AnyLedger) -> Dispatcher:
    config = DispatchConfig.from_mapping({"base_backoff_s": 0.01, "max_retry_backoff_s": 0.02})
    return Dispatcher(board, AdapterRunner(), ledger, config, executor=InlineExecutor())


def test_an_issue_whose_claude_lane_is_stopped_is_done_by_codex_and_says_so(
    ledger: AnyLedger, fakes: Path
) -> None:
    board = ReportedBoard(
        [
            # Stops claude's lane: the vendor refuses its credentials (environment).
            BoardIssue("A-1", "a", "todo", prompt="first", adapter="claude"),
            BoardIssue("B-1", "b", "todo", prompt="second", adapters=("claude", "codex")),
        ]
    )
    events = _settle(_dispatcher(board, ledger), board)
    done = {e.issue_id: e for e in events if e.kind is EventKind.DISPATCHED}
    assert done["A-1"].failure_class is FailureClass.ENVIRONMENT
    assert done["A-1"].lane_stopped is not None and done["A-1"].fell_back is None
    fell = done["B-1"]
    assert fell.status == "succeeded" and fell.attempt == 1
    assert fell.fell_back is not None
    assert fell.fell_back.startswith("fell back from claude/")
    assert "(stopped until an operator resumes it) to codex/" in fell.fell_back
    # The agents that ran: claude once, codex for B-1; claude never for B-1.
    calls = [json.loads(line) for line in fakes.read_text().splitlines()]
    assert [c["cli"] for c in calls] == ["claude", "codex"]
    assert calls[1]["argv"][-1] == "second"  # the prompt carried over
    # Announced on the run, the dispatch line, the board card.
    (task,) = [t for t in ledger.list_tasks() if t.title.endswith("B-1")]
    (run,) = ledger.runs(task.id)
    assert run.fell_back == fell.fell_back
    (started,) = [e for e in ledger.audit_events(task.id) if e.action == "run.start"]
    assert started.detail["fell_back"] == fell.fell_back
    assert f"succeeded ({fell.fell_back})" in _describe(fell, None)
    cards = [r for issue, r in board.reports if issue == "B-1"]
    assert all(fell.fell_back in r.lines for r in cards) and len(cards) == 2
    # The card's last status says what the run cost, as codex reported it (tokens only).
    assert cards[-1].spend == f"USD unknown, {run.usage.tokens:,} tokens", cards[-1].spend
    assert run.usage.tokens > 0
    # Never silently: the first's wait was said too.
    assert any(e.kind is EventKind.WAITING and e.issue_id == "B-1" for e in events)


def test_an_issue_whose_own_claude_run_stops_its_lane_is_done_by_codex_and_says_so(
    ledger: AnyLedger, fakes: Path
) -> None:
    # One issue: its own claude attempt is refused on credentials (environment, the lane
    # stops). Not charged, not given up: its next attempt, in the same dispatch, falls back.
    board = ReportedBoard(
        [BoardIssue("O-1", "o", "todo", prompt="only", adapters=("claude", "codex"))]
    )
    events = _settle(_dispatcher(board, ledger), board)
    first, second = [e for e in events if e.kind is EventKind.DISPATCHED]
    assert (first.failure_class, first.charged) == (FailureClass.ENVIRONMENT, False)
    assert first.lane_stopped is not None and first.falls_back is True
    assert first.moved_to is None and first.blocked_on is None
    assert "the next attempt falls back" in _describe(first, None)
    assert second.status == "succeeded" and second.attempt == 2 and second.moved_to == "done"
    assert second.fell_back is not None
    assert (
        f"fell back from {first.lane_stopped} (stopped until an operator resumes it) "
        + ("to codex/")
        in second.fell_back
    )
    calls = [json.loads(line) for line in fakes.read_text().splitlines()]
    assert [c["cli"] for c in calls] == ["claude", "codex"]
    assert calls[1]["argv"][-1] == "only"  # the prompt carried over
    # Announced on the run, the audit and the card; nothing charged, nothing given up.
    (task,) = ledger.list_tasks()
    assert task.status == "done" and task.gave_up_at_attempt is None
    assert task.charged_attempts == 1  # codex's success; claude's refusal was uncharged
    runs = ledger.runs(task.id)
    assert [r.fell_back for r in runs] == [None, second.fell_back]
    starts = [e for e in ledger.audit_events(task.id) if e.action == "run.start"]
    assert [e.detail.get("fell_back") for e in starts] == [None, second.fell_back]
    cards = [r for _issue, r in board.reports]
    assert any("falls back" in line for r in cards for line in r.lines)
    assert cards[-1].moved_to == "done" and second.fell_back in cards[-1].lines
    assert not any(r.moved_to == "blocked" for r in cards)


def test_an_issue_whose_own_usage_limit_parks_its_lane_falls_back_instead_of_waiting(
    ledger: AnyLedger, fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # claude's recorded gateway usage limit (`resetsAt` 1796623200), read an hour before
    # that reset: the run parks claude's lane for an hour and the task waits for it. With
    # codex next in its order, the issue runs there at once, announced, without the
    # claude session.
    monkeypatch.setenv("FAKE_CLAUDE", "claude/usage_limit_gateway")
    claude = attrs.evolve(ClaudeAdapter(), clock=lambda: 1796623200.0 - 3600)
    board = ReportedBoard(
        [BoardIssue("P-1", "p", "todo", prompt="p", adapters=("claude", "codex"))]
    )
    config = DispatchConfig.from_mapping({"base_backoff_s": 0.01, "max_retry_backoff_s": 0.02})
    dispatcher = Dispatcher(board, AdapterRunner(claude), ledger, config, executor=InlineExecutor())
    events = _settle(dispatcher, board)
    first, second = [e for e in events if e.kind is EventKind.DISPATCHED]
    assert (first.failure_class, first.charged, first.falls_back) == (
        FailureClass.UPSTREAM, False, True,
    )  # fmt: skip
    assert first.next_attempt_at is not None and first.next_attempt_at > time.time() + 3000
    assert second.status == "succeeded" and second.resumed_session is None
    assert second.fell_back is not None and "(parked until " in second.fell_back
    calls = [json.loads(line) for line in fakes.read_text().splitlines()]
    assert [c["cli"] for c in calls] == ["claude", "codex"]
    assert "resume" not in calls[1]["argv"]
    (task,) = ledger.list_tasks()
    assert [r.fell_back for r in ledger.runs(task.id)] == [None, second.fell_back]


def test_execkit_dispatch_falls_back_after_its_own_run_stops_the_lane(
    fakes: Path, tmp_path: Path
) -> None:
    board = write_board(
        tmp_path / "board.json",
        [{"id": "O-4", "title": "o", "state": "todo", "prompt": "p",
          "adapters": ["claude", "codex"]}],
        dispatch={"base_backoff_s": 0.01, "max_retry_backoff_s": 0.02},
    )  # fmt: skip
    db = str(tmp_path / "l.db")
    done = run_execkit("dispatch", "--board", str(board), "--db", db, "--until-idle")
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = [x for x in done.stdout.splitlines() if x.startswith("O-4  attempt")]
    assert len(lines) == 2, done.stdout
    assert "O-4  waiting: task t-1 waits on lane claude/" in done.stdout  # said, once
    assert "environment (uncharged)" in lines[0] and "falls back" in lines[0]
    assert "succeeded (fell back from claude/" in lines[1] and "to codex/" in lines[1]
    assert json.loads(board.read_text())["issues"][0]["state"] == "done"
    with open_ledger(db) as ledger:
        (task,) = ledger.list_tasks()
    shown = run_execkit("task", "show", task.id, "--db", db)
    assert "attempt 2: fell back from claude/" in shown.stdout, shown.stdout


def test_no_fallback_when_every_lane_of_the_order_is_stopped(
    ledger: AnyLedger, fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # codex is refused on credentials too: once both lanes are stopped the issue is
    # blocked and given up, as before (never a loop over closed lanes).
    monkeypatch.setenv("FAKE_CODEX", "codex/auth_401")
    board = InMemoryBoard(
        [BoardIssue("O-2", "o", "todo", prompt="p", adapters=("claude", "codex"))]
    )
    events = _settle(_dispatcher(board, ledger), board)
    dispatched = [e for e in events if e.kind is EventKind.DISPATCHED]
    assert [(e.failure_class, e.falls_back) for e in dispatched] == [
        (FailureClass.ENVIRONMENT, True),
        (FailureClass.ENVIRONMENT, None),
    ]
    assert dispatched[-1].moved_to == "blocked"
    calls = [json.loads(line)["cli"] for line in fakes.read_text().splitlines()]
    assert calls == ["claude", "codex"]


def test_no_fallback_after_a_work_failure_of_its_own(
    ledger: AnyLedger, fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CLAUDE", "claude/bad_request_400")
    board = InMemoryBoard(
        [BoardIssue("O-3", "o", "todo", prompt="p", adapters=("claude", "codex"))]
    )
    dispatcher = _dispatcher(board, ledger)
    (first,) = [e for e in dispatcher.tick() if e.kind is EventKind.DISPATCHED]
    assert first.failure_class is FailureClass.WORK and first.falls_back is None
    (task,) = ledger.list_tasks()
    assert not dispatcher._falls_back(board.list_candidates()[0], task, time.time())


def test_the_board_default_order_and_no_fallback_after_work(
    ledger: AnyLedger, fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # claude's lane open, claude's attempt a work failure (a 400): the issue retries on
    # claude, never on codex.
    monkeypatch.setenv("FAKE_CLAUDE", "claude/bad_request_400")
    issue = BoardIssue("W-1", "w", "todo", prompt="p")
    board = InMemoryBoard([issue])
    config = DispatchConfig.from_mapping(
        {
            "base_backoff_s": 0.01,
            "max_retry_backoff_s": 0.02,
            "max_attempts": 2,
            "adapters": ["claude", "codex"],
        }
    )
    assert config.adapters_of(issue) == ("claude", "codex")
    dispatcher = Dispatcher(board, AdapterRunner(), ledger, config, executor=InlineExecutor())
    for _ in range(200):  # bounded: two attempts with backoffs of 10-20 ms
        if not board.list_candidates():
            break
        dispatcher.tick()
        time.sleep(0.02)
    calls = [json.loads(line)["cli"] for line in fakes.read_text().splitlines()]
    assert calls == ["claude", "claude"]
    assert all(r.fell_back is None for r in ledger.runs(ledger.list_tasks()[0].id))


def test_a_usage_limit_falls_back_without_the_vendor_session(
    ledger: AnyLedger, fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # claude's recorded 429 in session 7fe4..., then an operator parks claude's lane for an
    # hour: the next attempt runs on codex, fresh: a session never crosses vendors.
    monkeypatch.setenv("FAKE_CLAUDE", "claude/usage_limit")
    board = InMemoryBoard(
        [BoardIssue("U-1", "u", "todo", prompt="p", adapters=("claude", "codex"))]
    )
    config = DispatchConfig.from_mapping({"base_backoff_s": 0.01, "max_retry_backoff_s": 0.02})
    dispatcher = Dispatcher(board, AdapterRunner(), ledger, config, executor=InlineExecutor())
    events = [e for e in dispatcher.tick() if e.kind is EventKind.DISPATCHED]
    (claude_lane,) = [lane.lane for lane in ledger.list_lanes()]
    owner = getpass.getuser()  # the ledger's owner may operate its lanes
    ledger.park_lane(claude_lane, until=time.time() + 3600, actor=owner, reason="usage limit")
    for _ in range(200):  # bounded: one more attempt after a backoff of 10-20 ms
        if not board.list_candidates():
            break
        events.extend(e for e in dispatcher.tick() if e.kind is EventKind.DISPATCHED)
        time.sleep(0.02)
    assert len(events) == 2, [(e.attempt, e.status, e.reason, e.fell_back) for e in events]
    first, second = events
    assert first.failure_class is FailureClass.UPSTREAM and first.fell_back is None
    assert second.status == "succeeded" and second.fell_back is not None
    assert second.resumed_session is None
    assert f"fell back from {claude_lane} (parked until " in second.fell_back
    calls = [json.loads(line) for line in fakes.read_text().splitlines()]
    assert [c["cli"] for c in calls] == ["claude", "codex"]
    assert "resume" not in calls[1]["argv"]


def test_task_show_and_status_say_the_fallback(
    fakes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # codex is overloaded: B-3 stays active (its next attempt due), so status lists it.
    monkeypatch.setenv("FAKE_CODEX", "codex/overloaded_529")
    path = tmp_path / "l.db"
    with open_ledger(path) as ledger:
        board = InMemoryBoard(
            [
                BoardIssue("A-3", "a", "todo", prompt="first", adapter="claude"),
                BoardIssue("B-3", "b", "todo", prompt="second", adapters=("claude", "codex")),
            ]
        )
        config = DispatchConfig.from_mapping({"base_backoff_s": 60, "max_retry_backoff_s": 60})
        dispatcher = Dispatcher(board, AdapterRunner(), ledger, config, executor=InlineExecutor())
        events: list[DispatchEvent] = []
        for _ in range(5):  # bounded: A-3 once, B-3 once, then both wait
            events.extend(e for e in dispatcher.tick() if e.kind is EventKind.DISPATCHED)
        assert sorted(e.issue_id for e in events) == ["A-3", "B-3"]
        (task,) = [t for t in ledger.list_tasks() if t.title.endswith("B-3")]
    shown = run_execkit("task", "show", task.id, "--db", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "attempt 1: fell back from claude/" in shown.stdout and "to codex/" in shown.stdout
    status = run_execkit("status", "--db", str(path))
    assert status.returncode == 0, status.stderr
    (line,) = [x for x in status.stdout.splitlines() if "fell back" in x]
    assert line.startswith("B-3  attempt 1: fell back from claude/") and "to codex/" in line


def test_execkit_dispatch_reads_the_order_from_the_board_and_prints_the_fallback(
    fakes: Path, tmp_path: Path
) -> None:
    board = write_board(
        tmp_path / "board.json",
        [
            {"id": "A-4", "title": "a", "state": "todo", "prompt": "first", "adapter": "claude"},
            {"id": "B-4", "title": "b", "state": "todo", "prompt": "second",
             "adapters": ["claude", "codex"]},
        ],
        dispatch={"base_backoff_s": 0.01, "max_retry_backoff_s": 0.02},
    )  # fmt: skip
    # One at a time: A-4's refused credentials stop claude's lane before B-4 is admitted
    # (an attempt that itself meets the refusal is blocked on environment, as before).
    done = run_execkit(
        "dispatch", "--board", str(board), "--db", str(tmp_path / "l.db"), "--until-idle",
        "--concurrency", "1",
    )  # fmt: skip
    lines = [x for x in done.stdout.splitlines() if x.startswith("B-4") and "succeeded" in x]
    assert len(lines) == 1, (done.stdout, done.stderr)
    (line,) = lines
    assert "succeeded (fell back from claude/" in line and "to codex/" in line
    assert json.loads(board.read_text())["issues"][1]["adapters"] == ["claude", "codex"]
    # A board that names both, or an empty order, is refused naming the field, nothing run.
    bads: list[dict[str, object]] = [{"adapter": "claude", "adapters": ["codex"]}, {"adapters": []}]
    for bad in bads:
        write_board(tmp_path / "bad.json", [{"id": "X", "state": "todo", **bad}])
        refused = run_execkit(
            "dispatch", "--board", str(tmp_path / "bad.json"), "--db", str(tmp_path / "x.db"),
            "--until-idle",
        )  # fmt: skip
        assert refused.returncode != 0 and "issues[0].adapters" in refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"adapters": "claude"}, "adapters"),
        ({"adapters": ["claude", "claude"]}, "adapters"),
        ({"adapters": ["claude", ""]}, "adapters"),
        ({"adapters": ["claude"], "adapter": "codex"}, "adapters"),
    ],
)
def test_a_bad_order_is_refused_naming_the_field(raw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        BoardIssue("X", "x", "todo", **raw)  # type: ignore[arg-type]
    assert refused.value.field == field
    with pytest.raises(InvalidInput):
        DispatchConfig.from_mapping({"adapters": ["a"] * 2})
