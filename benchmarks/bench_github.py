"""Benchmark the GitHub board (issue #47) against the loopback fake GitHub of the tests.

Run: python benchmarks/bench_github.py   (under a minute; prints a markdown table)

Requests are counted by the fake (every request it answered), never timed:

1. an idle poll of a 2,000-issue repository (1,000 labelled `execkit`): requests per poll
   once the board has read it, and what they answered (goal: 1, answered 304, spending no
   rate limit);
2. one issue from eligible to done with its status comment, through the dispatcher (an
   inline slot, a runner that succeeds): requests from the first poll that lists it to the
   last write (goal: at most 6);
3. two dispatchers (processes) over 200 issues, one SQLite ledger, a fake that answers 10%
   of the writes with 502 (half of those after making the write): runs per issue, status
   comments per issue, requests in all;
4. a GitHub Project (v2) board of 2,000 items: GraphQL requests per idle poll (one per 100
   items: GraphQL has no conditional request), and requests to take one item from eligible
   to done with its status comment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from github_fake import TOKEN, FakeGitHub  # noqa: E402

from execkit._proof import RunStatus  # noqa: E402
from execkit.dispatch import (  # noqa: E402
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
)
from execkit.dispatch._github import GitHubBoard, GitHubConfig  # noqa: E402
from execkit.dispatch._github_project import (  # noqa: E402
    GitHubProjectBoard,
    GitHubProjectConfig,
)
from execkit.ledger import open_ledger  # noqa: E402


class _Done:
    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        return RunOutcome(RunStatus.SUCCEEDED)


def idle_poll(tmp: Path) -> tuple[int, str, int]:
    fake = FakeGitHub()
    try:
        for n in range(2000):
            fake.add_issue(f"issue {n}", labels=("execkit",) if n % 2 else ("bug",))
        with open_ledger(tmp / "idle.db") as ledger:
            board = GitHubBoard(GitHubConfig(repo="acme/widgets", api_url=fake.url), ledger, TOKEN)
            board.list_candidates()
            board.list_candidates()
            before, counted = fake.requests, fake.counted
            polls = 10
            for _ in range(polls):
                board.list_candidates()
            per_poll = (fake.requests - before) // polls
            return per_poll, str(fake.log[-1][2]), fake.counted - counted
    finally:
        fake.close()


def eligible_to_done(tmp: Path) -> int:
    fake = FakeGitHub()
    try:
        fake.add_issue("Fix the parser", "It fails on empty input.")
        with open_ledger(tmp / "one.db") as ledger:
            board = GitHubBoard(GitHubConfig(repo="acme/widgets", api_url=fake.url), ledger, TOKEN)
            dispatcher = Dispatcher(
                board, _Done(), ledger, DispatchConfig(), executor=InlineExecutor()
            )
            before = fake.requests
            dispatcher.tick()
            return fake.requests - before
    finally:
        fake.close()


def two_dispatchers(tmp: Path) -> tuple[int, int, int, int, int]:
    import getpass

    fake = FakeGitHub(write_failure=0.1, seed=2024)
    try:
        for n in range(200):
            fake.add_issue(f"issue {n}")
        target = str(tmp / "two.db")
        with open_ledger(target) as ledger:
            ledger.set_lane_config(actor=getpass.getuser(), breaker_k=1000)
        out = tmp / "runs.txt"
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}"}
        worker = str(ROOT / "tests" / "github_worker.py")
        procs = [
            subprocess.Popen([sys.executable, worker, target, fake.url, str(out)], env=env)
            for _ in range(2)
        ]
        for proc in procs:
            proc.wait(timeout=900)
        issues = [line.split()[0] for line in out.read_text().splitlines()]
        comments = [len(fake.status_comments(n)) for n in fake.issues]
        done = sum(1 for n in fake.issues if fake.labels_of(n) == {"execkit:done"})
        return len(issues), len(set(issues)), done, max(comments), fake.requests
    finally:
        fake.close()


def project_board(tmp: Path) -> tuple[int, int]:
    fake = FakeGitHub()
    try:
        project = fake.add_project()
        for n in range(2000):
            fake.add_project_item(project, fake.add_issue(f"issue {n}"), status="In Progress")
        with open_ledger(tmp / "project.db") as ledger:
            config = GitHubProjectConfig.parse("acme/1", {}, {"GITHUB_API_URL": fake.url})
            board = GitHubProjectBoard(config, ledger, TOKEN)
            board.list_candidates()
            before = fake.requests
            polls = 5
            for _ in range(polls):
                board.list_candidates()
            per_poll = (fake.requests - before) // polls
            fake.set_status_by_hand(project, 1, "Todo")
            dispatcher = Dispatcher(
                board,
                _Done(),
                ledger,
                DispatchConfig.from_mapping(config.dispatch_states()),
                executor=InlineExecutor(),
            )
            before = fake.requests
            dispatcher.tick()
            return per_poll, fake.requests - before
    finally:
        fake.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        per_poll, answered, counted = idle_poll(where)
        one = eligible_to_done(where)
        runs, distinct, done, most, requests = two_dispatchers(where)
        project_poll, project_one = project_board(where)
    print("| measure | figure | goal |")
    print("|---|---|---|")
    print(f"| requests per idle poll, 2,000 issues | {per_poll} (answered {answered}, "
          f"{counted} counted against the limit) | 1, answered 304 |")  # fmt: skip
    print(f"| requests, one issue eligible -> done with its comment | {one} | <= 6 |")
    print(f"| 2 dispatchers x 200 issues, 10% of writes 502: runs / distinct issues / done | "
          f"{runs} / {distinct} / {done} | 200 / 200 / 200 |")  # fmt: skip
    print(f"| the same: most status comments on one issue, requests in all | {most}, "
          f"{requests} | 1 |")  # fmt: skip
    print(f"| GraphQL requests per idle poll, a 2,000-item project | {project_poll} | "
          "1 per 100 items |")  # fmt: skip
    print(f"| requests, one project item eligible -> done with its comment | {project_one} | "
          "- |")  # fmt: skip


if __name__ == "__main__":
    main()
