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


LEGACY = LaneConfig(rules=1)  # how lanes folded before the rules of version 2


def test_a_stated_reset_parks_then_half_opens_for_one_probe() -> None:
    lane = step(open_lane(LANE), _event("reset", 100, until=160.0, run_id="r-1"))
    # The probe goes a margin past the second the vendor named (2 s, plus a jitter of up
    # to 2 s drawn from the event): a vendor lifts its limit a little after it.
    margin = DEFAULT_LANES.reset_margin_s
    assert (lane.state, lane.trips) == (LaneState.PARKED, 1)
    assert lane.until is not None and 160 + margin <= lane.until < 160 + 2 * margin
    assert (
        lane.until == step(open_lane(LANE), _event("reset", 100, until=160.0, run_id="r-1")).until
    )
    assert not view(lane, 161).admits and view(lane, 161).opens_at == lane.until
    at_reset = view(lane, lane.until)
    assert (at_reset.state, at_reset.admits, at_reset.probe) == (LaneState.HALF_OPEN, True, True)
    probing = step(lane, _event("probe", lane.until, run_id="r-2"))
    shown = view(probing, lane.until + 1)
    assert shown.state is LaneState.HALF_OPEN and not shown.admits  # the others wait
    opened = step(probing, _event("success", 170, run_id="r-2"))
    assert opened.state is LaneState.OPEN and view(opened, 170).admits and opened.trips == 0
    # Rules 1: the probe went on the second itself.
    legacy = step(open_lane(LANE), _event("reset", 100, until=160.0, run_id="r-1"), LEGACY)
    assert legacy.until == 160.0


def test_a_probe_that_meets_the_stated_limit_again_waits_a_short_while_not_the_breakers() -> None:
    # The vendor lifted its limit 0.86 s after the second it named: the probe met it again
    # and the lane cooled for 60 s (the breaker's doubled cool). Now a short, bounded
    # recheck, growing while the vendor keeps refusing, whether it states the same reset
    # (now past), a new one, or none.
    config = DEFAULT_LANES
    lane = step(open_lane(LANE), _event("reset", 100, until=110.0, run_id="r-1"))
    assert lane.until is not None
    waits = []
    at = lane.until
    for n, (kind, until) in enumerate([("reset", 110.0), ("upstream", None), ("reset", None)]):
        lane = step(lane, _event("probe", at, run_id=f"p-{n}"))
        lane = step(lane, _event(kind, at + 1, run_id=f"p-{n}", until=until or at - 50))
        assert lane.state is LaneState.PARKED and lane.until is not None
        waits.append(lane.until - (at + 1))
        at = lane.until
    assert waits == [config.recheck_wait(2), config.recheck_wait(3), config.recheck_wait(4)]
    assert waits == [5.0, 10.0, 20.0]  # not 60 s and up
    # A new reset further on is waited out (plus the margin), never less than the recheck.
    lane = step(lane, _event("probe", at, run_id="p-9"))
    moved_on = step(lane, _event("reset", at + 1, run_id="p-9", until=at + 600))
    assert moved_on.until is not None and moved_on.until >= at + 600 + config.reset_margin_s


def test_a_failed_probe_after_the_breaker_cools_the_lane_again_for_longer() -> None:
    for config in (DEFAULT_LANES, LEGACY):
        lane = step(open_lane(LANE), _event("reset", 100, until=110.0, run_id="r-1"), config)
        if config is DEFAULT_LANES:  # the breaker's own closing, not a stated limit
            lane = fold(LANE, [_event("upstream", 100 + n, run_id=f"u-{n}") for n in range(3)])
        assert lane.until is not None
        opened = lane.until
        lane = step(lane, _event("probe", opened, run_id="r-2"), config)
        again = step(lane, _event("upstream", opened + 1, run_id="r-2"), config)
        assert again.state is LaneState.COOLING and again.trips == 2
        assert again.until is not None and again.until - (opened + 1) >= config.cooling_wait(2)
        lane = step(again, _event("probe", again.until, run_id="r-3"), config)
        third = step(lane, _event("upstream", again.until + 1, run_id="r-3"), config)
        assert third.until is not None
        assert third.until - (again.until + 1) > again.until - (lane.until or 0) - 1
        # A late upstream failure from a run that is not the probe changes nothing.
        late = step(third, _event("upstream", again.until + 2, run_id="r-9"), config)
        assert late.state is LaneState.COOLING


def test_a_reset_stated_in_the_past_is_no_opening_and_a_far_one_is_capped() -> None:
    # Codex prints its reset rounded down to the minute: read inside that minute, it is
    # already past. It counts as the vendor refusing (toward the breaker), never as "open".
    past = step(open_lane(LANE), _event("reset", 100, until=50.0, run_id="r-1"))
    assert past.state is LaneState.OPEN and past.failures == (100.0,)
    storm = fold(LANE, [_event("reset", 100 + n, until=50.0, run_id=f"r-{n}") for n in range(3)])
    assert storm.state is LaneState.COOLING
    assert step(open_lane(LANE), _event("reset", 100, until=50.0), LEGACY).failures == ()
    far = step(open_lane(LANE), _event("reset", 100, until=100 + 10 * 86400.0, run_id="r-1"))
    assert far.state is LaneState.PARKED and far.capped
    assert far.until == 100 + DEFAULT_LANES.max_park_s


def test_a_lane_that_keeps_closing_stops_for_a_person_after_max_trips() -> None:
    config = LaneConfig(max_trips=3)
    lane = fold(LANE, [_event("upstream", n, run_id=f"u-{n}") for n in range(3)], config)
    for n in range(3):
        assert lane.state is LaneState.COOLING and lane.until is not None
        opened = lane.until
        lane = step(lane, _event("probe", opened, run_id=f"p-{n}"), config)
        lane = step(lane, _event("upstream", opened + 1, run_id=f"p-{n}"), config)
    assert lane.state is LaneState.STOPPED and lane.trips == 4
    assert "4 times in a row" in (lane.reason or "") and not view(lane, 1e12).admits
    assert step(lane, _event("resume", 1e6, actor="op"), config).state is LaneState.OPEN


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
    reset_margin_s=st.floats(0, 300),
    recheck_s=st.floats(1, 60),
    max_trips=st.integers(1, 30),
    rules=st.integers(1, 2),
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
            and lane.probe_run is None
        )
    )
    if config.rules >= 2:
        assert lane.trips <= config.max_trips + 1  # nothing closes without end


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
