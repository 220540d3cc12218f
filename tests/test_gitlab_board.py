"""A GitLab project as a board (issue #48), against a loopback fake GitLab
(tests/gitlab_fake.py, shapes from GitLab's published API description): scoped labels are
the columns and a claim shows as `execkit::running`; eligible to done moves the labels and
leaves one status note; an idle poll is one request answered 304 (the ETag of the last
answer); a 429 parks the tracker's lane until `RateLimit-Reset`, a 401 stops it; bad
settings are named; `execkit dispatch --board gitlab:GROUP/PROJECT` runs an issue. The
shared scenarios are in tests/test_tracker_conformance.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO
from gitlab_fake import TOKEN, FakeGitLab

from execkit._errors import ExecKitError, InvalidInput, LaneWaiting
from execkit._lanes import LaneState
from execkit._proof import RunStatus
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
)
from execkit.dispatch._gitlab import GitLabBoard, GitLabConfig
from execkit.ledger import Ledger, open_ledger


@pytest.fixture
def fake() -> Iterator[FakeGitLab]:
    gitlab = FakeGitLab()
    try:
        yield gitlab
    finally:
        gitlab.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = open_ledger(tmp_path / "ledger.db")
    try:
        yield opened
    finally:
        opened.close()


def _board(fake: FakeGitLab, ledger: Ledger, **settings: Any) -> GitLabBoard:
    config = GitLabConfig.parse("acme/widgets", {"url": fake.url, **settings}, {})
    return GitLabBoard(config, ledger, TOKEN, retry_base_s=0.01)


class Scripted:
    def __init__(self, outcome: RunOutcome) -> None:
        self.outcome = outcome
        self.calls: list[tuple[str, int]] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append((issue.id, slot.attempt))
        return self.outcome


def test_eligible_to_done_moves_the_scoped_labels_and_leaves_one_note(
    fake: FakeGitLab, ledger: Ledger
) -> None:
    iid = fake.add_issue("Fix the parser", "It fails on empty input.")
    fake.add_issue("not ours", labels=("bug",))
    board = _board(fake, ledger)
    seen: list[set[str]] = []

    class Watching(Scripted):
        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            board.catch_up()
            seen.append(fake.labels_of(iid))
            return super().run(issue, slot)

    runner = Watching(RunOutcome(RunStatus.SUCCEEDED))
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), executor=InlineExecutor())
    before = fake.requests
    [event] = dispatcher.tick()
    assert event.moved_to == "done" and runner.calls == [("acme/widgets#1", 1)]
    assert seen == [{"execkit", "execkit::running"}]
    assert fake.labels_of(iid) == {"execkit::done"}
    assert fake.issues[iid]["state"] == "opened"  # closing is the merge request's job
    [note] = fake.status_notes(iid)
    assert "attempt 1" in note["body"] and "succeeded" in note["body"]
    assert fake.requests - before <= 6
    assert dispatcher.tick() == []


def test_close_on_done_closes_the_issue(fake: FakeGitLab, ledger: Ledger) -> None:
    iid = fake.add_issue("Close me")
    board = _board(fake, ledger, close_on_done=True)
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    Dispatcher(board, runner, ledger, DispatchConfig(), executor=InlineExecutor()).tick()
    assert fake.issues[iid]["state"] == "closed"


def test_an_idle_poll_is_one_request_answered_304(fake: FakeGitLab, ledger: Ledger) -> None:
    for n in range(2000):
        fake.add_issue(f"issue {n}", labels=("execkit",) if n % 2 else ("bug",))
    board = _board(fake, ledger)
    assert len(board.list_candidates()) == 1000
    board.list_candidates()  # the ETag of this request is learnt
    before, not_modified = fake.requests, fake.not_modified
    for _ in range(5):
        assert len(board.list_candidates()) == 1000
    assert fake.requests - before == 5 and fake.not_modified - not_modified == 5
    fake.add_issue("a new one")
    assert len(board.list_candidates()) == 1001


def test_a_429_parks_the_lane_until_ratelimit_reset(fake: FakeGitLab, ledger: Ledger) -> None:
    fake.add_issue("one")
    board = _board(fake, ledger)
    board.list_candidates()
    fake.rate_limited = 1
    with pytest.raises(ExecKitError):
        board.list_candidates()
    shown = ledger.get_lane(board.lane)
    assert shown.state is LaneState.PARKED and shown.opens_at is not None
    assert shown.opens_at >= fake.reset_at
    with pytest.raises(LaneWaiting):
        board.list_candidates()


@pytest.mark.parametrize(
    "project,settings,field",
    [
        ("acme", {}, "board"),
        ("acme/widgets", {"colour": 1}, "gitlab"),
        ("acme/widgets", {"labels": {"done": "a,b"}}, "gitlab.labels.done"),
        ("acme/widgets", {"labels": {"done": "execkit"}}, "gitlab.labels"),
        ("acme/widgets", {"labels": {"todo": "x"}}, "gitlab.labels"),
        ("acme/widgets", {"close_on_done": "yes"}, "gitlab.close_on_done"),
        ("acme/widgets", {"url": "ftp://x"}, "gitlab.url"),
    ],
)
def test_a_bad_setting_is_named(project: str, settings: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        GitLabConfig.parse(project, settings, {})
    assert refused.value.field == field


def test_subgroups_are_projects_too_and_the_token_is_required(ledger: Ledger) -> None:
    assert (
        GitLabConfig.parse("acme/platform/widgets", {}, {}).name == "gitlab:acme/platform/widgets"
    )
    with pytest.raises(InvalidInput) as refused:
        GitLabBoard.from_env("acme/widgets", ledger, {})
    assert refused.value.field == "GITLAB_TOKEN"


def test_execkit_dispatch_takes_a_gitlab_board(
    fake: FakeGitLab, tmp_path: Path, fake_vendor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from execkit.cli import main

    iid = fake.add_issue("Say hi", "Just say hi.")
    fixture = REPO / "fixtures" / "claude" / "success.json"
    fake_vendor.register("claude", stdout=fixture, exit_code=0, occurrences=1)
    monkeypatch.setenv("GITLAB_TOKEN", TOKEN)
    monkeypatch.setenv("GITLAB_URL", fake.url)
    db = str(tmp_path / "ledger.db")
    argv = ["dispatch", "--board", "gitlab:acme/widgets", "--db", db, "--adapter", "claude"]
    assert main([*argv, "--once"], start=fake_vendor.start) == 0
    assert fake.labels_of(iid) == {"execkit::done"}
    [note] = fake.status_notes(iid)
    assert "succeeded" in note["body"]
    monkeypatch.delenv("GITLAB_TOKEN")
    assert main([*argv, "--once"], start=fake_vendor.start) == 3  # no token: named


def test_the_fake_answers_in_gitlabs_published_shapes(fake: FakeGitLab) -> None:
    """An issue and a note the fake sends validate against GitLab's published JSON schemas
    of those answers (tests/gitlab_api_schemas.json); a note with a member GitLab's schema
    does not have is refused (the check can fail)."""
    import json

    from jsonschema import Draft202012Validator  # type: ignore[import-untyped, unused-ignore]

    schemas = json.loads((Path(__file__).parent / "gitlab_api_schemas.json").read_text())

    def errors(name: str, value: Any) -> list[str]:
        return [e.message for e in Draft202012Validator(schemas[name]).iter_errors(value)]

    iid = fake.add_issue("t", "b")
    auth = {"private-token": TOKEN}
    _s, _h, issues = fake.answer("GET", "/api/v4/projects/acme%2Fwidgets/issues", auth, b"")
    assert [errors("issue", issue) for issue in issues] == [[]]
    body = json.dumps({"body": "hi"}).encode()
    path = f"/api/v4/projects/acme%2Fwidgets/issues/{iid}/notes"
    _s, _h, note = fake.answer("POST", path, auth, body)
    assert errors("note", note) == []
    assert errors("note", {**note, "colour": "red"}) != []
