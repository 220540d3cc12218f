"""The lane model (issue #28), pure: names and fingerprints, the configuration's ranges,
the fold from events to state, and its properties under any interleaving (hypothesis)."""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from execkit._errors import InvalidInput
from execkit._lanes import (
    DEFAULT_LANES,
    LaneConfig,
    LaneEvent,
    LaneEventKind,
    LaneKey,
    LaneState,
    LaneSummary,
    credential_fingerprint,
    credential_material,
    fold,
    host_lane,
    lane_for,
    open_lane,
    step,
    view,
)

LANE = "claude/default"


def _event(kind: str, at: float, **kw: object) -> LaneEvent:
    return LaneEvent(lane=LANE, kind=LaneEventKind(kind), at=at, **kw)  # type: ignore[arg-type]


# -- names --------------------------------------------------------------------------------


def test_any_host_name_names_one_host_lane() -> None:
    # The owner's host is a client's word: whatever it is, admission and the stop name the
    # same valid lane from it, and a name already valid is kept as it is.
    assert host_lane(LANE, "build-7.example") == "claude/default@build-7.example"
    assert host_lane(LANE, "my host/ü") == "claude/default@my-host--"
    assert host_lane(LANE, "-x") == "claude/default@h-x"
    assert host_lane(LANE, "") == "claude/default@h"
    long = host_lane(LANE, "a" * 400)
    assert LaneKey.parse(long).host == "a" * 253
    with pytest.raises(InvalidInput):
        host_lane("claude", "h")


def test_a_lane_name_round_trips_and_bad_names_are_refused() -> None:
    key = LaneKey("claude", "0123456789abcdef", "build-7")
    assert str(key) == "claude/0123456789abcdef@build-7"
    assert LaneKey.parse(str(key)) == key
    assert LaneKey.parse("gemini/default") == LaneKey("gemini")
    assert str(key.without_host()) == "claude/0123456789abcdef"
    for bad in ("claude", "Claude/default", "claude/secret", "claude/default@", "/default", 7):
        with pytest.raises(InvalidInput) as caught:
            LaneKey.parse(bad)
        assert caught.value.field == "lane"


def test_the_fingerprint_is_keyed_and_never_the_secret(tmp_path: object) -> None:
    secret = "sk-ant-api03-" + "x" * 40
    env = {"ANTHROPIC_API_KEY": secret}
    one = lane_for("claude", key="ledger-1", env=env, credential_env=["ANTHROPIC_API_KEY"])
    same = lane_for("claude", key="ledger-1", env=env, credential_env=["ANTHROPIC_API_KEY"])
    other_ledger = lane_for("claude", key="ledger-2", env=env, credential_env=["ANTHROPIC_API_KEY"])
    assert one == same and one != other_ledger
    assert secret not in str(one) and len(one.credential) == 16
    assert lane_for("claude", key="ledger-1", env={}, credential_env=["ANTHROPIC_API_KEY"]) == (
        LaneKey("claude", "default")
    )
    assert credential_fingerprint([], "k") == "default"
    # Name and value are length-prefixed: moving bytes between them changes the digest.
    assert credential_fingerprint([("ab", b"c")], "k") != credential_fingerprint(
        [("a", b"bc")], "k"
    )


def test_credential_files_are_read_and_missing_ones_are_no_credential(tmp_path: object) -> None:
    from pathlib import Path

    home = Path(str(tmp_path))
    (home / ".creds.json").write_bytes(b'{"token": "abc"}')
    found = credential_material({"HOME": str(home)}, ["UNSET"], ["~/.creds.json", "~/missing.json"])
    assert found == [("file:~/.creds.json", b'{"token": "abc"}')]


@pytest.mark.parametrize(
    "field,value",
    [
        ("breaker_k", 0),
        ("breaker_k", 1001),
        ("breaker_k", True),
        ("breaker_window_s", 0.5),
        ("breaker_window_s", 86401),
        ("breaker_window_s", float("nan")),
        ("cool_base_s", 0),
        ("max_park_s", 59),
        ("max_park_s", 3e6),
    ],
)
def test_config_out_of_range_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        LaneConfig(**{field: value})  # type: ignore[arg-type]
    assert caught.value.field == field


def test_cool_max_below_cool_base_is_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        LaneConfig(cool_base_s=60, cool_max_s=30)
    assert caught.value.field == "cool_max_s"


# -- the fold, case by case ---------------------------------------------------------------


def test_a_stated_reset_parks_then_half_opens_for_one_probe() -> None:
    lane = step(open_lane(LANE), _event("reset", 100, until=160.0, run_id="r-1"))
    assert (lane.state, lane.until, lane.trips) == (LaneState.PARKED, 160.0, 1)
    assert not view(lane, 159).admits and view(lane, 159).opens_at == 160.0
    at_reset = view(lane, 160)
    assert (at_reset.state, at_reset.admits, at_reset.probe) == (LaneState.HALF_OPEN, True, True)
    probing = step(lane, _event("probe", 160, run_id="r-2"))
    assert not view(probing, 161).admits  # the others wait for the probe's result
    opened = step(probing, _event("success", 170, run_id="r-2"))
    assert opened.state is LaneState.OPEN and view(opened, 170).admits and opened.trips == 0


def test_a_failed_probe_closes_the_lane_again_for_longer() -> None:
    lane = step(open_lane(LANE), _event("reset", 100, until=110.0, run_id="r-1"))
    lane = step(lane, _event("probe", 110, run_id="r-2"))
    again = step(lane, _event("upstream", 111, run_id="r-2"))
    assert again.state is LaneState.COOLING and again.trips == 2
    first_wait = 10.0
    assert again.until is not None and again.until - 111 > first_wait
    lane = step(again, _event("probe", again.until, run_id="r-3"))
    third = step(lane, _event("upstream", again.until + 1, run_id="r-3"))
    assert third.until is not None
    assert third.until - (again.until + 1) > again.until - 111  # longer each time
    # A late upstream failure from a run that is not the probe changes nothing.
    assert step(third, _event("upstream", again.until + 2, run_id="r-9")).state is (
        LaneState.COOLING
    )


def test_a_reset_in_the_past_opens_and_a_far_one_is_capped() -> None:
    past = step(open_lane(LANE), _event("reset", 100, until=50.0, run_id="r-1"))
    assert past.state is LaneState.OPEN
    far = step(open_lane(LANE), _event("reset", 100, until=100 + 10 * 86400.0, run_id="r-1"))
    assert far.state is LaneState.PARKED and far.capped
    assert far.until == 100 + DEFAULT_LANES.max_park_s


def test_k_upstream_failures_within_w_trip_the_breaker_across_tasks() -> None:
    config = LaneConfig(breaker_k=3, breaker_window_s=60)
    lane = open_lane(LANE)
    lane = step(lane, _event("upstream", 0, task_id="t-1"), config)
    lane = step(lane, _event("upstream", 70, task_id="t-2"), config)  # the first left W
    lane = step(lane, _event("upstream", 80, task_id="t-3"), config)
    assert lane.state is LaneState.OPEN and lane.failures == (70.0, 80.0)
    lane = step(lane, _event("upstream", 90, task_id="t-4"), config)
    assert lane.state is LaneState.COOLING and lane.until == 90 + config.cool_base_s


def test_a_stop_holds_until_an_operator_resumes_it() -> None:
    lane = step(
        open_lane(LANE),
        _event("stop", 5, run_id="r-1", task_id="t-1", reason="run `claude /login`"),
    )
    assert lane.state is LaneState.STOPPED and lane.stopped_task == "t-1"
    late = step(lane, _event("success", 6, run_id="r-0"))
    assert late.state is LaneState.STOPPED and not view(late, 1e12).admits
    assert step(late, _event("resume", 7, actor="op")).state is LaneState.OPEN


def test_an_abandoned_probe_frees_the_probe_slot() -> None:
    lane = step(open_lane(LANE), _event("reset", 0, until=10.0, run_id="r-1"))
    lane = step(lane, _event("probe", 10, run_id="r-2"))
    assert not view(lane, 11).admits
    freed = step(lane, _event("abandon", 400, run_id="r-2"))
    assert view(freed, 400).admits and view(freed, 400).probe


# -- properties ---------------------------------------------------------------------------

_KINDS = st.sampled_from(list(LaneEventKind))


@st.composite
def _histories(draw: st.DrawFn) -> list[LaneEvent]:
    count = draw(st.integers(0, 40))
    at = 0.0
    events = []
    for _ in range(count):
        at += draw(st.floats(0, 200, allow_nan=False))
        kind = draw(_KINDS)
        until = None
        if kind in (LaneEventKind.RESET, LaneEventKind.PARK):
            until = at + draw(st.floats(-100, 4e6, allow_nan=False))
        events.append(
            LaneEvent(
                lane=LANE,
                kind=kind,
                at=at,
                run_id=f"r-{draw(st.integers(1, 5))}",
                task_id=f"t-{draw(st.integers(1, 3))}",
                until=until,
            )
        )
    return events


_CONFIGS = st.builds(
    LaneConfig,
    breaker_k=st.integers(1, 5),
    breaker_window_s=st.floats(1, 600),
    cool_base_s=st.floats(1, 60),
    cool_max_s=st.just(3600.0),
    max_park_s=st.floats(60, 86400),
)


@settings(max_examples=300, deadline=None)
@given(_histories(), _CONFIGS, st.floats(0, 1e5))
def test_any_history_folds_to_a_bounded_valid_state(
    events: list[LaneEvent], config: LaneConfig, now: float
) -> None:
    lane = fold(LANE, events, config)
    assert lane.events == len(events)
    assert len(lane.failures) < config.breaker_k
    if lane.state in (LaneState.PARKED, LaneState.COOLING):
        # Nothing parks for ever: every wait ends within the cap of the event that set it.
        assert lane.until is not None and lane.updated_at is not None
        assert lane.until <= lane.updated_at + max(config.max_park_s, config.cool_max_s)
    if lane.state is LaneState.OPEN:
        assert lane.probe_run is None and lane.until is None
    shown = view(lane, now)
    assert shown.admits == (
        lane.state is LaneState.OPEN
        or (lane.state is LaneState.HALF_OPEN and lane.probe_run is None)
        or (
            lane.state in (LaneState.PARKED, LaneState.COOLING)
            and lane.until is not None
            and lane.until <= now
        )
    )


@settings(max_examples=200, deadline=None)
@given(_histories(), _CONFIGS)
def test_the_stored_state_step_by_step_equals_the_fold_of_the_history(
    events: list[LaneEvent], config: LaneConfig
) -> None:
    # What the ledger does (one step per event, stored between) is what `db check` redoes.
    stored = open_lane(LANE)
    for event in events:
        stored = LaneSummary(**attrs.asdict(step(stored, event, config), recurse=False))
    assert stored == fold(LANE, events, config)


@settings(max_examples=200, deadline=None)
@given(_histories())
def test_a_success_or_a_resume_always_opens_a_lane_that_is_not_stopped(
    events: list[LaneEvent],
) -> None:
    lane = fold(LANE, events)
    resumed = step(lane, _event("resume", 1e9, actor="op"))
    assert resumed.state is LaneState.OPEN
    succeeded = step(lane, _event("success", 1e9))
    assert succeeded.state is (
        LaneState.STOPPED if lane.state is LaneState.STOPPED else LaneState.OPEN
    )
