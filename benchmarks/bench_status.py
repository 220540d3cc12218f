"""`execkit status` over a very large board, in a real process, side by side with another
checkout (issue #30: a 200,000-issue board took 49 s).

    python benchmarks/bench_status.py [--issues 200000] [--dispatched 100] [--repeat 3]
                                      [--root PATH ...]

Writes one board file of `--issues` issues and a SQLite ledger holding the tasks of the
first `--dispatched` of them (as a dispatcher leaves them), then times `python -m execkit
status --board FILE --db LEDGER --json` with each `--root` checkout on PYTHONPATH (default:
this one), the roots interleaved, `--repeat` times each; prints each root's median. The
floor, measured in the same run: `python -c "import json; json.load(open(FILE))"`, what
reading the file costs any program at all. Compare the ratios, not the times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _write_world(where: Path, issues: int, dispatched: int) -> tuple[Path, Path]:
    sys.path.insert(0, str(REPO))
    from execkit.ledger import open_ledger

    states = [
        {"name": "todo", "eligible": True},
        {"name": "done", "terminal": True},
        {"name": "blocked", "terminal": True},
    ]
    doc = {
        "states": states,
        "issues": [
            {"id": f"I{k}", "title": f"issue {k}", "state": "todo", "argv": ["true"]}
            for k in range(issues)
        ],
    }
    board = where / "board.json"
    board.write_text(json.dumps(doc))
    db = where / "ledger.db"
    with open_ledger(db) as ledger:
        for k in range(dispatched):
            key = f"board:I{k}"
            ledger.create_task(key, idempotency_key=key, actor="bench")
    return board, db


def _timed(argv: list[str], root: Path | None) -> float:
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = str(root)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed: {done.stderr.decode(errors='replace')}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--issues", type=int, default=200_000)
    parser.add_argument("--dispatched", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", action="append", type=Path, default=None)
    args = parser.parse_args()
    roots: list[Path] = args.root or [REPO]
    with tempfile.TemporaryDirectory() as tmp:
        board, db = _write_world(Path(tmp), args.issues, args.dispatched)
        floor_argv = [sys.executable, "-c", f"import json; json.load(open({str(board)!r}))"]
        status = [sys.executable, "-m", "execkit", "status", "--board", str(board)]
        status += ["--db", str(db), "--json"]
        times: dict[str, list[float]] = {"floor (json.load)": []}
        for root in roots:
            times[str(root)] = []
        for _ in range(args.repeat):
            times["floor (json.load)"].append(_timed(floor_argv, None))
            for root in roots:
                times[str(root)].append(_timed(status, root))
        floor = statistics.median(times["floor (json.load)"])
        print(
            f"execkit status, {args.issues} issues ({args.dispatched} dispatched), "
            f"median of {args.repeat}"
        )
        for name, runs in times.items():
            median = statistics.median(runs)
            print(f"  {name:<40} {median:7.2f} s  {median / floor:6.1f}x the floor")


if __name__ == "__main__":
    main()
