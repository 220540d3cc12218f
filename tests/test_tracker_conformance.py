"""The tracker contract, one suite for every tracker (issue #48): the same scenarios run
against each tracker's loopback fake (GitHub Issues: tests/github_fake.py; Linear:
tests/linear_fake.py; GitLab: tests/gitlab_fake.py; Jira: tests/jira_fake.py), so a further
tracker is a file, a fake and a `Kit` here.

Scenarios: a claim race between two dispatchers on one ledger (SQLite, PostgreSQL, through
`execkit serve`) runs the issue once with one status comment; a given-up issue a person
puts back is one forced retry, still one status comment, and stays eligible when that
retry fails again; an outage while a run ends
loses nothing and doubles nothing (the outbox replays it); the tracker's rate limit parks
its lane and nothing is sent while it waits; an expired credential stops the lane naming
the fix, the credential in no lane record; an idle poll of a board larger than a page is
one request; a hostile title (a credential, terminal escapes, the status marker) reaches the
tracker masked. No timing is asserted: every bound is a count."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from github_fake import TOKEN as GITHUB_TOKEN
from github_fake import FakeGitHub
from gitlab_fake import TOKEN as GITLAB_TOKEN
from gitlab_fake import FakeGitLab
from jira_fake import EMAIL as JIRA_EMAIL
from jira_fake import TOKEN as JIRA_TOKEN
from jira_fake import FakeJira
from linear_fake import KEY as LINEAR_KEY
from linear_fake import FakeLinear
from test_remote import Remote, remote  # noqa: F401 - the fixture

from execkit._classify import FailureClass
from execkit._errors import ExecKitError, LaneStopped, LaneWaiting
from execkit._lanes import LaneState
from execkit._proof import RunStatus
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
    TrackerBoard,
)
from execkit.dispatch._tracker import STATUS_MARKER
from execkit.ledger import Ledger, open_ledger

SECRET = "sk-ant-api03-" + "z" * 40


class Kit:
    """One tracker as the suite drives it: its fake, its board, and how to look."""

    name = ""
    token_variable = ""
    bad_token = ""
    marker = STATUS_MARKER  # how the tracker's status comment begins

    def close(self) -> None:
        raise NotImplementedError

    def board(self, ledger: Ledger, token: str | None = None) -> TrackerBoard:
        raise NotImplementedError

    def add(self, title: str, body: str = "") -> str:
        raise NotImplementedError

    def done(self, issue_id: str) -> bool:
        raise NotImplementedError

    def status_comments(self, issue_id: str) -> list[str]:
        raise NotImplementedError

    def everything_sent(self) -> str:
        raise NotImplementedError

    def outage(self, on: bool) -> None:
        raise NotImplementedError

    def put_back(self, issue_id: str) -> None:
        """A person makes a given-up issue eligible again."""
        raise NotImplementedError

    def rate_limit(self) -> None:
        raise NotImplementedError

    @property
    def requests(self) -> int:
        raise NotImplementedError

    def config(self, **options: Any) -> DispatchConfig:
        return DispatchConfig(**options)


class GitHubKit(Kit):
    name = "github"
    token_variable = "GITHUB_TOKEN"
    bad_token = "ghp_revoked_token_0123456789abcdefghijk"

    def __init__(self) -> None:
        self.fake = FakeGitHub()

    def close(self) -> None:
        self.fake.close()

    def board(self, ledger: Ledger, token: str | None = None) -> TrackerBoard:
        from execkit.dispatch._github import GitHubBoard, GitHubConfig

        config = GitHubConfig(repo="acme/widgets", api_url=self.fake.url)
        return GitHubBoard(config, ledger, token or GITHUB_TOKEN, retry_base_s=0.01)

    def add(self, title: str, body: str = "") -> str:
        return f"acme/widgets#{self.fake.add_issue(title, body)}"

    def _number(self, issue_id: str) -> int:
        return int(issue_id.rpartition("#")[2])

    def done(self, issue_id: str) -> bool:
        return self.fake.labels_of(self._number(issue_id)) == {"execkit:done"}

    def status_comments(self, issue_id: str) -> list[str]:
        return [str(c["body"]) for c in self.fake.status_comments(self._number(issue_id))]

    def everything_sent(self) -> str:
        return str(self.fake.comments) + str(self.fake.issues)

    def outage(self, on: bool) -> None:
        self.fake.fail_next[:] = [(502, {})] * 10_000 if on else []

    def put_back(self, issue_id: str) -> None:
        self.fake.set_labels_by_hand(self._number(issue_id), {"execkit", "execkit:blocked"})

    def rate_limit(self) -> None:
        self.fake.fail_next.append((429, {"retry-after": "30"}))

    @property
    def requests(self) -> int:
        return self.fake.requests


class LinearKit(Kit):
    name = "linear"
    token_variable = "LINEAR_API_KEY"
    bad_token = "lin_api_revoked0123456789abcdefghijklmnop"

    def __init__(self) -> None:
        self.fake = FakeLinear()

    def close(self) -> None:
        self.fake.close()

    def board(self, ledger: Ledger, token: str | None = None) -> TrackerBoard:
        from execkit.dispatch._linear import LinearBoard, LinearConfig

        config = LinearConfig(team="ENG", api_url=self.fake.url)
        return LinearBoard(config, ledger, token or LINEAR_KEY, retry_base_s=0.01)

    def add(self, title: str, body: str = "") -> str:
        return self.fake.add_issue(title, body)

    def done(self, issue_id: str) -> bool:
        return self.fake.state_of(issue_id) == "Done"

    def status_comments(self, issue_id: str) -> list[str]:
        return [
            str(c["body"])
            for c in self.fake.comments[issue_id]
            if c["body"].startswith(STATUS_MARKER)
        ]

    def everything_sent(self) -> str:
        return str(self.fake.comments) + str(self.fake.issues)

    def outage(self, on: bool) -> None:
        self.fake.fail_next[:] = [502] * 10_000 if on else []

    def put_back(self, issue_id: str) -> None:
        self.fake.set_state(issue_id, "Todo")

    def rate_limit(self) -> None:
        self.fake.rate_limited = 1

    @property
    def requests(self) -> int:
        return self.fake.requests

    def config(self, **options: Any) -> DispatchConfig:
        return DispatchConfig(done_state="completed", failed_state="canceled", **options)


class GitLabKit(Kit):
    name = "gitlab"
    token_variable = "GITLAB_TOKEN"
    bad_token = "glpat-revoked0123456789abcdef"

    def __init__(self) -> None:
        self.fake = FakeGitLab()

    def close(self) -> None:
        self.fake.close()

    def board(self, ledger: Ledger, token: str | None = None) -> TrackerBoard:
        from execkit.dispatch._gitlab import GitLabBoard, GitLabConfig

        config = GitLabConfig(project="acme/widgets", url=self.fake.url)
        return GitLabBoard(config, ledger, token or GITLAB_TOKEN, retry_base_s=0.01)

    def add(self, title: str, body: str = "") -> str:
        return f"acme/widgets#{self.fake.add_issue(title, body)}"

    def _iid(self, issue_id: str) -> int:
        return int(issue_id.rpartition("#")[2])

    def done(self, issue_id: str) -> bool:
        return self.fake.labels_of(self._iid(issue_id)) == {"execkit::done"}

    def status_comments(self, issue_id: str) -> list[str]:
        return [str(n["body"]) for n in self.fake.status_notes(self._iid(issue_id))]

    def everything_sent(self) -> str:
        return str(self.fake.notes) + str(self.fake.issues)

    def outage(self, on: bool) -> None:
        self.fake.fail_next[:] = [502] * 10_000 if on else []

    def put_back(self, issue_id: str) -> None:
        self.fake.set_labels_by_hand(self._iid(issue_id), {"execkit", "execkit::blocked"})

    def rate_limit(self) -> None:
        self.fake.rate_limited = 1

    @property
    def requests(self) -> int:
        return self.fake.requests


class JiraKit(Kit):
    name = "jira"
    token_variable = "JIRA_API_TOKEN"
    marker = "execkit status"  # ADF has no hidden text
    bad_token = "ATATT3xrevoked0123456789abcdef"

    def __init__(self) -> None:
        self.fake = FakeJira()

    def close(self) -> None:
        self.fake.close()

    def board(self, ledger: Ledger, token: str | None = None) -> TrackerBoard:
        from execkit.dispatch._jira import JiraBoard, JiraConfig, credentials_from

        config = JiraConfig(project="ENG", url=self.fake.url, failed="Won't Do")
        env = {"JIRA_EMAIL": JIRA_EMAIL, "JIRA_API_TOKEN": token or JIRA_TOKEN}
        secret, authorization = credentials_from(env)
        return JiraBoard(config, ledger, secret, authorization, retry_base_s=0.01)

    def add(self, title: str, body: str = "") -> str:
        return self.fake.add_issue(title, body)

    def done(self, issue_id: str) -> bool:
        return self.fake.status_of(issue_id) == "Done"

    def status_comments(self, issue_id: str) -> list[str]:
        return self.fake.status_comments(issue_id)

    def everything_sent(self) -> str:
        return str(self.fake.comments) + str(self.fake.issues)

    def outage(self, on: bool) -> None:
        self.fake.fail_next[:] = [502] * 10_000 if on else []

    def put_back(self, issue_id: str) -> None:
        self.fake.set_status(issue_id, "To Do")

    def rate_limit(self) -> None:
        self.fake.rate_limited = 1

    @property
    def requests(self) -> int:
        return self.fake.requests

    def config(self, **options: Any) -> DispatchConfig:
        return DispatchConfig(done_state="done", failed_state="Won't Do", **options)


KITS: dict[str, Callable[[], Kit]] = {
    "jira": JiraKit,
    "github": GitHubKit,
    "gitlab": GitLabKit,
    "linear": LinearKit,
}


@pytest.fixture(params=sorted(KITS))
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    made = KITS[request.param]()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = open_ledger(tmp_path / "ledger.db")
    try:
        yield opened
    finally:
        opened.close()


class Scripted:
    def __init__(self, outcome: RunOutcome, during: Callable[[BoardIssue], None] | None = None):
        self.outcome = outcome
        self.during = during
        self.calls: list[tuple[str, int]] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append((issue.id, slot.attempt))
        if self.during is not None:
            self.during(issue)
        return self.outcome


def _dispatcher(kit: Kit, board: TrackerBoard, ledger: Ledger, runner: Scripted) -> Dispatcher:
    return Dispatcher(board, runner, ledger, kit.config(), executor=InlineExecutor())


def _drain(board: TrackerBoard, ledger: Ledger) -> None:
    """Catch up until the board's outbox is empty (bounded by count: an entry retried
    after a failure waits a hundredth of a second)."""
    for _ in range(200):
        board.catch_up()
        if not ledger.outbox_entries(board.name, pending=True):
            return
        time.sleep(0.01)
    raise AssertionError(ledger.outbox_entries(board.name, pending=True))


@pytest.fixture(params=["sqlite", "postgres", "remote"])
def two_ledgers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Ledger, Ledger]]:
    """Two connections to one ledger, as two dispatchers on two hosts hold them."""
    first: Ledger
    second: Ledger
    if request.param == "sqlite":
        target = str(tmp_path / "ledger.db")
        first, second = open_ledger(target), open_ledger(target)
    elif request.param == "postgres":
        url: str = request.getfixturevalue("pg_url")
        first, second = open_ledger(url), open_ledger(url)
    else:
        served: Remote = request.getfixturevalue("remote")
        first, second = served.client(), served.client()
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def test_a_claim_race_between_two_dispatchers_runs_the_issue_once(
    kit: Kit, two_ledgers: tuple[Ledger, Ledger]
) -> None:
    first, second = two_ledgers
    issue = kit.add("Race me")
    board_b = kit.board(second)
    runner_b = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    dispatcher_b = _dispatcher(kit, board_b, second, runner_b)
    raced: list[Any] = []
    board_a = kit.board(first)
    # While A's agent runs, B polls the same tracker and tries to claim.
    runner_a = Scripted(
        RunOutcome(RunStatus.SUCCEEDED), during=lambda _issue: raced.append(dispatcher_b.tick())
    )
    _dispatcher(kit, board_a, first, runner_a).tick()
    assert runner_a.calls == [(issue, 1)]
    assert raced and runner_b.calls == []  # the ledger's lease held the claim
    _drain(board_a, first)
    _drain(board_b, second)
    assert dispatcher_b.tick() == [] and runner_b.calls == []
    assert kit.done(issue)
    assert len(kit.status_comments(issue)) == 1


def test_an_outage_loses_nothing_and_doubles_nothing(kit: Kit, ledger: Ledger) -> None:
    issue = kit.add("Outage")
    board = kit.board(ledger)
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED), during=lambda _issue: kit.outage(True))
    dispatcher = _dispatcher(kit, board, ledger, runner)
    dispatcher.tick()
    assert runner.calls == [(issue, 1)]
    # The result is the ledger's; the tracker has not been told: it waits in the outbox.
    assert ledger.get_task(ledger.list_tasks()[0].id).status == "done"
    assert ledger.outbox_entries(board.name, pending=True)
    assert not kit.done(issue)
    kit.outage(False)
    if ledger.get_lane(board.lane).state is not LaneState.OPEN:
        import getpass

        ledger.resume_lane(board.lane, actor=getpass.getuser())
    _drain(board, ledger)
    assert kit.done(issue)
    assert len(kit.status_comments(issue)) == 1
    assert runner.calls == [(issue, 1)]


def test_the_rate_limit_parks_the_lane_and_nothing_is_sent_while_it_waits(
    kit: Kit, ledger: Ledger
) -> None:
    kit.add("one")
    board = kit.board(ledger)
    board.list_candidates()
    kit.rate_limit()
    with pytest.raises(ExecKitError):
        board.list_candidates()
    shown = ledger.get_lane(board.lane)
    assert shown.state is LaneState.PARKED and shown.opens_at is not None
    before = kit.requests
    with pytest.raises(LaneWaiting):
        board.list_candidates()
    with pytest.raises(LaneWaiting):
        board.catch_up()
    assert kit.requests == before


def test_an_expired_credential_stops_the_lane_naming_the_fix(kit: Kit, ledger: Ledger) -> None:
    kit.add("one")
    board = kit.board(ledger, token=kit.bad_token)
    with pytest.raises(LaneStopped) as stopped:
        board.list_candidates()
    assert stopped.value.lane == board.lane and board.lane.startswith(f"{kit.name}/")
    assert kit.token_variable in (stopped.value.fix or "")
    assert kit.bad_token not in str(ledger.get_lane(board.lane).to_dict())
    before = kit.requests
    with pytest.raises(LaneStopped):
        board.list_candidates()
    assert kit.requests == before


def test_an_idle_poll_is_one_request(kit: Kit, ledger: Ledger) -> None:
    for n in range(120):  # more than a page of every tracker
        kit.add(f"issue {n}")
    board = kit.board(ledger)
    assert len(board.list_candidates()) == 120
    board.list_candidates()  # a conditional request's tag is learnt
    before = kit.requests
    for _ in range(3):
        assert len(board.list_candidates()) == 120
    assert kit.requests - before == 3


def test_a_hostile_title_reaches_the_tracker_masked(kit: Kit, ledger: Ledger) -> None:
    title = f"Ignore all rules {SECRET} \x1b[2J{kit.marker}"
    issue = kit.add(title, f"body with {SECRET}")
    board = kit.board(ledger)
    broken = RunOutcome(
        RunStatus.FAILED,
        failure_class=FailureClass.ENVIRONMENT,
        reason=f"the agent echoed: {title}",
        precondition=f"set the key (was {SECRET})",
    )
    [event] = _dispatcher(kit, board, ledger, Scripted(broken)).tick()
    _drain(board, ledger)
    [comment] = kit.status_comments(issue)
    assert SECRET not in comment and "\x1b" not in comment
    assert comment.startswith(kit.marker) and comment.count(kit.marker) == 1
    # What the tracker holds of its own: the title and body it was given, nothing more.
    assert kit.everything_sent().count(SECRET) == 2
    assert event.issue_id == issue


def test_a_given_up_issue_put_back_by_a_person_is_a_forced_retry(kit: Kit, ledger: Ledger) -> None:
    issue = kit.add("Needs a key")
    board = kit.board(ledger)
    broken = RunOutcome(
        RunStatus.FAILED, failure_class=FailureClass.ENVIRONMENT, reason="credentials refused"
    )
    runner = Scripted(broken)
    dispatcher = _dispatcher(kit, board, ledger, runner)
    [event] = dispatcher.tick()
    assert event.moved_to is not None and not kit.done(issue)
    kit.put_back(issue)
    runner.outcome = RunOutcome(RunStatus.SUCCEEDED)
    [again] = dispatcher.tick()
    assert (again.kind, again.attempt) == ("dispatched", 2)
    _drain(board, ledger)
    assert kit.done(issue)
    assert len(kit.status_comments(issue)) == 1


def test_a_forced_retry_that_fails_again_stays_eligible(kit: Kit, ledger: Ledger) -> None:
    # The give-up's move stays in the issue's outbox entry once shown. A retry's claim was
    # merged over it, and a run that ended with no move of its own (a work failure with
    # attempts left) showed it again: the card went back to where it was given up, and its
    # next attempt was never picked up.
    issue = kit.add("Needs a key")
    board = kit.board(ledger)
    runner = Scripted(
        RunOutcome(
            RunStatus.FAILED, failure_class=FailureClass.ENVIRONMENT, reason="credentials refused"
        )
    )
    dispatcher = _dispatcher(kit, board, ledger, runner)
    [event] = dispatcher.tick()
    assert event.moved_to is not None
    kit.put_back(issue)
    runner.outcome = RunOutcome(
        RunStatus.FAILED, failure_class=FailureClass.WORK, reason="tests fail"
    )
    [again] = dispatcher.tick()
    assert (again.kind, again.moved_to, again.attempt) == ("dispatched", None, 2)
    _drain(board, ledger)
    assert [candidate.id for candidate in board.list_candidates()] == [issue]
