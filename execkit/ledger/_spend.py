"""Spend caps (issue #45): the values the ledger stores and speaks about money and tokens
as a budget.

`SpendCap` is one cap on a window (a calendar `day` or `week` in a time zone, or a rolling
`5h`), ledger-wide or on one vendor lane; `SpendConfig` is every cap plus the operator's
floor for a run's reservation, stored in the ledger (`ledger_meta` key `spend`) so every
host agrees. `TaskBudget` is one task's own cap. `window_bounds` says where a window began
and when it reopens. Every value refuses bad input with `InvalidInput` naming the field.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from attrs.validators import ge, instance_of

from execkit._errors import InvalidInput, StorageError
from execkit._json import to_json
from execkit._validate import checked, finite, integer, opt_checked

__all__ = [
    "DEFAULT_FLOOR_TOKENS",
    "DEFAULT_FLOOR_USD",
    "SPEND_CAPABILITY",
    "SPEND_META_KEY",
    "SPEND_ROOM_CAPABILITY",
    "SpendCap",
    "SpendConfig",
    "SpendRoom",
    "SpendRow",
    "SpendWindow",
    "TaskBudget",
    "TaskCost",
    "WindowUse",
    "check_lane_name",
    "task_costs_of",
    "window_bounds",
]

SPEND_CAPABILITY = "spend.caps"
"""Spend caps (issue #45): `spend_config`, `set_spend_caps`, `task_budget`,
`set_task_budget`, and admission against them. A client sends none to a server that does
not advertise it (an older server would not enforce them)."""

SPEND_ROOM_CAPABILITY = "spend.room"
"""Caps held while a run goes (issue #45): `spend_room`, which grows a running run's
reservation as its CLI reports spend, or says which cap stops it. A runner meters a run
only against a ledger that advertises it (an older server: caps hold at admission only)."""

SPEND_META_KEY = "spend"
"""ledger_meta's key for the `SpendConfig` (JSON); no key: no cap, and admission reads no
spend at all."""

# What a run reserves when nothing better is known (its lane has no recent costs, or they
# are unknown): unknown is never zero. The operator sets their own (`set_spend_caps`).
DEFAULT_FLOOR_USD = 0.50
DEFAULT_FLOOR_TOKENS = 50_000
_WEEK_DAYS = 7
_ROLLING_S = 5 * 3600.0


class SpendWindow(enum.StrEnum):
    """The window a cap counts spend over."""

    DAY = "day"  # the calendar day in the cap's time zone, from 00:00
    ROLLING_5H = "5h"  # the last five hours, rolling
    WEEK = "week"  # the calendar week in the cap's time zone, from Monday 00:00


def _window(value: object) -> SpendWindow:
    try:
        return SpendWindow(value if isinstance(value, str) else repr(value))
    except ValueError:
        allowed = ", ".join(window.value for window in SpendWindow)
        raise InvalidInput(
            f"window must be one of {allowed}, got {value!r}", field="window"
        ) from None


def _zone(_inst: object, _attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"tz must be an IANA time zone name, got {value!r}", field="tz")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"tz must be an IANA time zone name (UTC, Europe/Paris), got {value!r}", field="tz"
        ) from None


def check_lane_name(value: object) -> str:
    """`value` as a vendor lane's name (ADAPTER/CREDENTIAL) a cap or a subscription names;
    InvalidInput naming `lane` otherwise."""
    if not isinstance(value, str) or "/" not in value or len(value) > 300 or value != value.strip():
        raise InvalidInput(
            f"lane must be a vendor lane ADAPTER/CREDENTIAL, got {value!r}", field="lane"
        )
    return value


def _lane_name(_inst: object, _attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        check_lane_name(value)


_USD = opt_checked("a finite number > 0 (USD)", finite, ge(0))
_TOKENS = opt_checked("an integer >= 1", integer, ge(1))


def _positive_usd(_inst: object, attribute: attrs.Attribute[float | None], value: object) -> None:
    if value is not None and value == 0:
        raise InvalidInput(f"{attribute.name} must be > 0, got 0", field=attribute.name)


@attrs.frozen
class SpendCap:
    """A cap on the spend of one window: ledger-wide (`lane` None) or of one vendor lane,
    in USD (`usd`) and/or tokens (`tokens`, every kind counted). A day and a week begin
    at 00:00 in `tz` (a week on Monday); `5h` is the last five hours."""

    window: SpendWindow = attrs.field(converter=_window)
    lane: str | None = attrs.field(default=None, validator=_lane_name)
    usd: float | None = attrs.field(default=None, validator=[_USD, _positive_usd])
    tokens: int | None = attrs.field(default=None, validator=_TOKENS)
    tz: str = attrs.field(default="UTC", validator=_zone)

    @property
    def key(self) -> str:
        """What names the cap in the ledger (one cap per lane and window)."""
        return f"{self.lane or '*'}|{self.window}"

    @property
    def name(self) -> str:
        """How a person reads it: "the day's budget", "lane claude/x's 5h budget"."""
        span = {"day": "day's", "5h": "rolling 5h", "week": "week's"}[self.window.value]
        return f"the {span} budget" + (f" of lane {self.lane}" if self.lane else "")

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def _cap_tuple(value: Iterable[SpendCap]) -> tuple[SpendCap, ...]:
    return tuple(value)


def _lane_set(lanes: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(lanes)))


def _override_pairs(value: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((str(key), float(until)) for key, until in value))


@attrs.frozen
class SpendConfig:
    """Every spend cap of the ledger, one per (lane, window), and the floor of a run's
    reservation (`floor_usd`, `floor_tokens`: what a run reserves when its lane's recent
    costs say less or nothing). `task_budgets` is set once any task has a budget of its
    own (admission reads a task's budget only then)."""

    caps: tuple[SpendCap, ...] = attrs.field(default=(), converter=_cap_tuple)
    floor_usd: float = attrs.field(
        default=DEFAULT_FLOOR_USD, validator=checked("a finite number >= 0", finite, ge(0))
    )
    floor_tokens: int = attrs.field(
        default=DEFAULT_FLOOR_TOKENS, validator=checked("an integer >= 0", integer, ge(0))
    )
    task_budgets: bool = attrs.field(default=False, validator=instance_of(bool))
    # An operator's override of a cap for one window: (the cap's key, until when) pairs,
    # sorted; a cap overridden is not applied before then.
    overrides: tuple[tuple[str, float], ...] = attrs.field(default=(), converter=_override_pairs)
    # Lanes on a subscription (issue #45): their runs' USD is recorded (the CLI prices
    # even a subscription's session) but held to no USD cap of a window, only to tokens.
    subscription_lanes: tuple[str, ...] = attrs.field(default=(), converter=_lane_set)

    @caps.validator
    def _one_a_window(self, _attribute: attrs.Attribute[Any], value: tuple[SpendCap, ...]) -> None:
        keys = [cap.key for cap in value]
        if any(not isinstance(cap, SpendCap) for cap in value) or len(set(keys)) != len(keys):
            raise InvalidInput("caps must be SpendCaps, one per lane and window", field="caps")

    def applying(self, lane: str | None, at: float | None = None) -> list[SpendCap]:
        """The caps a run on `lane` counts against: the ledger-wide ones and its lane's,
        but (at `at`) none an operator overrode for the window that holds `at`."""
        return [
            cap
            for cap in self.caps
            if (cap.lane is None or cap.lane == lane)
            and (at is None or self.overridden_until(cap, at) is None)
        ]

    def overridden_until(self, cap: SpendCap, at: float) -> float | None:
        """Until when an operator's override lifts `cap` at `at` (None: it applies)."""
        for key, until in self.overrides:
            if key == cap.key and at < until:
                return until
        return None

    def with_caps(self, changes: Sequence[SpendCap]) -> SpendConfig:
        """This configuration with each of `changes` in place of its (lane, window)'s cap;
        a change with neither usd nor tokens removes that cap."""
        kept = {cap.key: cap for cap in self.caps}
        for change in changes:
            if change.usd is None and change.tokens is None:
                kept.pop(change.key, None)
            else:
                kept[change.key] = change
        return attrs.evolve(self, caps=tuple(kept[key] for key in sorted(kept)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "caps": [cap.to_dict() for cap in self.caps],
            "floor_usd": self.floor_usd,
            "floor_tokens": self.floor_tokens,
            "task_budgets": self.task_budgets,
            "overrides": dict(self.overrides),
            "subscription_lanes": list(self.subscription_lanes),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SpendConfig:
        """A configuration from its JSON object; InvalidInput for a bad one."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("caps", []), list):
            raise InvalidInput("a spend configuration is an object with a list of caps")
        raw_overrides = doc.get("overrides") or {}
        if not isinstance(raw_overrides, Mapping) or not all(
            isinstance(until, int | float) and not isinstance(until, bool)
            for until in raw_overrides.values()
        ):
            raise InvalidInput(
                "overrides must map a cap's key to a time in POSIX seconds", field="overrides"
            )
        try:
            return cls(
                caps=tuple(SpendCap(**cap) for cap in doc.get("caps", [])),
                floor_usd=float(doc.get("floor_usd", DEFAULT_FLOOR_USD)),
                floor_tokens=int(doc.get("floor_tokens", DEFAULT_FLOOR_TOKENS)),
                task_budgets=bool(doc.get("task_budgets", False)),
                overrides=tuple(raw_overrides.items()),
                subscription_lanes=tuple(str(lane) for lane in doc.get("subscription_lanes") or ()),
            )
        except TypeError as exc:
            raise InvalidInput(f"caps: {exc}", field="caps") from None

    def to_stored(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_stored(cls, text: str | None) -> SpendConfig:
        """The stored configuration (None: none); StorageError for text that is not one."""
        if text is None:
            return cls()
        return _stored_config(text)


@functools.lru_cache(maxsize=16)
def _stored_config(text: str) -> SpendConfig:
    """`SpendConfig.from_stored`, read once per stored text: every capped admission reads
    the configuration, and checking every cap's time zone again costs more than the rest
    of the spend check (the value is frozen: sharing it is safe)."""
    try:
        return SpendConfig.from_dict(json.loads(text))
    except (ValueError, InvalidInput) as exc:
        raise StorageError(
            f"ledger_meta {SPEND_META_KEY!r} is not a spend configuration: {exc}; "
            "`execkit budget set` writes a new one"
        ) from None


@attrs.frozen
class TaskBudget:
    """One task's own cap: USD and/or tokens over all its runs (None: no cap of that kind).
    A run whose actual cost crosses it is charged and blocks the task on `spend` until an
    operator raises it (`execkit task set-budget`)."""

    task_id: str
    usd: float | None = attrs.field(default=None, validator=[_USD, _positive_usd])
    tokens: int | None = attrs.field(default=None, validator=_TOKENS)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


_OPT_USD = opt_checked("a finite number >= 0 (USD)", finite, ge(0))
_OPT_TOKENS = opt_checked("an integer >= 0", integer, ge(0))


@attrs.frozen
class SpendRoom:
    """What a running run may spend before it asks again (`Ledger.spend_room`, issue #45).

    `usd`/`tokens` are the run's reservation now (None: no cap of that kind applies to
    it): while its spend stays within them the runner asks nothing; past either, it asks
    the ledger, which grows the reservation if every cap still has room, or answers the
    stop. `stop` is then the reason the run must end (which cap, what it holds), with
    `cap` naming the cap as a person reads it, `by_task` True when it is the task's own
    budget (the run is charged and the task blocked on `spend`) and False for a window's
    cap (the run is stopped uncharged and its task waits for `reopens_at`).
    `unlimited`: no cap applies to the run at all; a runner need not meter it.
    """

    usd: float | None = attrs.field(default=None, validator=_OPT_USD)
    tokens: int | None = attrs.field(default=None, validator=_OPT_TOKENS)
    stop: str | None = attrs.field(default=None, validator=opt_checked("a str", instance_of(str)))
    cap: str | None = attrs.field(default=None, validator=opt_checked("a str", instance_of(str)))
    by_task: bool = attrs.field(default=False, validator=checked("a bool", instance_of(bool)))
    reopens_at: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number of POSIX seconds", finite)
    )

    @property
    def unlimited(self) -> bool:
        return self.stop is None and self.usd is None and self.tokens is None

    def allows(self, usd: float | None, tokens: int) -> bool:
        """Whether spend of `usd` (None: unknown, which no USD figure can check) and
        `tokens` is within this room without asking the ledger again."""
        if self.stop is not None:
            return False
        if self.tokens is not None and tokens > self.tokens:
            return False
        return not (self.usd is not None and usd is not None and usd > self.usd + 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


@attrs.frozen
class WindowUse:
    """What one cap's window holds now (`Ledger.spend_windows`): the cap (`window`,
    `lane`, `cap_usd`, `cap_tokens`, `tz`, and `name` as a person reads it), when its
    window began (`start`) and reopens (`reopens_at`), what it holds (`usd`, `tokens`:
    each run's cost, or its reservation while it runs or when its cost is unknown), and
    `full`: no room left for the least reservation (the floor), so no run on it is
    admitted before it reopens or is raised. `overridden_until`: an operator's override
    lifts the cap until then (None: it applies)."""

    name: str
    window: SpendWindow
    lane: str | None
    cap_usd: float | None
    cap_tokens: int | None
    tz: str
    start: float
    reopens_at: float
    usd: float
    tokens: int
    full: bool
    overridden_until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


@attrs.frozen
class SpendRow:
    """One run as a spend report reads it (`Ledger.spend_rows`): its task (`task_id`,
    `title`, `task_status`), its own `status`, `lane` and start, and its cost as stored
    (every kind of token, `usd` None when unknown, `usd_source`, `model`)."""

    run_id: str
    task_id: str
    title: str
    task_status: str
    status: str
    lane: str | None
    started_at: float
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    usd: float | None
    usd_source: str
    model: str | None

    @property
    def tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class TaskCost(NamedTuple):
    """What one task's runs reported together (`Ledger.task_costs`): how many `runs`, the
    `usd` those with a figure reported, summed (0.0 with none), how many reported no USD
    (`unknown_usd`: a running run too), and every kind of `tokens` summed."""

    runs: int
    usd: float
    unknown_usd: int
    tokens: int


def task_costs_of(rows: Iterable[SpendRow]) -> dict[str, TaskCost]:
    """`Ledger.task_costs` from a spend report's rows (`Ledger.spend_rows`, every run):
    each task that has a run, by its id."""
    sums: dict[str, list[Any]] = {}
    for row in rows:
        cost = sums.setdefault(row.task_id, [0, 0.0, 0, 0])
        cost[0] += 1
        if row.usd is None:
            cost[2] += 1
        else:
            cost[1] += row.usd
        cost[3] += row.tokens
    return {task: TaskCost(*cost) for task, cost in sums.items()}


# The calendar window last computed per (window, time zone): (its start, its end).
_CALENDAR: dict[tuple[SpendWindow, str], tuple[float, float]] = {}


def window_bounds(cap: SpendCap, at: float) -> tuple[float, float]:
    """(when the cap's window that holds `at` began, when the next one begins) in POSIX
    seconds. A rolling window began five hours ago and "reopens" as the spend of its
    oldest moment leaves it: its end is given as `at` + 5 h, the latest it can be."""
    if cap.window is SpendWindow.ROLLING_5H:
        return at - _ROLLING_S, at + _ROLLING_S
    # A calendar window stands until it ends: every capped admission asks, and a time
    # zone's arithmetic costs more than the rest of the check's Python.
    key = (cap.window, cap.tz)
    known = _CALENDAR.get(key)
    if known is not None and known[0] <= at < known[1]:
        return known
    zone = ZoneInfo(cap.tz)
    # Whole seconds: `fromtimestamp` rounds to the microsecond, which read the last float
    # before a midnight as the next day (every zone's midnight is a whole second).
    local = dt.datetime.fromtimestamp(math.floor(at), zone).date()
    if cap.window is SpendWindow.WEEK:
        start = local - dt.timedelta(days=local.weekday())
        end = start + dt.timedelta(days=_WEEK_DAYS)
    else:
        start, end = local, local + dt.timedelta(days=1)
    bounds = _midnight(start, zone), _midnight(end, zone)
    _CALENDAR[key] = bounds
    return bounds


def _midnight(day: dt.date, zone: ZoneInfo) -> float:
    """00:00 of `day` in `zone` (a skipped midnight: the first moment of the day)."""
    stamp = dt.datetime.combine(day, dt.time(0), zone).timestamp()
    return math.floor(stamp)
