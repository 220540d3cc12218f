"""`RemoteLedger` as the route table makes it, through injected transports (no socket).

The rows are the client's methods: each `Ledger` operation is a row of `LedgerRoutes` with
the protocol's signature; a row whose fields and method disagree is refused when it is
built. What goes on the wire is pinned byte for byte (old servers keep understanding new
clients); an answer lost after the server acted is sent again with the same key after the
injected pause; capabilities are checked before anything is sent; an answer that is not
the API is a `StorageError`.
"""

from __future__ import annotations

import inspect
import json
import os
import pwd
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from test_remote import AppTransport

from execkit._api import CAPABILITIES, ENDPOINTS, Endpoint, Field, LedgerRoutes
from execkit._budget import AttemptStatus, DispatchCap
from execkit._classify import FailureClass
from execkit._errors import NotFound, StorageError
from execkit.ledger import Actor, Ledger, SqliteLedger, Task
from execkit.remote import HttpAnswer, HttpRequest, RemoteLedger
from execkit.server import LedgerApp, TokenFile, add_token

ME = pwd.getpwuid(os.geteuid()).pw_name
URL = "http://ledger.invalid:8750/prefix"

# What no single route answers: read from the capabilities, derived, or local.
BY_HAND = {
    "capabilities",
    "schema_version",
    "ledger_id",
    "location",
    "history",
    "close",
    "iter_tasks",  # list_tasks a page at a time
    "iter_tasks_with_last",  # list_tasks_with_last a page at a time
    "task_lanes",  # task_lane a task at a time
    "announced_runs",  # runs a task at a time
}


def _protocol_methods() -> dict[str, Callable[..., Any]]:
    return {
        name: value
        for name, value in vars(Ledger).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


# -- the table is the client ------------------------------------------------------------


def test_the_client_and_the_table_need_neither_starlette_nor_uvicorn() -> None:
    """A runner that installs only the base package has RemoteLedger, and the document."""
    probe = (
        "import sys\n"
        "sys.modules['starlette'] = sys.modules['uvicorn'] = None  # importing them fails\n"
        "from execkit.remote import RemoteLedger\n"
        "from execkit.server.__main__ import main\n"
        "RemoteLedger('http://127.0.0.1:1', 'token')\n"
        "main(['--openapi'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["openapi"] == "3.1.0"


def test_every_ledger_operation_is_a_row_or_named_here() -> None:
    rows = {name for name, row in vars(LedgerRoutes).items() if isinstance(row, Endpoint)}
    assert rows | BY_HAND == set(_protocol_methods())
    assert not rows & BY_HAND
    assert {row.operation_id for row in ENDPOINTS} >= {
        row.operation_id for row in vars(LedgerRoutes).values() if isinstance(row, Endpoint)
    }


@pytest.mark.parametrize("name", sorted(_protocol_methods()))
def test_each_method_keeps_the_protocols_signature(name: str) -> None:
    client = RemoteLedger(URL, "t")
    assert inspect.signature(getattr(client, name)) == inspect.signature(
        getattr(Ledger, name).__get__(client)
    )


def test_a_row_is_a_method_with_a_name_a_docstring_and_argument_checks() -> None:
    client = RemoteLedger(URL, "t")
    assert client.start_run.__name__ == "start_run"
    assert "POST /v1/tasks/{task_id}/runs" in (client.start_run.__doc__ or "")
    assert isinstance(RemoteLedger.start_run, Endpoint)  # on the class: the row itself
    with pytest.raises(TypeError, match="request_key"):
        client.start_run("t-1", actor=ME)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        client.run("r-1", "r-2")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="surprise"):
        client.heartbeat("r-1", surprise=1)  # type: ignore[call-arg]


class _Extra(Protocol):
    def stretch(self, task_id: str, *, by: int, actor: Actor | str) -> Task: ...


def _never(_call: Any) -> tuple[int, dict[str, Any]]:
    raise AssertionError("not served here")


def test_a_row_whose_fields_and_method_disagree_is_refused() -> None:
    def row(body: tuple[Field, ...]) -> Endpoint[Any, Any]:
        return Endpoint(
            "POST",
            "/v1/tasks/{task_id}/stretch",
            "stretch",
            "Stretch",
            _never,
            "Task",
            body=body,
            binds=_Extra.stretch,
            read=lambda doc: doc,
        )

    assert row((Field("by", "integer", required=True),)).operation_id == "stretch"
    with pytest.raises(TypeError, match="must be its path, query and body fields"):
        row(())  # `by` would never be sent
    with pytest.raises(TypeError, match="must be its path, query and body fields"):
        row((Field("by", "integer"), Field("extra", "string")))  # nothing fills `extra`
    with pytest.raises((RuntimeError, TypeError)) as misnamed:  # 3.11 wraps it: RuntimeError

        class _Misnamed:
            stretched = row((Field("by", "integer", required=True),))

    assert "named after the method it binds" in str(misnamed.value.__cause__ or misnamed.value)


# -- the wire, byte for byte ---------------------------------------------------------------

TASK = {
    "id": "t-1",
    "title": "x",
    "status": "open",
    "state": "ready",
    "blocked_on": None,
    "reason": None,
    "ready": True,
    "max_attempts": 0,
    "attempts_started": 0,
    "charged_attempts": 0,
    "uncharged_streak": 0,
    "remaining": 3,
    "next_attempt_at": None,
    "created_by": ME,
    "created_at": 1,
    "max_uncharged_attempts": 3,
}
RUN = {
    "id": "r-1",
    "task_id": "t-1",
    "attempt": 1,
    "status": "failed",
    "failure_class": "upstream",
    "reason": None,
    "request_key": "k",
    "actor": ME,
    "forced": False,
    "started_at": 1,
    "ended_at": 2.5,
}
CAPS = {
    "capabilities": ["tasks.attempt_limits"],
    "schema_version": 3,
    "ledger_id": "L",
    "backoff": {"base_s": 10.0, "max_s": 300.0, "factor": 2.0, "jitter": 0.1},
    "budget": {"max_attempts": 3, "max_uncharged_attempts": 3},
}


class Canned:
    """A fake transport: records each request and answers `answer(request)` (a JSON
    document with 200, or an `HttpAnswer`), or raises what `fail` returns for it."""

    def __init__(
        self,
        answer: Callable[[HttpRequest], object],
        fail: Callable[[int], OSError | None] = lambda _n: None,
    ) -> None:
        self.answer = answer
        self.fail = fail
        self.sent: list[HttpRequest] = []

    def send(self, request: HttpRequest) -> HttpAnswer:
        self.sent.append(request)
        failure = self.fail(len(self.sent))
        if failure is not None:
            raise failure
        answer = self.answer(request)
        if isinstance(answer, HttpAnswer):
            return answer
        return HttpAnswer(200, {}, json.dumps(answer).encode())


def _canned(request: HttpRequest) -> object:
    path = request.target.split("?")[0].removeprefix("/prefix")
    if path == "/v1/capabilities":
        return CAPS
    if path.endswith("/runs") and request.method == "GET":
        return {"task_id": "t-1", "runs": [RUN]}
    if path.startswith("/v1/runs") or path.endswith("/runs"):
        return {"runs": [RUN]} if path.endswith("expired") else RUN
    if path == "/v1/tasks" and request.method == "GET":
        return {"tasks": [TASK]}
    if path.startswith("/v1/tasks"):
        return TASK
    grant = {"principal": "p", "role": "agent.operate", "granted_by": ME, "granted_at": 1.0}
    return {
        "/v1/grants": {"grants": [grant]} if request.method == "GET" else grant,
        "/v1/audit": {"events": []},
        "/v1/check/repair": {"repaired": ["r-1"]},
    }[path]


WIRE: list[tuple[Callable[[RemoteLedger], object], str, bytes | None]] = [
    (
        lambda c: c.create_task("x", actor=ME),
        "POST /prefix/v1/tasks",
        b'{"title": "x", "max_attempts": 0}',
    ),
    (
        lambda c: c.create_task("x", max_uncharged_attempts=2, idempotency_key="ik", actor=ME),
        "POST /prefix/v1/tasks",
        b'{"title": "x", "max_attempts": 0, "max_uncharged_attempts": 2, "idempotency_key": "ik"}',
    ),
    (lambda c: c.get_task("t-1"), "GET /prefix/v1/tasks/t-1", None),
    (
        lambda c: c.get_task("t 1/2", cap=DispatchCap(max_attempts=4), force=True),
        "GET /prefix/v1/tasks/t%201%2F2?cap=4&force=true",
        None,
    ),
    (lambda c: c.list_tasks(), "GET /prefix/v1/tasks", None),
    (lambda c: c.runs("t-1"), "GET /prefix/v1/tasks/t-1/runs", None),
    (
        lambda c: c.set_attempt_limit("t-1", 5, expected_max_attempts=0, actor=ME),
        "POST /prefix/v1/tasks/t-1/attempt-limit",
        b'{"max_attempts": 5, "expected_max_attempts": 0}',
    ),
    (
        lambda c: c.retry_task("t-1", actor=ME),
        "POST /prefix/v1/tasks/t-1/retry",
        b'{"reason": null, "force": false}',
    ),
    (
        lambda c: c.record_give_up("t-1", state="blocked", actor=ME),
        "POST /prefix/v1/tasks/t-1/give-up",
        b'{"state": "blocked"}',
    ),
    (lambda c: c.cancel_task("t-1", actor=ME), "POST /prefix/v1/tasks/t-1/cancel", b"{}"),
    (
        lambda c: c.start_run("t-1", request_key="k", actor=ME),
        "POST /prefix/v1/tasks/t-1/runs",
        b'{"request_key": "k", "forced": false, "ignore_backoff": false, "lease_s": 300.0, '
        b'"cap": null}',
    ),
    (
        lambda c: c.start_run(
            "t-1", request_key="k", actor=ME, forced=True, lease_s=60, cap=DispatchCap(2)
        ),
        "POST /prefix/v1/tasks/t-1/runs",
        b'{"request_key": "k", "forced": true, "ignore_backoff": false, "lease_s": 60, "cap": 2}',
    ),
    (lambda c: c.run("r-1"), "GET /prefix/v1/runs/r-1", None),
    (lambda c: c.heartbeat("r-1"), "POST /prefix/v1/runs/r-1/heartbeat", b'{"lease_s": null}'),
    (
        lambda c: c.finish_run(
            "r-1", AttemptStatus.FAILED, failure_class=FailureClass.UPSTREAM, not_before=9.5
        ),
        "POST /prefix/v1/runs/r-1/finish",
        b'{"status": "failed", "failure_class": "upstream", "reason": null, "not_before": 9.5}',
    ),
    (lambda c: c.abandon_expired_runs(), "POST /prefix/v1/runs/abandon-expired", b"{}"),
    (
        lambda c: c.grant_role("p", "agent.operate", actor=ME),
        "POST /prefix/v1/grants",
        b'{"principal": "p", "role": "agent.operate"}',
    ),
    (lambda c: c.grants("p"), "GET /prefix/v1/grants?principal=p", None),
    (lambda c: c.audit_events(), "GET /prefix/v1/audit", None),
    (lambda c: c.repair(), "POST /prefix/v1/check/repair", b"{}"),
]


@pytest.mark.parametrize(("call", "line", "body"), WIRE, ids=[line for _, line, _ in WIRE])
def test_what_goes_on_the_wire(
    call: Callable[[RemoteLedger], object], line: str, body: bytes | None
) -> None:
    transport = Canned(_canned)
    call(RemoteLedger(URL + "/", "tok", transport=transport))
    request = transport.sent[-1]
    assert (f"{request.method} {request.target}", request.body) == (line, body)
    headers = dict(request.headers)
    key = headers.pop("Idempotency-Key", None)
    assert (key is not None) == (request.method == "POST")
    expected = {"Authorization": "Bearer tok", "Accept": "application/json"}
    if body is not None:
        expected["Content-Type"] = "application/json"
    assert headers == expected


def test_on_behalf_of_is_a_header_and_now_is_never_sent() -> None:
    transport = Canned(_canned)
    client = RemoteLedger(URL, "tok", on_behalf_of="the bot", transport=transport)
    client.cancel_task("t-1", actor=Actor("x", on_behalf_of="Jürgen"), now=5.0)
    client.heartbeat("r-1", now=7.0)
    first, second = transport.sent
    assert first.headers["X-On-Behalf-Of"] == "J%C3%BCrgen"
    assert second.headers["X-On-Behalf-Of"] == "the%20bot"
    assert b"5.0" not in (first.body or b"") and b"7.0" not in (second.body or b"")


def test_the_answers_are_the_ledgers_values() -> None:
    client = RemoteLedger(URL, "tok", transport=Canned(_canned))
    run = client.run("r-1")
    assert (run.status, run.failure_class, run.started_at) == ("failed", "upstream", 1.0)
    assert type(run.started_at) is float and run.owner_host == ""
    assert client.history("t-1")[0].failure_class is FailureClass.UPSTREAM
    assert [t.id for t in client.list_tasks()] == ["t-1"]
    assert client.capabilities() == {"tasks.attempt_limits"}
    assert (client.schema_version(), client.ledger_id()) == (3, "L")


# -- sending again, and not sending -------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[LedgerApp, str]]:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME, ["agent.operate", "ledger.admin"])
    served = LedgerApp(ledger, TokenFile(tokens))
    yield served, token
    served.close()
    ledger.close()


class LosesFirstAnswer:
    """The server acts on the first request, and its answer never arrives."""

    def __init__(self, inner: AppTransport) -> None:
        self.inner = inner
        self.lost: HttpAnswer | None = None

    def send(self, request: HttpRequest) -> HttpAnswer:
        answer = self.inner.send(request)
        if self.lost is None:
            self.lost = answer
            raise ConnectionResetError("reset before the answer")
        return answer


def test_an_answer_lost_after_the_server_acted_is_asked_for_again_with_the_same_key(
    app: tuple[LedgerApp, str],
) -> None:
    served, token = app
    transport = LosesFirstAnswer(AppTransport(served))
    pauses: list[float] = []
    client = RemoteLedger("http://ledger.invalid", token, transport=transport, sleep=pauses.append)
    task = client.create_task("once", actor=ME)
    first, second = transport.inner.sent
    assert first == second and "Idempotency-Key" in first.headers
    assert pauses == [0.05]
    assert [t.id for t in served.ledger.list_tasks()] == [task.id]
    assert transport.lost is not None and json.loads(transport.lost.body)["id"] == task.id


@pytest.mark.parametrize(("retries", "pauses"), [(0, []), (2, [0.05, 0.25])])
def test_no_answer_after_the_last_try_is_a_storage_error(retries: int, pauses: list[float]) -> None:
    slept: list[float] = []
    transport = Canned(_canned, fail=lambda _n: ConnectionRefusedError("refused"))
    client = RemoteLedger(URL, "tok", transport=transport, retries=retries, sleep=slept.append)
    with pytest.raises(StorageError, match="repeating it is safe") as refused:
        client.cancel_task("t-1", actor=ME)
    assert "ConnectionRefusedError: refused" in str(refused.value)
    assert len(transport.sent) == retries + 1 and slept == pauses
    assert len({r.headers["Idempotency-Key"] for r in transport.sent}) == 1
    with pytest.raises(StorageError, match="cannot reach") as unread:
        client.list_tasks()
    assert "repeating" not in str(unread.value)  # a GET changes nothing


def test_a_capability_missing_sends_nothing_but_the_question() -> None:
    older = {**CAPS, "capabilities": ["runs.leases"]}
    transport = Canned(lambda r: older if r.target.endswith("capabilities") else _canned(r))
    client = RemoteLedger(URL, "tok", transport=transport)
    with pytest.raises(StorageError, match=r"does not advertise tasks\.attempt_limits"):
        client.create_task("limited", max_attempts=3, actor=ME)
    with pytest.raises(StorageError, match="an attempt limit"):
        client.set_attempt_limit("t-1", 3, expected_max_attempts=0, actor=ME)
    client.create_task("plain", actor=ME)  # no limit: nothing to check
    assert [f"{r.method} {r.target}" for r in transport.sent] == [
        "GET /prefix/v1/capabilities",
        "GET /prefix/v1/capabilities",
        "POST /prefix/v1/tasks",
    ]


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        (HttpAnswer(200, {}, b"<html>"), "did not answer JSON"),
        (HttpAnswer(200, {}, b'{"id": 1}'), "Run could not be read"),
        (HttpAnswer(200, {}, b"[]"), "did not answer JSON"),
        (HttpAnswer(502, {}, b"<html>bad gateway</html>"), "answered HTTP 502: <html>bad"),
        (HttpAnswer(500, {}, b'{"detail": "x"}'), "HTTP 500 without an execkit error"),
        (HttpAnswer(200, {}, b"x" * (64 * 1024 * 1024 + 1)), "more than 64 MiB"),
    ],
)
def test_an_answer_that_is_not_the_api_is_a_storage_error(answer: HttpAnswer, needle: str) -> None:
    client = RemoteLedger(URL, "tok", transport=Canned(lambda _r: answer))
    with pytest.raises(StorageError, match=needle):
        client.run("r-1")


def test_an_error_answer_is_its_type() -> None:
    doc = {"error": {"code": "not_found", "message": "no run 'r-9'"}}
    answer = HttpAnswer(404, {}, json.dumps(doc).encode())
    with pytest.raises(NotFound, match="no run 'r-9'"):
        RemoteLedger(URL, "tok", transport=Canned(lambda _r: answer)).run("r-9")


def test_the_capabilities_row_reads_the_document_as_it_is() -> None:
    client = RemoteLedger(URL, "tok", transport=Canned(_canned))
    assert client._send(CAPABILITIES, {}) == CAPS
    assert client.backoff.base_s == 10.0 and client.budget.max_attempts == 3


# -- the default transport ------------------------------------------------------------------


def test_the_default_transport_turns_a_broken_answer_into_a_retried_connection_error() -> None:
    """A peer that answers something that is not HTTP: the transport's protocol error is a
    `ConnectionError`, so the call is tried again, then refused."""
    accepted: list[int] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in range(2):
                peer, _ = listener.accept()
                accepted.append(1)
                with peer:
                    peer.recv(65536)
                    peer.sendall(b"NOT HTTP AT ALL\r\n\r\n")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        slept: list[float] = []
        client = RemoteLedger(f"http://127.0.0.1:{port}", "tok", retries=1, sleep=slept.append)
        with pytest.raises(StorageError, match=r"ConnectionError: the server's answer is not HTTP"):
            client.list_tasks()
        thread.join(timeout=30)
        client.close()
    assert (len(accepted), slept) == (2, [0.05])
