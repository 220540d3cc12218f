"""GitHub boards, what issue #47 left after its first part (against the loopback fake,
tests/github_fake.py): a board configuration file (labels, comments in the prompt, close on
done), validated key by key; the issue's comments in the prompt, masked and bounded; an
issue closed while its run is in flight (the run is recorded, the closed issue is left
alone, a reopened one gets one forced retry); and `execkit status --board github:...`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO
from github_fake import TOKEN, FakeGitHub

from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit._proof import RunStatus
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
)
from execkit.dispatch._github import GitHubBoard, GitHubConfig, read_board_config
from execkit.ledger import Ledger, open_ledger

pytest.importorskip("githubkit")

SECRET = "sk-ant-api03-" + "x" * 40


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


def _board(fake: FakeGitHub, ledger: Ledger, **settings: Any) -> GitHubBoard:
    config = GitHubConfig.from_mapping("acme/widgets", settings, {"GITHUB_API_URL": fake.url})
    return GitHubBoard(config, ledger, TOKEN, retry_base_s=0.01)


class Scripted:
    """A runner whose outcomes are given in order (the last one repeats); `during` runs
    while the agent works."""

    def __init__(self, *outcomes: RunOutcome, during: Any = None) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, int]] = []
        self.prompts: list[str] = []
        self.during = during

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append((issue.id, slot.attempt))
        self.prompts.append(issue.prompt)
        if self.during is not None:
            self.during()
            self.during = None
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


def _dispatcher(board: GitHubBoard, ledger: Ledger, runner: Scripted) -> Dispatcher:
    return Dispatcher(board, runner, ledger, DispatchConfig(), executor=InlineExecutor())


# -- 1. the board configuration -----------------------------------------------------------


def test_the_configured_labels_are_the_columns(fake: FakeGitHub, ledger: Ledger) -> None:
    labels = {"eligible": "agent", "running": "agent/busy", "done": "agent/ok"}
    number = fake.add_issue("Fix it", labels=("agent",))
    fake.add_issue("default label, not ours here")  # labelled `execkit`
    board = _board(fake, ledger, labels=labels, close_on_done=True)
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    [event] = _dispatcher(board, ledger, runner).tick()
    assert (event.kind, event.moved_to) == ("dispatched", "done")
    assert runner.calls == [("acme/widgets#1", 1)]
    assert fake.labels_of(number) == {"agent/ok"}
    assert fake.issues[number]["state"] == "closed"  # close_on_done
    assert fake.labels_of(2) == {"execkit"}


@pytest.mark.parametrize(
    "settings,field",
    [
        ({"labels": {"done": ""}}, "github.labels.done"),
        ({"labels": {"eligible": "a,b"}}, "github.labels.eligible"),
        ({"labels": {"running": "x" * 51}}, "github.labels.running"),
        ({"labels": {"finished": "x"}}, "github.labels"),
        ({"labels": ["x"]}, "github.labels"),
        ({"labels": {"done": "execkit"}}, "github.labels"),  # two states, one label
        ({"close_on_done": "yes"}, "github.close_on_done"),
        ({"comments": 1}, "github.comments"),
        ({"comments_max_chars": 0}, "github.comments_max_chars"),
        ({"comments_max_chars": 10**9}, "github.comments_max_chars"),
        ({"comments_max_chars": 10.0}, "github.comments_max_chars"),
        ({"api_url": "ftp://example"}, "github.api_url"),
        ({"colour": "red"}, "github"),
    ],
)
def test_a_bad_setting_is_one_error_naming_its_key(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        GitHubConfig.from_mapping("acme/widgets", settings, {})
    assert refused.value.field == field


@pytest.mark.parametrize(
    "text,field",
    [
        ("not json", "board_config"),
        ("[]", "board_config"),
        ('{"github": [], "dispatch": {}}', "github"),
        ('{"asana": {}}', "board_config"),
    ],
)
def test_a_bad_config_file_is_refused_naming_it(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "board.json"
    path.write_text(text)
    with pytest.raises(InvalidInput) as refused:
        read_board_config(path)
    assert refused.value.field == field
    with pytest.raises(InvalidInput) as missing:
        read_board_config(tmp_path / "absent.json")
    assert missing.value.field == "board_config"


def test_execkit_dispatch_reads_the_board_config_file(
    fake: FakeGitHub, tmp_path: Path, fake_vendor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from execkit.cli import main

    number = fake.add_issue("Say hi", "Just say hi.", labels=("please",))
    fixture = REPO / "fixtures" / "claude" / "success.json"
    fake_vendor.register("claude", stdout=fixture, exit_code=0, occurrences=1)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    config = tmp_path / "board-config.json"
    config.write_text(
        json.dumps(
            {
                "github": {"api_url": fake.url, "labels": {"eligible": "please"}},
                "dispatch": {"default_adapter": "claude"},
            }
        )
    )
    db = str(tmp_path / "ledger.db")
    argv = ["dispatch", "--board", "github:acme/widgets", "--db", db, "--once"]
    assert main([*argv, "--board-config", str(config)], start=fake_vendor.start) == 0
    assert fake.labels_of(number) == {"execkit:done"}
    # A bad key: one error naming it, exit 3, nothing sent.
    config.write_text(json.dumps({"github": {"labels": {"done": ""}}}))
    before = fake.requests
    assert main([*argv, "--board-config", str(config)], start=fake_vendor.start) == 3
    assert fake.requests == before
    # A board file holds its own settings.
    board_file = tmp_path / "board.json"
    board_file.write_text('{"states": [{"name": "todo", "eligible": true}], "issues": []}')
    argv = ["dispatch", "--board", str(board_file), "--db", db, "--once"]
    assert main([*argv, "--board-config", str(config)], start=fake_vendor.start) == 3


# -- 2. comments in the prompt ------------------------------------------------------------


def test_the_comments_are_in_the_prompt_masked_and_bounded(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    number = fake.add_issue("Fix the parser", "It fails.")
    fake.comment_by_hand(number, "first: an old remark " + "o" * 300)
    fake.comment_by_hand(number, f"it needs the key {SECRET}")
    fake.comment_by_hand(number, "<!-- execkit:status -->\nattempt 1")  # ours: left out
    fake.comment_by_hand(number, "last: empty input is the case")
    plain = _board(fake, ledger).list_candidates()
    assert plain[0].prompt == "Fix the parser\n\nIt fails."  # off by default
    board = _board(fake, ledger, comments=True, comments_max_chars=200)
    [issue] = board.list_candidates()
    assert issue.prompt.startswith("Fix the parser\n\nIt fails.\n\n## Comments")
    assert "octocat wrote:\nlast: empty input is the case" in issue.prompt
    assert "it needs the key" in issue.prompt and SECRET not in issue.prompt
    assert "execkit:status" not in issue.prompt
    assert "(1 older comments left out)" in issue.prompt and "first:" not in issue.prompt
    tail = issue.prompt.split("## Comments", 1)[1]
    assert len(tail) <= 200 + 100  # the bound, with the masking and the headings
    # Read again only when the issue changed.
    before = fake.requests
    board.list_candidates()
    assert fake.requests - before == 1  # the poll, no comment read
    fake.comment_by_hand(number, "one more")
    [issue] = board.list_candidates()
    assert issue.prompt.endswith("one more")


def test_the_prompt_carries_the_comments_to_the_agent(fake: FakeGitHub, ledger: Ledger) -> None:
    number = fake.add_issue("Fix it")
    fake.comment_by_hand(number, "use the fast path")
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    _dispatcher(_board(fake, ledger, comments=True), ledger, runner).tick()
    assert runner.prompts == ["Fix it\n\n## Comments\n\noctocat wrote:\nuse the fast path"]


# -- 3. closed or reopened while its run is in flight -------------------------------------


def test_an_issue_closed_in_flight_is_left_alone_and_reopened_retried_once(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    number = fake.add_issue("Needs a key")
    board = _board(fake, ledger)
    broken = RunOutcome(
        RunStatus.FAILED,
        failure_class=FailureClass.ENVIRONMENT,
        reason="credentials refused",
        precondition="set ANTHROPIC_API_KEY",
    )

    def close_while_running() -> None:
        board.catch_up()  # the claim is shown
        assert fake.labels_of(number) == {"execkit", "execkit:running"}
        fake.close_by_hand(number)
        board.list_candidates()  # a pass while the agent runs sees it closed

    runner = Scripted(broken, RunOutcome(RunStatus.SUCCEEDED), during=close_while_running)
    dispatcher = _dispatcher(board, ledger, runner)
    [event] = dispatcher.tick()
    # The run finished and is recorded; the closed issue was not moved, its claim is off.
    assert event.kind == "dispatched" and event.failure_class == "environment"
    [task] = ledger.list_tasks()
    assert ledger.get_task(task.id).attempts_started == 1
    assert fake.issues[number]["state"] == "closed"
    assert fake.labels_of(number) == {"execkit"}
    [comment] = fake.status_comments(number)
    assert "environment" in comment["body"]
    assert ledger.outbox_entries(board.name, pending=True) == []
    # Closed: nothing runs it again.
    assert dispatcher.tick() == [] and dispatcher.tick() == []
    assert len(runner.calls) == 1
    # Reopened, labelled `execkit`: one forced retry, then done.
    fake.reopen_by_hand(number, {"execkit"})
    [again] = dispatcher.tick()
    assert (again.kind, again.moved_to, again.attempt) == ("dispatched", "done", 2)
    assert fake.labels_of(number) == {"execkit:done"}
    assert len(fake.status_comments(number)) == 1
    assert dispatcher.tick() == []
    assert len(runner.calls) == 2


def test_an_issue_closed_in_flight_that_succeeds_is_not_relabelled(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    number = fake.add_issue("Quick one")
    board = _board(fake, ledger)

    def close_while_running() -> None:
        fake.close_by_hand(number)
        board.list_candidates()

    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED), during=close_while_running)
    [event] = _dispatcher(board, ledger, runner).tick()
    assert event.kind == "dispatched"
    assert ledger.get_task(ledger.list_tasks()[0].id).status == "done"
    assert fake.labels_of(number) == {"execkit"}  # the running label off, no done label
    assert fake.issues[number]["state"] == "closed"


def test_a_claim_not_shown_before_the_issue_closed_is_never_shown(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    from execkit.dispatch import BoardReport

    number = fake.add_issue("Closed before the write-back")
    board = _board(fake, ledger)
    [issue] = board.list_candidates()
    board.report(issue.id, BoardReport(attempt=1, running=True, host="builder-1"))
    fake.close_by_hand(number)
    board.list_candidates()  # the pass that sends it has seen the issue closed
    board.catch_up()
    assert fake.labels_of(number) == {"execkit"}  # no running label on a closed issue
    [comment] = fake.status_comments(number)
    assert "running on `builder-1`" in comment["body"]


# -- 4. execkit status --board github:... -------------------------------------------------


def test_execkit_status_reads_a_github_board(
    fake: FakeGitHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from execkit.cli import main

    fake.add_issue("Done one")
    fake.add_issue("Waiting one")
    fake.add_issue("not ours", labels=("bug",))
    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        board = _board(fake, ledger)
        runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
        dispatcher = Dispatcher(
            board,
            runner,
            ledger,
            DispatchConfig(max_concurrent_agents=1),
            executor=InlineExecutor(),
        )
        dispatcher.tick()
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_API_URL", fake.url)
    capsys.readouterr()
    writes = fake.writes
    argv = ["status", "--board", "github:acme/widgets", "--db", str(db), "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["issues"]
    assert {row["issue_id"]: row["board_state"] for row in rows} == {
        "acme/widgets#1": "done",
        "acme/widgets#2": "done" if len(runner.calls) == 2 else "todo",
    }
    assert fake.writes == writes  # read only
    assert main(argv[:-1]) == 0
    assert "acme/widgets#1" in capsys.readouterr().out
