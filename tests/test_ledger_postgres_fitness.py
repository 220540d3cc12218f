"""A PostgreSQL ledger checked before any write: a schema missing a table or column its
version needs, and a role without the privileges a write needs (on a table, a sequence, the
schema, the database), are each one StorageError (exit 13) naming what is missing and how
to fix it, with nothing written. Real PostgreSQL (tests/pgcluster.py), real roles with
restricted grants made here."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgcluster import Cluster

import execkit.ledger._postgres.schema as pg_schema
from execkit._errors import StorageError
from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.ledger import PostgresLedger, open_ledger
from execkit.ledger._model import user_name
from execkit.ledger._postgres import check

REPO = Path(__file__).resolve().parent.parent
_BOUND_S = 60  # a backstop for a call that must not hang, never a measured figure
_ROLES = itertools.count(1)


def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own (autocommit)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def schema_of(url: str) -> str:
    found = sql(url, "SELECT current_schema()")[0][0]
    assert isinstance(found, str)
    return found


def cli(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, dict[str, Any]]:
    """`execkit --json ARGV --db URL` in process: its exit code and the JSON it printed
    (a report on stdout, else an error on stderr)."""
    code = main(["--json", *argv, "--db", url])
    printed = capsys.readouterr()
    doc: dict[str, Any] = json.loads(printed.out or printed.err)
    return code, doc


def new_ledger(url: str) -> str:
    """A ledger at `url` holding one task; its id."""
    with open_ledger(url) as ledger:
        assert isinstance(ledger, PostgresLedger)
        return ledger.create_task("first", actor="a").id


def counts(url: str) -> list[tuple[Any, ...]]:
    return sql(
        url,
        "SELECT (SELECT COUNT(*) FROM tasks), (SELECT COUNT(*) FROM audit), "
        "(SELECT COUNT(*) FROM idempotency)",
    )


def worker_role(cluster: Cluster, url: str) -> tuple[str, str]:
    """A new login role with every privilege a write needs on `url`'s schema, and the URL
    that connects as it."""
    role = f"worker_{os.getpid()}_{next(_ROLES)}"
    name = schema_of(url)
    admin = cluster.url()
    sql(admin, f"CREATE ROLE {role} LOGIN")
    sql(admin, f"GRANT USAGE ON SCHEMA {name} TO {role}")
    sql(admin, f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {name} TO {role}")
    sql(admin, f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {name} TO {role}")
    prefix = f"postgresql://{cluster.url().split('://', 1)[1].split('@', 1)[0]}@"
    assert url.startswith(prefix)
    return role, f"postgresql://{role}@" + url[len(prefix) :]


# -- the schema ---------------------------------------------------------------------------


def test_the_columns_expected_are_read_from_the_schema_steps() -> None:
    current = check.expected_columns(pg_schema.SCHEMA_VERSION)
    assert sorted(current) == sorted(pg_schema.TABLES)
    assert {"stopped", "owner_instance", "limit_at_admission"} <= current["runs"]
    assert "runs_attempt_unique" not in current["runs"]  # a constraint, not a column
    assert "stopped" not in check.expected_columns(1)["runs"]  # added by step 2
    assert "lane_events" not in check.expected_columns(2)


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("ALTER TABLE runs DROP COLUMN stopped", "column runs.stopped"),
        ("DROP TABLE run_lanes", "table run_lanes"),
        ("ALTER TABLE tasks DROP COLUMN last_stopped", "column tasks.last_stopped"),
    ],
)
def test_a_schema_missing_a_table_or_column_takes_no_write(
    pg_url: str, capsys: pytest.CaptureFixture[str], damage: str, named: str
) -> None:
    task = new_ledger(pg_url)
    sql(pg_url, damage)
    before = counts(pg_url)
    for argv in (("task", "create", "second"), ("task", "retry", task), ("db", "status")):
        code, refused = cli(capsys, pg_url, *argv)
        assert code == EXIT_CODES["storage"], (argv, refused)
        message = refused["error"]["message"]
        assert f"{named} missing" in message and "restore" in message, message
    assert counts(pg_url) == before
    with open_ledger(pg_url) as ledger, pytest.raises(StorageError, match=named):
        ledger.create_task("third", actor="a")
    assert counts(pg_url) == before
    code, checked = cli(capsys, pg_url, "db", "check")
    assert code == EXIT_CODES["storage"]
    assert f"storage: {named} is missing" in checked["problems"]


# -- the role's privileges ----------------------------------------------------------------


def test_a_role_without_insert_on_runs_is_refused_naming_the_grant(
    pg_url: str, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    new_ledger(pg_url)
    role, as_role = worker_role(pg_cluster, pg_url)
    assert cli(capsys, as_role, "db", "status")[0] == 0
    sql(pg_cluster.url(), f"REVOKE INSERT ON {schema_of(pg_url)}.runs FROM {role}")
    before = counts(pg_url)
    grant = f"GRANT INSERT ON {schema_of(pg_url)}.runs TO {role}"
    for argv in (("task", "create", "second"), ("db", "status")):
        code, refused = cli(capsys, as_role, *argv)
        assert code == EXIT_CODES["storage"], refused
        message = refused["error"]["message"]
        assert f"the role {role}" in message and "lacks INSERT on table runs" in message
        assert grant in message
    assert counts(pg_url) == before
    # The statement named is the fix.
    sql(pg_cluster.url(), grant)
    code, created = cli(capsys, as_role, "task", "create", "second")
    assert code == 0 and created["title"] == "second"


def test_a_role_without_a_sequence_or_the_schema_is_refused_naming_the_grant(
    pg_url: str, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    new_ledger(pg_url)
    role, as_role = worker_role(pg_cluster, pg_url)
    name = schema_of(pg_url)
    sql(pg_cluster.url(), f"REVOKE USAGE ON {name}.task_numbers FROM {role}")
    code, refused = cli(capsys, as_role, "task", "create", "second")
    assert code == EXIT_CODES["storage"]
    assert f"GRANT USAGE ON SEQUENCE {name}.task_numbers TO {role}" in refused["error"]["message"]

    sql(pg_cluster.url(), f"REVOKE USAGE ON SCHEMA {name} FROM {role}")
    before = counts(pg_url)
    for argv in (("task", "create", "second"), ("db", "status"), ("task", "list")):
        code, refused = cli(capsys, as_role, *argv)
        assert code == EXIT_CODES["storage"], refused
        message = refused["error"]["message"]
        assert f"the role {role} lacks USAGE on schema {name}" in message, message
        assert f"GRANT USAGE ON SCHEMA {name} TO {role}" in message
    assert counts(pg_url) == before


def test_a_role_without_connect_is_one_clear_error_without_a_traceback(
    pg_cluster: Cluster,
) -> None:
    database = f"closed_{os.getpid()}_{next(_ROLES)}"
    role = f"stranger_{os.getpid()}_{next(_ROLES)}"
    admin = pg_cluster.url()
    sql(admin, f"CREATE DATABASE {database}")
    try:
        sql(admin, f"REVOKE CONNECT ON DATABASE {database} FROM PUBLIC")
        sql(admin, f"CREATE ROLE {role} LOGIN")
        url = pg_cluster.url(database).replace("postgres@", f"{role}@", 1)
        for argv in (("task", "create", "x"), ("db", "status")):
            done = subprocess.run(
                [sys.executable, "-m", "execkit", "--json", *argv, "--db", url],
                env={**os.environ, "PYTHONPATH": str(REPO)},
                capture_output=True,
                text=True,
                timeout=_BOUND_S,
            )
            assert done.returncode == EXIT_CODES["storage"], done.stderr
            assert "Traceback" not in done.stderr
            message = json.loads(done.stderr)["error"]["message"]
            assert f"the role {role} lacks CONNECT on database {database}" in message
            assert f"GRANT CONNECT ON DATABASE {database} TO {role}" in message
    finally:
        sql(admin, f"DROP DATABASE {database}")


def test_a_privilege_opening_does_not_check_is_named_when_the_write_fails(
    pg_url: str, pg_cluster: Cluster
) -> None:
    new_ledger(pg_url)
    role, as_role = worker_role(pg_cluster, pg_url)
    # Granting roles is an administrator's write: a worker without it still creates tasks.
    sql(pg_cluster.url(), f"REVOKE INSERT ON {schema_of(pg_url)}.role_grants FROM {role}")
    with open_ledger(as_role) as ledger:
        ledger.create_task("second", actor="a")
        before = counts(pg_url)
        with pytest.raises(StorageError) as refused:
            ledger.grant_role("bob", "ledger.admin", actor=user_name(os.geteuid()))
    message = refused.value.message
    assert f"the role {role} lacks a privilege on table role_grants" in message, message
    assert "nothing was written" in message
    assert counts(pg_url) == before
