"""`execkit budget set|show` and `execkit spend`: the ledger's spend caps and what runs
cost (issue #45), local or through `--remote`, each with `--json`.

`spend [--by task|issue|lane|day|model] [--since TIME] [--tz ZONE]` prints USD and tokens
and runs per group, and "$ per done issue" (every run of every done issue, failed ones
included, each counted once); `--since` takes POSIX seconds, an ISO-8601 date or time, or
`24h`/`7d` back from now.

`set` changes the caps given (role `agent.operate`, audited; they live in the ledger, so
every host admits against them): the ledger-wide day's with `--day-usd`/`--day-tokens`,
one window of one lane (or the whole ledger) with `--usd`/`--tokens` `--window day|5h|week`
[`--lane NAME`], a time zone with `--tz`, and the floor of a run's reservation with
`--floor-usd`/`--floor-tokens`; `off` removes a cap. `show` prints them and, as text,
what each cap's window holds now and when it reopens. Every rule is the ledger's: this
module parses flags and prints.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from execkit._errors import InvalidInput
from execkit.cli._args import parse_int, parse_money
from execkit.cli._ledger import _acting, _actor, _common, _using
from execkit.cli._output import emit, print_json, safe_text

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `budget` and its actions, and `spend`."""
    register_budget(sub)
    register_spend(sub)


def register_budget(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `budget` and its actions."""
    common = _common()
    budget = sub.add_parser("budget", help="spend caps: per day, rolling 5h or week; per lane")
    budget_sub = budget.add_subparsers(dest="budget_command", metavar="ACTION", required=True)

    show = budget_sub.add_parser("show", parents=[common], help="the ledger's spend caps")
    show.set_defaults(handler=_show)

    change = budget_sub.add_parser(
        "set",
        parents=[common],
        help="change spend caps (agent.operate; audited; every host admits against them)",
        description=(
            "Set the caps given; `off` removes one. A run is admitted only if every cap "
            "that applies (the ledger-wide ones and its lane's) has room for its "
            "reservation: the larger of the floor and the 90th percentile of its lane's "
            "recent costs."
        ),
    )
    change.add_argument("--day-usd", default=None, metavar="USD", help="the day's USD cap")
    change.add_argument("--day-tokens", default=None, metavar="N", help="the day's token cap")
    change.add_argument(
        "--window", default=None, choices=("day", "5h", "week"), help="the window of --usd/--tokens"
    )
    change.add_argument("--lane", default=None, metavar="LANE", help="ADAPTER/CREDENTIAL")
    change.add_argument("--usd", default=None, metavar="USD", help="a USD cap on --window")
    change.add_argument("--tokens", default=None, metavar="N", help="a token cap on --window")
    change.add_argument("--tz", default="UTC", metavar="ZONE", help="IANA time zone (UTC)")
    change.add_argument(
        "--floor-usd", default=None, metavar="USD", help="a run's least reservation"
    )
    change.add_argument("--floor-tokens", default=None, metavar="N", help="ditto, in tokens")
    _acting(change)
    change.set_defaults(handler=_set)

    override = budget_sub.add_parser(
        "override",
        parents=[common],
        help="lift one cap for the window that holds now (agent.operate; audited)",
        description=(
            "Lift the cap of --window (ledger-wide, or --lane's) until its window ends (a "
            "rolling 5h window: for five hours): no run is held to it meanwhile, on any "
            "host. The next window holds to it again."
        ),
    )
    override.add_argument("--window", required=True, choices=("day", "5h", "week"))
    override.add_argument("--lane", default=None, metavar="LANE", help="ADAPTER/CREDENTIAL")
    _acting(override)
    override.set_defaults(handler=_override)

    subscription = budget_sub.add_parser(
        "subscription",
        parents=[common],
        help="mark a lane as a subscription: its USD recorded, held to tokens only",
    )
    subscription.add_argument("lane", metavar="LANE", help="ADAPTER/CREDENTIAL")
    subscription.add_argument("state", choices=("on", "off"))
    _acting(subscription)
    subscription.set_defaults(handler=_subscription)


def register_spend(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `spend`."""
    spend = sub.add_parser(
        "spend",
        parents=[_common()],
        help="what runs cost: USD and tokens by task, issue, lane, day or model",
    )
    spend.add_argument("--by", default="issue", choices=("task", "issue", "lane", "day", "model"))
    spend.add_argument(
        "--since", default=None, metavar="TIME", help="POSIX seconds, ISO-8601, or 24h / 7d"
    )
    spend.add_argument("--tz", default="UTC", metavar="ZONE", help="the days' time zone (UTC)")
    spend.set_defaults(handler=_spend)


_AGO = {"h": 3600.0, "d": 86400.0}


def _since(raw: str | None, tz: str) -> float:
    if raw is None:
        return 0.0
    text = raw.strip()
    try:
        if text[-1:] in _AGO and text[:-1].isdigit():
            return time.time() - int(text[:-1]) * _AGO[text[-1]]
        if text.replace(".", "", 1).isdigit():
            return float(text)
        stamp = dt.datetime.fromisoformat(text)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=ZoneInfo(tz))
        return stamp.timestamp()
    except (ValueError, ZoneInfoNotFoundError):
        raise InvalidInput(
            f"--since must be POSIX seconds, an ISO-8601 date or time, or 24h / 7d; got {raw!r}",
            field="--since",
        ) from None


def _spend(args: argparse.Namespace) -> int:
    from execkit.dispatch import spend_report

    try:
        ZoneInfo(args.tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"--tz must be an IANA time zone, got {args.tz!r}", field="--tz"
        ) from None
    since = _since(args.since, args.tz)
    with _using(args, write=False) as ledger:
        report = spend_report(ledger.spend_rows(since=since), args.by, tz=args.tz)
    if args.json:
        print_json(report.to_dict())
        return 0
    emit(f"{args.by.upper():<32} {'RUNS':>5} {'USD':>10} {'TOKENS':>13}")
    for group in (*report.groups, report.total):
        usd = f"${group.usd:,.2f}" + ("+?" if group.unknown_usd else "")
        emit(safe_text(f"{group.key[:32]:<32} {group.runs:>5} {usd:>10} {group.tokens:>13,}"))
    if report.per_done is not None:
        emit(
            f"$ per done issue: ${report.per_done:,.2f} ({report.done} done, "
            f"{report.done_cost.runs} run{'' if report.done_cost.runs == 1 else 's'}, "
            "failed ones included)"
        )
    return 0


def _tokens(flag: str, raw: str | None) -> int | None:
    if raw is None or raw.strip().lower() in ("off", "none"):
        return None
    return parse_int(flag, raw, 1)


def _set(args: argparse.Namespace) -> int:
    # Each cap named by its window and lane, with the fields given (`off`: None); a field
    # not given keeps the stored cap's.
    wanted: list[tuple[str, str | None, dict[str, Any]]] = []
    if args.day_usd is not None or args.day_tokens is not None:
        wanted.append(("day", None, _fields(args, "--day-usd", "--day-tokens", "day_")))
    if args.usd is not None or args.tokens is not None or args.lane is not None:
        if args.window is None:
            raise InvalidInput("--usd/--tokens/--lane need --window day|5h|week", field="--window")
        wanted.append((args.window, args.lane, _fields(args, "--usd", "--tokens", "")))
    floor_usd = None if args.floor_usd is None else _floor_usd(args.floor_usd)
    floor_tokens = (
        None if args.floor_tokens is None else parse_int("--floor-tokens", args.floor_tokens, 0)
    )
    if not wanted and floor_usd is None and floor_tokens is None:
        raise InvalidInput(
            "budget set needs a cap (--day-usd, --day-tokens, or --window with --usd/--tokens) "
            "or a floor (--floor-usd, --floor-tokens)"
        )
    from execkit.ledger import SpendCap

    actor = _actor(args)
    with _using(args) as ledger:
        stored = {cap.key: cap for cap in ledger.spend_config().caps} if wanted else {}
        caps = []
        for window, lane, fields in wanted:
            found = SpendCap(window, lane=lane, tz=args.tz)
            before = stored.get(found.key)
            if before is not None:
                fields = {"usd": before.usd, "tokens": before.tokens, **fields}
            caps.append(SpendCap(window, lane=lane, tz=args.tz, **fields))
        config = ledger.set_spend_cap(
            caps[0] if caps else None, actor=actor, floor_usd=floor_usd, floor_tokens=floor_tokens
        )
        for cap in caps[1:]:
            config = ledger.set_spend_cap(cap, actor=actor)
    return _print(args, config)


def _subscription(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        config = ledger.set_subscription_lane(args.lane, args.state == "on", actor=actor)
    return _print(args, config)


def _override(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        config = ledger.override_spend_cap(args.window, lane=args.lane, actor=actor)
    return _print(args, config)


def _fields(
    args: argparse.Namespace, usd_flag: str, tokens_flag: str, prefix: str
) -> dict[str, Any]:
    """The usd and tokens flags given (a flag not given is left out; `off` is None)."""
    fields: dict[str, Any] = {}
    usd, tokens = getattr(args, f"{prefix}usd"), getattr(args, f"{prefix}tokens")
    if usd is not None:
        fields["usd"] = parse_money(usd_flag, usd)
    if tokens is not None:
        fields["tokens"] = _tokens(tokens_flag, tokens)
    return fields


def _floor_usd(raw: str) -> float:
    if raw.strip() in ("0", "0.0", "$0"):
        return 0.0
    found = parse_money("--floor-usd", raw)
    if found is None:
        raise InvalidInput(
            f"--floor-usd must be a USD amount >= 0, got {raw!r}", field="--floor-usd"
        )
    return found


def _show(args: argparse.Namespace) -> int:
    from execkit._stamp import utc_stamp

    with _using(args, write=False) as ledger:
        config = ledger.spend_config()
        windows = [] if args.json else ledger.spend_windows()
    _print(args, config)
    for use in windows:
        full = "  full" if use.full else ""
        emit(
            safe_text(
                f"{use.name}: ${use.usd:,.2f} and {use.tokens:,} tokens since "
                f"{utc_stamp(use.start)}, reopens {utc_stamp(use.reopens_at)}{full}"
            )
        )
    return 0


def _print(args: argparse.Namespace, config: Any) -> int:
    from execkit._stamp import utc_stamp

    if args.json:
        print_json(config.to_dict())
        return 0
    if not config.caps:
        emit("no spend cap")
    for cap in config.caps:
        limits = []
        if cap.usd is not None:
            limits.append(f"${cap.usd:,.2f}")
        if cap.tokens is not None:
            limits.append(f"{cap.tokens:,} tokens")
        where = f"lane {cap.lane}" if cap.lane else "ledger-wide"
        lifted = dict(config.overrides).get(cap.key)
        if lifted is not None and lifted <= time.time():
            lifted = None  # its window ended: the cap holds again
        note = "" if lifted is None else f"  overridden until {utc_stamp(lifted)}"
        emit(safe_text(f"{cap.window:<5} {where:<30} {' and '.join(limits)}  ({cap.tz}){note}"))
    for lane in config.subscription_lanes:
        emit(safe_text(f"lane {lane} is a subscription: its USD is recorded, held to tokens"))
    emit(
        f"a run reserves at least ${config.floor_usd:,.2f} and {config.floor_tokens:,} tokens "
        "(more when its lane's recent runs cost more)"
    )
    return 0
