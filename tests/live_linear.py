"""A live check of the Linear board against real Linear (issue #48), never part of `make
test`: `make live-linear`. Skipped (exit 0, SKIP printed) without a key.

Needs LINEAR_API_KEY and EXECKIT_LIVE_LINEAR_TEAM=KEY, a team the key may read (its
documents are checked against the real schema by the real API). It reads only: the team
and its issues, then two polls, the second of which must be one request. It writes nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from execkit.dispatch._linear import LinearBoard, LinearConfig
from execkit.ledger import open_ledger


def main() -> int:
    key = os.environ.get("LINEAR_API_KEY")
    team = os.environ.get("EXECKIT_LIVE_LINEAR_TEAM")
    if not key or not team:
        print("SKIP: set LINEAR_API_KEY and EXECKIT_LIVE_LINEAR_TEAM=KEY for the live check")
        return 0
    config = LinearConfig.parse(team, {}, os.environ)
    with tempfile.TemporaryDirectory() as tmp, open_ledger(Path(tmp) / "live.db") as ledger:
        board = LinearBoard(config, ledger, key, read_only=True)
        first = board.list_issues()
        board.list_issues()
        before = board.client.requests
        board.list_issues()
        polls = board.client.requests - before
        print(f"{len(first)} issues on the board; an idle poll cost {polls} request(s)")
        if polls != 1:
            print("FAIL: an idle poll must be one request")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
