"""A Linear team as a board (issue #48), against a loopback fake Linear (tests/linear_fake.py)
whose documents run against a part of Linear's published GraphQL schema: the board's
documents are valid there; workflow states by name or type; a claim moves the issue to the
team's first started state and a retry puts it back; done and given-up issues move to the
completed and canceled states with one status comment; an idle poll of 2,000 issues is one
request; RATELIMITED parks the tracker's lane until Linear's reset, a refused key stops it;
and `execkit dispatch --board linear:ENG` runs an issue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO
from linear_fake import KEY, FakeLinear

from execkit._classify import FailureClass
from execkit._errors import ExecKitError, InvalidInput, LaneStopped, LaneWaiting
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
from execkit.dispatch._linear import (
    COMMENT_CREATE,
    COMMENT_UPDATE,
    COMMENTS_QUERY,
    ISSUES_QUERY,
    MOVE_MUTATION,
    TEAM_QUERY,
    LinearBoard,
    LinearConfig,
    linear_lane,
)
from execkit.dispatch._tracker import STATUS_MARKER
from execkit.ledger import Ledger, open_ledger

SECRET = "sk-ant-api03-" + "y" * 40


@pytest.fixture
def fake() -> Iterator[FakeLinear]:
    linear = FakeLinear()
    try:
        yield linear
    finally:
        linear.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = open_ledger(tmp_path / "ledger.db")
    try:
        yield opened
    finally:
        opened.close()


def _board(fake: FakeLinear, ledger: Ledger, key: str = KEY, **settings: Any) -> LinearBoard:
    config = LinearConfig.parse("ENG", {"api_url": fake.url, **settings}, {})
    return LinearBoard(config, ledger, key, retry_base_s=0.01)


class Scripted:
    def __init__(self, *outcomes: RunOutcome) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, int]] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append((issue.id, slot.attempt))
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


def _dispatcher(board: LinearBoard, ledger: Ledger, runner: Any, **config: Any) -> Dispatcher:
    states = board.config.dispatch_states()
    settings = {
        "failed_state": None if states["failed_state"] == "none" else states["failed_state"]
    }
    dispatch = DispatchConfig(done_state=states["done_state"], **{**settings, **config})
    return Dispatcher(board, runner, ledger, dispatch, executor=InlineExecutor())


def _status_comments(fake: FakeLinear, identifier: str) -> list[dict[str, Any]]:
    return [c for c in fake.comments[identifier] if c["body"].startswith(STATUS_MARKER)]


def test_every_document_is_valid_against_linears_schema() -> None:
    """The board's documents validate against the part of Linear's published schema the
    fake runs (a renamed field or a wrong argument type fails here, not in production)."""
    from graphql import build_schema, parse, validate

    schema = build_schema((Path(__file__).parent / "linear_graphql.graphql").read_text())
    for document in (
        TEAM_QUERY,
        ISSUES_QUERY,
        MOVE_MUTATION,
        COMMENTS_QUERY,
        COMMENT_CREATE,
        COMMENT_UPDATE,
    ):
        assert validate(schema, parse(document)) == [], document
    # The check can fail: a field Linear does not have is refused.
    assert validate(schema, parse("{ issues { nodes { status } } }")) != []


def test_eligible_to_done_shows_the_claim_then_moves_to_completed(
    fake: FakeLinear, ledger: Ledger
) -> None:
    issue = fake.add_issue("Fix the parser", "It fails on empty input.")
    fake.add_issue("not ours", labels=("bug",))
    fake.add_issue("in the backlog", state="Backlog")
    board = _board(fake, ledger)
    seen: list[str] = []

    class Watching(Scripted):
        def run(self, card: BoardIssue, slot: Slot) -> RunOutcome:
            board.catch_up()  # what a pass sends while the agent runs
            seen.append(fake.state_of(issue))
            return super().run(card, slot)

    runner = Watching(RunOutcome(RunStatus.SUCCEEDED))
    dispatcher = _dispatcher(board, ledger, runner)
    before = fake.requests
    events = dispatcher.tick()
    assert [(e.kind, e.moved_to) for e in events] == [("dispatched", "completed")]
    assert runner.calls == [(issue, 1)]
    assert seen == ["In Progress"]  # the team's first started state
    assert fake.state_of(issue) == "Done"
    [comment] = _status_comments(fake, issue)
    assert "attempt 1" in comment["body"] and "succeeded" in comment["body"]
    assert fake.requests - before <= 8  # team, issues, claim, comment, move, edit
    assert dispatcher.tick() == []


def test_a_retry_puts_the_issue_back_where_it_was_taken_from(
    fake: FakeLinear, ledger: Ledger
) -> None:
    issue = fake.add_issue("Flaky")
    board = _board(fake, ledger)
    failed = RunOutcome(RunStatus.FAILED, failure_class=FailureClass.WORK, reason="tests fail")
    dispatcher = _dispatcher(board, ledger, Scripted(failed), base_backoff_s=0.01)
    [event] = dispatcher.tick()
    assert event.moved_to is None
    board.catch_up()
    assert fake.state_of(issue) == "Todo"  # eligible again for the retry
    assert len(_status_comments(fake, issue)) == 1


def test_a_give_up_moves_to_canceled_with_the_fix_and_no_secret(
    fake: FakeLinear, ledger: Ledger
) -> None:
    issue = fake.add_issue("Needs a key")
    board = _board(fake, ledger)
    broken = RunOutcome(
        RunStatus.FAILED,
        failure_class=FailureClass.ENVIRONMENT,
        reason="credentials refused",
        precondition=f"set ANTHROPIC_API_KEY (was {SECRET})",
    )
    [event] = _dispatcher(board, ledger, Scripted(broken)).tick()
    assert event.moved_to == "canceled"
    assert fake.state_of(issue) == "Canceled"
    [comment] = _status_comments(fake, issue)
    assert "environment" in comment["body"] and "set ANTHROPIC_API_KEY" in comment["body"]
    assert SECRET not in str(fake.comments)


def test_states_by_name_resolve_to_the_named_workflow_states(
    fake: FakeLinear, ledger: Ledger
) -> None:
    issue = fake.add_issue("Review me")
    board = _board(fake, ledger, running="In Review", done="Done", failed=None)
    [card] = board.list_candidates()
    assert card.state == "unstarted"
    seen: list[str] = []

    class Watching(Scripted):
        def run(self, card: BoardIssue, slot: Slot) -> RunOutcome:
            board.catch_up()
            seen.append(fake.state_of(issue))
            return super().run(card, slot)

    _dispatcher(board, ledger, Watching(RunOutcome(RunStatus.SUCCEEDED))).tick()
    assert seen == ["In Review"] and fake.state_of(issue) == "Done"


def test_a_state_the_team_does_not_have_is_named(fake: FakeLinear, ledger: Ledger) -> None:
    fake.add_issue("x")
    with pytest.raises(InvalidInput) as refused:
        _board(fake, ledger, done="Shipped").list_candidates()
    assert refused.value.field == "linear.done" and "Shipped" in str(refused.value)


@pytest.mark.parametrize(
    "settings,field",
    [
        ({"colour": 1}, "linear"),
        ({"eligible": []}, "linear.eligible"),
        ({"eligible": ["completed"]}, "linear.eligible"),
        ({"done": ""}, "linear.done"),
        ({"label": 3}, "linear.label"),
        ({"api_url": "ftp://x"}, "linear.api_url"),
        ({"done": "started"}, "linear.eligible"),
    ],
)
def test_a_bad_setting_is_named(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        LinearConfig.parse("ENG", settings, {})
    assert refused.value.field == field


def test_a_bad_team_key_and_a_missing_key_are_named(ledger: Ledger) -> None:
    with pytest.raises(InvalidInput) as refused:
        LinearBoard.from_env("no spaces", ledger, {"LINEAR_API_KEY": KEY})
    assert refused.value.field == "board"
    with pytest.raises(InvalidInput) as refused:
        LinearBoard.from_env("ENG", ledger, {})
    assert refused.value.field == "LINEAR_API_KEY"


def test_an_idle_poll_of_2000_issues_is_one_request(fake: FakeLinear, ledger: Ledger) -> None:
    for n in range(2000):
        fake.add_issue(f"issue {n}", labels=("execkit",) if n % 2 else ("bug",))
    board = _board(fake, ledger)
    before = fake.requests
    assert len(board.list_candidates()) == 1000
    assert fake.requests - before == 1 + 40  # the team, then 40 pages of 50
    before = fake.requests
    for _ in range(5):
        assert len(board.list_candidates()) == 1000
    assert fake.requests - before == 5
    fake.add_issue("a new one")
    assert len(board.list_candidates()) == 1001


def test_ratelimited_parks_the_lane_until_linears_reset(fake: FakeLinear, ledger: Ledger) -> None:
    fake.add_issue("one")
    board = _board(fake, ledger)
    board.list_candidates()
    fake.rate_limited = 1
    with pytest.raises(ExecKitError):
        board.list_candidates()
    shown = ledger.get_lane(board.lane)
    assert shown.state is LaneState.PARKED
    assert shown.opens_at is not None and shown.opens_at >= fake.reset_ms / 1000
    before = fake.requests
    with pytest.raises(LaneWaiting):
        board.list_candidates()
    with pytest.raises(LaneWaiting):
        board.catch_up()
    assert fake.requests == before


def test_a_spent_request_budget_parks_the_lane_even_on_a_success(
    fake: FakeLinear, ledger: Ledger
) -> None:
    fake.add_issue("one")
    board = _board(fake, ledger)
    fake.remaining = 2  # the team, then the issues: the budget's last request
    board.list_candidates()
    assert ledger.get_lane(board.lane).state is LaneState.PARKED


def test_a_refused_key_stops_the_lane_naming_the_fix(fake: FakeLinear, ledger: Ledger) -> None:
    fake.add_issue("one")
    board = _board(fake, ledger, key="lin_api_revoked")
    with pytest.raises(LaneStopped) as stopped:
        board.list_candidates()
    assert stopped.value.lane == linear_lane("lin_api_revoked", ledger.ledger_id())
    assert "LINEAR_API_KEY" in (stopped.value.fix or "")
    assert "lin_api_revoked" not in str(ledger.get_lane(board.lane).to_dict())


def test_execkit_dispatch_takes_a_linear_board(
    fake: FakeLinear, tmp_path: Path, fake_vendor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`execkit dispatch --board linear:ENG`: the key and the API from the environment, the
    done and failed states from the board's configuration."""
    from execkit.cli import main

    issue = fake.add_issue("Say hi", "Just say hi.")
    fixture = REPO / "fixtures" / "claude" / "success.json"
    fake_vendor.register("claude", stdout=fixture, exit_code=0, occurrences=1)
    monkeypatch.setenv("LINEAR_API_KEY", KEY)
    monkeypatch.setenv("LINEAR_API_URL", fake.url)
    db = str(tmp_path / "ledger.db")
    argv = ["dispatch", "--board", "linear:ENG", "--db", db, "--adapter", "claude"]
    assert main([*argv, "--once"], start=fake_vendor.start) == 0
    assert fake.state_of(issue) == "Done"
    [comment] = _status_comments(fake, issue)
    assert "succeeded" in comment["body"]
    monkeypatch.delenv("LINEAR_API_KEY")
    assert main([*argv, "--once"], start=fake_vendor.start) == 3  # no key: named


def test_execkit_status_reads_a_linear_board_read_only(
    fake: FakeLinear,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from execkit.cli import main

    done = fake.add_issue("Done one")
    fake.add_issue("not ours", labels=("bug",))
    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        board = _board(fake, ledger)
        _dispatcher(board, ledger, Scripted(RunOutcome(RunStatus.SUCCEEDED))).tick()
    waiting = fake.add_issue("Waiting one")
    monkeypatch.setenv("LINEAR_API_KEY", KEY)
    monkeypatch.setenv("LINEAR_API_URL", fake.url)
    capsys.readouterr()
    writes = fake.writes
    argv = ["status", "--board", "linear:ENG", "--db", str(db), "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["issues"]
    assert {row["issue_id"]: row["board_state"] for row in rows} == {
        done: "completed",
        waiting: "unstarted",
    }
    assert fake.writes == writes  # read only


def test_a_given_up_issue_moved_back_by_a_person_is_a_forced_retry(
    fake: FakeLinear, ledger: Ledger
) -> None:
    issue = fake.add_issue("Needs a key")
    board = _board(fake, ledger)
    broken = RunOutcome(
        RunStatus.FAILED, failure_class=FailureClass.ENVIRONMENT, reason="credentials refused"
    )

    seen: list[str] = []

    class Then(Scripted):
        def run(self, card: BoardIssue, slot: Slot) -> RunOutcome:
            self.calls.append((card.id, slot.attempt))
            board.catch_up()  # the claim shows
            seen.append(fake.state_of(issue))
            return broken if slot.attempt == 1 else RunOutcome(RunStatus.SUCCEEDED)

    dispatcher = _dispatcher(board, ledger, Then(broken))
    [event] = dispatcher.tick()
    assert event.moved_to == "canceled" and fake.state_of(issue) == "Canceled"
    fake.set_state(issue, "Todo")  # the operator fixed it
    [again] = dispatcher.tick()
    assert (again.kind, again.moved_to, again.attempt) == ("dispatched", "completed", 2)
    assert fake.state_of(issue) == "Done"
    # The second claim shows from where the person put the card, not the first run's move.
    assert seen == ["In Progress", "In Progress"]
    assert len(_status_comments(fake, issue)) == 1
