"""Benchmark execkit.spawn, each row against its floor measured in the same run.

    python benchmarks/bench_exec.py [--rounds N] [--drain-rounds N] [--big-rounds N]
                                    [--root DIR] [--skip-big]

Every row times execkit and its floor in interleaved repetitions (the order rotates each
round, so drift hits all alike) and reports the medians and their ratio:

1. `spawn(["true"])` against `subprocess.run(["true"], capture_output=True)` (<= 1.1x),
2. `spawn(["true"])` against a bare `subprocess.run(["true"])` (<= 1.2x),
3. draining 1 MiB of /dev/urandom (`head -c 1048576 /dev/urandom`) against the pipe floor:
   a bare 64 KiB `os.read` loop over the child's stdout keeping a 64 KiB tail (<= 2.0x);
   the same row again with redaction replaced by the identity, to show what the rest of
   spawn costs on its own,
4. draining 256 MiB and 1 GiB of /dev/zero against that same floor (<= 1.15x),
5. context: `spawn(["true"])` under each process-tree mechanism execkit can use here
   (`cgroup`, `subreaper`, `session`) against the capturing run,
6. the work spawn does after its child exits (decode, redact, build the result) on a cut
   32 MiB tail of random bytes, log lines, a log with a credential on every line, and
   valid UTF-8 that decodes to four bytes a character (tests/kept_tails.py), each against
   a floor of what any redactor must do to it: decode it, and search it once or mask a
   word on each line (<= 1 s per 32 MiB). These ratios are figures, not test bounds:
   tests/test_exec_tree.py counts the calls and decoded bytes of that work instead,
7. `spawn(["true"])` from a parent holding 1 GiB against `subprocess.run` from that same
   parent, bare (<= 1.2x) and capturing (in a child process that holds the ballast; with
   `--skip-big` it is skipped too).

`--root DIR` imports execkit from another checkout (to measure a before/after pair with
the same script). Prints the command, then a markdown table.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

MIB = 1024 * 1024
TAIL = 64 * 1024


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _interleaved(fns: list[Callable[[], object]], rounds: int) -> list[float]:
    """The median seconds of each of `fns`, run in a rotating order `rounds` times."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            times[i].append(_timed(fns[i]))
    return [statistics.median(t) for t in times]


def _floor_drain(argv: list[str]) -> Callable[[], None]:
    """The pipe floor: a bare 64 KiB `os.read` loop keeping a 64 KiB tail."""

    def floor() -> None:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, bufsize=0)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        tail = bytearray()
        while chunk := os.read(fd, TAIL):
            tail += chunk
            if len(tail) > 2 * TAIL:
                del tail[:-TAIL]
        proc.stdout.close()
        assert proc.wait() == 0

    return floor


def _private(exec_module: ModuleType, file: str, name: str, old_name: str) -> Any:
    """A private name of the exec stage wherever the measured checkout keeps it: `name` in
    the file `file` of the execkit/_exec/ package, or `old_name` on the single module
    execkit/_exec.py of a checkout from before the package (None where it has none)."""
    try:
        module = importlib.import_module(f"execkit._exec.{file}")
    except ImportError:
        return getattr(exec_module, old_name, None)
    return getattr(module, name, None)


def _result_module(exec_module: ModuleType) -> ModuleType:
    """The module whose redaction calls build a result: execkit._exec.result, or the old
    single module."""
    try:
        return importlib.import_module("execkit._exec.result")
    except ImportError:
        return exec_module


@contextmanager
def _no_redaction(exec_module: ModuleType) -> Iterator[None]:
    """Redaction replaced by the identity where the exec stage builds its results, for the
    context row."""
    stubs: dict[str, Callable[..., Any]] = {
        "redact": lambda text, *_a, **_k: text,
        "redact_tail": lambda tail, *_a, **_k: tail,
        "redact_argv": lambda argv, *_a, **_k: tuple(argv),
    }
    saved = {name: getattr(exec_module, name) for name in stubs if hasattr(exec_module, name)}
    for name in saved:
        setattr(exec_module, name, stubs[name])
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(exec_module, name, value)


def _row(measure: str, ours: float, floor: float, floor_name: str, target: str) -> str:
    unit, scale = ("ms", 1e3) if floor < 0.1 else ("s", 1.0)
    return (
        f"| {measure} | {ours * scale:.3f} {unit} | {floor * scale:.3f} {unit} {floor_name} "
        f"| {ours / floor:.2f}x | {target} |"
    )


def _post_exit_rows(post_exit: Callable[..., float]) -> list[str]:
    """Row 6: the work after the exit on four 32 MiB cut tails (tests/kept_tails.py), each
    against a floor of what any redactor must do to it."""
    sys.path.insert(0, str(ROOT / "tests"))
    import kept_tails

    # An older checkout's `_post_exit_seconds(data)` keeps all of `data`: no cut, which
    # is its faster path.
    cuts = len(inspect.signature(post_exit).parameters) > 1
    size, context = 32 * MIB, 4096
    decode_floor = "`bytes.decode` of the same bytes"
    search_floor = "`bytes.decode` + one `str.find` over the text"
    mask_floor = "`bytes.decode` + one `re.sub` masking a word a line"
    cases: list[tuple[str, Callable[[int], bytes], Callable[[str], object] | None, str]] = [
        ("random bytes (binary output)", kept_tails.random_bytes, None, decode_floor),
        ("log lines", kept_tails.log_lines, kept_tails.search_once, search_floor),
        (
            "a credential on every line",
            kept_tails.credential_log,
            kept_tails.mask_last_words,
            mask_floor,
        ),
        (
            "wide text (4 bytes a character)",
            kept_tails.wide_text,
            kept_tails.search_once,
            search_floor,
        ),
    ]
    rows: list[str] = []
    for name, make, text_floor, floor_name in cases:
        data = make(size + context)
        kept = data[context:]

        def finish(data: bytes = data, kept: bytes = kept) -> None:
            if cuts:
                post_exit(data, size)
            else:
                post_exit(kept)

        def floor(
            kept: bytes = kept, text_floor: Callable[[str], object] | None = text_floor
        ) -> None:
            text = kept.decode("utf-8", errors="replace")
            if text_floor is not None:
                text_floor(text)

        ours_p, floor_p = _interleaved([finish, floor], 5)
        rows.append(
            _row(
                f"post-exit work, 32 MiB cut tail of {name} (median of 5)",
                ours_p,
                floor_p,
                floor_name,
                "<= 1 s",
            )
        )
    return rows


_BIG_PARENT = """
import statistics, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
mib, rounds = int(sys.argv[2]), int(sys.argv[3])
ballast = bytearray(mib * 1024 * 1024)
for i in range(0, len(ballast), 4096):  # every page touched: resident, not just mapped
    ballast[i] = 1
from execkit._exec import spawn
def ours(): assert spawn(["true"]).ok
def floor(): subprocess.run(["true"], check=True, capture_output=True)
def bare(): subprocess.run(["true"], check=True)
fns = [ours, floor, bare]
times = [[], [], []]
for r in range(rounds):
    for k in range(3):
        i = (r + k) % 3
        start = time.perf_counter(); fns[i](); times[i].append(time.perf_counter() - start)
print(*(statistics.median(t) for t in times))
"""


def _big_parent_rows(root: Path, rounds: int) -> list[str]:
    """Row 7: `spawn(["true"])` from a parent holding 1 GiB (a dispatcher running many
    agents is such a parent), in a child process of its own that holds the ballast (so no
    other row runs in a large process), against `subprocess.run` from the same parent:
    with a fork the cost grows with the parent's memory, with vfork it does not."""
    rows = []
    for mib in (1024,):
        done = subprocess.run(
            [sys.executable, "-c", _BIG_PARENT, str(root), str(mib), str(rounds)],
            capture_output=True,
            text=True,
            check=True,
        )
        ours, floor, bare = (float(part) for part in done.stdout.split())
        label = f'`spawn(["true"])` from a parent holding {mib} MiB (median of {rounds})'
        rows.append(
            _row(label, ours, floor, "capturing `subprocess.run`, same parent", "(context)")
        )
        rows.append(_row(label, ours, bare, "bare `subprocess.run`, same parent", "<= 1.2x"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--drain-rounds", type=int, default=60)
    parser.add_argument("--big-rounds", type=int, default=5)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to import")
    parser.add_argument("--skip-big", action="store_true", help="skip the 256 MiB/1 GiB rows")
    args = parser.parse_args()

    sys.path.insert(0, str(args.root.resolve()))
    import execkit._exec as exec_module

    spawn = exec_module.spawn
    rows: list[str] = []

    def ours_true() -> None:
        assert spawn(["true"]).ok

    def capture_true() -> None:
        subprocess.run(["true"], check=True, capture_output=True)

    def bare_true() -> None:
        subprocess.run(["true"], check=True)

    for _ in range(20):  # warm caches and the page cache for `true`
        ours_true()
        capture_true()
        bare_true()
    ours, capture, bare = _interleaved([ours_true, capture_true, bare_true], args.rounds)
    n = args.rounds
    rows.append(
        _row(
            f'`spawn(["true"])` (median of {n})',
            ours,
            capture,
            '`subprocess.run(["true"], capture_output=True)`',
            "<= 1.1x",
        )
    )
    rows.append(
        _row(
            f'`spawn(["true"])` (median of {n})',
            ours,
            bare,
            '`subprocess.run(["true"])`',
            "<= 1.2x",
        )
    )

    urandom = ["head", "-c", str(MIB), "/dev/urandom"]

    def ours_urandom() -> None:
        assert spawn(urandom).stdout_bytes == MIB

    floor_urandom = _floor_drain(urandom)
    ours_u, floor_u = _interleaved([ours_urandom, floor_urandom], args.drain_rounds)
    with _no_redaction(_result_module(exec_module)):
        ours_plain, floor_u2 = _interleaved([ours_urandom, floor_urandom], args.drain_rounds)
    m = args.drain_rounds
    rows.append(
        _row(
            f"drain 1 MiB of /dev/urandom (median of {m})",
            ours_u,
            floor_u,
            "64 KiB `os.read` loop + 64 KiB tail",
            "<= 2.0x",
        )
    )
    rows.append(
        _row(
            f"drain 1 MiB of /dev/urandom, redaction stubbed (median of {m})",
            ours_plain,
            floor_u2,
            "same floor",
            "(context)",
        )
    )

    if not args.skip_big:
        for size, label in ((256 * MIB, "256 MiB"), (1024 * MIB, "1 GiB")):
            zero = ["head", "-c", str(size), "/dev/zero"]

            def ours_zero(zero: list[str] = zero, size: int = size) -> None:
                assert spawn(zero).stdout_bytes == size

            ours_z, floor_z = _interleaved([ours_zero, _floor_drain(zero)], args.big_rounds)
            rows.append(
                _row(
                    f"drain {label} of /dev/zero (median of {args.big_rounds})",
                    ours_z,
                    floor_z,
                    "64 KiB `os.read` loop + 64 KiB tail",
                    "<= 1.15x",
                )
            )

    mechanisms: list[str] = list(getattr(exec_module, "TREE_MECHANISMS", ()))
    force = _private(exec_module, "tree", "force_mechanism", "_force_mechanism")
    if mechanisms and callable(force):
        for name in mechanisms:
            if not force(name):
                rows.append(f'| `spawn(["true"])`, mechanism `{name}` | n/a | | | (context) |')
                continue
            try:
                ours_m, capture_m = _interleaved([ours_true, capture_true], args.rounds // 2)
            finally:
                force(None)
            rows.append(
                _row(
                    f'`spawn(["true"])`, mechanism `{name}` (median of {args.rounds // 2})',
                    ours_m,
                    capture_m,
                    "capturing `subprocess.run`",
                    "(context)",
                )
            )

    if not args.skip_big:
        rows.extend(_big_parent_rows(args.root.resolve(), args.rounds))

    post_exit = _private(exec_module, "result", "_post_exit_seconds", "_post_exit_seconds")
    if callable(post_exit):
        rows.extend(_post_exit_rows(post_exit))

    mechanism = getattr(exec_module, "tree_mechanism", None)
    command = shlex.join([sys.executable, *sys.argv])
    print(f"$ {command}\n")
    print(
        f"execkit spawn benchmark (python {sys.version.split()[0]}, {sys.platform}, "
        f"{os.cpu_count()} CPUs, execkit from {args.root}"
        + (f", tree mechanism `{mechanism()}`" if callable(mechanism) else "")
        + ")\n"
    )
    print("| measure | execkit | floor | ratio | target |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
