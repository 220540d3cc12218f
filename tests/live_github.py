"""A live check of the GitHub board against real GitHub (issue #47), never part of `make
test`: `make live-github`. Skipped (exit 0, SKIP printed) without a token.

Needs GITHUB_TOKEN (or GH_TOKEN) and EXECKIT_LIVE_REPO=OWNER/NAME, a repository the token
may read; GITHUB_API_URL for GitHub Enterprise. It reads only: the board's first read, then
two polls, the second of which must be one request (answered 304, spending no rate limit,
as GitHub documents for a 304). It writes nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from execkit.dispatch._github import GitHubBoard, GitHubConfig
from execkit.ledger import open_ledger


def main() -> int:
    token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    repo = os.environ.get("EXECKIT_LIVE_REPO")
    if not token or not repo:
        print("SKIP: set GITHUB_TOKEN and EXECKIT_LIVE_REPO=OWNER/NAME for the live check")
        return 0
    config = GitHubConfig.from_mapping(repo, {}, os.environ)
    with tempfile.TemporaryDirectory() as tmp, open_ledger(Path(tmp) / "live.db") as ledger:
        board = GitHubBoard(config, ledger, token)
        first = board.list_candidates()
        board.list_candidates()
        before = board.client.requests
        board.list_candidates()
        polls = board.client.requests - before
        print(f"{len(first)} eligible issues; an idle poll cost {polls} request(s)")
        if polls != 1:
            print("FAIL: an idle poll must be one request")
            return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
