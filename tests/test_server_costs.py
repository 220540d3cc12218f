"""What one request through `execkit serve` costs, by counts (never by time): HTTP requests
per admission, writes per request, token hashes, route patterns tried, access-log lines
built, metric series looked up, hops to a worker thread.

Each test counts through a real server on 127.0.0.1 (`ServerThread`, the listener's whole
application: access log, monitoring, dashboard, API) or the same application in process.
"""

from __future__ import annotations

import http.client
import logging
import os
import pwd
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from prometheus_client import Histogram
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

import execkit.server._tokens
from execkit._api import ENDPOINTS
from execkit._classify import FailureClass
from execkit.ledger import SqliteLedger, open_ledger
from execkit.remote import RemoteLedger
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token
from execkit.server._access_log import ACCESS_LOGGER, Request
from execkit.server._app import RouteTable
from execkit.server._workers import WorkerThreads

ME = pwd.getpwuid(os.geteuid()).pw_name


@attrs.define
class Served:
    ledger: SqliteLedger
    app: LedgerApp
    url: str
    token: str


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    ledger = open_ledger(tmp_path / "ledger.db")
    assert isinstance(ledger, SqliteLedger)
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME, ["agent.operate", "ledger.admin"])
    app = LedgerApp(ledger, TokenFile(tokens))
    with ServerThread(app) as running:
        yield Served(ledger, app, running.url, token)
    app.close()
    ledger.close()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    logger = logging.getLogger(ACCESS_LOGGER)
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _admit(client: RemoteLedger, ledger: SqliteLedger, count: int) -> None:
    """`count` admissions through `client`, each on a task of its own (made directly)."""
    for n in range(count):
        task = ledger.create_task(f"t{n}", actor=ME)
        run = client.start_run(task.id, request_key=f"k-{task.id}", actor=ME)
        client.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="x")


def test_an_admission_is_two_requests_each_one_write(
    served: Served, access_lines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """start_run + finish_run through RemoteLedger: exactly two HTTP requests reach the
    server (no capabilities GET, no re-read), and each request leaves the client in one
    write (head and body together: the server wakes once for it)."""
    writes: list[int] = []
    real_connect = socket.create_connection

    class Counted:
        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock

        def sendall(self, data: bytes) -> None:
            writes.append(len(data))
            self._sock.sendall(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._sock, name)

    def connect(address: tuple[str, int], timeout: float, *more: Any) -> Any:
        return Counted(real_connect(address, timeout, *more))

    monkeypatch.setattr(socket, "create_connection", connect)
    with RemoteLedger(served.url, served.token) as client:
        _admit(client, served.ledger, 5)
    # The access log writes a line once its answer is sent: the last may trail the client.
    for _ in range(500):
        if len(access_lines) >= 10:
            break
        time.sleep(0.01)
    routes = [line for line in access_lines if '"route": "/v1/' in line]
    assert len(routes) == 10
    assert sum('"method": "POST"' in line for line in routes) == 10
    assert len(writes) == 10  # one write a request, body included
    assert [t.attempts_started for t in served.ledger.list_tasks()] == [1] * 5


def test_a_token_is_hashed_once_per_process(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty requests with one token: its SHA-256 is computed once; a token the file does
    not hold is hashed on each try (nothing of it is kept), and is refused each time."""
    hashed: list[int] = []
    real_hash = execkit.server._tokens.token_hash

    def counting(token: str) -> str:
        hashed.append(1)
        return real_hash(token)

    monkeypatch.setattr(execkit.server._tokens, "token_hash", counting)
    client = TestClient(served.app.front.asgi)
    good = {"Authorization": f"Bearer {served.token}"}
    for _ in range(20):
        assert client.get("/v1/capabilities", headers=good).status_code == 200
    assert len(hashed) == 1
    bad = {"Authorization": "Bearer ekt_not-a-token"}
    for _ in range(3):
        assert client.get("/v1/capabilities", headers=bad).status_code == 401
    assert len(hashed) == 4


def test_the_tokens_file_is_looked_at_once_a_request_and_read_when_it_changed(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten requests: ten looks at the tokens file (its inode, size, mode and time), no
    read; once it changed, one read, then none again."""
    where = os.fspath(served.app.tokens.path)
    looked: list[str] = []
    parsed: list[str] = []
    real_stat, real_parse = os.stat, execkit.server._tokens._parse

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path) == where:
            looked.append(where)
        return real_stat(path, *args, **kwargs)

    def parse(text: str, name: str) -> Any:
        parsed.append(name)
        return real_parse(text, name)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(execkit.server._tokens, "_parse", parse)
    with RemoteLedger(served.url, served.token) as client:
        for _ in range(10):
            client.list_tasks()
        assert (len(looked), parsed) == (10, [])
        add_token(where, "bob")  # reads the file itself
        looked.clear()
        parsed.clear()
        for _ in range(10):
            client.list_tasks()
    assert (len(looked), parsed) == (10, [where])


def test_a_removed_token_is_refused_though_its_hash_was_kept(served: Served) -> None:
    tokens = served.app.tokens
    client = TestClient(served.app.front.asgi)
    good = {"Authorization": f"Bearer {served.token}"}
    assert client.get("/v1/capabilities", headers=good).status_code == 200
    tokens.path.write_text('{"tokens": []}\n')
    os.chmod(tokens.path, 0o600)
    assert client.get("/v1/capabilities", headers=good).status_code == 401


def test_an_api_request_tries_no_route_pattern(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API request is routed by the table (a dict lookup for a static path), not by
    trying each Starlette route's pattern: the dashboard's, the monitoring's, then the
    API's 31 in turn. A path the API does not have still gets Starlette's 404."""
    tried: list[str] = []
    real_matches = Route.matches

    def matches(self: Route, scope: Any) -> Any:
        tried.append(self.path)
        return real_matches(self, scope)

    monkeypatch.setattr(Route, "matches", matches)
    with RemoteLedger(served.url, served.token) as client:
        _admit(client, served.ledger, 2)
        client.get_task("t-1")
        client.list_tasks()
    assert tried == []
    with TestClient(served.app.front.asgi) as http:
        auth = {"Authorization": f"Bearer {served.token}"}
        answer = http.get("/v1/no-such-thing", headers=auth)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
        assert http.get("/healthz").status_code == 200
    assert tried  # what the table does not route goes through Starlette's router


def _starlette_choice(app: LedgerApp, method: str, path: str) -> str | None:
    for route in app.app.routes:
        assert isinstance(route, Route)
        if route.path_regex.match(path) and method in (route.methods or ()):
            return route.path
    return None


@pytest.mark.parametrize(
    "path",
    [
        "/v1/runs/abandon-expired",  # a GET here is getRun's, as Starlette picks it
        "/v1/tasks/",
        "/v1/tasks//runs",
        "/v1//tasks",
        "/v1/tasks/t-1/runs/",
        "/openapi.json",
        "/v1/lanes/show",
        "/v1/lanes/x",
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_the_route_table_picks_what_starlette_picks(served: Served, method: str, path: str) -> None:
    found = served.app.routes.find(method, path)
    assert (found[1].path if found else None) == _starlette_choice(served.app, method, path)


def test_every_route_is_found_with_its_parameters(served: Served) -> None:
    for endpoint in ENDPOINTS:
        path = endpoint.path.replace("{task_id}", "t-7").replace("{run_id}", "r-9")
        found = served.app.routes.find(endpoint.method, path)
        assert found is not None and found[1].path == endpoint.path
        assert found[1].path == _starlette_choice(served.app, endpoint.method, path)
        assert set(found[2].values()) <= {"t-7", "r-9"}


def test_a_static_path_shadowed_by_an_earlier_pattern_is_refused() -> None:
    async def handle(_request: StarletteRequest) -> Response:
        raise AssertionError

    routes = [
        (Route("/v1/runs/{run_id}", handle, methods=["GET"]), handle),
        (Route("/v1/runs/latest", handle, methods=["GET"]), handle),
    ]
    for route, _ in routes:
        route.methods = {"GET"}
    with pytest.raises(ValueError, match="shadowed"):
        RouteTable(routes)


def test_the_access_line_is_built_only_when_written(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the access logger off, no request's line is serialized; with it on and two
    handlers, each line is serialized once."""
    built: list[int] = []
    real_to_dict = Request.to_dict

    def counting(self: Request) -> dict[str, Any]:
        built.append(1)
        return real_to_dict(self)

    monkeypatch.setattr(Request, "to_dict", counting)
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    client = TestClient(served.app.front.asgi)
    auth = {"Authorization": f"Bearer {served.token}"}
    try:
        logger.setLevel(logging.WARNING)
        for _ in range(5):
            client.get("/v1/capabilities", headers=auth)
        assert built == []
        first, second = _Lines(), _Lines()
        logger.addHandler(first)
        logger.addHandler(second)
        logger.setLevel(logging.INFO)
        for _ in range(5):
            client.get("/v1/capabilities", headers=auth)
        assert len(built) == 5
        assert first.lines == second.lines and len(first.lines) == 5
        assert '"route": "/v1/capabilities"' in first.lines[0]
    finally:
        logger.handlers = [h for h in logger.handlers if not isinstance(h, _Lines)]
        logger.setLevel(level)


def test_a_latency_series_is_looked_up_once(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[tuple[str, ...]] = []
    real_labels = Histogram.labels

    def counting(self: Histogram, *values: str) -> Histogram:
        looked_up.append(values)
        return real_labels(self, *values)

    monkeypatch.setattr(Histogram, "labels", counting)
    client = TestClient(served.app.front.asgi)
    auth = {"Authorization": f"Bearer {served.token}"}
    for _ in range(10):
        client.get("/v1/capabilities", headers=auth)
    for _ in range(3):
        client.get("/v1/capabilities")
    assert looked_up == [("GET", "/v1/capabilities", "200"), ("GET", "/v1/capabilities", "401")]
    text = client.get("/metrics", headers=auth).text
    assert 'route="/v1/capabilities",status="200"} 10.0' in text


def test_one_hop_to_a_worker_thread_per_ledger_request(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that calls the ledger hops to a worker thread once (and back); one that
    does not (the OpenAPI document, a refusal before the ledger, /healthz) never. Through
    the listener and through ASGI alike."""
    hops: list[str] = []
    real_submit = WorkerThreads.submit

    def counting(self: WorkerThreads, loop: Any, done: Any, function: Any, *args: Any) -> Any:
        hops.append(getattr(function, "__name__", "?"))
        return real_submit(self, loop, done, function, *args)

    monkeypatch.setattr(WorkerThreads, "submit", counting)
    with RemoteLedger(served.url, served.token) as client:
        _admit(client, served.ledger, 3)
    assert hops == ["call_ledger"] * 6
    http = TestClient(served.app.front.asgi)
    http.get("/openapi.json")
    http.get("/v1/tasks")  # no token: refused before the ledger
    http.get("/healthz")
    assert len(hops) == 6
    http.get("/v1/tasks", headers={"Authorization": f"Bearer {served.token}"})
    assert hops == ["call_ledger"] * 7
    statuses = [_get(served.url, path) for path in ("/openapi.json", "/v1/tasks", "/healthz")]
    assert statuses == [200, 401, 200] and len(hops) == 7


def _get(url: str, path: str) -> int:
    """The status of a GET of `path` through the listener at `url`, without a token."""
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    conn = http.client.HTTPConnection(host or "", port, timeout=30)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def test_an_api_request_through_the_listener_makes_no_task_and_no_starlette_objects(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the listener an API request is served from the parser's callbacks
    (`_api_cycle`): no asyncio task, no Starlette request or response, no future per
    request. What is not the API's (/healthz) still runs as an ASGI task."""
    import asyncio.base_events

    made: list[str] = []
    loop_class = asyncio.base_events.BaseEventLoop
    real_task, real_future = loop_class.create_task, WorkerThreads.run
    real_request, real_response = StarletteRequest.__init__, Response.__init__

    def task(self: Any, coro: Any, **kwargs: Any) -> Any:
        # uvicorn's own ticks make tasks and futures too (a sleep every 0.1 s): only a
        # request's ASGI task and a future awaited for a ledger call are counted.
        if "run_asgi" in getattr(coro, "__qualname__", ""):
            made.append("task")
        return real_task(self, coro, **kwargs)

    def future(self: WorkerThreads, function: Any, *args: Any) -> Any:
        made.append("future")
        return real_future(self, function, *args)

    def request(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append("request")
        real_request(self, *args, **kwargs)

    def response(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append("response")
        real_response(self, *args, **kwargs)

    monkeypatch.setattr(loop_class, "create_task", task)
    monkeypatch.setattr(WorkerThreads, "run", future)
    monkeypatch.setattr(StarletteRequest, "__init__", request)
    monkeypatch.setattr(Response, "__init__", response)
    with RemoteLedger(served.url, served.token) as client:
        _admit(client, served.ledger, 3)
        client.list_tasks()
        client.get_task("t-1")
    assert made == []
    assert _get(served.url, "/openapi.json") == 200
    assert _get(served.url, "/v1/tasks") == 401
    assert made == []
    assert _get(served.url, "/healthz") == 200
    assert "task" in made


def test_an_answer_leaves_the_server_in_one_write(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn writes an answer's head and body apart; the server joins them, so the client
    is woken once per answer (asyncio's socket transport counts the writes)."""
    import asyncio.selector_events

    transport = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    writes: list[int] = []
    real_write = transport.write

    def counting(self: Any, data: bytes) -> None:
        writes.append(len(data))
        real_write(self, data)

    monkeypatch.setattr(transport, "write", counting)
    with RemoteLedger(served.url, served.token) as client:
        _admit(client, served.ledger, 3)
        assert client.list_tasks()
    assert len(writes) == 7 and min(writes) > 200  # each a head and its body


def _read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """`count` whole answers (head and Content-Length body) read from `sock`, in order."""
    data = b""
    answers: list[bytes] = []
    for _ in range(1000):  # bounded: each round reads at least one byte or ends
        while b"\r\n\r\n" in data and len(answers) < count:
            head, _, rest = data.partition(b"\r\n\r\n")
            if head.startswith(b"HTTP/1.1 100 "):
                answers.append(head)
                data = rest
                continue
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                break
            answers.append(head + b"\r\n\r\n" + rest[:length])
            data = rest[length:]
        if len(answers) == count:
            return answers
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return answers


def test_the_api_cycle_keeps_pipelining_expect_continue_and_http_1_0(served: Served) -> None:
    """What uvicorn's cycle did for a connection, the API's own cycle does too: two requests
    sent at once are answered in order; `Expect: 100-continue` is answered 100 before the
    body is sent; an HTTP/1.0 request is answered and its connection closed."""
    parts = urllib.parse.urlsplit(served.url)
    address = (parts.hostname or "", parts.port)
    auth = f"Authorization: Bearer {served.token}\r\n".encode()
    body = b'{"title": "piped"}'
    post = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    get = b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(post + get)
        created, listed = _read_answers(sock, 2)
    assert created.startswith(b"HTTP/1.1 201 ") and listed.startswith(b"HTTP/1.1 200 ")
    assert b'"piped"' in listed

    with socket.create_connection(address, timeout=30) as sock:
        head, _, _ = post.partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n")
        (interim,) = _read_answers(sock, 1)
        assert interim.startswith(b"HTTP/1.1 100 ")
        sock.sendall(body)
        (answer,) = _read_answers(sock, 1)
        assert answer.startswith(b"HTTP/1.1 201 ")

    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(get.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        (answer,) = _read_answers(sock, 1)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" in answer.lower()
        assert sock.recv(1) == b""  # closed after the answer
    assert len(served.ledger.list_tasks()) == 2
