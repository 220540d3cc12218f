"""The vendor session resumed once (issue #46): after an attempt that ended on an upstream
refusal with a session id, the issue's next attempt resumes that session with the
adapter's own flag, in the same workspace; exactly once; never after `work`; a resume the
vendor refuses (claude-code 2.1.332: "No conversation found with session ID: <id>",
recorded from the real CLI) starts fresh in the same attempt, uncharged, and says so.
Real processes: a stand-in `claude` that replays the recorded usage limit and success."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from _support import REPO, a_slot, run_execkit
from hypothesis import given, settings
from hypothesis import strategies as st
from ledger_backends import AnyLedger

from adapters import ClaudeAdapter, CodexAdapter, GeminiAdapter, GenericAdapter
from execkit import InvalidInput
from execkit._adapter import AgentRequest, resume_refused, resumes_sessions
from execkit._classify import FailureClass
from execkit._registry import get_adapter
from execkit.cli._dispatch import _describe
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    DispatchEvent,
    EventKind,
    InlineExecutor,
    InMemoryBoard,
    RunOutcome,
    Workspaces,
)

SESSION = "7fe4ecce-cba9-4182-98c6-ce5bbc5450ae"  # the recorded usage limit's session
RECORDED = REPO / "fixtures" / "recorded" / "claude"
# What claude-code 2.1.332 prints for `-p --output-format stream-json --verbose --resume
# <unknown uuid>` (run against the loopback API; it exits 1 before any request).
UNKNOWN_SESSION_RESULT = (
    '{"type":"result","subtype":"error_during_execution","duration_ms":0,'
    '"duration_api_ms":0,"is_error":true,"num_turns":0,"stop_reason":null,'
    '"session_id":"1b4e28ba-2fa1-11d2-883f-0016d3cca427","total_cost_usd":0,'
    '"errors":["No conversation found with session ID: 1b4e28ba-2fa1-11d2-883f-0016d3cca427"]}'
)

# A stand-in `claude`: each call logged (argv, cwd); a fresh start replays the recorded
# usage limit (a 429 in session SESSION) the first time only, then the recorded success;
# `--resume ID` of the session in `known` replays the success, any other id is refused
# with the real CLI's result.
_FAKE_CLAUDE = f"""#!{sys.executable}
import json, os, pathlib, sys
argv = sys.argv[1:]
state = pathlib.Path(os.environ["FAKE_CLAUDE_STATE"])
with open(state / "calls.jsonl", "a") as f:
    f.write(json.dumps({{"argv": argv, "cwd": os.getcwd()}}) + "\\n")
rec = pathlib.Path({str(RECORDED)!r})
first = (state / "first").read_text() if (state / "first").exists() else "usage_limit"
if "--resume" in argv:
    sid = argv[argv.index("--resume") + 1]
    known = (state / "known").read_text() if (state / "known").exists() else ""
    if (state / "resume_limited").exists():
        sys.stdout.write((rec / "usage_limit" / "stdout").read_text())
        sys.exit(1)
    if sid != known:
        print({UNKNOWN_SESSION_RESULT!r}.replace("1b4e28ba-2fa1-11d2-883f-0016d3cca427", sid))
        sys.exit(1)
elif not (state / "started").exists():
    (state / "started").write_text("")
    sys.stdout.write((rec / first / "stdout").read_text())
    sys.exit(1)
sys.stdout.write((rec / "success" / "stdout").read_text())
"""


@pytest.fixture
def fake_claude(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "claude-state"
    state.mkdir()
    program = tmp_path / "bin" / "claude"
    program.parent.mkdir()
    program.write_text(_FAKE_CLAUDE)
    program.chmod(0o755)
    monkeypatch.setenv("FAKE_CLAUDE_STATE", str(state))
    return state


def _calls(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def _dispatch(
    ledger: AnyLedger,
    state: Path,
    board: InMemoryBoard,
    workspaces: Workspaces,
    *,
    runs: int | None = None,
) -> list[DispatchEvent]:
    """Dispatch until the board settles (or `runs` runs have ended)."""
    adapter = attrs.evolve(ClaudeAdapter(), binary=str(state.parent / "bin" / "claude"))
    config = DispatchConfig.from_mapping(
        {"default_adapter": "claude", "base_backoff_s": 0.01, "max_retry_backoff_s": 0.02}
    )
    dispatcher = Dispatcher(
        board,
        AdapterRunner(adapter),
        ledger,
        config,
        executor=InlineExecutor(),
        workspaces=workspaces,
    )
    events: list[DispatchEvent] = []
    for _ in range(200):  # bounded: two or three attempts with backoffs of 10-20 ms
        if not board.list_candidates() or (runs is not None and len(events) >= runs):
            return events
        events.extend(e for e in dispatcher.tick() if e.kind is EventKind.DISPATCHED)
        time.sleep(0.02)
    raise AssertionError("the board did not settle")


def test_the_next_attempt_resumes_the_session_once_in_the_same_workspace(
    ledger: AnyLedger, fake_claude: Path, tmp_path: Path
) -> None:
    (fake_claude / "known").write_text(SESSION)
    board = InMemoryBoard([BoardIssue("S-1", "s", "todo", prompt="fix it")])
    first, second = _dispatch(ledger, fake_claude, board, Workspaces(tmp_path / "ws"))
    assert (first.failure_class, first.charged, first.resumed_session) == (
        FailureClass.UPSTREAM,
        False,
        None,
    )
    assert second.status == "succeeded" and second.resumed_session == SESSION
    assert second.resume_refused is False and second.resumed_after == "http 429"
    fresh, resumed = _calls(fake_claude)
    assert "--resume" not in fresh["argv"]
    assert resumed["argv"][resumed["argv"].index("--resume") + 1] == SESSION
    assert fresh["cwd"] == resumed["cwd"] == str(tmp_path / "ws" / "S-1")
    # The ledger keeps it on the run; the operator reads it in the dispatch line.
    runs = ledger.runs(ledger.list_tasks()[0].id)
    assert [r.resumed_session for r in runs] == [None, SESSION]
    starts = [e for e in ledger.audit_events(runs[0].task_id) if e.action == "run.start"]
    assert [e.detail.get("resumed_session") for e in starts] == [None, SESSION]
    line = _describe(second, None)
    assert f"succeeded (resumed session {SESSION} after http 429) -> moved to done" in line


def test_a_usage_limit_two_seconds_from_its_reset_is_resumed_after_the_lane_opens(
    ledger: AnyLedger, fake_claude: Path, tmp_path: Path
) -> None:
    # The recorded gateway usage limit: a `rate_limit_event` whose `resetsAt` parks the
    # lane; read two seconds before that reset, so the lane opens two seconds later.
    gateway = "b94f7332-a7ea-43c3-ac10-97bf896c5d85"
    (fake_claude / "first").write_text("usage_limit_gateway")
    (fake_claude / "known").write_text(gateway)
    adapter = attrs.evolve(
        ClaudeAdapter(),
        binary=str(fake_claude.parent / "bin" / "claude"),
        clock=lambda: 1796623198.0,
    )
    board = InMemoryBoard([BoardIssue("S-6", "s", "todo", prompt="fix it")])
    config = DispatchConfig.from_mapping(
        {"default_adapter": "claude", "base_backoff_s": 0.01, "max_retry_backoff_s": 0.02}
    )
    dispatcher = Dispatcher(
        board, AdapterRunner(adapter), ledger, config, executor=InlineExecutor(),
        workspaces=Workspaces(tmp_path / "ws"),
    )  # fmt: skip
    events: list[DispatchEvent] = []
    for _ in range(400):  # bounded: the lane's two seconds, at 50 ms a pass
        if not board.list_candidates():
            break
        events.extend(e for e in dispatcher.tick() if e.kind is EventKind.DISPATCHED)
        time.sleep(0.05)
    first, second = events
    assert first.failure_class is FailureClass.UPSTREAM and first.reason is not None
    assert second.status == "succeeded" and second.resumed_session == gateway
    assert second.resumed_after == first.reason.split(": ", 1)[0]
    _fresh, resumed = _calls(fake_claude)
    assert resumed["argv"][resumed["argv"].index("--resume") + 1] == gateway
    runs = ledger.runs(ledger.list_tasks()[0].id)
    assert runs[0].not_before is not None and [r.resumed_session for r in runs] == [None, gateway]


def test_a_session_the_vendor_does_not_know_starts_fresh_in_the_same_attempt(
    ledger: AnyLedger, fake_claude: Path, tmp_path: Path
) -> None:
    # `known` is never written: the vendor refuses the session it was asked to resume.
    board = InMemoryBoard([BoardIssue("S-2", "s", "todo", prompt="fix it")])
    first, second = _dispatch(ledger, fake_claude, board, Workspaces(tmp_path / "ws"))
    assert first.failure_class is FailureClass.UPSTREAM
    assert second.attempt == 2 and second.status == "succeeded"
    assert (second.resumed_session, second.resume_refused) == (SESSION, True)
    calls = [c["argv"] for c in _calls(fake_claude)]
    assert ["--resume" in argv for argv in calls] == [False, True, False]
    # One run per attempt: the refused resume is no attempt of its own, nothing charged.
    runs = ledger.runs(ledger.list_tasks()[0].id)
    assert [r.attempt for r in runs] == [1, 2]
    assert "the vendor refused it: started fresh, uncharged" in _describe(second, None)


def test_never_after_a_work_failure(ledger: AnyLedger, fake_claude: Path, tmp_path: Path) -> None:
    (fake_claude / "known").write_text(SESSION)
    (fake_claude / "first").write_text("bad_request_400")  # a 400: the work, charged
    board = InMemoryBoard([BoardIssue("S-3", "s", "todo", prompt="fix it")])
    first, second = _dispatch(ledger, fake_claude, board, Workspaces(tmp_path / "ws"))
    assert first.failure_class is FailureClass.WORK
    assert second.status == "succeeded" and second.resumed_session is None
    assert not any("--resume" in c["argv"] for c in _calls(fake_claude))
    assert [r.resumed_session for r in ledger.runs(ledger.list_tasks()[0].id)] == [None, None]


def test_task_show_says_which_attempt_resumed_what(
    fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from execkit.ledger import open_ledger

    (fake_claude / "known").write_text(SESSION)
    path = tmp_path / "l.db"
    with open_ledger(path) as ledger:
        board = InMemoryBoard([BoardIssue("S-4", "s", "todo", prompt="fix it")])
        _dispatch(ledger, fake_claude, board, Workspaces(tmp_path / "ws"))
        task_id = ledger.list_tasks()[0].id
    shown = run_execkit("task", "show", task_id, "--db", str(path))
    assert shown.returncode == 0, shown.stderr
    assert f"attempt 2: resumed session {SESSION} after http 429" in shown.stdout


def test_status_shows_an_active_issue_whose_attempt_resumed(
    fake_claude: Path, tmp_path: Path
) -> None:
    from execkit.ledger import open_ledger

    (fake_claude / "known").write_text(SESSION)
    (fake_claude / "resume_limited").write_text("")  # the resumed attempt is refused too
    path = tmp_path / "l.db"
    with open_ledger(path) as ledger:
        board = InMemoryBoard([BoardIssue("S-5", "s", "todo", prompt="fix it")])
        _first, second = _dispatch(ledger, fake_claude, board, Workspaces(tmp_path / "ws"), runs=2)
    assert second.resumed_session == SESSION and second.failure_class is FailureClass.UPSTREAM
    shown = run_execkit("status", "--db", str(path))
    assert shown.returncode == 0, shown.stderr
    assert f"S-5  attempt 2: resumed session {SESSION} after http 429" in shown.stdout


# -- the adapters' own flags -------------------------------------------------------------


def test_each_resuming_adapter_passes_its_own_flag() -> None:
    request = AgentRequest(prompt="go on", cwd="/w", resume_session=SESSION)
    assert ClaudeAdapter().build_argv(request)[:7] == [
        "claude", "-p", "--output-format", "stream-json", "--verbose", "--resume", SESSION
    ]  # fmt: skip
    assert CodexAdapter().build_argv(request) == [
        "codex", "exec", "--json", "--cd", "/w", "resume", SESSION, "go on"
    ]  # fmt: skip
    gemini = GeminiAdapter().build_argv(request)
    assert gemini[gemini.index("--resume") + 1] == SESSION
    for adapter in (ClaudeAdapter(), CodexAdapter(), GeminiAdapter()):
        assert resumes_sessions(adapter)
        fresh = adapter.build_argv(AgentRequest(prompt="go on"))
        assert "--resume" not in fresh and "resume" not in fresh


@pytest.mark.parametrize("name", ["qwen", "opencode", "copilot", "pi", "generic", "aider"])
def test_an_adapter_without_a_resume_starts_fresh(name: str) -> None:
    adapter = get_adapter(name)
    assert not resumes_sessions(adapter)
    # It never sees a session id: the runner leaves it out, and the dispatcher gets none.
    runner = AdapterRunner(GenericAdapter())
    outcome = runner.run(
        BoardIssue("G", "g", "todo", argv=[sys.executable, "-c", "pass"]),
        attrs.evolve(a_slot(2), resume_session=SESSION),
    )
    assert outcome.resumed_session is None and outcome.session_id is None


def test_each_vendors_refusal_of_an_unknown_session_is_read() -> None:
    assert resume_refused(ClaudeAdapter(), "No conversation found with session ID: x")
    codex = "Error: thread/resume: thread/resume failed: no rollout found for thread id x"
    assert resume_refused(CodexAdapter(), codex)
    assert resume_refused(GeminiAdapter(), 'Invalid session identifier "x".')
    assert not resume_refused(ClaudeAdapter(), "API Error: 429 rate limit")
    assert not resume_refused(GenericAdapter(), "No conversation found with session ID: x")


@pytest.mark.parametrize("bad", ["", "a b", "-rf", "x" * 201, "a\nb"])
def test_a_session_id_that_is_not_one_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        AgentRequest(prompt="p", resume_session=bad)
    assert refused.value.field == "resume_session"


def test_the_recorded_claude_refusal_is_what_the_adapter_reads(tmp_path: Path) -> None:
    script = tmp_path / "claude"
    script.write_text(
        f"#!{sys.executable}\nprint({UNKNOWN_SESSION_RESULT!r})\nraise SystemExit(1)\n"
    )
    script.chmod(0o755)
    adapter = attrs.evolve(ClaudeAdapter(), binary=str(script))
    runner = AdapterRunner(adapter)
    outcome = runner.run(
        BoardIssue("C", "c", "todo", prompt="p", adapter="claude"),
        attrs.evolve(a_slot(2, "claude"), resume_session="1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
    )
    # Refused, then started fresh: the stand-in refuses again (it knows no other answer),
    # and that fresh start's own failure is the attempt's.
    assert outcome.resume_refused is True and outcome.status == "failed"


# -- the rule, for any history ----------------------------------------------------------

_OUTCOMES = st.sampled_from(
    [
        RunOutcome("succeeded", session_id="s-ok"),
        RunOutcome("failed", failure_class=FailureClass.WORK, session_id="s-work"),
        RunOutcome("failed", failure_class=FailureClass.ENVIRONMENT, session_id="s-env"),
        RunOutcome("failed", failure_class=FailureClass.UPSTREAM, session_id="s-up"),
        RunOutcome("failed", failure_class=FailureClass.UPSTREAM),  # no session said
    ]
)


@settings(max_examples=40, deadline=None)
@given(
    failures=st.lists(_OUTCOMES.filter(lambda o: o.status == "failed"), max_size=6),
    done=st.booleans(),
)
def test_a_session_is_resumed_only_after_an_upstream_refusal_that_named_one(
    failures: list[RunOutcome], done: bool
) -> None:
    # A success ends the task: it can only be the last run.
    history = failures + ([RunOutcome("succeeded", session_id="s-ok")] if done else [])
    # Recorded in a real ledger and read back from it (issue #46: the decision is the
    # ledger's, so a restarted dispatcher takes the same one).
    from execkit._attempt import record_outcome, resumable_session, session_after
    from execkit.ledger import open_ledger

    with tempfile.TemporaryDirectory() as place, open_ledger(Path(place) / "l.db") as ledger:
        task = ledger.create_task("p", actor="me")
        for n, outcome in enumerate(history, 1):
            run = ledger.start_run(task.id, request_key=str(n), actor="me", forced=True,
                                   ignore_backoff=True)  # fmt: skip
            record_outcome(ledger, run.id, outcome, now=time.time())
        runs = ledger.runs(task.id)
        kept = resumable_session(ledger, task.id, "claude", now=time.time())
        assert kept == session_after(runs)
        last = history[-1] if history else None
        if last is not None and last.failure_class is FailureClass.UPSTREAM and last.session_id:
            assert kept == last.session_id
        else:
            assert kept is None
