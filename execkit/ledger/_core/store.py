"""What a backend implements beneath the rules: `Store` (transactions over its storage) and
`Tx` (one open transaction's typed reads and writes, no rules), and `TaskRecord`, what a
backend stores of a task.

What a backend promises (`Store.write()`): everything inside one `with` block is one
transaction that commits at the end or rolls back on any exception, and no other writer can
interleave with it for the same task (SQLite takes the database write lock at BEGIN
IMMEDIATE; PostgreSQL locks the task row). Reads (`Store.read()`) see one snapshot.

A new concern that stores facts of its own adds its reads and writes to `Tx` here, and
each backend implements them in its own SQL.
"""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from execkit._budget import Attempt, AttemptStatus, HistorySummary
from execkit._classify import FailureClass
from execkit._errors import StorageError
from execkit._lanes import LaneEvent, LaneGate, LaneSummary
from execkit._usage import Usage
from execkit._validate import fields_in_order
from execkit.ledger._model import AuditEntry, AuditEvent, Grant, OutboxEntry, Run, TaskStatus
from execkit.ledger._spend import SpendRow, TaskBudget

# ledger_meta's key for the lane configuration (`LaneConfigHistory`, stored): a backend
# that reads ahead reads it with a lane-bound run's result (`Tx.expect_result`).
LANE_CONFIG_META_KEY = "lane_config"

# An admission's spend reads (`Tx.spend_reads`): the run's lane, how many recent costs,
# and each window (its start, its lane or None: every lane).
SpendReads = tuple[str | None, int, tuple[tuple[float, str | None], ...]]
# Given the spend configuration's stored text, the spend reads an admission will make, or
# None when it makes none (`Tx.expect_admission`).
SpendPlan = Callable[[str], SpendReads | None]

__all__ = [
    "HISTORY_ROW",
    "LANE_CONFIG_META_KEY",
    "SUMMARY_AT",
    "SpendPlan",
    "SpendReads",
    "StaleCopy",
    "Store",
    "TaskRecord",
    "Tx",
    "domain",
    "stored_attempt",
    "summary_row",
    "summary_values",
]


_E = TypeVar("_E", bound=enum.Enum)


@functools.cache
def _members(kind: type[_E]) -> dict[Any, _E]:
    return {member.value: member for member in kind}


def domain(kind: type[_E], value: Any, where: str, *keys: object) -> _E:
    """A stored value as its enum; one this execkit does not know is a StorageError
    naming the row: `where`, formatted with `keys` (`"run {!r} status", run_id`) only
    then, as every row read passes through here (a dict lookup, not the enum's call)."""
    member: _E | None = _members(kind).get(value)
    if member is not None:
        return member
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise StorageError(
            f"{where.format(*keys)} holds {value!r}, which is not one of {allowed}; "
            "`execkit db check` lists every such row"
        ) from None


_NEW = object.__new__
_EMPTY_SUMMARY = HistorySummary()
_ATTEMPT_STATUSES = _members(AttemptStatus)
_FAILURE_CLASSES = _members(FailureClass)
_TASK_STATUSES = _members(TaskStatus)


def stored_attempt(
    number: int,
    status: AttemptStatus,
    failure_class: FailureClass | None,
    reason: str | None,
    started_at: float | None,
    ended_at: float | None,
    forced: bool,
    not_before: float | None,
    stopped: bool,
    lane_held: bool = False,
) -> Attempt:
    """An attempt as the ledger stored it, without `Attempt`'s validators: every listed
    task has one, and validating it cost half of listing 100,000 tasks. What they check
    is held by the schema (the enums, each read through `domain`; the number; the flag)
    or was checked when the attempt was written; `db check` validates every history and
    compares each stored summary with it, so a summary edited by hand is reported there.
    One statement a field: every field of `Attempt` (`_ATTEMPT_FIELDS`, checked at import)."""
    attempt = _NEW(Attempt)
    _SET_NUMBER(attempt, number)
    _SET_STATUS(attempt, status)
    _SET_CLASS(attempt, failure_class)
    _SET_REASON(attempt, reason)
    _SET_STARTED(attempt, started_at)
    _SET_ENDED(attempt, ended_at)
    _SET_FORCED(attempt, forced)
    _SET_NOT_BEFORE(attempt, not_before)
    _SET_STOPPED(attempt, stopped)
    _SET_LANE_HELD(attempt, lane_held)
    return attempt


# The fields `stored_attempt` sets: a field added to `Attempt` must be set there too.
_ATTEMPT_FIELDS = (
    "number",
    "status",
    "failure_class",
    "reason",
    "started_at",
    "ended_at",
    "forced",
    "not_before",
    "stopped",
    "lane_held",
)
fields_in_order(Attempt, _ATTEMPT_FIELDS, "stored_attempt sets those")
# Each slot's own setter (what `object.__setattr__` finds by name, a third cheaper without
# the lookup): `Attempt` is a slotted class, frozen only through its `__setattr__`.
(
    _SET_NUMBER,
    _SET_STATUS,
    _SET_CLASS,
    _SET_REASON,
    _SET_STARTED,
    _SET_ENDED,
    _SET_FORCED,
    _SET_NOT_BEFORE,
    _SET_STOPPED,
    _SET_LANE_HELD,
) = (vars(Attempt)[name].__set__ for name in _ATTEMPT_FIELDS)


class TaskRecord(NamedTuple):
    """What a backend stores of a task: the task row, its limit and its history's summary,
    as the columns hold them (in the order of `_rows.TASK_ROW`; the summary's are None
    when the task has no history yet).

    A tuple, made from a row in one call (`TaskRecord._make(row)`): a listing of 100,000
    tasks makes one per task, and most of them are shown from their columns alone (a done
    task needs no decision). `status` and `summary` are read from the columns when asked
    (a value outside its enum is a StorageError naming the row); `with_summary` is the
    record with another summary.
    """

    id: str
    title: str
    stored_status: str
    created_by: str
    created_at: float
    max_attempts: int  # 0 = no explicit limit
    max_uncharged_attempts: int | None  # None = the ledger's budget
    retry_requested_by: str | None  # an operator's pending forced retry, if any
    gave_up_at_attempt: int | None  # a dispatcher moved it to a terminal state here
    attempts_used: int | None  # None: no summary yet, and so every summary column
    charged_attempts: int | None
    uncharged_streak: int | None
    streak_reason: str | None
    running: int | None
    last_number: int | None  # None: no last attempt, and so every last_ column
    last_status: str | None
    last_class: str | None
    last_reason: str | None
    last_started_at: float | None
    last_ended_at: float | None
    last_forced: bool | int | None
    last_not_before: float | None
    last_stopped: bool | int | None
    last_lane_held: bool | int | None

    @property
    def status(self) -> TaskStatus:
        stored = self.stored_status
        return _TASK_STATUSES.get(stored) or domain(TaskStatus, stored, "task {!r} status", self.id)

    def last_kind(self) -> tuple[AttemptStatus, FailureClass | None]:
        """The last attempt's stored status and class as their enums (a task with a last
        attempt); a value outside its enum is a StorageError naming the task."""
        status, klass = self.last_status, self.last_class
        return (
            _ATTEMPT_STATUSES.get(status)
            or domain(AttemptStatus, status, "task {!r} summary last_status", self.id),
            None
            if klass is None
            else _FAILURE_CLASSES.get(klass)
            or domain(FailureClass, klass, "task {!r} summary last_class", self.id),
        )

    @property
    def last(self) -> Attempt | None:
        """The history's last attempt as the summary columns hold it (built at each call)."""
        if self.last_number is None:
            return None
        status, klass = self.last_kind()
        return stored_attempt(
            self.last_number,
            status,
            klass,
            self.last_reason,
            self.last_started_at,
            self.last_ended_at,
            bool(self.last_forced),
            self.last_not_before,
            bool(self.last_stopped),
            bool(self.last_lane_held),
        )

    @property
    def summary(self) -> HistorySummary:
        """The history's summary as its columns hold it (built at each call)."""
        if self.attempts_used is None:  # no summary row (a left join): no history yet
            return _EMPTY_SUMMARY
        # Positional, in the field order (HistorySummary has no validators to skip).
        return HistorySummary(
            self.attempts_used,
            self.charged_attempts or 0,
            self.uncharged_streak or 0,
            self.streak_reason,
            self.running,
            self.last,
        )

    def with_summary(self, summary: HistorySummary) -> TaskRecord:
        """This record with `summary` in its summary columns."""
        return TaskRecord._make(self[:SUMMARY_AT] + summary_values(summary))


# Where a record's summary columns start: `attempts_used` and every field after it.
SUMMARY_AT = TaskRecord._fields.index("attempts_used")


# The columns of a row of `Tx.history_rows`, in order: a task's id and stored status, its
# stored summary's columns (`TaskRecord`'s from `SUMMARY_AT`, None when it has no summary
# row), then the values of one of its runs that `db check` folds (None when it has no run).
HISTORY_ROW = (
    "task_id",
    "task_status",
    *TaskRecord._fields[SUMMARY_AT:],
    "run_id",
    "attempt",
    "status",
    "failure_class",
    "reason",
    "forced",
    "started_at",
    "ended_at",
    "not_before",
    "lease_expires_at",
    "stopped",
    "lane_held",
)


def summary_values(summary: HistorySummary) -> tuple[Any, ...]:
    """`summary` as the values of its columns, in `TaskRecord`'s order from `SUMMARY_AT`
    (enums as their strings): what a backend writes (`summary_row`), what a record holds,
    and what `db check` compares a stored summary with."""
    counts = (
        summary.attempts_used,
        summary.charged_attempts,
        summary.uncharged_streak,
        summary.streak_reason,
        summary.running,
    )
    last = summary.last
    if last is None:
        return (*counts, None, None, None, None, None, None, False, None, False, False)
    return (
        *counts,
        last.number,
        str(last.status),
        None if last.failure_class is None else str(last.failure_class),
        last.reason,
        last.started_at,
        last.ended_at,
        last.forced,
        last.not_before,
        last.stopped,
        last.lane_held,
    )


def summary_row(summary: HistorySummary) -> dict[str, Any]:
    """`summary` as the values of its columns (`_rows.SUMMARY_COLUMNS`), by name."""
    return dict(zip(TaskRecord._fields[SUMMARY_AT:], summary_values(summary), strict=True))


class Tx(Protocol):
    """One open transaction of a backend: typed reads and writes, no rules.

    `task(..., lock=True)` is the read an admission decides on: a backend that does not
    serialise whole transactions (PostgreSQL) locks the task row with it. `task_page` is
    at most `limit` tasks in creation order after task `after` (None: from the first), of
    `status` only (None: any): how a listing reads 100,000 tasks a page at a time;
    `runs_of` is the runs of a page's tasks, in creation order.

    `history_rows` is every task in creation order, each followed by its runs in creation
    order: one row a run (a task with none: one row, its run's columns None), the columns
    of `HISTORY_ROW` in that order, as stored (enums as their strings, flags as the backend
    holds them). Streamed: rows are read from the database as they are iterated, never all
    held (a batch at a time), so it is iterated inside its transaction. What `db check`
    folds: one statement for the whole ledger, and only the columns the fold reads.
    """

    # Hints, made first in an admission's and a run result's transaction: a backend that
    # pays a round trip per statement (PostgreSQL) sends, together, the reads (and their
    # locks) the rules are about to make, in the order they make them, and answers those
    # calls with what it got; one without (SQLite) does nothing. The rules never depend
    # on a hint: a read it did not foresee is made as it comes.
    # `spend`: given the spend configuration's stored text, the `spend_reads` the admission
    # will make (lane, limit, windows), or None when it makes none: a store that knows the
    # text may send them (and the spend lock) with its first reads.
    def expect_admission(
        self,
        scope: str,
        key: str,
        task_id: str,
        lanes: tuple[str, ...],
        spend: SpendPlan | None = None,
    ) -> None: ...
    def expect_result(self, run_id: str) -> None: ...

    def task(self, task_id: str, *, lock: bool = False) -> TaskRecord | None: ...
    def tasks(self) -> list[TaskRecord]: ...
    def task_page(
        self, after: str | None, limit: int, status: TaskStatus | None
    ) -> list[TaskRecord]: ...
    def runs(self, task_id: str) -> list[Run]: ...
    def runs_of(self, task_ids: list[str]) -> list[Run]: ...
    # The runs, in creation order, of each of `task_ids` whose latest run resumed a vendor
    # session or fell back to a later adapter (issue #46).
    def announced_runs(self, task_ids: list[str]) -> list[Run]: ...
    def history_rows(self) -> Iterator[tuple[Any, ...]]: ...
    def all_runs(self) -> list[Run]: ...
    def run(self, run_id: str) -> Run | None: ...
    def run_at(self, task_id: str, attempt: int) -> Run | None: ...
    def expired_runs(self, now: float) -> list[Run]: ...
    def running_runs(self) -> list[Run]: ...

    def insert_task(
        self, title: str, actor: str, at: float, max_uncharged_attempts: int | None
    ) -> str: ...
    def set_task_status(self, task_id: str, status: TaskStatus, at: float) -> None: ...
    def set_retry(self, task_id: str, requested_by: str | None, at: float | None) -> None: ...
    def set_gave_up(self, task_id: str, attempts: int | None) -> None: ...
    def upsert_limit(self, task_id: str, max_attempts: int, actor: str, at: float) -> None: ...
    def write_summary(self, task_id: str, summary: HistorySummary) -> None: ...
    # `reserved`: the (USD, tokens) its admission holds for it (issue #45), written with it.
    def insert_run(
        self, run: Run, lease_s: float, reserved: tuple[float, int] | None = None
    ) -> Run: ...
    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus,
        failure_class: FailureClass | None,
        reason: str | None,
        not_before: float | None,
        at: float,
        stopped: bool = False,
        lane_held: bool = False,
        usage: Usage | None = None,
        session_id: str | None = None,
    ) -> bool: ...
    def renew_lease(self, run_id: str, expires_at: float, lease_s: float | None) -> bool: ...
    def lease_of(self, run_id: str) -> float: ...

    def audit(self, entry: AuditEntry) -> None: ...
    def audit_events(self, task_id: str | None) -> list[AuditEvent]: ...
    def idempotent(self, scope: str, key: str) -> tuple[str, dict[str, Any]] | None: ...
    def remember(
        self, scope: str, key: str, fingerprint: str, response: dict[str, Any], at: float
    ) -> None: ...

    def grants(self, principal: str | None) -> list[Grant]: ...
    def put_grant(self, grant: Grant) -> bool: ...
    def delete_grant(self, principal: str, role: str) -> bool: ...
    def meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...

    # Vendor lanes (issue #28). `lane(..., lock=True)` locks the lane's row when it has one
    # (PostgreSQL: FOR UPDATE, always after the task rows the transaction locks);
    # `create=True` makes an open row first, so a lane seen for the first time is locked
    # too. A lane with no row is open.
    def lane(
        self, name: str, *, lock: bool = False, create: bool = False
    ) -> LaneSummary | None: ...
    def lanes(self) -> list[LaneSummary]: ...
    # What admission reads of the stored lanes among `names` (those with a row), in name
    # order; `lock` as `lane`.
    def lane_gates(self, names: tuple[str, ...], *, lock: bool) -> list[LaneGate]: ...
    def lane_events(self, name: str | None) -> list[LaneEvent]: ...
    # A notification to whoever listens on `channel`, sent when the transaction commits
    # (PostgreSQL's NOTIFY; SQLite has none, and its waiters poll).
    def notify(self, channel: str, payload: str) -> None: ...
    # The (task, run) of each `stop` event on `name` since its last `resume`, in order: the
    # tasks the lane's stop blocked (the run that stopped it, and those that met it after).
    def lane_stops(self, name: str) -> list[tuple[str, str]]: ...
    # Every lane event with its number (`seq`), in order: what `db check` folds.
    def numbered_lane_events(self) -> list[tuple[int, LaneEvent]]: ...
    # The number of the last lane event, once no other transaction can still add one
    # numbered below it: PostgreSQL waits for every transaction that added a lane event to
    # end and holds new ones until this one ends (a lane configuration change).
    def lane_event_barrier(self) -> int: ...
    def add_lane_event(self, event: LaneEvent) -> None: ...
    def write_lane(self, summary: LaneSummary) -> None: ...
    def set_run_lane(self, run_id: str, lane: str) -> None: ...
    def run_lane(self, run_id: str) -> str | None: ...
    def task_lane(self, task_id: str) -> str | None: ...
    # -- the board outbox (issue #47) ----------------------------------------------------
    def outbox(self, board: str, item: str, *, lock: bool = False) -> OutboxEntry | None: ...
    def outbox_rows(self, board: str, *, pending: bool) -> list[OutboxEntry]:
        """A board's entries by item (only those not delivered yet with `pending`)."""
        ...

    def due_outbox(
        self, board: str, at: float, owner: str, limit: int, max_tries: int
    ) -> list[OutboxEntry]:
        """Up to `limit` pending entries of `board` that may be sent at `at` (no `next_at`
        after it, fewer than `max_tries` failures in a row, unclaimed, claimed by `owner`,
        or their claim run out), oldest put first, locked."""
        ...

    def write_outbox(self, entry: OutboxEntry) -> None: ...

    # -- spend (issue #45) ---------------------------------------------------------------
    # A run's effective cost, what every sum below counts: a running run, and a finished
    # one whose result reported no USD (tokens), counts what its admission reserved; any
    # other its reported cost. A run with no cost stored counts nothing.
    def task_budget(self, task_id: str) -> TaskBudget | None: ...
    def put_task_budget(self, budget: TaskBudget, actor: str, at: float) -> None: ...
    # The admissions that read the window sums queue here (PostgreSQL: a transaction-scoped
    # advisory lock, taken after every row lock of the admission; SQLite: its write lock).
    def lock_spend(self) -> None: ...
    # A running run's reservation (USD, tokens): (0, 0) for a run admitted with none.
    def reservation(self, run_id: str) -> tuple[float, int]: ...
    # Replaces a running run's reservation (`spend_room` grows it as the run spends).
    def set_reservation(self, run_id: str, usd: float, tokens: int) -> None: ...
    # (USD, tokens, the earliest start counted) of the runs started at or after `since`,
    # on `lane` only when one is given.
    def window_spend(self, since: float, lane: str | None) -> tuple[float, int, float | None]: ...
    # An admission's spend reads, in one round trip where the store can: `lock_spend` when
    # there are `windows`, then `recent_costs(lane, limit)` (none for a limit of 0) and the
    # (USD, tokens) each window (since, lane) holds, as `window_spend` sums it.
    def spend_reads(
        self, lane: str | None, limit: int, windows: Sequence[tuple[float, str | None]]
    ) -> tuple[list[tuple[float | None, int]], list[tuple[float, int]]]: ...
    def task_spend(self, task_id: str) -> tuple[float, int]: ...
    # Each of `task_ids` with a budget that caps something, beside what its runs hold as
    # `task_spend` counts it (USD, tokens): what a listing's spend block reads, a page at once.
    def task_budgets_of(self, task_ids: Sequence[str]) -> list[tuple[TaskBudget, float, int]]: ...
    # The (USD or None, tokens) of up to `limit` runs whose result reported a cost (of
    # `lane` when given, else of every lane), the latest first: what a reservation's
    # percentile reads.
    def recent_costs(self, lane: str | None, limit: int) -> list[tuple[float | None, int]]: ...
    # Records that `cap`'s window starting at `window_start` had its 80% warning; False
    # when it had one already.
    def note_spend_warning(self, cap: str, window_start: float, at: float) -> bool: ...
    # Every run started at or after `since`, in creation order, with its task and cost.
    def spend_rows(self, since: float) -> list[SpendRow]: ...
    # Each of `task_ids` that has a run: (task id, runs, USD reported, runs with no USD,
    # tokens); and whether any run of the ledger reported a cost (USD or tokens).
    def task_costs(self, task_ids: list[str]) -> list[tuple[str, int, float, int, int]]: ...
    def costs_reported(self) -> bool: ...
    # -- notifications (issue #49) -------------------------------------------------------
    # Rows as dicts by column name (`notify.py` reads them). `notify_owed` is the events
    # numbered after `from_seq` of `kinds` (None: any; a `notify.test` event only for the
    # endpoint it names) that the endpoint has not settled, in order, each with its
    # delivery's `tries`, `first_at` and `next_at` (None when never tried);
    # `notify_endpoint_rows(..., lock=True)` locks the rows (PostgreSQL: FOR UPDATE).
    def add_notify_event(
        self, event_id: str, kind: str, subject: str, payload: str, at: float
    ) -> None: ...
    def notify_event(self, event_id: str) -> dict[str, Any] | None: ...
    def notify_max_seq(self) -> int: ...
    def notify_events_after(self, after: int, limit: int) -> list[dict[str, Any]]: ...
    def notify_endpoint_rows(
        self, endpoint_id: str | None, *, lock: bool
    ) -> list[dict[str, Any]]: ...
    def put_notify_endpoint(self, row: Mapping[str, Any]) -> None: ...
    def delete_notify_endpoint(self, endpoint_id: str) -> bool: ...
    def notify_owed(
        self, endpoint_id: str, from_seq: int, kinds: tuple[str, ...] | None, limit: int
    ) -> list[dict[str, Any]]: ...
    def notify_backlog(
        self, endpoint_id: str, from_seq: int, kinds: tuple[str, ...] | None
    ) -> int: ...
    def notify_delivery(self, endpoint_id: str, event_seq: int) -> dict[str, Any] | None: ...
    def put_notify_delivery(self, row: Mapping[str, Any]) -> None: ...

    def task_lanes(self, task_ids: list[str]) -> dict[str, tuple[str, str]]:
        """Of each of `task_ids` that ran on a lane: the lane of its last run that had one
        and the owner host of its last run, by task id (`task_lane`, and `runs(...)[-1]`'s
        `owner_host`, for many tasks at once)."""
        ...


class StaleCopy(Exception):
    """A write transaction that decided on the store's copy of a row (`Store.write(
    remembered=True)`) found the row changed since (nothing was written), or lost its
    connection in its one batch: run it again with `remembered=False`. Never leaves the
    ledger.

    `in_doubt` is set when nobody could tell whether the lost batch committed: the error
    the caller hears if the second run fails too (what it found out says nothing of the
    first), so that a failure is never reported as nothing written when something may
    have been. `deadline` is the backend's own (when the caller's wait ends): handed back
    to `Store.write(after=...)`, the second run waits only what is left of it."""

    def __init__(
        self, in_doubt: StorageError | None = None, *, deadline: float | None = None
    ) -> None:
        super().__init__()
        self.in_doubt = in_doubt
        self.deadline = deadline


class Store(Protocol):
    """A backend: transactions over its storage, its schema and its own checks.

    `write(remembered=True)` lets the transaction's hinted reads (`Tx.expect_admission`,
    `Tx.expect_result`) be answered from the rows this store's own last transaction on
    that task left, without asking the database (PostgreSQL: a round trip saved); the
    database checks them when the transaction writes. If they changed, or the block ended
    before anything was checked, the transaction raises `StaleCopy` and nothing is
    written: the caller runs the same block again with `remembered=False`, on rows read
    under the lock. It also raises `StaleCopy` when the connection was lost in the batch
    that carried the whole transaction and the outcome is not known to be a commit (a
    commit it knows of is answered as one): so only a block that is idempotent asks for
    copies (an admission by its request key, a result by its values), and its second run
    finds what the first one did. A backend without copies (SQLite) ignores it and never
    raises it. `after` is the `StaleCopy` the first run raised, given to the second: a
    backend that bounds a caller's whole wait (PostgreSQL: one lock timeout for the pool
    and every lock) bounds both runs by it; SQLite ignores it.
    """

    def read(self) -> contextlib.AbstractContextManager[Tx]: ...
    def write(
        self, *, remembered: bool = False, after: StaleCopy | None = None
    ) -> contextlib.AbstractContextManager[Tx]: ...
    # The ledger's wake number once it differs from `seen`, or after `timeout_s`; `read`
    # reads it (`_core/wake.py`): PostgreSQL listens for its notification, SQLite polls.
    def wait_for_wake(self, seen: int, timeout_s: float, read: Callable[[], int]) -> int: ...
    def schema_version(self) -> int: ...
    def location(self) -> str: ...
    def owner(self) -> str | None: ...
    def storage_problems(self) -> list[str]: ...
    def close(self) -> None: ...
