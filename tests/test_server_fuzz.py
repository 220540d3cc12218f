"""A bounded schemathesis run against `/openapi.json` of a real server on loopback: every
operation, with generated paths, queries, headers and bodies (valid and not), answers
without a server error (no 5xx).

Bounded: `MAX_EXAMPLES` generated cases per operation (about 20 operations), no shrinking
deadline; the whole module takes a few seconds.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from execkit.ledger import open_ledger  # noqa: E402
from execkit.server import (  # noqa: E402
    LedgerApp,
    ServerThread,
    TokenFile,
    add_token,
)

ME = pwd.getpwuid(os.geteuid()).pw_name
MAX_EXAMPLES = 12


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    where = tmp_path_factory.mktemp("fuzz")
    ledger = open_ledger(where / "ledger.db")
    tokens = where / "tokens.json"
    token = add_token(tokens, ME, ["agent.operate", "ledger.admin"])
    ledger.create_task("seed", max_attempts=3, actor=ME)
    ledger.start_run("t-1", request_key="seed", actor=ME)
    app = LedgerApp(ledger, TokenFile(tokens), request_timeout_s=20)
    with ServerThread(app) as running:
        assert running.url.startswith("http://127.0.0.1:")
        yield running.url, token
    app.close()
    ledger.close()


def _operations(url: str) -> list[Any]:
    api = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in api.get_all_operations()]


def test_the_document_loads_with_every_operation(live: tuple[str, str]) -> None:
    url, _token = live
    found = {(op.method.upper(), op.path) for op in _operations(url)}
    assert len(found) >= 20 and ("POST", "/v1/tasks/{task_id}/runs") in found


def test_no_operation_answers_a_server_error(live: tuple[str, str]) -> None:
    url, token = live
    failures: list[str] = []
    for operation in _operations(url):

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case: Any) -> None:
            case.call_and_validate(
                base_url=url,
                headers={"Authorization": f"Bearer {token}"},
                checks=[not_a_server_error],
                timeout=30,
            )

        try:
            fuzz()
        except Exception as exc:  # collect every operation's failure, then report them all
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    assert failures == []
