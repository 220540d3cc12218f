"""Being told (issue #49), in the ledger, on both backends: an event is written in the
transaction of the change it reports (a give-up, a lane stopped, parked or resumed), with a
stable id and masked; endpoints are the admin's, audited, never shown with their URL's path
or their secret; a sender's claim is a lease, an endpoint is owed the events written after
it was added, of its kinds, in order, a retry not yet due holds the later ones, a refusal
for good stops the endpoint."""

from __future__ import annotations

import getpass

import pytest
from ledger_backends import AnyLedger, RawSql
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit._classify import FailureClass
from execkit._errors import Forbidden, InvalidInput, NotFound
from execkit._usage import Usage, UsdSource
from execkit.ledger import ADMIN_ROLE

LANE = "claude/default"
OWNER = getpass.getuser()
HOOK = "https://hooks.slack.test/services/T000/B000/sEcReTpAtH"
SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def _stop_lane(ledger: AnyLedger, *, at: float = 1, fix: str = "run `claude /login`") -> str:
    task = ledger.create_task("stopper", actor="d", now=at).id
    run = ledger.start_run(task, request_key=f"s{at}", actor="d", lane=LANE, now=at)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="environment",  # type: ignore[arg-type]
        reason=fix,
        lane_cause="credentials",
        now=at + 1,
    )
    return task


def test_a_block_by_the_tasks_own_spend_cap_is_told_as_one(ledger: AnyLedger) -> None:
    # A charged failure that spends the task's cap blocks it on `spend` (issue #45): the
    # person told, and the give-up's audit, name the cap, not the policies' "retry".
    ledger.set_spend_cap(actor=ME, floor_usd=0.2)
    task = ledger.create_task("costly", actor=ME, now=0).id
    ledger.set_task_budget(
        task, usd=1.0, tokens=None, expected_usd=None, expected_tokens=None, actor=ME
    )
    run = ledger.start_run(task, request_key="0", actor="d", now=0)
    spent = Usage(input_tokens=10, usd=0.9, usd_source=UsdSource.REPORTED)
    ledger.finish_run(
        run.id, "failed", failure_class=FailureClass.WORK, reason="over", usage=spent, now=1
    )
    [event] = ledger.notify_events()
    assert (event.kind, event.payload["blocked_on"]) == ("issue.blocked", "spend")
    assert "execkit task set-budget" in event.payload["decision"]
    ledger.record_give_up(task, state="blocked", actor="d", now=2)
    assert len(ledger.notify_events()) == 1  # told once, by the result
    [gave_up] = [e for e in ledger.audit_events(task) if e.action == "task.give_up"]
    assert gave_up.detail["blocked_on"] == "spend"


def test_a_result_that_blocks_writes_issue_blocked_once(ledger: AnyLedger) -> None:
    task = ledger.create_task("fix the flake", actor="d", now=0).id
    # A work failure with budget left blocks nothing: no event.
    run = ledger.start_run(task, request_key="0", actor="d", now=0)
    ledger.finish_run(run.id, "failed", failure_class="work", reason="tests failed", now=0.5)  # type: ignore[arg-type]
    assert ledger.notify_events() == []
    run = ledger.start_run(task, request_key="1", actor="d", now=10**6)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="environment",  # type: ignore[arg-type]
        reason=f"token {SECRET} refused; set GITHUB_TOKEN",
        now=10**6 + 1,
    )
    [event] = ledger.notify_events()
    assert event.kind == "issue.blocked" and event.subject == task and event.at == 10**6 + 1
    assert event.id.startswith("evt_") and event.seq >= 1
    data = event.payload
    assert (data["task_id"], data["attempts"], data["class"], data["blocked_on"]) == (
        task,
        2,
        "environment",
        "environment",
    )
    assert "set GITHUB_TOKEN" in data["fix"]
    assert SECRET not in str(data)  # masked as every stored string is
    # The dispatcher's give-up of the same history tells nobody again.
    ledger.record_give_up(task, state="Blocked", actor="d", now=10**6 + 2)
    assert len(ledger.notify_events()) == 1
    # A failed give-up (an unknown task) writes no event.
    with pytest.raises(NotFound):
        ledger.record_give_up("nope", state="Blocked", actor="d", now=10**6 + 3)
    assert len(ledger.notify_events()) == 1


def test_a_give_up_no_result_told_writes_issue_blocked(ledger: AnyLedger) -> None:
    task = ledger.create_task("never ran", actor="d", now=0).id
    ledger.record_give_up(task, state="Won't do", actor="d", now=1)
    [event] = ledger.notify_events()
    assert (event.kind, event.payload["state"], event.payload["attempts"]) == (
        "issue.blocked",
        "Won't do",
        0,
    )


def test_lane_stop_park_and_resume_are_events(ledger: AnyLedger) -> None:
    _stop_lane(ledger)
    ledger.resume_lane(LANE, actor=OWNER, reason="logged in", now=5)
    ledger.park_lane(LANE, until=500, actor=OWNER, reason="maintenance", now=6)
    kinds = [(e.kind, e.subject) for e in ledger.notify_events()]
    assert kinds == [
        ("lane.stopped", LANE),
        ("issue.blocked", "t-1"),  # the stopping failure blocked its own task too
        ("lane.resumed", LANE),
        ("lane.parked", LANE),
    ]
    stopped = ledger.notify_events()[0].payload
    assert stopped["reason"] == "run `claude /login`" and stopped["state"] == "stopped"
    ids = [e.id for e in ledger.notify_events()]
    assert len(set(ids)) == 4
    # Read again: the same ids (stable, not made at reading).
    assert [e.id for e in ledger.notify_events()] == ids


def test_endpoints_are_the_admins_audited_and_never_shown_whole(ledger: AnyLedger) -> None:
    with pytest.raises(Forbidden, match=ADMIN_ROLE):
        ledger.add_notify_endpoint(HOOK, events=["*"], format="slack", actor="mallory", now=1)
    endpoint = ledger.add_notify_endpoint(
        HOOK, events=["lane.stopped", "issue.blocked"], secret="s3cret", actor=OWNER, now=1
    )
    assert endpoint.url == "https://hooks.slack.test/…" and endpoint.has_secret
    assert endpoint.events == ("lane.stopped", "issue.blocked")
    again = ledger.add_notify_endpoint(
        HOOK, events=["lane.stopped", "issue.blocked"], secret="s3cret", actor=OWNER, now=2
    )
    assert again == endpoint  # the same one again (a retry): nothing added
    [listed] = ledger.notify_endpoints()
    shown = str(listed.to_dict())
    assert "sEcReTpAtH" not in shown and "s3cret" not in shown
    [audit] = [a for a in ledger.audit_events() if a.action == "notify.add"]
    assert "sEcReTpAtH" not in str(audit.detail) and "s3cret" not in str(audit.detail)
    with pytest.raises(Forbidden):
        ledger.remove_notify_endpoint(endpoint.id, actor="mallory", now=2)
    assert ledger.remove_notify_endpoint(endpoint.id, actor=OWNER, now=2)
    assert not ledger.remove_notify_endpoint(endpoint.id, actor=OWNER, now=3)
    assert ledger.notify_endpoints() == []
    assert [a.action for a in ledger.audit_events()][-2:] == ["notify.add", "notify.remove"]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"url": "ftp://example.test/x"}, "url"),
        ({"url": "https:///nohost"}, "url"),
        ({"url": "http://a b.test/"}, "url"),
        ({"events": ["issue.exploded"]}, "events"),
        ({"events": []}, "events"),
        ({"events": "lane.stopped"}, "events"),
        ({"format": "xml"}, "format"),
        ({"secret": ""}, "secret"),
    ],
)
def test_bad_endpoints_are_refused_naming_the_field(
    ledger: AnyLedger, options: dict[str, object], field: str
) -> None:
    given: dict[str, object] = {"url": "http://127.0.0.1:9/hook", "events": ["*"], **options}
    url = given.pop("url")
    with pytest.raises(InvalidInput) as refused:
        ledger.add_notify_endpoint(url, actor=OWNER, now=1, **given)  # type: ignore[arg-type]
    assert refused.value.field == field
    assert ledger.notify_endpoints() == []


def test_an_endpoint_is_owed_later_events_of_its_kinds_in_order(ledger: AnyLedger) -> None:
    _stop_lane(ledger, at=1)  # before the endpoint: never sent to it
    lanes = ledger.add_notify_endpoint(
        "http://127.0.0.1:9/a", events=["lane.resumed", "lane.parked"], actor=OWNER, now=3
    )
    every = ledger.add_notify_endpoint("http://127.0.0.1:9/b", events=["*"], actor=OWNER, now=3)
    ledger.resume_lane(LANE, actor=OWNER, now=4)
    ledger.park_lane(LANE, until=500, actor=OWNER, now=5)
    claims = {c.endpoint.id: c for c in ledger.notify_claim(owner="A", now=6)}
    assert [e.kind for e, _, _ in claims[lanes.id].events] == ["lane.resumed", "lane.parked"]
    assert [e.kind for e, _, _ in claims[every.id].events] == ["lane.resumed", "lane.parked"]
    # A lease: another sender gets nothing while A holds them.
    assert ledger.notify_claim(owner="B", now=7) == []
    first, second = (e for e, _, _ in claims[every.id].events)
    ledger.notify_settle(
        every.id, first.seq, "retry", owner="A", error="answered 500", retry_at=100, now=8
    )
    ledger.notify_release(every.id, owner="A")
    ledger.notify_settle(lanes.id, first.seq, "delivered", owner="A", now=8)
    ledger.notify_release(lanes.id, owner="A")
    # The retry is not due: nothing of `every` goes, even the later event (order kept).
    claims = {c.endpoint.id: c for c in ledger.notify_claim(owner="B", now=9)}
    assert every.id not in claims
    assert [e.seq for e, _, _ in claims[lanes.id].events] == [second.seq]
    ledger.notify_release(lanes.id, owner="B")
    later = {c.endpoint.id: c for c in ledger.notify_claim(owner="B", now=100)}
    [(event, tries, first_at), _] = later[every.id].events
    assert (event.seq, tries, first_at) == (first.seq, 1, 8)
    # A settle of what was settled already changes nothing (a late sender).
    ledger.notify_settle(every.id, first.seq, "delivered", owner="B", now=101)
    again = ledger.notify_settle(every.id, first.seq, "failed", owner="A", error="x", now=102)
    assert (again.delivered, again.failed) == (1, 0)
    listed = {e.id: e for e in ledger.notify_endpoints()}
    assert listed[every.id].backlog == 1 and listed[lanes.id].backlog == 1


def test_a_given_up_event_is_counted_and_a_refusal_stops_the_endpoint(
    ledger: AnyLedger,
) -> None:
    endpoint = ledger.add_notify_endpoint(
        "http://127.0.0.1:9/a", events=["lane.stopped", "lane.resumed", "lane.parked"],
        actor=OWNER, now=0,
    )  # fmt: skip
    _stop_lane(ledger, at=1)
    ledger.resume_lane(LANE, actor=OWNER, now=4)
    [claim] = ledger.notify_claim(owner="A", now=5)
    first, second = (e for e, _, _ in claim.events)
    gave = ledger.notify_settle(
        endpoint.id, first.seq, "failed", owner="A", error="given up: answered 503", now=6
    )
    assert (gave.failed, gave.last_error) == (1, "given up: answered 503")
    stopped = ledger.notify_settle(
        endpoint.id, second.seq, "stopped", owner="A", error="answered 410", now=7
    )
    assert stopped.stopped_reason == "answered 410"
    ledger.notify_release(endpoint.id, owner="A")
    ledger.park_lane(LANE, until=500, actor=OWNER, now=8)
    assert ledger.notify_claim(owner="A", now=9) == []  # stopped: sent nothing more
    [listed] = ledger.notify_endpoints()
    assert (listed.stopped_reason, listed.failed, listed.backlog) == ("answered 410", 1, 2)


def test_a_test_event_goes_to_its_endpoint_only(ledger: AnyLedger, raw_sql: RawSql) -> None:
    one = ledger.add_notify_endpoint(
        "http://127.0.0.1:9/a", events=["issue.blocked"], actor=OWNER, now=0
    )
    two = ledger.add_notify_endpoint("http://127.0.0.1:9/b", events=["*"], actor=OWNER, now=0)
    event = ledger.notify_test(one.id, actor=OWNER, now=1)
    assert event.kind == "notify.test" and event.subject == one.id
    [claim] = ledger.notify_claim(owner="A", now=2)
    assert claim.endpoint.id == one.id and [e.id for e, _, _ in claim.events] == [event.id]
    assert two.id not in {c.endpoint.id for c in ledger.notify_claim(owner="A", now=3)}
    with pytest.raises(NotFound):
        ledger.notify_test("ep_nope", actor=OWNER, now=4)
    with pytest.raises(Forbidden):
        ledger.notify_test(one.id, actor="mallory", now=4)
    assert raw_sql("SELECT COUNT(*) FROM notify_events") == [(1,)]


def test_a_dispatcher_that_stops_with_work_left_is_an_event(ledger: AnyLedger) -> None:
    assert ledger.notify_dispatcher_stopped("host/1", left=0, reason="done", now=1) is None
    event_id = ledger.notify_dispatcher_stopped("host/1", left=3, reason="SIGTERM", now=2)
    [event] = ledger.notify_events()
    assert event.id == event_id and event.payload == {
        "dispatcher": "host/1",
        "left": 3,
        "reason": "SIGTERM",
    }


def test_endpoints_through_the_server(remote: Remote) -> None:  # noqa: F811
    from execkit.ledger import NOTIFY_CAPABILITY

    client = remote.client()
    assert NOTIFY_CAPABILITY in client.capabilities()
    added = client.add_notify_endpoint(
        HOOK, events=["lane.stopped", "issue.blocked"], format="slack", secret="s3cret", actor=ME
    )
    assert added.url == "https://hooks.slack.test/…" and added.has_secret
    assert added.events == ("lane.stopped", "issue.blocked")
    assert client.notify_endpoints() == remote.ledger.notify_endpoints()
    event = client.notify_test(added.id, actor=ME)
    assert event.kind == "notify.test" and event.subject == added.id
    with pytest.raises(InvalidInput) as refused:
        client.add_notify_endpoint("ftp://x.test/", events=["*"], actor=ME)
    assert refused.value.field == "url"
    assert client.remove_notify_endpoint(added.id, actor=ME)
    assert client.notify_endpoints() == []
    # Nothing the server stored or answered names the URL's path or the secret.
    assert "sEcReTpAtH" not in str([a.detail for a in remote.ledger.audit_events()])
