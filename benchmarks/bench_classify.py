"""Benchmark the failure classifier: the tail bound and the per-text cost.

Run: python benchmarks/bench_classify.py   (about 10-20 s; prints a markdown table)

1. A 64 MiB adversarial text (repeated status/circuit/retry fragments) against its own
   last 8 KiB: the tail bound makes the two cost the same (ratio ~1). Scanning the whole
   64 MiB is shown for contrast.
2. 10,000 texts from the labelled corpus, against the obvious baseline: one naive regex
   for a 3-digit status (`\\b(429|5\\d\\d)\\b`), which is fast and wrong.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from execkit._classify import TAIL_CHARS, classify_text  # noqa: E402

CORPUS = ROOT / "fixtures" / "failures"
BIG_CHARS = 64 * 1024 * 1024
TEXTS = 10_000
_ADVERSARIAL_UNIT = (
    'status 503; retrying HTTP/1.1 "code": 4290 circuit breaker is rate limit exceeded the '
    "service overloaded error: 9\n"
)
_NAIVE = re.compile(r"\b(429|5\d\d)\b")


def _best_of(repeats: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _corpus_texts() -> list[str]:
    manifest = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    texts = [(CORPUS / c["file"]).read_text(encoding="utf-8") for c in manifest["cases"]]
    return [texts[i % len(texts)] for i in range(TEXTS)]


def main() -> None:
    big = (_ADVERSARIAL_UNIT * (BIG_CHARS // len(_ADVERSARIAL_UNIT) + 1))[:BIG_CHARS]
    tail = big[-TAIL_CHARS:]
    assert classify_text(big) == classify_text(tail)
    big_s = _best_of(5, lambda: classify_text(big))
    tail_s = _best_of(5, lambda: classify_text(tail))
    whole_s = _best_of(1, lambda: classify_text(big, tail_chars=len(big)))

    texts = _corpus_texts()
    corpus_s = _best_of(3, lambda: [classify_text(t) for t in texts])
    naive_s = _best_of(3, lambda: [_NAIVE.search(t) for t in texts])
    mean_chars = sum(map(len, texts)) / len(texts)

    rows = [
        ("64 MiB adversarial text (tail read)", f"{big_s * 1e3:.3f} ms", f"{big_s / tail_s:.2f}x"),
        ("its last 8 KiB alone (baseline)", f"{tail_s * 1e3:.3f} ms", "1.00x"),
        (
            "64 MiB scanned whole (tail_chars=len)",
            f"{whole_s:.2f} s",
            f"{whole_s / tail_s:.0f}x",
        ),
        (
            f"{TEXTS:,} corpus texts (mean {mean_chars:,.0f} chars)",
            f"{corpus_s:.3f} s ({corpus_s / TEXTS * 1e6:.1f} us/text)",
            f"{corpus_s / naive_s:.1f}x",
        ),
        (
            f"{TEXTS:,} texts, naive 3-digit regex (baseline)",
            f"{naive_s:.3f} s ({naive_s / TEXTS * 1e6:.1f} us/text)",
            "1.0x",
        ),
    ]
    print("| case | time | ratio to baseline |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
