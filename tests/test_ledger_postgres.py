"""What is the PostgreSQL backend's own: selection by URL, the constraints the database
enforces, the row lock admissions queue on, the advisory lock migrations queue on, schema
refusal and migration, passwords kept out, and connections that fail or are killed.

The rules themselves are the contract suite's (test_ledger*.py run on both backends).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from ledger_backends import PgSchemas
from pgcluster import Cluster

import execkit.ledger._postgres.migrate as pg_migrate
import execkit.ledger._postgres.schema as pg_schema
import execkit.ledger._postgres.tx as pg_tx
from execkit._errors import (
    InvalidInput,
    NotFound,
    SchemaTooNew,
    StorageError,
    TaskBlocked,
)
from execkit.cli._output import EXIT_CODES
from execkit.ledger import (
    PostgresLedger,
    PostgresMigration,
    SqliteLedger,
    default_db_path,
    migrate,
    open_ledger,
)
from execkit.ledger._postgres import public_url

REPO = Path(__file__).resolve().parent.parent

# The schema this code writes, and a newer one a test stands in (one more additive step).
CURRENT = pg_schema.SCHEMA_VERSION
# Version 6 (issue #45, spend) undone: what a ledger of version 5 has.
# Version 11's spend buckets (issue #45), undone before anything they read.
BUCKETS_UNDONE = (
    "DROP TRIGGER runs_spend_ended ON runs",  # step 12's
    "DROP TRIGGER runs_spend ON runs",
    "DROP FUNCTION execkit_runs_spend()",
    "DROP TABLE spend_buckets",
)
SPEND_UNDONE = (
    *BUCKETS_UNDONE,
    "DROP TABLE task_budgets",
    "DROP TABLE spend_warnings",
    "DROP INDEX runs_by_start",
    "ALTER TABLE runs DROP COLUMN reserved_usd, DROP COLUMN reserved_tokens, "
    "DROP COLUMN input_tokens, DROP COLUMN output_tokens, DROP COLUMN cache_read_tokens, "
    "DROP COLUMN cache_write_tokens, DROP COLUMN usd, DROP COLUMN usd_source, "
    "DROP COLUMN model",
)
NEWER = CURRENT + 1


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own (autocommit)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def open_pg(url: str, **options: Any) -> PostgresLedger:
    """The PostgreSQL ledger at `url`, opened as everything opens one (`open_ledger`)."""
    ledger = open_ledger(url, **options)
    assert isinstance(ledger, PostgresLedger)
    return ledger


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresLedger]:
    with open_pg(pg_url) as ledger:
        yield ledger


# -- selection -----------------------------------------------------------------------------


def test_a_url_selects_postgres_and_a_path_selects_sqlite(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_ledger(pg_url) as ledger:
        assert isinstance(ledger, PostgresLedger)
        assert ledger.location() == pg_url  # no password in it to strip
    with open_ledger("postgres://" + pg_url.removeprefix("postgresql://")) as ledger:
        assert isinstance(ledger, PostgresLedger)
    monkeypatch.setenv("EXECKIT_DB", pg_url)
    with open_ledger() as ledger:
        assert isinstance(ledger, PostgresLedger)
    with open_ledger(tmp_path / "file.db") as ledger:
        assert isinstance(ledger, SqliteLedger)
    # A URL names no file: the file-only entry point says so rather than making one.
    with pytest.raises(InvalidInput, match="PostgreSQL ledger"):
        default_db_path()
    monkeypatch.delenv("EXECKIT_DB")
    with pytest.raises(InvalidInput, match="PostgreSQL ledger"):
        default_db_path(pg_url)
    assert not list(Path.cwd().glob("postgres*"))


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_importing_the_ledger_does_not_import_psycopg() -> None:
    done = _python(
        "import sys, execkit.ledger, execkit.ledger._postgres\nprint('psycopg' in sys.modules)"
    )
    assert done.stdout.strip() == "False", done.stderr


def test_without_psycopg_a_url_is_one_clear_error(pg_url: str) -> None:
    done = _python(
        "import sys\n"
        "sys.modules['psycopg'] = None  # as if not installed\n"
        "from execkit._errors import StorageError\n"
        "from execkit.ledger import open_ledger\n"
        "try:\n"
        f"    open_ledger({pg_url!r})\n"
        "except StorageError as exc:\n"
        "    print(exc.code, exc.message)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("storage ")
    assert "pip install 'execkit-runner[postgres]'" in done.stdout


def test_execkit_dispatch_takes_a_url_for_db(pg_url: str, tmp_path: Path) -> None:
    board = tmp_path / "board.json"
    board.write_text(json.dumps({"states": [{"name": "todo", "eligible": True}], "issues": []}))
    board.chmod(0o600)
    argv = ["dispatch", "--board", str(board), "--once", "--adapter", "generic", "--db", pg_url]
    done = subprocess.run(
        [sys.executable, "-m", "execkit", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    with open_pg(pg_url) as ledger:
        # The board is bound to this ledger, in `FILE.ledger` beside it (the board file
        # itself stays as written): the ledger's id and its password-free URL.
        bound = (tmp_path / "board.json.ledger").read_text()
        assert ledger.ledger_id() in bound
        assert ledger.location() in bound
        assert json.loads(board.read_text())["issues"] == []


# -- identity and secrets ----------------------------------------------------------------


def test_owner_and_id_are_stored_at_creation(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    # The creator is the operating-system user, as the CLI's actor is: never $USER.
    for variable in ("USER", "LOGNAME", "LNAME", "USERNAME"):
        monkeypatch.setenv(variable, "mallory")
    with open_pg(pg_url) as ledger:
        first_id = ledger.ledger_id()
        assert len(first_id) == 32
        assert ledger._store.owner() == me
    rows = dict(sql(pg_url, "SELECT key, value FROM ledger_meta"))
    assert rows == {"ledger_id": first_id, "owner": me}
    with open_pg(pg_url) as again:
        assert again.ledger_id() == first_id
        assert again.migration is None
        assert again.schema_version() == pg_schema.SCHEMA_VERSION


def test_the_password_is_never_shown(pg_url: str) -> None:
    secret = "s3cret-Pa55word"
    with_user = pg_url.replace("postgresql://postgres@", f"postgresql://postgres:{secret}@")
    as_param = f"{pg_url}&password={secret}"
    for url in (with_user, as_param):
        assert secret not in public_url(url)
        # trust authentication ignores the password: the ledger opens, and never shows it
        with open_pg(url) as ledger:
            assert secret not in ledger.location()
            assert secret not in json.dumps(ledger.status_info())
            assert ledger.location() == pg_url
    unreachable = f"postgresql://postgres:{secret}@/execkit?host=/nonexistent-dir&port=1"
    with pytest.raises(StorageError, match="cannot connect") as failed:
        open_pg(unreachable)
    assert secret not in failed.value.message
    assert "postgresql://postgres@/execkit" in failed.value.message


def test_a_url_of_another_kind_is_refused() -> None:
    with pytest.raises(InvalidInput, match="postgresql:// URL"):
        PostgresLedger("mysql://x")


# -- what the database enforces ----------------------------------------------------------


def _insert_run(url: str, run_id: int, attempt: int, key: str, status: str = "failed") -> None:
    ended = "NULL" if status == "running" else "2"
    sql(
        url,
        "INSERT INTO runs (seq, id, task_id, attempt, limit_at_admission, status, request_key, "
        f"actor, owner_host, owner_pid, started_at, ended_at) VALUES ({run_id}, 'r-{run_id}', "
        f"'t-1', {attempt}, (SELECT max_attempts FROM tasks WHERE id = 't-1'), '{status}', "
        f"'{key}', 'x', 'h', 1, 1, {ended})",
    )


def test_the_database_enforces_attempts_keys_the_limit_and_one_running_run(
    pg: PostgresLedger, pg_url: str
) -> None:
    task = pg.create_task("t", max_attempts=2, actor="a")
    run = pg.start_run(task.id, request_key="k1", actor="a")
    # Every run row carries the limit in force when it was admitted.
    assert sql(pg_url, "SELECT attempt, limit_at_admission FROM runs") == [(1, 2)]
    with pytest.raises(psycopg.errors.UniqueViolation, match="runs_one_running_per_task"):
        _insert_run(pg_url, 90, 2, "k2", status="running")
    pg.finish_run(run.id, "failed")
    with pytest.raises(psycopg.errors.UniqueViolation, match="runs_attempt_unique"):
        _insert_run(pg_url, 91, 1, "k3")
    with pytest.raises(psycopg.errors.UniqueViolation, match="runs_request_key_unique"):
        _insert_run(pg_url, 92, 2, "k1")
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_attempt_within_limit"):
        _insert_run(pg_url, 93, 3, "k4")
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_attempt_within_limit"):
        sql(pg_url, "UPDATE runs SET attempt = 3")
    with pytest.raises(psycopg.errors.CheckViolation):
        sql(pg_url, "UPDATE runs SET status = 'paused'")
    with pytest.raises(psycopg.errors.CheckViolation):
        sql(pg_url, "UPDATE tasks SET max_attempts = 10001")
    assert pg.validate() == []
    assert [r.attempt for r in pg.runs(task.id)] == [1]


def test_a_write_the_database_refuses_is_a_storage_error_and_rolls_back(
    pg: PostgresLedger, pg_url: str
) -> None:
    # A rule the code would never break, broken on purpose beneath it: the database's own
    # CHECK catches it, and the transaction leaves nothing behind.
    task = pg.create_task("t", max_attempts=1, actor="a")
    sql(pg_url, "UPDATE tasks SET attempts_used = 1")  # the summary now lies about the history
    before = pg.audit_events()
    with pytest.raises(StorageError, match="refused the write") as refused:
        pg.start_run(task.id, request_key="k", actor="a", forced=True)
    assert "runs_attempt_within_limit" in refused.value.message
    assert pg.runs(task.id) == []
    assert pg.audit_events() == before
    assert sql(pg_url, "SELECT COUNT(*) FROM idempotency WHERE scope = 'run.start'") == [(0,)]


def test_a_nul_in_a_reason_is_stored_not_refused(pg: PostgresLedger) -> None:
    task = pg.create_task("t", actor="a")
    run = pg.start_run(task.id, request_key="k", actor="a")
    pg.finish_run(run.id, "failed", reason="binary \x00 output")
    assert pg.run(run.id).reason == "binary \ufffd output"
    assert pg.validate() == []


# -- the row lock admissions queue on -------------------------------------------------------


@pytest.fixture
def hold_admission(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, Any]]:
    """Holds admissions made by the thread named `victim` open right after their INSERT,
    until the returned event is set; the second value records that the insert happened."""
    release = threading.Event()
    inserted = threading.Event()

    def hold() -> None:
        if threading.current_thread().name == "victim":
            inserted.set()
            assert release.wait(60), "never released"

    monkeypatch.setattr(pg_tx, "_after_admission_insert", hold)
    yield release, inserted
    release.set()


def test_two_admissions_on_one_task_queue_on_its_row_lock(
    pg_url: str, hold_admission: tuple[threading.Event, threading.Event]
) -> None:
    release, inserted = hold_admission
    with open_pg(pg_url) as setup:
        task = setup.create_task("t", max_attempts=5, actor="a")
        other = setup.create_task("u", max_attempts=5, actor="a")
    first = open_pg(pg_url)
    results: dict[str, Any] = {}

    def admit(name: str, ledger: PostgresLedger, task_id: str) -> None:
        try:
            results[name] = ledger.start_run(task_id, request_key=name, actor=name)
        except Exception as exc:
            results[name] = exc

    victim = threading.Thread(target=admit, args=("first", first, task.id), name="victim")
    victim.start()
    try:
        assert inserted.wait(30)
        with open_pg(pg_url, lock_timeout_s=0.3) as impatient:
            # The first admission holds the task's row: a second one waits for it ...
            started = time.monotonic()
            with pytest.raises(StorageError, match="ledger busy"):
                impatient.start_run(task.id, request_key="impatient", actor="b")
            assert time.monotonic() - started >= 0.25
            # ... and sees nothing uncommitted meanwhile; another task is not held up.
            assert impatient.runs(task.id) == []
            assert impatient.start_run(other.id, request_key="o", actor="b").attempt == 1
        second = open_pg(pg_url)
        waiter = threading.Thread(target=admit, args=("second", second, task.id))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # queued on the lock
        release.set()
        victim.join(30)
        waiter.join(30)
        second.close()
    finally:
        release.set()
        victim.join(30)
        first.close()
    assert results["first"].attempt == 1
    # The second admission decided on the first one's committed run.
    assert isinstance(results["second"], TaskBlocked), results["second"]
    assert "still running" in results["second"].message
    with open_pg(pg_url) as ledger:
        assert [r.request_key for r in ledger.runs(task.id)] == ["first"]
        assert ledger.validate() == []


def test_concurrent_first_uses_of_one_key_create_one_task(pg_url: str) -> None:
    with open_pg(pg_url):
        pass
    ledgers = [open_pg(pg_url) for _ in range(6)]
    barrier = threading.Barrier(len(ledgers))
    ids: list[str] = []
    errors: list[BaseException] = []

    def create(ledger: PostgresLedger) -> None:
        barrier.wait(30)
        try:
            ids.append(ledger.create_task("board:I1", idempotency_key="board:I1", actor="d").id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(ledger,)) for ledger in ledgers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for ledger in ledgers:
        ledger.close()
    assert errors == []
    assert ids == ["t-1"] * len(ledgers)
    assert sql(pg_url, "SELECT COUNT(*) FROM tasks") == [(1,)]


def test_one_ledger_is_shared_safely_by_threads(pg: PostgresLedger) -> None:
    # A dispatcher renews its run's lease from a second thread while the first one works.
    task = pg.create_task("t", max_attempts=10000, actor="a")
    run = pg.start_run(task.id, request_key="k0", actor="a")
    stop = threading.Event()
    beats: list[float] = []
    failures: list[BaseException] = []

    def heartbeat() -> None:
        while not stop.is_set():
            try:
                beats.append(pg.heartbeat(run.id).lease_expires_at or 0)
            except BaseException as exc:
                failures.append(exc)
                return

    beater = threading.Thread(target=heartbeat)
    beater.start()
    try:
        others = [pg.create_task(f"o{n}", actor="a") for n in range(30)]
        for other in others:
            pg.finish_run(pg.start_run(other.id, request_key=other.id, actor="a").id, "succeeded")
    finally:
        stop.set()
        beater.join(30)
    assert failures == []
    assert beats
    assert pg.validate() == []


# -- schema versions ----------------------------------------------------------------------


def test_a_newer_schema_is_refused_with_nothing_written(pg: PostgresLedger, pg_url: str) -> None:
    pg.create_task("t", actor="a")
    sql(pg_url, "INSERT INTO schema_version (version, applied_at) VALUES (99, 0)")
    before = sql(pg_url, "SELECT COUNT(*) FROM audit")
    with pytest.raises(SchemaTooNew, match="schema version 99"):
        open_pg(pg_url)
    assert sql(pg_url, "SELECT COUNT(*) FROM audit") == before
    assert sql(pg_url, "SELECT MAX(version) FROM schema_version") == [(99,)]


def test_foreign_tables_and_a_missing_ledger(pg_url: str, pg_schemas: PgSchemas) -> None:
    sql(pg_url, "CREATE TABLE tasks (id integer)")
    with pytest.raises(StorageError, match="no execkit ledger"):
        open_pg(pg_url)
    empty = pg_schemas.new()
    with pytest.raises(NotFound, match="no ledger"):
        open_pg(empty, create=False)
    assert sql(empty, "SELECT COUNT(*) FROM pg_tables WHERE schemaname = current_schema()") == [
        (0,)
    ]


def test_concurrent_creations_and_migrations_serialise_on_the_advisory_lock(
    pg_url: str,
) -> None:
    # Someone holds the migration lock: a ledger being created waits for it.
    holder = psycopg.connect(pg_url, autocommit=True)
    holder.execute("BEGIN")
    holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", pg_migrate._MIGRATION_LOCK)
    opened: list[PostgresLedger] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(open_pg(pg_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    assert opened == [] and errors == []  # all four wait on the lock
    holder.execute("COMMIT")
    holder.close()
    for thread in threads:
        thread.join(60)
    assert errors == []
    # One of them built the schema; the other three found it built.
    assert sorted(ledger.migration is None for ledger in opened) == [False, True, True, True]
    versions = [(version,) for version in sorted(pg_schema.SCHEMA_STEPS)]
    assert sql(pg_url, "SELECT version FROM schema_version") == versions
    assert {ledger.ledger_id() for ledger in opened} == {opened[0].ledger_id()}
    for ledger in opened:
        ledger.close()


def test_an_older_schema_waits_for_a_backup_then_migrates_additively(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_pg(pg_url) as ledger:
        task = ledger.create_task("kept", max_attempts=3, actor="a")
        ledger.start_run(task.id, request_key="k", actor="a")
        before = ledger.get_task(task.id)
    # A newer execkit with one more (additive) step.
    steps = {**pg_schema.SCHEMA_STEPS, NEWER: ("CREATE TABLE ledger_notes (note text NOT NULL)",)}
    monkeypatch.setattr(pg_schema, "SCHEMA_STEPS", steps)
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", NEWER)
    with open_pg(pg_url) as outdated:
        assert outdated.schema_version() == CURRENT
        with pytest.raises(StorageError, match="back it up first") as refused:
            outdated.get_task(task.id)
        message = refused.value.message
        assert "pg_dump --format=custom" in message
        assert f"--dbname={pg_url}" in message or "--dbname=" in message
        assert "--schema=" in message
        assert outdated.status_info()["needs_migration"] is True
    assert sql(pg_url, "SELECT MAX(version) FROM schema_version") == [(CURRENT,)]
    # Without the operator's word that the dump was taken, migrate names it and waits.
    with pytest.raises(InvalidInput, match="pg_dump --format=custom") as waiting:
        migrate(pg_url)
    assert "--backed-up" in waiting.value.message and waiting.value.field == "backed_up"
    assert sql(pg_url, "SELECT MAX(version) FROM schema_version") == [(CURRENT,)]
    done = migrate(pg_url, backed_up=True)
    assert isinstance(done, PostgresMigration)
    assert (done.from_version, done.to_version) == (CURRENT, NEWER)
    assert done.backup_command is not None and done.backup_command.startswith("pg_dump ")
    again = migrate(pg_url, backed_up=True)  # already current: nothing done
    assert isinstance(again, PostgresMigration) and again.backup_command is None
    assert (again.from_version, again.to_version) == (NEWER, NEWER)
    with open_pg(pg_url) as migrated:
        assert migrated.schema_version() == NEWER
        assert migrated.get_task(task.id) == before
        assert migrated.validate() == []
    assert sql(pg_url, "SELECT COUNT(*) FROM ledger_notes") == [(0,)]


def test_an_outdated_ledger_opened_as_is_migrates_in_place_once_backed_up(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    open_pg(pg_url).close()
    steps = {**pg_schema.SCHEMA_STEPS, NEWER: ("CREATE TABLE ledger_notes (note text NOT NULL)",)}
    monkeypatch.setattr(pg_schema, "SCHEMA_STEPS", steps)
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", NEWER)
    with open_pg(pg_url) as outdated:  # a server's ledger is never migrated by default
        assert outdated.migration is None
        with pytest.raises(InvalidInput, match="pg_dump --format=custom"):
            outdated.migrate()
        assert sql(pg_url, "SELECT MAX(version) FROM schema_version") == [(CURRENT,)]
        done = outdated.migrate(backed_up=True)
        assert (done.from_version, done.to_version) == (CURRENT, NEWER)
        assert outdated.migration == done
        # Usable at once, its owner known (it was not read while the schema was outdated).
        assert outdated.grant_role("op", "agent.operate", actor=me).role == "agent.operate"
    monkeypatch.setattr(
        pg_schema, "SCHEMA_STEPS", {**steps, NEWER + 1: ("CREATE TABLE more_notes (note text)",)}
    )
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", NEWER + 1)
    with open_pg(pg_url, upgrade=True) as upgraded:  # the operator's say-so, on open
        assert upgraded.migration is not None
        done = upgraded.migration
        assert (done.from_version, done.to_version) == (NEWER, NEWER + 1)
        assert upgraded.grants()[0].principal == "op"


def test_the_db_commands_take_a_url(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from execkit.cli import main

    def cli(*argv: str) -> tuple[int, dict[str, Any]]:
        code = main(["--json", *argv, "--db", pg_url])
        printed = capsys.readouterr()
        return code, json.loads(printed.out if code == 0 else printed.err)

    with pytest.raises(NotFound):
        open_pg(pg_url, create=False).close()
    code, created = cli("db", "init")
    assert code == 0 and created["created"] is True and created["ledger_id"]
    assert cli("db", "init") == (0, {**created, "created": False})
    code, status = cli("db", "status")
    assert code == 0 and status["schema_version"] == pg_schema.SCHEMA_VERSION
    assert status["needs_migration"] is False and status["tasks"] == 0
    code, current = cli("db", "migrate")
    assert code == 0 and current["backup_command"] is None

    # A newer execkit with one more (additive) step: migrate waits for the operator's dump.
    steps = {**pg_schema.SCHEMA_STEPS, NEWER: ("CREATE TABLE ledger_notes (note text NOT NULL)",)}
    monkeypatch.setattr(pg_schema, "SCHEMA_STEPS", steps)
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", NEWER)
    assert cli("db", "status")[1]["needs_migration"] is True
    code, refused = cli("db", "migrate")
    assert code == EXIT_CODES["invalid"]
    message = refused["error"]["message"]
    assert "pg_dump --format=custom" in message and "--backed-up" in message
    assert sql(pg_url, "SELECT MAX(version) FROM schema_version") == [(CURRENT,)]  # nothing written
    code, migrated = cli("db", "migrate", "--backed-up")
    assert code == 0 and (migrated["from_version"], migrated["to_version"]) == (CURRENT, NEWER)
    assert sql(pg_url, "SELECT MAX(version) FROM schema_version") == [(NEWER,)]


def test_storage_problems_are_named_and_a_drifted_summary_repaired(
    pg: PostgresLedger, pg_url: str
) -> None:
    task = pg.create_task("t", actor="a")
    run = pg.start_run(task.id, request_key="1", actor="a", now=1)
    pg.finish_run(run.id, "failed", failure_class="upstream", now=2)  # type: ignore[arg-type]
    sql(pg_url, "UPDATE tasks SET uncharged_streak = 3")
    (problem,) = pg.validate(now=3)
    assert "stored summary differs from its history" in problem
    assert pg.repair(now=3) == ["t-1: rebuilt its summary from its history"]
    assert pg.validate(now=3) == []
    sql(pg_url, "DROP TABLE role_grants")
    assert pg.validate() == ["storage: table role_grants is missing"]
    with pytest.raises(StorageError, match="role_grants"):
        pg.grants()


# -- connections that fail ---------------------------------------------------------------


def _backend_pids(url: str, application: str) -> list[int]:
    rows = sql(url, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application,))
    return [int(row[0]) for row in rows]


def _terminate(url: str, application: str) -> int:
    pids = _backend_pids(url, application)
    for pid in pids:
        sql(url, "SELECT pg_terminate_backend(%s)", (pid,))
    return len(pids)


def test_a_dropped_connection_is_replaced_and_a_replayed_key_returns_its_run(
    pg_url: str,
) -> None:
    url = f"{pg_url}&application_name=dropped"
    with open_pg(url) as ledger:
        task = ledger.create_task("t", max_attempts=3, actor="a")
        run = ledger.start_run(task.id, request_key="k", actor="a")
        # The connection goes away between two calls (the answer to the start was lost,
        # say): the next call reconnects before it sends anything, and the replay of the
        # same request key returns the run it created; no attempt is spent twice.
        assert _terminate(pg_url, "dropped") == 1
        assert ledger.start_run(task.id, request_key="k", actor="a") == run
        assert [r.id for r in ledger.runs(task.id)] == [run.id]
        assert _backend_pids(pg_url, "dropped")  # a new backend serves it


def test_a_backend_terminated_mid_admission_writes_nothing_and_the_retry_admits(
    pg_url: str, hold_admission: tuple[threading.Event, threading.Event]
) -> None:
    release, inserted = hold_admission
    url = f"{pg_url}&application_name=victim"
    with open_pg(pg_url) as setup:
        task = setup.create_task("t", max_attempts=2, actor="a")
    victim = open_pg(url)
    outcome: list[BaseException | object] = []

    def admit() -> None:
        try:
            outcome.append(victim.start_run(task.id, request_key="doomed", actor="v"))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=admit, name="victim")
    thread.start()
    try:
        assert inserted.wait(30)
        assert _terminate(pg_url, "victim") == 1  # killed with the run row inserted
        release.set()
        thread.join(30)
    finally:
        release.set()
        thread.join(30)
    (failure,) = outcome
    assert isinstance(failure, StorageError), failure
    assert "rolled back" in failure.message and "nothing was written" in failure.message
    with open_pg(pg_url) as ledger:
        assert ledger.runs(task.id) == []
        assert [e.action for e in ledger.audit_events()] == ["task.create"]
        assert ledger.validate() == []
    # The same ledger object reconnects; the key was never used, so it admits attempt 1.
    run = victim.start_run(task.id, request_key="doomed", actor="v")
    assert run.attempt == 1
    victim.close()


def test_a_server_that_is_not_there_is_one_clear_error(tmp_path: Path) -> None:
    url = f"postgresql://postgres@/execkit?host={tmp_path}&port=5432"
    with pytest.raises(StorageError, match="cannot connect to the PostgreSQL server"):
        open_pg(url, connect_timeout_s=2)


_STREAM = r"""
import json, sys, time
from pathlib import Path
from execkit._errors import StorageError, TaskBlocked
from execkit.ledger import open_ledger

url, task_id, name, sync = sys.argv[1:5]
deadline = time.monotonic() + 120
acked, errors, n = [], 0, 0

def answer(call):
    global errors
    while True:
        if time.monotonic() > deadline:
            sys.exit("deadline")
        try:
            return call()
        except StorageError:
            errors += 1  # the server went away: the same request again, same key
            time.sleep(0.02)
        except TaskBlocked:
            time.sleep(0.002)  # the other worker's run is still running

ledger = answer(lambda: open_ledger(url))
while not Path(sync, "stop").exists():
    n += 1
    key = f"{name}-{n}"
    run = answer(lambda: ledger.start_run(task_id, request_key=key, actor=name,
                                          ignore_backoff=True))
    answer(lambda: ledger.finish_run(run.id, "failed", reason="stream"))
    acked.append([key, run.id, run.attempt])
    Path(sync, f"{name}.count").write_text(str(len(acked)))
print(json.dumps({"acked": acked, "errors": errors}))
"""


@pytest.fixture
def own_cluster(pg_cluster: Cluster) -> Iterator[Cluster]:
    """A cluster of the test's own, for a test that crashes its server: the session's
    cluster serves the tests the other pytest-xdist worker runs meanwhile."""
    cluster = Cluster.start(pg_cluster.bindir)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_server_crash_in_a_stream_of_admissions_loses_and_doubles_nothing(
    own_cluster: Cluster, tmp_path: Path
) -> None:
    """`pg_ctl restart -m immediate` while 4 processes admit on 2 tasks: every run a worker
    was told about is there, nothing else is, histories are valid, and admissions resume."""
    pg_cluster = own_cluster
    pg_url = PgSchemas(own_cluster).new()
    with open_pg(pg_url) as ledger:
        tasks = [ledger.create_task(f"t{n}", max_attempts=10000, actor="a").id for n in (1, 2)]
    names = [f"w{n}" for n in range(4)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _STREAM, pg_url, tasks[n % 2], name, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        for n, name in enumerate(names)
    ]

    def counts() -> list[int]:
        found = []
        for name in names:
            count = 0
            with contextlib.suppress(OSError, ValueError):  # not written yet, or half
                count = int((tmp_path / f"{name}.count").read_text() or 0)
            found.append(count)
        return found

    def admitted() -> int:
        return sum(counts())

    results = []
    try:
        # Every worker is in the middle of its stream when the server crashes.
        wait_for(lambda: min(counts()) >= 5 and admitted() >= 40, 120, "every worker admitting")
        pg_cluster.restart("immediate")
        after_crash = admitted()
        wait_for(lambda: admitted() >= after_crash + 40, 120, "admissions after the crash")
        (tmp_path / "stop").touch()
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err
            results.append(json.loads(out))
    finally:
        (tmp_path / "stop").touch()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    acked = {run_id: key for result in results for key, run_id, _ in result["acked"]}
    assert sum(result["errors"] for result in results) > 0  # the crash was felt
    with open_pg(pg_url) as ledger:
        assert ledger.validate() == []
        stored: dict[str, str] = {}
        for task_id in tasks:
            runs = ledger.runs(task_id)
            assert [r.attempt for r in runs] == list(range(1, len(runs) + 1))
            assert {r.status for r in runs} == {"failed"}
            stored.update({r.id: r.request_key for r in runs})
        # Nothing lost (every acknowledged run is there), nothing doubled (nothing else is).
        assert stored == acked
        keys = sql(pg_url, "SELECT COUNT(*) FROM idempotency WHERE scope = 'run.start'")
        assert keys == [(len(stored),)]


def test_threads_of_one_ledger_run_side_by_side_on_a_bounded_pool(pg_url: str) -> None:
    """A transaction left open in one thread does not hold up another thread's (each takes
    a connection of its own); with every one of the `pool_size` connections lent, the next
    transaction waits at most the lock timeout and is a StorageError, nothing written."""
    url = f"{pg_url}&application_name=pooled"
    release = threading.Event()
    with PostgresLedger(url, pool_size=2, lock_timeout_s=1) as ledger:
        task = ledger.create_task("t", max_attempts=5, actor="a")
        opened: list[threading.Event] = []

        def hold() -> None:
            with ledger._store.read():  # a transaction left open
                opened[-1].set()
                release.wait(60)

        holders: list[threading.Thread] = []
        try:
            for _ in range(2):
                opened.append(threading.Event())
                holders.append(threading.Thread(target=hold))
                holders[-1].start()
                assert opened[-1].wait(30)
                if len(holders) == 1:
                    # One transaction open: another thread's admission goes ahead.
                    run = ledger.start_run(task.id, request_key="k", actor="a")
                    assert run.attempt == 1
            assert len(_backend_pids(pg_url, "pooled")) == 2
            with pytest.raises(StorageError, match="none of the 2 connections"):
                ledger.finish_run(run.id, "succeeded")
        finally:
            release.set()
            for holder in holders:
                holder.join(30)
        assert ledger.run(run.id).status == "running"  # the refused finish wrote nothing
        assert ledger.finish_run(run.id, "succeeded").status == "succeeded"
        assert len(_backend_pids(pg_url, "pooled")) == 2  # kept open, reused
    with pytest.raises(InvalidInput, match="pool_size"):
        PostgresLedger(pg_url, pool_size=0)


def test_lane_events_from_before_the_rules_of_version_2_keep_folding_as_they_did_on_postgres(
    pg_url: str,
) -> None:
    # As on SQLite (test_ledger_schema.py): a version-3 ledger whose lane met a reset stated
    # for a moment already past. Migrated, its events keep folding with the rules of
    # version 1 (`db check` clean), later ones with today's.
    from execkit._lanes import LaneConfigHistory
    from execkit.ledger._core.store import LANE_CONFIG_META_KEY

    lane = "claude/default"
    open_pg(pg_url).close()
    for statement in (
        "ALTER TABLE runs DROP CONSTRAINT runs_lane_held_upstream",
        "ALTER TABLE runs DROP COLUMN lane_held",
        "ALTER TABLE tasks DROP COLUMN last_lane_held",
        "DROP TABLE board_outbox",  # version 5's, made after
        *SPEND_UNDONE,  # version 6's
        "ALTER TABLE runs DROP COLUMN workspace",  # version 7's
        "ALTER TABLE runs DROP COLUMN resumed_session",  # version 8's
        "ALTER TABLE runs DROP COLUMN fell_back",
        "DROP TABLE notify_events, notify_endpoints, notify_deliveries",  # version 9's
        "ALTER TABLE runs DROP COLUMN session_id",  # version 10's
        "DELETE FROM schema_version WHERE version >= 4",
        "INSERT INTO lane_events (lane, kind, at, actor, run_id, until_at) VALUES "
        f"('{lane}', 'upstream', 10, 'd', 'r-8', NULL), ('{lane}', 'reset', 20, 'd', 'r-9', 5)",
        "INSERT INTO lane_summaries (lane, state, until_at, reason, trips, failures, "
        "probe_run, stopped_task, capped, events, updated_at) "
        f"VALUES ('{lane}', 'open', NULL, NULL, 0, '[10.0]', NULL, NULL, false, 2, 20.0)",
    ):
        sql(pg_url, statement)
    done = migrate(pg_url, backed_up=True)
    assert isinstance(done, PostgresMigration) and done.from_version == 3
    with open_pg(pg_url) as migrated:
        assert migrated.validate(now=30) == []
        assert migrated.lane_config().rules == 2
    (stored,) = sql(pg_url, "SELECT value FROM ledger_meta WHERE key = %s", (LANE_CONFIG_META_KEY,))
    history = LaneConfigHistory.from_stored(stored[0])
    assert [config.rules for _, config in history.epochs] == [1, 2]
