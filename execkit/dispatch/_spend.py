"""Spend reports (issue #45): what runs cost, grouped by task, board issue, lane, day or
model, and what a done issue cost to get there.

`spend_report` groups `Ledger.spend_rows` (every run since a time, with its task, lane and
cost): each run counted once, in USD (the known part; `unknown_usd` counts the runs with no
USD figure, never zero) and tokens by kind. "$ per done issue" is the cost of every run of
every done task (failed attempts included) over how many there are.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable
from typing import Any
from zoneinfo import ZoneInfo

import attrs

from execkit._errors import InvalidInput
from execkit._json import to_json
from execkit.dispatch._board import TASK_TITLE_PREFIX
from execkit.ledger import SpendRow

__all__ = ["SpendBy", "SpendGroup", "SpendReport", "spend_report"]


class SpendBy(enum.StrEnum):
    """What a spend report groups runs by."""

    TASK = "task"
    ISSUE = "issue"  # the board issue a dispatcher made the task for (its title otherwise)
    LANE = "lane"
    DAY = "day"  # the day the run started, in the report's time zone
    MODEL = "model"


@attrs.frozen
class SpendGroup:
    """What the runs of one group cost: `runs`, `usd` (the known part), `unknown_usd`
    (runs with no USD figure), and tokens by kind (`tokens`: every kind)."""

    key: str
    runs: int = 0
    usd: float = 0.0
    unknown_usd: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    def plus(self, row: SpendRow) -> SpendGroup:
        return SpendGroup(
            self.key,
            self.runs + 1,
            self.usd + (row.usd or 0.0),
            self.unknown_usd + int(row.usd is None),
            self.input_tokens + row.input_tokens,
            self.output_tokens + row.output_tokens,
            self.cache_read_tokens + row.cache_read_tokens,
            self.cache_write_tokens + row.cache_write_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**to_json(self), "tokens": self.tokens}


@attrs.frozen
class SpendReport:
    """The groups in first-seen order, the whole (`total`), and the done issues: how many
    (`done`) and what all their runs cost (`done_cost`), so `per_done` is "$ per done
    issue" (None with none done)."""

    by: SpendBy
    groups: tuple[SpendGroup, ...]
    total: SpendGroup
    done: int
    done_cost: SpendGroup

    @property
    def per_done(self) -> float | None:
        return None if self.done == 0 else self.done_cost.usd / self.done

    def to_dict(self) -> dict[str, Any]:
        return {
            "by": str(self.by),
            "groups": [group.to_dict() for group in self.groups],
            "total": self.total.to_dict(),
            "done_issues": self.done,
            "done_cost": self.done_cost.to_dict(),
            "usd_per_done_issue": self.per_done,
        }


def _by(value: object) -> SpendBy:
    try:
        return SpendBy(value if isinstance(value, str) else repr(value))
    except ValueError:
        allowed = ", ".join(member.value for member in SpendBy)
        raise InvalidInput(f"by must be one of {allowed}, got {value!r}", field="by") from None


def spend_report(rows: Iterable[SpendRow], by: SpendBy | str, *, tz: str = "UTC") -> SpendReport:
    """`rows` grouped `by` (InvalidInput naming `by` for another word); a day is the
    calendar day in `tz` a run started on."""
    kind = _by(by)
    zone = ZoneInfo(tz)
    groups: dict[str, SpendGroup] = {}
    total, done_cost = SpendGroup("total"), SpendGroup("done")
    done_tasks: set[str] = set()
    for row in rows:
        key = _key(row, kind, zone)
        groups[key] = groups.get(key, SpendGroup(key)).plus(row)
        total = total.plus(row)
        if row.task_status == "done":
            done_tasks.add(row.task_id)
            done_cost = done_cost.plus(row)
    return SpendReport(kind, tuple(groups.values()), total, len(done_tasks), done_cost)


def _key(row: SpendRow, by: SpendBy, zone: ZoneInfo) -> str:
    if by is SpendBy.TASK:
        return row.task_id
    if by is SpendBy.ISSUE:
        return row.title.removeprefix(TASK_TITLE_PREFIX)
    if by is SpendBy.LANE:
        return row.lane or "-"
    if by is SpendBy.DAY:
        return dt.datetime.fromtimestamp(row.started_at, zone).date().isoformat()
    return row.model or "unknown"
