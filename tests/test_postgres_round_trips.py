"""Round trips to the PostgreSQL server per admission (issue #33 goal 1), counted on the wire.

libpq's own protocol trace (`PQtrace`) records every message between client and server. The
client waits for the server only after a message that asks for answers: `Sync` (the end of
a statement, or of a pipeline's batch, answered by `ReadyForQuery`), `Query` (the simple
protocol, the same) or `Flush` (a pipeline read). A round trip is such a request sent while
no earlier one is still unanswered (a `Flush` that psycopg adds behind a `Sync` it is
already waiting for is the same wait). No timing is involved.
"""

from __future__ import annotations

import functools
import getpass
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _support import protocol_trace

from execkit._classify import FailureClass
from execkit._errors import StorageError, TaskBackingOff
from execkit._usage import Usage, UsdSource
from execkit.ledger import PostgresLedger, Run, SpendCap, SpendWindow, open_ledger

_PAID = Usage(input_tokens=100, usd=0.01, usd_source=UsdSource.REPORTED)


def _trace(ledger: PostgresLedger, call: Callable[[], Any]) -> list[tuple[str, str]]:
    """(F or B, message kind) for every protocol message during `call`, in order."""
    # The connection the next transaction takes: the pool lends its last idle one first,
    # and a test's one thread leaves exactly one idle (opening the ledger used it).
    return protocol_trace(ledger._postgres._idle[-1], call)


def round_trips(ledger: PostgresLedger, call: Callable[[], Any]) -> int:
    return _round_trips_in(_trace(ledger, call))


def _round_trips_in(trace: list[tuple[str, str]]) -> int:
    trips = 0
    unanswered_syncs = 0  # Sync/Query sent, their ReadyForQuery not yet received
    flushing = False  # a Flush sent, nothing received since
    for side, kind in trace:
        if side == "B":
            flushing = False
            if kind == "ReadyForQuery":
                unanswered_syncs -= 1
        elif kind in ("Sync", "Query", "Flush"):
            if unanswered_syncs == 0 and not flushing:
                trips += 1
            if kind == "Flush":
                flushing = True
            else:
                unanswered_syncs += 1
    return trips


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresLedger]:
    ledger = open_ledger(pg_url)
    assert isinstance(ledger, PostgresLedger)
    with ledger:
        yield ledger


def test_start_and_finish_take_two_round_trips_each(pg: PostgresLedger, pg_url: str) -> None:
    task = pg.create_task("t", max_attempts=10, actor="a")
    other = pg.create_task("other", max_attempts=10, actor="a")
    runs: list[Run] = []

    def start(key: str, at: float, lane: str | None = None) -> None:
        runs.append(pg.start_run(task.id, request_key=key, actor="a", now=at, lane=lane))

    assert round_trips(pg, lambda: start("k1", 1000.0)) == 2
    # Another store finished it: this store's copy of the task is no copy of the row.
    with open_ledger(pg_url) as elsewhere:
        elsewhere.finish_run(runs[-1].id, "failed", now=1001.0)
    # A replay of the same key, and a refusal (the failure backs the task off): two each.
    assert round_trips(pg, lambda: start("k1", 1002.0)) == 2
    assert runs[-1] == pg.run(runs[0].id)  # the run the key admitted, as it is now
    refusals: list[BaseException] = []

    def refused_start() -> None:
        try:
            start("k2", 1002.0)
        except TaskBackingOff as exc:
            refusals.append(exc)

    assert round_trips(pg, refused_start) == 2
    assert len(refusals) == 1
    # A task whose last transaction was this store's: one round trip each (`copies.py`).
    first = pg.start_run(other.id, request_key="o1", actor="a", now=1000.0)
    assert round_trips(pg, lambda: pg.finish_run(first.id, "failed", now=1001.0)) == 1
    assert round_trips(pg, lambda: pg.start_run(other.id, request_key="o2", actor="a")) == 1
    # On a lane (no row yet: open), on a history.
    assert round_trips(pg, lambda: start("k3", 9000.0, lane="claude/default")) == 2
    # The lane's first event creates its row and reads the configuration: two more round
    # trips, once per lane.
    assert round_trips(pg, lambda: pg.finish_run(runs[-1].id, "succeeded", now=9001.0)) == 4
    assert [(r.attempt, r.status) for r in pg.runs(task.id)] == [(1, "failed"), (2, "succeeded")]
    assert [(r.attempt, r.status) for r in pg.runs(other.id)] == [(1, "failed"), (2, "running")]
    assert pg.get_lane("claude/default").state == "open"
    assert pg.validate() == []


def test_a_result_on_a_lane_takes_two_round_trips(pg: PostgresLedger) -> None:
    """A run bound to a lane feeds it an event: the lane's row and configuration are read
    with the run's, so the finish stays at two whatever it does to the lane."""
    pg.set_lane_config(breaker_k=2, actor=getpass.getuser())  # the owner operates
    lane = "codex/default"
    first = pg.create_task("first", actor="a")
    run = pg.start_run(first.id, request_key="f", actor="a", now=1000.0, lane=lane)
    pg.finish_run(run.id, "succeeded", now=1001.0)  # the lane's row exists from here on
    for n, at in enumerate((2000.0, 2010.0)):  # two upstream failures trip a breaker of 2
        task = pg.create_task(f"t{n}", actor="a")
        run = pg.start_run(task.id, request_key=f"k{n}", actor="a", now=at, lane=lane)
        finish = functools.partial(
            pg.finish_run, run.id, "failed", failure_class=FailureClass.UPSTREAM, now=at + 1
        )
        assert round_trips(pg, finish) == 2
    assert pg.get_lane(lane, now=2012.0).state != "open"  # the configuration read ahead held
    assert [e.kind for e in pg.lane_history(lane)] == ["success", "upstream", "upstream"]
    assert pg.validate() == []


def test_a_finish_and_an_abandonment_after_a_lost_lease_stay_in_two(pg: PostgresLedger) -> None:
    task = pg.create_task("t", max_attempts=10, actor="a")
    first = pg.start_run(task.id, request_key="k1", actor="a", now=1000.0, lease_s=10)
    # The lease expired: the next admission abandons the run first, in its own transaction.
    second: list[Run] = []
    trips = round_trips(
        pg,
        lambda: second.append(
            pg.start_run(task.id, request_key="k2", actor="a", now=5000.0, ignore_backoff=True)
        ),
    )
    assert trips <= 3  # the abandonment is a write: the backoff's decision reads after it
    assert pg.run(first.id).status == "abandoned"
    # Finished on the copy the admission left: one.
    assert round_trips(pg, lambda: pg.finish_run(second[0].id, "succeeded", now=5001.0)) == 1
    assert pg.validate() == []


def _terminate(pg_url: str, application: str) -> None:
    """Terminate the backend serving `application` and wait (bounded) until it is gone."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        (pid,) = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application,)
        ).fetchone() or (None,)
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(1000):  # bounded: the backend is gone within a few polls
            left = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            if left.fetchone() == (0,):
                return


def test_a_connection_dropped_unseen_is_replaced_and_the_reads_sent_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch (BEGIN, reads, locks) meets a connection the server closed: it is
    sent again, once, on a new one; nothing is doubled."""
    import execkit.ledger._postgres.store as pg_store

    url = f"{pg_url}&application_name=unseen"
    ledger = open_ledger(url)
    assert isinstance(ledger, PostgresLedger)
    with ledger:
        task = ledger.create_task("t", max_attempts=3, actor="a")
        first = ledger.start_run(task.id, request_key="k1", actor="a", now=1000.0)
        # Not noticed before sending (as when the server's farewell is still on its way).
        monkeypatch.setattr(pg_store, "_unasked", lambda conn: False)
        _terminate(pg_url, "unseen")
        finished = ledger.finish_run(first.id, "failed", now=1001.0)
        assert finished.status == "failed"
        second = ledger.start_run(task.id, request_key="k2", actor="a", now=9000.0)
        assert [(r.id, r.attempt) for r in ledger.runs(task.id)] == [
            (first.id, 1),
            (second.id, 2),
        ]
        assert len(ledger.audit_events(task.id)) == 4  # create, start, finish, start


def test_a_connection_lost_in_the_commit_batch_is_resolved_by_the_server(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend dies after the writes, before the batch with COMMIT, unseen: the outcome
    is asked of the server (the transaction's status), and a rollback is said as one."""
    import execkit.ledger._postgres.store as pg_store
    import execkit.ledger._postgres.tx as pg_tx

    url = f"{pg_url}&application_name=lost"
    ledger = open_ledger(url)
    assert isinstance(ledger, PostgresLedger)
    with ledger:
        task = ledger.create_task("t", max_attempts=3, actor="a")
        inserted: list[bool] = []

        def unasked(conn: Any) -> bool:
            # Asked before the COMMIT batch: the backend dies now, and it is not seen.
            if inserted:
                _terminate(pg_url, "lost")
                inserted.clear()
            return False

        monkeypatch.setattr(pg_store, "_unasked", unasked)
        monkeypatch.setattr(pg_tx, "_after_admission_insert", lambda: inserted.append(True))
        with pytest.raises(StorageError) as failure:
            ledger.start_run(task.id, request_key="k", actor="a", now=1000.0)
        assert "rolled back and nothing was written" in failure.value.message
        monkeypatch.setattr(pg_tx, "_after_admission_insert", None)
        assert ledger.runs(task.id) == []
        run = ledger.start_run(task.id, request_key="k", actor="a", now=1000.0)
        assert run.attempt == 1


def statements(ledger: PostgresLedger, call: Callable[[], Any]) -> tuple[int, int]:
    """(statements sent, statements parsed) during `call`: a statement of the extended
    protocol is one `Bind` (a simple `Query` counts as one too); a `Parse` prepares one."""
    return _statements_in(_trace(ledger, call))


def _statements_in(trace: list[tuple[str, str]]) -> tuple[int, int]:
    sent = parsed = 0
    for side, kind in trace:
        if side == "F" and kind in ("Bind", "Query"):
            sent += 1
        elif side == "F" and kind == "Parse":
            parsed += 1
    return sent, parsed


def test_an_admission_sends_twelve_statements_all_prepared(pg: PostgresLedger) -> None:
    """The first start, on rows read: BEGIN, the key's lock, the key, the task's lock, the
    number with the running run, the four writes as one, the task read back, COMMIT. Then
    each on the copy the last one left: start: BEGIN, the key's lock, the task's guard,
    the four writes as one, the read back, COMMIT; finish: BEGIN, the task's guard, the
    run's guard, the three writes as one, the read back, COMMIT. Once each has run on the
    connection, none is parsed again; each after the first is one round trip."""
    task = pg.create_task("t", max_attempts=100, actor="a")
    counts: list[tuple[int, int]] = []
    trips: list[int] = []
    runs: list[Run] = []

    def start(n: int) -> None:
        runs.append(pg.start_run(task.id, request_key=f"k{n}", actor="a", now=1000.0 + n * 3600))

    def finish(n: int) -> None:
        pg.finish_run(runs[-1].id, "failed", now=1001.0 + n * 3600)

    for n in range(8):
        counts.append(statements(pg, functools.partial(start, n)))
        counts.append(statements(pg, functools.partial(finish, n)))
    for n in range(8, 10):
        trips.append(round_trips(pg, functools.partial(start, n)))
        trips.append(round_trips(pg, functools.partial(finish, n)))
    assert [sent for sent, _ in counts] == [8] + [6] * 15
    assert trips == [1, 1, 1, 1]
    assert [parsed for _, parsed in counts[-4:]] == [0, 0, 0, 0]
    assert [(r.attempt, r.status) for r in pg.runs(task.id)] == [
        (n + 1, "failed") for n in range(10)
    ]


def test_writes_to_one_table_in_one_transaction_each_take_effect(pg: PostgresLedger) -> None:
    """A success updates its task twice (the summary, then the status): never folded into
    one statement, where one of the two changes would be lost. An abandonment and an
    admission in one transaction both write the run table and the audit: in their order."""
    task = pg.create_task("t", max_attempts=10, actor="a")
    run = pg.start_run(task.id, request_key="k1", actor="a", now=1000.0)
    assert statements(pg, lambda: pg.finish_run(run.id, "succeeded", now=1001.0))[0] == 7
    assert (pg.get_task(task.id).status, pg.get_task(task.id).attempts_started) == ("done", 1)
    with pg._postgres.read() as tx:
        record = tx.task(task.id)
    assert record is not None
    assert record.summary.last is not None
    assert (record.summary.last.status, record.summary.running) == ("succeeded", None)
    other = pg.create_task("u", max_attempts=10, actor="a")
    first = pg.start_run(other.id, request_key="k2", actor="a", now=1000.0, lease_s=10)
    second = pg.start_run(other.id, request_key="k3", actor="a", now=5000.0, ignore_backoff=True)
    assert [(r.id, r.status) for r in pg.runs(other.id)] == [
        (first.id, "abandoned"),
        (second.id, "running"),
    ]
    actions = [e.action for e in pg.audit_events(other.id)]
    assert actions == ["task.create", "run.start", "run.abandon", "run.start"], actions


def test_a_connection_numbered_past_select_s_limit_is_kept_and_works(pg_url: str) -> None:
    """A process holding more than 1024 files (a server, a dispatcher with many agents):
    its sockets are numbered past what select(2) can watch. Admissions work and keep their
    one connection (a check that failed would open a new one per transaction)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:  # bounded: each dup takes the next number
            held.append(os.dup(0 if not held else held[0]))
        ledger = open_ledger(pg_url)
        assert isinstance(ledger, PostgresLedger)
        with ledger:
            conn = ledger._postgres._idle[-1]
            assert conn.fileno() > 1024
            backend = conn.info.backend_pid
            task = ledger.create_task("t", max_attempts=10, actor="a")
            for n in range(3):
                run = ledger.start_run(task.id, request_key=f"k{n}", actor="a", now=n * 9000.0)
                ledger.finish_run(run.id, "failed", now=n * 9000.0 + 1)
            assert ledger._postgres._idle == [conn]
            assert conn.info.backend_pid == backend
            assert [r.attempt for r in ledger.runs(task.id)] == [1, 2, 3]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_capped_admission_takes_two_round_trips_too(pg: PostgresLedger) -> None:
    # Issue #45: the spend lock and the spend reads go with the admission's first reads once
    # the store has seen the caps; an admission on caps it has not seen (the first, or the
    # first after they change) reads them in one more round trip.
    me = getpass.getuser()
    pg.set_spend_cap(SpendCap(SpendWindow.DAY, usd=100.0), floor_usd=0.0, actor=me)
    pg.set_spend_cap(SpendCap(SpendWindow.ROLLING_5H, lane="codex/default", tokens=10**9), actor=me)
    tasks = [pg.create_task(f"t{n}", max_attempts=5, actor=me).id for n in range(5)]
    runs: list[Run] = []

    def start(n: int, lane: str | None, at: float) -> None:
        runs.append(pg.start_run(tasks[n], request_key=f"k{n}", actor=me, now=at, lane=lane))

    assert round_trips(pg, lambda: start(0, "codex/default", 1000.0)) == 3  # the caps not seen yet
    pg.finish_run(runs[-1].id, "succeeded", now=1001.0, usage=_PAID)
    # A minute on (the lanes' estimates read again, in the same batch):
    assert round_trips(pg, lambda: start(1, "codex/default", 1100.0)) == 2
    assert round_trips(pg, lambda: start(2, None, 1101.0)) == 2  # the day's cap alone
    # What the windows hold is what the reads read: $0.01 spent, and two reservations of
    # the lane's $0.01 (all lanes' for the run with none).
    assert pg.spend_windows(now=1102.0)[0].usd == pytest.approx(0.03)
    pg.set_spend_cap(SpendCap(SpendWindow.DAY, usd=50.0), actor=me)
    assert round_trips(pg, lambda: start(3, "codex/default", 1103.0)) == 3
    assert round_trips(pg, lambda: start(4, "codex/default", 1104.0)) == 2  # estimate kept

    # What caps add to an admission on a lane (ten statements: BEGIN, the key's lock, the
    # key, the task, the lane's gates, the number, the writes as two, the read back,
    # COMMIT) is the windows' read: the spend lock is taken by the number's statement.
    def start_on(n: int, at: float) -> None:
        task = pg.create_task(f"t{n}", max_attempts=5, actor=me).id
        pg.finish_run(runs[-1].id, "succeeded", now=at - 1, usage=_PAID)
        trace = _trace(pg, lambda: runs.append(
            pg.start_run(task, request_key=f"k{n}", actor=me, now=at, lane="codex/default")
        ))  # fmt: skip
        trips.append(_round_trips_in(trace))
        sent.append(_statements_in(trace)[0])

    trips: list[int] = []
    sent: list[int] = []
    start_on(5, 1106.0)
    # A subscription lane's USD is left out of the day's: its share of the day is read in
    # the same statement as the windows, not in statements (and round trips) of its own.
    pg.set_subscription_lane("claude/default", True, actor=me)
    start_on(6, 1110.0)  # the caps changed: read in one more round trip
    start_on(7, 1120.0)
    assert trips == [2, 3, 2]
    assert (sent[0], sent[2]) == (11, 11)


def test_no_admission_statement_is_planned_again_at_each_run(pg: PostgresLedger) -> None:
    # PostgreSQL plans a prepared statement for its values five times, then keeps a generic
    # plan unless that looks dearer. A lane's gates read as `unnest` of an array always
    # looked ten times dearer (planned for ten rows), so they were planned again at every
    # admission: about a tenth of its time.
    me = getpass.getuser()
    pg.set_spend_cap(SpendCap(SpendWindow.DAY, usd=100.0), floor_usd=0.0, actor=me)
    pg.set_spend_cap(SpendCap(SpendWindow.ROLLING_5H, lane="codex/default", tokens=10**9), actor=me)
    for n in range(12):
        task = pg.create_task(f"t{n}", max_attempts=5, actor=me).id
        run = pg.start_run(
            task, request_key=f"k{n}", actor=me, now=1000.0 + n, lane="codex/default"
        )
        pg.finish_run(run.id, "succeeded", now=1000.5 + n, usage=_PAID)
    conn = pg._postgres._idle[-1]  # the one connection this thread's transactions took
    plans = conn.execute(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
    ).fetchall()
    run_often = [(text, custom) for text, generic, custom in plans if generic + custom >= 12]
    assert len(run_often) >= 8  # the admission's and the result's statements
    assert [(text, custom) for text, custom in run_often if custom > 5] == []


def test_no_check_of_a_written_table_calls_an_sql_function(pg: PostgresLedger) -> None:
    # PostgreSQL prepares a table's checks at each statement that writes it, inlining any
    # SQL function they call: parsed and planned again at every INSERT and UPDATE. The ids'
    # checks once compared with text || bigint (`textanycat`, an SQL function): 6-7% of an
    # admission and its result.
    conn = pg._postgres._idle[-1]
    called = conn.execute(
        "SELECT con.conrelid::regclass::text, con.conname, p.proname FROM pg_constraint con "
        "CROSS JOIN LATERAL regexp_matches(con.conbin::text, "
        "':(?:opfuncid|funcid) ([0-9]+)', 'g') AS m(ids) "
        "JOIN pg_proc p ON p.oid = m.ids[1]::oid JOIN pg_language l ON l.oid = p.prolang "
        "WHERE con.contype = 'c' AND con.connamespace = current_schema()::regnamespace "
        "AND l.lanname NOT IN ('internal', 'c')"
    ).fetchall()
    assert called == []
    assert conn.execute(
        "SELECT count(*) FROM pg_constraint WHERE contype = 'c' "
        "AND connamespace = current_schema()::regnamespace"
    ).fetchone() == (pytest.approx(50, abs=10),)  # the checks were read at all
