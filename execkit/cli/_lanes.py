"""`execkit lane list|show|resume|park|config`: the vendor lanes of a ledger (issue #28),
local or through `--remote`, each with `--json`.

`resume` and `park` need the role `agent.operate` in the ledger and are audited; `resume`
on an open lane changes nothing (and says so); `park` takes `--until` (POSIX seconds or an
ISO-8601 time with its zone) or `--for SECONDS`. `config` shows the lanes' configuration
(the breaker's K and W, the bounds of every wait) with no flag, and changes the fields given
(role `agent.operate`, audited; it lives in the ledger, so every host uses it). Every rule is
the ledger's: this module parses flags and prints.
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Any

from execkit._errors import InvalidInput
from execkit._json import to_json
from execkit._lanes import (
    LaneConfig,
    LaneEvent,
    LaneState,
    LaneSummary,
    LaneView,
    open_lane,
    step,
)
from execkit.cli._args import parse_seconds
from execkit.cli._ledger import _acting, _actor, _common, _using
from execkit.cli._output import emit, print_json, safe_text, utc_stamp, waiting_text

__all__ = ["lane_line", "register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `lane` and its actions."""
    common = _common()
    lane = sub.add_parser("lane", help="vendor lanes: list, show, resume, park")
    lane_sub = lane.add_subparsers(dest="lane_command", metavar="ACTION", required=True)

    listing = lane_sub.add_parser("list", parents=[common], help="every lane the ledger has seen")
    listing.set_defaults(handler=_list)

    show = lane_sub.add_parser("show", parents=[common], help="one lane and its history")
    show.add_argument("lane", metavar="LANE", help="ADAPTER/CREDENTIAL[@HOST]")
    show.set_defaults(handler=_show)

    resume = lane_sub.add_parser(
        "resume",
        parents=[common],
        help="re-open a lane (agent.operate; audited): its tasks run, the stopped one once",
    )
    resume.add_argument("lane", metavar="LANE")
    resume.add_argument("--reason", default=None, help="why (audited)")
    _acting(resume)
    resume.set_defaults(handler=_resume)

    park = lane_sub.add_parser(
        "park", parents=[common], help="park a lane until a time (agent.operate; audited)"
    )
    park.add_argument("lane", metavar="LANE")
    when = park.add_mutually_exclusive_group(required=True)
    when.add_argument("--until", default=None, metavar="TIME", help="POSIX seconds or ISO-8601")
    when.add_argument("--for", dest="for_s", default=None, metavar="SECONDS")
    park.add_argument("--reason", default=None, help="why (shown to its waiting tasks)")
    _acting(park)
    park.set_defaults(handler=_park)

    config = lane_sub.add_parser(
        "config",
        parents=[common],
        help="show, or change (agent.operate; audited), the breaker and the bounds of every wait",
    )
    for flag, field, what in _CONFIG_FLAGS:
        config.add_argument(flag, dest=field, default=None, metavar="N", help=what)
    _acting(config)
    config.set_defaults(handler=_config)


_CONFIG_FLAGS = (
    ("--breaker-k", "breaker_k", "K: upstream failures that cool a lane (1..1000)"),
    ("--breaker-window", "breaker_window_s", "W: seconds they count within (1..86400)"),
    ("--cool-base", "cool_base_s", "seconds of the first cooling (1..3600)"),
    ("--cool-max", "cool_max_s", "longest cooling in seconds (cool-base..86400)"),
    ("--max-park", "max_park_s", "longest park in seconds (60..2592000)"),
    ("--reset-margin", "reset_margin_s", "seconds past a stated reset the probe waits (0..300)"),
    ("--recheck", "recheck_s", "first wait after a probe meets the limit again (1..3600)"),
    ("--max-trips", "max_trips", "closings in a row before a lane stops for a person (1..1000)"),
)


def _until(args: argparse.Namespace) -> float:
    if args.for_s is not None:
        seconds = parse_seconds("--for", args.for_s, allow_zero=False)
        assert seconds is not None
        return time.time() + seconds
    raw = str(args.until).strip()
    try:
        return float(raw) if raw.replace(".", "", 1).isdigit() else _iso(raw)
    except ValueError:
        raise InvalidInput(
            f"--until must be POSIX seconds or an ISO-8601 time with its zone, got {raw!r}",
            field="--until",
        ) from None


def _iso(raw: str) -> float:
    stamp = datetime.datetime.fromisoformat(raw)
    if stamp.tzinfo is None:
        raise ValueError("no zone")
    return stamp.timestamp()


def lane_line(lane: LaneView) -> str:
    opens = utc_stamp(lane.opens_at) if lane.opens_at is not None else "-"
    capped = " (reset capped)" if lane.capped else ""
    return safe_text(f"{lane.lane}  {lane.state:<9}  opens {opens}  {lane.reason or '-'}{capped}")


# How many of a lane's events `lane show` prints (the newest; `--json` has them all).
SHOWN_EVENTS = 20


def _event_line(event: LaneEvent, after: LaneSummary | None) -> str:
    until = f" until {utc_stamp(event.until)}" if event.until is not None else ""
    run = f" {event.run_id}" if event.run_id else ""
    why = f"  {event.reason}" if event.reason else ""
    moved = f"  -> {_state_words(after)}" if after is not None else ""
    return safe_text(
        f"  {utc_stamp(event.at)}  {event.kind}{until}{run} by {event.actor}{why}{moved}"
    )


def _state_words(summary: LaneSummary) -> str:
    """What a lane became: `parked until T (usage limit)`, `cooling until T (breaker: ...)`,
    `stopped (fix ...)`, `half-open (probe r-9)`, `open`."""
    if summary.state in (LaneState.PARKED, LaneState.COOLING):
        until = utc_stamp(summary.until) if summary.until is not None else "-"
        capped = ", capped" if summary.capped else ""
        return f"{summary.state} until {until} ({summary.reason or '-'}{capped})"
    if summary.state is LaneState.STOPPED:
        return f"stopped ({summary.reason or '-'})"
    if summary.state is LaneState.HALF_OPEN:
        return f"half-open (probe {summary.probe_run or '-'})"
    return str(summary.state)


def _changes(events: list[LaneEvent], config: LaneConfig) -> list[LaneSummary | None]:
    """For each event, the lane's state after it where the event changed the state (None
    where it did not): the lane's history folded as the ledger folds it (with `config`, the
    lanes' configuration in force now: an event folded under an older one may have moved
    the lane otherwise, which `execkit db check` compares exactly)."""
    moved: list[LaneSummary | None] = []
    summary: LaneSummary | None = None
    for event in events:
        before = summary or open_lane(event.lane)
        summary = step(before, event, config)
        changed = (summary.state, summary.until, summary.reason, summary.probe_run) != (
            before.state,
            before.until,
            before.reason,
            before.probe_run,
        )
        moved.append(summary if changed else None)
    return moved


def _print_lane(args: argparse.Namespace, lane: LaneView, **extra: Any) -> int:
    if args.json:
        print_json({**lane.to_dict(), **extra})
    else:
        emit(lane_line(lane))
        if not lane.admits:
            emit("  " + waiting_text(lane))
        if lane.state == "stopped":
            emit(safe_text(f"  fix it, then: execkit lane resume {lane.lane}"))
    return 0


def _list(args: argparse.Namespace) -> int:
    with _using(args, write=False) as ledger:
        lanes = ledger.list_lanes()
    if args.json:
        print_json({"lanes": [lane.to_dict() for lane in lanes]})
    else:
        for lane in lanes:
            emit(lane_line(lane))
    return 0


def _show(args: argparse.Namespace) -> int:
    with _using(args, write=False) as ledger:
        lane = ledger.get_lane(args.lane)
        events = ledger.lane_history(args.lane)
        config = None if args.json else ledger.lane_config()
    if args.json or config is None:
        print_json({**lane.to_dict(), "events": [event.to_dict() for event in events]})
        return 0
    _print_lane(args, lane)
    shown = events[-SHOWN_EVENTS:]
    if len(shown) < len(events):
        emit(f"  the last {len(shown)} of {len(events)} events (--json lists them all):")
    else:
        emit(f"  its {len(events)} event{'s' if len(events) != 1 else ''}:")
    moved = _changes(events, config)[-len(shown) :] if shown else []
    for event, after in zip(shown, moved, strict=True):
        emit(_event_line(event, after))
    return 0


def _resume(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        before = ledger.get_lane(args.lane)
        lane = ledger.resume_lane(args.lane, actor=actor, reason=args.reason)
    if not args.json and before.state == "open":
        emit(safe_text(f"lane {lane.lane} is open; nothing to resume"))
        return 0
    return _print_lane(args, lane, resumed=before.state != "open")


def _park(args: argparse.Namespace) -> int:
    until = _until(args)
    actor = _actor(args)
    with _using(args) as ledger:
        lane = ledger.park_lane(args.lane, until=until, actor=actor, reason=args.reason)
    return _print_lane(args, lane)


_WHOLE = frozenset({"breaker_k", "max_trips"})


def _config_value(flag: str, raw: str, *, whole: bool) -> float:
    try:
        return int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number of seconds"
        raise InvalidInput(
            f"{flag} must be {kind}, got {raw!r}", field=flag.lstrip("-").replace("-", "_")
        ) from None


def _config(args: argparse.Namespace) -> int:
    given = {
        field: _config_value(flag, getattr(args, field), whole=field in _WHOLE)
        for flag, field, _ in _CONFIG_FLAGS
        if getattr(args, field) is not None
    }
    if given:
        actor = _actor(args)
        with _using(args) as ledger:
            config = ledger.set_lane_config(actor=actor, **given)  # type: ignore[arg-type]
    else:
        with _using(args, write=False) as ledger:
            config = ledger.lane_config()
    if args.json:
        print_json(to_json(config))
    else:
        for flag, field, what in _CONFIG_FLAGS:
            emit(f"{flag[2:]:<15} {getattr(config, field):<8g} {what}")
    return 0
