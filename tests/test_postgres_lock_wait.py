"""A caller's whole wait on the PostgreSQL ledger, the pool's and every lock's, ends by its
one `lock_timeout_s` (issue #50): the store carries a deadline from the call's start
(through the transaction run again on rows read after a stale copy), waits for a pooled
connection until it, and every statement that asks for a lock is given what is left of it
as its lock timeout, counted down by the server from the transaction's start.

Tested through what the store sets, never a stopwatch: a clock that moves a fixed step at
each read (so what is left is known to the millisecond), the statements the wire sends
(each lock's timeout parameter), and the server's own arithmetic on a transaction of its
own. The wall time is measured by `benchmarks/bench_postgres.py --lock-wait`.
"""

from __future__ import annotations

import functools
import getpass
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest

import execkit.ledger._postgres.tx as pg_tx
import execkit.ledger._postgres.wire as pg_wire
from execkit._classify import FailureClass
from execkit.ledger import PostgresLedger, Run

OWNER = getpass.getuser()
LOCK_TIMEOUT_S = 30.0
STEP_S = 0.25  # what the clock moves at each read
LANE = "claude/default"


class Clock:
    """A monotonic clock that moves `STEP_S` each time it is read."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += STEP_S
        return self.now


# A statement that asks for a lock: a row lock, an advisory lock, a table lock.
_LOCKS = re.compile(r"FOR UPDATE|pg_advisory_xact_lock|LOCK TABLE")


class Sent:
    """Every statement the wire sends, with its parameters, in order."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def clear(self) -> None:
        self.statements.clear()

    def locks(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The statements that ask for a lock, each with the lock timeout it is given:
        its own `set_config`, or, for a table's lock (a statement that cannot carry one),
        the statement right before it."""
        found = []
        for n, (sql, params) in enumerate(self.statements):
            if not _LOCKS.search(sql):
                continue
            if sql.startswith("LOCK TABLE"):
                sql, params = self.statements[n - 1]
            assert "set_config('lock_timeout'" in sql, f"a lock with no timeout: {sql}"
            found.append((sql, params))
        return found

    def budgets(self) -> list[float]:
        """What each lock is given of the caller's wait (ms): its timeout's parameter."""
        given = []
        for sql, params in self.locks():
            at = sql.index("set_config('lock_timeout'")
            given.append(float(params[sql[:at].count("%s")]))
        return given


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    seen = Sent()
    execute = pg_wire.Wire.execute

    def spy(wire: Any, sql: str, params: Sequence[Any] = (), *, prepare: bool = True) -> Any:
        seen.statements.append((sql, tuple(params)))
        return execute(wire, sql, params, prepare=prepare)

    monkeypatch.setattr(pg_wire.Wire, "execute", spy)
    return seen


def _clocked(url: str, **options: Any) -> tuple[PostgresLedger, Clock]:
    ledger = PostgresLedger(url, lock_timeout_s=LOCK_TIMEOUT_S, **options)
    clock = Clock()
    ledger._postgres._clock = clock
    return ledger, clock


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresLedger]:
    ledger, _clock = _clocked(pg_url)
    with ledger:
        yield ledger


# One read of the clock takes the deadline as the call begins, one what is left of it as
# its transaction begins: the statements of a call's one transaction are given the
# timeout less one step.
LEFT_MS = (LOCK_TIMEOUT_S - STEP_S) * 1000


def _given(sent: Sent, call: Callable[[], object]) -> list[float]:
    sent.clear()
    call()
    return sent.budgets()


def test_every_lock_of_an_admission_and_a_result_is_given_what_is_left(
    pg: PostgresLedger, sent: Sent
) -> None:
    """Fresh (reads first) and on the store's copy (guards first), with lanes: the key's
    lock, the task's row, each lane's row, the lane configuration's lock, the run's row."""
    pg.set_lane_config(breaker_k=5, actor=OWNER)  # the configuration a result reads
    task = pg.create_task("t", max_attempts=5, actor="a")
    first = pg.start_run(task.id, request_key="k1", actor="a", now=1000.0, lane=LANE)
    pg.finish_run(first.id, "failed", failure_class=FailureClass.UPSTREAM, now=1001.0)
    pg._postgres._copies.drop(task.id)

    def start(key: str, at: float) -> Run:
        return pg.start_run(task.id, request_key=key, actor="a", now=at, lane=LANE)

    # Fresh: the key, the task, the lane and its host's lane (a row at a time, one
    # statement).
    assert _given(sent, lambda: start("k2", 9000.0)) == [LEFT_MS] * 3
    run = pg.runs(task.id)[-1]
    pg._postgres._copies.drop(task.id)
    # Fresh: the task, the configuration's lock, the lane's row.
    finish = functools.partial(
        pg.finish_run, run.id, "failed", failure_class=FailureClass.UPSTREAM, now=9001.0
    )
    assert _given(sent, finish) == [LEFT_MS] * 3
    # On the copy that finish left: the guards of the key, the task and the lanes.
    assert _given(sent, lambda: start("k3", 20000.0)) == [LEFT_MS] * 3
    other = pg.create_task("u", actor="a")
    plain = pg.start_run(other.id, request_key="u1", actor="a", now=1000.0)
    # On the copy the admission left (no lane): the guards of the task and the run.
    assert _given(sent, lambda: pg.finish_run(plain.id, "succeeded", now=1001.0)) == [LEFT_MS] * 2
    assert pg.validate(now=20000.0) == []


def test_every_lock_of_the_other_writes_is_given_what_is_left(
    pg: PostgresLedger, sent: Sent
) -> None:
    """Creating with a key (its lock), a limit, a heartbeat, a retry and a cancel (the
    task's row), the expired runs (their tasks' rows, then each one's), a lane's park and
    resume (its row), a configuration change (its lock, then the lane events' table), a
    repair (the expired runs' tasks, then every task's row): each lock with what is left."""
    now = 1000.0
    assert _given(sent, lambda: pg.create_task("t", idempotency_key="c", actor="a")) == [LEFT_MS]
    task = pg.create_task("u", max_attempts=2, actor=OWNER)
    limit = lambda: pg.set_attempt_limit(task.id, 3, expected_max_attempts=2, actor=OWNER)  # noqa: E731
    assert _given(sent, limit) == [LEFT_MS]
    run = pg.start_run(task.id, request_key="k", actor=OWNER, now=now, lease_s=10)
    assert _given(sent, lambda: pg.heartbeat(run.id, lease_s=10, now=now + 1)) == [LEFT_MS]
    assert _given(sent, lambda: pg.abandon_expired_runs(now=now + 100)) == [LEFT_MS] * 3
    retry = lambda: pg.retry_task(task.id, actor=OWNER, force=True)  # noqa: E731
    assert _given(sent, retry) == [LEFT_MS]
    assert _given(sent, lambda: pg.cancel_task(task.id, actor=OWNER)) == [LEFT_MS]
    park = lambda: pg.park_lane(LANE, until=now + 600, actor=OWNER, now=now)  # noqa: E731
    assert _given(sent, park) == [LEFT_MS] * 2
    assert _given(sent, lambda: pg.resume_lane(LANE, actor=OWNER, now=now + 1)) == [LEFT_MS]
    assert _given(sent, lambda: pg.set_lane_config(breaker_k=4, actor=OWNER)) == [LEFT_MS] * 2
    assert _given(sent, lambda: pg.repair(now=now + 200)) == [LEFT_MS] * 2


def test_the_transaction_run_again_after_a_stale_copy_waits_only_what_is_left(
    pg_url: str, sent: Sent
) -> None:
    """The copy an admission decided on was changed by another store: the admission runs
    again on rows read, within the same deadline (one step later, one step less), not a
    new one."""
    here, _clock = _clocked(pg_url)
    with here, PostgresLedger(pg_url) as there:
        task = here.create_task("t", max_attempts=5, actor="a")
        first = here.start_run(task.id, request_key="k1", actor="a", now=1000.0)
        here.finish_run(first.id, "failed", failure_class=FailureClass.UPSTREAM, now=1001.0)
        there.set_attempt_limit(task.id, 6, expected_max_attempts=5, actor=OWNER)  # stale now
        given = _given(sent, lambda: here.start_run(task.id, request_key="k2", actor="a"))
    # The copy's two guards (the key's lock, the task's), then the reads of the run again:
    # the key, the task.
    assert given == [LEFT_MS] * 2 + [LEFT_MS - STEP_S * 1000] * 2


def test_the_time_waited_for_the_pool_is_taken_from_what_each_lock_is_given(
    pg_url: str, sent: Sent
) -> None:
    """The pool's one connection is lent: the caller waits for it (the clock read once
    more, and the connection given back then), and its locks are given what is left after
    that wait, one step less."""
    ledger, clock = _clocked(pg_url, pool_size=1)
    task = ledger.create_task("t", max_attempts=3, actor="a")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ledger._postgres.write() as tx:
            tx.task(task.id)
            holding.set()
            assert release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(60)
        reads = 0

        def read() -> float:
            nonlocal reads
            reads += 1
            if reads == 2:  # the caller found the pool empty: it waits, and is woken
                release.set()
            return clock()

        ledger._postgres._clock = read
        given = _given(sent, lambda: ledger.start_run(task.id, request_key="k", actor="a"))
    finally:
        release.set()
        holder.join(60)
        ledger.close()
    assert given == [LEFT_MS - STEP_S * 1000] * 2  # the key's lock, the task's row


# -- the server's arithmetic ------------------------------------------------------------


def _lock_timeout_after(url: str, budget_ms: float, sleep_s: float) -> str:
    """The lock timeout `_WAIT` sets, in a transaction that has run `sleep_s` already."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_sleep(%s)", (sleep_s,))
        conn.execute(f"SELECT {pg_tx._WAIT}", (budget_ms,))
        row = conn.execute("SHOW lock_timeout").fetchone()
        assert row is not None
        return str(row[0])


def test_the_server_counts_what_is_left_down_from_the_transaction_s_start(
    pg_url: str,
) -> None:
    left = _lock_timeout_after(pg_url, 1000.0, 0.2)
    assert left.endswith("ms") and 1 <= int(left.removesuffix("ms")) <= 800
    # Spent: the least timeout there is, never 0 (which would be none at all).
    assert _lock_timeout_after(pg_url, 0.0, 0.0) == "1ms"
    assert _lock_timeout_after(pg_url, 100.0, 0.2) == "1ms"


def test_a_lock_asked_for_once_the_wait_is_spent_is_refused_at_once(pg_url: str) -> None:
    """A row another transaction holds, asked for by a transaction whose caller has no
    time left: refused (55P03) after a millisecond, not after the session's timeout (here
    a minute, which the test would not outlast)."""
    with psycopg.connect(pg_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE held (id int PRIMARY KEY)")
        setup.execute("INSERT INTO held VALUES (1)")
    with psycopg.connect(pg_url) as holder, psycopg.connect(pg_url) as waiter:
        holder.execute("SELECT id FROM held WHERE id = 1 FOR UPDATE")
        waiter.execute("SET lock_timeout = '60s'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            waiter.execute(
                f"SELECT id FROM held WHERE id = 1 AND {pg_tx._WAITS} FOR UPDATE", (0.0,)
            )
