"""Rows are mapped by column name, on both backends: the order a SELECT names its columns in
cannot shift one value into another's field, and a summary is written back by name."""

from __future__ import annotations

from typing import Any

import pytest
from ledger_backends import AnyLedger

from execkit._budget import Attempt, AttemptStatus, HistorySummary
from execkit._classify import FailureClass
from execkit._errors import StorageError
from execkit.ledger._rows import (
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    TASK_COLUMNS,
    run_from_row,
    summary_row,
    task_from_row,
)

_RUN: dict[str, Any] = {
    "id": "r-1",
    "task_id": "t-1",
    "attempt": 1,
    "status": "failed",
    "failure_class": "upstream",
    "reason": "http 503",
    "request_key": "k",
    "actor": "a",
    "forced": 0,
    "started_at": 10.0,
    "ended_at": 11.0,
    "owner_host": "h",
    "owner_pid": 7,
    "lease_expires_at": 40.0,
    "not_before": 70.0,
    "owner_boot_id": "b",
    "owner_pid_namespace": 4,
    "owner_pid_started_at": 5.0,
    "owner_instance": "i",
    "stopped": 0,
    "lane_held": 1,
    "workspace": "/srv/ws/ISS-1",
    "input_tokens": 100,
    "output_tokens": 20,
    "cache_read_tokens": 0,
    "cache_write_tokens": 3,
    "usd": 0.25,
    "usd_source": "priced",
    "model": "gpt-5",
    "resumed_session": "0b1e-session",
    "fell_back": "fell back from claude/a (stopped) to codex/b",
    "session_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
}

_SUMMARY = HistorySummary(
    attempts_used=1,
    charged_attempts=0,
    uncharged_streak=1,
    streak_reason="http 503",
    running=None,
    last=Attempt(
        number=1,
        status=AttemptStatus.FAILED,
        failure_class=FailureClass.UPSTREAM,
        reason="http 503",
        started_at=10.0,
        ended_at=11.0,
        not_before=70.0,
    ),
)


def _task_row(summary: HistorySummary) -> dict[str, Any]:
    return {
        "id": "t-1",
        "title": "t",
        "status": "open",
        "created_by": "a",
        "created_at": 1.0,
        "max_attempts": 5,
        "max_uncharged_attempts": None,
        "retry_requested_by": None,
        "gave_up_at_attempt": None,
        **summary_row(summary),
    }


def test_the_row_shapes_name_every_column_once() -> None:
    assert set(_RUN) == set(RUN_COLUMNS)
    assert tuple(summary_row(_SUMMARY)) == SUMMARY_COLUMNS == tuple(summary_row(HistorySummary()))
    assert not set(TASK_COLUMNS) & set(SUMMARY_COLUMNS)


def test_a_row_in_any_column_order_maps_to_the_same_value() -> None:
    reordered = dict(reversed(list(_RUN.items())))
    assert run_from_row(reordered) == run_from_row(_RUN)
    run = run_from_row(_RUN)
    assert (run.lease_expires_at, run.not_before, run.owner_pid) == (40.0, 70.0, 7)
    row = _task_row(_SUMMARY)
    task = task_from_row(dict(reversed(list(row.items()))))
    assert task == task_from_row(row)
    assert (task.max_attempts, task.summary) == (5, _SUMMARY)


def test_a_missing_column_is_an_error_not_a_shifted_value() -> None:
    short = {name: value for name, value in _RUN.items() if name != "reason"}
    with pytest.raises(KeyError, match="reason"):
        run_from_row(short)
    with pytest.raises(StorageError, match="run 'r-1' status holds 'paused'"):
        run_from_row({**_RUN, "status": "paused"})


def test_a_task_without_a_summary_row_has_an_empty_summary() -> None:
    row = {**_task_row(_SUMMARY), **dict.fromkeys(SUMMARY_COLUMNS)}
    assert task_from_row(row).summary == HistorySummary()


def test_a_summary_written_by_name_reads_back_the_same(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=3, actor="a", now=1.0)
    run = ledger.start_run(task.id, request_key="1", actor="a", now=10.0)
    ledger.finish_run(
        run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="http 503", now=11.0
    )
    ledger.start_run(task.id, request_key="2", actor="a", now=100.0, lease_s=50)
    # The summary read back on every admission is the one its history gives.
    assert ledger.validate(now=120.0) == []
    shown = ledger.get_task(task.id, now=120.0)
    assert (shown.attempts_started, shown.uncharged_streak, shown.state) == (2, 1, "running")
    (first, second) = ledger.runs(task.id)
    assert (first.reason, first.failure_class, second.lease_expires_at) == (
        "http 503",
        FailureClass.UPSTREAM,
        150.0,
    )
