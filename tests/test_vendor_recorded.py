"""Every recorded real-CLI cell, replayed through execkit's real adapter path, gets what an
operator needs: the class, the reason, the precondition and the retry timing of
fixtures/recorded/expected.json.

Each cell's recorded output is reproduced by its stand-in (tests/vendors/replay.py: Python,
no node), put first on the PATH the child is started with, and run by
`execkit.run_command(get_adapter(cli), argv)` exactly as argv.json says, and a few cells
through `execkit run --adapter CLI --json -- PROMPT` in a fresh interpreter (which builds the
adapter's argv around the prompt; the stand-in ignores its arguments). All stand-ins are
written before the first starts (an open script forked into another thread's child fails
to exec with ETXTBSY), then the cells run in parallel; a recorded hang is killed after
`HANG_S`, as execkit kills a real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
VENDORS = REPO / "tests" / "vendors"
RECORDED = REPO / "fixtures" / "recorded"
if str(VENDORS) not in sys.path:
    sys.path.insert(0, str(VENDORS))

import measure  # noqa: E402
from clis import CLI_NAMES  # noqa: E402
from fake_api import SCENARIOS  # noqa: E402
from replay import (  # noqa: E402
    Recording,
    adapter_for,
    load,
    recorded_at,
    recorded_zone,
    write_replay,
)
from setups import applies  # noqa: E402

from execkit import AgentProof, AgentStatus, get_adapter, run_command  # noqa: E402
from execkit._attempt import lane_cause  # noqa: E402
from execkit._classify import FailureClass  # noqa: E402

HANG_S = 1.0
PROMPT = "Reply with one short sentence."  # record.py's
PATHS = sorted(p.parent for p in RECORDED.glob("*/*/meta.json"))
EXPECTED: dict[str, dict[str, Any]] = json.loads(
    (RECORDED / "expected.json").read_text(encoding="utf-8")
)["cells"]
KEYS = [f"{p.parent.name}/{p.name}" for p in PATHS]
# Through the CLI as well: one cell per vendor, each class, a wall-clock reset, a hang.
CLI_CELLS = [
    "claude/auth_401",
    "codex/usage_limit",
    "gemini/rate_limit_429",
    "opencode/connection_refused",
    "gemini/retrying_503_killed",
    "pi/server_500",
    "amp/no_credentials",
    "crush/not_installed",
    # Stopped by the gemini adapter's watch: its quota retry announced a 298 s sleep.
    "gemini/limit_longer_than_timeout",
]


def _path_env(bin_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    return env


def _starter(bin_dir: Path) -> Callable[..., subprocess.Popen[bytes]]:
    """`spawn`'s start seam, with the stand-in's directory first on the child's PATH (the
    program is looked up on the PATH of the environment it is started with)."""

    def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs["env"] = _path_env(bin_dir, kwargs.get("env"))
        return subprocess.Popen(argv, **kwargs)

    return start


@pytest.fixture(scope="module")
def stand_ins() -> Iterator[dict[str, tuple[Recording, Path]]]:
    with tempfile.TemporaryDirectory(prefix="execkit-recorded-") as root:
        yield {
            key: (load(path), write_replay(path, Path(root) / key.replace("/", "-")))
            for key, path in zip(KEYS, PATHS, strict=True)
        }


@pytest.fixture(scope="module")
def proofs(stand_ins: dict[str, tuple[Recording, Path]]) -> dict[str, AgentProof]:
    def run(key: str) -> AgentProof:
        cell, bin_dir = stand_ins[key]
        timeout = HANG_S if cell.meta.get("timed_out") else 60.0
        # Each cell's stated resets are read against its recording's clock and zone, so a
        # `try again at 4:00 PM` classes the same at any hour (replay.adapter_for).
        return run_command(
            adapter_for(cell),
            cell.argv,
            timeout_s=timeout,
            kill_grace=1.0,
            start=_starter(bin_dir),
        )

    with recorded_zone(), ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(KEYS, pool.map(run, KEYS), strict=True))


def _class(proof_class: FailureClass | None) -> str | None:
    return None if proof_class is None else proof_class.value


def test_expected_covers_exactly_the_recorded_cells() -> None:
    assert sorted(EXPECTED) == KEYS
    # Every CLI in every scenario it can be put in (tests/vendors/setups.py's `applies`).
    wanted = sorted(
        f"{cli}/{scenario}" for cli in CLI_NAMES for scenario in SCENARIOS if applies(cli, scenario)
    )
    assert wanted == KEYS
    assert len(KEYS) >= 88
    for key, want in EXPECTED.items():
        assert want["class"] in (None, "work", "environment", "upstream"), key
        assert want.get("why"), key
        if want["class"] is not None:
            assert want.get("reason"), key
        if want["class"] == "environment":
            assert want.get("precondition_has"), key


def _check(key: str, proof: dict[str, Any]) -> None:
    want = EXPECTED[key]
    assert proof["class"] == want["class"], (key, proof)
    if want["class"] is None:
        assert proof["status"] == "succeeded", key
        return
    assert proof["status"] == "failed"
    assert proof["reason"] == want["reason"], (key, proof["reason"])
    if want["class"] == "environment":
        assert proof["precondition"], key
        for part in want["precondition_has"]:
            assert part in proof["precondition"], (key, part, proof["precondition"])
    else:
        assert proof["precondition"] is None, key
    wait = want.get("retry_after_s")
    if wait is None:
        assert proof["retry_after_s"] is None, (key, proof["retry_after_s"])
    elif isinstance(wait, list):
        low, high = wait
        assert proof["retry_after_s"] is not None, key
        assert low <= proof["retry_after_s"] <= high, (key, proof["retry_after_s"])
    else:
        assert proof["retry_after_s"] == pytest.approx(wait), key


@pytest.mark.parametrize("key", KEYS)
def test_each_recorded_cell_gets_what_an_operator_needs(
    key: str, proofs: dict[str, AgentProof]
) -> None:
    proof = proofs[key]
    _check(key, proof.to_dict())
    if proof.status is AgentStatus.FAILED:
        assert proof.effective_class is FailureClass(EXPECTED[key]["class"])


def test_upstream_precision_and_every_class_on_the_adapter_path(
    proofs: dict[str, AgentProof],
) -> None:
    pairs = [(EXPECTED[key]["class"], _class(proofs[key].failure_class)) for key in KEYS]
    figures = measure.figures(pairs)
    assert figures.upstream_precision == 1.0
    assert figures.upstream_recall == 1.0
    assert figures.agreement == 1.0


def _zone_of_the_recording_hour(cell: Recording) -> str:
    """A POSIX TZ whose wall clock reads now what UTC read when `cell` was recorded (to
    within half a day): a fresh `execkit run` reads a wall-clock reset such as `try again
    at 4:00 PM` as far ahead as it was then, whatever the hour of this run."""
    shift = (recorded_at(cell) - time.time()) % 86400
    if shift > 43200:
        shift -= 86400
    seconds = abs(round(shift))
    sign = "-" if shift >= 0 else "+"  # POSIX counts west of Greenwich as positive
    return f"<REC>{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _cli_proof(cell: Recording, bin_dir: Path, timeout: float | None) -> dict[str, Any]:
    command = [sys.executable, "-m", "execkit", "run", "--adapter", cell.cli, "--json"]
    if timeout is not None:
        command += ["--timeout", str(timeout), "--kill-grace", "1"]
    env = _path_env(bin_dir)
    env["TZ"] = _zone_of_the_recording_hour(cell)
    done = subprocess.run(
        [*command, "--", *(cell.argv[1:] if cell.cli == "generic" else [PROMPT])],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    proof: dict[str, Any] = json.loads(done.stdout)
    proof["exit_status"] = done.returncode
    return proof


def test_a_few_cells_through_execkit_run_adapter_json(
    stand_ins: dict[str, tuple[Recording, Path]],
) -> None:
    def run(key: str) -> dict[str, Any]:
        cell, bin_dir = stand_ins[key]
        return _cli_proof(cell, bin_dir, HANG_S if cell.meta.get("timed_out") else None)

    with ThreadPoolExecutor(max_workers=len(CLI_CELLS)) as pool:
        results = dict(zip(CLI_CELLS, pool.map(run, CLI_CELLS), strict=True))
    for key, proof in results.items():
        _check(key, proof)
    # The shell conventions of `execkit run`: 127 only for a program that never started; a
    # refused credential is environment (the JSON says so) but the program ran: 1.
    assert results["claude/auth_401"]["exit_status"] == 1
    assert results["codex/usage_limit"]["exit_status"] == 1


def test_matrix_md_holds_the_current_classes() -> None:
    recorded = measure.measure_recordings()
    corpus = measure.measure_corpus()
    text = (RECORDED / "MATRIX.md").read_text(encoding="utf-8")
    section = measure.matrix_section(recorded, corpus)
    assert section in text, "run: python tests/vendors/measure.py --write-matrix"
    assert text.index(measure.MATRIX_BEGIN) > text.index("| cli | scenario |")
    corpus_figures = measure.figures((v.expected, v.adapter) for v in corpus)
    assert corpus_figures.upstream_precision == 1.0


# What each recorded refusal does to its vendor lane, through the adapter (issue #28): only a
# reset from the vendor's own structure parks it; refused credentials or billing stop it.
LANE_CAUSES = {
    "claude/usage_limit_gateway": "reset",  # stream-json `rate_limit_event` with `resetsAt`
    "claude/usage_limit": None,  # a 429 in prose only: it waits, never parks
    "claude/auth_401": "credentials",
    "claude/payment_402": "billing",
    "claude/auth_401_stream": "credentials",  # stream-json: `error: authentication_failed`
    "claude/payment_402_stream": "billing",  # stream-json: `error: billing_error`
    "gemini/auth_401": "credentials",
    "gemini/no_credentials": "credentials",  # exit 41
    "gemini/untrusted_workspace": None,  # exit 55: the workspace's fix, not the lane's
    "gemini/rate_limit_429": "reset",  # the error's RetryInfo delay (`retryDelayMs`)
    # The fake's 429 carries RetryInfo as the real API does (below); gemini-cli 0.61 drops
    # it for a per-day quota id and prints `retryDelayMs: undefined`: it waits, never parks.
    "gemini/usage_limit": None,
    "codex/usage_limit": "reset",  # its fixed "try again at <time>" usage-limit sentence
    # Issue 52: printed to the minute, read to the minute's end: each parks the lane, the
    # one inside the current minute too (it read as a reset already past, `now`).
    "codex/usage_limit_this_minute": "reset",
    "codex/usage_limit_later_minute": "reset",
    "codex/usage_limit_on_minute": "reset",
    "claude/overloaded_529_then_dropped": None,  # unreachable: neither parks nor stops
    # Issue 52: a limit the CLI would sleep out. Its announcement, read as it is printed,
    # ends the attempt with the announced reset: the lane parks instead of a slot sleeping.
    "gemini/limit_longer_than_timeout": "reset",  # `Suggested retry after 298s.. Retrying ...`
    "gemini/limit_longer_than_timeout_one_attempt": "reset",  # `retryDelayMs: 298000`
    "qwen/limit_longer_than_timeout_unattended": "reset",  # `Waiting for API capacity...`
    # Slept silently inside the CLI: nothing to read, charged as a timeout.
    "qwen/limit_longer_than_timeout": None,
    "pi/limit_longer_than_timeout": None,
    # Handed back by pi's setting, its wait in the vendor's prose: it waits, never parks.
    "pi/limit_longer_than_timeout_no_sdk_retries": None,
}


@pytest.mark.parametrize("key", sorted(LANE_CAUSES))
def test_recorded_refusals_park_or_stop_the_lane_from_structure_only(
    key: str, proofs: dict[str, AgentProof]
) -> None:
    proof = proofs[key]
    not_before = None if proof.retry_after_s is None else 1.0 + proof.retry_after_s
    cause = lane_cause(get_adapter(stand_in_cli(key)), proof, not_before)
    assert cause == LANE_CAUSES[key], (key, proof.to_dict())
    assert proof.reset_from_structure is (cause == "reset"), key


def stand_in_cli(key: str) -> str:
    return key.split("/", 1)[0]


def test_the_fake_google_usage_limit_carries_retry_info_and_gemini_cli_drops_it() -> None:
    # Issue #28 (d): the fake API's Google usage limit answers as the real API does, a 429
    # RESOURCE_EXHAUSTED with a QuotaFailure (a per-day quota id) and a google.rpc.RetryInfo
    # `retryDelay`. gemini-cli 0.61.0 (`classifyGoogleError`) returns its TerminalQuotaError
    # for any `PerDay`/`Daily` quota id before it reads RetryInfo, so the recorded cell
    # says `retryDelayMs: undefined`; with a per-minute quota (`rate_limit_429`) it reads
    # the delay, and that one parks the lane.
    from fake_api import _google_reply

    for kind, printed in (("usage_limit", "undefined"), ("rate_limit_429", "17000")):
        reply = _google_reply(kind)
        details = json.loads(reply.body)["error"]["details"]
        delays = [d["retryDelay"] for d in details if d["@type"].endswith("google.rpc.RetryInfo")]
        assert reply.status == 429 and len(delays) == 1, (kind, details)
        quota_ids = [v["quotaId"] for d in details for v in d.get("violations", [])]
        assert ("PerDay" in quota_ids[0]) is (kind == "usage_limit")
        stderr = (RECORDED / "gemini" / kind / "stderr").read_text(encoding="utf-8")
        assert f"retryDelayMs: {printed}" in stderr
