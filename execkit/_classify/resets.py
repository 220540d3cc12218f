"""Reset times: how long until a limit the vendor stated lifts (`stated_wait_s`).

The forms read: `Retry-After: 30`, `retry-after-ms: 1500`, `"retryDelay": "17s"`,
`retryDelayMs: 17000`, `try again in 14.036s`, `Please retry in 7200.0s`, `try again in 4
days 10 hours 3 minutes`, `reset after 2h52m39s`, `"resets_in_seconds": 4123`,
`"resets_at": 1796313600` and `usage limit reached|1753459200` (epoch seconds), and codex's
`try again at 4:00 PM` / `try again at Dec 4th, 2026 4:00 PM` (the local time of this
machine, which is the CLI's: codex prints the bare time only for a reset later the same
day). The last one in the text wins; a reset already past waits 0. A CLI's own backoff
(`Retrying in 8 seconds`, `Retrying after 17268ms`) is not the vendor's reset and is not read.

The classifier reads a reset for two things (scan.py): the `retry_after_s` of an upstream
verdict, and whether an account limit lifts at a stated time (a reset stated after the
limit turns its veto into an upstream verdict). There, a reset on a stale retry notice
(notices.py) is skipped. The patterns follow patterns.py: each starts with a literal, every
gap and repeat is bounded, so reading the resets of a text is linear in its length.
"""

from __future__ import annotations

import math
import re
import time

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
# Each pattern starts with a literal, so the engine finds candidates with a fast prefix
# search (one alternation over all of them would try every position).
WAIT_SOURCES = (
    # A relative wait after a key or phrase.
    r"retry(?:[-_ ]?after(?P<ms1>[-_]?ms)?|[-_ ]?delay(?P<ms2>[-_]?ms)?| (?:in|after))"
    rf"{_WAIT_SEP}{_DURATION}",
    r"reset(?:s? (?:in|after)|s?_in_seconds)"
    rf"{_WAIT_SEP}{_DURATION}"
    # An absolute reset in epoch seconds.
    r"|resets?_at[\"']?[ \t]{0,2}[:=][ \t]{0,2}[\"']?(?P<epoch>\d{9,11})(?!\d)",
    r"usage limit reached\|(?P<epoch>\d{9,11})(?!\d)",
    # codex's local wall-clock reset (with the date when it is not today), or a duration.
    rf"try again (?:(?:in|after){_WAIT_SEP}{_DURATION}"
    rf"|at (?:(?P<mon>{'|'.join(_MONTHS)})[a-z]{{0,6}}\.? (?P<day>\d{{1,2}})"
    r"(?:st|nd|rd|th)?,? (?P<year>\d{4}),? )?(?P<hour>\d{1,2}):(?P<minute>\d{2})"
    r"[ \t]{0,2}(?P<ampm>am|pm)\b)",
)
PART_SOURCE = rf"({_NUMBER})[ \t]{{0,2}}({_UNIT})?"


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


def _clock_reset(match: re.Match[str], now: float) -> float | None:
    """The epoch of codex's `try again at [Mon Dth, YYYY ]H:MM AM|PM`, in local time."""
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
        return time.mktime((year, month, day, hour, minute, 0, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def _wait_of(match: re.Match[str], now: float) -> float | None:
    groups = match.groupdict()
    duration = groups.get("dur")
    if duration is not None:
        millis = bool(groups.get("ms1") or groups.get("ms2"))
        return _duration_seconds(duration, 0.001 if millis else 1.0)
    if groups.get("epoch") is not None:
        return float(groups["epoch"]) - now
    if groups.get("hour") is None:
        return None
    reset = _clock_reset(match, now)
    return None if reset is None else reset - now


def last_wait(low: str, now: float, skip: NoticeIndex | None = None) -> tuple[int, float] | None:
    """(offset, seconds) of the last reset stated in lowered `low`, stale notices skipped."""
    found: tuple[int, float] | None = None
    for source in WAIT_SOURCES:
        for match in patterns.compiled(source).finditer(low):
            if found is not None and match.start() <= found[0]:
                continue
            if skip is not None and skip.is_stale_notice(match.start()):
                continue
            wait = _wait_of(match, now)
            if wait is not None and math.isfinite(wait):
                found = (match.start(), max(0.0, wait))
    return found


def stated_wait_s(text: str | None, *, now: float | None = None) -> float | None:
    """Seconds until the last reset `text` states (see "Reset times"); None when none.

    `now` is the clock for absolute resets (epoch seconds, default `time.time()`); a reset
    already past is 0. Linear time; never raises for any str.
    """
    if not text:
        return None
    found = last_wait(patterns.lowered(text), time.time() if now is None else now)
    return None if found is None else found[1]
