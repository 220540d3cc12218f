"""Reset times: how long until a limit the vendor stated lifts (`stated_wait_s`).

The forms read: `Retry-After: 30`, `retry-after-ms: 1500`, `"retryDelay": "17s"`,
`retryDelayMs: 17000`, `try again in 14.036s`, `Please retry in 7200.0s`, `try again in 4
days 10 hours 3 minutes`, `reset after 2h52m39s`, `"resets_in_seconds": 4123`,
`"resets_at": 1796313600` and `usage limit reached|1753459200` (epoch seconds),
`"resets_at": "2026-12-04T16:00:00Z"` / `resets at 2026-12-04 16:00` (ISO 8601), and codex's
`try again at 4:00 PM` / `try again at Dec 4th, 2026 4:00 PM` (the local time of this
machine, which is the CLI's: codex prints the bare time only for a reset later the same
day), and claude's `resets 3:31pm`, `resets 1pm (Europe/Lisbon)`, `resets at Dec 4, 3:31pm
(UTC)`, `resets Dec 4` (a bare time is the next one within 24 h, in the zone it names or
this machine's). The last one in the text wins. A CLI's own backoff (`Retrying in 8 seconds`,
`Retrying after 17268ms`) is not the vendor's reset and is not read.

A stated time has a granularity, and it means "not before the end of it" (issue 52): codex
prints its reset rounded *down* to the minute (chrono's `%-I:%M %p`), so `try again at 3:52
AM` is a reset somewhere in 3:52:00..3:52:59 and is read as 3:53:00; claude's formatter
leaves the minute out when it is 0, so `resets 1pm` is the minute 13:00 (read as 13:01),
and a date alone is read to the end of that day; an epoch in whole seconds (`resets_at`,
`|<epoch>`, claude's `resetsAt`) is read as the end of that second.
So a reset inside the current minute waits until the minute ends instead of reading as
"now". A stated reset still past after that (a stale message, or clocks that disagree)
gives no wait at all (`None`), never 0: the verdict it belongs to is unchanged (upstream),
and the caller's own backoff and breaker apply, as for a refusal that states no reset.

The classifier reads a reset for two things (scan.py): the `retry_after_s` of an upstream
verdict, and whether an account limit lifts at a stated time (a reset stated after the
limit turns its veto into an upstream verdict). There, a reset on a stale retry notice
(notices.py) is skipped. The patterns follow patterns.py: each starts with a literal, every
gap and repeat is bounded, so reading the resets of a text is linear in its length.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import time
import zoneinfo

from execkit._classify import patterns
from execkit._classify.notices import NoticeIndex

_UNIT = (
    r"(?:milliseconds?|msecs?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)"
    r"(?![a-z])"
)
_NUMBER = r"\d{1,9}(?:\.\d{1,6})?"
# One to four `<number><unit>` parts (`4 days 10 hours 3 minutes`, `2h52m39s`), or one bare
# number (seconds, or milliseconds after an `-ms` key) not followed by a word.
_DURATION = (
    rf"(?P<dur>(?:{_NUMBER}[ \t]{{0,2}}{_UNIT}(?:,?[ \t]{{0,2}}(?:and[ \t]{{1,2}})?)){{1,4}}"
    rf"|{_NUMBER}(?![ \t]{{0,2}}[a-z\d.]))"
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WAIT_SEP = r"[\"']?[ \t]{0,4}[:=]?[ \t]{0,4}[\"']?"
# claude's reset as its formatter prints it (claude-code 2.1.332, `JN` in the bundle): a
# time within the next 24 h as `3:31pm` or, on the hour, `1pm` (the minute left out when
# it is 0: still a time to the minute); further out with the date, `Dec 4, 3:31pm`, and the
# year when it is not this one, `Dec 4, 2027, 3pm`; a date alone, `Dec 4`; then the zone it
# was printed in, `(Europe/Lisbon)`, or none (this machine's). After `resets`, `resets at`
# (its usage-limit sentence) or `reset at` (older versions' "Your limit will reset at").
_FULL_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_CLAUDE_RESET = (
    rf"(?P<resets>reset)s?(?: at)? (?:(?P<mon>{_FULL_MONTHS})\.? (?P<day>\d{{1,2}})\b"
    r"(?:,? (?P<year>\d{4})\b)?(?:,? (?=\d))?)?"
    r"(?:(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?[ \t]?(?P<ampm>am|pm)\b)?"
    r"(?:[ \t]{0,2}\((?P<zone>[a-z][a-z0-9_+\-/]{0,63})\))?"
)
# Each pattern starts with a literal, so the engine finds candidates with a fast prefix
# search (one alternation over all of them would try every position).
WAIT_SOURCES = (
    # A relative wait after a key or phrase.
    r"retry(?:[-_ ]?after(?P<ms1>[-_]?ms)?|[-_ ]?delay(?P<ms2>[-_]?ms)?| (?:in|after))"
    rf"{_WAIT_SEP}{_DURATION}",
    r"reset(?:s? (?:in|after)|s?_in_seconds)"
    rf"{_WAIT_SEP}{_DURATION}"
    # An absolute reset in epoch seconds.
    r"|resets?_at[\"']?[ \t]{0,2}[:=][ \t]{0,2}[\"']?(?P<epoch>\d{9,11})(?!\d)"
    # An absolute reset as an ISO 8601 time, to the minute, second or a fraction of one.
    r"|resets?(?:_at|[ \t]at)[\"']?[ \t]{0,2}[:=]?[ \t]{0,2}[\"']?"
    r"(?P<iso>\d{4}-\d{2}-\d{2}[t ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?"
    r"(?:z|[+-]\d{2}:?\d{2})?)(?![\d:.])",
    r"usage limit reached\|(?P<epoch>\d{9,11})(?!\d)",
    # codex's local wall-clock reset (with the date when it is not today), or a duration.
    rf"try again (?:(?:in|after){_WAIT_SEP}{_DURATION}"
    rf"|at (?:(?P<mon>{'|'.join(_MONTHS)})[a-z]{{0,6}}\.? (?P<day>\d{{1,2}})"
    r"(?:st|nd|rd|th)?,? (?P<year>\d{4}),? )?(?P<hour>\d{1,2}):(?P<minute>\d{2})"
    r"[ \t]{0,2}(?P<ampm>am|pm)\b)",
    _CLAUDE_RESET,
)
PART_SOURCE = rf"({_NUMBER})[ \t]{{0,2}}({_UNIT})?"
# A bare claude time is within the 24 h after it was printed; one whose minute ended up to
# this long ago is that message read late (stale), not a reset a day away. Short, because
# it is read as the CLI exits: a longer one would take a reset 23 h 58 min away for stale.
_STALE_CLOCK_S = 60.0


def _unit_seconds(unit: str | None, default: float) -> float:
    if not unit:
        return default
    if unit.startswith(("ms", "msec", "milli")):
        return 0.001
    if unit.startswith("s"):
        return 1.0
    if unit.startswith("m"):
        return 60.0
    if unit.startswith("h"):
        return 3600.0
    return 86400.0


def _duration_seconds(text: str, default_unit: float) -> float:
    return sum(
        float(part.group(1)) * _unit_seconds(part.group(2), default_unit)
        for part in patterns.compiled(PART_SOURCE).finditer(text)
    )


MINUTE_S = 60.0
"""The granularity of a time printed to the minute (`H:MM`)."""
SECOND_S = 1.0
"""The granularity of an epoch stated in whole seconds."""


def wait_until(reset: float, now: float, granularity_s: float = 0.0) -> float | None:
    """Seconds from `now` until the end of a stated reset: `reset` (epoch seconds, the start
    of what was printed) plus its `granularity_s` (`MINUTE_S` for a time printed to the
    minute, `SECOND_S` for an epoch in whole seconds, 0 for an exact one).

    None when that end is not after `now` (a reset already past: no stated wait, never a
    wait of 0) or when any value is not finite. Never raises for floats.
    """
    try:
        wait = float(reset) + granularity_s - now
    except (OverflowError, TypeError, ValueError):
        return None
    return wait if math.isfinite(wait) and wait > 0 else None


def epoch_wait(reset: float, now: float) -> float | None:
    """`wait_until` for a vendor's epoch: to the end of its second when it is a whole
    number of seconds (`1753459200`: floored, the true reset may lie up to a second on),
    to the value itself when it has a fraction; None when past or not finite."""
    if not math.isfinite(reset):
        return None
    return wait_until(reset, now, SECOND_S if float(reset).is_integer() else 0.0)


def _clock_reset(match: re.Match[str], now: float) -> float | None:
    """The epoch of codex's `try again at [Mon Dth, YYYY ]H:MM AM|PM` in local time: the
    start of the printed minute (the later one of a wall time a DST change repeats)."""
    hour, minute = int(match.group("hour")), int(match.group("minute"))
    if not (1 <= hour <= 12 and minute <= 59):
        return None
    hour = hour % 12 + (12 if match.group("ampm") == "pm" else 0)
    if match.group("mon"):
        year = int(match.group("year"))
        month = _MONTHS.index(match.group("mon")) + 1
        day = int(match.group("day"))
    else:
        today = time.localtime(now)
        year, month, day = today.tm_year, today.tm_mon, today.tm_mday
    try:
        # A naive datetime's timestamp is local time; fold=1 takes the later of the two
        # instants a DST change gives one wall time, so the wait is never early.
        return datetime.datetime(year, month, day, hour, minute, fold=1).timestamp()
    except (OverflowError, OSError, ValueError):
        return None


@functools.cache
def _zone_names() -> dict[str, str]:
    """Every IANA zone name this machine knows, by its lowered form (the tail is lowered)."""
    return {name.lower(): name for name in zoneinfo.available_timezones()}


def _zone(name: str | None) -> datetime.tzinfo | bool | None:
    """The zone a claude reset names (None: none named, local time), or False when it
    names one this machine does not know (the time cannot be read)."""
    if name is None:
        return None
    if name in ("utc", "gmt", "etc/utc", "z"):
        return datetime.UTC
    key = _zone_names().get(name)
    if key is None:
        return False
    try:
        return zoneinfo.ZoneInfo(key)
    except (OSError, ValueError):
        return False


def _claude_start(
    zone: datetime.tzinfo | None, year: int, month: int, day: int, hour: int, minute: int
) -> float | None:
    """The epoch of a wall time in `zone` (None: local), the later of a repeated one."""
    try:
        return datetime.datetime(year, month, day, hour, minute, fold=1, tzinfo=zone).timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def _claude_reset(match: re.Match[str], now: float) -> tuple[float, float] | None:
    """(start, granularity) of claude's `resets [Mon D[, YYYY], ]H[:MM]am|pm [(Zone)]`, or
    None when the text holds no date or time, or names an unknown zone."""
    groups = match.groupdict()
    has_time = groups.get("hour") is not None
    if not has_time and groups.get("mon") is None:
        return None
    zone = _zone(groups.get("zone"))
    if zone is False:
        return None
    tz = zone if isinstance(zone, datetime.tzinfo) else None
    hour = minute = 0
    if has_time:
        hour, minute = int(groups["hour"]), int(groups.get("minute") or 0)
        if not (1 <= hour <= 12 and minute <= 59):
            return None
        hour = hour % 12 + (12 if groups.get("ampm") == "pm" else 0)
    try:
        today = datetime.datetime.fromtimestamp(now, tz)
    except (OverflowError, OSError, ValueError):
        return None
    granularity = MINUTE_S
    if groups.get("mon") is not None:
        month = _MONTHS.index(groups["mon"][:3]) + 1
        year = int(groups["year"]) if groups.get("year") else today.year
        day = int(groups["day"])
        start = _claude_start(tz, year, month, day, hour, minute)
        if start is None or has_time:
            return None if start is None else (start, granularity)
        # A date alone is the whole day: to the next midnight, however long a DST change
        # makes the day.
        try:
            after = datetime.date(year, month, day) + datetime.timedelta(days=1)
        except (OverflowError, ValueError):
            return None
        end = _claude_start(tz, after.year, after.month, after.day, 0, 0)
        return None if end is None else (start, end - start)
    # A bare time: the first of yesterday's, today's and tomorrow's whose minute ended no
    # more than _STALE_CLOCK_S ago (within that, it is stale: wait_until gives None).
    for offset in (-1, 0, 1):
        date = today.date() + datetime.timedelta(days=offset)
        start = _claude_start(tz, date.year, date.month, date.day, hour, minute)
        if start is not None and start + granularity > now - _STALE_CLOCK_S:
            return start, granularity
    return None


def _iso_reset(text: str) -> tuple[float, float] | None:
    """(start, granularity) of an ISO 8601 reset: to the minute (60 s), the second (1 s) or
    a fraction of one (exact); without an offset it is local time (the later of a repeated
    wall time). None when it is not a real time."""
    try:
        when = datetime.datetime.fromisoformat(text.upper())
    except ValueError:
        return None
    clock = text[11:]
    if "." in clock:
        granularity = 0.0
    elif clock[:8].count(":") == 2:
        granularity = SECOND_S
    else:
        granularity = MINUTE_S
    if when.tzinfo is None:
        when = when.replace(fold=1)
    try:
        return when.timestamp(), granularity
    except (OverflowError, OSError, ValueError):
        return None


def _wait_of(match: re.Match[str], now: float) -> float | None:
    groups = match.groupdict()
    duration = groups.get("dur")
    if duration is not None:
        millis = bool(groups.get("ms1") or groups.get("ms2"))
        return _duration_seconds(duration, 0.001 if millis else 1.0)
    if groups.get("epoch") is not None:
        return epoch_wait(float(groups["epoch"]), now)
    if groups.get("iso") is not None:
        iso = _iso_reset(groups["iso"])
        return None if iso is None else wait_until(iso[0], now, iso[1])
    if groups.get("resets") is not None:
        found = _claude_reset(match, now)
        return None if found is None else wait_until(found[0], now, found[1])
    if groups.get("hour") is None:
        return None
    reset = _clock_reset(match, now)
    return None if reset is None else wait_until(reset, now, MINUTE_S)


def _readable(match: re.Match[str], now: float) -> bool:
    """Whether the match states a reset at all (a well-formed duration, epoch or time),
    past or not."""
    groups = match.groupdict()
    if groups.get("dur") is not None or groups.get("epoch") is not None:
        return True
    if groups.get("iso") is not None:
        return _iso_reset(groups["iso"]) is not None
    if groups.get("resets") is not None:
        return _claude_reset(match, now) is not None
    return groups.get("hour") is not None and _clock_reset(match, now) is not None


def last_wait(
    low: str, now: float, skip: NoticeIndex | None = None
) -> tuple[int, float | None] | None:
    """(offset, seconds) of the last reset stated in lowered `low`, stale notices skipped;
    the seconds are None for a reset already past (it was stated: a limit it follows still
    lifts, but there is nothing to wait for)."""
    found: tuple[int, float | None] | None = None
    for source in WAIT_SOURCES:
        for match in patterns.compiled(source).finditer(low):
            if found is not None and match.start() <= found[0]:
                continue
            if skip is not None and skip.is_stale_notice(match.start()):
                continue
            if not _readable(match, now):
                continue
            wait = _wait_of(match, now)
            found = (match.start(), wait if wait is not None and math.isfinite(wait) else None)
    return found


def stated_wait_s(text: str | None, *, now: float | None = None) -> float | None:
    """Seconds until the last reset `text` states (see "Reset times"); None when none.

    `now` is the clock for absolute resets (epoch seconds, default `time.time()`); an
    absolute reset is read to the end of its granularity, and one still past after that is
    None (not 0). Linear time; never raises for any str.
    """
    if not text:
        return None
    found = last_wait(patterns.lowered(text), time.time() if now is None else now)
    return None if found is None else found[1]
