"""Times from a vendor are bounded, and every printer of a time is total (issue #44 item 4).

A claude `rate_limit_event` with `resetsAt` 99999999999999 (or 1e308) parked the lane for
its capped day, but the task's own next attempt was not capped ("retry in 27777278718.8h")
and `execkit task show` / `lane show` exited 70 (`year 3170843 is out of range`). Here: the
ledger bounds a task's wait as it bounds a lane's park, and every printer of a time (the
one module that words them, the dispatcher's lines, the lane lines, the CLI's text and JSON
on a ledger holding such a time from before the bound) gives text for any value.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execkit._lanes import LaneState, LaneView
from execkit._stamp import span, utc_stamp
from execkit.cli import main
from execkit.cli._dispatch import describe_event
from execkit.cli._output import waiting_text
from execkit.dispatch import DispatchEvent, EventKind
from execkit.dispatch._lanes import waiting_reason
from execkit.ledger import Task, open_ledger

LANE = "claude/default"
ABSURD = (99999999999999.0, 1e308, 1.7976931348623157e308, 3e11)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)


@given(ANY_FLOAT)
def test_a_time_is_always_worded(at: float) -> None:
    text = utc_stamp(at)
    assert text and text.isprintable()
    if math.isfinite(at) and -6e10 < at < 2.5e11:
        assert text.endswith("+00:00") and not text.startswith(("after", "before"))


@given(ANY_FLOAT)
def test_a_length_of_time_is_always_worded(seconds: float) -> None:
    text = span(seconds)
    assert text and text.isprintable() and len(text) <= 16


@pytest.mark.parametrize("bad", [None, "soon", object(), 10**400])
def test_what_is_no_time_is_worded_too(bad: object) -> None:
    assert utc_stamp(bad) in ("an unreadable time",) or utc_stamp(bad).startswith("after")  # type: ignore[arg-type]
    assert span(bad) in ("an unknown time", "over 100 years")  # type: ignore[arg-type]


@given(ANY_FLOAT, ANY_FLOAT)
def test_the_dispatchers_lines_are_total(at: float, next_at: float) -> None:
    event = DispatchEvent(
        kind=EventKind.DISPATCHED,
        issue_id="I-1",
        at=1_800_000_000.0,
        attempt=1,
        max_attempts=10,
        status="failed",  # type: ignore[arg-type]
        reason="usage limit",
        next_attempt_at=next_at,
    )
    assert describe_event(event, now=at).startswith("I-1")


@given(ANY_FLOAT)
def test_a_lanes_wait_is_worded_whatever_its_opening(opens_at: float) -> None:
    shown = LaneView(
        lane=LANE,
        state=LaneState.PARKED,
        admits=False,
        probe=False,
        opens_at=opens_at,
        reason="usage limit",
        capped=True,
        stopped_task=None,
    )
    assert waiting_reason(shown).startswith("waiting on lane claude/default until ")
    assert waiting_text(shown).startswith("waiting on lane claude/default until ")


@pytest.mark.parametrize("absurd", ABSURD)
def test_an_absurd_reset_waits_no_longer_than_the_lanes_longest_park(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], absurd: float
) -> None:
    db = tmp_path / "l.db"
    now = time.time()
    with open_ledger(db) as ledger:
        task = _limited(ledger, reset=absurd, now=now)
        longest = ledger.lane_config().max_park_s
        shown = ledger.get_task(task.id, now=now)
        (lane,) = ledger.list_lanes(now=now)
    assert shown.next_attempt_at is not None and shown.next_attempt_at <= now + longest
    assert lane.opens_at is not None and lane.opens_at <= now + longest and lane.capped
    for argv in _every_reader(str(db), task.id):
        assert main(argv) == 0, argv
    out = capsys.readouterr().out
    assert "Traceback" not in out and "h" in out


def _limited(ledger: Any, *, reset: float, now: float) -> Task:
    """A task whose one run met a usage limit on LANE with its reset stated for `reset`."""
    task = ledger.create_task("a", actor="d")
    run = ledger.start_run(task.id, request_key="1", actor="d", lane=LANE, now=now)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="upstream",
        reason="usage limit",
        not_before=reset,
        lane_cause="reset",
        now=now,
    )
    return task  # type: ignore[no-any-return]


def _every_reader(db: str, task_id: str) -> list[list[str]]:
    readers = [
        ["task", "show", task_id],
        ["task", "list"],
        ["task", "runs", task_id],
        ["lane", "show", LANE],
        ["lane", "list"],
    ]
    return [[*argv, "--db", db, *extra] for argv in readers for extra in ([], ["--json"])]


@pytest.mark.parametrize("absurd", ABSURD)
def test_a_time_stored_before_the_bound_is_still_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], absurd: float
) -> None:
    # A ledger written before the bound (or by hand) holds the absurd time itself: every
    # reader still exits 0 and prints it in words.
    db = tmp_path / "l.db"
    now = time.time()
    with open_ledger(db) as ledger:
        task = _limited(ledger, reset=now + 3600, now=now)
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE run_extras SET not_before = ?", (absurd,))
        raw.execute("UPDATE task_summaries SET last_not_before = ?", (absurd,))
        raw.execute("UPDATE lane_events SET until_at = ?", (absurd,))
        raw.execute("UPDATE lane_summaries SET until_at = ?", (absurd,))
    for argv in _every_reader(str(db), task.id):
        assert main(argv) == 0, argv
    out = capsys.readouterr().out
    assert "after 9999-12-31T23:59:59+00:00" in out or json.dumps(absurd) in out
