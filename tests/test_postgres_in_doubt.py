"""A write whose batch with COMMIT loses its answer is answered with what the server did
(issue #50): the result when it committed, a rollback only when the server says so, and
"may or may not have been applied" only when it cannot tell.

Each window is held open through the wire's seam (`wire._sent`: a batch has left, its sync
not yet sent): the test waits, on a connection of its own, until the server has run the
batch (or is waiting on a lock in it), terminates the backend with pg_terminate_backend (or
shuts the client's end of the socket, so that no answer at all is read), waits until it is
gone, and only then lets the client read the answers. Last, a chaos test: kills hunting
COMMITs while workers admit and finish, every error they hear checked against the ledger.
Nothing is timed: every wait is bounded by a count of polls, tries or kills.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import execkit.ledger._postgres.wire as pg_wire
from execkit._classify import FailureClass
from execkit._errors import StorageError
from execkit.ledger import PostgresLedger, Run
from execkit.remote import RemoteLedger
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token

OWNER = getpass.getuser()  # the ledger's owner: it may operate lanes and grant roles
VICTIM = "victim"

# What the test waits for on the backend, by window: the batch with COMMIT has run (COMMIT
# was its last statement, and the server waits for the sync); a batch of reads has run
# (its transaction has an id, and the server waits for the sync); a statement of the batch
# waits on a lock the test holds.
_RAN_COMMIT = "ran_commit"
_RAN_READS = "ran_reads"
_LOCKED = "locked"


class Window:
    """Ends the backend of the victim store (its connections are named `VICTIM`) in one
    window of its next batch: `arm(kind)`, then the call; the seam fires once."""

    def __init__(self, url: str) -> None:
        self._admin = psycopg.connect(url, autocommit=True)
        self._kind: str | None = None
        self.batches: list[bool] = []  # each batch the victim sent while armed: COMMIT in it?
        self.ended = 0
        self.then: Callable[[], None] | None = None  # run once the backend is gone
        self.cut = False  # shut the client's socket instead of terminating the backend

    def arm(self, kind: str) -> None:
        self._kind, self.batches = kind, []

    def close(self) -> None:
        self._admin.close()

    def _activity(self, pid: int) -> tuple[Any, ...] | None:
        return self._admin.execute(
            "SELECT application_name, state, wait_event_type, wait_event, query, backend_xid "
            "FROM pg_stat_activity WHERE pid = %s",
            (pid,),
        ).fetchone()

    def __call__(self, pid: int, sock: int, committing: bool) -> None:
        row = self._activity(pid)
        if self._kind is None or row is None or row[0] != VICTIM:
            return
        self.batches.append(committing)
        wanted = {_RAN_COMMIT: committing, _RAN_READS: not committing, _LOCKED: committing}
        if not wanted[self._kind]:
            return
        for _ in range(5000):  # the server runs the batch within a few polls
            _, state, wait_type, wait, query, xid = row
            ran = state == "active" and wait == "ClientRead"
            if (
                (self._kind == _RAN_COMMIT and ran and query == "COMMIT")
                or (self._kind == _RAN_READS and ran and xid is not None)
                or (self._kind == _LOCKED and wait_type == "Lock")
            ):
                break
            time.sleep(0.001)
            row = self._activity(pid)
            assert row is not None
        else:
            raise AssertionError(f"the batch never reached its window: {row}")
        self._kind = None
        if self.cut:
            # The client's end of the connection shut: the server's answers are lost
            # unread, and it says nothing more (the backend sees the end of the stream).
            with contextlib.closing(socket.socket(fileno=os.dup(sock))) as end:
                end.shutdown(socket.SHUT_RDWR)
        else:
            self._admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(5000):
            if self._activity(pid) is None:
                break
            time.sleep(0.001)
        else:
            raise AssertionError("the backend did not end")
        self.ended += 1
        if self.then is not None:
            self.then()


@pytest.fixture
def window(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Window]:
    held = Window(pg_url)
    monkeypatch.setattr(pg_wire, "_sent", held)
    try:
        yield held
    finally:
        held.close()


def _victim(pg_url: str) -> PostgresLedger:
    """A store whose connections the window ends (a fresh one: it holds no copies)."""
    return PostgresLedger(f"{pg_url}&application_name={VICTIM}")


@pytest.fixture
def ledgers(pg_url: str) -> Iterator[tuple[PostgresLedger, PostgresLedger]]:
    """(setup, victim): the first prepares and checks, the second is the one cut off."""
    with PostgresLedger(pg_url) as setup, _victim(pg_url) as victim:
        yield setup, victim


# -- a commit the server ran: its result ------------------------------------------------


def _start_fresh(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", max_attempts=3, actor="a")
    window.arm(_RAN_COMMIT)
    run = victim.start_run(task.id, request_key="k", actor="a", now=1000.0)
    assert window.batches == [False, True]  # the reads, then the writes with COMMIT
    assert setup.runs(task.id) == [run]
    assert setup.start_run(task.id, request_key="k", actor="a") == run  # as a replay says


def _start_on_a_copy(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", max_attempts=3, actor="a")
    first = victim.start_run(task.id, request_key="k1", actor="a", now=1000.0)
    victim.finish_run(first.id, "failed", failure_class=FailureClass.UPSTREAM, now=1001.0)
    window.arm(_RAN_COMMIT)
    run = victim.start_run(task.id, request_key="k2", actor="a", now=9000.0)
    assert window.batches == [True]  # one batch: decided on the store's copy
    assert setup.runs(task.id)[-1] == run and run.attempt == 2
    assert setup.start_run(task.id, request_key="k2", actor="a") == run


def _finish_fresh(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", max_attempts=3, actor="a")
    started = setup.start_run(task.id, request_key="k", actor="a", now=1000.0)
    window.arm(_RAN_COMMIT)
    run = victim.finish_run(started.id, "failed", failure_class=FailureClass.UPSTREAM, now=1001.0)
    assert window.batches == [False, True]
    assert run.status == "failed" and setup.run(started.id) == run


def _finish_on_a_copy(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", max_attempts=3, actor="a")
    started = victim.start_run(task.id, request_key="k", actor="a", now=1000.0)
    window.arm(_RAN_COMMIT)
    run = victim.finish_run(started.id, "succeeded", now=1001.0)
    assert window.batches == [True]
    assert run.status == "succeeded" and setup.run(started.id) == run
    assert setup.get_task(task.id).status == "done"


def _create_task(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    window.arm(_RAN_COMMIT)
    task = victim.create_task("t", idempotency_key="c", actor="a", now=1000.0)
    assert [listed.id for listed in setup.list_tasks()] == [task.id]
    assert setup.create_task("t", idempotency_key="c", actor="a", now=1000.0).id == task.id


def _set_attempt_limit(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", max_attempts=3, actor="a")
    window.arm(_RAN_COMMIT)
    changed = victim.set_attempt_limit(task.id, 7, expected_max_attempts=3, actor="a")
    assert changed.max_attempts == 7 and setup.get_task(task.id).max_attempts == 7


def _cancel_task(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", actor="a")
    window.arm(_RAN_COMMIT)
    assert victim.cancel_task(task.id, actor="a").status == "cancelled"
    assert setup.get_task(task.id).status == "cancelled"


def _retry_task(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", max_attempts=1, actor=OWNER)
    run = setup.start_run(task.id, request_key="k", actor=OWNER, now=1000.0)
    setup.finish_run(run.id, "failed", now=1001.0)
    window.arm(_RAN_COMMIT)
    retried = victim.retry_task(task.id, actor=OWNER, force=True, idempotency_key="r")
    assert retried.max_attempts == 2 and setup.get_task(task.id).max_attempts == 2


def _record_give_up(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", actor="a")
    run = setup.start_run(task.id, request_key="k", actor="a", now=1000.0)
    setup.finish_run(run.id, "failed", failure_class=FailureClass.ENVIRONMENT, now=1001.0)
    window.arm(_RAN_COMMIT)
    victim.record_give_up(task.id, state="blocked", actor="a")
    assert [e.action for e in setup.audit_events(task.id)][-1] == "task.give_up"


def _heartbeat(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", actor="a")
    started = setup.start_run(task.id, request_key="k", actor="a", now=1000.0)
    window.arm(_RAN_COMMIT)
    renewed = victim.heartbeat(started.id, lease_s=600, now=1100.0)
    assert renewed.lease_expires_at == 1700.0 == setup.run(started.id).lease_expires_at


def _abandon_run(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", actor="a")
    started = setup.start_run(task.id, request_key="k", actor="a", now=1000.0)
    window.arm(_RAN_COMMIT)
    run = victim.abandon_run(started.id, reason="its host is gone", actor="a", now=1001.0)
    assert run.status == "abandoned" and setup.run(started.id) == run


def _abandon_expired(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", actor="a")
    started = setup.start_run(task.id, request_key="k", actor="a", now=1000.0, lease_s=10)
    window.arm(_RAN_COMMIT)
    (run,) = victim.abandon_expired_runs(now=2000.0)
    assert run.status == "abandoned" and setup.run(started.id) == run


def _park_lane(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    now = time.time()
    window.arm(_RAN_COMMIT)
    parked = victim.park_lane("claude/default", until=now + 600, actor=OWNER, now=now)
    assert parked.state == "parked" == setup.get_lane("claude/default", now=now).state


def _resume_lane(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    now = time.time()
    setup.park_lane("claude/default", until=now + 600, actor=OWNER, now=now)
    window.arm(_RAN_COMMIT)
    resumed = victim.resume_lane("claude/default", actor=OWNER, now=now + 1)
    assert resumed.state == "open" == setup.get_lane("claude/default", now=now + 1).state


def _set_lane_config(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    window.arm(_RAN_COMMIT)
    config = victim.set_lane_config(breaker_k=7, actor=OWNER)
    assert config.breaker_k == 7 == setup.lane_config().breaker_k


def _grant_role(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    window.arm(_RAN_COMMIT)
    grant = victim.grant_role("bob", "agent.operate", actor=OWNER, now=1000.0)
    assert setup.grants("bob") == [grant]


def _revoke_role(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    setup.grant_role("bob", "agent.operate", actor=OWNER, now=1000.0)
    window.arm(_RAN_COMMIT)
    assert victim.revoke_role("bob", "agent.operate", actor=OWNER) is True
    assert setup.grants("bob") == []


def _repair(setup: PostgresLedger, victim: PostgresLedger, window: Window) -> None:
    task = setup.create_task("t", actor="a")
    run = setup.start_run(task.id, request_key="k", actor="a", now=1000.0)
    setup.finish_run(run.id, "failed", now=1001.0)
    with setup._postgres.write() as tx:  # a summary edited by hand
        tx._send("UPDATE tasks SET attempts_used = 5 WHERE id = %s", (task.id,))
    window.arm(_RAN_COMMIT)
    assert victim.repair(now=2000.0) == [f"{task.id}: rebuilt its summary from its history"]
    assert setup.validate(now=2000.0) == []


WRITES = [
    _start_fresh,
    _start_on_a_copy,
    _finish_fresh,
    _finish_on_a_copy,
    _create_task,
    _set_attempt_limit,
    _cancel_task,
    _retry_task,
    _record_give_up,
    _heartbeat,
    _abandon_run,
    _abandon_expired,
    _park_lane,
    _resume_lane,
    _set_lane_config,
    _grant_role,
    _revoke_role,
    _repair,
]


@pytest.mark.parametrize("write", WRITES, ids=[w.__name__.strip("_") for w in WRITES])
def test_a_commit_the_server_ran_is_answered_with_its_result(
    ledgers: tuple[PostgresLedger, PostgresLedger],
    window: Window,
    write: Callable[[PostgresLedger, PostgresLedger, Window], None],
) -> None:
    """The backend ran COMMIT and is terminated before the client reads its answer (the
    sync's answer is the backend's FATAL): the call returns what it did, as a replay or a
    read on another connection shows it."""
    setup, victim = ledgers
    write(setup, victim, window)
    assert window.ended == 1
    assert setup.validate(now=1.0) == []  # (before every lease in these histories ends)


# -- a batch of reads lost: a rollback --------------------------------------------------


@pytest.mark.parametrize("what", ["start", "finish"])
def test_a_batch_of_reads_whose_answer_is_lost_is_a_rollback_and_nothing_is_written(
    ledgers: tuple[PostgresLedger, PostgresLedger], window: Window, what: str
) -> None:
    """The backend ran the first batch (BEGIN, the reads, their locks) and is terminated
    before its answer is read: no COMMIT was sent, so the caller hears a certain rollback,
    nothing is written, and the same call again does what was asked."""
    setup, victim = ledgers
    task = setup.create_task("t", max_attempts=3, actor="a")
    started = setup.start_run(task.id, request_key="k0", actor="a", now=1000.0)
    call: Callable[[], Run]
    if what == "start":
        setup.finish_run(started.id, "failed", failure_class=FailureClass.UPSTREAM, now=1001.0)
        call = functools.partial(victim.start_run, task.id, request_key="k1", actor="a", now=9e3)
    else:
        call = functools.partial(victim.finish_run, started.id, "succeeded", now=1001.0)
    before = setup.runs(task.id)
    window.arm(_RAN_READS)
    with pytest.raises(StorageError) as lost:
        call()
    assert window.batches == [False]
    assert "rolled back and nothing was written" in lost.value.message
    assert setup.runs(task.id) == before
    done = call()
    assert setup.runs(task.id)[-1] == done
    assert setup.validate(now=1001.0) == []


# -- a batch with COMMIT lost before COMMIT ran -----------------------------------------


@contextlib.contextmanager
def _audit_locked(url: str, window: Window) -> Iterator[None]:
    """The audit table locked against writes (every write transaction appends to it),
    released once the window has ended the backend that waited for it."""
    with psycopg.connect(url) as holder:
        holder.execute("LOCK TABLE audit IN SHARE MODE")
        window.then = holder.commit
        try:
            yield
        finally:
            window.then = None


def _unreachable(ledger: PostgresLedger) -> Callable[[], None]:
    """Makes every new connection of `ledger`'s store fail (the server is not there for
    it any more): what `Window.then` calls to leave the outcome untold."""

    def cut() -> None:
        ledger._postgres._url = "postgresql://postgres@/execkit?host=/nonexistent&port=5432"

    return cut


@pytest.mark.parametrize("copy", [False, True], ids=["fresh", "on_a_copy"])
def test_a_batch_with_commit_lost_before_commit_ran_is_what_the_server_says(
    pg_url: str, ledgers: tuple[PostgresLedger, PostgresLedger], window: Window, copy: bool
) -> None:
    """The batch with COMMIT waits on a lock and its backend is terminated: COMMIT never
    ran. Asked on a new connection, the server says the transaction was rolled back: the
    caller hears so (a fresh store), or, decided on a copy (no id to ask about), the
    admission is decided again on rows read and admits."""
    setup, victim = ledgers
    task = setup.create_task("t", max_attempts=3, actor="a")
    if copy:
        first = victim.start_run(task.id, request_key="k0", actor="a", now=1000.0)
        victim.finish_run(first.id, "failed", failure_class=FailureClass.UPSTREAM, now=1001.0)
    before = setup.runs(task.id)
    window.arm(_LOCKED)
    with _audit_locked(pg_url, window):
        if copy:
            run = victim.start_run(task.id, request_key="k1", actor="a", now=9000.0)
            assert setup.runs(task.id) == [*before, run]
        else:
            with pytest.raises(StorageError) as lost:
                victim.start_run(task.id, request_key="k1", actor="a", now=9000.0)
            assert "rolled back and nothing was written" in lost.value.message
            assert setup.runs(task.id) == before
    assert window.ended == 1
    assert setup.validate(now=1.0) == []


def _admit_twice(setup: PostgresLedger, victim: PostgresLedger, copy: bool) -> str:
    """A task with one finished run (on the victim's copy when `copy`): the next admission
    is decided on the copy (one batch), else on rows read (two)."""
    task = setup.create_task("t", max_attempts=3, actor="a")
    admits = victim if copy else setup
    first = admits.start_run(task.id, request_key="k0", actor="a", now=1.0)
    admits.finish_run(first.id, "failed", failure_class=FailureClass.UPSTREAM, now=2.0)
    return task.id


@pytest.mark.parametrize("copy", [False, True], ids=["fresh", "on_a_copy"])
def test_a_commit_whose_answers_are_all_lost_is_asked_of_the_server(
    ledgers: tuple[PostgresLedger, PostgresLedger], window: Window, copy: bool
) -> None:
    """The server ran COMMIT and the client's end of the connection is shut before any
    answer is read: asked on a new connection (its transaction's id, or, decided on a copy,
    the admission decided again on rows read, which replays its key), the server says it
    committed, and the caller gets the run."""
    setup, victim = ledgers
    task_id = _admit_twice(setup, victim, copy)
    window.arm(_RAN_COMMIT)
    window.cut = True
    run = victim.start_run(task_id, request_key="k1", actor="a", now=9000.0)
    assert window.ended == 1
    assert window.batches == ([True] if copy else [False, True])
    assert setup.runs(task_id)[-1] == run and run.attempt == 2


@pytest.mark.parametrize("copy", [False, True], ids=["fresh", "on_a_copy"])
def test_an_outcome_the_server_cannot_be_asked_is_said_to_be_unknown(
    ledgers: tuple[PostgresLedger, PostgresLedger], window: Window, copy: bool
) -> None:
    """The answers are lost and the server cannot be reached to ask: the caller hears that
    the admission may or may not have been applied, never that nothing was written, and
    replaying its key later returns the run it did admit."""
    setup, victim = ledgers
    task_id = _admit_twice(setup, victim, copy)
    window.arm(_RAN_COMMIT)
    window.cut = True
    window.then = _unreachable(victim)
    with pytest.raises(StorageError) as unknown:
        victim.start_run(task_id, request_key="k1", actor="a", now=9000.0)
    message = unknown.value.message
    assert "may or may not have been applied" in message
    assert "nothing was written" not in message
    replayed = setup.start_run(task_id, request_key="k1", actor="a", now=9000.0)
    assert setup.runs(task_id)[-1] == replayed and replayed.attempt == 2


# -- through the server -----------------------------------------------------------------


@pytest.fixture
def served(
    pg_url: str, tmp_path: Any
) -> Iterator[tuple[PostgresLedger, PostgresLedger, RemoteLedger]]:
    """(setup, victim, a client of `execkit serve` over the victim)."""
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, OWNER, ["agent.operate", "ledger.admin"])
    with PostgresLedger(pg_url) as setup, _victim(pg_url) as victim:
        app = LedgerApp(victim, TokenFile(tokens))
        try:
            with ServerThread(app) as running:
                remote = RemoteLedger(running.url, token, timeout_s=60)
                try:
                    yield setup, victim, remote
                finally:
                    remote.close()
        finally:
            app.close()


def test_through_the_server_a_commit_that_ran_is_answered_with_the_run(
    served: tuple[PostgresLedger, PostgresLedger, RemoteLedger], window: Window
) -> None:
    """`execkit serve` answers 200 with the run where it answered `503 storage` saying it
    was rolled back; and a finish the same."""
    setup, _victim_ledger, remote = served
    task = setup.create_task("t", max_attempts=3, actor=OWNER)
    window.arm(_RAN_COMMIT)
    run = remote.start_run(task.id, request_key="k", actor=OWNER)
    assert window.ended == 1
    assert setup.runs(task.id) == [run]
    window.arm(_RAN_COMMIT)
    finished = remote.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM)
    assert window.ended == 2
    assert finished.status == "failed" and setup.run(run.id) == finished


def test_through_the_server_an_untold_outcome_is_a_503_that_says_so(
    served: tuple[PostgresLedger, PostgresLedger, RemoteLedger], window: Window
) -> None:
    setup, victim, remote = served
    task = setup.create_task("t", max_attempts=3, actor=OWNER)
    window.arm(_RAN_COMMIT)
    window.cut = True
    window.then = _unreachable(victim)
    with pytest.raises(StorageError) as unknown:
        remote.start_run(task.id, request_key="k", actor=OWNER)
    assert "may or may not have been applied" in unknown.value.message
    assert "nothing was written" not in unknown.value.message
    assert [run.request_key for run in setup.runs(task.id)] == ["k"]  # it was


# -- chaos: kills hunting COMMITs ---------------------------------------------------------

_WORKERS = 3
_CYCLES = 30  # admissions and finishes per worker
_KILLS = 12  # backends the hunter ends, at most
_TRIES = 30  # a call's tries, at most (a kill costs one)


def test_kills_hunting_commits_never_report_a_saved_change_as_rolled_back(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers admit and finish runs, each on a task of its own, while a hunter terminates
    their backends, mostly between a COMMIT the server ran and the answer the worker reads
    (some batches hold that window open a little so it can be found), sometimes anywhere a
    batch is running. Every error a worker hears is checked at once against the ledger:
    nobody is told "rolled back" or "nothing was written" for a change that was saved.
    Each call is then repeated as a runner would (same key, same values) until it is
    answered; the ledger ends with every answered run, nothing else, and checks clean.
    Bounded by counts: cycles, kills, tries."""
    rng = random.Random(50)
    app = f"{pg_url}&application_name=chaos"
    admin = psycopg.connect(pg_url, autocommit=True)
    offered: dict[int, threading.Event] = {}  # backends holding a COMMIT window open
    lock = threading.Lock()
    done = threading.Event()
    kills: list[str] = []
    lies: list[str] = []
    answered: list[tuple[str, str]] = []  # (request key, run id)

    def hold(pid: int, sock: int, committing: bool) -> None:
        if not committing or threading.current_thread().name == "hunter":
            return
        with lock:
            if rng.random() >= 0.2:
                return
            ended = offered[pid] = threading.Event()
        ended.wait(0.05)  # bounded: the hunter ends it, or the batch goes on
        with lock:
            offered.pop(pid, None)

    monkeypatch.setattr(pg_wire, "_sent", hold)

    def hunt() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for poll in range(20000):
                if done.is_set() or len(kills) >= _KILLS:
                    return
                rows = conn.execute(
                    "SELECT pid, query FROM pg_stat_activity WHERE application_name = 'chaos' "
                    "AND state = 'active' AND wait_event = 'ClientRead'"
                ).fetchall()
                for pid, query in rows:
                    if query == "COMMIT" or poll % 97 == 0:  # mostly COMMITs
                        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        kills.append(query)
                        with lock:
                            ended = offered.get(pid)
                        if ended is not None:
                            ended.set()
                        break
                time.sleep(0.0005)

    def checked(call: Callable[[], Any], saved: Callable[[], bool]) -> Any:
        """`call()`, repeated until it is answered; each StorageError checked against
        what the ledger holds at once (no one else writes this task)."""
        for _ in range(_TRIES):
            try:
                return call()
            except StorageError as exc:
                said = exc.message
                if ("rolled back" in said or "nothing was written" in said) and saved():
                    lies.append(said)
        raise AssertionError("a call was never answered")

    def stored(sql: str, value: str) -> Any:
        with lock:  # one admin connection, shared
            row = admin.execute(sql, (value,)).fetchone()
        return None if row is None else row[0]

    def admitted(key: str) -> Callable[[], bool]:
        return lambda: stored("SELECT id FROM runs WHERE request_key = %s", key) is not None

    def finished(run_id: str) -> Callable[[], bool]:
        return lambda: stored("SELECT status FROM runs WHERE id = %s", run_id) != "running"

    def work(n: int, ledger: PostgresLedger) -> None:
        with ledger:
            title = f"t{n}"
            task = checked(
                lambda: ledger.create_task(
                    title, max_attempts=10000, idempotency_key=title, actor="a"
                ),
                lambda: stored("SELECT id FROM tasks WHERE title = %s", title) is not None,
            )
            for cycle in range(_CYCLES):
                key = f"w{n}-{cycle}"
                start = functools.partial(
                    ledger.start_run, task.id, request_key=key, actor="a", ignore_backoff=True
                )
                run = checked(start, admitted(key))
                finish = functools.partial(ledger.finish_run, run.id, "failed", reason="chaos")
                checked(finish, finished(run.id))
                with lock:
                    answered.append((key, run.id))

    ledgers = [PostgresLedger(app, pool_size=1) for _ in range(_WORKERS)]  # opened unhunted
    hunter = threading.Thread(target=hunt, name="hunter")
    workers = [
        threading.Thread(target=work, args=(n, ledger), name=f"w{n}")
        for n, ledger in enumerate(ledgers)
    ]
    hunter.start()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    done.set()
    hunter.join(60)
    admin.close()
    assert lies == []
    assert len(answered) == _WORKERS * _CYCLES  # every call was answered in the end
    assert kills, "the hunter never found a backend to end"
    with PostgresLedger(pg_url) as ledger:
        runs = [run for task in ledger.list_tasks() for run in ledger.runs(task.id)]
        assert sorted((r.request_key, r.id) for r in runs) == sorted(answered)
        assert all(r.status == "failed" for r in runs)
        assert ledger.validate() == []
