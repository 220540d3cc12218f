"""One dispatcher over a GitHub board, as its own process (tests/test_github_board.py):
`python github_worker.py TARGET API_URL OUT` dispatches until every eligible issue is done
and the outbox is empty, or a bound of passes; each run it makes is appended to OUT as
`issue attempt`. TARGET is a ledger (file or postgresql:// URL) or `remote:URL` (the
token in $EXECKIT_TOKEN)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from github_fake import TOKEN

from execkit._proof import RunStatus
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
)
from execkit.dispatch._github import GitHubBoard, GitHubConfig
from execkit.ledger import Ledger, open_ledger


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        with self.out.open("a") as handle:
            handle.write(f"{issue.id} {slot.attempt} {os.getpid()}\n")
        return RunOutcome(RunStatus.SUCCEEDED)


def main() -> int:
    target, api_url, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    ledger: Ledger
    if target.startswith("remote:"):
        from execkit.remote import RemoteLedger

        ledger = RemoteLedger(target.removeprefix("remote:"), os.environ["EXECKIT_TOKEN"])
    else:
        ledger = open_ledger(target)
    board = GitHubBoard(
        GitHubConfig(repo="acme/widgets", api_url=api_url), ledger, TOKEN, retry_base_s=0.01
    )
    dispatcher = Dispatcher(
        board,
        Recorder(out),
        ledger,
        DispatchConfig(max_concurrent_agents=4),
        executor=InlineExecutor(),
    )
    for _ in range(3000):
        dispatcher.pass_once()
        if not board.list_candidates() and not ledger.outbox_entries(board.name, pending=True):
            ledger.close()
            return 0
    ledger.close()
    return 1


if __name__ == "__main__":
    sys.exit(main())
