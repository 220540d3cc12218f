"""Benchmark the CLI's start-up: whole-process wall time against `python -c pass`.

    python benchmarks/bench_cli.py [--rounds N] [--tree DIR [--tree DIR ...]]

Each round starts every command below once, in a rotating order (interleaved, so drift and
noise hit them alike); the table gives each command's median wall time and its ratio to the
floor, `python -c pass`, measured in the same run:

1. `python -m execkit run -- true` (target <= 3x the floor)
2. `python -m execkit --help`
3. `python -m execkit task list --db <fresh ledger>` (an empty ledger created beforehand)
4. `execkit run -- true` through the console script next to the interpreter, if there is one
5. context, what stands in the way of 3x: `python -c 'import attrs'` (execkit's value types
   are attrs classes), and `python -c 'import argparse, attrs, ctypes, subprocess,
   threading'`, the modules from outside execkit that `execkit run -- true` needs (the
   parser, the value types, prctl for the process tree, the spawn, its signal thread)

The children run with their bytecode cached under a temporary PYTHONPYCACHEPREFIX (written
by a warm-up run), as an installed package would, whatever PYTHONDONTWRITEBYTECODE says and
however stale the checkout's __pycache__ is. `--tree DIR` measures another checkout (for
instance `git archive HEAD | tar -x -C DIR`, to compare before and after a change) with the
same interpreter; given more than once, every tree's commands run interleaved in the same
rounds (against one floor), each row named by its tree's number. Prints every command,
then a markdown table.
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
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="a checkout to measure (default: this one); give it again to compare",
    )
    opts = parser.parse_args()
    trees = [tree.resolve() for tree in opts.tree or [ROOT]]
    with tempfile.TemporaryDirectory(prefix="execkit-bench-cli-") as scratch:
        py = [sys.executable]
        execkit = [*py, "-m", "execkit"]
        envs = [_env(tree, str(Path(scratch) / f"pycache-{n}")) for n, tree in enumerate(trees)]
        # The floor and the context rows import no execkit: the first tree's env serves.
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass (floor)": ([*py, "-c", "pass"], envs[0]),
            "python -c 'import attrs' (context)": ([*py, "-c", "import attrs"], envs[0]),
            "python -c 'import argparse, attrs, ctypes, subprocess, threading' (context)": (
                [*py, "-c", "import argparse, attrs, ctypes, subprocess, threading"],
                envs[0],
            ),
        }
        script = Path(sys.executable).parent / "execkit"
        for n, (tree, env) in enumerate(zip(trees, envs, strict=True)):
            tag = f" [tree {n + 1}]" if len(trees) > 1 else ""
            db = Path(scratch) / f"fresh-{n}.db"
            _fresh_ledger(tree, db, env)
            commands[f"execkit run -- true{tag}"] = ([*execkit, "run", "--", "true"], env)
            commands[f"execkit --help{tag}"] = ([*execkit, "--help"], env)
            commands[f"execkit task list --db <fresh>{tag}"] = (
                [*execkit, "task", "list", "--db", str(db)],
                env,
            )
            if script.is_file():  # the console script, as an operator types it (no runpy)
                commands[f"execkit run -- true (console script){tag}"] = (
                    [str(script), "run", "--", "true"],
                    env,
                )
        for n, (tree, env) in enumerate(zip(trees, envs, strict=True)):
            print(f"tree {n + 1}: {tree}")
            print(f"  PYTHONPATH={tree}, PYTHONPYCACHEPREFIX={env['PYTHONPYCACHEPREFIX']}")
        print(f"cwd {scratch}")
        for argv, env in commands.values():
            print(f"  $ {shlex.join(argv)}")
            _wall(argv, env, scratch)  # warm-up: writes the bytecode cache
        times: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for round_no in range(opts.rounds):
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                argv, env = commands[name]
                times[name].append(_wall(argv, env, scratch))
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    floor = medians[names[0]]
    print(f"\n{opts.rounds} interleaved rounds, median wall time per process\n")
    print("| command | median ms | x floor |")
    print("|---|---:|---:|")
    for name in names:
        print(f"| `{name}` | {medians[name] * 1000:.1f} | {medians[name] / floor:.2f}x |")


if __name__ == "__main__":
    main()
