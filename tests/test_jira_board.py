"""A Jira project as a board (issue #48), against a loopback fake Jira (tests/jira_fake.py):
issues move by transition (a claim to a status of category `indeterminate`, done to
`done`); a `Blocks` link holds an issue until its blocker is done; the status comment is in
Atlassian Document Format, one per issue; the description's ADF is the prompt's text; Jira
Cloud's email and token and a Data Center personal access token both authenticate; bad
settings are named; `execkit dispatch --board jira:ENG` runs an issue. The shared scenarios
are in tests/test_tracker_conformance.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO
from jira_fake import EMAIL, TOKEN, FakeJira

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
from execkit.dispatch._jira import HELD, JiraBoard, JiraConfig, credentials_from
from execkit.ledger import Ledger, open_ledger


@pytest.fixture
def fake() -> Iterator[FakeJira]:
    jira = FakeJira()
    try:
        yield jira
    finally:
        jira.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = open_ledger(tmp_path / "ledger.db")
    try:
        yield opened
    finally:
        opened.close()


def _board(fake: FakeJira, ledger: Ledger, env: dict[str, str] | None = None) -> JiraBoard:
    config = JiraConfig.parse("ENG", {"url": fake.url, "failed": "Won't Do"}, {})
    token, authorization = credentials_from(env or {"JIRA_EMAIL": EMAIL, "JIRA_API_TOKEN": TOKEN})
    return JiraBoard(config, ledger, token, authorization, retry_base_s=0.01)


class Scripted:
    def __init__(self, outcome: RunOutcome, during: Any = None) -> None:
        self.outcome = outcome
        self.during = during
        self.calls: list[tuple[str, int]] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append((issue.id, slot.attempt))
        if self.during is not None:
            self.during()
        return self.outcome


def _dispatcher(board: JiraBoard, ledger: Ledger, runner: Scripted) -> Dispatcher:
    config = DispatchConfig(done_state="done", failed_state="Won't Do")
    return Dispatcher(board, runner, ledger, config, executor=InlineExecutor())


def test_moves_are_transitions_and_the_comment_is_adf(fake: FakeJira, ledger: Ledger) -> None:
    key = fake.add_issue("Fix the parser", "It fails on empty input.")
    fake.add_issue("not ours", labels=("bug",))
    board = _board(fake, ledger)
    [card] = board.list_candidates()
    assert card.prompt == "Fix the parser\n\nIt fails on empty input."  # ADF to text
    seen: list[str] = []

    def during() -> None:
        board.catch_up()
        seen.append(fake.status_of(key))

    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED), during)
    [event] = _dispatcher(board, ledger, runner).tick()
    assert event.moved_to == "done" and seen == ["In Progress"]
    assert fake.status_of(key) == "Done"
    [comment] = fake.comments[key]
    assert comment["body"]["type"] == "doc" and comment["body"]["version"] == 1
    [text] = fake.status_comments(key)
    assert "attempt 1" in text and "succeeded" in text


def test_a_blocks_link_holds_an_issue_until_its_blocker_is_done(
    fake: FakeJira, ledger: Ledger
) -> None:
    blocker = fake.add_issue("Migrate the schema", labels=())
    blocked = fake.add_issue("Use the new column")
    fake.block(blocker, blocked)
    board = _board(fake, ledger)
    assert board.list_candidates() == []
    [card] = board.list_issues()
    assert card.state == HELD
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    assert _dispatcher(board, ledger, runner).tick() == [] and runner.calls == []
    fake.set_status(blocker, "Done")
    [card] = board.list_candidates()
    assert card.id == blocked


def test_a_personal_access_token_authenticates_as_bearer(fake: FakeJira, ledger: Ledger) -> None:
    fake.add_issue("one")
    board = _board(fake, ledger, env={"JIRA_API_TOKEN": TOKEN})
    assert len(board.list_candidates()) == 1


@pytest.mark.parametrize(
    "project,settings,env,field",
    [
        ("eng", {}, {"JIRA_URL": "https://x"}, "board"),
        ("ENG", {}, {}, "jira.url"),
        ("ENG", {"colour": 1}, {"JIRA_URL": "https://x"}, "jira"),
        ("ENG", {"jql": ""}, {"JIRA_URL": "https://x"}, "jira.jql"),
        ("ENG", {"eligible": []}, {"JIRA_URL": "https://x"}, "jira.eligible"),
        ("ENG", {"done": "new"}, {"JIRA_URL": "https://x"}, "jira.eligible"),
    ],
)
def test_a_bad_setting_is_named(
    project: str, settings: dict[str, Any], env: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        JiraConfig.parse(project, settings, env)
    assert refused.value.field == field


def test_credentials_are_required(ledger: Ledger) -> None:
    with pytest.raises(InvalidInput) as refused:
        JiraBoard.from_env("ENG", ledger, {"JIRA_URL": "https://x"})
    assert refused.value.field == "JIRA_API_TOKEN"


def test_execkit_dispatch_takes_a_jira_board(
    fake: FakeJira, tmp_path: Path, fake_vendor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from execkit.cli import main

    key = fake.add_issue("Say hi", "Just say hi.")
    fixture = REPO / "fixtures" / "claude" / "success.json"
    fake_vendor.register("claude", stdout=fixture, exit_code=0, occurrences=1)
    monkeypatch.setenv("JIRA_URL", fake.url)
    monkeypatch.setenv("JIRA_EMAIL", EMAIL)
    monkeypatch.setenv("JIRA_API_TOKEN", TOKEN)
    db = str(tmp_path / "ledger.db")
    argv = ["dispatch", "--board", "jira:ENG", "--db", db, "--adapter", "claude"]
    assert main([*argv, "--once"], start=fake_vendor.start) == 0
    assert fake.status_of(key) == "Done"
    [text] = fake.status_comments(key)
    assert "succeeded" in text
    monkeypatch.delenv("JIRA_API_TOKEN")
    assert main([*argv, "--once"], start=fake_vendor.start) == 3  # no token: named


def test_an_idle_poll_of_2000_issues_is_one_search(fake: FakeJira, ledger: Ledger) -> None:
    for n in range(2000):
        fake.add_issue(f"issue {n}", labels=("execkit",) if n % 2 else ("bug",))
    board = _board(fake, ledger)
    before = fake.requests
    assert len(board.list_candidates()) == 1000
    assert fake.requests - before == 10  # the board's issues, 100 a search
    before = fake.requests
    for _ in range(5):
        assert len(board.list_candidates()) == 1000  # the newest minute read again
    assert fake.requests - before == 5
    fake.add_issue("a new one")
    assert len(board.list_candidates()) == 1001


def test_the_fake_answers_in_the_descriptions_shapes(fake: FakeJira) -> None:
    """What the fake sends validates against Atlassian's published OpenAPI description (the
    part of it in tests/jira_openapi_part.json): an issue (with a `Blocks` link), its
    transitions, a page of comments and a comment. The check can fail: a field the
    description does not have is refused where its schema is closed."""
    import base64
    import json

    from jsonschema import Draft202012Validator  # type: ignore[import-untyped, unused-ignore]

    part = json.loads((Path(__file__).parent / "jira_openapi_part.json").read_text())

    def check(name: str, value: Any) -> list[str]:
        schema = {**part, "$ref": f"#/components/schemas/{name}"}
        return [e.message for e in Draft202012Validator(schema).iter_errors(value)]

    blocker = fake.add_issue("first")
    key = fake.add_issue("second", "body")
    fake.block(blocker, key)
    auth = {"authorization": "Basic " + base64.b64encode(f"{EMAIL}:{TOKEN}".encode()).decode()}
    body = json.dumps({"body": {"type": "doc", "version": 1, "content": []}}).encode()
    _s, _h, comment = fake.answer("POST", f"/rest/api/3/issue/{key}/comment", auth, body)
    assert check("Comment", comment) == []
    _s, _h, page = fake.answer("GET", f"/rest/api/3/issue/{key}/comment", auth, b"")
    assert check("PageOfComments", page) == []
    _s, _h, transitions = fake.answer("GET", f"/rest/api/3/issue/{key}/transitions", auth, b"")
    assert check("Transitions", transitions) == []
    issue = fake._view(fake.issues[key])
    assert check("IssueBean", issue) == []
    [link] = issue["fields"]["issuelinks"]
    # `IssueLink` is also the create request's body, which needs both sides; an issue's
    # links carry one side each: each part is checked against its own schema.
    assert check("IssueLinkType", link["type"]) == []
    assert check("LinkedIssue", link["inwardIssue"]) == []
    assert check("StatusDetails", issue["fields"]["status"]) == []
    assert check("IssueLinkType", {**link["type"], "colour": "red"}) != []
