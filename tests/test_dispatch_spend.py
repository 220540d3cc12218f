"""The dispatcher against spend caps (issue #45): a window's refusal is uncharged and
holds the issue until the window reopens, as a parked lane does, said once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_dispatch import OK, ROOMY, Clock, ScriptedRunner
from test_remote import ME

from execkit._errors import InvalidInput
from execkit.cli._dispatch import describe_event
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InMemoryBoard,
    JsonFileBoard,
    issue_statuses,
)
from execkit.ledger import SpendCap, SpendWindow, TaskBudget, open_ledger, window_bounds

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC
STATES = [{"name": "todo", "eligible": True}, {"name": "done", "terminal": True}]


def test_a_window_refusal_holds_the_issue_until_the_window_reopens(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        day = SpendCap(SpendWindow.DAY, usd=1.0)
        ledger.set_spend_cap(day, actor=ME, floor_usd=1.0)  # room for one run a day
        board = InMemoryBoard(
            [BoardIssue("ISS-1", "one", "todo", prompt="a"), BoardIssue("ISS-2", "two", "todo")]
        )
        runner, clock = ScriptedRunner(OK), Clock(T0)
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=3), clock)
        events = []
        for _ in range(6):
            events += dispatcher.tick()
            clock.now += 60
        assert [call[0] for call in runner.calls] == ["ISS-1"]
        waiting = [event for event in events if event.kind == "waiting"]
        assert len(waiting) == 1 and waiting[0].issue_id == "ISS-2"
        reopens = window_bounds(day, T0)[1]
        assert f"waiting on the day's budget until {'2027-01-16T00:00:00+00:00'}" in (
            waiting[0].reason or ""
        )
        second = ledger.list_tasks()[-1]
        assert ledger.runs(second.id) == []  # uncharged: never admitted
        starts = [e for e in ledger.audit_events() if e.action == "run.start"]
        assert len(starts) == 1
        # The dashboard says what it waits on, and until when.
        config = DispatchConfig(max_attempts=3)
        rows = {
            row.issue_id: row for row in issue_statuses(ledger, config, board=board, now=clock.now)
        }
        assert rows["ISS-2"].reason == "waiting on the day's budget until 2027-01-16T00:00:00+00:00"
        assert (rows["ISS-2"].next_attempt_at, rows["ISS-2"].waits_on) == (reopens, "spend")
        assert rows["ISS-1"].reason != rows["ISS-2"].reason  # done: it waits on nothing
        (use,) = ledger.spend_windows(now=clock.now)
        assert (use.full, use.usd, use.reopens_at) == (True, 1.0, reopens)
        clock.now = reopens + 1
        for _ in range(3):
            dispatcher.tick()
            clock.now += 60
        assert [call[0] for call in runner.calls] == ["ISS-1", "ISS-2"]


def test_a_board_issues_budget_is_its_tasks_own_cap(tmp_path: Path) -> None:
    board_file = tmp_path / "board.json"
    board_file.write_text(
        json.dumps(
            {
                "states": STATES,
                "issues": [
                    {"id": "ISS-1", "title": "one", "state": "todo", "budget_usd": 2.5},
                    {"id": "ISS-2", "title": "two", "state": "todo", "budget_tokens": 9000},
                ],
            }
        )
    )
    board = JsonFileBoard(board_file)
    assert board.list_issues()[0].budget_usd == 2.5
    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        runner, clock = ScriptedRunner(OK), Clock(T0)
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=3), clock)
        dispatcher.tick()
        first, second = ledger.list_tasks()
        assert ledger.task_budget(first.id) == TaskBudget(first.id, 2.5, None)
        assert ledger.task_budget(second.id) == TaskBudget(second.id, None, 9000)


@pytest.mark.parametrize("bad", [{"budget_usd": 0}, {"budget_usd": "5"}, {"budget_tokens": 1.5}])
def test_a_bad_board_budget_is_refused_naming_it(tmp_path: Path, bad: dict[str, object]) -> None:
    board_file = tmp_path / "board.json"
    board_file.write_text(
        json.dumps(
            {"states": STATES, "issues": [{"id": "A", "title": "a", "state": "todo", **bad}]}
        )
    )
    with pytest.raises(InvalidInput) as refused:
        JsonFileBoard(board_file).list_issues()
    assert refused.value.field == f"issues[0].{next(iter(bad))}"


def test_an_issue_its_budget_stops_comes_back_when_an_operator_raises_it(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(actor=ME, floor_usd=0.6)  # every run reserves $0.60
        issue = BoardIssue("ISS-1", "one", "todo", prompt="a", budget_usd=0.5)
        board = InMemoryBoard([issue])
        runner, clock = ScriptedRunner(OK), Clock(T0)
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=3), clock)
        events = dispatcher.tick()
        assert runner.calls == [] and board.get("ISS-1").state == "blocked"
        (task,) = ledger.list_tasks()
        shown = ledger.get_task(task.id, now=clock.now)
        assert shown.blocked_on == "spend" and "execkit task set-budget" in (shown.reason or "")
        assert any(event.kind in ("blocked", "gave_up") for event in events)
        # Its line names the one fix, which brings the card back by itself.
        (line,) = [describe_event(e, clock.now) for e in events if e.moved_to == "blocked"]
        assert "execkit task set-budget" in line and "the raise brings the card back" in line
        assert "move the card back" not in line
        [gave_up] = [e for e in ledger.audit_events(task.id) if e.action == "task.give_up"]
        assert gave_up.detail["blocked_on"] == "spend"  # what a person is told too
        # The operator's table says so too (it reads a listing, not the task alone).
        (row,) = issue_statuses(ledger, DispatchConfig(max_attempts=3), board=board, now=clock.now)
        assert (row.ledger_state, row.blocked_on, row.reason) == ("blocked", "spend", shown.reason)
        ledger.set_task_budget(
            task.id, usd=5.0, tokens=None, expected_usd=0.5, expected_tokens=None, actor=ME
        )
        for _ in range(3):
            dispatcher.tick()
            clock.now += 60
        assert [call[0] for call in runner.calls] == ["ISS-1"]
        assert board.get("ISS-1").state == "done"
