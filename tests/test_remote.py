"""`execkit.remote.RemoteLedger`: the `Ledger` interface over a real server on loopback.

Errors come back typed, the wire shapes back as the ledger's own values, capabilities are
checked before a limit is relied on, a dropped connection is retried with the same key,
and the dispatcher runs unchanged over it. The broad tests run twice: over the default
transport to the server's socket, and over an in-memory transport that hands each request
to the same application (`AppTransport`, test_remote_wire.py has more of those).
"""

from __future__ import annotations

import os
import pwd
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from _support import BeatingRunner
from test_bulk_projection import _every_kind

import execkit.remote as remote_module
from execkit._backoff import Backoff
from execkit._budget import Attempt, AttemptStatus, DispatchCap
from execkit._classify import FailureClass
from execkit._errors import (
    AttemptLimitReached,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    StorageError,
    TaskBackingOff,
    TaskBlocked,
    TaskFinished,
    Unauthenticated,
)
from execkit._http1 import Answer, Connection
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InMemoryBoard,
    RunOutcome,
)
from execkit.ledger import Actor, Ledger, SqliteLedger, Task, open_ledger
from execkit.remote import HttpAnswer, HttpRequest, HTTPTransport, RemoteLedger, error_from_wire
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token

ME = pwd.getpwuid(os.geteuid()).pw_name
TRANSPORTS = ["socket", "memory"]


class AppTransport:
    """The in-memory transport: each request handed to the API as it is served
    (`LedgerApp.api`, through Starlette's TestClient), no socket in between."""

    def __init__(self, app: LedgerApp) -> None:
        from starlette.testclient import TestClient

        self.client = TestClient(app.api)
        self.sent: list[HttpRequest] = []

    def send(self, request: HttpRequest) -> HttpAnswer:
        self.sent.append(request)
        answer = self.client.request(
            request.method, request.target, headers=dict(request.headers), content=request.body
        )
        return HttpAnswer(answer.status_code, dict(answer.headers), answer.content)


@attrs.define
class Remote:
    ledger: SqliteLedger  # the server's own ledger, for looking under the API
    app: LedgerApp
    url: str
    token: str

    def client(self, transport: str = "socket", **options: Any) -> RemoteLedger:
        if transport == "memory":
            options["transport"] = AppTransport(self.app)
        return RemoteLedger(self.url, self.token, **options)


@pytest.fixture
def remote(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Remote]:
    without: frozenset[str] = getattr(request, "param", frozenset())
    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, ME, ["agent.operate", "ledger.admin"])
    app = LedgerApp(ledger, TokenFile(tokens), without=without)
    with ServerThread(app) as running:
        yield Remote(ledger, app, running.url, token)
    app.close()
    ledger.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_it_is_a_ledger_and_answers_with_the_ledgers_own_values(
    remote: Remote, transport: str
) -> None:
    client: Ledger = remote.client(transport)
    task = client.create_task("write it", max_attempts=3, actor=ME)
    assert task == remote.ledger.get_task("t-1", now=task.created_at)
    run = client.start_run("t-1", request_key="k", actor=ME, lease_s=60)
    assert run == remote.ledger.run("r-1")
    finished = client.finish_run(
        run.id, AttemptStatus.FAILED, failure_class=FailureClass.UPSTREAM, reason="http 503"
    )
    assert finished.failure_class is FailureClass.UPSTREAM
    assert client.runs("t-1") == remote.ledger.runs("t-1")
    assert client.history("t-1") == remote.ledger.history("t-1")
    assert client.audit_events("t-1") == remote.ledger.audit_events("t-1")
    grant = client.grant_role("op", "agent.operate", actor=ME)
    assert client.grants() == remote.ledger.grants() == [grant]
    assert client.revoke_role("op", "agent.operate", actor=ME) is True
    assert client.ledger_id() == remote.ledger.ledger_id()
    assert client.schema_version() == remote.ledger.schema_version()
    assert client.capabilities() == remote.ledger.capabilities()
    assert client.validate() == []
    assert client.location() == remote.url
    listed = client.list_tasks()
    assert [t.id for t in listed] == ["t-1"]
    client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_refusals_come_back_as_the_same_typed_errors(remote: Remote, transport: str) -> None:
    client = remote.client(transport)
    with pytest.raises(NotFound, match="no task 't-9'"):
        client.get_task("t-9")
    client.create_task("t", max_attempts=1, actor=ME, idempotency_key="key")
    with pytest.raises(Conflict):
        client.create_task("other", actor=ME, idempotency_key="key")
    run = client.start_run("t-1", request_key="a", actor=ME)
    with pytest.raises(TaskBlocked, match="still running"):
        client.start_run("t-1", request_key="b", actor=ME)
    client.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM)
    with pytest.raises(AttemptLimitReached):
        client.start_run("t-1", request_key="c", actor=ME, ignore_backoff=True)
    client.create_task("u", actor=ME)
    client.finish_run(
        client.start_run("t-2", request_key="d", actor=ME).id,
        "failed",
        failure_class=FailureClass.UPSTREAM,
    )
    with pytest.raises(TaskBackingOff) as backing_off:
        client.start_run("t-2", request_key="e", actor=ME)
    assert backing_off.value.ready_at > time.time()
    client.cancel_task("t-2", actor=ME)
    with pytest.raises(TaskFinished):
        client.start_run("t-2", request_key="f", actor=ME)
    with pytest.raises(InvalidInput, match="failure_class must be one of"):
        client.finish_run("r-2", "failed", failure_class="cosmic")  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated, match="unknown token") as refused:
        RemoteLedger(remote.url, "wrong-token").list_tasks()
    assert isinstance(refused.value, Forbidden)  # `except Forbidden` catches it too
    assert (refused.value.code, refused.value.exit_code) == ("unauthenticated", 15)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_invalid_input_through_the_server_names_its_field_as_the_local_one(
    remote: Remote, transport: str
) -> None:
    client = remote.client(transport)
    task = remote.ledger.create_task("t", actor=ME)
    run = remote.ledger.start_run(task.id, request_key="a", actor=ME)
    refusals: tuple[Callable[[Any], object], ...] = (
        lambda ledger: ledger.finish_run(run.id, "failed", failure_class="cosmic"),
        lambda ledger: ledger.set_attempt_limit(task.id, 10**6, expected_max_attempts=0, actor=ME),
        lambda ledger: ledger.create_task("u", max_attempts=-1, actor=ME),
    )
    for refuse in refusals:
        with pytest.raises(InvalidInput) as local:
            refuse(remote.ledger)
        with pytest.raises(InvalidInput) as far:
            refuse(client)
        assert local.value.field is not None
        assert (type(far.value), far.value.message, far.value.field) == (
            type(local.value),
            local.value.message,
            local.value.field,
        )


def test_error_codes_map_to_their_types() -> None:
    invalid = error_from_wire(400, {"error": {"code": "invalid", "message": "m", "field": "f"}})
    assert type(invalid) is InvalidInput and invalid.field == "f"
    unnamed = error_from_wire(400, {"error": {"code": "invalid", "message": "m", "field": 7}})
    assert isinstance(unnamed, InvalidInput) and unnamed.field is None
    assert type(error_from_wire(404, {"error": {"code": "not_found", "message": "m"}})) is NotFound
    backoff = error_from_wire(409, {"error": {"code": "backoff", "message": "m", "ready_at": 5}})
    assert isinstance(backoff, TaskBackingOff) and backoff.ready_at == 5.0
    assert isinstance(error_from_wire(502, "<html>"), StorageError)


@pytest.mark.parametrize("remote", [frozenset({"tasks.attempt_limits"})], indirect=True)
def test_a_server_without_attempt_limits_is_refused_before_anything_is_sent(
    remote: Remote,
) -> None:
    client = remote.client()
    with pytest.raises(StorageError, match=r"does not advertise tasks\.attempt_limits"):
        client.create_task("limited", max_attempts=3, actor=ME)
    assert remote.ledger.list_tasks() == []
    task = client.create_task("unlimited", actor=ME)  # nothing to enforce: it goes ahead
    with pytest.raises(StorageError, match=r"tasks\.attempt_limits"):
        client.set_attempt_limit(task.id, 5, expected_max_attempts=0, actor=ME)
    assert remote.ledger.get_task(task.id).max_attempts == 0


def test_who_acts_is_the_token_and_on_behalf_of_is_sent(remote: Remote) -> None:
    client = remote.client(on_behalf_of="the build bot")
    assert (
        client.create_task("a", actor="someone else").created_by
        == f"{ME} on behalf of the build bot"
    )
    named = client.create_task("b", actor=Actor("x", on_behalf_of="Jürgen"))
    assert named.created_by == f"{ME} on behalf of Jürgen"
    plain = remote.client()
    assert plain.create_task("c", actor="mallory").created_by == ME


def test_a_dropped_connection_is_retried_with_the_same_key(
    remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_request = Connection.request
    sent_keys: list[str] = []
    dropped: list[bool] = []

    def flaky(
        self: Connection,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        limit: int,
    ) -> tuple[Answer, bool]:
        if "Idempotency-Key" in headers:
            sent_keys.append(headers["Idempotency-Key"])
        answer = real_request(self, method, target, headers, body, limit)
        if not dropped:  # the server acted, and its answer is lost on the way back
            dropped.append(True)
            self.close()
            raise ConnectionResetError("dropped before the answer")
        return answer

    monkeypatch.setattr(Connection, "request", flaky)
    task = remote.client().create_task("once", actor=ME)
    assert len(sent_keys) == 2 and sent_keys[0] == sent_keys[1]
    assert [t.id for t in remote.ledger.list_tasks()] == [task.id]


def test_an_unreachable_server_is_a_storage_error() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = RemoteLedger(f"http://127.0.0.1:{port}", "t", retries=1, timeout_s=2)
    with pytest.raises(StorageError, match="cannot reach the execkit server"):
        client.list_tasks()


@pytest.mark.parametrize(
    ("url", "token"),
    [
        ("ftp://host", "t"),
        ("http://user:pw@host", "t"),
        ("http://host?x=1", "t"),
        ("http://host", ""),
        ("http://host", "a\nb"),
    ],
)
def test_bad_urls_and_tokens_are_refused(url: str, token: str) -> None:
    with pytest.raises(InvalidInput):
        RemoteLedger(url, token)


def test_the_token_never_shows(remote: Remote) -> None:
    client = remote.client()
    assert remote.token not in repr(client)
    with pytest.raises(NotFound) as missing:
        client.run("r-404")
    assert remote.token not in str(missing.value)


def test_the_servers_backoff_is_the_one_in_force(remote: Remote) -> None:
    client = remote.client()
    assert client.backoff == remote.ledger.backoff
    client.backoff = Backoff()  # the same one: fine
    with pytest.raises(InvalidInput, match="decides the backoff"):
        client.backoff = Backoff(base_s=1.0, max_s=2.0)
    assert client.budget == remote.ledger.budget


def test_calls_from_many_threads_share_one_client(remote: Remote) -> None:
    client = remote.client()
    for n in range(8):
        client.create_task(f"t{n}", actor=ME)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for _ in range(10):
                client.get_task(f"t-{n + 1}")
                client.list_tasks()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    client.close()


def test_the_dispatcher_runs_unchanged_over_a_remote_ledger(remote: Remote) -> None:
    board = InMemoryBoard(
        [
            BoardIssue("A", "passes", "todo", prompt="p"),
            BoardIssue("B", "fails", "todo", prompt="p"),
        ]
    )
    runner = BeatingRunner(
        {"A": RunOutcome("succeeded"), "B": RunOutcome("failed", FailureClass.WORK, "wrong")}
    )
    client = remote.client()
    dispatcher = Dispatcher(board, runner, client, DispatchConfig(), time.time, lease_s=0.3)
    events = dispatcher.tick()
    assert {e.issue_id for e in events} == {"A", "B"}
    assert board.get("A").state == "done"
    tasks = {t.title: t for t in remote.ledger.list_tasks()}
    assert tasks["board:A"].status == "done"
    run_b = remote.ledger.runs(tasks["board:B"].id)
    assert [(r.status, r.failure_class) for r in run_b] == [("failed", FailureClass.WORK)]
    # The lease was renewed, through the server, each time the runner's slot beat.
    events_b = remote.ledger.audit_events(tasks["board:B"].id)
    assert all(e.action != "run.abandon" for e in events_b)
    assert runner.beats_done == {"A": 3, "B": 3}
    renewed = run_b[0].lease_expires_at
    assert renewed is not None and renewed > run_b[0].started_at + 0.3
    # A second pass: B backs off, A is done; nothing is dispatched again.
    assert all(e.kind != "dispatched" for e in dispatcher.tick())


# -- the status listing -----------------------------------------------------------------


def _board_of_every_kind(ledger: SqliteLedger) -> None:
    """Dispatched tasks (titled `board:`) of every kind a status row shows, against the
    real clock: never run, running, done, failed for good, and backing off from an upstream
    failure just now; `_every_kind`'s (test_bulk_projection.py) besides, and tasks no
    dispatcher made."""
    _every_kind(ledger, prefix="board:")
    ledger.create_task("by hand", actor=ME)
    now = time.time()
    backing = ledger.create_task("board:backing off now", actor=ME, now=now).id
    run = ledger.start_run(backing, request_key="now", actor=ME, now=now)
    ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, now=now + 1.0)
    ledger.create_task("board:never run", actor=ME)
    ledger.create_task("by hand too", actor=ME)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("title_prefix", [None, "board:", "by hand"])
def test_the_status_listing_through_the_server_is_the_local_one(
    remote: Remote, transport: str, title_prefix: str | None
) -> None:
    _board_of_every_kind(remote.ledger)
    client = remote.client(transport)
    cap = DispatchCap(max_attempts=2)
    listed = list(client.iter_tasks_with_last(cap=cap, title_prefix=title_prefix))
    local = list(
        remote.ledger.iter_tasks_with_last(now=time.time(), cap=cap, title_prefix=title_prefix)
    )
    assert listed == local
    # The pages the server answers, read by hand: the ledger's own pages.
    paged: list[tuple[Task, Attempt | None]] = []
    while page := client.list_tasks_with_last(
        cap=cap, title_prefix=title_prefix, limit=4, after=paged[-1][0].id if paged else None
    ):
        paged += page
    assert paged == local
    states = {task.state for task, _ in listed}
    if title_prefix == "board:":
        assert {"ready", "running", "backoff", "blocked", "done", "cancelled"} <= states
        assert any(last is None for _, last in listed)
        assert any(last is not None and last.failure_class for _, last in listed)
    client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_status_listing_is_a_request_a_page_never_one_a_task(
    remote: Remote, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 dispatched tasks, pages of 20 (the client's `LIST_PAGE` shrunk): three requests
    (20, 20, 10), where reading each task again with its history made two a task more."""
    for n in range(50):
        task = remote.ledger.create_task(f"board:I-{n}", actor=ME)
        if n % 2:
            run = remote.ledger.start_run(task.id, request_key=f"k{n}", actor=ME)
            remote.ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM)
    monkeypatch.setattr(remote_module, "LIST_PAGE", 20)
    sent: list[HttpRequest] = []
    real = HTTPTransport.send

    def counted(self: HTTPTransport, request: HttpRequest) -> HttpAnswer:
        sent.append(request)
        return real(self, request)

    monkeypatch.setattr(HTTPTransport, "send", counted)
    client = remote.client(transport)
    if isinstance(client._transport, AppTransport):
        sent = client._transport.sent
    listed = list(client.iter_tasks_with_last(title_prefix="board:"))
    assert len(listed) == 50
    assert [request.target.split("?")[0] for request in sent] == ["/v1/tasks-with-last"] * 3
    client.close()


class _OlderServer(AppTransport):
    """The application as a server from before `/v1/tasks-with-last`: that path is 404."""

    def send(self, request: HttpRequest) -> HttpAnswer:
        if request.target.startswith("/v1/tasks-with-last"):
            self.sent.append(request)
            body = b'{"error": {"code": "not_found", "message": "no such path"}}'
            return HttpAnswer(404, {"content-type": "application/json"}, body)
        return super().send(request)


def test_a_server_without_the_listing_route_is_read_task_by_task(remote: Remote) -> None:
    _board_of_every_kind(remote.ledger)
    older = _OlderServer(remote.app)
    client = RemoteLedger(remote.url, remote.token, transport=older)
    cap = DispatchCap(max_attempts=2)
    listed = list(client.iter_tasks_with_last(cap=cap, title_prefix="board:"))
    local = list(
        remote.ledger.iter_tasks_with_last(now=time.time(), cap=cap, title_prefix="board:")
    )
    assert listed == local
    tried = [request.target.split("?")[0] for request in older.sent]
    assert tried[0] == "/v1/tasks-with-last" and tried.count("/v1/tasks-with-last") == 1
    assert len(tried) == 2 + 2 * len(local)  # the page tried, the task list, two reads a task
    # A later page that is 404 is the ledger's NotFound (its `after` vanished), not an old
    # server: raised, not read again another way.
    with pytest.raises(NotFound):
        client.list_tasks_with_last(after="t-999")
