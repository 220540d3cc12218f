"""GitHub Issues as a board (issue #47), against a loopback fake GitHub (tests/github_fake.py):
the fake's shapes are the description's; an idle poll is one request answered 304; the
dispatcher takes an issue from eligible to done in at most six requests with one status
comment; a give-up shows the fix and an operator's relabel is a forced retry; rate limits,
secondary limits, 502 storms and a refused token are the tracker's own lane; nothing secret
reaches GitHub; and two dispatchers (SQLite across processes, PostgreSQL, through `execkit
serve`) never run one issue twice and leave exactly one status comment per issue while a
tenth of the writes fail."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO
from github_fake import TOKEN, FakeGitHub
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
)
from execkit.dispatch._github import STATUS_MARKER, GitHubBoard, GitHubConfig, github_lane
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


def _board(fake: FakeGitHub, ledger: Ledger, token: str = TOKEN, **options: Any) -> GitHubBoard:
    config = GitHubConfig(repo="acme/widgets", api_url=fake.url)
    return GitHubBoard(config, ledger, token, retry_base_s=0.01, **options)


class Scripted:
    """A runner whose outcomes are given in order (the last one repeats)."""

    def __init__(self, *outcomes: RunOutcome) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, int]] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append((issue.id, slot.attempt))
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


def _dispatcher(board: GitHubBoard, ledger: Ledger, runner: Scripted) -> Dispatcher:
    return Dispatcher(board, runner, ledger, DispatchConfig(), executor=InlineExecutor())


def test_the_fake_answers_in_the_descriptions_shapes(fake: FakeGitHub) -> None:
    """What the fake sends validates against githubkit's models, which are generated from
    GitHub's OpenAPI description: the board reads typed models, not guessed fields."""
    from githubkit_schemas.latest.models import Issue, IssueComment, Label

    number = fake.add_issue("t", "b", pull_request=True)
    Issue.model_validate(fake.issues[number])
    Label.model_validate(fake.label("execkit"))
    _status, _headers, body = fake.answer(
        "POST",
        f"/repos/acme/widgets/issues/{number}/comments",
        {"authorization": f"token {TOKEN}"},
        b'{"body": "hi"}',
    )
    import json

    IssueComment.model_validate(json.loads(body))


def test_an_idle_poll_of_2000_issues_is_one_request_answered_304(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    for n in range(2000):
        fake.add_issue(f"issue {n}", labels=("execkit",) if n % 2 else ("bug",))
    board = _board(fake, ledger)
    assert len(board.list_candidates()) == 1000  # the first read: every page
    board.list_candidates()  # the newest issue again: this request's ETag is learnt
    before, counted = fake.requests, fake.counted
    for _ in range(5):
        assert len(board.list_candidates()) == 1000
    assert fake.requests - before == 5
    assert fake.log[-1][2] == 304
    assert fake.counted == counted  # a 304 spends no rate limit
    # A change is seen at the next poll.
    fake.set_labels_by_hand(1, {"bug", "execkit"})  # issue 0 of the loop
    assert len(board.list_candidates()) == 1001


def test_eligible_to_done_takes_at_most_six_requests_and_one_comment(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    number = fake.add_issue("Fix the parser", "It fails on empty input.")
    fake.add_issue("a pull request", pull_request=True)
    fake.add_issue("not ours", labels=("bug",))
    board = _board(fake, ledger)
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    dispatcher = _dispatcher(board, ledger, runner)
    before = fake.requests
    events = dispatcher.tick()
    assert [(e.kind, e.moved_to) for e in events] == [("dispatched", "done")]
    assert runner.calls == [("acme/widgets#1", 1)]
    assert fake.requests - before <= 6
    assert fake.labels_of(number) == {"execkit:done"}
    [comment] = fake.status_comments(number)
    assert comment["body"].startswith(STATUS_MARKER)
    assert "attempt 1" in comment["body"] and "succeeded" in comment["body"]
    assert fake.issues[number]["state"] == "open"  # closing is the pull request's job
    assert dispatcher.tick() == []  # nothing eligible is left
    assert runner.calls == [("acme/widgets#1", 1)]


def test_the_claim_is_shown_while_the_agent_runs(fake: FakeGitHub, ledger: Ledger) -> None:
    number = fake.add_issue("Slow work")
    board = _board(fake, ledger)
    seen: list[tuple[set[str], str]] = []

    class Watching(Scripted):
        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            board.catch_up()  # what a pass sends while the agent runs
            [comment] = fake.status_comments(number)
            seen.append((fake.labels_of(number), comment["body"]))
            return RunOutcome(RunStatus.SUCCEEDED)

    _dispatcher(board, ledger, Watching(RunOutcome(RunStatus.SUCCEEDED))).tick()
    [(labels, body)] = seen
    assert labels == {"execkit", "execkit:running"}
    assert "attempt 1" in body and "running on" in body  # the host and the attempt
    assert len(fake.status_comments(number)) == 1


def test_a_give_up_shows_the_fix_and_a_relabel_is_a_forced_retry(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    number = fake.add_issue("Needs a key")
    board = _board(fake, ledger)
    broken = RunOutcome(
        RunStatus.FAILED,
        failure_class=FailureClass.ENVIRONMENT,
        reason="credentials refused",
        precondition=f"set ANTHROPIC_API_KEY (was {SECRET})",
    )
    running_labels: list[set[str]] = []

    class Watching(Scripted):
        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            board.catch_up()  # what a pass sends while the agent runs
            running_labels.append(fake.labels_of(number))
            return super().run(issue, slot)

    runner = Watching(broken, RunOutcome(RunStatus.SUCCEEDED))
    dispatcher = _dispatcher(board, ledger, runner)
    [event] = dispatcher.tick()
    assert event.moved_to == "blocked"
    assert fake.labels_of(number) == {"execkit:blocked"}
    [comment] = fake.status_comments(number)
    assert "environment" in comment["body"] and "set ANTHROPIC_API_KEY" in comment["body"]
    assert SECRET not in str(fake.comments) and SECRET not in str(fake.issues)
    # The operator fixed it and labels the issue again: one forced retry.
    fake.set_labels_by_hand(number, {"execkit", "execkit:blocked"})
    [again] = dispatcher.tick()
    assert (again.kind, again.moved_to, again.attempt) == ("dispatched", "done", 2)
    # While the retry runs, the issue shows the claim, not the give-up it was put back from.
    assert running_labels == [{"execkit", "execkit:running"}] * 2
    assert fake.labels_of(number) == {"execkit:done"}
    assert len(fake.status_comments(number)) == 1


def test_a_spent_rate_limit_parks_the_lane_until_its_reset(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    fake.add_issue("one")
    board = _board(fake, ledger)
    fake.remaining = 1  # the next answer spends the last request
    board.list_candidates()
    shown = ledger.get_lane(board.lane)
    assert shown.state is LaneState.PARKED and shown.opens_at is not None
    assert shown.opens_at >= fake.reset_at
    before = fake.requests
    with pytest.raises(LaneWaiting) as waiting:
        board.list_candidates()
    assert waiting.value.lane == board.lane == github_lane(TOKEN, ledger.ledger_id())
    with pytest.raises(LaneWaiting):
        board.catch_up()
    assert fake.requests == before  # nothing is sent while it waits


@pytest.mark.parametrize(
    "status,headers",
    [(403, {"retry-after": "120"}), (429, {"retry-after": "30"}), (429, {})],
    ids=["secondary-403", "secondary-429", "429-without-headers"],
)
def test_a_secondary_limit_parks_the_lane_for_what_it_states(
    fake: FakeGitHub, ledger: Ledger, status: int, headers: dict[str, str]
) -> None:
    fake.add_issue("one")
    board = _board(fake, ledger)
    board.list_candidates()
    fake.fail_next.append((status, headers))
    with pytest.raises(ExecKitError):
        board.list_candidates()
    shown = ledger.get_lane(board.lane)
    assert shown.state is LaneState.PARKED
    wait = float(headers.get("retry-after", "60"))
    assert shown.opens_at is not None and shown.opens_at - shown.updated_at >= wait  # type: ignore[operator]


def test_a_502_storm_cools_the_lane_and_the_results_wait_in_the_outbox(
    fake: FakeGitHub, ledger: Ledger
) -> None:
    number = fake.add_issue("one")
    board = _board(fake, ledger)
    runner = Scripted(RunOutcome(RunStatus.SUCCEEDED))
    dispatcher = _dispatcher(board, ledger, runner)
    fake.fail_writes = 1000  # the run ends while GitHub takes no write
    dispatcher.pass_once()
    fake.fail_next.extend([(502, {})] * 50)  # then nothing at all: a storm
    for _ in range(ledger.lane_config().breaker_k + 2):
        try:
            dispatcher.pass_once()
        except LaneWaiting:
            break  # cooling: no new claim until it opens
        except ExecKitError:
            continue  # a failed poll: the pass is over, the loop logs it and goes on
    assert ledger.get_lane(board.lane).state is LaneState.COOLING
    # The run happened and is recorded; GitHub has not been told yet: it waits, recorded.
    assert runner.calls == [("acme/widgets#1", 1)]
    assert ledger.get_task(ledger.list_tasks()[0].id).status == "done"
    assert ledger.outbox_entries(board.name, pending=True)
    # The storm passes and the lane opens (an operator here; its cooling otherwise).
    fake.fail_writes = 0
    fake.fail_next.clear()
    ledger.resume_lane(board.lane, actor=ledger_owner(ledger))
    dispatcher.pass_once()
    assert fake.labels_of(number) == {"execkit:done"}
    assert len(fake.status_comments(number)) == 1
    assert ledger.outbox_entries(board.name, pending=True) == []


def test_a_refused_token_stops_the_lane_naming_the_fix(fake: FakeGitHub, ledger: Ledger) -> None:
    fake.add_issue("one")
    expired = "ghp_" + "e" * 36
    board = _board(fake, ledger, token=expired)
    with pytest.raises(LaneStopped) as stopped:
        board.list_candidates()
    assert "GITHUB_TOKEN" in (stopped.value.fix or "")
    assert expired not in str(stopped.value) and expired not in str(ledger.list_lanes())
    before = fake.requests
    with pytest.raises(LaneStopped):
        board.list_candidates()
    assert fake.requests == before
    # A valid token is another lane: it reads at once.
    assert len(_board(fake, ledger).list_candidates()) == 1


def test_an_issue_names_its_adapter_and_model(fake: FakeGitHub, ledger: Ledger) -> None:
    fake.add_issue("by label", labels=("execkit", "execkit:adapter=codex"))
    fake.add_issue("by block", "Do it.\n```execkit\nadapter: gemini\nmodel: gemini-2.5-pro\n```\n")
    issues = _board(fake, ledger).list_candidates()
    assert [(i.adapter, i.model) for i in issues] == [("codex", None), ("gemini", "gemini-2.5-pro")]
    assert issues[1].prompt.startswith("by block\n\nDo it.")


# -- two dispatchers -----------------------------------------------------------------------


def _two_dispatchers(fake: FakeGitHub, target: str, tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "runs.txt"
    worker = str(REPO / "tests" / "github_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, worker, target, fake.url, str(out)],
            env={**env, "PYTHONPATH": f"{REPO / 'tests'}:{REPO}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
    runs = out.read_text().split("\n")[:-1]
    issues = [line.split()[0] for line in runs]
    assert sorted(issues) == sorted(set(issues)), "an issue ran twice"
    assert len(issues) == len(fake.issues)
    for number in fake.issues:
        assert fake.labels_of(number) == {"execkit:done"}, number
        assert len(fake.status_comments(number)) == 1, number


def _prepared(ledger: Ledger, fake: FakeGitHub, count: int) -> None:
    for n in range(count):
        fake.add_issue(f"issue {n}")
    # A tenth of the writes fail: the breaker must not cool the lane on purpose here.
    ledger.set_lane_config(actor=ledger_owner(ledger), breaker_k=1000)


def ledger_owner(ledger: Ledger) -> str:
    import getpass

    return getpass.getuser()


def test_two_dispatchers_across_processes_on_sqlite(tmp_path: Path) -> None:
    import os

    fake = FakeGitHub(write_failure=0.1)
    try:
        target = str(tmp_path / "ledger.db")
        with open_ledger(target) as ledger:
            _prepared(ledger, fake, 40)
        _two_dispatchers(fake, target, tmp_path, dict(os.environ))
        with open_ledger(target) as ledger:
            assert ledger.outbox_entries("github:acme/widgets", pending=True) == []
    finally:
        fake.close()


def test_two_dispatchers_across_processes_on_postgres(tmp_path: Path, pg_url: str) -> None:
    import os

    fake = FakeGitHub(write_failure=0.1, seed=7)
    try:
        with open_ledger(pg_url) as ledger:
            _prepared(ledger, fake, 40)
        _two_dispatchers(fake, pg_url, tmp_path, dict(os.environ))
        with open_ledger(pg_url) as ledger:
            assert ledger.outbox_entries("github:acme/widgets", pending=True) == []
    finally:
        fake.close()


def test_two_dispatchers_through_execkit_serve(tmp_path: Path, remote: Remote) -> None:  # noqa: F811
    import os

    fake = FakeGitHub(write_failure=0.1, seed=11)
    try:
        _prepared(remote.ledger, fake, 30)
        env = {**os.environ, "EXECKIT_TOKEN": remote.token}
        _two_dispatchers(fake, f"remote:{remote.url}", tmp_path, env)
        assert remote.ledger.outbox_entries("github:acme/widgets", pending=True) == []
    finally:
        fake.close()


def test_execkit_dispatch_takes_a_github_board(
    fake: FakeGitHub, tmp_path: Path, fake_vendor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`execkit dispatch --board github:OWNER/REPO`: the token and the API from the
    environment, the issue's title and body the prompt, the claude CLI faked."""
    from execkit.cli import main

    number = fake.add_issue("Say hi", "Just say hi.")
    fixture = REPO / "fixtures" / "claude" / "success.json"
    fake_vendor.register("claude", stdout=fixture, exit_code=0, occurrences=1)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_API_URL", fake.url)
    db = str(tmp_path / "ledger.db")
    argv = ["dispatch", "--board", "github:acme/widgets", "--db", db, "--adapter", "claude"]
    assert main([*argv, "--once"], start=fake_vendor.start) == 0
    assert fake.labels_of(number) == {"execkit:done"}
    [comment] = fake.status_comments(number)
    assert "succeeded" in comment["body"]
    monkeypatch.delenv("GITHUB_TOKEN")
    monkeypatch.delenv("GH_TOKEN", raising=False)
    assert main([*argv, "--once"], start=fake_vendor.start) == 3  # no token: named, nothing sent
