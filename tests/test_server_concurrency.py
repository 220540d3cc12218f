"""A real server on loopback under concurrent clients: admission stays exact (ADR 0033: the
limit is enforced in the transaction that starts the run) on SQLite and on PostgreSQL, and
a request whose connection dropped before its answer is replayed, not repeated.

The PostgreSQL variant uses the session cluster of tests/conftest.py (`pg_url`); it skips
where no PostgreSQL server binaries are installed (and fails under CI=true).
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execkit._classify import FailureClass
from execkit._errors import AttemptLimitReached, TaskBlocked
from execkit.ledger import Ledger, Run, open_ledger
from execkit.remote import RemoteLedger
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token

ME = pwd.getpwuid(os.geteuid()).pw_name
CLIENTS = 16
LIMIT = 25


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def server(target: str, tmp_path: Path) -> Iterator[tuple[Ledger, str, str]]:
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME, ["agent.operate"])
    ledger = open_ledger(target)
    app = LedgerApp(ledger, TokenFile(tokens))
    try:
        with ServerThread(app) as running:
            yield ledger, running.url, token
    finally:
        app.close()
        ledger.close()


def test_16_clients_racing_start_admit_exactly_the_limit(
    server: tuple[Ledger, str, str],
) -> None:
    ledger, url, token = server
    task = ledger.create_task(
        "contended", max_attempts=LIMIT, max_uncharged_attempts=1000, actor=ME
    )
    admitted: list[Run] = []
    refused_at_limit: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client(n: int) -> None:
        remote = RemoteLedger(url, token, timeout_s=60)
        try:
            barrier.wait(timeout=30)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                try:
                    run = remote.start_run(
                        task.id, request_key=f"c{n}-{uuid.uuid4()}", actor=ME, ignore_backoff=True
                    )
                except AttemptLimitReached:
                    with lock:
                        refused_at_limit.append(n)
                    return
                except TaskBlocked:  # another client's run is still running
                    continue
                with lock:
                    admitted.append(run)
                remote.finish_run(
                    run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="busy"
                )
            raise AssertionError("the race did not end in time")
        except BaseException as exc:
            with lock:
                errors.append(exc)
        finally:
            remote.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(refused_at_limit) == list(range(CLIENTS))  # every client saw the limit
    assert len(admitted) == LIMIT
    assert sorted(run.attempt for run in admitted) == list(range(1, LIMIT + 1))
    assert len({run.id for run in admitted}) == LIMIT
    stored = ledger.runs(task.id)
    assert [run.attempt for run in stored] == list(range(1, LIMIT + 1))
    assert {run.status for run in stored} == {"failed"}
    assert ledger.get_task(task.id).attempts_started == LIMIT
    assert ledger.validate() == []


def _raw_post(url: str, path: str, token: str, key: str, body: dict[str, object]) -> bytes:
    parts = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


def test_a_post_replayed_after_a_dropped_connection_creates_nothing(
    server: tuple[Ledger, str, str],
) -> None:
    ledger, url, token = server
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname in ("127.0.0.1", "::1")
    request = _raw_post(url, "/v1/tasks", token, "drop-1", {"title": "once", "max_attempts": 2})
    with socket.create_connection((parts.hostname, parts.port or 80), timeout=10) as sock:
        sock.sendall(request)
    # Dropped before reading anything; the server acts anyway (the ledger keeps the key).
    deadline = time.monotonic() + 15
    while not ledger.list_tasks() and time.monotonic() < deadline:
        time.sleep(0.02)
    (task,) = ledger.list_tasks()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        for _ in range(2):  # each repeat is the ledger's replay: the same task, nothing new
            conn.request(
                "POST",
                "/v1/tasks",
                body=json.dumps({"title": "once", "max_attempts": 2}),
                headers={
                    "Authorization": f"Bearer {token}",
                    "Idempotency-Key": "drop-1",
                    "Content-Type": "application/json",
                },
            )
            answer = conn.getresponse()
            doc = json.loads(answer.read())
            assert answer.status == 201
            assert doc["id"] == task.id and doc["created_at"] == task.created_at
    finally:
        conn.close()
    assert [t.id for t in ledger.list_tasks()] == [task.id]
    assert [e.action for e in ledger.audit_events(task.id)] == ["task.create"]


def test_a_start_replayed_after_a_dropped_connection_admits_one_run(
    server: tuple[Ledger, str, str],
) -> None:
    ledger, url, token = server
    task = ledger.create_task("t", actor=ME)
    parts = urllib.parse.urlsplit(url)
    path = f"/v1/tasks/{task.id}/runs"
    with socket.create_connection((parts.hostname, parts.port or 80), timeout=10) as sock:
        sock.sendall(_raw_post(url, path, token, "drop-2", {}))
    deadline = time.monotonic() + 15
    while not ledger.runs(task.id) and time.monotonic() < deadline:
        time.sleep(0.02)
    run = RemoteLedger(url, token).start_run(task.id, request_key="drop-2", actor=ME)
    assert [r.id for r in ledger.runs(task.id)] == [run.id]
    assert run.request_key == "drop-2"


# -- the HTTP parser ------------------------------------------------------------------------


def _raw_get(url: str, headers: bytes, *, in_pieces: int = 1) -> bytes:
    """One GET on a socket of its own, its head sent in `in_pieces` writes; the answer."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        head = b"GET /v1/capabilities HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
        step = -(-len(head) // in_pieces)
        try:
            for start in range(0, len(head), step):
                sock.sendall(head[start : start + step])
        except OSError:  # closed on us mid-head: the answer was written before the close
            pass
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and b"content-length" in answer.lower():
                break
        return answer


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_the_server_parses_with_httptools_and_bounds_the_head(
    server: tuple[Ledger, str, str],
) -> None:
    """The `server` extra installs httptools, and the server uses it with a 16 KiB bound on
    a request's head: one header of 20 KiB, a head of 20 KiB sent in a hundred writes, or
    200 header lines is answered 431 in the error shape and closed; a head of 12 KiB is
    served."""
    from execkit.server import _protocol

    assert _protocol.MAX_HEAD_BYTES == 16 * 1024
    _, url, token = server
    auth = f"Authorization: Bearer {token}\r\n".encode()
    fine = _raw_get(url, auth + b"X-Pad: " + b"a" * 12 * 1024 + b"\r\n")
    assert fine.startswith(b"HTTP/1.1 200"), fine[:200]
    for pieces in (1, 100):
        big = _raw_get(url, auth + b"X-Pad: " + b"a" * 20 * 1024 + b"\r\n", in_pieces=pieces)
        assert big.startswith(b"HTTP/1.1 431"), big[:200]
        assert b'"code": "invalid"' in big and b"connection: close" in big
        many = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"a" * 100) for n in range(200))
        assert _raw_get(url, auth + many, in_pieces=pieces).startswith(b"HTTP/1.1 431")
