"""How well execkit classes the recorded real-CLI failures, today.

    python tests/vendors/measure.py            # figures and the per-cell table
    python tests/vendors/measure.py --json     # the same as one JSON document
    python tests/vendors/measure.py --write-expected   # regenerate expected.json (review it!)
    python tests/vendors/measure.py --write-matrix     # the class matrix into MATRIX.md

Reads `fixtures/recorded/expected.json` (the class an operator needs for each
CLI/scenario cell; null for success) and replays every recording through
`tests/vendors/replay.py`, then classes the replayed spawn two ways:

- the adapter path: `get_adapter(cli).parse(result)` (the envelope, then `map_result`);
- the plain path: `execkit.classify(result)` (structure, then the text list).

For each path it prints the precision and recall of `upstream` and the share of cells
whose class is the expected one; then the same figures over the hand-labelled corpus in
fixtures/failures/ (each transcript as the stderr of a spawn that exited 1). It changes
nothing (unless told to write) and needs only Python (no node); the cells replay in
parallel.

`--write-matrix` replaces the "Classes" section of fixtures/recorded/MATRIX.md (between
its markers, after record.py's table of recorded cells) with the CLI x scenario table of
the class each cell gets on the adapter path, and the figures;
tests/test_vendor_recorded.py checks that it is current.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from replay import adapter_for, load, recorded_at, recorded_zone, write_replay  # noqa: E402

if TYPE_CHECKING:
    from execkit import SpawnResult

REPO = HERE.parent.parent
RECORDED = REPO / "fixtures" / "recorded"
EXPECTED = RECORDED / "expected.json"
CORPUS = REPO / "fixtures" / "failures"
MATRIX = RECORDED / "MATRIX.md"
ADAPTERS = (
    "codex",
    "claude",
    "gemini",
    "opencode",
    "qwen",
    "pi",
    "kilo",
    "copilot",
    "cn",
    "droid",
    "aider",
    "llm",
    "amp",
    "auggie",
    "crush",
)
# A recorded hang is replayed and killed after this long (the recording says how it ended).
HANG_REPLAY_S = 1.5
MATRIX_BEGIN = "<!-- classes: written by tests/vendors/measure.py --write-matrix -->"
MATRIX_END = "<!-- end of classes -->"


@dataclass(frozen=True)
class Verdict:
    """One cell: what the operator needs and what each path said (None: no failure)."""

    key: str
    expected: str | None
    adapter: str | None
    plain: str | None
    adapter_reason: str | None = None
    plain_reason: str | None = None
    adapter_retry_after_s: float | None = None
    adapter_precondition: str | None = None


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


def replay_all(
    paths: list[Path], *, hang_s: float = HANG_REPLAY_S, workers: int = 16
) -> dict[Path, SpawnResult]:
    """Replay every recording through `execkit.spawn`, `workers` at a time.

    Every stand-in is written (and closed) before the first one starts: a script still
    open for writing in one thread while another thread forks would fail to exec with
    ETXTBSY ("text file busy").
    """
    from execkit import spawn

    with tempfile.TemporaryDirectory(prefix="execkit-measure-") as root:
        bins = {path: write_replay(path, Path(root) / str(i)) for i, path in enumerate(paths)}

        def run(path: Path) -> SpawnResult:
            cell = load(path)
            env = {**os.environ, "PATH": os.pathsep.join([str(bins[path]), os.environ["PATH"]])}
            timeout = hang_s if cell.meta.get("timed_out") else 60.0
            return spawn(cell.argv, env=env, timeout=timeout, kill_grace=1.0, tail_bytes=4 << 20)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return dict(zip(paths, pool.map(run, paths), strict=True))


def _measure_one(path: Path, result: SpawnResult, expected: dict[str, dict[str, Any]]) -> Verdict:
    from execkit import classify

    cell = load(path)
    key = f"{cell.cli}/{cell.scenario}"
    if key not in expected:
        raise SystemExit(f"{EXPECTED.name} has no entry for {key}: run --write-expected")
    # Stated resets are read against the recording's own clock and zone (replay.py).
    with recorded_zone():
        mapped = adapter_for(cell).parse(result)
        plain = classify(result, now=recorded_at(cell))
    return Verdict(
        key,
        expected[key]["class"],
        None if mapped.failure_class is None else mapped.failure_class.value,
        None if plain is None else plain.failure_class.value,
        mapped.reason,
        None if plain is None else plain.reason,
        mapped.retry_after_s,
        mapped.precondition,
    )


def measure_recordings() -> list[Verdict]:
    """Replay every recording (in parallel) and class it both ways."""
    expected = load_expected()
    results = replay_all(_recordings())
    return [_measure_one(path, result, expected) for path, result in results.items()]


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
    "auth_401_stream": ("environment", "invalid key: a missing precondition, stop"),
    "payment_402_stream": ("environment", "payment required with no reset: stop"),
    "context_length": ("work", "the prompt is too long: charged"),
    "midstream_error": ("upstream", "the vendor failed mid-stream: retry later"),
    "connection_refused": ("upstream", "the API is unreachable: retry later"),
    "hang": ("work", "a hang with nothing shown: charged as a timeout"),
    "retrying_503_killed": ("upstream", "killed while retrying a 503: retry later"),
    "no_credentials": ("environment", "no key in the environment: a missing precondition, stop"),
    "not_logged_in": ("environment", "not logged in: a missing precondition, stop"),
    "expired_credential": ("environment", "an expired or revoked credential: log in again, stop"),
    "untrusted_workspace": ("environment", "the CLI does not trust the directory: stop"),
    "quota_per_day": ("upstream", "a per-day limit with its reset: retry after the reset"),
    "overloaded_in_stream": ("upstream", "overloaded inside a 200 stream: retry later"),
    "stream_cut": ("upstream", "the stream was cut mid-answer: retry later"),
    "dns_failure": ("upstream", "the API host cannot be resolved: unreachable, retry later"),
    "tls_failure": ("upstream", "the TLS handshake failed: unreachable, retry later"),
    "not_installed": ("environment", "the CLI's binary is not installed: stop"),
    "usage_limit_this_minute": (
        "upstream",
        "a usage limit whose reset falls inside the current minute: printed as that minute "
        "(rounded down), read to its end, so the lane parks until the minute is over",
    ),
    "usage_limit_later_minute": (
        "upstream",
        "a usage limit 40 s into the minute after next: printed to the minute, read to its "
        "end (never before the reset)",
    ),
    "usage_limit_on_minute": (
        "upstream",
        "a usage limit exactly on the minute after next: printed to the minute, read to its "
        "end (up to a minute late, never early)",
    ),
    "overloaded_529_then_dropped": (
        "upstream",
        "a 529, then the retry's connection dropped: unreachable, retry later",
    ),
    "limit_longer_than_timeout": (
        "upstream",
        "the CLI announced it would sleep out a limit longer than an attempt sleeps (60 s): "
        "stopped there and handed back, upstream with the announced reset, so the lane parks",
    ),
    "limit_longer_than_timeout_one_attempt": (
        "upstream",
        "a usage limit with its reset, reported at once (one attempt): retry after the reset",
    ),
    "limit_longer_than_timeout_unattended": (
        "upstream",
        "the CLI's unattended retry announced its wait for capacity, longer than an attempt "
        "sleeps: stopped there and handed back with that reset",
    ),
    "limit_longer_than_timeout_no_sdk_retries": (
        "upstream",
        "a usage limit reported with its reset once the CLI's client does not sleep it out",
    ),
}
# Scenarios that are another one in another output mode or CLI version: the same class.
_VARIANT = re.compile(r"_(?:text|json|gemini_\d+_\d+)$")


def _by_scenario(scenario: str) -> tuple[str | None, str]:
    return _BY_SCENARIO.get(scenario) or _BY_SCENARIO[_VARIANT.sub("", scenario)]


# Cells whose class is not the scenario's, decided by what the vendor or the CLI did
# (reviewed by hand; the `why` says what happened).
_OVERRIDES: dict[str, tuple[str | None, str]] = {
    "qwen/limit_longer_than_timeout": (
        "work",
        "qwen's first retry loop (retryWithBackoff: 7 attempts, no setting) sleeps a 429's "
        "Retry-After in full and prints nothing (its log goes to a debug file): killed by the "
        "timeout in a silent sleep, indistinguishable from a hang, so charged as a timeout; "
        "QWEN_CODE_UNATTENDED_RETRY=1 makes it announce the wait (the _unattended cell)",
    ),
    "pi/limit_longer_than_timeout": (
        "work",
        "pi's OpenAI client (openai 6.26) sleeps any Retry-After before pi sees the 429, and "
        "prints nothing: killed by the timeout in a silent sleep, charged as a timeout; "
        "retry.provider.maxRetries 0 hands it back (the _no_sdk_retries cell)",
    ),
    "gemini/quota_per_day": (
        "environment",
        "Google's per-day quota with no retry delay: the structure says the account's "
        "daily quota is spent (raise it), no reset stated: stop",
    ),
    "codex/not_logged_in": (
        "upstream",
        "codex checks no credential before calling: with no key and no provider it calls "
        "its default API, which is unreachable here (the proxy refuses it), and waits for "
        "the network until killed",
    ),
    "copilot/billing": (
        "upstream",
        "copilot retries OpenAI's insufficient-quota 429 as a rate limit and was killed "
        "retrying it; its retry events carry only the status 429, not the body: what the "
        "run showed is a rate limit being retried (upstream, bounded by the uncharged "
        "ceiling), and nothing structured says billing",
    ),
    "amp/tls_failure": (
        "work",
        "amp prints only `Error: TypeError: unknown certificate verification error`, which "
        "names neither its service nor a connection: nothing identifies it",
    ),
    "cn/not_logged_in": (
        "work",
        "with no config cn calls the Continue hub (refused here) and prints only `The request "
        "failed and the interceptors did not return an alternative response`: nothing "
        "identifies a missing login",
    ),
    "droid/connection_refused": ("work", "droid says only `Exec failed`: nothing identifies it"),
    "droid/dns_failure": ("work", "droid says only `Exec failed`: nothing identifies it"),
    "droid/tls_failure": ("work", "droid says only `Exec failed`: nothing identifies it"),
    "droid/payment_402": ("work", "droid says only `Exec failed`: nothing identifies it"),
    "qwen/untrusted_workspace": (
        None,
        "qwen asks for no folder trust in headless mode (even with folderTrust enabled): "
        "it ran and replied",
    ),
    "cn/stream_cut": (
        None,
        "cn took the cut stream as a complete reply and exited 0: the CLI reports success",
    ),
    "droid/stream_cut": (
        None,
        "droid took the cut stream as a complete reply (subtype success) and exited 0",
    ),
    "kilo/stream_cut": (
        None,
        "kilo took the cut stream as a complete reply and exited 0 (opencode loops on it)",
    ),
    "aider/forbidden_403": (
        "work",
        "aider prints the 403 as LiteLLM's generic `APIError` with the body only, no status "
        "and no credential type: nothing structured names credentials",
    ),
    "aider/payment_402": (
        "work",
        "aider prints the 402 as LiteLLM's generic `APIError` with the body only: nothing "
        "structured names billing (and billing in free text charges)",
    ),
    "llm/dns_failure": (
        "work",
        "Python's idna codec refuses the recording's over-long host name before any lookup "
        "(`encoding with 'idna' codec failed`): no connection was tried, nothing names one",
    ),
    "llm/stream_cut": (
        None,
        "llm printed the cut stream's words as its reply and exited 0: it reports success",
    ),
    "pi/stream_cut": (
        None,
        "pi took the cut stream as a complete reply (stopReason stop, the partial text) and "
        "exited 0: the CLI reports success (a cut answer is the work's to catch)",
    ),
}
_BY_OUTCOME = {"flaky_503_then_400", "flaky_503_then_success"}
# What a transcript that says anything about a failure holds somewhere.
_FAILURE_WORDS = re.compile(
    rb"(?i)error|retry|retrying|fail|no api key|login|\"reason\":\"unknown\"|\b[45]\d\d\b"
)
_SILENT = (
    "work",
    "killed by the timeout while the CLI retried or waited out the refusal without a word "
    "(nothing it printed names a failure): indistinguishable from a hang, so charged as a "
    "timeout; the CLI cannot be told to say more or to retry less",
)
_SILENT_RETRY = (
    "work",
    "killed while retrying a 503, but the CLI printed nothing: indistinguishable from a "
    "hang, so charged as a timeout (a timeout with nothing to show stays work)",
)


def expected_for(
    meta: dict[str, Any], printed: bool = True, silent: bool = False
) -> tuple[str | None, str]:
    """The class for one recorded cell: by its scenario, or by the last answer it got.

    `printed`: the CLI wrote anything at all (a run killed while retrying that printed
    nothing cannot be told from a hang, and the policy charges a silent timeout).
    `silent`: nothing it wrote names a failure (`_FAILURE_WORDS`): killed while it
    retried or waited out a refusal without a word, it is charged the same way.
    """
    scenario = str(meta["scenario"])
    key = f"{meta['cli']}/{scenario}"
    if key in _OVERRIDES:
        return _OVERRIDES[key]
    if scenario == "retrying_503_killed" and meta.get("timed_out") and not printed:
        return _SILENT_RETRY
    if silent and meta.get("timed_out") and scenario != "hang":
        return _SILENT
    if scenario not in _BY_OUTCOME:
        return _by_scenario(scenario)
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
    """Regenerate expected.json; the hand-added keys of a cell whose class is unchanged
    (`reason`, `retry_after_s`, `precondition_has`...) are kept."""
    previous = load_expected() if EXPECTED.exists() else {}
    cells: dict[str, dict[str, Any]] = {}
    for path in _recordings():
        cell = load(path)
        printed = bool(cell.stdout().strip() or cell.stderr().strip())
        silent = not _FAILURE_WORDS.search(cell.stdout() + cell.stderr())
        klass, why = expected_for(cell.meta, printed, silent)
        key = f"{cell.cli}/{cell.scenario}"
        extra = previous.get(key, {})
        kept = {k: v for k, v in extra.items() if k not in ("class", "why")}
        cells[key] = {"class": klass, "why": why, **(kept if extra.get("class") == klass else {})}
    document = {
        "description": (
            "The failure class an operator needs for each recorded cell (null: success). "
            "upstream: the vendor refused or was unreachable (5xx, 529, 429, rate and usage "
            "limits with a reset, connection refused, killed while retrying); environment: "
            "a missing precondition (401, 403, credit or quota exhausted with no reset); "
            "work: everything else (400, 404, context length, a silent hang or a run killed "
            "while retrying that printed nothing). Optional per cell: reason (the expected "
            "reason), retry_after_s (a number, or [min, max] for a wall-clock reset), "
            "precondition_has (substrings the environment precondition names). Read by "
            "tests/vendors/measure.py and tests/test_vendor_recorded.py."
        ),
        "cells": cells,
    }
    EXPECTED.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def fill_details(verdicts: list[Verdict]) -> list[str]:
    """Give each expected cell that has no `reason` yet the adapter path's reason, reset
    and precondition words, where the adapter path already gets the expected class (a
    new cell's details are then reviewed by hand, like its class). Returns the keys
    filled; a cell whose class the adapter misses is left for a person."""
    document = json.loads(EXPECTED.read_text(encoding="utf-8"))
    cells: dict[str, dict[str, Any]] = document["cells"]
    filled = []
    for verdict in verdicts:
        want = cells.get(verdict.key)
        if want is None or want["class"] is None or "reason" in want:
            continue
        if verdict.adapter != want["class"]:
            continue
        want["reason"] = verdict.adapter_reason
        wait = verdict.adapter_retry_after_s
        if wait is not None:
            # A reset stated as a wall-clock time or an epoch moves with the recording's
            # age: only its order of magnitude is checked.
            want["retry_after_s"] = wait if wait < 3600 else [0, 30 * 86400]
        precondition = verdict.adapter_precondition
        if want["class"] == "environment" and precondition:
            want["precondition_has"] = [precondition.split(";")[-1].strip()]
        filled.append(verdict.key)
    EXPECTED.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return filled


# --------------------------------------------------------------------------- MATRIX.md


def _matrix_cell(verdict: Verdict) -> str:
    if verdict.adapter is None:
        shown = "success"
    else:
        shown = f"{verdict.adapter} ({verdict.adapter_reason}"
        if verdict.adapter_retry_after_s is not None:
            shown += ", waits for the stated reset"
        shown += ")"
    if verdict.adapter != verdict.expected:
        shown += f" **expected {_show(verdict.expected)}**"
    return shown


def matrix_section(recorded: list[Verdict], corpus: list[Verdict]) -> str:
    """The "Classes" section of MATRIX.md, markers included."""
    by_key = {v.key: v for v in recorded}
    clis = sorted({key.split("/")[0] for key in by_key})
    scenarios = sorted({key.split("/")[1] for key in by_key})
    lines = [
        MATRIX_BEGIN,
        "## Classes",
        "",
        "The class each recorded cell gets on the adapter path (`get_adapter(cli).parse`,",
        "the path `execkit run --adapter` and the dispatcher take), with its reason; written",
        "by `python tests/vendors/measure.py --write-matrix`.",
        "",
        "| scenario | " + " | ".join(clis) + " |",
        "|---|" + "---|" * len(clis),
    ]
    for scenario in scenarios:
        cells = [
            _matrix_cell(by_key[f"{cli}/{scenario}"]) if f"{cli}/{scenario}" in by_key else ""
            for cli in clis
        ]
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    lines += ["", "Blank: the CLI is not recorded in that scenario (see the notes below).", ""]
    lines += _per_cli(recorded)
    lines += _drift_section()
    lines += _NOTES
    lines += ["", "| over | path | figures |", "|---|---|---|"]
    for title, verdicts in (("recorded cells", recorded), ("fixtures/failures", corpus)):
        for path, pairs in (
            ("adapter", [(v.expected, v.adapter) for v in verdicts]),
            ("plain `classify`", [(v.expected, v.plain) for v in verdicts]),
        ):
            lines.append(f"| {title} | {path} | {figures(pairs).line()} |")
    lines.append(MATRIX_END)
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _per_cli(recorded: list[Verdict]) -> list[str]:
    """Per CLI: both paths' share of expected classes, upstream precision and recall, and
    how many environment cells each path gets."""
    lines = [
        "### Per CLI",
        "",
        "| cli | cells | adapter: expected class | adapter: upstream P / R "
        "| plain: expected class | plain: upstream P / R | environment cells: adapter / plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for cli in sorted({v.key.split("/")[0] for v in recorded}):
        mine = [v for v in recorded if v.key.split("/")[0] == cli]
        adapter = figures((v.expected, v.adapter) for v in mine)
        plain = figures((v.expected, v.plain) for v in mine)
        env = [v for v in mine if v.expected == "environment"]
        env_adapter = sum(1 for v in env if v.adapter == "environment")
        env_plain = sum(1 for v in env if v.plain == "environment")
        lines.append(
            f"| {cli} | {len(mine)} | {adapter.agreement:.1%} "
            f"| {_pct(adapter.upstream_precision)} / {_pct(adapter.upstream_recall)} "
            f"| {plain.agreement:.1%} | {_pct(plain.upstream_precision)} / "
            f"{_pct(plain.upstream_recall)} | {env_adapter} / {env_plain} of {len(env)} |"
        )
    return [*lines, ""]


def _drift_section() -> list[str]:
    """The second column: each CLI's pin beside the newest version the registry serves,
    and how the newest classes its cells (`record.py --latest`)."""
    versions_path, drift_path = RECORDED / "versions.json", RECORDED / "drift.json"
    if not versions_path.exists():
        return []
    versions = json.loads(versions_path.read_text(encoding="utf-8"))
    drift = json.loads(drift_path.read_text(encoding="utf-8")) if drift_path.exists() else {}
    expected = load_expected()
    lines = [
        "### Version drift",
        "",
        "The pinned version (recorded above) beside the newest the registry served when",
        "`python tests/vendors/record.py --latest` last ran; for each newer one, its cells",
        "recorded live and classed through the same adapter.",
        "",
        "| cli | package | pinned | newest served | cells on the newest |",
        "|---|---|---|---|---|",
    ]
    for cli, row in sorted(versions.items()):
        if row["newest"] == row["pinned"]:
            newest = "the pinned one"
        else:
            found = drift.get(cli, {})
            if "not_installed" in found:
                newest = f"could not be installed: {found['not_installed']}"
            else:
                cells = found.get("cells", {})
                same = sum(
                    1
                    for scenario, got in cells.items()
                    if got["class"] == expected.get(f"{cli}/{scenario}", {}).get("class")
                )
                newest = f"{same} of {len(cells)} cells get the expected class"
        lines.append(
            f"| {cli} | `{row['package']}` | {row['pinned']} | {row['newest']} | {newest} |"
        )
    return [*lines, ""]


_NOTES = [
    "### Notes",
    "",
    "- amp talks to its own service (`AMP_URL`), auggie only to Augment's: neither can be",
    "  pointed at a model API, so they are recorded without credentials, not logged in and",
    "  (amp) with the service unreachable.",
    "- crush: `npm install @charmland/crush` installs a launcher with no binary; its first",
    "  run downloads crush from GitHub releases, which is refused here. It is recorded once,",
    "  as installed (`not_installed`), and read from its launcher's fixed sentence.",
    "- `untrusted_workspace` is recorded for the CLIs that have a trust check (gemini, qwen).",
    "- Cells whose expected class is not their scenario's are reviewed by hand; each says",
    "  why in expected.json (`why`): a CLI that retried or waited silently until the timeout",
    "  (charged, as a silent timeout is), one that took a cut stream as its reply (success),",
    "  one that names nothing (`Exec failed`).",
]


def write_matrix(recorded: list[Verdict], corpus: list[Verdict]) -> None:
    """Replace (or append) the "Classes" section of MATRIX.md."""
    text = MATRIX.read_text(encoding="utf-8") if MATRIX.exists() else ""
    section = matrix_section(recorded, corpus)
    begin, end = text.find(MATRIX_BEGIN), text.find(MATRIX_END)
    if begin >= 0 and end > begin:
        text = text[:begin] + section + text[end + len(MATRIX_END) :].lstrip("\n")
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    MATRIX.write_text(text, encoding="utf-8")


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
    parser.add_argument(
        "--write-corpus",
        action="store_true",
        help="write the packaged conformance corpus (execkit/recorded_cells.json.gz)",
    )
    parser.add_argument(
        "--fill-details",
        action="store_true",
        help="give new expected cells the adapter path's reason, reset and precondition",
    )
    parser.add_argument(
        "--write-matrix", action="store_true", help="write the class matrix into MATRIX.md"
    )
    args = parser.parse_args(argv)
    if args.write_corpus:
        from execkit._corpus import CORPUS_FILE, write_corpus

        target = write_corpus(RECORDED, REPO / "execkit" / CORPUS_FILE)
        print(f"wrote {target.relative_to(REPO)} ({target.stat().st_size} bytes)")
        if not (args.write_matrix or args.json):
            return 0
    if args.fill_details:
        filled = fill_details(measure_recordings())
        print(f"filled {len(filled)} cells of {EXPECTED.relative_to(REPO)}: review them")
        return 0
    if args.write_expected:
        write_expected()
        print(f"wrote {EXPECTED.relative_to(REPO)}: review each class before committing")
        return 0
    if not _recordings():
        print(f"SKIP: no recordings under {RECORDED.relative_to(REPO)} (make record-vendors)")
        return 0
    recorded = measure_recordings()
    corpus = measure_corpus()
    if args.write_matrix:
        write_matrix(recorded, corpus)
        print(f"wrote the classes of {MATRIX.relative_to(REPO)}")
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
