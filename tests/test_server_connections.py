"""`execkit serve`'s connections on a real listener (`execkit/server/_protocol.py`): the
connection limit with /healthz and /readyz answered past it, idle and slow connections
closed (a head's time is counted in total, so a trickle gets no longer), and every answer
the server makes before an application sees a request in the API's error shape.

Checked by counts and states, never by timing: each wait is for a state (a connection
closed, a count reached) with a generous bound that only a broken server reaches, and the
timeouts configured are short only so that the waits are.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import select
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from execkit._errors import InvalidInput
from execkit.ledger import SqliteLedger, open_ledger
from execkit.server import ConnectionLimits, LedgerApp, ServerThread, TokenFile, add_token
from execkit.server._access_log import ACCESS_LOGGER
from execkit.server._protocol import UNPARSED

ME = pwd.getpwuid(os.geteuid()).pw_name
WAIT_S = 60.0  # the bound on any wait for a state: only a broken server reaches it


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, str]:
        assert self.headers["content-type"] == "application/json", self
        doc = json.loads(self.body)
        assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}, doc
        error: dict[str, str] = doc["error"]
        return error


def _parse(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(lines[0].split()[1]), headers, body)


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _connect(url: str) -> socket.socket:
    sock = socket.create_connection(_address(url), timeout=WAIT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _exchange_raw(url: str, raw: bytes) -> bytes:
    """`raw` sent on a connection of its own; what came back until the server closed."""
    with _connect(url) as sock:
        with contextlib.suppress(OSError):  # closed on us mid-request: the answer is there
            sock.sendall(raw)
        return _read_to_end(sock)


def _exchange(url: str, raw: bytes) -> Answer:
    return _parse(_exchange_raw(url, raw))


def _get(url: str, path: str, token: str | None = None, method: str = "GET") -> Answer:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    return _exchange(url, head.encode())


def _wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"not reached within {WAIT_S:g} s: {what}"
        time.sleep(0.01)


@attrs.frozen
class Served:
    url: str
    token: str
    running: ServerThread


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[LedgerApp, str]]:
    ledger = open_ledger(tmp_path / "ledger.db")
    token = add_token(tmp_path / "tokens.json", ME, ["agent.operate"])
    made = LedgerApp(ledger, TokenFile(tmp_path / "tokens.json"))
    yield made, token
    made.close()
    ledger.close()


@contextlib.contextmanager
def _serving(app: tuple[LedgerApp, str], limits: ConnectionLimits) -> Iterator[Served]:
    made, token = app
    with ServerThread(made, limits=limits) as running:
        yield Served(running.url, token, running)


# -- the connection limit -------------------------------------------------------------------


def test_past_the_connection_limit_health_checks_answer_and_the_rest_is_a_json_503(
    app: tuple[LedgerApp, str],
) -> None:
    """16 places, held by 24 connections that send nothing and 8 that sent part of a head
    (timeouts long enough not to end any of them here): /healthz and /readyz (GET and
    HEAD) still answer 200 on new connections; any other request on a new connection is
    503 `storage` in the error shape with Retry-After, and its connection closed; a
    connection that had its place before keeps being served."""
    limits = ConnectionLimits(max_connections=16, idle_timeout_s=600, head_timeout_s=600)
    with _serving(app, limits) as served, contextlib.ExitStack() as stack:
        first = stack.enter_context(_connect(served.url))
        ask = f"GET /v1/capabilities HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.token}"
        first.sendall(ask.encode() + b"\r\n\r\n")
        assert first.recv(65536).startswith(b"HTTP/1.1 200")
        idle = [stack.enter_context(_connect(served.url)) for _ in range(24)]
        slow = [stack.enter_context(_connect(served.url)) for _ in range(8)]
        for sock in slow:
            sock.sendall(b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n")
        _wait_for("33 connections held", lambda: served.running.connections >= 33)

        for path in ("/healthz", "/readyz"):
            answer = _get(served.url, path)
            assert answer.status == 200 and answer.headers["content-type"] == "application/json"
            assert json.loads(answer.body)["status"] in ("ok", "ready")
            head = _get(served.url, path, method="HEAD")
            assert (head.status, head.body) == (200, b"")
        for path in ("/v1/capabilities", "/dashboard/api/snapshot", "/metrics", "/nowhere"):
            refused = _get(served.url, path, served.token)
            assert refused.status == 503, (path, refused)
            assert refused.error()["code"] == "storage"
            assert "limit of 16 connections" in refused.error()["message"]
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["connection"] == "close"
        head = _get(served.url, "/v1/capabilities", served.token, method="HEAD")
        assert (head.status, head.body) == (503, b"")

        first.sendall(ask.encode() + b"\r\n\r\n")  # the first connection kept its place
        assert first.recv(65536).startswith(b"HTTP/1.1 200")
        assert served.running.connections >= 33  # nothing was closed to make room
        for sock in idle + slow:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):  # still open, nothing sent to it
                sock.recv(1)


def test_a_place_freed_is_taken_by_the_next_request(app: tuple[LedgerApp, str]) -> None:
    """A connection past the limit is served once places are free again (an idle one
    closed): the limit counts connections held, not connections ever made."""
    limits = ConnectionLimits(max_connections=4, idle_timeout_s=600, head_timeout_s=600)
    with _serving(app, limits) as served:
        held = [_connect(served.url) for _ in range(4)]
        _wait_for("4 connections held", lambda: served.running.connections >= 4)
        assert _get(served.url, "/v1/capabilities", served.token).status == 503
        for sock in held:
            sock.close()
        _wait_for("the places freed", lambda: served.running.connections == 0)
        assert _get(served.url, "/v1/capabilities", served.token).status == 200


# -- idle and slow connections --------------------------------------------------------------


def test_idle_connections_and_slow_heads_are_closed_however_the_bytes_trickle(
    app: tuple[LedgerApp, str],
) -> None:
    """With 3 s to wait for a request and 1 s for a head: 20 connections that send nothing
    are closed without an answer; 8 that send a header line every 50 ms (each line within
    the head's time of the last, up to 600 of them: 30 s) are answered 408 in the error
    shape and closed after a few lines, since a head's time is counted in total, not from
    its last byte; a trickle of empty lines (which a parser skips before a request) is
    closed the same way. Then the server holds nothing and answers as before. (Each
    trickle's first bytes go out as it connects: the idle time is for none at all.)"""
    limits = ConnectionLimits(max_connections=64, idle_timeout_s=3, head_timeout_s=1)
    lines = 600
    with _serving(app, limits) as served:
        slow, blank = [], []
        for _ in range(8):
            slow.append(_connect(served.url))
            slow[-1].sendall(b"GET /v1/tasks HTTP/1.1\r\n")
        for _ in range(2):
            blank.append(_connect(served.url))
            blank[-1].sendall(b"\r\n")
        idle = [_connect(served.url) for _ in range(20)]
        sent = {sock: 0 for sock in slow + blank}
        answers = {sock: b"" for sock in slow + blank}
        open_ = set(sent)
        for _ in range(lines):
            if not open_:
                break
            readable, _, _ = select.select(list(open_), [], [], 0.05)
            for sock in readable:
                answers[sock] += _read_to_end(sock)
                open_.discard(sock)
            for sock in open_:
                line = b"\r\n" if sock in blank else b"X-Line-%d: a\r\n" % sent[sock]
                try:
                    sock.sendall(line)
                    sent[sock] += 1
                except OSError:
                    answers[sock] += _read_to_end(sock)
        assert not open_, "a trickling connection outlasted 600 lines"
        for sock in slow + blank:
            answer = _parse(answers[sock])
            assert answer.status == 408, answer
            assert answer.error()["code"] == "invalid"
            assert "did not arrive whole within 1 s" in answer.error()["message"]
            assert answer.headers["connection"] == "close"
            assert sent[sock] < lines
        for sock in idle:
            assert _read_to_end(sock) == b""  # closed, and nothing said
        _wait_for("every connection closed", lambda: served.running.connections == 0)
        assert _get(served.url, "/healthz").status == 200
        for sock in idle + slow + blank:
            sock.close()


def test_a_keep_alive_connection_is_closed_once_idle_after_its_answers(
    app: tuple[LedgerApp, str],
) -> None:
    """Three requests sent at once on one connection are all answered, then the idle
    connection is closed without another byte."""
    limits = ConnectionLimits(idle_timeout_s=0.5)
    with _serving(app, limits) as served, _connect(served.url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        answers = _read_to_end(sock)
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert answers.endswith(b'{"status": "ok"}\n')


def test_an_answered_body_that_never_ends_is_closed(tmp_path: Path) -> None:
    """A request refused at its head (401) while its declared body never comes: the rest
    of the body is read and dropped within the request's time, then the connection is
    closed (it was left open for as long as the client trickled)."""
    ledger = SqliteLedger(tmp_path / "ledger.db")
    add_token(tmp_path / "tokens.json", ME)
    made = LedgerApp(ledger, TokenFile(tmp_path / "tokens.json"), request_timeout_s=0.5)
    with ServerThread(made) as running, _connect(running.url) as sock:
        sock.sendall(
            b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        answer = _parse(_read_to_end(sock))
        assert answer.status == 401 and answer.error()["code"] == "unauthenticated"
        with sock, _connect(running.url) as dashboard:  # the same through Starlette
            dashboard.sendall(
                b"POST /dashboard/api/session HTTP/1.1\r\nHost: x\r\nOrigin: http://x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
            late = _parse(_read_to_end(dashboard))
            assert late.status == 408 and late.error()["code"] == "invalid"
    made.close()
    ledger.close()


# -- answers made before an application sees a request ------------------------------------

MALFORMED = {
    "a 20 KiB header": (
        b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20 * 1024 + b"\r\n\r\n",
        431,
    ),
    "a 20 KiB URL": (b"GET /v1/tasks?" + b"a" * 20 * 1024 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    "300 headers": (
        b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-H%d: v\r\n" % n for n in range(300))
        + b"\r\n",
        431,
    ),
    "NUL in a header": (b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),
    "a garbage request line": (b"\x16\x03\x01 garbage\r\n\r\n", 400),
    "Content-Length: -1": (
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        400,
    ),
    "two Content-Lengths": (
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        400,
    ),
    "a bad chunk": (
        b"POST /v1/tasks/t-1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer TOKEN\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        400,
    ),
    "a space in the target": (b"GET /v1/ta sks HTTP/1.1\r\nHost: x\r\n\r\n", 400),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_request_is_answered_in_the_error_shape_and_closed(
    app: tuple[LedgerApp, str], name: str
) -> None:
    raw, status = MALFORMED[name]
    with _serving(app, ConnectionLimits()) as served:
        answer = _exchange(served.url, raw.replace(b"TOKEN", served.token.encode()))
    assert answer.status == status, answer
    assert answer.error()["code"] == "invalid"
    assert answer.headers["connection"] == "close"
    assert b"\x00" not in answer.body and b"garbage" not in answer.body  # never the bytes sent


def test_a_malformed_body_after_a_refusal_gets_no_second_answer(
    app: tuple[LedgerApp, str],
) -> None:
    """A request refused at its head (401) whose chunked body is then malformed: its one
    answer, then the connection closed (a second answer would read as the answer to a
    request never sent)."""
    with _serving(app, ConnectionLimits()) as served:
        raw = _exchange_raw(
            served.url,
            b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        )
    assert _parse(raw).status == 401
    assert raw.count(b"HTTP/1.1 ") == 1, raw


def test_the_connection_limits_are_checked() -> None:
    for bad in (
        {"max_connections": 0},
        {"max_connections": True},
        {"max_connections": 2.5},
        {"idle_timeout_s": 0},
        {"head_timeout_s": float("nan")},
        {"head_timeout_s": 3601},
    ):
        with pytest.raises(InvalidInput):
            ConnectionLimits(**bad)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def test_answers_made_before_a_route_are_in_the_access_log_as_unparsed(
    app: tuple[LedgerApp, str],
) -> None:
    """A malformed request, one past the connection limit and a head that timed out are
    each one access line, route `(unparsed)`, with their status and code (and nothing of
    what was sent)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    limits = ConnectionLimits(max_connections=1, idle_timeout_s=600, head_timeout_s=0.5)
    try:
        with _serving(app, limits) as served, _connect(served.url) as holding:
            _wait_for("the one place held", lambda: served.running.connections >= 1)
            with _connect(served.url) as slow:
                slow.sendall(b"GET /v1/tasks HTTP/1.1\r\n")  # a head that never ends
                assert _get(served.url, "/v1/tasks", served.token).status == 503
                assert _parse(_read_to_end(slow)).status == 408
            assert _exchange(served.url, b"\x16\x03 garbage\r\n\r\n").status == 400
            _wait_for("three lines", lambda: len(handler.lines) >= 3)
            holding.close()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    unparsed = [line for line in handler.lines if line["route"] == UNPARSED]
    assert sorted((line["method"], line["status"], line["code"]) for line in unparsed) == [
        ("GET", 408, "invalid"),
        ("GET", 503, "storage"),
        ("OTHER", 400, "invalid"),
    ]
    assert "garbage" not in json.dumps(handler.lines)


def test_serve_raises_its_open_file_limit_to_hold_its_connections(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A soft limit of 1,024 would make the kernel refuse the connections past
    `max_connections` (and /healthz with them): it is raised towards the hard limit, to
    twice the places and 256; a hard limit below the places is said in a warning."""
    import resource

    from execkit.server import _serve

    limits: list[tuple[int, int]] = [(1024, 1_000_000)]
    monkeypatch.setattr(resource, "getrlimit", lambda _which: limits[-1])
    monkeypatch.setattr(resource, "setrlimit", lambda _which, pair: limits.append(pair))
    _serve._raise_file_limit(ConnectionLimits(max_connections=1024))
    assert limits[-1] == (2 * 1024 + 256, 1_000_000)
    limits[:] = [(1024, 1500)]
    with caplog.at_level(logging.WARNING, logger="execkit.server"):
        _serve._raise_file_limit(ConnectionLimits(max_connections=4000))
    assert limits[-1] == (1500, 1500)
    assert "below --max-connections 4000" in caplog.text
