"""Benchmark redaction: the new redactor against the frozen reference and a linear floor.

    python benchmarks/bench_redact.py [--root DIR] [--skip-linear]

(about a minute; prints two markdown tables)

1. A clean 1 MiB output (log words, timestamps, paths) against the floor: one `str.find`
   pass over the same text for a string that is not there. The anchor pre-check makes the
   new redactor a few dozen such passes; the reference runs every pattern.
2. A 1 MiB output with corpus credentials every few KiB (tests/secrets_corpus.py).
3. A cut 64 KiB tail with 4 KiB of context (what `spawn` keeps of a large output), clean
   and with credentials: the reference redacts it twice (alone, and with the context);
   the new one once.
4. The issue's case: five spawns of 1 MiB each, i.e. ten cut tails (stdout and stderr).
5. Linear time (`--skip-linear` leaves it out): each text of `secrets_corpus.ADVERSARIAL`,
   which repeats a rule's anchors, against one trivial `re.sub` over the same text (`vs
   floor`), and the cost of doubling it (`doubled`: 2x when linear, 4x when quadratic).
   Timed here, never in a test: tests/test_redact.py holds the same texts to counts.

6. Cost per MiB, per engine (the compiled Hyperscan anchor scan and the pure-Python
   gate), on clean log text, on text with credentials every few KiB, and on the recorded
   vendor transcripts (fixtures/recorded), against two floors: one `str.find` pass, and
   one `re` pass of a one-character class that matches nothing (each character tried).

Ratios: `vs floor` is time / floor time; `speed-up` is reference time / new time.
`--root DIR` imports execkit from another checkout (a before/after pair, same script);
`--engine` picks the engine(s) the new redactor runs under (a checkout from before the
engines existed has one).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import _redact_reference as reference  # noqa: E402
from secrets_corpus import ADVERSARIAL, SAMPLES, adversarial  # noqa: E402

MIB = 1 << 20
TAIL = 64 * 1024
CONTEXT = 4096
_WORDS = [
    "the",
    "build",
    "step",
    "compiled",
    "module",
    "warning",
    "line",
    "file",
    "test",
    "passed",
    "ok",
    "running",
    "install",
    "done",
    "[info]",
    "2024-05-01T12:00:00Z",
    "src/app/main.py:123",
    "return",
    "value",
    "42",
    "ms",
    "retry",
    "queue",
    "worker",
    "fetched",
    "200",
    "bytes",
    "from",
    "cache",
    "in",
    "3.2s",
    "(hit)",
    "linking",
    "objects",
    "...",
    "writing",
    "output",
]


def _best_of(repeats: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _clean_output(size: int, seed: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    total = 0
    while total < size:
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


def _with_secrets(size: int, seed: int) -> str:
    rng = random.Random(seed)
    clean = _clean_output(size, seed)
    parts: list[str] = []
    position = 0
    while position < len(clean):
        step = rng.randint(2048, 6144)
        parts.append(clean[position : position + step])
        parts.append("\n" + rng.choice(SAMPLES).text + "\n")
        position += step
    return "".join(parts)[:size]


def _holds_no_anchor(redactor: ModuleType, text: str) -> bool:
    if hasattr(redactor, "_fold"):  # a checkout from before execkit/_redact/ was a package
        low, steps = redactor._fold(text), redactor._REFERENCE_PASSES + redactor._EXTRA_PASSES
    else:
        engine: Any = importlib.import_module("execkit._redact.engine")
        gate: Any = importlib.import_module("execkit._redact.gate")
        low, steps = gate.fold(text), engine.REFERENCE_PASSES + engine.EXTRA_PASSES
    return not any(
        all(
            any(literal in (low if folded else text) for literal, folded in group)
            for group in anchors
        )
        for anchors in (step.anchors for step in steps)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to import")
    parser.add_argument("--skip-linear", action="store_true", help="leave out table 5")
    parser.add_argument(
        "--engine", default=None, help="hyperscan or python (default: the best that loads)"
    )
    parser.add_argument(
        "--per-mib-only", action="store_true", help="only table 6, under every engine"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    redactor = importlib.import_module("execkit._redact")
    redact: Callable[..., str] = redactor.redact
    redact_tail: Callable[..., str] = redactor.redact_tail
    print(f"execkit from {Path(redactor.__file__ or '').parent}\n")
    engines: tuple[str, ...] = getattr(redactor, "available_engines", lambda: ())()
    if args.per_mib_only:
        _per_mib(redactor, engines)
        return
    if args.engine is not None:
        redactor.use_engine(args.engine)
    if engines:
        print(f"engine: {redactor.engine_in_use()}\n")

    clean = _clean_output(MIB, 1)
    # Before the provider rules, no anchor of any rule occurred in it; now a few do (`:`
    # of the .pgpass rule, `?` of the URL parameters): said, not asserted.
    print(f"the clean text holds an anchor of some rule: {not _holds_no_anchor(redactor, clean)}\n")
    dirty = _with_secrets(MIB, 2)
    assert redact(clean) == reference.redact(clean) == clean

    rows: list[tuple[str, float, float, float]] = []  # case, floor, new, reference seconds

    def case(
        name: str, texts: list[str], new: Callable[[], object], old: Callable[[], object], n: int
    ) -> None:
        floor = _best_of(20, lambda: [text.find("\x00absent\x00") for text in texts])
        rows.append((name, floor, _best_of(n, new), _best_of(max(1, n // 2), old)))

    case("clean 1 MiB output", [clean], lambda: redact(clean), lambda: reference.redact(clean), 10)
    case(
        "1 MiB output with secrets",
        [dirty],
        lambda: redact(dirty),
        lambda: reference.redact(dirty),
        5,
    )
    for label, text in (("clean", clean), ("with secrets", dirty)):
        cut = len(text) - TAIL
        tail, context = text[cut:], text[cut - CONTEXT : cut]
        case(
            f"cut 64 KiB tail + 4 KiB context, {label}",
            [context + tail],
            functools.partial(redact_tail, tail, context),
            functools.partial(reference.redact_tail, tail, context),
            20,
        )
    spawns = [_clean_output(MIB, 10 + i) for i in range(10)]
    tails = [(s[-TAIL:], s[-TAIL - CONTEXT : -TAIL]) for s in spawns]
    case(
        "five 1 MiB spawns: ten cut tails, clean",
        [c + t for t, c in tails],
        lambda: [redact_tail(t, c) for t, c in tails],
        lambda: [reference.redact_tail(t, c) for t, c in tails],
        5,
    )

    print("floor: one str.find pass over the same text, for a string that is not in it\n")
    print("| case | floor | new | reference | new vs floor | reference vs floor | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for name, floor, new_s, old_s in rows:
        print(
            f"| {name} | {floor * 1e3:.3f} ms | {new_s * 1e3:.2f} ms | {old_s * 1e3:.2f} ms "
            f"| {new_s / floor:.1f}x | {old_s / floor:.1f}x | {old_s / new_s:.1f}x |"
        )
    if not args.skip_linear:
        _linear(redact)
    _per_mib(redactor, engines)


def _recorded(size: int) -> str:
    parts: list[str] = []
    total = 0
    for path in sorted((ROOT / "fixtures" / "recorded").rglob("*")):
        if path.is_file() and total < size:
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
            total += len(parts[-1])
    return "\n".join(parts)[:size]


def _per_mib(redactor: ModuleType, engines: tuple[str, ...]) -> None:
    """Table 6: milliseconds per MiB under each engine, against the two floors."""
    texts = {
        "clean log text": _clean_output(MIB, 1),
        "credentials every few KiB": _with_secrets(MIB, 2),
        "recorded vendor transcripts": _recorded(MIB),
    }
    nothing = re.compile(r"[\x00-\x08]")  # tries every character, matches none
    names = engines or ("(one engine)",)
    print("\ncost per MiB (ms); floors: one `str.find` pass, one `re` pass of a class\n")
    print("| text | str.find | re pass | " + " | ".join(names) + " | vs re pass |")
    print("|---|---|---|" + "---|" * len(names) + "---|")
    for label, text in texts.items():
        scale = MIB / len(text)
        find = _best_of(20, functools.partial(text.find, "\x00absent\x00")) * scale
        one_pass = _best_of(10, functools.partial(nothing.search, text)) * scale
        times: list[float] = []
        for name in names:
            if engines:
                redactor.use_engine(name)
            redactor.redact(text)  # the table loaded and the patterns compiled
            times.append(_best_of(5, functools.partial(redactor.redact, text)) * scale)
        if engines:
            redactor.use_engine(None)
        ratios = " / ".join(f"{t / one_pass:.1f}x" for t in times)
        print(
            f"| {label} | {find * 1e3:.3f} | {one_pass * 1e3:.2f} | "
            + " | ".join(f"{t * 1e3:.2f}" for t in times)
            + f" | {ratios} |"
        )


# Per text of ADVERSARIAL: 8 MiB for the two the issue named, 256 KiB where every few
# characters are a match (a Python call each: the run time, not the ratio), else 512 KiB.
_LINEAR_SIZES = {"sk-": 8 << 20, "Bearer ": 8 << 20}
_MANY_MATCHES = {"authorization: ", "--token ", "AccountKey=", '\\"token\\": \\"', 'password=\\"'}


def _linear(redact: Callable[..., str]) -> None:
    """Table 5: each adversarial text against one trivial `re.sub` over it, and doubled."""
    floor_pattern = re.compile(r"[^\n]")  # touches every character
    print("\nlinear time: floor is one `re.sub` of a one-character class over the same text\n")
    print("| text | size | new | vs floor | doubled |")
    print("|---|---|---|---|---|")
    for head, unit in ADVERSARIAL:
        size = _LINEAR_SIZES.get(unit, 1 << 18 if unit in _MANY_MATCHES else 1 << 19)
        one, two = adversarial(head, unit, size), adversarial(head, unit, 2 * size)
        floor = _best_of(5, functools.partial(floor_pattern.sub, "", one))
        first = _best_of(5, functools.partial(redact, one))
        second = _best_of(5, functools.partial(redact, two))
        label = repr(head + unit if len(head + unit) < 30 else (head + unit)[:27] + "...")
        print(
            f"| `{label}` | {size >> 10} KiB | {first * 1e3:.2f} ms | {first / floor:.1f}x "
            f"| {second / first:.2f}x |"
        )


if __name__ == "__main__":
    main()
