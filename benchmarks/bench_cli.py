"""Benchmark the CLI's start-up: whole-process wall time against `python -c pass`.

    python benchmarks/bench_cli.py [--rounds N] [--tree DIR]

Each round starts every command below once, in a rotating order (interleaved, so drift and
noise hit them alike); the table gives each command's median wall time and its ratio to the
floor, `python -c pass`, measured in the same run:

1. `python -m execkit run -- true` (target <= 3x the floor)
2. `python -m execkit --help`
3. `python -m execkit task list --db <fresh ledger>` (an empty ledger created beforehand)
4. `execkit run -- true` through the console script next to the interpreter, if there is one

The children run with their bytecode cached under a temporary PYTHONPYCACHEPREFIX (written
by a warm-up run), as an installed package would, whatever PYTHONDONTWRITEBYTECODE says and
however stale the checkout's __pycache__ is. `--tree DIR` measures another checkout (for
instance `git archive HEAD | tar -x -C DIR`, to compare before and after a change) with the
same interpreter. Prints every command, then a markdown table.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env(tree: Path, pycache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # Ahead of any installed or editable copy; the children run in a scratch directory, so
    # `-m` does not put the caller's working directory first either.
    env["PYTHONPATH"] = str(tree)
    env["PYTHONPYCACHEPREFIX"] = pycache
    env.pop("EXECKIT_DB", None)
    return env


def _fresh_ledger(tree: Path, path: Path, env: dict[str, str]) -> None:
    script = (
        "import sys\nfrom execkit.ledger import open_ledger\n"
        "with open_ledger(sys.argv[1]):\n    pass\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, cwd=path.parent, check=True, timeout=60
    )


def _wall(argv: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
        timeout=60,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41, help="runs of each command")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    opts = parser.parse_args()
    tree = opts.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="execkit-bench-cli-") as scratch:
        env = _env(tree, str(Path(scratch) / "pycache"))
        db = Path(scratch) / "fresh.db"
        _fresh_ledger(tree, db, env)
        py = [sys.executable]
        execkit = [*py, "-m", "execkit"]
        commands: dict[str, list[str]] = {
            "python -c pass (floor)": [*py, "-c", "pass"],
            "execkit run -- true": [*execkit, "run", "--", "true"],
            "execkit --help": [*execkit, "--help"],
            "execkit task list --db <fresh>": [*execkit, "task", "list", "--db", str(db)],
        }
        script = Path(sys.executable).parent / "execkit"
        if script.is_file():  # the console script, as an operator types it (no runpy)
            commands["execkit run -- true (console script)"] = [str(script), "run", "--", "true"]
        print(f"tree: {tree}")
        print(f"cwd {scratch}, PYTHONPATH={tree}, PYTHONPYCACHEPREFIX={env['PYTHONPYCACHEPREFIX']}")
        for argv in commands.values():
            print(f"  $ {shlex.join(argv)}")
            _wall(argv, env, scratch)  # warm-up: writes the bytecode cache
        times: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for round_no in range(opts.rounds):
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(_wall(commands[name], env, scratch))
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    floor = medians[names[0]]
    print(f"\n{opts.rounds} interleaved rounds, median wall time per process\n")
    print("| command | median ms | x floor |")
    print("|---|---:|---:|")
    for name in names:
        print(f"| `{name}` | {medians[name] * 1000:.1f} | {medians[name] / floor:.2f}x |")


if __name__ == "__main__":
    main()
