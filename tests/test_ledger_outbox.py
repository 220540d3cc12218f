"""The board outbox and a tracker's own lane (issue #47), on both backends: a put is
recorded before it is sent and merges over the last one; a claim is a lease no second
drainer takes; a put made during a send stays pending; failures are retried no sooner than
asked and at most `OUTBOX_MAX_TRIES` times in a row; every string is masked; a tracker's
calls fold into its lane as a run's result does (a stated reset parks it, a storm cools it,
a refused token stops it, the probe after a wait is recorded); webhook deliveries are
de-duplicated and wake the dispatchers."""

from __future__ import annotations

import pytest
from ledger_backends import AnyLedger, Opener
from test_remote import Remote, remote  # noqa: F401 - the fixture

from execkit._errors import InvalidInput, NotFound
from execkit._lanes import LaneState
from execkit.ledger import OUTBOX_CAPABILITY, OutboxEntry

BOARD = "github:acme/widgets"
LANE = "github/0123456789abcdef"
SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def test_a_put_is_pending_until_settled_and_merges_key_by_key(ledger: AnyLedger) -> None:
    assert OUTBOX_CAPABILITY in ledger.capabilities()
    first = ledger.outbox_put(BOARD, "acme/widgets#1", {"state": "todo", "running": 1}, now=10)
    assert (first.seq, first.sent_seq, first.pending) == (1, 0, True)
    second = ledger.outbox_put(BOARD, "acme/widgets#1", {"state": "done"}, now=11)
    assert second.seq == 2
    assert second.payload == {"state": "done", "running": 1}
    [claimed] = ledger.outbox_claim(BOARD, owner="A", now=12)
    assert (claimed.seq, claimed.sends, claimed.claimed_by) == (2, 1, "A")
    settled = ledger.outbox_settle(BOARD, "acme/widgets#1", 2, owner="A", ref="9001", now=13)
    assert (settled.sent_seq, settled.pending, settled.ref, settled.claimed_by) == (
        2,
        False,
        "9001",
        None,
    )
    assert ledger.outbox_entries(BOARD, pending=True) == []
    # The same state again: shown already, nothing to send, nothing written.
    again = ledger.outbox_put(BOARD, "acme/widgets#1", {"state": "done"}, now=14)
    assert (again.seq, again.pending) == (2, False)


def test_a_claim_is_a_lease_a_second_drainer_does_not_take(ledger: AnyLedger) -> None:
    ledger.outbox_put(BOARD, "i1", {"state": "done"}, now=10)
    assert [e.item for e in ledger.outbox_claim(BOARD, owner="A", lease_s=30, now=11)] == ["i1"]
    assert ledger.outbox_claim(BOARD, owner="B", now=12) == []
    # The owner may claim it again (its own retry); another only once the claim ran out.
    assert [e.sends for e in ledger.outbox_claim(BOARD, owner="A", lease_s=30, now=13)] == [2]
    [taken] = ledger.outbox_claim(BOARD, owner="B", now=44)
    assert (taken.claimed_by, taken.sends) == ("B", 3)


def test_a_put_during_a_send_stays_pending_after_it(ledger: AnyLedger) -> None:
    ledger.outbox_put(BOARD, "i1", {"state": "todo"}, now=10)
    [sending] = ledger.outbox_claim(BOARD, owner="A", now=11)
    ledger.outbox_put(BOARD, "i1", {"state": "done"}, now=12)
    after = ledger.outbox_settle(BOARD, "i1", sending.seq, owner="A", now=13)
    assert (after.sent_seq, after.seq, after.pending) == (1, 2, True)
    [next_send] = ledger.outbox_claim(BOARD, owner="A", now=14)
    assert next_send.payload == {"state": "done"}


def test_failures_wait_as_asked_and_stop_after_the_bound(ledger: AnyLedger) -> None:
    from execkit.ledger._core.outbox import OUTBOX_MAX_TRIES

    ledger.outbox_put(BOARD, "i1", {"state": "done"}, now=10)
    at = 10.0
    for tries in range(1, OUTBOX_MAX_TRIES + 1):
        [entry] = ledger.outbox_claim(BOARD, owner="A", now=at)
        failed = ledger.outbox_settle(
            BOARD, "i1", entry.seq, owner="A", error="502 Bad Gateway", retry_at=at + 5, now=at
        )
        assert (failed.tries, failed.next_at, failed.last_error) == (
            tries,
            at + 5,
            "502 Bad Gateway",
        )
        assert ledger.outbox_claim(BOARD, owner="A", now=at + 4) == []  # not before
        at += 5
    assert ledger.outbox_claim(BOARD, owner="A", now=at + 1000) == []  # the bound
    # A new put lets it go again.
    ledger.outbox_put(BOARD, "i1", {"state": "blocked"}, now=at)
    assert [e.tries for e in ledger.outbox_claim(BOARD, owner="A", now=at)] == [0]


def test_every_string_put_or_settled_is_masked(ledger: AnyLedger) -> None:
    entry = ledger.outbox_put(BOARD, "i1", {"comment": f"token {SECRET} leaked"}, now=10)
    assert SECRET not in str(entry.payload)
    ledger.outbox_claim(BOARD, owner="A", now=11)
    failed = ledger.outbox_settle(BOARD, "i1", 1, owner="A", error=f"401 for {SECRET}", now=12)
    assert SECRET not in (failed.last_error or "")
    assert all(SECRET not in str(e.to_dict()) for e in ledger.outbox_entries(BOARD))


def test_bad_arguments_are_refused_naming_the_field(ledger: AnyLedger) -> None:
    with pytest.raises(InvalidInput) as caught:
        ledger.outbox_put(BOARD, "i1", ["not", "an", "object"], now=1)  # type: ignore[arg-type]
    assert caught.value.field == "fields"
    with pytest.raises(InvalidInput):
        ledger.outbox_put(BOARD, "i1", {"big": "x" * 70_000}, now=1)
    with pytest.raises(NotFound):
        ledger.outbox_settle(BOARD, "never", 1, owner="A", now=1)
    ledger.outbox_put(BOARD, "i1", {"a": 1}, now=1)
    with pytest.raises(InvalidInput) as seq:
        ledger.outbox_settle(BOARD, "i1", 2, owner="A", now=1)
    assert seq.value.field == "seq"
    with pytest.raises(InvalidInput):
        ledger.outbox_claim(BOARD, owner="A", limit=0, now=1)


def test_entries_outlive_a_reopen(opener: Opener) -> None:
    with opener() as first:
        first.outbox_put(BOARD, "i1", {"state": "done"}, now=10)
    with opener() as second:
        [entry] = second.outbox_entries(BOARD, pending=True)
        assert isinstance(entry, OutboxEntry)
        assert entry.payload == {"state": "done"}


def test_a_tracker_lane_parks_on_a_stated_reset_and_its_probe_is_recorded(
    ledger: AnyLedger,
) -> None:
    # A success on a lane never seen writes nothing.
    assert ledger.record_lane_call(LANE, "success", now=100).state is LaneState.OPEN
    assert ledger.list_lanes(now=100) == []
    parked = ledger.record_lane_call(LANE, "reset", until=400, reason="rate limited", now=100)
    assert parked.state is LaneState.PARKED and not parked.admits
    assert parked.opens_at is not None and parked.opens_at >= 400
    # After the wait the next call is the probe; a limit that held parks it again, longer.
    held = ledger.record_lane_call(LANE, "upstream", reason="403 again", now=parked.opens_at + 1)
    assert held.state is LaneState.PARKED and held.trips == 2
    kinds = [event.kind for event in ledger.lane_history(LANE)]
    assert kinds == ["reset", "probe", "upstream"]
    seen = ledger.wake_seq()
    opened = ledger.record_lane_call(LANE, "success", now=10**6)
    assert opened.state is LaneState.OPEN
    assert ledger.wake_seq() == seen + 1  # the dispatchers that wait act at once


def test_a_tracker_lane_cools_on_a_storm_and_stops_on_a_refused_token(ledger: AnyLedger) -> None:
    config = ledger.lane_config()
    for n in range(config.breaker_k):
        shown = ledger.record_lane_call(LANE, "upstream", reason="502", now=100 + n)
    assert shown.state is LaneState.COOLING
    stopped = ledger.record_lane_call(
        LANE, "stop", reason="GitHub refused the token (401): set GITHUB_TOKEN", now=200
    )
    assert stopped.state is LaneState.STOPPED
    # A late success does not open a stopped lane: only an operator's resume does.
    assert ledger.record_lane_call(LANE, "success", now=300).state is LaneState.STOPPED
    with pytest.raises(InvalidInput):
        ledger.record_lane_call(LANE, "maybe", now=1)
    with pytest.raises(InvalidInput):
        ledger.record_lane_call(LANE + "@host", "success", now=1)


def test_a_delivery_wakes_once(ledger: AnyLedger) -> None:
    seen = ledger.wake_seq()
    assert ledger.note_delivery("github", "72d3162e-cc78-11e3-81ab-4c9367dc0958", now=1)
    assert not ledger.note_delivery("github", "72d3162e-cc78-11e3-81ab-4c9367dc0958", now=2)
    assert ledger.wake_seq() == seen + 1


def test_the_outbox_and_a_tracker_lane_through_the_server(remote: Remote) -> None:  # noqa: F811
    """Two clients of one `execkit serve`: what one puts the other claims, a claim is
    exclusive, a lane call is shared, a delivery counts once."""
    first, second = remote.client(), remote.client("memory")
    assert OUTBOX_CAPABILITY in first.capabilities()
    put = first.outbox_put(BOARD, "i1", {"state": "done", "attempt": 2, "running": False})
    assert put.pending and put.payload == {"state": "done", "attempt": 2, "running": False}
    [claimed] = second.outbox_claim(BOARD, owner="B", lease_s=60)
    assert first.outbox_claim(BOARD, owner="A") == []
    settled = second.outbox_settle(BOARD, "i1", claimed.seq, owner="B", ref="77")
    assert (settled.pending, settled.ref) == (False, "77")
    assert first.outbox_entries(BOARD, pending=True) == []
    parked = first.record_lane_call(LANE, "reset", until=10**10, reason="rate limited")
    assert parked.state is LaneState.PARKED
    assert second.get_lane(LANE).state is LaneState.PARKED
    assert first.note_delivery("github", "d-1") is True
    assert second.note_delivery("github", "d-1") is False
