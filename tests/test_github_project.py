"""A GitHub Project (v2) as a board (issue #47), against the loopback fake, whose GraphQL
side executes the board's documents against a part of GitHub's published schema
(tests/github_graphql.graphql): the Status options are the states, items are issues, a
draft is skipped and said once, a move is one mutation, the status comment is the issues
board's, a closed issue is left alone, and `execkit dispatch --board github-project:...`
takes the board configuration's `github_project` object."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO
from github_fake import TOKEN, FakeGitHub

from execkit._classify import FailureClass
from execkit._errors import ExecKitError, InvalidInput
from execkit._proof import RunStatus
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
)
from execkit.dispatch._github_project import (
    PROJECT_ITEMS_QUERY,
    SET_STATUS_MUTATION,
    GitHubProjectBoard,
    GitHubProjectConfig,
)
from execkit.ledger import Ledger, open_ledger

pytest.importorskip("githubkit")
pytest.importorskip("graphql")


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    github = FakeGitHub()
    try:
        yield github
    finally:
        github.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = open_ledger(tmp_path / "ledger.db")
    try:
        yield opened
    finally:
        opened.close()


def _board(
    fake: FakeGitHub, ledger: Ledger, spec: str = "acme/1", **settings: Any
) -> GitHubProjectBoard:
    config = GitHubProjectConfig.parse(spec, settings, {"GITHUB_API_URL": fake.url})
    return GitHubProjectBoard(config, ledger, TOKEN, retry_base_s=0.01)


class Scripted:
    def __init__(self, *outcomes: RunOutcome) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, int]] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append((issue.id, slot.attempt))
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


def _dispatcher(board: GitHubProjectBoard, ledger: Ledger, runner: Scripted) -> Dispatcher:
    config = DispatchConfig.from_mapping(board.project.dispatch_states())
    return Dispatcher(board, runner, ledger, config, executor=InlineExecutor())


def test_the_documents_are_valid_against_the_schema_part() -> None:
    from graphql import build_schema, parse, validate

    schema = build_schema((REPO / "tests" / "github_graphql.graphql").read_text())
    for document in (PROJECT_ITEMS_QUERY, SET_STATUS_MUTATION):
        assert validate(schema, parse(document)) == []


def test_the_status_options_are_the_states_and_drafts_are_said_once(
    fake: FakeGitHub, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    project = fake.add_project()
    first = fake.add_issue("Fix the parser", "It fails.", labels=("execkit:adapter=codex",))
    second = fake.add_issue("Later", labels=())
    pull = fake.add_issue("a pull request", pull_request=True)
    fake.add_project_item(project, first, status="Todo")
    fake.add_project_item(project, second, status="In Progress")
    fake.add_project_item(project, pull, status="Todo")
    fake.add_project_item(project, draft="an idea", status="Todo")
    fake.add_issue("not on the project")
    board = _board(fake, ledger, failed="Blocked")
    with caplog.at_level(logging.WARNING, logger="execkit.dispatch"):
        [issue] = board.list_candidates()
        board.list_candidates()
    assert (issue.id, issue.state, issue.adapter) == ("acme/widgets#1", "Todo", "codex")
    assert issue.prompt == "Fix the parser\n\nIt fails."
    assert {(i.id, i.state) for i in board.list_issues()} == {
        ("acme/widgets#1", "Todo"),
        ("acme/widgets#2", "In Progress"),
    }
    drafts = [r for r in caplog.records if "draft item" in r.getMessage()]
    assert len(drafts) == 1 and "an idea" in drafts[0].getMessage()
    states = {s.name: (s.eligible, s.terminal) for s in board.states}
    assert states == {
        "Todo": (True, False),
        "In Progress": (False, False),
        "Done": (False, True),
        "Blocked": (False, True),
        "closed": (False, True),
    }


def test_eligible_to_done_is_one_move_and_one_status_comment(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    project = fake.add_project()
    number = fake.add_issue("Fix it")
    fake.add_project_item(project, number)
    board = _board(fake, ledger)
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    dispatcher = _dispatcher(board, ledger, runner)
    [event] = dispatcher.tick()
    assert (event.kind, event.moved_to) == ("dispatched", "Done")
    assert fake.status_of(project, number) == "Done"
    [comment] = fake.status_comments(number)
    assert "succeeded" in comment["body"]
    assert fake.labels_of(number) == {"execkit"}  # a project board moves no label
    assert dispatcher.tick() == []
    assert runner.calls == [("acme/widgets#1", 1)]


@pytest.mark.parametrize(
    "retried,shown",
    [
        (RunOutcome(RunStatus.SUCCEEDED), "Done"),
        (RunOutcome(RunStatus.FAILED, failure_class=FailureClass.WORK, reason="fail"), "Todo"),
    ],
    ids=["succeeds", "fails-again"],
)
def test_a_give_up_moves_to_failed_and_a_move_back_is_one_forced_retry(
    fake: FakeGitHub, ledger: Ledger, retried: RunOutcome, shown: str
) -> None:
    project = fake.add_project()
    number = fake.add_issue("Needs a key")
    fake.add_project_item(project, number)
    board = _board(fake, ledger, failed="Blocked")
    broken = RunOutcome(
        RunStatus.FAILED,
        failure_class=FailureClass.ENVIRONMENT,
        reason="credentials refused",
        precondition="set ANTHROPIC_API_KEY",
    )
    running: list[str | None] = []

    class Watching(Scripted):
        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            board.catch_up()  # what a pass sends while the agent runs
            running.append(fake.status_of(project, number))
            return super().run(issue, slot)

    dispatcher = _dispatcher(board, ledger, Watching(broken, retried))
    [event] = dispatcher.tick()
    assert event.moved_to == "Blocked"
    assert fake.status_of(project, number) == "Blocked"
    assert dispatcher.tick() == []
    fake.set_status_by_hand(project, number, "Todo")
    [again] = dispatcher.tick()
    assert (again.kind, again.attempt) == ("dispatched", 2)
    board.catch_up()
    # The give-up's Status stayed in the item's outbox entry once shown: the retry's claim
    # set Blocked again while its agent ran, and kept it when the run failed again.
    assert running == ["Todo", "Todo"]
    assert fake.status_of(project, number) == shown
    assert len(fake.status_comments(number)) == 1


def test_a_closed_issue_is_left_alone(fake: FakeGitHub, ledger: Ledger) -> None:
    project = fake.add_project()
    number = fake.add_issue("Closed already")
    fake.add_project_item(project, number, status="Todo")
    fake.close_by_hand(number)
    board = _board(fake, ledger)
    assert board.list_candidates() == []
    [issue] = board.list_issues()
    assert issue.state == "closed"
    assert board.move(issue.id, "Done") is True  # taken, and nothing recorded
    board.catch_up()
    assert fake.status_of(project, number) == "Todo"


def test_a_users_project_reads_the_same_way(fake: FakeGitHub, ledger: Ledger) -> None:
    project = fake.add_project(owner="octocat", number=3)
    number = fake.add_issue("Mine")
    fake.add_project_item(project, number)
    assert [i.id for i in _board(fake, ledger, "octocat/3").list_candidates()] == ["acme/widgets#1"]


def test_more_than_a_page_of_items_is_read_page_by_page(fake: FakeGitHub, ledger: Ledger) -> None:
    project = fake.add_project()
    for n in range(150):
        fake.add_project_item(project, fake.add_issue(f"issue {n}"))
    board = _board(fake, ledger)
    before = fake.graphql_requests
    assert len(board.list_candidates()) == 150
    assert fake.graphql_requests - before == 2


@pytest.mark.parametrize(
    "settings,field",
    [
        ({"eligible": []}, "github_project.eligible"),
        ({"eligible": "Todo"}, "github_project.eligible"),
        ({"terminal": [""]}, "github_project.terminal"),
        ({"done": 3}, "github_project.done"),
        ({"failed": "Done"}, "github_project.failed"),
        ({"eligible": ["Done"]}, "github_project.eligible"),
        ({"status_field": ""}, "github_project.status_field"),
        ({"columns": []}, "github_project"),
        ({"api_url": "file:///x"}, "github_project.api_url"),
    ],
)
def test_a_bad_project_setting_is_one_error_naming_its_key(
    settings: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        GitHubProjectConfig.parse("acme/1", settings, {})
    assert refused.value.field == field


@pytest.mark.parametrize("spec", ["acme", "acme/x", "-acme/1", "acme/0"])
def test_a_bad_project_spec_is_refused(spec: str) -> None:
    with pytest.raises(InvalidInput):
        GitHubProjectConfig.parse(spec, {}, {})


def test_options_the_project_does_not_have_are_named(fake: FakeGitHub, ledger: Ledger) -> None:
    fake.add_project()
    with pytest.raises(InvalidInput) as refused:
        _board(fake, ledger, eligible=["Ready"]).list_candidates()
    assert refused.value.field == "github_project.eligible" and "Ready" in refused.value.message
    with pytest.raises(InvalidInput) as no_field:
        _board(fake, ledger, status_field="Stage").list_candidates()
    assert no_field.value.field == "github_project.status_field"
    with pytest.raises(ExecKitError) as missing:
        _board(fake, ledger, "acme/9").list_candidates()
    assert "Could not resolve to a ProjectV2" in missing.value.message


def test_execkit_dispatch_takes_a_project_board(
    fake: FakeGitHub, tmp_path: Path, fake_vendor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from execkit.cli import main

    project = fake.add_project(options=("Ready", "Working", "Shipped", "Stuck"))
    number = fake.add_issue("Say hi", "Just say hi.")
    fake.add_project_item(project, number, status="Ready")
    fake.add_project_item(project, draft="a draft", status="Ready")
    fixture = REPO / "fixtures" / "claude" / "success.json"
    fake_vendor.register("claude", stdout=fixture, exit_code=0, occurrences=1)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_API_URL", fake.url)
    config = tmp_path / "board-config.json"
    settings = {"eligible": ["Ready"], "terminal": ["Shipped"], "done": "Shipped"}
    config.write_text(json.dumps({"github_project": {**settings, "failed": "Stuck"}}))
    db = str(tmp_path / "ledger.db")
    argv = ["dispatch", "--board", "github-project:acme/1", "--db", db, "--adapter", "claude"]
    assert main([*argv, "--board-config", str(config), "--once"], start=fake_vendor.start) == 0
    assert fake.status_of(project, number) == "Shipped"
    assert len(fake.status_comments(number)) == 1
    status = ["status", "--board", "github-project:acme/1", "--db", db, "--json"]
    assert main([*status, "--board-config", str(config)]) == 0


def test_a_secondary_limit_on_graphql_parks_the_trackers_lane(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    from execkit._errors import LaneWaiting
    from execkit._lanes import LaneState

    project = fake.add_project()
    fake.add_project_item(project, fake.add_issue("one"))
    board = _board(fake, ledger)
    board.list_candidates()
    fake.fail_next.append((403, {"retry-after": "120"}))
    with pytest.raises(ExecKitError):
        board.list_candidates()
    assert ledger.get_lane(board.lane).state is LaneState.PARKED
    before = fake.requests
    with pytest.raises(LaneWaiting):
        board.list_candidates()
    assert fake.requests == before  # nothing is sent while it waits


def test_a_rate_limited_graphql_answer_parks_the_lane_until_its_reset(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    from execkit._lanes import LaneState

    project = fake.add_project()
    fake.add_project_item(project, fake.add_issue("one"))
    board = _board(fake, ledger)
    fake.graphql_rate_limited = 1
    with pytest.raises(ExecKitError):
        board.list_candidates()
    shown = ledger.get_lane(board.lane)
    assert shown.state is LaneState.PARKED
    assert shown.opens_at is not None and shown.opens_at >= fake.reset_at
