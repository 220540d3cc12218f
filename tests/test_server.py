"""`execkit serve`'s application: routes and their OpenAPI document, authentication and the
two role layers, error shapes and statuses, input bounds, idempotency, tokens.

The tests on `served` run twice: against the ASGI app in-process (Starlette's TestClient)
and through a real listener on loopback (`ServerThread`, where the API's requests are
served from the parser's callbacks, `_api_cycle`), so both paths answer alike. The ones
about what only a real listener does (the access log, the CLI) start one themselves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
from starlette.testclient import TestClient

from execkit._api import ENDPOINTS
from execkit._budget import Attempt
from execkit._classify import FailureClass
from execkit._errors import ExecKitError
from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.ledger import CAPABILITIES, SqliteLedger, Task, open_ledger
from execkit.server import (
    LedgerApp,
    ServerThread,
    TokenFile,
    add_token,
    parse_listen,
    token_hash,
)

REPO = Path(__file__).resolve().parent.parent
ME = pwd.getpwuid(os.geteuid()).pw_name
BOTH = ["agent.operate", "ledger.admin"]


@attrs.define
class Served:
    tmp: Path
    ledger: SqliteLedger
    tokens: Path
    app: LedgerApp
    client: httpx2.Client
    owner: str  # the token for the ledger's owner (us), with both roles
    plain: str  # alice, no token role
    operator: str  # alice, agent.operate

    def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        body: Any = None,
        **headers: str,
    ) -> tuple[int, Any]:
        sent = dict(headers)
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        sent = {name.replace("_", "-"): value for name, value in sent.items()}
        kwargs: dict[str, Any] = {"headers": sent}
        if body is not None:
            kwargs["content" if isinstance(body, bytes) else "json"] = body
            # Raw bytes are sent as JSON, as a client does (another type is 415).
            sent.setdefault("content-type", "application/json")
        answer = self.client.request(method, path, **kwargs)
        return answer.status_code, answer.json()

    def state(self) -> list[str]:
        """Every row of the ledger (the server keeps no rows of its own)."""
        return list(self.ledger._conn.iterdump())


def _served(tmp_path: Path, **options: Any) -> Served:
    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    owner = add_token(tokens, ME, BOTH)
    plain = add_token(tokens, "alice")
    operator = add_token(tokens, "alice", ["agent.operate"])
    app = LedgerApp(ledger, TokenFile(tokens), **options)
    return Served(tmp_path, ledger, tokens, app, TestClient(app.api), owner, plain, operator)


@contextlib.contextmanager
def _listening(served: Served) -> Iterator[Served]:
    """`served` with its client talking to a real listener on loopback."""
    with ServerThread(served.app) as running, httpx2.Client(base_url=running.url) as client:
        yield attrs.evolve(served, client=client)


@pytest.fixture(params=["asgi", "listener"])
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    made = _served(tmp_path)
    with contextlib.ExitStack() as stack:
        if request.param == "listener":
            made = stack.enter_context(_listening(made))
        yield made
    made.app.close()
    made.ledger.close()


def _error(doc: Any) -> str:
    assert set(doc) == {"error"}, doc
    assert {"code", "message"} <= set(doc["error"]) <= {"code", "message", "ready_at", "field"}
    code: str = doc["error"]["code"]
    return code


# -- the route table and its document -------------------------------------------------


def _normal(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path.split("?")[0])


def test_every_route_is_in_the_openapi_document_with_its_methods(served: Served) -> None:
    status, doc = served.call("GET", "/openapi.json")
    assert status == 200
    assert doc["openapi"] == "3.1.0"
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    routed: set[tuple[str, str]] = set()
    for route in served.app.app.routes:
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                routed.add((method, getattr(route, "path", "")))
    assert routed == documented
    assert routed == {(e.method, e.path) for e in ENDPOINTS}
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert names == set(re.findall(r"\{([^}]+)\}", path)), (method, path)
            for response in operation["responses"].values():
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"]


def test_every_path_in_docs_remote_md_is_routed_and_every_route_documented() -> None:
    text = (REPO / "docs" / "remote.md").read_text(encoding="utf-8")
    table = text.split("## Endpoints", 1)[1].split("\n## ", 1)[0]
    in_doc = {
        (method, _normal(path))
        for method, path in re.findall(r"^\| `(GET|POST) ([^`]+)`", table, re.MULTILINE)
    }
    assert in_doc == {(e.method, _normal(e.path)) for e in ENDPOINTS}


def test_the_documented_wire_shapes_are_the_ledgers(served: Served) -> None:
    _, doc = served.call("GET", "/openapi.json")
    schemas = doc["components"]["schemas"]
    task = served.ledger.create_task("t", actor="a")
    assert set(schemas["Task"]["properties"]) == set(task.to_dict())
    assert schemas["Task"]["properties"]["state"]["enum"] == [s.value for s in type(task.state)]
    assert schemas["Task"]["properties"]["blocked_on"]["type"] == ["string", "null"]


def test_the_error_statuses_are_those_of_docs_remote_md() -> None:
    from execkit._api import ERROR_STATUSES

    text = (REPO / "docs" / "remote.md").read_text(encoding="utf-8")
    table = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, int] = {}
    for status, codes in re.findall(r"^\| (\d{3}) \| (.+) \|$", table, re.MULTILINE):
        for code in re.findall(r"`([a-z_]+)`", codes):
            documented[code] = int(status)
    assert documented == ERROR_STATUSES


# -- authentication and roles ---------------------------------------------------------

POSTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/tasks", {"title": "x", "max_attempts": 3}),
    ("/v1/tasks/t-1/attempt-limit", {"max_attempts": 9, "expected_max_attempts": 2}),
    ("/v1/tasks/t-1/retry", {"force": True}),
    ("/v1/tasks/t-1/cancel", {}),
    ("/v1/tasks/t-1/give-up", {"state": "blocked"}),
    ("/v1/tasks/t-1/runs", {"ignore_backoff": True}),
    ("/v1/runs/r-1/heartbeat", {}),
    ("/v1/runs/r-1/finish", {"status": "failed"}),
    ("/v1/runs/abandon-expired", {}),
    ("/v1/grants", {"principal": "bob", "role": "agent.operate"}),
    ("/v1/grants/revoke", {"principal": "carol", "role": "agent.operate"}),
    ("/v1/check/repair", {}),
]


def _seed(served: Served) -> None:
    ledger = served.ledger
    ledger.create_task("seed", max_attempts=2, actor=ME)
    run = ledger.start_run("t-1", request_key="k", actor=ME, lease_s=0.001)
    ledger.grant_role("carol", "agent.operate", actor=ME)
    time.sleep(0.01)  # its lease has expired: abandon-expired and repair would act
    assert run.status == "running"


@pytest.mark.parametrize(("path", "body"), POSTS, ids=[p for p, _ in POSTS])
@pytest.mark.parametrize("token", [None, "", "Basic abc", "Bearer nope"])
def test_an_unauthenticated_call_is_401_and_changes_nothing(
    served: Served, path: str, body: dict[str, Any], token: str | None
) -> None:
    _seed(served)
    before = served.state()
    headers = {} if token is None else {"Authorization": token}
    answer = served.client.post(path, json=body, headers={**headers, "Idempotency-Key": "k1"})
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert _error(answer.json()) == "unauthenticated"
    assert served.state() == before


def test_the_401_help_names_the_header_as_written(served: Served) -> None:
    # `Bearer TOKEN` names the credential to send and is none: every answer that says so
    # (the API, and the front's dashboard and /metrics) says it unmasked (issue #44).
    help_text = "send Authorization: Bearer TOKEN"
    for sent in ({}, {"Authorization": "Basic x"}):
        status, doc = served.call("GET", "/v1/tasks", **sent)
        assert (status, _error(doc), doc["error"]["message"]) == (401, "unauthenticated", help_text)
    front = TestClient(served.app.front.asgi)
    for path in ("/dashboard/api/snapshot", "/metrics"):
        answer = front.get(path, headers={"Authorization": "Basic x"})
        assert answer.status_code == 401
        assert answer.json()["error"]["message"] == help_text, path


GATED = [
    ("/v1/tasks/t-1/attempt-limit", {"max_attempts": 9, "expected_max_attempts": 2}),
    ("/v1/tasks/t-1/retry", {"force": True}),
    ("/v1/grants", {"principal": "bob", "role": "agent.operate"}),
    ("/v1/grants/revoke", {"principal": "carol", "role": "agent.operate"}),
    ("/v1/check/repair", {}),
]


@pytest.mark.parametrize(("path", "body"), GATED, ids=[p for p, _ in GATED])
def test_a_call_without_the_token_role_is_403_and_changes_nothing(
    served: Served, path: str, body: dict[str, Any]
) -> None:
    _seed(served)
    before = served.state()
    status, doc = served.call("POST", path, served.plain, body, Idempotency_Key="k2")
    assert (status, _error(doc)) == (403, "forbidden")
    assert "token role" in doc["error"]["message"]
    assert served.state() == before
    if "grants" in path or "repair" in path:  # agent.operate is not ledger.admin
        status, doc = served.call("POST", path, served.operator, body)
        assert (status, _error(doc)) == (403, "forbidden")
        assert served.state() == before


def test_roles_from_the_request_are_never_read(served: Served) -> None:
    served.ledger.create_task("t", max_attempts=2, actor=ME)
    for extra in ({"roles": ["agent.operate"]}, {"role": "agent.operate"}):
        status, doc = served.call(
            "POST",
            "/v1/tasks/t-1/attempt-limit",
            served.plain,
            {"max_attempts": 3, "expected_max_attempts": 2, **extra},
        )
        assert status in (400, 403), doc
    status, doc = served.call(
        "POST",
        "/v1/tasks/t-1/attempt-limit",
        served.plain,
        {"max_attempts": 3, "expected_max_attempts": 2},
        X_Roles="agent.operate",
        X_Actor=ME,
    )
    assert (status, _error(doc)) == (403, "forbidden")
    assert served.ledger.get_task("t-1").max_attempts == 2


def test_the_two_role_layers(served: Served) -> None:
    """The token's role opens the route; the ledger still checks the actor's grant."""
    os.chown(served.ledger.path, pwd.getpwnam("nobody").pw_uid, -1)  # we no longer own it
    served.ledger.create_task("t", max_attempts=2, actor="alice")
    served.ledger.start_run("t-1", request_key="k", actor="alice")
    body = {"max_attempts": 4, "expected_max_attempts": 2}
    # The token may use agent.operate, but alice holds no grant in the ledger.
    status, doc = served.call("POST", "/v1/tasks/t-1/attempt-limit", served.operator, body)
    assert (status, _error(doc)) == (403, "forbidden")
    assert "execkit role grant alice agent.operate" in doc["error"]["message"]
    served.ledger.grant_role("alice", "agent.operate", actor="nobody")
    # Granted in the ledger, but this token may not use the role.
    status, doc = served.call("POST", "/v1/tasks/t-1/attempt-limit", served.plain, body)
    assert (status, _error(doc)) == (403, "forbidden")
    # Both layers agree.
    status, doc = served.call("POST", "/v1/tasks/t-1/attempt-limit", served.operator, body)
    assert (status, doc["max_attempts"]) == (200, 4)
    assert served.ledger.audit_events("t-1")[-1].actor == "alice"


def test_the_token_actor_acts_and_on_behalf_of_is_recorded_beside_it(served: Served) -> None:
    status, task = served.call(
        "POST", "/v1/tasks", served.plain, {"title": "x"}, X_On_Behalf_Of="the%20build%20bot"
    )
    assert (status, task["created_by"]) == (201, "alice on behalf of the build bot")
    status, task = served.call(
        "POST", "/v1/tasks", served.plain, {"title": "y"}, X_On_Behalf_Of="J%C3%BCrgen"
    )
    assert task["created_by"] == "alice on behalf of Jürgen"
    # A header of blanks only cannot be sent on the wire (a client refuses it): in process.
    blank = [" "] if isinstance(served.client, TestClient) else []
    for bad in ("%FF", "a%0Ab", "%20", *blank):
        status, doc = served.call(
            "POST", "/v1/tasks", served.plain, {"title": "z"}, X_On_Behalf_Of=bad
        )
        assert (status, _error(doc)) == (400, "invalid"), bad
    assert len(served.ledger.list_tasks()) == 2


def test_reads_need_a_token_too_but_not_the_document(served: Served) -> None:
    for path in ("/v1/tasks", "/v1/capabilities", "/v1/audit", "/v1/grants", "/v1/check"):
        assert served.call("GET", path)[0] == 401, path
        assert served.call("GET", path, served.plain)[0] == 200, path
    assert served.call("GET", "/openapi.json")[0] == 200


def test_a_viewer_reads_the_tasks_with_their_last_attempts_a_page_a_request(
    served: Served,
) -> None:
    """`GET /v1/tasks-with-last` (what `execkit status --remote` reads): any valid token,
    each task beside its last attempt or null, `title_prefix`, `limit` and `after` as the
    ledger takes them; a bad `limit` is 400 naming the field and its range."""
    ledger = served.ledger
    ledger.create_task("board:A", actor=ME)
    ledger.create_task("other", actor=ME)
    ledger.create_task("board:B", actor=ME)
    run = ledger.start_run("t-3", request_key="k", actor=ME)
    ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="HTTP 503")
    path = "/v1/tasks-with-last?title_prefix=board%3A"
    assert served.call("GET", path)[0] == 401
    status, doc = served.call("GET", f"{path}&limit=1", served.plain)
    assert status == 200
    assert [(item["task"]["id"], item["last_attempt"]) for item in doc["tasks"]] == [("t-1", None)]
    status, doc = served.call("GET", f"{path}&limit=1&after=t-1&cap=5", served.plain)
    assert status == 200
    [item] = doc["tasks"]
    assert item["task"]["id"] == "t-3" and item["task"]["attempts_started"] == 1
    assert Attempt(**item["last_attempt"]) == ledger.history("t-3")[-1]
    status, doc = served.call("GET", "/v1/tasks-with-last", served.plain)
    assert [item["task"]["title"] for item in doc["tasks"]] == ["board:A", "other", "board:B"]
    for bad in ("0", "10001"):
        status, doc = served.call("GET", f"/v1/tasks-with-last?limit={bad}", served.plain)
        assert (status, _error(doc), doc["error"]["field"]) == (400, "invalid", "limit")
        assert "1..10000" in doc["error"]["message"]
    for bad_query in ("limit=many", "cap=-1", "surprise=1"):
        status, doc = served.call("GET", f"/v1/tasks-with-last?{bad_query}", served.plain)
        assert (status, _error(doc)) == (400, "invalid"), bad_query
        assert bad_query.split("=")[0] in doc["error"]["message"]
    status, doc = served.call("GET", "/v1/tasks-with-last?after=t-9", served.plain)
    assert (status, _error(doc)) == (404, "not_found")


# -- errors -----------------------------------------------------------------------------


def test_each_refusal_has_its_status_and_code(served: Served) -> None:
    call, token = served.call, served.owner
    assert call("GET", "/v1/tasks/t-9", token)[0] == 404
    call("POST", "/v1/tasks", token, {"title": "t", "max_attempts": 1})
    _, run = call("POST", "/v1/tasks/t-1/runs", token, {})
    status, doc = call("POST", "/v1/tasks/t-1/runs", token, {})
    assert (status, _error(doc)) == (409, "blocked")
    call("POST", f"/v1/runs/{run['id']}/finish", token, {"status": "failed"})
    status, doc = call("POST", "/v1/tasks/t-1/runs", token, {"ignore_backoff": True})
    assert (status, _error(doc)) == (422, "attempt_limit")
    status, doc = call(
        "POST",
        "/v1/tasks/t-1/attempt-limit",
        token,
        {"max_attempts": 3, "expected_max_attempts": 7},
    )
    assert (status, _error(doc)) == (409, "conflict")
    call("POST", "/v1/tasks", token, {"title": "u"})
    call("POST", "/v1/tasks/t-2/runs", token, {})
    call("POST", "/v1/runs/r-2/finish", token, {"status": "failed", "failure_class": "upstream"})
    status, doc = call("POST", "/v1/tasks/t-2/runs", token, {})
    assert (status, _error(doc)) == (409, "backoff")
    assert doc["error"]["ready_at"] > time.time()
    call("POST", "/v1/tasks/t-2/cancel", token, {})
    status, doc = call("POST", "/v1/tasks/t-2/runs", token, {})
    assert (status, _error(doc)) == (409, "finished")
    status, doc = call("POST", "/v1/runs/r-2/finish", token, {"status": "exploded"})
    assert (status, _error(doc)) == (400, "invalid")


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'"text"',
        b'{"title": NaN}',
        b'{"title": "x", "max_attempts": Infinity}',
        b'{"title": 7}',
        b'{"title": "x", "max_attempts": true}',
        b'{"title": "x", "max_attempts": 2.5}',
        b'{"title": "x", "max_attempts": 100000000000000000000000}',
        b'{"title": "x", "surprise": 1}',
        b'{"title": "a\\u0000b"}',
        b'{"title": "\\ud800"}',
        b"{}",
        b"\xff\xfe",
        b"[" * 100_000,
    ],
)
def test_bad_bodies_are_400_invalid_and_change_nothing(served: Served, body: bytes) -> None:
    before = served.state()
    status, doc = served.call("POST", "/v1/tasks", served.owner, body)
    assert (status, _error(doc)) == (400, "invalid"), doc
    assert served.state() == before


@pytest.mark.parametrize(
    "query", ["cap=abc", "force=yes", "cap=1&cap=2", "surprise=1", "cap=99999999999999999999"]
)
def test_bad_query_parameters_are_400(served: Served, query: str) -> None:
    served.ledger.create_task("t", actor="a")
    status, doc = served.call("GET", f"/v1/tasks/t-1?{query}", served.owner)
    assert (status, _error(doc)) == (400, "invalid")


@pytest.mark.parametrize("via", ["asgi", "listener"])
def test_a_body_over_the_limit_is_413_and_changes_nothing(tmp_path: Path, via: str) -> None:
    with contextlib.ExitStack() as stack:
        served = _served(tmp_path, max_body_bytes=1000)
        if via == "listener":
            served = stack.enter_context(_listening(served))
        _check_413(served)


def _check_413(served: Served) -> None:
    before = served.state()
    big = {"title": "x" * 2000}
    status, doc = served.call("POST", "/v1/tasks", served.owner, big)
    assert (status, _error(doc)) == (413, "invalid")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the stream is counted
        yield b'{"title": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}'

    answer = served.client.post(
        "/v1/tasks", content=chunks(), headers={"Authorization": f"Bearer {served.owner}"}
    )
    assert answer.status_code == 413
    assert served.state() == before
    served.app.close()


def test_unknown_paths_and_methods_keep_the_error_shape(served: Served) -> None:
    status, doc = served.call("GET", "/v2/nothing", served.owner)
    assert (status, _error(doc)) == (404, "not_found")
    status, doc = served.call("DELETE", "/v1/tasks", served.owner)
    assert (status, _error(doc)) == (405, "invalid")


def _get_paths(served: Served) -> list[str]:
    """Every GET route of the server, its parameters filled from `_seed`'s rows."""
    run = served.ledger.runs("t-1")[0]
    fill = {"task_id": "t-1", "run_id": run.id}
    api = [re.sub(r"\{([^}]+)\}", lambda m: fill[m.group(1)], e.path) for e in ENDPOINTS]
    api = [path for path, e in zip(api, ENDPOINTS, strict=True) if e.method == "GET"]
    front = ["/healthz", "/readyz", "/metrics", "/", "/dashboard", "/dashboard/tasks/t-1"]
    front += ["/dashboard/static/dashboard.js", "/dashboard/api/session"]
    front += ["/dashboard/api/snapshot", "/dashboard/api/tasks/t-1"]
    return [*api, "/v1/tasks/t-404", "/v1/lanes/show?lane=a", *front]


def test_head_answers_as_get_without_the_body_on_every_get_route(tmp_path: Path) -> None:
    """Through the listener, every GET route (the API's, the monitoring's, the dashboard's)
    answers HEAD with the GET's status, type and, where the answer does not change from
    one request to the next, length; no body."""
    served = _served(tmp_path)
    _seed(served)
    with _listening(served) as listening:
        client = listening.client
        auth = {"Authorization": f"Bearer {served.owner}"}
        for path in _get_paths(served):
            got = client.get(path, headers=auth)
            head = client.head(path, headers=auth)
            assert head.status_code == got.status_code, (path, head.status_code, got.text)
            assert head.headers.get("content-type") == got.headers.get("content-type"), path
            assert head.content == b"", path
            if path.startswith(("/v1/", "/openapi.json")):
                assert head.headers["content-length"] == got.headers["content-length"], path
    # In-process too (the API's ASGI path, as a pipelined request or one under h11 takes).
    client = TestClient(served.app.front.asgi)
    for path in _get_paths(served):
        if path.startswith("/v1/"):
            head = client.head(path, headers={"Authorization": f"Bearer {served.owner}"})
            got = client.get(path, headers={"Authorization": f"Bearer {served.owner}"})
            assert head.status_code == got.status_code, path
            assert head.headers["content-length"] == got.headers["content-length"], path
    served.app.close()
    served.ledger.close()


def test_an_exception_no_route_expected_is_a_json_500_on_every_route(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A route outside the API (here /readyz, whose ledger read raises what it does not
    expect) answers a JSON 500 in the error shape, not Starlette's text page."""

    class BrokenLedger(SqliteLedger):
        def schema_version(self) -> int:
            raise RuntimeError("a bug")

    ledger = BrokenLedger(tmp_path / "ledger.db")
    add_token(tmp_path / "tokens.json", ME)
    app = LedgerApp(ledger, TokenFile(tmp_path / "tokens.json"))
    with caplog.at_level(logging.ERROR):
        answer = TestClient(app.front.asgi, raise_server_exceptions=False).get("/readyz")
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": {"code": "error", "message": "internal server error"}}
    with ServerThread(app) as running, caplog.at_level(logging.ERROR):
        answer = httpx2.get(running.url + "/readyz")
    assert answer.status_code == 500
    assert answer.json() == {"error": {"code": "error", "message": "internal server error"}}
    app.close()
    ledger.close()


@pytest.mark.parametrize("via", ["asgi", "listener"])
def test_a_request_past_its_time_is_503_and_its_answer_replays_later(
    tmp_path: Path, via: str
) -> None:
    class SlowLedger(SqliteLedger):
        slow = True

        def create_task(self, title: str, **kwargs: Any) -> Task:
            task = super().create_task(title, **kwargs)
            if self.slow:  # the first: committed, answered too late
                self.slow = False
                time.sleep(0.6)
            return task

    ledger = SlowLedger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME)
    app = LedgerApp(ledger, TokenFile(tokens), request_timeout_s=0.2)
    with contextlib.ExitStack() as stack:
        client: httpx2.Client = TestClient(app.api)
        if via == "listener":
            running = stack.enter_context(ServerThread(app))
            client = stack.enter_context(httpx2.Client(base_url=running.url))
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "slow-1"}
        answer = client.post("/v1/tasks", json={"title": "x"}, headers=headers)
        assert answer.status_code == 503
        assert "outcome is unknown" in answer.json()["error"]["message"]
        deadline = time.monotonic() + 10
        while not ledger.list_tasks() and time.monotonic() < deadline:
            time.sleep(0.05)
        again = client.post("/v1/tasks", json={"title": "x"}, headers=headers)
        assert (again.status_code, again.json()["id"]) == (201, "t-1")
        assert [t.id for t in ledger.list_tasks()] == ["t-1"]
    app.close()
    ledger.close()


def test_a_slow_ledger_call_holds_only_its_own_request(tmp_path: Path) -> None:
    """Through the listener, a ledger call that does not return (here: until released)
    keeps its own request waiting and no other: another connection is answered meanwhile,
    and the held one is answered once its call returns."""
    release, entered = threading.Event(), threading.Event()

    class HeldLedger(SqliteLedger):
        def create_task(self, title: str, **kwargs: Any) -> Task:
            entered.set()
            assert release.wait(30)
            return super().create_task(title, **kwargs)

    ledger = HeldLedger(tmp_path / "ledger.db")
    token = add_token(tmp_path / "tokens.json", ME)
    app = LedgerApp(ledger, TokenFile(tmp_path / "tokens.json"))
    auth = {"Authorization": f"Bearer {token}"}
    held: list[httpx2.Response] = []
    with ServerThread(app) as running, httpx2.Client(base_url=running.url) as first:
        thread = threading.Thread(
            target=lambda: held.append(first.post("/v1/tasks", json={"title": "x"}, headers=auth))
        )
        thread.start()
        assert entered.wait(30)
        with httpx2.Client(base_url=running.url) as second:
            assert second.get("/v1/capabilities", headers=auth).status_code == 200
            assert second.get("/v1/tasks", headers=auth).json() == {"tasks": []}
        assert not held  # still waiting for its call
        release.set()
        thread.join(30)
    assert [answer.status_code for answer in held] == [201]
    app.close()
    ledger.close()


def test_an_unexpected_exception_is_a_json_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenLedger(SqliteLedger):
        def list_tasks(self, *, now: float | None = None, **_: Any) -> list[Task]:
            raise RuntimeError("a bug")

    ledger = BrokenLedger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME)
    app = LedgerApp(ledger, TokenFile(tokens))
    with caplog.at_level(logging.ERROR, logger="execkit.server"):
        answer = TestClient(app.api).get("/v1/tasks", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 500
    assert answer.json() == {"error": {"code": "error", "message": "internal server error"}}
    assert "a bug" in caplog.text and token not in caplog.text
    app.close()
    ledger.close()


# -- idempotency ------------------------------------------------------------------------


def test_a_key_replays_the_first_answer_and_a_different_request_is_409(served: Served) -> None:
    body = {"title": "x", "max_attempts": 2}
    status, first = served.call("POST", "/v1/tasks", served.owner, body, Idempotency_Key="a")
    assert status == 201
    served.ledger.start_run("t-1", request_key="r", actor=ME)  # the task moves on
    before = served.state()
    status, again = served.call("POST", "/v1/tasks", served.owner, body, Idempotency_Key="a")
    # The same task, as it is now (the ledger's replay): nothing written.
    assert (status, again["id"], again["attempts_started"]) == (201, first["id"], 1)
    assert served.state() == before
    for changed in ({"title": "y", "max_attempts": 2}, {"title": "x"}):
        status, doc = served.call("POST", "/v1/tasks", served.owner, changed, Idempotency_Key="a")
        assert (status, _error(doc)) == (409, "conflict")
    assert served.state() == before
    status, doc = served.call("POST", "/v1/tasks", served.owner, body, Idempotency_Key="!" * 201)
    assert (status, _error(doc)) == (400, "invalid")


def test_a_refusal_is_not_stored(served: Served) -> None:
    served.ledger.create_task("t", actor=ME)
    served.ledger.start_run("t-1", request_key="first", actor=ME)
    status, doc = served.call("POST", "/v1/tasks/t-1/runs", served.owner, {}, Idempotency_Key="b")
    assert (status, _error(doc)) == (409, "blocked")
    served.ledger.finish_run("r-1", "failed", failure_class=FailureClass.UPSTREAM)
    status, run = served.call(
        "POST", "/v1/tasks/t-1/runs", served.owner, {"ignore_backoff": True}, Idempotency_Key="c"
    )
    assert (status, run["attempt"], run["request_key"]) == (201, 2, "c")


def test_answers_survive_a_restart(tmp_path: Path) -> None:
    first = _served(tmp_path)
    status, task = first.call("POST", "/v1/tasks", first.owner, {"title": "x"}, Idempotency_Key="k")
    assert status == 201
    first.app.close()
    first.ledger.close()
    ledger = open_ledger(tmp_path / "ledger.db")
    app = LedgerApp(ledger, TokenFile(first.tokens))
    answer = TestClient(app.api).post(
        "/v1/tasks",
        json={"title": "x"},
        headers={"Authorization": f"Bearer {first.owner}", "Idempotency-Key": "k"},
    )
    assert answer.json() == task
    assert len(ledger.list_tasks()) == 1
    app.close()
    ledger.close()


def test_two_requests_with_one_key_at_once_act_once(served: Served) -> None:
    answers: list[tuple[int, Any]] = []

    def send() -> None:
        answers.append(
            served.call("POST", "/v1/tasks", served.owner, {"title": "x"}, Idempotency_Key="same")
        )

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {status for status, _ in answers} == {201}
    assert {doc["id"] for _, doc in answers} == {"t-1"}
    assert len(served.ledger.list_tasks()) == 1


def test_the_key_is_the_runs_request_key_when_the_body_gives_none(served: Served) -> None:
    served.ledger.create_task("t", actor=ME)
    status, run = served.call("POST", "/v1/tasks/t-1/runs", served.owner, {}, Idempotency_Key="rk")
    assert (status, run["request_key"]) == (201, "rk")
    status, again = served.call(
        "POST", "/v1/tasks/t-1/runs", served.owner, {}, Idempotency_Key="rk"
    )
    assert (status, again["id"]) == (201, run["id"])


def test_a_key_is_the_ledgers_not_the_tokens(served: Served) -> None:
    served.call("POST", "/v1/tasks", served.owner, {"title": "x"}, Idempotency_Key="k")
    status, doc = served.call(
        "POST", "/v1/tasks", served.plain, {"title": "x"}, Idempotency_Key="k"
    )
    # One key space per ledger (docs/remote.md): the same creation replays the task.
    assert (status, doc["id"]) == (201, "t-1")
    assert len(served.ledger.list_tasks()) == 1
    # An admission's key names its actor: another token's request with it is a conflict.
    served.call("POST", "/v1/tasks/t-1/runs", served.owner, {}, Idempotency_Key="rk")
    status, doc = served.call("POST", "/v1/tasks/t-1/runs", served.plain, {}, Idempotency_Key="rk")
    assert (status, _error(doc)) == (409, "conflict")


# -- capabilities -----------------------------------------------------------------------


def test_capabilities_and_the_older_server_stand_in(tmp_path: Path) -> None:
    served = _served(tmp_path, without=frozenset({"tasks.attempt_limits"}))
    status, doc = served.call("GET", "/v1/capabilities", served.plain)
    assert status == 200
    assert doc["capabilities"] == sorted(CAPABILITIES - {"tasks.attempt_limits"})
    assert doc["ledger_id"] == served.ledger.ledger_id()
    assert doc["schema_version"] == served.ledger.schema_version()
    assert doc["backoff"] == attrs.asdict(served.ledger.backoff)
    served.app.close()


# -- tokens -----------------------------------------------------------------------------


def test_the_tokens_file_holds_hashes_only_and_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "tokens.json"
    token = add_token(path, "alice", ["agent.operate"])
    text = path.read_text()
    assert token not in text
    doc = json.loads(text)
    assert doc == {
        "tokens": [{"sha256": token_hash(token), "actor": "alice", "roles": ["agent.operate"]}]
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    second = add_token(path, "bob")
    assert second != token and len(json.loads(path.read_text())["tokens"]) == 2
    found = TokenFile(path)
    assert found.lookup(token) is not None and found.lookup(token + "x") is None
    with pytest.raises(ExecKitError, match="unknown role"):
        add_token(path, "carol", ["root"])
    assert len(json.loads(path.read_text())["tokens"]) == 2


def test_a_tokens_file_others_can_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    add_token(path, "alice")
    os.chmod(path, 0o620)
    with pytest.raises(ExecKitError, match="writable by others"):
        TokenFile(path)


def test_tokens_are_reread_when_the_file_changes_and_a_broken_file_fails_closed(
    served: Served,
) -> None:
    late = add_token(served.tokens, "dave")
    assert served.call("GET", "/v1/tasks", late)[0] == 200
    good = served.tokens.read_text()
    served.tokens.write_text('{"tokens": [{"sha256": "oops"}]}')
    status, doc = served.call("GET", "/v1/tasks", served.owner)
    assert (status, _error(doc)) == (503, "storage")
    served.tokens.write_text(good)
    assert served.call("GET", "/v1/tasks", served.owner)[0] == 200
    # Removing a token's line revokes it.
    entries = json.loads(good)["tokens"]
    kept = [e for e in entries if e["sha256"] != token_hash(late)]
    served.tokens.write_text(json.dumps({"tokens": kept}))
    assert served.call("GET", "/v1/tasks", late)[0] == 401


def test_no_token_reaches_a_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    served = _served(tmp_path)
    with caplog.at_level(logging.DEBUG), ServerThread(served.app) as running:
        for token in (served.owner, "not-a-token-" + "z" * 20):
            request = urllib.request.Request(
                f"{running.url}/v1/tasks/t-404", headers={"Authorization": f"Bearer {token}"}
            )
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(request, timeout=10)
    assert served.owner not in caplog.text
    assert "z" * 20 not in caplog.text
    served.app.close()
    served.ledger.close()


# -- listening ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8750", ("127.0.0.1", 8750)),
        ("localhost:0", ("127.0.0.1", 0)),
        ("127.8.9.10:1", ("127.8.9.10", 1)),
        ("[::1]:9000", ("::1", 9000)),
    ],
)
def test_loopback_addresses_are_accepted(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(
    "text", ["0.0.0.0:8750", "[::]:8750", "10.0.0.5:80", "example.com:80", "8750", "x:y", ":80"]
)
def test_other_addresses_are_refused_unless_allowed(text: str) -> None:
    with pytest.raises(ExecKitError):
        parse_listen(text)
    if text not in ("8750", "x:y", ":80"):
        assert parse_listen(text, allow_non_loopback=True)[1] > 0


# -- the command ------------------------------------------------------------------------


def test_serve_refuses_a_non_loopback_address_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens.json"
    add_token(tokens, ME)
    db = tmp_path / "ledger.db"
    argv = ["serve", "--db", str(db), "--tokens", str(tokens), "--listen", "0.0.0.0:0"]
    assert main(argv) == EXIT_CODES["invalid"]
    assert "not a loopback address" in capsys.readouterr().err
    assert not db.exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["serve"], "the tokens file is required (--tokens)"),
        (["serve", "--tokens", "t.json", "--actor", "a"], "--actor does not apply"),
        (["serve", "--tokens", "t.json", "--without-capability", "x"], "unknown capability"),
        (["serve", "--add-token", "t.json"], "--actor NAME is required"),
        (["serve", "--add-token", "t.json", "--actor", "a", "--role", "root"], "unknown role"),
        (["serve", "--add-token", "t.json", "--actor", "a", "--tokens", "x"], "does not apply"),
        (["serve", "--tokens", "t.json", "--request-timeout", "0"], "--request-timeout"),
        (["serve", "--tokens", "t.json", "--max-connections", "0"], "--max-connections"),
        (["serve", "--tokens", "t.json", "--max-connections", "many"], "--max-connections"),
        (["serve", "--tokens", "t.json", "--max-connections", "2000000"], "--max-connections"),
        (["serve", "--tokens", "t.json", "--idle-timeout", "0"], "--idle-timeout"),
        (["serve", "--tokens", "t.json", "--head-timeout", "nan"], "--head-timeout"),
        (["serve", "--tokens", "t.json", "--head-timeout", "3601"], "--head-timeout"),
        (["serve", "--add-token", "t.json", "--actor", "a", "--idle-timeout", "1"], "does not"),
    ],
)
def test_serve_flags_are_checked(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    add_token(tmp_path / "t.json", ME)
    assert main(argv) == EXIT_CODES["invalid"]
    err = capsys.readouterr().err
    assert needle in err
    assert "[REDACTED]" not in err  # our own advice must survive redaction whole


def test_a_missing_tokens_file_says_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--db", str(tmp_path / "l.db"), "--tokens", str(tmp_path / "none.json")]
    assert main(argv) == EXIT_CODES["not_found"]
    err = capsys.readouterr().err
    assert "create one with `execkit serve --add-token`" in err
    assert "[REDACTED]" not in err


def test_add_token_prints_the_token_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tokens.json"
    argv = ["serve", "--add-token", str(path), "--actor", "bot", "--role", "agent.operate"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["actor"], doc["roles"]) == ("bot", ["agent.operate"])
    principal = TokenFile(path).lookup(doc["token"])
    assert principal is not None and principal.actor == "bot"
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 1 and out.strip() not in err


def test_serve_listens_where_it_says_and_stops_on_sigint(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME)
    process, ready = _serve_ready(tmp_path, tokens)
    try:
        request = urllib.request.Request(
            f"{ready['url']}/v1/capabilities", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["ledger_id"] == ready["ledger_id"]
    finally:
        process.send_signal(2)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert token not in err and "Traceback" not in err


def test_serve_bounds_its_connections_as_its_flags_say(tmp_path: Path) -> None:
    """`--max-connections 1`: with one connection held (sending nothing; `--idle-timeout`
    long enough to keep it), a request on a second is 503 in the error shape and /healthz
    still answers."""
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME)
    flags = ("--max-connections", "1", "--idle-timeout", "600", "--head-timeout", "600")
    process, url = _serve_process(tmp_path, tokens, *flags)
    try:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30):
            refused = httpx2.get(
                url + "/v1/capabilities", headers={"Authorization": f"Bearer {token}"}
            )
            assert refused.status_code == 503
            assert "limit of 1 connections" in refused.json()["error"]["message"]
            assert httpx2.get(url + "/healthz").json() == {"status": "ok"}
    finally:
        process.send_signal(2)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err


def _serve_process(tmp_path: Path, tokens: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """`execkit serve` on the ledger in `tmp_path`, and the URL it listens on."""
    process, ready = _serve_ready(tmp_path, tokens, *extra)
    return process, str(ready["url"])


def _serve_ready(
    tmp_path: Path, tokens: Path, *extra: str
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """`execkit serve` on the ledger in `tmp_path`, and the line it prints when ready."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "execkit",
            "serve",
            "--db",
            str(tmp_path / "ledger.db"),
            "--tokens",
            str(tokens),
            "--listen",
            "127.0.0.1:0",
            "--json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None
    ready: dict[str, Any] = json.loads(process.stdout.readline())
    return process, ready


def _post(url: str, token: str, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Idempotency-Key": key,
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, json.loads(answer.read())


def test_a_retry_after_the_server_was_killed_replays_and_no_file_but_the_ledger_is_written(
    tmp_path: Path,
) -> None:
    """The retry a client sends when its first request's answer was lost to a crash: the
    server is killed (SIGKILL: nothing of its own flushed), another one started on the
    same ledger answers the same key with the same task and run, and written nothing but
    the ledger's own files (no `tokens.idempotency.db`, even when `--idempotency-db` names
    one: it is deprecated and ignored)."""
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME, BOTH)
    before = set(os.listdir(tmp_path))
    answers: list[tuple[int, dict[str, Any]]] = []
    for extra in ((), ("--idempotency-db", str(tmp_path / "answers.db"))):
        process, url = _serve_process(tmp_path, tokens, *extra)
        try:
            answers.append(_post(f"{url}/v1/tasks", token, {"title": "x"}, "task-1"))
            answers.append(_post(f"{url}/v1/tasks/t-1/runs", token, {}, "run-1"))
            answers.append(
                _post(
                    f"{url}/v1/tasks/t-1/attempt-limit",
                    token,
                    {"max_attempts": 3, "expected_max_attempts": 0},
                    "limit-1",
                )
            )
        finally:
            process.kill()
            _, err = process.communicate(timeout=30)
        assert "Traceback" not in err
    first, second = answers[:3], answers[3:]
    assert [status for status, _ in first + second] == [201, 201, 200] * 2
    assert [doc["id"] for _, doc in second] == [doc["id"] for _, doc in first]
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        assert [task.id for task in ledger.list_tasks()] == ["t-1"]
        assert [run.id for run in ledger.runs("t-1")] == ["r-1"]
        assert ledger.get_task("t-1").max_attempts == 3
    written = set(os.listdir(tmp_path)) - before
    assert {name for name in written if not name.startswith("ledger.db")} == set()


def test_ledger_calls_run_on_at_most_workers_threads(tmp_path: Path) -> None:
    """Eight requests at once on a server of two workers: every one is answered, by at
    most two threads, never more than two ledger calls at once."""
    running: list[str] = []
    seen: set[str] = set()
    most = 0
    guard = threading.Lock()
    two_in = threading.Barrier(2, timeout=30)

    class CountingLedger(SqliteLedger):
        def create_task(self, title: str, **kwargs: Any) -> Task:
            nonlocal most
            with guard:
                running.append(threading.current_thread().name)
                seen.add(running[-1])
                most = max(most, len(running))
            with contextlib.suppress(threading.BrokenBarrierError):
                two_in.wait()  # the first two meet: both workers are busy at once
            try:
                return super().create_task(title, **kwargs)
            finally:
                with guard:
                    running.remove(threading.current_thread().name)

    ledger = CountingLedger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME)
    app = LedgerApp(ledger, TokenFile(tokens), workers=2)
    client = TestClient(app.api)
    answers: list[int] = []

    def send(n: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        answers.append(
            client.post("/v1/tasks", json={"title": f"t{n}"}, headers=headers).status_code
        )

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    app.close()
    ledger.close()
    assert answers == [201] * 8
    assert most == 2 and len(seen) == 2
