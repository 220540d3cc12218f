"""A real PostgreSQL server for the test run, and ledgers of either backend.

The cluster is a throwaway one (tests/pgcluster.py) started once per session, or the one
`python tests/pgcluster.py --run -- pytest` started and names in TEST_PG_CLUSTER;
either way it is stopped whatever happens. Each test that opens a PostgreSQL ledger gets a
fresh schema of its own (`CREATE SCHEMA`, then `search_path` in the URL): no test sees
another's rows, and nothing is copied. Without server binaries the PostgreSQL tests skip
naming the install command; with CI=true they fail instead.

The contract fixtures: `backend` ("sqlite" | "postgres"), `ledger_target` (a file path or a
URL), `opener` (opens the test's ledger, again if need be), `ledger` (one opened for the
test), `new_target` (a fresh target per call, for property tests), `raw_sql`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from ledger_backends import AnyLedger, Opener, PgSchemas, RawSql, open_at, raw_sql_at
from pgcluster import ENV_VAR, INSTALL_HINT, Cluster, find_bindir


def _unavailable(message: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: PostgreSQL tests must run here)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """The session's PostgreSQL cluster (started on first use, stopped at the end)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed: pip install 'execkit-runner[postgres]'")
    named = os.environ.get(ENV_VAR)
    if named:
        yield Cluster.from_env(named)
        return
    if find_bindir() is None:
        _unavailable(f"no PostgreSQL server binaries (initdb, pg_ctl): {INSTALL_HINT}")
    cluster = Cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_schemas(pg_cluster: Cluster) -> PgSchemas:
    return PgSchemas(pg_cluster)


@pytest.fixture
def pg_url(pg_schemas: PgSchemas) -> str:
    """A URL naming a fresh, empty schema of its own."""
    return pg_schemas.new()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def new_target(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Callable[[], str]:
    """A fresh, empty ledger target on each call (a new file, or a new schema)."""
    if backend == "sqlite":
        return lambda: str(tmp_path_factory.mktemp("ledger") / "ledger.db")
    schemas: PgSchemas = request.getfixturevalue("pg_schemas")
    return schemas.new


@pytest.fixture
def ledger_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where this test's ledger lives: a file path (sqlite) or a URL (postgres)."""
    if backend == "sqlite":
        return str(tmp_path / "ledger.db")
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def opener(ledger_target: str) -> Opener:
    def open_(**options: Any) -> AnyLedger:
        return open_at(ledger_target, **options)

    return open_


@pytest.fixture
def ledger(opener: Opener) -> Iterator[AnyLedger]:
    with opener() as opened:
        yield opened


@pytest.fixture
def raw_sql(ledger_target: str) -> RawSql:
    return raw_sql_at(ledger_target)
