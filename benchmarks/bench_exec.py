"""Benchmark execkit.spawn against the obvious subprocess baselines, measured in one run.

    python benchmarks/bench_exec.py [--rounds N] [--drain-rounds N]

1. spawn+wait of `true` vs `subprocess.run(["true"])`: alternated rounds, median per call
   (target <= 1.2x). Context row: against `subprocess.run` capturing both pipes in a new
   session, which pays the same kernel work (pipes, setsid) that spawn needs.
2. draining 1 GiB from `head -c 1G /dev/zero` vs `subprocess.run(stdout=DEVNULL)`: median
   wall (target <= 1.5x).
   Context row: the same drain against a bare `os.read` loop over a pipe, the floor for
   anything that captures output (DEVNULL never copies the bytes at all).
3. peak RSS of a fresh interpreter that imports execkit and drains that 1 GiB
   (`ru_maxrss`, target < 64 MiB), next to one that only imports it.

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from execkit._exec import spawn  # noqa: E402  (the checkout, not an installed copy)

ONE_GIB = 1024 * 1024 * 1024
DRAIN = ["head", "-c", str(ONE_GIB), "/dev/zero"]

_RSS_SCRIPT = """
import resource, sys
sys.path.insert(0, {root!r})
from execkit._exec import spawn
if {drain!r}:
    result = spawn({argv!r})
    assert result.ok and result.stdout_bytes == {size!r}, result
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _alternate(
    ours: Callable[[], object], baseline: Callable[[], object], rounds: int
) -> tuple[float, float]:
    """Median seconds of each, measured in alternation so drift hits both alike."""
    ours_s: list[float] = []
    base_s: list[float] = []
    for i in range(rounds):
        if i % 2:
            ours_s.append(_timed(ours))
            base_s.append(_timed(baseline))
        else:
            base_s.append(_timed(baseline))
            ours_s.append(_timed(ours))
    return statistics.median(ours_s), statistics.median(base_s)


def _peak_rss_mib(drain: bool) -> float:
    script = _RSS_SCRIPT.format(root=str(ROOT), drain=drain, argv=DRAIN, size=ONE_GIB)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    return int(out.strip()) / 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--drain-rounds", type=int, default=5)
    args = parser.parse_args()

    def ours_true() -> None:
        assert spawn(["true"]).ok

    def base_true() -> None:
        subprocess.run(["true"], check=True)

    def capture_true() -> None:
        subprocess.run(["true"], check=True, capture_output=True, start_new_session=True)

    def ours_drain() -> None:
        assert spawn(DRAIN).stdout_bytes == ONE_GIB

    def base_drain() -> None:
        subprocess.run(DRAIN, stdout=subprocess.DEVNULL, check=True)

    def floor_drain() -> None:
        # What any wrapper that captures must pay: every byte crosses a pipe into us.
        proc = subprocess.Popen(DRAIN, stdout=subprocess.PIPE, bufsize=0)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while os.read(fd, 64 * 1024):
            pass
        proc.stdout.close()
        assert proc.wait() == 0

    for _ in range(10):  # warm caches and the page cache for `true`
        ours_true()
        base_true()
    spawn_ours, spawn_base = _alternate(ours_true, base_true, args.rounds)
    spawn_ours_2, spawn_capture = _alternate(ours_true, capture_true, args.rounds)
    drain_ours, drain_base = _alternate(ours_drain, base_drain, args.drain_rounds)
    drain_ours_2, drain_floor = _alternate(ours_drain, floor_drain, args.drain_rounds)
    rss_idle = _peak_rss_mib(drain=False)
    rss_drain = _peak_rss_mib(drain=True)

    spawn_ratio = spawn_ours / spawn_base
    drain_ratio = drain_ours / drain_base
    print(f"execkit spawn benchmark (python {sys.version.split()[0]}, {sys.platform})\n")
    print("| measure | execkit | baseline | ratio | target |")
    print("|---|---|---|---|---|")
    print(
        f"| spawn+wait `true` (median of {args.rounds}) | {spawn_ours * 1e3:.2f} ms "
        f"| {spawn_base * 1e3:.2f} ms `subprocess.run` | {spawn_ratio:.2f}x | <= 1.2x |"
    )
    print(
        f"| spawn+wait `true`, against a capturing run (median of {args.rounds}) "
        f"| {spawn_ours_2 * 1e3:.2f} ms | {spawn_capture * 1e3:.2f} ms `subprocess.run("
        f"capture_output=True, start_new_session=True)` | {spawn_ours_2 / spawn_capture:.2f}x "
        "| (context) |"
    )
    print(
        f"| drain 1 GiB `head -c 1G /dev/zero` (median of {args.drain_rounds}) "
        f"| {drain_ours:.2f} s | {drain_base:.2f} s `run(stdout=DEVNULL)` "
        f"| {drain_ratio:.2f}x | <= 1.5x |"
    )
    print(
        f"| drain 1 GiB, against the pipe floor (median of {args.drain_rounds}) "
        f"| {drain_ours_2:.2f} s | {drain_floor:.2f} s bare `os.read` loop on a pipe "
        f"| {drain_ours_2 / drain_floor:.2f}x | (context) |"
    )
    print(
        f"| peak RSS while draining 1 GiB (fresh interpreter) | {rss_drain:.1f} MiB "
        f"| {rss_idle:.1f} MiB import only | +{rss_drain - rss_idle:.1f} MiB | < 64 MiB |"
    )


if __name__ == "__main__":
    main()
