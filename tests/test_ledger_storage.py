"""What the SQLite store does with files it did not expect: empty, foreign, damaged,
unreachable. Never a silent re-initialisation, never a traceback, every bad row named."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_backends import SQLITE_BUCKETS_UNDONE

from execkit._classify import FailureClass
from execkit._errors import ExecKitError, InvalidInput, NotFound, StorageError
from execkit.ledger import open_ledger


def make_ledger(path: Path) -> None:
    with open_ledger(path) as ledger:
        task = ledger.create_task("t", actor="a")
        run = ledger.start_run(task.id, request_key="1", actor="a", now=1)
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, now=2)


def test_an_empty_file_is_never_silently_made_a_ledger(tmp_path: Path) -> None:
    empty = tmp_path / "ledger.db"
    empty.touch()
    for create in (True, False):
        with pytest.raises(StorageError, match="empty file"):
            open_ledger(empty, create=create)
    assert empty.stat().st_size == 0
    # Only an explicit init makes it one.
    with open_ledger(empty, init=True) as ledger:
        assert ledger.list_tasks() == []
    assert empty.stat().st_size > 0


def test_a_path_that_is_a_directory_or_under_a_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="is a directory"):
        open_ledger(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InvalidInput, match="parent of the ledger path is a file"):
        open_ledger(blocker / "ledger.db")
    assert blocker.read_text() == "x"


def test_reading_never_creates_or_migrates(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        open_ledger(tmp_path / "missing.db", create=False, upgrade=False)
    assert not (tmp_path / "missing.db").exists()


def test_rows_outside_their_domain_are_named_not_crashed_on(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    make_ledger(db)
    conn = sqlite3.connect(db)
    # A newer writer, or a hand edit past the CHECKs: values this execkit does not know.
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute("UPDATE runs SET status = 'paused', failure_class = 'cosmic' WHERE id = 'r-1'")
    conn.commit()
    conn.close()
    with open_ledger(db) as ledger:
        with pytest.raises(StorageError, match="run 'r-1' status holds 'paused'"):
            ledger.runs("t-1")
        problems = ledger.validate()
    # SQLite's own check first, then each bad value with its row.
    assert problems[0] == "storage: CHECK constraint failed in runs"
    assert problems[1:] == [
        "r-1: status of run is 'paused', not one of running, succeeded, failed, abandoned",
        "r-1: class of run is 'cosmic', not one of work, environment, upstream",
    ]


def test_a_dropped_table_is_a_storage_error_and_a_named_problem(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    make_ledger(db)
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE task_summaries")
    conn.commit()
    conn.close()
    with open_ledger(db) as ledger:
        with pytest.raises(StorageError):
            ledger.list_tasks()
        assert "storage: table task_summaries is missing" in ledger.validate()


def test_a_summary_that_drifted_from_its_history_is_reported_and_repaired(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    make_ledger(db)
    with open_ledger(db) as ledger:
        ledger._conn.execute("UPDATE task_summaries SET uncharged_streak = 3")
        (problem,) = ledger.validate(now=3)
        assert "stored summary differs from its history" in problem
        assert ledger.get_task("t-1", now=10**10).blocked_on == "upstream"  # what it read
        assert ledger.repair(now=3) == ["t-1: rebuilt its summary from its history"]
        assert ledger.validate(now=3) == []
        assert ledger.get_task("t-1", now=10**10).state == "ready"


def test_the_summary_migration_builds_summaries_for_an_old_ledger(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    make_ledger(db)
    with open_ledger(db) as ledger:
        ledger._conn.execute("DELETE FROM task_summaries")
        ledger._conn.execute("DELETE FROM schema_version WHERE version >= 3")
        for statement in SQLITE_BUCKETS_UNDONE:  # step 13's triggers read later tables
            ledger._conn.execute(statement)
        # every table of a step after 3
        later = (
            "lane_events",
            "lane_summaries",
            "run_lanes",
            "run_lane_holds",
            "board_outbox",
            "run_costs",
            "task_budgets",
            "spend_warnings",
            "notify_events",
            "notify_endpoints",
            "notify_deliveries",
        )
        for table in (
            "task_summaries",
            "run_extras",
            "task_extras",
            "ledger_meta",
            "role_grants",
            "run_owners",
            "run_stops",
            *later,
        ):
            ledger._conn.execute(f"DROP TABLE {table}")
        ledger._conn.execute("DROP INDEX runs_by_task_request_key")
    with open_ledger(db) as migrated:
        assert migrated.migration is not None and migrated.migration.from_version == 2
        shown = migrated.get_task("t-1", now=10**10)
        assert (shown.attempts_started, shown.uncharged_streak) == (1, 1)
        assert migrated.validate() == []
        assert len(migrated.ledger_id()) == 32


_BAD_ROWS = st.fixed_dictionaries(
    {
        "status": st.one_of(st.sampled_from(["running", "failed", "x"]), st.text(max_size=5)),
        "failure_class": st.one_of(
            st.none(), st.sampled_from(["work", "?"]), st.integers(-(2**63), 2**63 - 1)
        ),
        "attempt": st.one_of(st.integers(-2, 4), st.text(max_size=3)),
        "reason": st.one_of(st.none(), st.text(max_size=20), st.binary(max_size=8)),
        "started_at": st.one_of(st.floats(allow_nan=True), st.text(max_size=3)),
    }
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(_BAD_ROWS, min_size=1, max_size=3))
def test_prop_any_stored_row_reads_as_a_result_or_a_storage_error(
    tmp_path_factory: pytest.TempPathFactory, rows: list[dict[str, object]]
) -> None:
    # Fuzz the reader: whatever a damaged file holds, reading gives data or an ExecKitError
    # naming the problem, and `validate` lists problems instead of raising.
    db = tmp_path_factory.mktemp("fuzz") / "ledger.db"
    make_ledger(db)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    for n, row in enumerate(rows, start=10):
        conn.execute(
            "INSERT OR IGNORE INTO runs (seq, id, task_id, attempt, status, failure_class, reason, "
            "request_key, actor, forced, owner_host, owner_pid, started_at) "
            "VALUES (?, ?, 't-1', ?, ?, ?, ?, ?, 'x', 0, 'h', 1, ?)",
            (
                n,
                f"r-{n}",
                row["attempt"],
                row["status"],
                row["failure_class"],
                row["reason"],
                f"k-{n}",
                row["started_at"],
            ),
        )
    conn.commit()
    conn.close()
    with open_ledger(db) as ledger:
        for read in (lambda: ledger.runs("t-1"), ledger.list_tasks, ledger.audit_events):
            with contextlib.suppress(ExecKitError):
                read()
        problems = ledger.validate(now=10)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
