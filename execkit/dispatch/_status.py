"""The operator's dashboard: each board issue's board state beside its ledger state."""

from __future__ import annotations

import functools
import itertools
import operator
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import attrs

from execkit._budget import AttemptStatus, BlockedOn
from execkit._classify import FailureClass
from execkit._json import to_json
from execkit._lanes import LaneView
from execkit._mask import mask_text
from execkit._validate import fields_in_order
from execkit.dispatch._board import TASK_TITLE_PREFIX, Board, task_key
from execkit.dispatch._config import DispatchConfig
from execkit.ledger import (
    LANES_CAPABILITY,
    LIST_PAGE,
    SPEND_CAPABILITY,
    LastOutcome,
    Ledger,
    Task,
    TaskState,
    TaskValues,
    WindowUse,
    iter_task_values_with_last,
)

__all__ = [
    "SPEND_WAIT",
    "IssueStatus",
    "IssueStatusValues",
    "issue_status_values",
    "issue_statuses",
    "iter_issue_status_values",
    "iter_issue_statuses",
]


@attrs.frozen
class IssueStatus:
    """One row of the operator's dashboard: the board's view and the ledger's, side by side."""

    issue_id: str
    title: str
    board_state: str | None
    task_id: str | None
    ledger_state: TaskState | None
    blocked_on: BlockedOn | None
    attempts: int
    max_attempts: int | None  # the binding bound: dispatch cap or explicit limit; None = none
    charged_attempts: int
    uncharged_streak: int
    next_attempt_at: float | None
    last_class: FailureClass | None
    last_status: AttemptStatus | None
    last_reason: str | None
    reason: str | None
    explicit_limit: int = 0  # the task's own limit on attempts started; 0 = none
    max_uncharged_attempts: int | None = None  # the ceiling on the uncharged streak
    # What `next_attempt_at` waits for: `backoff` (the task's own retry delay) or `lane`
    # (its vendor lane's opening, when that is later); None when it waits for neither.
    waits_on: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class IssueStatusValues(NamedTuple):
    """An `IssueStatus`'s fields as a tuple, in its order (checked at import): what the
    terminal table writes each row from (`iter_issue_status_values`) without building the
    row, since a status of 100,000 issues built 100,000 of them to write each once.
    `IssueStatus(*values)` is the row; `issue_status_values(row)` gives a row's."""

    issue_id: str
    title: str
    board_state: str | None
    task_id: str | None
    ledger_state: TaskState | None
    blocked_on: BlockedOn | None
    attempts: int
    max_attempts: int | None
    charged_attempts: int
    uncharged_streak: int
    next_attempt_at: float | None
    last_class: FailureClass | None
    last_status: AttemptStatus | None
    last_reason: str | None
    reason: str | None
    explicit_limit: int
    max_uncharged_attempts: int | None
    waits_on: str | None


fields_in_order(IssueStatus, IssueStatusValues._fields, "IssueStatusValues holds them so")
_row_getter = operator.attrgetter(*IssueStatusValues._fields)
# A tuple of the fields, in order, as the row's values: one C call (no Python `__new__`).
_values_of = functools.partial(tuple.__new__, IssueStatusValues)
_NO_LAST = (None, None, None)  # a task never attempted: no last status, class or reason
BACKOFF_WAIT = "backoff"  # `IssueStatus.waits_on`: the task's own retry delay
LANE_WAIT_ON = "lane"  # `IssueStatus.waits_on`: its vendor lane's opening (or an operator)
SPEND_WAIT_ON = "spend"  # `IssueStatus.waits_on`: a full ledger-wide spend window's reopening
SPEND_WAIT = "waiting on the "  # how a row held by a full spend window's reason begins


def issue_status_values(row: IssueStatus) -> IssueStatusValues:
    """`row`'s fields as `IssueStatusValues`."""
    return _values_of(_row_getter(row))


def _status_row(
    issue_id: str,
    title: str,
    board_state: str | None,
    task: Task | TaskValues | None,
    last: LastOutcome | None,
    bound: int | None,
) -> IssueStatusValues:
    """The dashboard row of an issue and its task (None: never dispatched); `bound` is
    `DispatchConfig.bound_for(task)`."""
    if task is None:
        return _values_of(
            (issue_id, title, board_state, None, None, None, 0, bound, 0, 0, None, None, None,
             None, None, 0, None, None)
        )  # fmt: skip
    state = task.state
    last_status, last_class, last_reason = _NO_LAST if last is None else last
    backoff = state is TaskState.BACKOFF
    return _values_of(
        (
            issue_id,
            title,
            board_state,
            task.id,  # task_id
            state,  # ledger_state
            task.blocked_on,
            task.attempts_started,  # attempts
            bound,  # max_attempts
            task.charged_attempts,
            task.uncharged_streak,
            task.next_attempt_at if backoff else None,
            last_class,
            last_status,
            last_reason,
            task.reason,
            task.max_attempts,  # explicit_limit
            task.max_uncharged_attempts,
            BACKOFF_WAIT if backoff else None,  # waits_on
        )
    )


def issue_statuses(
    ledger: Ledger | None,
    config: DispatchConfig,
    *,
    board: Board | None = None,
    now: float | None = None,
) -> list[IssueStatus]:
    """`iter_issue_statuses` as a list."""
    return list(iter_issue_statuses(ledger, config, board=board, now=now))


def iter_issue_statuses(
    ledger: Ledger | None,
    config: DispatchConfig,
    *,
    board: Board | None = None,
    now: float | None = None,
) -> Iterator[IssueStatus]:
    """`iter_issue_status_values`, each row an `IssueStatus`. Raises as it does."""
    return (
        IssueStatus(*values)
        for values in iter_issue_status_values(ledger, config, board=board, now=now)
    )


def iter_issue_status_values(
    ledger: Ledger | None,
    config: DispatchConfig,
    *,
    board: Board | None = None,
    now: float | None = None,
) -> Iterator[IssueStatusValues]:
    """The dashboard rows, each as its `IssueStatusValues`: every board issue (with
    `board`), else every ledger task the dispatcher created. Reads only; an issue never
    dispatched has no task (`task_id` None), and `ledger=None` (no ledger yet) means no
    issue was.

    The ledger is read in one pass (`Ledger.iter_tasks_with_last`, each task as its values:
    a page of tasks a read, each with its last attempt from its summary), never a read per
    issue. Without a board
    the rows are yielded as that pass reads them, so memory does not grow with the ledger;
    with one, the dispatched tasks are held by title to be matched with the board's issues
    (the board is held whole anyway).

    A blocked row whose issue still stands in an eligible board state shows what the
    dispatcher will do with it, not a stop that will not happen: an issue an operator moved
    back after a give-up, or one whose board offers no state to give up into (ADR 015's
    legacy retry), shows the forced retry it gets (that task alone is read again).
    """
    at = time.time() if now is None else now
    cap = config.cap
    dispatched: Iterator[tuple[TaskValues, LastOutcome | None]] = (
        iter(())
        if ledger is None
        # No row shows a time for a ready task (`_status_row`): none is computed for one.
        else iter_task_values_with_last(
            ledger, now=at, cap=cap, title_prefix=TASK_TITLE_PREFIX, ready_times=False
        )
    )
    still_eligible = {i.id for i in board.list_candidates()} if board is not None else set()
    states = getattr(board, "states", None)
    can_give_up = config.failed_state is not None and (
        states is None or config.failed_state in {state.name for state in states}
    )
    # Vendor lanes that do not admit now (issue #28): their open tasks show what they wait on.
    closed = {}
    lanes = None
    if ledger is not None and LANES_CAPABILITY in ledger.capabilities():
        closed = {view.lane: view for view in ledger.list_lanes(now=at) if not view.admits}
        if closed:
            # Only then the dispatcher's lanes (and the adapter registry they read) load.
            from execkit.dispatch._lanes import DispatchLanes

            lanes = DispatchLanes(ledger)
            lanes.bind(ledger.ledger_id())

    # A ledger-wide spend window with no room for a run (issue #45): every open task that
    # is not running waits for it to reopen (the one that reopens last, if several).
    spend_full: WindowUse | None = None
    if ledger is not None and SPEND_CAPABILITY in ledger.capabilities():
        full = [use for use in ledger.spend_windows(now=at) if use.full and use.lane is None]
        spend_full = max(full, key=lambda use: use.reopens_at, default=None)
    bounds: dict[int, int | None] = {}
    # While a lane is closed: the lane of each open task that is not running, read a page
    # of tasks at a time (`Ledger.task_lanes`), never a read a task.
    task_lanes: dict[str, LaneView] = {}

    def may_wait(task: Task | TaskValues) -> bool:
        return task.status == "open" and task.state is not TaskState.RUNNING

    def read_lanes(page: list[tuple[TaskValues, LastOutcome | None]]) -> None:
        if closed and ledger is not None:
            ids = [task.id for task, _ in page if may_wait(task)]
            if ids:
                task_lanes.update(ledger.task_lanes(ids, now=at))

    def waiting(task: Task | TaskValues, adapter: str | None) -> LaneView | None:
        if not closed or not may_wait(task):
            return None
        view = task_lanes.get(task.id)
        if (view is None or view.admits) and lanes is not None and adapter is not None:
            view = lanes.closed(adapter, closed)
        return None if view is None or view.admits else view

    def row(
        issue_id: str,
        title: str,
        board_state: str | None,
        found: tuple[TaskValues, LastOutcome | None] | None,
        adapter: str | None = None,
    ) -> IssueStatusValues:
        if ledger is None or found is None:
            return _status_row(issue_id, title, board_state, None, None, config.bound_for(None))
        task: Task | TaskValues
        task, last = found
        if (
            task.state is TaskState.BLOCKED
            and task.blocked_on is not BlockedOn.ATTEMPT_LIMIT
            and issue_id in still_eligible
            and (not can_give_up or task.gave_up_at_attempt == task.attempts_started)
        ):
            task = ledger.get_task(task.id, now=at, cap=cap, force=True)
        limit = task.max_attempts  # the binding bound depends on the limit alone
        if limit in bounds:
            bound = bounds[limit]
        else:
            bound = bounds[limit] = config.bound_for(task)
        shown = _status_row(issue_id, title, board_state, task, last, bound)
        held = waiting(task, adapter) if closed else None  # no lane closed: none waits
        if held is not None:
            return _held(shown, held)
        if spend_full is not None and may_wait(task) and task.state is not TaskState.BLOCKED:
            return _spent(shown, spend_full)
        return shown

    if board is None and not closed and spend_full is None:
        # No forced retry to show, no lane nor spend window to wait on.
        yield from _ledger_rows(dispatched, config)
        return
    if board is None:
        for page in _pages(dispatched):
            read_lanes(page)
            for task, last in page:
                yield row(task.title[len(TASK_TITLE_PREFIX) :], "", None, (task, last))
            task_lanes.clear()
        return
    tasks: dict[str, tuple[TaskValues, LastOutcome | None]] = {}
    for page in _pages(dispatched):
        read_lanes(page)
        tasks.update((task.title, (task, last)) for task, last in page)
    # A task's title is its issue's key as stored, masked: the key itself unless the issue
    # id held a credential. Only then (a stored title holds the mask) is a key masked to be
    # looked up, so a board of 200,000 issues is not 200,000 calls of the redactor.
    from execkit._redact import REDACTED  # the redactor loads on first use

    any_masked = any(REDACTED in title for title in tasks)
    for issue in board.list_issues():
        key = task_key(issue.id)
        found = tasks.get(key)
        if found is None and any_masked:
            found = tasks.get(mask_text(key))
        yield row(issue.id, issue.title, issue.state, found, config.adapter_of(issue))


def _held(shown: IssueStatusValues, lane: LaneView) -> IssueStatusValues:
    """`shown`, an open task's row, held by `lane` (which does not admit): its reason says
    so, and its next attempt is the later of its own backoff and the lane's opening (a lane
    only an operator or a probe's result opens has none: the row waits on the lane)."""
    from execkit.dispatch._lanes import waiting_reason  # loaded by the caller: a lane is closed

    own = shown.next_attempt_at
    if lane.opens_at is not None and own is not None and own >= lane.opens_at:
        return shown._replace(reason=waiting_reason(lane))
    return shown._replace(
        reason=waiting_reason(lane), next_attempt_at=lane.opens_at, waits_on=LANE_WAIT_ON
    )


def _spent(shown: IssueStatusValues, window: WindowUse) -> IssueStatusValues:
    """`shown`, an open task's row, held by a full spend window until it reopens: "waiting
    on the day's budget until 2027-01-16T00:00:00+00:00" (issue #45)."""
    from execkit._stamp import utc_stamp

    reason = f"{SPEND_WAIT}{window.name.removeprefix('the ')} until {utc_stamp(window.reopens_at)}"
    own = shown.next_attempt_at
    if own is not None and own >= window.reopens_at:
        return shown._replace(reason=reason)
    return shown._replace(reason=reason, next_attempt_at=window.reopens_at, waits_on=SPEND_WAIT_ON)


def _pages(
    dispatched: Iterator[tuple[TaskValues, LastOutcome | None]],
) -> Iterator[list[tuple[TaskValues, LastOutcome | None]]]:
    """`dispatched` a list of at most `LIST_PAGE` at a time."""
    while page := list(itertools.islice(dispatched, LIST_PAGE)):
        yield page


def _ledger_rows(
    dispatched: Iterator[tuple[TaskValues, LastOutcome | None]], config: DispatchConfig
) -> Iterator[IssueStatusValues]:
    """The rows of the dispatched tasks as `row` makes them when no board is read (so no
    issue stands eligible: no forced retry to show) and no lane is closed (no task waits
    on one): each task's values unpacked at once, its row one tuple. The dashboard of a
    ledger of 100,000 tasks is this loop; tests/test_bulk_projection.py holds it to
    `row`'s fields."""
    start = len(TASK_TITLE_PREFIX)
    backoff = TaskState.BACKOFF
    backoff_wait = BACKOFF_WAIT
    bounds: dict[int, int | None] = {}
    for task, last in dispatched:
        (
            task_id, title, _, state, blocked_on, reason, _, limit, attempts, charged, streak,
            _, next_at, _, _, ceiling, _, _,
        ) = task  # fmt: skip
        if limit in bounds:  # the binding bound depends on the limit alone
            bound = bounds[limit]
        else:
            bound = bounds[limit] = config.bound_for(task)
        last_status, last_class, last_reason = _NO_LAST if last is None else last
        waits = state is backoff
        yield _values_of(
            (
                title[start:], "", None, task_id, state, blocked_on, attempts, bound, charged,
                streak, next_at if waits else None, last_class, last_status,
                last_reason, reason, limit, ceiling, backoff_wait if waits else None,
            )
        )  # fmt: skip
