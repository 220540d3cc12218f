"""Sending notifications (issue #49) to a loopback receiver, on both backends: signed JSON
webhooks whose signature the receiver checks, retried on 500, 429 (its Retry-After
honoured) and a receiver that hangs (bounded by the client's timeout), given up after a
bounded time with the failure listed, an endpoint stopped by a 4xx or a redirect (never
followed), a Slack message a person reads. Every event is delivered once per endpoint, by
id, in order. No timing is asserted: the sender's clock is the test's."""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger_backends import AnyLedger, Opener
from notify_receiver import receiving

from execkit._notify import NotifySender, render, sign, verify
from execkit.ledger import NotifyEvent

LANE = "claude/default"
OWNER = getpass.getuser()
SECRET = "whsec-test-0123456789"


class Clock:
    def __init__(self, at: float = 1000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def _events(ledger: AnyLedger, at: float = 1) -> list[str]:
    """A lane stopped (its run's task blocked), resumed and parked, and that task given up
    (told already by its result): four events."""
    task = ledger.create_task("deploy the docs", actor="d", now=at).id
    run = ledger.start_run(task, request_key="r1", actor="d", lane=LANE, now=at)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class="environment",  # type: ignore[arg-type]
        reason="claude: credentials refused; run `claude /login`",
        lane_cause="credentials",
        now=at + 1,
    )
    ledger.resume_lane(LANE, actor=OWNER, now=at + 2)
    ledger.park_lane(LANE, until=at + 500, actor=OWNER, now=at + 3)
    ledger.record_give_up(task, state="Blocked", actor="d", now=at + 4)
    return [e.id for e in ledger.notify_events()]


def _drain(sender: NotifySender, clock: Clock, rounds: int, step: float = 400.0) -> None:
    for _ in range(rounds):
        sender.drain()
        clock.at += step


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    import hashlib
    import hmac

    body = b'{"id":"evt_1"}'
    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("k", "1700000000", body) == "sha256=" + expected
    assert verify("k", "1700000000", body, "sha256=" + expected)
    assert not verify("k", "1700000001", body, "sha256=" + expected)
    assert not verify("other", "1700000000", body, "sha256=" + expected)


def test_retries_then_delivers_each_event_once_in_order(ledger: AnyLedger) -> None:
    clock = Clock()
    with receiving(SECRET) as receiver:
        endpoint = ledger.add_notify_endpoint(
            receiver.url("/hook"), events=["*"], secret=SECRET, actor=OWNER, now=0
        )
        ids = _events(ledger)
        receiver.scripts["/hook"] = [500, 500, (429, {"Retry-After": "30"}), "hang", "close"]
        sender = NotifySender(ledger, "A", clock=clock, timeout_s=0.5, rng=lambda: 0.5)
        # Three failures in a row: the first event is retried, nothing after it goes.
        for _ in range(3):
            sender.drain()
            clock.at += 400
        assert receiver.ids("/hook") == ids[:1]
        # The 429 asked for 30 s: not sooner (the clock stands still), then at once.
        clock.at -= 400
        sender.drain()
        assert [r["path"] for r in receiver.got].count("/hook") == 3
        clock.at += 30
        _drain(sender, clock, 12)
        assert receiver.bad_signatures == 0
        assert receiver.ids("/hook") == ids  # each once by id, in order
        [listed] = ledger.notify_endpoints()
        assert (listed.id, listed.delivered, listed.failed, listed.backlog) == (
            endpoint.id,
            4,
            0,
            0,
        )
        [sent] = [r for r in receiver.got if r["body"]["kind"] == "issue.blocked"]
        assert sent["headers"]["x-execkit-event"] == "issue.blocked"
        assert sent["body"]["id"] == ids[1]
        assert sent["body"]["data"]["class"] == "environment"
        assert "claude /login" in sent["body"]["data"]["fix"]


def test_a_refusal_stops_the_endpoint_and_a_redirect_is_not_followed(
    ledger: AnyLedger,
) -> None:
    clock = Clock()
    with receiving() as receiver, receiving() as elsewhere:
        gone = ledger.add_notify_endpoint(receiver.url("/gone"), events=["*"], actor=OWNER, now=0)
        moved = ledger.add_notify_endpoint(receiver.url("/moved"), events=["*"], actor=OWNER, now=0)
        receiver.scripts["/gone"] = [410]
        receiver.scripts["/moved"] = [(302, {"Location": elsewhere.url("/x")})]
        _events(ledger)
        _drain(NotifySender(ledger, "A", clock=clock, timeout_s=0.5), clock, 5)
        shown = {e.id: e for e in ledger.notify_endpoints()}
        assert "410" in (shown[gone.id].stopped_reason or "")
        assert "redirect" in (shown[moved.id].stopped_reason or "")
        assert shown[gone.id].backlog == 4 and shown[moved.id].backlog == 4
        # One try each, then nothing more; the other host never asked.
        assert len(receiver.got) == 2 and elsewhere.got == []


def test_an_event_is_given_up_after_the_bound_and_the_next_goes(ledger: AnyLedger) -> None:
    clock = Clock()
    with receiving() as receiver:
        ledger.add_notify_endpoint(receiver.url("/flaky"), events=["*"], actor=OWNER, now=0)
        ids = _events(ledger)
        receiver.scripts["/flaky"] = [503] * 4
        sender = NotifySender(ledger, "A", clock=clock, timeout_s=0.5, give_up_after_s=1000)
        _drain(sender, clock, 12)
        [listed] = ledger.notify_endpoints()
        assert listed.failed == 1 and "given up" in (listed.last_error or "")
        assert listed.delivered == 3 and listed.backlog == 0
        assert receiver.ids("/flaky") == ids  # the first tried, given up; the rest went


def test_two_senders_never_send_one_event_twice(ledger: AnyLedger, opener: Opener) -> None:
    clock = Clock()
    with receiving() as receiver:
        ledger.add_notify_endpoint(receiver.url("/one"), events=["*"], actor=OWNER, now=0)
        ids = _events(ledger)
        with opener() as other:
            first = NotifySender(ledger, "A", clock=clock, timeout_s=0.5)
            second = NotifySender(other, "B", clock=clock, timeout_s=0.5)
            for _ in range(4):
                first.drain()
                second.drain()
                clock.at += 1
        assert [r["headers"]["x-execkit-event-id"] for r in receiver.got] == ids


def test_a_slack_message_says_what_why_and_the_fix() -> None:
    event = NotifyEvent(
        seq=1,
        id="evt_1",
        kind="lane.stopped",
        subject=LANE,
        payload={"lane": LANE, "reason": "claude: credentials refused; run `claude /login`"},
        at=1.0,
    )
    import json

    text = json.loads(render(event, "slack", dashboard_url="http://127.0.0.1:8765"))["text"]
    assert "lane *claude/default* stopped" in text
    assert "credentials refused" in text
    assert "`execkit lane resume claude/default`" in text
    assert "<http://127.0.0.1:8765/dashboard|" in text


def test_a_slack_endpoint_gets_a_message_and_no_signature(ledger: AnyLedger) -> None:
    clock = Clock()
    with receiving() as receiver:
        ledger.add_notify_endpoint(
            receiver.url("/services/T0/B0/x"), events=["issue.blocked"], format="slack",
            actor=OWNER, now=0,
        )  # fmt: skip
        _events(ledger)
        _drain(NotifySender(ledger, "A", clock=clock, timeout_s=0.5), clock, 2)
        [got] = receiver.got
        assert "x-execkit-signature" not in got["headers"]
        assert "is blocked" in got["body"]["text"] and "claude /login" in got["body"]["text"]
        assert "execkit task retry" in got["body"]["text"]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _worker(target: str, owner: str) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("notify_worker.py")), target, owner],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    return worker


def _until(check: Callable[[], bool], what: str, polls: int = 600) -> None:
    """Wait for `check` by a bounded count of polls (no time is asserted)."""
    for _ in range(polls):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def _kill(worker: subprocess.Popen[str]) -> None:
    worker.send_signal(signal.SIGKILL)
    worker.wait(30)
    assert worker.stdout is not None
    worker.stdout.close()


def test_a_sender_killed_while_the_receiver_is_down_and_mid_send_loses_nothing(
    ledger_target: str, opener: Opener
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hook"
    with opener() as ledger:
        endpoint = ledger.add_notify_endpoint(url, events=["*"], secret=SECRET, actor=OWNER, now=0)
        ids = _events(ledger)
        other = ledger.create_task("second issue", actor="d", now=20).id
        ledger.record_give_up(other, state="Blocked", actor="d", now=21)
        ids = [e.id for e in ledger.notify_events()]
        subjects = {e.id: e.subject for e in ledger.notify_events()}

        def shown() -> Any:
            [found] = ledger.notify_endpoints()
            return found

        # The receiver is down: the first event fails and waits; the sender is killed.
        first = _worker(ledger_target, "dispatch@one")
        try:
            _until(lambda: shown().last_error is not None, "a failed try recorded")
        finally:
            _kill(first)
        assert shown().delivered == 0
        with receiving(SECRET, port) as receiver:
            # Up, but its first answer never comes: killed mid-send (sent, not settled).
            receiver.scripts["/hook"] = ["hang"]
            second = _worker(ledger_target, "dispatch@two")
            try:
                _until(receiver.hanging.is_set, "a send in flight")
            finally:
                _kill(second)
            receiver.released.set()
            third = _worker(ledger_target, "dispatch@three")
            try:
                _until(lambda: shown().backlog == 0, "every event delivered")
            finally:
                _kill(third)
        assert receiver.bad_signatures == 0
        # Each event once by id (the one in flight was sent again: the receiver
        # de-duplicates), none lost, in order, so in order per issue.
        assert receiver.ids("/hook") == ids
        sent = [r["headers"]["x-execkit-event-id"] for r in receiver.got]
        assert sent.count(ids[0]) == 2 and len(sent) == len(ids) + 1
        for subject in set(subjects.values()):
            mine = [i for i in ids if subjects[i] == subject]
            assert [i for i in receiver.ids("/hook") if subjects[i] == subject] == mine
        final = shown()
        assert (final.id, final.delivered, final.failed) == (endpoint.id, len(ids), 0)
