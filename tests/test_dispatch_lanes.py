"""The dispatcher on vendor lanes (issue #28), counted on a virtual clock: 50 tasks on one
lane meet a usage limit with a structured reset, or refused credentials; with lanes the
vendor is asked once before the lane opens, nothing is charged, and the other tasks wait
without their cards moving. The scenarios are benchmarks/bench_lanes.py's (counts only)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_lanes.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_lanes", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_lanes"] = module
    spec.loader.exec_module(module)
    return module


def test_a_usage_limit_is_met_once_with_lanes_and_fifty_times_without(
    bench: ModuleType, tmp_path: Path
) -> None:
    on = bench.scenario(lanes=True, db=tmp_path / "on.db")
    off = bench.scenario(lanes=False, db=tmp_path / "off.db")
    assert on["calls_before_open"] <= 2 and off["calls_before_open"] >= 50
    assert on["charged_failures"] == off["charged_failures"] == 0
    assert on["done"] == off["done"] == 50


def test_an_expired_credential_is_met_once_until_the_lane_is_resumed(
    bench: ModuleType, tmp_path: Path
) -> None:
    on = bench.scenario(lanes=True, credentials=True, db=tmp_path / "on.db")
    off = bench.scenario(lanes=False, credentials=True, db=tmp_path / "off.db")
    assert on["calls_before_open"] == 1 and off["calls_before_open"] == 50
    # The task that hit the stop is blocked as before (its card moved); the 49 held ones ran.
    assert on["done"] == 49 and on["charged_failures"] == 0


def test_the_dashboard_says_which_lane_an_issue_waits_on(bench: ModuleType, tmp_path: Path) -> None:
    from execkit.dispatch import DispatchConfig, Dispatcher, InlineExecutor, issue_statuses
    from execkit.ledger import open_ledger

    clock = bench.Clock()
    vendor = bench.LimitedVendor(clock, clock.now + 3600)
    board = bench._board()
    config = DispatchConfig(max_concurrent_agents=8)
    with open_ledger(tmp_path / "l.db") as ledger:
        Dispatcher(board, vendor, ledger, config, clock, executor=InlineExecutor()).tick()
        rows = issue_statuses(ledger, config, board=board, now=clock.now + 1)
    assert len(vendor.calls) == 1
    waiting = [row for row in rows if (row.reason or "").startswith("waiting on lane ")]
    assert len(waiting) == len(rows) == 50  # the one that met the limit waits on it too
    assert all(row.board_state == "todo" for row in rows)  # no card was moved
