"""The notification events of issue #49 beyond a give-up and a lane: `run.stalled`,
`spend.warning` and `spend.capped`, on both backends. Each is written in the transaction
of the change it reports (a refused admission's `spend.capped` in one of its own, since
the refusal writes nothing) and rolls back with it; each is told once (a window, a
budget); each is delivered once per endpoint, by id, in order. And an endpoint a refusal
stopped is enabled again without being removed: its events resume in order."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest
from _support import marked_left, run_execkit, write_board
from hypothesis import given
from hypothesis import strategies as st
from ledger_backends import AnyLedger, RawSql, is_postgres_url
from notify_receiver import receiving
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture
from test_stall import RUN_TIMEOUT_S, _silent_agent, marker  # noqa: F401 - the fixture

from adapters import GenericAdapter
from execkit import AgentRequest, AttemptOptions, run_attempt
from execkit._classify import FailureClass, stall_reason, stalled_for
from execkit._errors import ExecKitError, Forbidden, NotFound, SpendCapReached, TaskBlocked
from execkit._notify import NotifySender, render
from execkit._usage import Usage, UsdSource
from execkit.ledger import NOTIFY_ENABLE_CAPABILITY, SpendCap, SpendWindow, open_ledger

LANE = "claude/default"
OWNER = getpass.getuser()
NOW = 1_800_000_000.0
MIDNIGHT = 1_799_971_200.0  # 2027-01-15 00:00 UTC


def _paid(usd: float) -> Usage:
    return Usage(input_tokens=100, usd=usd, usd_source=UsdSource.REPORTED)


def _kinds(ledger: AnyLedger) -> list[str]:
    return [event.kind for event in ledger.notify_events()]


def _refuse_audit(raw_sql: RawSql, target: str, action: str) -> None:
    """Make the store refuse the audit row of `action`: the transaction that writes it
    fails after everything else it wrote, which must roll back with it."""
    if is_postgres_url(target):
        raw_sql(
            "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
        raw_sql(
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit FOR EACH ROW "
            f"WHEN (NEW.action = '{action}') EXECUTE FUNCTION refuse_audit()"
        )
    else:
        raw_sql(
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit "
            f"WHEN NEW.action = '{action}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )


def _allow_audit(raw_sql: RawSql, target: str) -> None:
    raw_sql(
        "DROP TRIGGER refuse_audit ON audit"
        if is_postgres_url(target)
        else "DROP TRIGGER refuse_audit"
    )


def test_the_stall_reason_is_read_back_and_nothing_else_is() -> None:
    assert stalled_for(stall_reason(5)) == 5.0
    assert stalled_for(stall_reason(0.25) + " (a vendor request in flight): tail") == 0.25
    for other in (None, "", "tests failed", "stalled: no output for ever", "stalled: x s"):
        assert stalled_for(other) is None


def test_a_stalled_run_is_told_with_its_result_and_rolls_back_with_it(
    ledger: AnyLedger, raw_sql: RawSql, ledger_target: str
) -> None:
    task = ledger.create_task("hangs", actor="d", now=0).id
    run = ledger.start_run(task, request_key="1", actor="d", lane=LANE, now=1)
    _refuse_audit(raw_sql, ledger_target, "run.finish")
    with pytest.raises(ExecKitError):
        ledger.finish_run(
            run.id,
            "failed",
            failure_class=FailureClass.WORK,
            reason=stall_reason(30),
            now=2,
        )
    assert ledger.notify_events() == [] and ledger.run(run.id).status == "running"
    _allow_audit(raw_sql, ledger_target)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class=FailureClass.WORK,
        reason=stall_reason(30) + ": last line",
        now=3,
    )
    [event] = ledger.notify_events()
    assert (event.kind, event.subject, event.at) == ("run.stalled", task, 3)
    assert event.payload == {
        "task_id": task,
        "run_id": run.id,
        "attempt": 1,
        "lane": LANE,
        "adapter": "claude",
        "seconds": 30.0,
        "class": "work",
        "reason": "stalled: no output for 30 s: last line",
    }
    # Any other failure, and a run bound to no lane, say so (or nothing).
    other = ledger.start_run(task, request_key="2", actor="d", now=10**6)
    ledger.finish_run(
        other.id, "failed", failure_class=FailureClass.WORK, reason="tests failed", now=10**6 + 1
    )
    assert _kinds(ledger) == ["run.stalled"]
    slow = ledger.start_run(task, request_key="3", actor="d", now=2 * 10**6)
    ledger.finish_run(
        slow.id,
        "failed",
        failure_class=FailureClass.UPSTREAM,
        reason=stall_reason(9),
        now=2 * 10**6 + 1,
    )
    last = ledger.notify_events()[-1]
    assert (last.kind, last.payload["lane"], last.payload["adapter"]) == ("run.stalled", None, None)
    assert last.payload["class"] == "upstream"


def test_spend_warning_is_an_event_once_a_window_and_rolls_back_with_its_admission(
    ledger: AnyLedger, raw_sql: RawSql, ledger_target: str
) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=OWNER, floor_usd=0.3)
    tasks = [ledger.create_task(f"t{n}", actor=OWNER).id for n in range(5)]
    ledger.start_run(tasks[0], request_key="0", actor=OWNER, now=NOW)
    ledger.start_run(tasks[1], request_key="1", actor=OWNER, now=NOW + 1)
    assert ledger.notify_events() == []
    # The admission that reaches 80% fails at its last write: no event, no "once" spent.
    _refuse_audit(raw_sql, ledger_target, "spend.warning")
    with pytest.raises(ExecKitError):
        ledger.start_run(tasks[2], request_key="2", actor=OWNER, now=NOW + 2)
    assert ledger.notify_events() == []
    _allow_audit(raw_sql, ledger_target)
    third = ledger.start_run(tasks[2], request_key="2", actor=OWNER, now=NOW + 3)
    [event] = ledger.notify_events()
    assert (event.kind, event.subject) == ("spend.warning", "*|day")
    data = event.payload
    assert (data["cap"], data["window"], data["usd"], data["share"]) == (
        "the day's budget",
        "day",
        1.0,
        0.9,
    )
    assert (data["task_id"], data["run_id"], data["window_start"]) == (tasks[2], third.id, MIDNIGHT)
    assert [e.detail["cap"] for e in ledger.audit_events() if e.action == "spend.warning"] == [
        "the day's budget"
    ]


def test_spend_capped_is_told_once_a_window_though_the_refusal_writes_nothing(
    ledger: AnyLedger,
) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=OWNER, floor_usd=0.6)
    tasks = [ledger.create_task(f"t{n}", actor=OWNER).id for n in range(4)]
    ledger.start_run(tasks[0], request_key="0", actor=OWNER, now=NOW)
    for n in (1, 2):
        with pytest.raises(SpendCapReached):
            ledger.start_run(tasks[n], request_key=str(n), actor=OWNER, now=NOW + n)
    [capped] = [e for e in ledger.notify_events() if e.kind == "spend.capped"]
    assert capped.subject == tasks[1]
    data = capped.payload
    assert (data["cap"], data["window"], data["window_start"], data["task_id"]) == (
        "the day's budget",
        "day",
        MIDNIGHT,
        tasks[1],
    )
    assert data["run_id"] is None and "execkit budget set" in data["reason"]
    assert ledger.get_task(tasks[1]).attempts_started == 0  # the refusal charged nothing
    # The next day's window, full again, is told again.
    ledger.start_run(tasks[2], request_key="a", actor=OWNER, now=MIDNIGHT + 86400)
    with pytest.raises(SpendCapReached):
        ledger.start_run(tasks[3], request_key="b", actor=OWNER, now=MIDNIGHT + 86401)
    assert _kinds(ledger).count("spend.capped") == 2


def test_a_task_blocked_on_its_own_budget_is_told_once_a_budget(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(actor=OWNER, floor_usd=0.2)
    task = ledger.create_task("t", actor=OWNER).id
    ledger.set_task_budget(
        task, usd=1.0, tokens=None, expected_usd=None, expected_tokens=None, actor=OWNER
    )
    run = ledger.start_run(task, request_key="1", actor=OWNER, now=NOW)
    ledger.finish_run(run.id, "failed", usage=_paid(1.2), now=NOW + 1)
    for key in ("2", "3"):
        with pytest.raises(TaskBlocked):
            ledger.start_run(task, request_key=key, actor=OWNER, now=NOW + 2, ignore_backoff=True)
    [capped] = [e for e in ledger.notify_events() if e.kind == "spend.capped"]
    assert capped.subject == task and capped.payload["cap"] == f"the budget of task {task}"
    assert capped.payload["usd"] == 1.0 and "set-budget" in capped.payload["reason"]
    assert f"execkit task set-budget {task}" in render(capped, "slack").decode()
    # Raised, spent again, blocked again: a new budget is told again.
    ledger.set_task_budget(
        task, usd=3.0, tokens=None, expected_usd=1.0, expected_tokens=None, actor=OWNER
    )
    run = ledger.start_run(task, request_key="4", actor=OWNER, now=NOW + 3, ignore_backoff=True)
    ledger.finish_run(run.id, "failed", usage=_paid(1.7), now=NOW + 4)
    with pytest.raises(TaskBlocked):
        ledger.start_run(task, request_key="5", actor=OWNER, now=NOW + 5, ignore_backoff=True)
    assert _kinds(ledger).count("spend.capped") == 2


def test_the_new_events_are_delivered_once_per_endpoint_by_id(ledger: AnyLedger) -> None:
    with receiving("s3cret") as receiver:
        json_ep = ledger.add_notify_endpoint(
            receiver.url("/json"),
            events=["run.stalled", "spend.warning", "spend.capped"],
            secret="s3cret",
            actor=OWNER,
            now=0,
        )
        ledger.add_notify_endpoint(
            receiver.url("/slack"), events=["*"], format="slack", actor=OWNER, now=0
        )
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=OWNER, floor_usd=0.45)
        tasks = [ledger.create_task(f"t{n}", actor=OWNER).id for n in range(3)]
        run = ledger.start_run(tasks[0], request_key="0", actor=OWNER, lane=LANE, now=NOW)
        ledger.finish_run(
            run.id,
            "failed",
            failure_class=FailureClass.WORK,
            reason=stall_reason(12),
            now=NOW + 1,
        )
        ledger.start_run(tasks[1], request_key="1", actor=OWNER, now=NOW + 2)
        with pytest.raises(SpendCapReached):
            ledger.start_run(tasks[2], request_key="2", actor=OWNER, now=NOW + 3)
        ids = [e.id for e in ledger.notify_events()]
        assert _kinds(ledger) == ["run.stalled", "spend.warning", "spend.capped"]
        sender = NotifySender(ledger, "A", timeout_s=2.0)
        for _ in range(3):
            sender.drain()
        assert receiver.ids("/json") == ids and receiver.bad_signatures == 0
        slack = [r["body"]["text"] for r in receiver.got if r["path"] == "/slack"]
        assert len(slack) == 3
        assert "no output for 12" in slack[0] and "claude/default" in slack[0]
        assert "90%" in slack[1] and "the day's budget" in slack[1]
        assert "execkit budget set --window day --usd N" in slack[2]
        [listed] = [e for e in ledger.notify_endpoints() if e.id == json_ep.id]
        assert (listed.delivered, listed.backlog) == (3, 0)


def test_a_stopped_endpoint_is_enabled_and_its_events_resume_in_order(ledger: AnyLedger) -> None:
    with receiving() as receiver:
        endpoint = ledger.add_notify_endpoint(receiver.url("/h"), events=["*"], actor=OWNER, now=0)
        first = [
            ledger.notify_dispatcher_stopped(f"d/{n}", left=1, reason="x", now=1) for n in (1, 2)
        ]
        receiver.scripts["/h"] = [404]
        sender = NotifySender(ledger, "A", timeout_s=2.0)
        sender.drain()
        [stopped] = ledger.notify_endpoints()
        assert "404" in (stopped.stopped_reason or "") and stopped.backlog == 2
        later = ledger.notify_dispatcher_stopped("d/3", left=1, reason="x", now=2)
        with pytest.raises(Forbidden):
            ledger.enable_notify_endpoint(endpoint.id, actor="mallory", now=3)
        with pytest.raises(NotFound):
            ledger.enable_notify_endpoint("ep_nope", actor=OWNER, now=3)
        enabled = ledger.enable_notify_endpoint(endpoint.id, actor=OWNER, now=4)
        assert enabled.stopped_reason is None and enabled.backlog == 3
        [audited] = [e for e in ledger.audit_events() if e.action == "notify.enable"]
        assert audited.detail["endpoint"] == endpoint.id and "404" in audited.detail["was"]
        # Enabling one that runs changes nothing and audits nothing.
        assert ledger.enable_notify_endpoint(endpoint.id, actor=OWNER, now=5).stopped_reason is None
        assert len([e for e in ledger.audit_events() if e.action == "notify.enable"]) == 1
        for _ in range(3):
            sender.drain()
        # The refused one once before, then each once, in order.
        sent = [r["headers"]["x-execkit-event-id"] for r in receiver.got]
        assert sent == [first[0], first[0], first[1], later]
        [listed] = ledger.notify_endpoints()
        assert (listed.delivered, listed.backlog, listed.stopped_reason) == (3, 0, None)


def test_enable_through_the_python_remote_client(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    assert NOTIFY_ENABLE_CAPABILITY in client.capabilities()
    added = client.add_notify_endpoint("http://127.0.0.1:9/r", events=["*"], actor=ME)
    event = client.notify_test(added.id, actor=ME)
    remote.ledger.notify_settle(added.id, event.seq, "stopped", owner="s", error="answered 410")
    assert client.notify_endpoints()[0].stopped_reason == "answered 410"
    enabled = client.enable_notify_endpoint(added.id, actor=ME)
    assert (enabled.stopped_reason, enabled.backlog) == (None, 1)
    assert client.notify_endpoints() == remote.ledger.notify_endpoints()
    with pytest.raises(NotFound):
        client.enable_notify_endpoint("ep_nope", actor=ME)


def test_a_real_agent_that_falls_silent_is_told_as_run_stalled(
    tmp_path: Path,
    marker: str,  # noqa: F811
) -> None:
    """A real agent prints a line and sleeps: its watchdog stops it, the result and its
    `run.stalled` are written together, and the event names the run's lane and adapter."""
    with open_ledger(tmp_path / "l.db") as ledger:
        task = ledger.create_task("t", actor="runner")
        request = AgentRequest(prompt="", extra_args=_silent_agent(marker), timeout_s=RUN_TIMEOUT_S)
        options = AttemptOptions(stall_timeout_s=1, kill_grace=1)
        outcome = run_attempt(ledger, task.id, GenericAdapter(), request, options)
        assert outcome.failure_class is FailureClass.WORK
        [run] = ledger.runs(task.id)
        [event] = ledger.notify_events()
        assert (event.kind, event.subject) == ("run.stalled", task.id)
        data = event.payload
        assert (data["run_id"], data["seconds"], data["class"], data["adapter"]) == (
            run.id,
            1.0,
            "work",
            "generic",
        )
        assert str(data["lane"]).startswith("generic/")
    assert marked_left(marker) == []


def test_a_dispatcher_sends_the_stall_of_its_agent_before_it_returns(
    tmp_path: Path,
    marker: str,  # noqa: F811
) -> None:
    board = write_board(
        tmp_path / "board.json",
        [{"id": "S-1", "title": "s", "state": "todo", "argv": _silent_agent(marker)}],
    )
    db = tmp_path / "l.db"
    with receiving("s3cret") as receiver:
        with open_ledger(db) as ledger:
            ledger.add_notify_endpoint(
                receiver.url("/h"), events=["run.stalled"], secret="s3cret", actor=OWNER
            )
        done = run_execkit(
            "dispatch", "--board", str(board), "--db", str(db), "--once", "--stall-timeout", "1"
        )
        assert done.returncode == 0, done.stderr
        with open_ledger(db) as ledger:
            ids = [e.id for e in ledger.notify_events() if e.kind == "run.stalled"]
            [listed] = ledger.notify_endpoints()
        assert len(ids) == 1 and receiver.ids("/h") == ids and receiver.bad_signatures == 0
        assert (listed.delivered, listed.backlog) == (1, 0)
        [got] = receiver.got
        assert got["body"]["data"]["seconds"] == 1.0 and got["body"]["data"]["class"] == "work"
    assert marked_left(marker) == []


@given(st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False))
def test_a_stall_reason_reads_back_as_the_seconds_it_says(seconds: float) -> None:
    said = stall_reason(seconds)
    assert stalled_for(said) == float(f"{seconds:g}")
    assert stalled_for(said + " (a vendor request in flight)") == float(f"{seconds:g}")
    assert stalled_for("x" + said) is None


def test_stall_and_spend_events_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME, lane=LANE)
    client.finish_run(run.id, "failed", failure_class=FailureClass.WORK, reason=stall_reason(7))
    client.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=2.0)
    other = client.create_task("u", actor=ME)
    with pytest.raises(SpendCapReached):
        client.start_run(other.id, request_key="2", actor=ME)
    kinds = [(e.kind, e.subject) for e in remote.ledger.notify_events()]
    assert kinds == [("run.stalled", task.id), ("spend.capped", other.id)]
