"""`execkit lane list|show|resume|park` and the lane line of `task show` (issue #28): text and
--json, exit codes for a refused admission, bad input refused with nothing stored."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.ledger import open_ledger

LANE = "claude/default"


def _parked(db: Path) -> None:
    with open_ledger(db) as ledger:
        task = ledger.create_task("a", actor="d")
        ledger.create_task("b", actor="d")
        run = ledger.start_run(task.id, request_key="1", actor="d", lane=LANE)
        ledger.finish_run(
            run.id,
            "failed",
            failure_class="upstream",  # type: ignore[arg-type]
            reason="usage limit",
            not_before=time.time() + 3600,
            lane_cause="reset",
        )


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out if code == 0 else captured.err)


def test_list_show_and_task_show_name_the_lane_and_when_it_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "l.db")
    _parked(Path(db))
    assert main(["lane", "list", "--db", db]) == 0
    assert "claude/default  parked" in capsys.readouterr().out
    code, doc = _json(capsys, "lane", "show", LANE, "--db", db)
    assert code == 0 and doc["state"] == "parked" and len(doc["events"]) == 1  # type: ignore[arg-type]
    assert main(["task", "show", "t-1", "--db", db]) == 0
    assert "waiting on lane claude/default until " in capsys.readouterr().out
    # A run start through the CLI on that lane is refused with its own exit code.
    code, error = _json(capsys, "run", "start", "t-2", "--db", db, "--lane", LANE)
    assert code == EXIT_CODES["lane_waiting"] == 16
    assert error["error"]["code"] == "lane_waiting"  # type: ignore[index]


def test_resume_and_park_and_their_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "l.db")
    _parked(Path(db))
    code, doc = _json(capsys, "lane", "resume", LANE, "--db", db, "--reason", "checked")
    assert code == 0 and doc["state"] == "open" and doc["resumed"] is True
    assert main(["lane", "resume", LANE, "--db", db]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    code, doc = _json(capsys, "lane", "park", LANE, "--for", "600", "--db", db)
    assert code == 0 and doc["state"] == "parked"
    for bad in (["--until", "soon"], ["--until", "2001-01-01T00:00:00+00:00"], ["--for", "-5"]):
        code, _ = _json(capsys, "lane", "park", LANE, "--db", db, *bad)
        assert code == EXIT_CODES["invalid"], bad
    code, _ = _json(capsys, "lane", "show", "gemini/default", "--db", db)
    assert code == EXIT_CODES["not_found"]
    code, _ = _json(capsys, "lane", "show", "nonsense", "--db", db)
    assert code == EXIT_CODES["invalid"]
    with open_ledger(db) as ledger:
        assert [event.kind for event in ledger.lane_history(LANE)] == ["reset", "resume", "park"]


def test_lane_config_shows_changes_and_refuses_bad_values_storing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "l.db")
    _parked(Path(db))
    assert main(["lane", "config", "--db", db]) == 0
    assert "breaker-k       3 " in capsys.readouterr().out
    code, doc = _json(capsys, "lane", "config", "--db", db, "--breaker-k", "5", "--cool-max", "600")
    assert code == 0 and doc["breaker_k"] == 5 and doc["cool_max_s"] == 600
    for flag, value, says in (
        ("--breaker-k", "0", "breaker_k must be an integer in 1..1000"),
        ("--breaker-k", "two", "--breaker-k must be a whole number"),
        ("--breaker-window", "0", "breaker_window_s must be a number of seconds in 1..86400"),
        ("--max-park", "soon", "--max-park must be a number of seconds"),
        ("--cool-max", "5", "cool_max_s must be >= cool_base_s"),
    ):
        code, error = _json(capsys, "lane", "config", "--db", db, flag, value)
        assert code == EXIT_CODES["invalid"]
        assert error["error"]["code"] == "invalid"  # type: ignore[index]
        assert says in error["error"]["message"]  # type: ignore[index]
    with open_ledger(db) as ledger:
        assert ledger.lane_config().breaker_k == 5 and ledger.lane_config().cool_max_s == 600
        assert [e.action for e in ledger.audit_events()].count("lane.config") == 1


def test_the_status_table_says_which_open_task_waits_on_a_lane(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A dispatched issue whose last attempt parked its lane (a usage limit with a reset):
    # the operator's table names the wait before the last failure, as --json does, and an
    # issue on no lane keeps its last failure alone.
    db = tmp_path / "l.db"
    with open_ledger(db) as ledger:
        for issue, lane in (("ISS-1", LANE), ("ISS-2", None)):
            task = ledger.create_task(f"board:{issue}", actor="d")
            run = ledger.start_run(task.id, request_key=issue, actor="d", lane=lane)
            ledger.finish_run(
                run.id,
                "failed",
                failure_class="upstream",  # type: ignore[arg-type]
                reason=f"usage limit {issue}",
                not_before=time.time() + 3600,
                lane_cause="reset" if lane else None,
            )
    assert main(["status", "--db", str(db)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert f"waiting on lane {LANE} until " in lines["ISS-1"]
    assert lines["ISS-1"].endswith("; last failure: usage limit ISS-1")
    assert "waiting on lane" not in lines["ISS-2"]
    assert lines["ISS-2"].endswith(" usage limit ISS-2")
    code, doc = _json(capsys, "status", "--db", str(db))
    assert code == 0
    reasons = {row["issue_id"]: row["reason"] for row in doc["issues"]}  # type: ignore[attr-defined]
    assert reasons["ISS-1"].startswith(f"waiting on lane {LANE} until ")


def test_next_is_the_later_of_a_tasks_backoff_and_its_lanes_opening_and_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ISS-1's own backoff ends in about 10 s, but the lane another task parked opens in 54 s:
    # its NEXT is the lane's, said so (it showed `in 10s` while nothing could run for 54).
    # ISS-3 is held by a stopped lane: no time, and the row says it waits on its lane.
    # ISS-2, on no lane, shows its own backoff.
    from _support import table_columns

    db = tmp_path / "l.db"
    now = time.time()
    stopped_lane = "codex/default"
    with open_ledger(db) as ledger:
        cases = (
            ("ISS-0", LANE, "usage limit"),
            ("ISS-1", LANE, "http 503"),
            ("ISS-2", None, "http 503"),
            ("ISS-3", stopped_lane, "credentials"),
        )
        runs = []  # all admitted first: the lane parks at ISS-0's result
        for issue, lane, _ in cases:
            task = ledger.create_task(f"board:{issue}", actor="d")
            runs.append(ledger.start_run(task.id, request_key=issue, actor="d", lane=lane, now=now))
        for run, (issue, _, reason) in zip(runs, cases, strict=True):
            environment = reason == "credentials"
            ledger.finish_run(
                run.id,
                "failed",
                failure_class="environment" if environment else "upstream",  # type: ignore[arg-type]
                reason=reason,
                not_before=now + 54 if issue == "ISS-0" else None,
                lane_cause=(
                    "credentials" if environment else "reset" if issue == "ISS-0" else None
                ),
                now=now,
            )
        ledger.retry_task("t-4", actor="d", force=True, now=now)  # open, held by the stop
    assert main(["status", "--db", str(db)]) == 0
    rows = {row["ISSUE"]: row for row in table_columns(capsys.readouterr().out)}
    assert re.fullmatch(r"in (5\d)s \(lane\)", rows["ISS-1"]["NEXT"]), rows["ISS-1"]
    assert re.fullmatch(r"in \d+s", rows["ISS-2"]["NEXT"]), rows["ISS-2"]
    assert rows["ISS-3"]["NEXT"] == "on its lane", rows["ISS-3"]
    code, doc = _json(capsys, "status", "--db", str(db))
    assert code == 0
    by_issue = {row["issue_id"]: row for row in doc["issues"]}  # type: ignore[attr-defined]
    assert by_issue["ISS-1"]["waits_on"] == "lane"
    assert now + 54 <= by_issue["ISS-1"]["next_attempt_at"] < now + 58  # the probe's margin
    assert by_issue["ISS-2"]["waits_on"] == "backoff"


def test_lane_show_says_when_the_lane_closed_and_why_and_how_many_events_it_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 25 upstream failures spread out (none trips the breaker), then a usage limit with a
    # reset: the text names the event that parked the lane and what it became, and says it
    # shows the last 20 of 26 (only --json had said how many there were).
    db = tmp_path / "l.db"
    now = time.time() - 10_000
    with open_ledger(db) as ledger:
        for n in range(26):
            task = ledger.create_task(f"t{n}", actor="d")
            at = now + 100 * n
            run = ledger.start_run(task.id, request_key=str(n), actor="d", lane=LANE, now=at)
            last = n == 25
            ledger.finish_run(
                run.id,
                "failed",
                failure_class="upstream",  # type: ignore[arg-type]
                reason="usage limit" if last else "http 503",
                not_before=at + 20_000 if last else None,
                lane_cause="reset" if last else None,
                now=at + 1,
            )
    assert main(["lane", "show", LANE, "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  the last 20 of 26 events (--json lists them all):" in out
    moved = [line for line in out if " -> " in line]
    assert len(moved) == 1 and " reset until " in moved[0]
    assert moved[0].endswith("(usage limit)") and "-> parked until " in moved[0]
