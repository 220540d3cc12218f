"""A stated reset is read to the end of what was printed (issue 52, item 1).

Codex prints its usage-limit reset rounded *down* to the minute (`try again at 3:52 AM`,
chrono's `%-I:%M %p`, with `%b %-d<suffix>, %Y` before it when the reset is not today);
claude prints `resets 3:31pm`, `resets 1pm` (the minute left out when it is 0), `resets Dec
4, 3:31pm`, `resets Dec 4` (its `JN` formatter), with the zone in parentheses; epochs are
whole seconds. For any clock and any true reset the printed text could stand for, the wait
read from it (a wall-clock time, a date, an epoch, an ISO 8601 time) is never earlier
than that reset, never 0 while the printed time has not ended, and at most one granularity
later; a printed time already over is no wait (None),
never 0. Each property runs with the local zone set (the codex form is local time).
"""

from __future__ import annotations

import datetime
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from zoneinfo import ZoneInfo

import attrs
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from execkit._classify import FailureClass, classify_text, stated_wait_s
from execkit.adapterkit import header_wait_s, reset_wait_s

# 2020-01-01 .. 2035-01-01 (UTC): every clock the properties try, to the millisecond (a
# float a hair below a minute would print, through datetime's microsecond rounding, as
# the next one: the printer under test, not the reader).
NOWS = st.integers(min_value=1_577_836_800_000, max_value=2_051_222_400_000).map(
    lambda ms: ms / 1000
)
# Three zones without a DST change and one with a 45-minute offset that has one (Chatham:
# 02:45..03:44 repeats each April); a printed wall time the change repeats is read as its
# later instant (never early: test_a_repeated_wall_hour_takes_the_later_instant).
ZONES = ("UTC", "Asia/Kolkata", "America/Phoenix", "Pacific/Chatham")
MINUTE = 60.0


@contextmanager
def local_zone(name: str) -> Iterator[None]:
    """This process's local time zone set to `name` (TZ and tzset), restored after."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


def _suffix(day: int) -> str:
    if 11 <= day % 100 <= 13:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def codex_prints(reset: float, now: float) -> str:
    """codex 0.171.0's usage-limit sentence for `reset`, printed at `now` in local time."""
    local = datetime.datetime.fromtimestamp(reset)
    clock = f"{local.hour % 12 or 12}:{local.minute:02d} {'AM' if local.hour < 12 else 'PM'}"
    if local.date() != datetime.datetime.fromtimestamp(now).date():
        clock = f"{local:%b} {local.day}{_suffix(local.day)}, {local.year} {clock}"
    return (
        "You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), "
        f"visit https://chatgpt.com/settings/usage to purchase more credits or try again at "
        f"{clock}."
    )


def claude_prints(reset: float, now: float, zone: str, *, with_time: bool = True) -> str:
    """claude-code 2.1.332's `JN(reset, true)` in `zone`: a bare time within 24 h, else the
    date (and the year when it is not this one); the minute left out when it is 0."""
    tz = ZoneInfo(zone)
    at = datetime.datetime.fromtimestamp(reset, tz)
    clock = f"{at.hour % 12 or 12}" + (f":{at.minute:02d}" if at.minute else "")
    clock += "am" if at.hour < 12 else "pm"
    if with_time and reset - now <= 86400:
        shown = clock
    else:
        shown = f"{at:%b} {at.day}"
        if at.year != datetime.datetime.fromtimestamp(now, tz).year:
            shown += f", {at.year}"
        if with_time:
            shown += f", {clock}"
    return f"You've hit your 5-hour limit · resets {shown} ({zone})"


def _floor(reset: float, granularity: float, zone: datetime.tzinfo | None = None) -> float:
    """The start of the printed unit holding `reset` (a minute, or a day in `zone`)."""
    if granularity == MINUTE:
        return math.floor(reset / MINUTE) * MINUTE
    day = datetime.datetime.fromtimestamp(reset, zone).date()
    return datetime.datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


def _printed_minute(reset: float, zone: datetime.tzinfo | None = None) -> float:
    """The start of the minute a clock in `zone` (None: local time) prints for `reset`,
    read back as a reader must: the later of the two instants when a DST change repeats
    that wall minute, else the minute holding `reset`."""
    wall = datetime.datetime.fromtimestamp(reset, zone).replace(second=0, microsecond=0)
    return max(_floor(reset, MINUTE), wall.replace(fold=1).timestamp())


def assert_read_to_the_end(
    wait: float | None, reset: float, now: float, start: float, end: float
) -> None:
    """The wait for a reset printed as the unit [start, end) holding `reset`."""
    if end <= now:
        assert wait is None, (wait, reset, now)  # already over: no wait, never 0
        return
    assert wait is not None and wait > 0, (wait, reset, now)
    assert now + wait >= reset - 1e-6, (wait, reset, now)  # never before the true reset
    assert now + wait == pytest.approx(end, abs=1e-3), (wait, reset, now)  # the unit's end


@pytest.mark.parametrize("zone", ZONES)
@settings(max_examples=150, deadline=None)
@given(now=NOWS, ahead=st.floats(min_value=-3 * MINUTE, max_value=3 * 86400.0))
@example(now=1_796_356_320.0, ahead=20.0)  # 03:52:00 UTC: a reset inside the current minute
@example(now=1_796_356_339.5, ahead=0.4)  # the same minute, read later in it
@example(now=1_796_356_320.0, ahead=60.0)  # a reset exactly on the next minute
@example(now=1_796_356_379.99, ahead=-59.0)  # printed in the minute now ending
def test_codex_try_again_at_is_read_to_the_end_of_its_minute(
    zone: str, now: float, ahead: float
) -> None:
    reset = round(now + ahead, 3)
    with local_zone(zone):
        text = codex_prints(reset, now)
        wait = stated_wait_s(text, now=now)
        verdict = classify_text(text, now=now)
        start = _printed_minute(reset)
    assert_read_to_the_end(wait, reset, now, start, start + MINUTE)
    # The usage limit with its reset is upstream whether or not there is a wait left.
    assert verdict.failure_class is FailureClass.UPSTREAM
    assert verdict.retry_after_s == wait


# claude prints a bare time for a reset up to 24 h away: in the last two minutes before
# 24 h the same wall time was also "now" (or just over), and the text cannot say which;
# it is read as the earlier one (the lane's probe then finds the limit still on).
AHEAD_BARE = st.floats(min_value=0.001, max_value=86400.0 - 2 * MINUTE)
AHEAD_DATED = st.floats(min_value=86400.0 + 0.001, max_value=30 * 86400.0)


@pytest.mark.parametrize("zone", [*ZONES, "Europe/Lisbon", "America/New_York"])
@settings(max_examples=150, deadline=None)
@given(now=NOWS, ahead=st.one_of(AHEAD_BARE, AHEAD_DATED))
@example(now=1_796_356_320.0, ahead=20.0)
@example(now=1_796_356_330.0, ahead=50.0)  # 1am exactly: printed `1am`, a minute
def test_claude_resets_is_read_to_the_end_of_its_minute(
    zone: str, now: float, ahead: float
) -> None:
    reset = round(now + ahead, 3)  # claude states a reset still to come
    tz = ZoneInfo(zone)
    wall_ahead = datetime.datetime.fromtimestamp(reset, tz).replace(
        tzinfo=None
    ) - datetime.datetime.fromtimestamp(now, tz).replace(tzinfo=None)
    # The same ambiguity on the wall clock: across a DST change that skips an hour, a bare
    # time less than 24 h away may be more than a wall day away, and today's same time is
    # then the earlier reading (the text cannot say which).
    assume(ahead > 86400.0 or wall_ahead.total_seconds() <= 86400.0 - 2 * MINUTE)
    text = claude_prints(reset, now, zone)
    wait = stated_wait_s(text, now=now)
    start = _printed_minute(reset, ZoneInfo(zone))
    assert_read_to_the_end(wait, reset, now, start, start + MINUTE)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Lisbon", "Asia/Kolkata"])
@settings(max_examples=100, deadline=None)
@given(now=NOWS, ahead=st.floats(min_value=0.001, max_value=60 * 86400.0))
def test_a_claude_date_alone_is_read_to_the_end_of_that_day(
    zone: str, now: float, ahead: float
) -> None:
    reset = round(now + ahead, 3)
    text = claude_prints(reset, now, zone, with_time=False)
    wait = stated_wait_s(text, now=now)
    tz = ZoneInfo(zone)
    start = _floor(reset, 86400.0, tz)
    day = datetime.datetime.fromtimestamp(reset, tz).date() + datetime.timedelta(days=1)
    end = datetime.datetime(day.year, day.month, day.day, tzinfo=tz).timestamp()
    assert start <= reset < end
    assert_read_to_the_end(wait, reset, now, start, end)


@settings(max_examples=200, deadline=None)
@given(now=NOWS, ahead=st.floats(min_value=-5.0, max_value=10 * 86400.0))
@example(now=1_796_356_176.0, ahead=0.86)  # 03:29:36 stated, lifted 0.86 s later (#51.4)
@example(now=1_796_356_176.5, ahead=0.0)
def test_an_epoch_in_whole_seconds_is_read_to_the_end_of_its_second(
    now: float, ahead: float
) -> None:
    reset = round(now + ahead, 3)
    stated = math.floor(reset)  # the vendor floors its epoch to the second
    iso = datetime.datetime.fromtimestamp(stated, datetime.UTC)
    for wait in (
        reset_wait_s(stated, now=now),
        stated_wait_s(f'{{"error": {{"resets_at": {stated}}}}}', now=now),
        stated_wait_s(f"Claude AI usage limit reached|{stated}", now=now),
        stated_wait_s(f'{{"resets_at": "{iso:%Y-%m-%dT%H:%M:%SZ}"}}', now=now),
        stated_wait_s(f"limit resets at {iso:%Y-%m-%d %H:%M:%S}+00:00", now=now),
    ):
        assert_read_to_the_end(wait, reset, now, stated, stated + 1.0)
    # An ISO time to the minute is read to the end of that minute.
    start = _floor(reset, MINUTE)
    minute = stated_wait_s(f'"resets_at": "{iso:%Y-%m-%dT%H:%MZ}"', now=now)
    assert_read_to_the_end(minute, reset, now, start, start + MINUTE)


def test_a_stated_reset_already_over_is_no_wait_and_the_verdict_stays() -> None:
    now = 1_796_356_400.0  # 03:53:20 UTC
    with local_zone("UTC"):
        text = codex_prints(now - 90.0, now)  # `try again at 3:51 AM`: over
        assert "3:51 AM" in text
        verdict = classify_text(text, now=now)
    assert verdict.failure_class is FailureClass.UPSTREAM
    assert verdict.retry_after_s is None
    assert reset_wait_s(now - 1.0, now=now) is None
    assert reset_wait_s(float("nan"), now=now) is None
    assert reset_wait_s(float("inf"), now=now) is None
    assert header_wait_s({"retry-after": "Thu, 03 Dec 2026 16:00:00 GMT"}, now=2e9) is None


def test_a_repeated_wall_hour_takes_the_later_instant() -> None:
    # Europe/Lisbon, 2026-10-25: 01:00..01:59 happens twice (WEST, then WET). A printed
    # `1:30 AM` may be either; the later one is never early.
    later = datetime.datetime(2026, 10, 25, 1, 30, fold=1, tzinfo=ZoneInfo("Europe/Lisbon"))
    now = later.timestamp() - 2 * 3600  # 00:30 WEST, before both
    with local_zone("Europe/Lisbon"):
        wait = stated_wait_s("try again at 1:30 AM.", now=now)
    claude = stated_wait_s("resets 1:30am (Europe/Lisbon)", now=now)
    assert wait == pytest.approx(2 * 3600 + MINUTE)
    assert claude == pytest.approx(2 * 3600 + MINUTE)


def test_a_claude_reset_in_an_unknown_zone_states_nothing() -> None:
    assert stated_wait_s("resets 1pm (Mars/Olympus_Mons)", now=1_796_356_400.0) is None
    assert stated_wait_s("reset decision 3", now=1_796_356_400.0) is None
    # A bare claude time whose minute just ended is that message read late, not tomorrow.
    assert stated_wait_s("resets 3:52am (UTC)", now=1_796_356_400.0) is None


def test_the_vendor_adapters_read_a_reset_against_their_clock() -> None:
    # The seam a replay uses (tests/vendors/replay.py: adapter_for): the same output read at
    # two clocks gives the waits of those clocks, not of the machine's.
    from _support import spawn_result

    from execkit import get_adapter

    now = 1_796_356_330.0  # 03:52:10 UTC
    codex_out = (
        '{"type":"turn.failed","error":{"message":"'
        + codex_prints(now + 20.0, now).replace('"', '\\"')
        + '"}}\n'
    )
    claude_out = (
        '{"type":"rate_limit_event","rate_limit_info":{"status":"rejected",'
        f'"resetsAt":{int(now) + 20}}}}}\n'
        '{"type":"result","subtype":"success","is_error":true,"result":"limit"}\n'
    )
    for name, out, wait in (("codex", codex_out, 50.0), ("claude", claude_out, 21.0)):
        adapter = get_adapter(name)
        result = spawn_result((name,), exit_code=1, stdout=out)
        with local_zone("UTC"):
            at_now = attrs.evolve(adapter, clock=lambda: now).parse(result)  # type: ignore[misc]
            later = attrs.evolve(adapter, clock=lambda: now + 3600).parse(result)  # type: ignore[misc]
        assert at_now.failure_class is FailureClass.UPSTREAM, name
        assert at_now.retry_after_s == pytest.approx(wait), name
        assert at_now.reset_from_structure, name
        # An hour later the same text states a reset long over: upstream, no wait.
        assert later.failure_class is FailureClass.UPSTREAM, name
        assert later.retry_after_s is None, name


def test_claude_s_own_limit_sentence_with_its_reset_is_upstream_until_the_minute_ends() -> None:
    # claude's words for its plan's limits, with the reset its formatter prints (to the
    # minute, `1pm` being 13:00): upstream, waiting until the end of that minute.
    now = datetime.datetime(2026, 12, 4, 12, 59, 30, tzinfo=ZoneInfo("Europe/Lisbon"))
    for text in (
        "You've hit your limit · resets 1pm (Europe/Lisbon)",
        "You've hit your 5-hour limit · resets 1pm (Europe/Lisbon)",
        "Claude usage limit reached. Your limit will reset at 1pm (Europe/Lisbon).",
    ):
        verdict = classify_text(text, now=now.timestamp())
        assert verdict.failure_class is FailureClass.UPSTREAM, text
        assert verdict.reason == "usage limit", text
        assert verdict.retry_after_s == pytest.approx(90.0), text
    # Without a reset it is an account limit: charged, as the text list says.
    assert classify_text("You've hit your limit").failure_class is FailureClass.WORK
