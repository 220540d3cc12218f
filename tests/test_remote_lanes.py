"""Vendor lanes through `execkit serve` (issue #28): two clients of one server share a lane,
lane refusals come back typed with their lane and time, the operator's routes work, and a
server without `vendor.lanes` is never sent a lane."""

from __future__ import annotations

import pytest
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit._errors import InvalidInput, LaneStopped, LaneWaiting, StorageError
from execkit._lanes import LaneConfig, LaneState
from execkit.ledger import LANES_CAPABILITY

LANE = "claude/default"


def test_two_clients_of_one_server_share_a_lane(remote: Remote) -> None:  # noqa: F811
    first, second = remote.client(), remote.client("memory")
    a = first.create_task("a", actor=ME)
    b = second.create_task("b", actor=ME)
    run = first.start_run(a.id, request_key="1", actor=ME, lane=LANE)
    first.finish_run(
        run.id,
        "failed",
        failure_class="upstream",  # type: ignore[arg-type]
        reason="usage limit",
        not_before=run.started_at + 3600,
        lane_cause="reset",
    )
    with pytest.raises(LaneWaiting) as refused:
        second.start_run(b.id, request_key="2", actor=ME, lane=LANE)
    reset = run.started_at + 3600
    assert refused.value.lane == LANE and refused.value.opens_at is not None
    assert reset + 2 <= refused.value.opens_at < reset + 4  # the probe's margin past it
    assert second.runs(b.id) == []
    shown = second.get_lane(LANE)
    assert shown == remote.ledger.get_lane(LANE, now=shown.updated_at)
    assert shown.state is LaneState.PARKED
    assert [lane.lane for lane in first.list_lanes()] == [LANE]
    assert [event.kind for event in first.lane_history(LANE)] == ["reset"]
    assert first.task_lane(a.id) is not None and first.task_lane(b.id) is None
    # Read together (a task a request through the API), as the ledger reads them.
    together = first.task_lanes([a.id, b.id, "t-999999"])
    assert list(together) == [a.id] and together[a.id].state is LaneState.PARKED
    assert together == remote.ledger.task_lanes([a.id, b.id], now=together[a.id].updated_at)


def test_a_stopped_lane_comes_back_with_its_fix_and_resumes(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    other = client.create_task("u", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME, lane=LANE)
    client.finish_run(
        run.id,
        "failed",
        failure_class="environment",  # type: ignore[arg-type]
        reason="run `claude /login`",
        lane_cause="credentials",
    )
    with pytest.raises(LaneStopped) as stopped:
        client.start_run(other.id, request_key="2", actor=ME, lane=LANE)
    assert stopped.value.fix == "run `claude /login`" and stopped.value.lane == LANE
    assert client.resume_lane(LANE, actor=ME, reason="logged in").state is LaneState.OPEN
    assert client.start_run(other.id, request_key="3", actor=ME, lane=LANE).attempt == 1
    parked = client.park_lane(LANE, until=run.started_at + 600, actor=ME)
    assert parked.state is LaneState.PARKED


@pytest.mark.parametrize("remote", [frozenset({LANES_CAPABILITY})], indirect=True)
def test_a_server_without_lanes_is_never_sent_a_lane(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    with pytest.raises(StorageError, match=r"does not advertise vendor\.lanes"):
        client.start_run(task.id, request_key="1", actor=ME, lane=LANE)
    assert remote.ledger.runs(task.id) == []
    with pytest.raises(StorageError, match=r"vendor\.lanes"):
        client.list_lanes()
    run = client.start_run(task.id, request_key="2", actor=ME)  # without a lane: as before
    assert run.attempt == 1


def test_the_lanes_configuration_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    assert client.lane_config() == LaneConfig()
    changed = client.set_lane_config(actor=ME, breaker_k=7, cool_max_s=900)
    assert (changed.breaker_k, changed.cool_max_s) == (7, 900)
    # It is the ledger's: the server's own ledger and every other client read the same.
    assert remote.ledger.lane_config() == changed == remote.client("memory").lane_config()
    with pytest.raises(InvalidInput, match=r"breaker_k must be an integer in 1\.\.1000"):
        client.set_lane_config(actor=ME, breaker_k=0)
    assert remote.ledger.lane_config() == changed
    [entry] = [e for e in remote.ledger.audit_events() if e.action == "lane.config"]
    assert entry.detail["to"]["breaker_k"] == 7


@pytest.mark.parametrize("remote", [frozenset({LANES_CAPABILITY})], indirect=True)
def test_a_server_without_lanes_is_never_sent_a_lane_config(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    with pytest.raises(StorageError, match=r"vendor\.lanes"):
        client.set_lane_config(actor=ME, breaker_k=7)
    assert remote.ledger.lane_config() == LaneConfig()
