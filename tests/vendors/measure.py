"""How well execkit classes the recorded real-CLI failures, today.

    python tests/vendors/measure.py            # figures and the per-cell table
    python tests/vendors/measure.py --json     # the same as one JSON document
    python tests/vendors/measure.py --write-expected   # regenerate expected.json (review it!)

Reads `fixtures/recorded/expected.json` (the class an operator needs for each
CLI/scenario cell; null for success) and replays every recording through
`tests/vendors/replay.py`, then classes the replayed spawn two ways:

- the adapter path: `get_adapter(cli).parse(result)` (the envelope, then `map_result`);
- the plain path: `execkit.classify(result)` (structure, then the text list).

For each path it prints the precision and recall of `upstream` and the share of cells
whose class is the expected one; then the same figures over the hand-labelled corpus in
fixtures/failures/ (each transcript as the stderr of a spawn that exited 1). It changes
nothing and needs only Python (no node).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from replay import load, replay_spawn  # noqa: E402

REPO = HERE.parent.parent
RECORDED = REPO / "fixtures" / "recorded"
EXPECTED = RECORDED / "expected.json"
CORPUS = REPO / "fixtures" / "failures"
ADAPTERS = ("codex", "claude", "gemini", "opencode")
# A recorded hang is replayed and killed after this long (the recording says how it ended).
HANG_REPLAY_S = 1.5


@dataclass(frozen=True)
class Verdict:
    """One cell: what the operator needs and what each path said (None: no failure)."""

    key: str
    expected: str | None
    adapter: str | None
    plain: str | None
    adapter_reason: str | None = None
    plain_reason: str | None = None


@dataclass(frozen=True)
class Figures:
    upstream_precision: float | None
    upstream_recall: float | None
    agreement: float
    cells: int
    upstream_expected: int
    upstream_predicted: int

    def line(self) -> str:
        def pct(value: float | None) -> str:
            return "  n/a" if value is None else f"{value:5.2f}"

        return (
            f"upstream precision {pct(self.upstream_precision)}  "
            f"recall {pct(self.upstream_recall)}  "
            f"expected class {self.agreement:5.1%} of {self.cells} cells "
            f"(upstream: {self.upstream_expected} expected, {self.upstream_predicted} predicted)"
        )


def figures(pairs: Iterable[tuple[str | None, str | None]]) -> Figures:
    """Figures over (expected, predicted) class pairs; None is the 'no failure' class."""
    listed = list(pairs)
    true_pos = sum(1 for e, p in listed if e == "upstream" and p == "upstream")
    predicted = sum(1 for _, p in listed if p == "upstream")
    expected = sum(1 for e, _ in listed if e == "upstream")
    same = sum(1 for e, p in listed if e == p)
    return Figures(
        upstream_precision=true_pos / predicted if predicted else None,
        upstream_recall=true_pos / expected if expected else None,
        agreement=same / len(listed) if listed else 0.0,
        cells=len(listed),
        upstream_expected=expected,
        upstream_predicted=predicted,
    )


def _recordings() -> list[Path]:
    return sorted(p.parent for p in RECORDED.glob("*/*/meta.json"))


def load_expected() -> dict[str, dict[str, Any]]:
    document = json.loads(EXPECTED.read_text(encoding="utf-8"))
    cells: dict[str, dict[str, Any]] = document["cells"]
    return cells


def measure_recordings() -> list[Verdict]:
    """Replay every recording and class it both ways."""
    from execkit import classify, get_adapter

    expected = load_expected()
    verdicts: list[Verdict] = []
    for path in _recordings():
        cell = load(path)
        key = f"{cell.cli}/{cell.scenario}"
        if key not in expected:
            raise SystemExit(f"{EXPECTED.name} has no entry for {key}: run --write-expected")
        timeout = HANG_REPLAY_S if cell.meta.get("timed_out") else 60.0
        result = replay_spawn(path, timeout_s=timeout, kill_grace=1.0)
        mapped = get_adapter(cell.cli).parse(result)
        plain = classify(result)
        verdicts.append(
            Verdict(
                key,
                expected[key]["class"],
                None if mapped.failure_class is None else mapped.failure_class.value,
                None if plain is None else plain.failure_class.value,
                mapped.reason,
                None if plain is None else plain.reason,
            )
        )
    return verdicts


def measure_corpus() -> list[Verdict]:
    """The hand-labelled transcripts of fixtures/failures, as the stderr of an exit 1."""
    from execkit import SpawnResult, classify, get_adapter

    manifest = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    verdicts: list[Verdict] = []
    for case in manifest["cases"]:
        text = (CORPUS / case["file"]).read_text(encoding="utf-8")
        vendor = case["vendor"] if case["vendor"] in ADAPTERS else "generic"
        result = SpawnResult(
            argv=(vendor,),
            pid=4242,
            exit_code=1,
            signal=None,
            spawn_errno=None,
            spawn_error=None,
            timed_out=False,
            duration_s=1.0,
            stdout_tail="",
            stderr_tail=text,
            stdout_bytes=0,
            stderr_bytes=len(text.encode()),
            stdout_truncated=False,
            stderr_truncated=False,
        )
        mapped = get_adapter(vendor).parse(result)
        plain = classify(result)
        verdicts.append(
            Verdict(
                case["file"],
                case["class"],
                None if mapped.failure_class is None else mapped.failure_class.value,
                None if plain is None else plain.failure_class.value,
                mapped.reason,
                None if plain is None else plain.reason,
            )
        )
    return verdicts


# --------------------------------------------------------------------------- expected.json

# The class an operator needs, by scenario; "by outcome" cells are decided per CLI below.
_BY_SCENARIO: dict[str, tuple[str | None, str]] = {
    "success": (None, "a reply"),
    "server_500": ("upstream", "5xx from the vendor: retry later, uncharged"),
    "bad_gateway_502": ("upstream", "5xx from the vendor: retry later, uncharged"),
    "unavailable_503": ("upstream", "5xx from the vendor: retry later, uncharged"),
    "overloaded_529": ("upstream", "overloaded: retry later, uncharged"),
    "proxy_502_html": ("upstream", "a proxy's 502: the vendor is unreachable"),
    "proxy_503_text": ("upstream", "a proxy's 503: the vendor is unreachable"),
    "rate_limit_429": ("upstream", "rate limited: retry after the wait"),
    "usage_limit": ("upstream", "a usage limit with a reset time: retry after the reset"),
    "bad_request_400": ("work", "the vendor refused this request: charged"),
    "auth_401": ("environment", "invalid key: a missing precondition, stop"),
    "forbidden_403": ("environment", "no permission: a missing precondition, stop"),
    "not_found_404": ("work", "model not found: the request's own fault, charged"),
    "billing": ("environment", "credit or quota exhausted with no reset: stop"),
    "payment_402": ("environment", "payment required with no reset: stop"),
    "context_length": ("work", "the prompt is too long: charged"),
    "midstream_error": ("upstream", "the vendor failed mid-stream: retry later"),
    "connection_refused": ("upstream", "the API is unreachable: retry later"),
    "hang": ("work", "a hang with nothing shown: charged as a timeout"),
    "retrying_503_killed": ("upstream", "killed while retrying a 503: retry later"),
}
_BY_OUTCOME = {"flaky_503_then_400", "flaky_503_then_success"}


def expected_for(meta: dict[str, Any]) -> tuple[str | None, str]:
    """The class for one recorded cell: by its scenario, or by the last answer it got."""
    scenario = str(meta["scenario"])
    if scenario not in _BY_OUTCOME:
        return _BY_SCENARIO[scenario]
    main = [e for e in meta["requests"] if e.get("role") == "model" and not e.get("helper")]
    last = main[-1] if main else None
    if last is None:
        return "upstream", "never reached the API"
    if last["status"] == 200 and meta.get("exit_code") == 0:
        return None, "the CLI retried the 503 and the retry succeeded"
    if last["status"] == 400:
        return "work", "the CLI retried the 503 and the retry was refused with 400: charged"
    return "upstream", f"the CLI gave up on the 503 before the {last['step']} answer"


def write_expected() -> None:
    cells: dict[str, dict[str, Any]] = {}
    for path in _recordings():
        cell = load(path)
        klass, why = expected_for(cell.meta)
        cells[f"{cell.cli}/{cell.scenario}"] = {"class": klass, "why": why}
    document = {
        "description": (
            "The failure class an operator needs for each recorded cell (null: success). "
            "upstream: the vendor refused or was unreachable (5xx, 529, 429, rate and usage "
            "limits with a reset, connection refused, killed while retrying); environment: "
            "a missing precondition (401, 403, credit or quota exhausted with no reset); "
            "work: everything else (400, 404, context length, a silent hang). Read by "
            "tests/vendors/measure.py."
        ),
        "cells": cells,
    }
    EXPECTED.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- main


def _show(value: str | None) -> str:
    return "none" if value is None else value


def report(title: str, verdicts: list[Verdict], *, table: bool) -> dict[str, Any]:
    adapter = figures((v.expected, v.adapter) for v in verdicts)
    plain = figures((v.expected, v.plain) for v in verdicts)
    print(f"== {title}")
    print(f"  adapter path (parse -> map_result): {adapter.line()}")
    print(f"  plain path   (classify):            {plain.line()}")
    if table:
        print(f"  {'cell':<36}{'expected':<13}{'adapter':<30}{'plain':<30}")
        for v in verdicts:
            mark = " " if v.adapter == v.expected and v.plain == v.expected else "*"
            got_a = f"{_show(v.adapter)} ({v.adapter_reason})" if v.adapter else "none"
            got_p = f"{_show(v.plain)} ({v.plain_reason})" if v.plain else "none"
            print(f"{mark} {v.key:<36}{_show(v.expected):<13}{got_a:<30.29}{got_p:<30.29}")
    return {
        "adapter": adapter.__dict__,
        "plain": plain.__dict__,
        "cells": [v.__dict__ for v in verdicts],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--write-expected", action="store_true", help="regenerate expected")
    parser.add_argument("--no-table", action="store_true", help="figures only")
    args = parser.parse_args(argv)
    if args.write_expected:
        write_expected()
        print(f"wrote {EXPECTED.relative_to(REPO)}: review each class before committing")
        return 0
    if not _recordings():
        print(f"SKIP: no recordings under {RECORDED.relative_to(REPO)} (make record-vendors)")
        return 0
    recorded = measure_recordings()
    corpus = measure_corpus()
    if args.json:
        document = {
            "recorded": {
                "adapter": figures((v.expected, v.adapter) for v in recorded).__dict__,
                "plain": figures((v.expected, v.plain) for v in recorded).__dict__,
                "cells": [v.__dict__ for v in recorded],
            },
            "corpus": {
                "adapter": figures((v.expected, v.adapter) for v in corpus).__dict__,
                "plain": figures((v.expected, v.plain) for v in corpus).__dict__,
            },
        }
        print(json.dumps(document, indent=2))
        return 0
    report("recorded real CLIs (fixtures/recorded)", recorded, table=not args.no_table)
    report("hand-labelled corpus (fixtures/failures)", corpus, table=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
