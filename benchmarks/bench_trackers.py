"""Benchmark the Linear, GitLab and Jira boards (issue #48) against the tests' loopback fakes.

Run: python benchmarks/bench_trackers.py   (seconds; prints a markdown table)

Requests are counted by each fake (every request it answered), never timed:

1. a 2,000-issue board (1,000 of them the board's): requests for the first read, then per
   idle poll once read (goal: 1);
2. one issue from eligible to done with its status comment, through the dispatcher (an
   inline slot, a runner that succeeds): requests from the first poll to the last write.
GitHub's own figures are benchmarks/bench_github.py's.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from gitlab_fake import TOKEN as GITLAB_TOKEN  # noqa: E402
from gitlab_fake import FakeGitLab  # noqa: E402
from jira_fake import EMAIL as JIRA_EMAIL  # noqa: E402
from jira_fake import TOKEN as JIRA_TOKEN  # noqa: E402
from jira_fake import FakeJira  # noqa: E402
from linear_fake import KEY as LINEAR_KEY  # noqa: E402
from linear_fake import FakeLinear  # noqa: E402

from execkit._proof import RunStatus  # noqa: E402
from execkit.dispatch import (  # noqa: E402
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
    TrackerBoard,
)
from execkit.dispatch._gitlab import GitLabBoard, GitLabConfig  # noqa: E402
from execkit.dispatch._jira import JiraBoard, JiraConfig, credentials_from  # noqa: E402
from execkit.dispatch._linear import LinearBoard, LinearConfig  # noqa: E402
from execkit.ledger import Ledger, open_ledger  # noqa: E402


class _Done:
    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        return RunOutcome(RunStatus.SUCCEEDED)


def _linear() -> tuple[Any, Callable[[Ledger], TrackerBoard], DispatchConfig]:
    fake = FakeLinear()
    config = LinearConfig(team="ENG", api_url=fake.url)
    return (
        fake,
        lambda ledger: LinearBoard(config, ledger, LINEAR_KEY),
        DispatchConfig(done_state="completed", failed_state="canceled"),
    )


def _gitlab() -> tuple[Any, Callable[[Ledger], TrackerBoard], DispatchConfig]:
    fake = FakeGitLab()
    config = GitLabConfig(project="acme/widgets", url=fake.url)
    return fake, lambda ledger: GitLabBoard(config, ledger, GITLAB_TOKEN), DispatchConfig()


def _jira() -> tuple[Any, Callable[[Ledger], TrackerBoard], DispatchConfig]:
    fake = FakeJira()
    config = JiraConfig(project="ENG", url=fake.url)
    token, header = credentials_from({"JIRA_EMAIL": JIRA_EMAIL, "JIRA_API_TOKEN": JIRA_TOKEN})
    return (
        fake,
        lambda ledger: JiraBoard(config, ledger, token, header),
        DispatchConfig(done_state="done", failed_state=None),
    )


def measure(name: str, make: Callable[[], Any], tmp: Path) -> tuple[str, int, int, int]:
    fake, board_of, config = make()
    try:
        for n in range(2000):
            fake.add_issue(f"issue {n}", labels=("execkit",) if n % 2 else ("bug",))
        with open_ledger(tmp / f"{name}-idle.db") as ledger:
            board = board_of(ledger)
            before = fake.requests
            board.list_candidates()
            first = fake.requests - before
            board.list_candidates()  # a conditional request's tag is learnt
            before = fake.requests
            for _ in range(10):
                board.list_candidates()
            per_poll = (fake.requests - before) // 10
    finally:
        fake.close()
    fake, board_of, config = make()
    try:
        fake.add_issue("Fix the parser")
        with open_ledger(tmp / f"{name}-done.db") as ledger:
            board = board_of(ledger)
            dispatcher = Dispatcher(board, _Done(), ledger, config, executor=InlineExecutor())
            before = fake.requests
            dispatcher.tick()
            board.catch_up()
            done = fake.requests - before
    finally:
        fake.close()
    return name, first, per_poll, done


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("Linear", _linear), ("GitLab", _gitlab), ("Jira", _jira)):
            rows.append(measure(name, make, Path(tmp)))
    print("| tracker | first read of 2,000 issues | an idle poll | eligible to done |")
    print("|---|---|---|---|")
    for name, first, per_poll, done in rows:
        print(f"| {name} | {first} | {per_poll} | {done} |")
    return 0 if all(row[2] == 1 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
