"""Schema versions: additive migration of a populated version-1 file, refusal of newer ones."""

from __future__ import annotations

import getpass
import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from ledger_backends import SQLITE_BUCKETS_UNDONE

from execkit._errors import SchemaTooNew, StorageError
from execkit.ledger import SCHEMA_VERSION, Migration, ledger_status, migrate, open_ledger
from execkit.ledger._sqlite.schema import SCHEMA_STEPS


def _legacy_fingerprint(title: str) -> str:
    canonical = json.dumps({"title": title}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _build_version_1(path: Path) -> None:
    """A populated file as a version-1 (pre attempt limits) execkit would have left it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    for statement in SCHEMA_STEPS[1]:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, 1.5)")
    conn.executemany(
        "INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (1, "t-1", "old open task", "open", "alice", 100.25, 100.25),
            (2, "t-2", "old done task", "done", "bob", 200.5, 260.125),
        ],
    )
    conn.executemany(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                1,
                "r-1",
                "t-1",
                1,
                "failed",
                "upstream",
                "http 503",
                "k1",
                "alice",
                0,
                "h",
                1,
                5.0,
                110.0,
                111.0,
            ),
            (
                2,
                "r-2",
                "t-2",
                1,
                "failed",
                None,
                "wrong",
                "k2",
                "bob",
                0,
                "h",
                1,
                5.0,
                210.0,
                220.0,
            ),
            (
                3,
                "r-3",
                "t-2",
                2,
                "succeeded",
                None,
                None,
                "k3",
                "bob",
                0,
                "h",
                1,
                5.0,
                250.0,
                260.125,
            ),
            (
                4,
                "r-4",
                "t-1",
                2,
                "failed",
                "work",
                "bad",
                "k4",
                "alice",
                1,
                "h",
                1,
                5.0,
                300.0,
                301.0,
            ),
        ],
    )
    conn.execute(
        "INSERT INTO idempotency VALUES ('task.create', 'legacy-key', ?, ?, 100.25)",
        (_legacy_fingerprint("old open task"), json.dumps({"task_id": "t-1"})),
    )
    conn.execute("INSERT INTO audit VALUES (1, 100.25, 'alice', 'task.create', 't-1', NULL, '{}')")
    conn.execute("COMMIT")
    conn.close()


def _rows(path: Path, table: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        # quote() renders each value exactly as stored (type and bits), so equal lists mean
        # byte-for-byte equal rows, not merely equal-looking Python values.
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        quoted = ", ".join(f"quote({c})" for c in columns)
        return list(conn.execute(f"SELECT {quoted} FROM {table} ORDER BY rowid"))
    finally:
        conn.close()


def _table_sql(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"))
    finally:
        conn.close()


def test_a_fresh_file_goes_through_every_step() -> None:
    assert sorted(SCHEMA_STEPS) == list(range(1, SCHEMA_VERSION + 1))
    # 8 is issue #45's step (spend); 9, 10 and 12 are issue #46's; 11 is issue #49's.
    assert SCHEMA_VERSION == 14


def test_opening_a_version_1_file_migrates_it_additively(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _build_version_1(db)
    before = {table: _rows(db, table) for table in ("tasks", "runs", "audit", "idempotency")}
    sql_before = _table_sql(db)

    with open_ledger(db) as ledger:
        assert ledger.migration is not None
        assert (ledger.migration.from_version, ledger.migration.to_version) == (1, SCHEMA_VERSION)
        backup = ledger.migration.backup_path
        assert ledger.schema_version() == SCHEMA_VERSION
        # The migrated tasks read with no explicit limit and their whole history.
        old = ledger.get_task("t-1", now=10**10)
        assert (old.max_attempts, old.attempts_started, old.status) == (0, 2, "open")
        assert ledger.get_task("t-2").state == "done"
        assert ledger.validate() == []
        assert ledger.history("t-1")[1].forced is True

    for table, rows in before.items():
        assert _rows(db, table) == rows, table
    sql_after = _table_sql(db)
    # Additive: every old object is defined exactly as before; only new ones appear.
    assert {name: sql_after[name] for name in sql_before} == sql_before
    assert set(sql_after) - set(sql_before) == {
        "task_attempt_limits",
        "runs_by_task_creation",
        "run_extras",
        "task_extras",
        "task_summaries",
        "ledger_meta",
        "role_grants",
        "runs_by_task_request_key",
        "run_extras_by_lease",
        "run_owners",
        "run_stops",
        "lane_events",
        "lane_events_by_lane",
        "lane_summaries",
        "run_lanes",
        "run_lane_holds",
        "board_outbox",
        "run_costs",
        "run_costs_by_start",
        "run_costs_by_task",
        "task_budgets",
        "spend_warnings",
        "notify_events",
        "notify_endpoints",
        "notify_deliveries",
        "spend_buckets",
        "run_costs_by_lane",
        "runs_running",
        "spend_buckets_on_cost_insert",
        "spend_buckets_on_cost_update",
        "run_costs_on_end",
    }
    assert _rows(db, "schema_version")[0] == ("1", "1.5")

    # The backup is the untouched version-1 file.
    assert backup is not None and backup.is_file()
    assert backup.parent == db.parent
    assert _rows(backup, "schema_version") == [("1", "1.5")]
    assert _rows(backup, "runs") == before["runs"]
    assert "task_attempt_limits" not in _table_sql(backup)


def test_a_legacy_creation_key_still_replays_after_migration(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _build_version_1(db)
    with open_ledger(db) as ledger:
        # ADR 0033: the fingerprint with max_attempts 0 is the legacy one, unchanged.
        again = ledger.create_task("old open task", idempotency_key="legacy-key", actor="x")
        assert again.id == "t-1"
        assert len(ledger.list_tasks()) == 2


def test_the_migrated_file_enforces_limits(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _build_version_1(db)
    with open_ledger(db) as ledger:
        ledger.grant_role("op", "agent.operate", actor=getpass.getuser())
        ledger.set_attempt_limit("t-1", 3, expected_max_attempts=0, actor="op")
        assert ledger.start_run("t-1", request_key="new", actor="op").attempt == 3
        ledger.finish_run("r-5", "failed")
        assert ledger.get_task("t-1").blocked_on == "attempt_limit"


def test_concurrent_upgrades_back_up_once_the_state_they_migrate(tmp_path: Path) -> None:
    """The backup is taken under the migration's write lock: a write committed while the
    upgraders wait is in it (restoring it loses nothing), and only one of two upgraders
    that read the old version backs up and migrates."""
    db = tmp_path / "ledger.db"
    _build_version_1(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a version-1 writer, busy as the upgraders start
    migrations: list[Migration | None] = []
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            with open_ledger(db) as ledger:
                migrations.append(ledger.migration)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    upgraders = [threading.Thread(target=upgrade) for _ in range(2)]
    try:
        for upgrader in upgraders:
            upgrader.start()
        # Give both time to read version 1 and queue for the lock; nothing may be backed
        # up before they hold it (a slow start only makes this test weaker, never flaky).
        time.sleep(1.0)
        assert not list(tmp_path.glob("*.bak"))
        holder.execute(
            "INSERT INTO tasks VALUES "
            "(3, 't-3', 'written while they waited', 'open', 'c', 9.0, 9.0)"
        )
        holder.execute("COMMIT")
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        for upgrader in upgraders:
            upgrader.join(timeout=120)
    assert errors == []
    assert sorted(m is None for m in migrations) == [False, True]
    backups = list(tmp_path.glob("*.bak"))
    assert len(backups) == 1
    assert [row[1] for row in _rows(backups[0], "tasks")] == ["'t-1'", "'t-2'", "'t-3'"]
    assert _rows(backups[0], "schema_version") == [("1", "1.5")]
    with open_ledger(db) as ledger:
        assert ledger.get_task("t-3").title == "written while they waited"


def test_migrate_writes_a_backup_and_says_where(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _build_version_1(db)
    result = migrate(db)
    assert (result.from_version, result.to_version) == (1, SCHEMA_VERSION)
    assert result.backup_path is not None and result.backup_path.is_file()
    assert "schema-v1" in result.backup_path.name
    again = migrate(db)
    assert (again.from_version, again.backup_path) == (SCHEMA_VERSION, None)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".bak") == [
        result.backup_path.name
    ]


def test_a_newer_schema_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        ledger.create_task("made by the future", actor="a")
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO schema_version VALUES (?, 9.0)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    image = db.read_bytes()
    listing = sorted(p.name for p in tmp_path.iterdir())

    with pytest.raises(SchemaTooNew, match=f"schema version {SCHEMA_VERSION + 1}"):
        open_ledger(db)
    with pytest.raises(SchemaTooNew):
        migrate(db)
    with pytest.raises(SchemaTooNew):
        open_ledger(db, upgrade=False)

    assert db.read_bytes() == image
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


def test_a_newer_rollback_journal_file_is_not_switched_to_wal(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in SCHEMA_STEPS[1]:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (99, 1.0)")
    conn.close()
    image = db.read_bytes()
    with pytest.raises(SchemaTooNew):
        open_ledger(db)
    assert db.read_bytes() == image


def test_status_without_upgrade_reports_an_old_file_without_touching_it(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _build_version_1(db)
    image = db.read_bytes()
    with open_ledger(db, upgrade=False) as ledger:
        info = ledger.status_info()
    assert (info["schema_version"], info["needs_migration"]) == (1, True)
    assert (info["tasks"], info["runs"]) == (2, 4)
    assert db.read_bytes() == image
    assert not list(tmp_path.glob("*.bak"))


def test_an_sqlite_file_of_another_program_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE notes (x)")
    conn.commit()
    conn.close()
    image = db.read_bytes()
    with pytest.raises(StorageError, match="not an execkit ledger"):
        open_ledger(db)
    assert db.read_bytes() == image


def test_an_older_file_opened_as_is_is_read_only_until_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    _build_version_1(db)
    with open_ledger(db, upgrade=False) as ledger:
        assert ledger.status_info()["needs_migration"] is True
        with pytest.raises(StorageError, match="db migrate"):
            ledger.create_task("t", actor="a")
        done = ledger.migrate()
        assert (done.from_version, done.to_version) == (1, SCHEMA_VERSION)
        assert done.backup_path is not None and done.backup_path.is_file()
        assert ledger.migration == done
        assert ledger.create_task("now it writes", actor="a").id == "t-3"
        assert ledger.migrate().backup_path is None  # current now: nothing more
    assert ledger_status(db)["schema_version"] == SCHEMA_VERSION


def test_lane_events_from_before_the_rules_of_version_2_keep_folding_as_they_did(
    tmp_path: Path,
) -> None:
    # A version-5 file whose lane met a reset already past when it was stated: under the
    # rules of version 1 that said the lane was open; under today's it is a refusal that
    # counts toward the breaker (two within its window, of three). The
    # migration keeps those events folding with the rules they were stored under, so
    # `db check` is clean, and the events after it fold with today's.
    import sqlite3

    from execkit._lanes import LaneConfig, LaneConfigHistory, LaneEvent, LaneEventKind, fold
    from execkit.ledger._core.store import LANE_CONFIG_META_KEY

    db = tmp_path / "ledger.db"
    lane = "claude/default"
    with open_ledger(db) as ledger:
        task = ledger.create_task("t", actor="d", now=0).id
    with sqlite3.connect(db) as raw:  # the version-5 file, as version 5 left it
        raw.execute("DROP TABLE run_lane_holds")
        raw.execute("ALTER TABLE task_summaries DROP COLUMN last_lane_held")
        raw.execute("DELETE FROM schema_version WHERE version = 6")
        raw.execute("DROP TABLE board_outbox")  # version 7's, made after
        raw.execute("DELETE FROM schema_version WHERE version = 7")
        for statement in SQLITE_BUCKETS_UNDONE:  # version 13's, first
            raw.execute(statement)
        raw.execute("ALTER TABLE run_extras DROP COLUMN workspace")  # version 9's
        raw.execute("ALTER TABLE run_extras DROP COLUMN resumed_session")  # version 10's
        raw.execute("ALTER TABLE run_extras DROP COLUMN fell_back")
        for table in ("run_costs", "task_budgets", "spend_warnings"):  # version 8's
            raw.execute(f"DROP TABLE {table}")
        for table in ("notify_events", "notify_endpoints", "notify_deliveries"):
            raw.execute(f"DROP TABLE {table}")  # version 11's
        raw.execute("ALTER TABLE run_extras DROP COLUMN session_id")  # version 12's
        raw.execute("DELETE FROM schema_version WHERE version >= 8")
        events = [
            LaneEvent(lane=lane, kind=LaneEventKind.UPSTREAM, at=10, run_id="r-8", task_id=task),
            LaneEvent(lane=lane, kind=LaneEventKind.RESET, at=20, until=5, run_id="r-9"),
        ]
        for event in events:
            raw.execute(
                "INSERT INTO lane_events (lane, kind, at, actor, run_id, task_id, until_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (lane, str(event.kind), event.at, "d", event.run_id, event.task_id, event.until),
            )
        legacy = fold(lane, events, LaneConfig(rules=1))
        assert legacy.state == "open" and legacy.failures == (10.0,)  # v1: the reset passed
        assert fold(lane, events).failures == (10.0, 20.0)  # today's rules would not
        raw.execute(
            "INSERT INTO lane_summaries (lane, state, until_at, reason, trips, failures, "
            "probe_run, stopped_task, capped, events, updated_at) "
            "VALUES (?, 'open', NULL, NULL, 0, '[10.0]', NULL, NULL, 0, 2, 20.0)",
            (lane,),
        )
    with open_ledger(db) as ledger:
        assert ledger.migration is not None and ledger.migration.from_version == 5
        assert ledger.validate(now=30) == []
        with sqlite3.connect(db) as raw:
            (stored,) = raw.execute(
                "SELECT value FROM ledger_meta WHERE key = ?", (LANE_CONFIG_META_KEY,)
            ).fetchone()
        history = LaneConfigHistory.from_stored(stored)
        assert [(seq, config.rules) for seq, config in history.epochs] == [(0, 1), (3, 2)]
        assert ledger.lane_config().rules == 2
