"""What the operator's dashboard shows, read from one ledger: the board's columns and
cards, the retries table, the blocked cards with their fix, the runs in flight, a task's
history and the attempts over time by class (docs/dashboard.md). No HTTP here: the routes
(`_dashboard_http`) and the metrics (`_metrics`) both read a `LedgerView`.

The board. Given the board the ledger's tasks were dispatched from (`execkit serve --board
FILE`), the board panel is that board: its own columns in its order, each issue a card
under the column the board has it in, titled with the issue's title, with its task's
attempts and last failure once it has been dispatched. Every card, row and task page then
carries the issue's title too. A board bound to another ledger (`BindableBoard`) is
refused (Conflict): its cards would be a table of blanks. Without one the columns are the
ledger's task states and a card is named by its issue id (a task's title is `board:<id>`).

Cost. A snapshot is one `list_tasks` plus one `runs(task_id)` per task whose summary
changed since the last snapshot: the runs of a task are cached under its summary (state,
attempts started, charged, streak, next attempt, status), which every finished or admitted
run changes, so a board that stands still costs one query per refresh whatever its size
(a running task is read again every time, for its lease). Snapshots are shared for
`ttl_s` between all viewers, so ten open pages cost what one does. What a page carries is
bounded too: each column lists at most `max_cards` cards and says how many more there are.
A view that cannot read the ledger raises the ledger's `ExecKitError`; nothing is cached
from a failed read.

Lanes: `LedgerView.lanes()` and `resume_lane()` read the ledger's vendor lanes
(`list_lanes`, `resume_lane`, issue #28); a ledger without them (a stand-in) has no lanes
panel, no lanes series and no resume action (404).

The chart per lane. A run does not carry its lane; each lane's history does (every run
bound to a lane leaves one result event there, with its run id, when it ends: a missing
binary's on `lane@host`, counted under `lane`). So a refresh reads `lane_history` for at
most `MAX_LANES_READ` lanes (the most recently changed first), and only when a lane or
the set of finished runs changed since the last refresh: a board that stands still reads
no history. The chart has at most `CHART_MAX_LANES` lane series (those with the most
attempts), then "other lanes" and "no lane", each of `CHART_BUCKETS` slices. When more
lanes exist than are read, the runs of the unread ones cannot be told from runs with no
lane: the chart says how many lanes went unread, and its last series is named "no lane or
an unread lane".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from execkit._budget import AttemptStatus, BlockedOn, TaskState
from execkit._errors import Conflict, ExecKitError, InvalidInput, NotFound
from execkit._lanes import LaneKey
from execkit.dispatch import BindableBoard, Board, BoardIssue, task_key
from execkit.ledger import Actor, Ledger, Run, Task, spend_of

__all__ = [
    "CHART_BUCKETS",
    "CHART_MAX_LANES",
    "COLUMNS",
    "DEFAULT_MAX_CARDS",
    "MAX_LANES_READ",
    "NO_LANE",
    "OTHER_LANES",
    "LedgerView",
    "charged",
    "chart",
    "fix_for",
    "issue_of",
    "run_row",
]

# The board's columns, left to right: the order a card travels.
COLUMNS: tuple[TaskState, ...] = (
    TaskState.READY,
    TaskState.RUNNING,
    TaskState.BACKOFF,
    TaskState.BLOCKED,
    TaskState.DONE,
    TaskState.CANCELLED,
)
# `board:`: the title prefix of a task a dispatcher made for a board issue.
TASK_TITLE_PREFIX = task_key("")
DEFAULT_MAX_CARDS = 100
DEFAULT_TTL_S = 1.0
CHART_BUCKETS = 24
# The chart's lane series: at most this many lanes drawn on their own (those with the most
# attempts), the rest summed as OTHER_LANES, runs bound to no lane as NO_LANE.
CHART_MAX_LANES = 8
# The lane histories one refresh reads at most (one query each): lanes are an adapter and
# a credential (and a host for a missing binary), a handful on any real ledger.
MAX_LANES_READ = 64
NO_LANE = "no lane"
OTHER_LANES = "other lanes"
UNREAD_LANE = "no lane or an unread lane"

# What each blocked card tells the operator to do. An environment block's reason names the
# missing precondition and its fix already (the adapter's precondition): the fix says so.
_FIXES: Mapping[BlockedOn, str] = {
    BlockedOn.ENVIRONMENT: "fix the precondition the reason names (install the program, log "
    "in, add credit), then retry once",
    BlockedOn.WORK: "the charged budget is spent on failures of the work itself: read the "
    "last failure, change the task or its prompt, then retry once",
    BlockedOn.UPSTREAM: "the vendor kept refusing (uncharged): retry once when it answers again",
    BlockedOn.ATTEMPT_LIMIT: "the task's explicit attempt limit is reached: retry once "
    "(raises it by one) or raise it with `execkit task set-attempt-limit`",
    BlockedOn.DISPATCH_CAP: "the dispatcher's cap per issue is reached: retry once, or "
    "raise --max-attempts",
    BlockedOn.SPEND: "the task's own spend cap is spent: raise it with `execkit task "
    "set-budget`, which retries it once (retry once alone meets the same cap)",
}


def fix_for(blocked_on: BlockedOn | None) -> str | None:
    """The fix a blocked card names (None for a card that is not blocked)."""
    return _FIXES.get(blocked_on) if blocked_on is not None else None


def issue_of(task: Task) -> str | None:
    """The board issue id of a task a dispatcher created (`board:<id>`), else None."""
    if task.title.startswith(TASK_TITLE_PREFIX):
        return task.title[len(TASK_TITLE_PREFIX) :]
    return None


def charged(run: Run) -> bool | None:
    """Whether a finished run was charged (the budget's rule, `_budget`); None while it runs."""
    if run.status is AttemptStatus.RUNNING:
        return None
    if run.status is AttemptStatus.FAILED:
        return run.failure_class is None or run.failure_class.charged
    return True  # succeeded (informative) or abandoned (nothing proved it was not)


def _class_of(run: Run) -> str:
    if run.status is AttemptStatus.FAILED:
        return run.failure_class.value if run.failure_class else "work"
    return run.status.value  # succeeded, abandoned, running


def run_row(run: Run) -> dict[str, Any]:
    """A run as the dashboard shows it: its wire shape plus `class` and `charged`."""
    row = run.to_dict()
    row["class"] = _class_of(run)
    row["charged"] = charged(run)
    return row


def _summary_key(task: Task) -> tuple[Any, ...]:
    return (
        task.status,
        task.state,
        task.attempts_started,
        task.charged_attempts,
        task.uncharged_streak,
        task.next_attempt_at,
        task.retry_pending,
    )


def _limit(task: Task) -> int | None:
    return task.max_attempts or None


class LedgerView:
    """A cached reading of one ledger for the dashboard and the metrics (thread-safe).

    `clock` is the wall clock (injected for tests); `ttl_s` how long one snapshot serves
    every viewer; `max_cards` the cards per column a snapshot lists; `board` the board the
    tasks were dispatched from, whose columns and titles the page then shows (Conflict
    when it is bound to another ledger).
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        board: Board | None = None,
        clock: Callable[[], float] = time.time,
        ttl_s: float = DEFAULT_TTL_S,
        max_cards: int = DEFAULT_MAX_CARDS,
    ) -> None:
        if isinstance(board, BindableBoard):
            bound = board.ledger_binding()
            if bound is not None and bound[0] != ledger.ledger_id():
                raise Conflict(
                    f"the board was dispatched with ledger {bound[0]} at {bound[1]}, not "
                    f"with the one served ({ledger.location()}): serve that ledger (--db)"
                )
        self.board = board
        self._issues: list[BoardIssue] = []
        self._titles: dict[str, str] = {}
        self._board_error: str | None = None
        self._column_names: list[str] = []
        self.ledger = ledger
        self.clock = clock
        self.ttl_s = ttl_s
        self.max_cards = max_cards
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[tuple[Any, ...], list[Run]]] = {}
        self._snapshot: dict[str, Any] | None = None
        self._snapshot_at = 0.0
        self._tasks: list[Task] = []
        self._all_runs: list[Run] = []
        self._lanes: list[dict[str, Any]] | None = None
        self._notify: list[dict[str, Any]] | None = None
        self._spend: dict[str, Any] | None = None
        # run id -> its lane (without a host), from the lanes' histories; None: no lanes.
        self._lane_of: dict[str, str] | None = None
        self._lanes_unread = 0
        self._finished: frozenset[str] = frozenset()

    # -- reading ------------------------------------------------------------------------

    def _refresh(self, now: float) -> None:
        """Under the lock: the task list, and the runs of every task that changed."""
        tasks = self.ledger.list_tasks(now=now)
        seen: dict[str, tuple[tuple[Any, ...], list[Run]]] = {}
        for task in tasks:
            if task.attempts_started == 0:
                continue
            key = _summary_key(task)
            cached = self._runs.get(task.id)
            if cached is not None and cached[0] == key and task.state is not TaskState.RUNNING:
                seen[task.id] = cached
            else:
                seen[task.id] = (key, self.ledger.runs(task.id))
        self._runs = seen  # tasks gone from the list drop out of the cache
        self._tasks = tasks
        if self.board is not None:
            # A board file is re-read only when it changed (JsonFileBoard keeps its parse).
            # One that cannot be read (a hand edit half saved, a typo) leaves the last
            # good one shown, and says why: the ledger's panels and /metrics go on.
            try:
                issues = self.board.list_issues()
                states = getattr(self.board, "states", ())
                self._issues, self._column_names = issues, [state.name for state in states]
                self._board_error = None
            except ExecKitError as exc:
                self._board_error = f"{exc.code}: {exc.message}"
            self._titles = {issue.id: issue.title for issue in self._issues if issue.title}
        self._all_runs = [run for _key, runs in seen.values() for run in runs]
        # The lanes' histories are read again only when a lane or the set of finished
        # runs changed (a run's lane is known once it has ended).
        finished = frozenset(r.id for r in self._all_runs if r.status is not AttemptStatus.RUNNING)
        lanes = self._read_lanes(now)
        if lanes != self._lanes or finished != self._finished or self._lane_of is None:
            self._lane_of = self._read_lane_runs(lanes)
        self._lanes = lanes
        self._finished = finished
        self._notify = self._read_notify()
        self._spend = self._read_spend(now)

    def _read_spend(self, now: float) -> dict[str, Any] | None:
        """What the spend caps' windows hold now, and what each lane's runs cost today
        (UTC) (issue #45); None for a ledger without caps (a stand-in, an older server)."""
        windows = getattr(self.ledger, "spend_windows", None)
        if windows is None or not callable(windows):
            return None
        day_start = now - now % 86400
        today: dict[str, dict[str, Any]] = {}
        for run in self._all_runs:
            if run.started_at < day_start or not run.usage.known:
                continue
            lane = (self._lane_of or {}).get(run.id) or "-"
            row = today.setdefault(lane, {"lane": lane, "usd": 0.0, "tokens": 0, "runs": 0,
                                          "unknown_usd": 0})  # fmt: skip
            row["runs"] += 1
            row["tokens"] += run.usage.tokens
            if run.usd is None:
                row["unknown_usd"] += 1
            else:
                row["usd"] += run.usd
        return {
            "windows": [use.to_dict() for use in windows(now=now)],
            "lanes_today": sorted(today.values(), key=lambda row: -row["usd"]),
        }

    def _read_notify(self) -> list[dict[str, Any]] | None:
        """Each notification endpoint and its health (issue #49); None for a ledger
        without them (a stand-in)."""
        listing = getattr(self.ledger, "notify_endpoints", None)
        if listing is None or not callable(listing):
            return None
        return [endpoint.to_dict() for endpoint in listing()]

    def _read_lanes(self, now: float) -> list[dict[str, Any]] | None:
        list_lanes = getattr(self.ledger, "list_lanes", None)
        if list_lanes is None or not callable(list_lanes):
            return None
        return [lane.to_dict() for lane in list_lanes(now=now)]

    def _read_lane_runs(self, lanes: list[dict[str, Any]] | None) -> dict[str, str] | None:
        """Which lane each finished run went through, from the lanes' histories."""
        history = getattr(self.ledger, "lane_history", None)
        if lanes is None or history is None or not callable(history):
            self._lanes_unread = 0
            return None
        # The most recently changed lanes first: those are the ones with recent attempts.
        ordered = sorted(lanes, key=lambda lane: (-(lane.get("updated_at") or 0.0), lane["lane"]))
        read = ordered[:MAX_LANES_READ]
        self._lanes_unread = len(ordered) - len(read)
        lane_of: dict[str, str] = {}
        for lane in read:
            try:
                name = str(LaneKey.parse(lane["lane"]).without_host())
            except InvalidInput:
                name = str(lane["lane"])
            for event in history(lane["lane"]):
                if event.run_id is not None:
                    lane_of[event.run_id] = name
        return lane_of

    def snapshot(self) -> dict[str, Any]:
        """The whole page's data (JSON-safe), at most `ttl_s` old."""
        with self._lock:
            now = self.clock()
            if self._snapshot is not None and 0 <= now - self._snapshot_at < self.ttl_s:
                return self._snapshot
            self._refresh(now)
            self._snapshot = self._build(now)
            self._snapshot_at = now
            return self._snapshot

    def invalidate(self) -> None:
        """Take the next snapshot afresh (after an action changed the ledger)."""
        with self._lock:
            self._snapshot = None

    def tasks_and_runs(self) -> tuple[list[Task], list[Run]]:
        """The tasks and every run of the last snapshot (taken now if it is stale)."""
        self.snapshot()
        with self._lock:
            return list(self._tasks), list(self._all_runs)

    def task_page(self, task_id: str) -> dict[str, Any]:
        """One task, its card and its run history, read now (`NotFound` if none)."""
        task = self.ledger.get_task(task_id)
        runs = self.ledger.runs(task_id)
        cost = spend_of(runs)
        return {
            "now": self.clock(),
            "card": self._card(task, runs[-1] if runs else None),
            "runs": [run_row(run) for run in runs],
            "spend": {**cost.to_dict(), "phrase": cost.phrase()},
        }

    def lanes(self) -> list[dict[str, Any]] | None:
        """The vendor lanes of the last snapshot (`LaneView.to_dict()`: `lane`, `state`,
        `reason`, `opens_at`...; taken now if it is stale), or None when the ledger has no
        `list_lanes` (a stand-in): the page then shows no lanes panel."""
        self.snapshot()
        with self._lock:
            return None if self._lanes is None else list(self._lanes)

    def resume_lane(self, lane: str, actor: Actor) -> dict[str, Any]:
        """An operator's resume of one lane (`resume_lane`, audited by the ledger);
        `NotFound` when the ledger has no lanes."""
        resume = getattr(self.ledger, "resume_lane", None)
        if resume is None or not callable(resume):
            raise NotFound("this ledger has no vendor lanes")
        view = resume(lane, actor=actor, reason="resume (dashboard)")
        self.invalidate()
        result: dict[str, Any] = view.to_dict()
        return result

    # -- building ----------------------------------------------------------------------

    def _last(self, task: Task) -> Run | None:
        cached = self._runs.get(task.id)
        return cached[1][-1] if cached and cached[1] else None

    def _card(self, task: Task, last: Run | None) -> dict[str, Any]:
        last_failed = last is not None and last.status in (
            AttemptStatus.FAILED,
            AttemptStatus.ABANDONED,
        )
        issue = issue_of(task)
        return {
            "task_id": task.id,
            "issue": issue,
            "issue_title": self._titles.get(issue) if issue is not None else None,
            "board_state": None,
            "title": task.title,
            "state": task.state.value,
            "blocked_on": task.blocked_on.value if task.blocked_on else None,
            "reason": task.reason,
            "fix": fix_for(task.blocked_on),
            "attempts": task.attempts_started,
            "max_attempts": _limit(task),
            "charged": task.charged_attempts,
            "uncharged_streak": task.uncharged_streak,
            "next_attempt_at": task.next_attempt_at if task.state is TaskState.BACKOFF else None,
            "retry_pending": task.retry_pending,
            "last_class": _class_of(last) if last is not None and last_failed else None,
            "last_reason": last.reason if last is not None and last_failed else None,
        }

    def _issue_card(self, issue: BoardIssue, task: Task | None) -> dict[str, Any]:
        """A board issue's card: its task's card with the board's column, or (never
        dispatched) the issue alone."""
        if task is not None:
            card = self._card(task, self._last(task))
        else:
            card = {
                "task_id": None,
                "issue": issue.id,
                "issue_title": None,
                "title": task_key(issue.id),
                "state": None,
                "blocked_on": None,
                "reason": None,
                "fix": None,
                "attempts": 0,
                "max_attempts": None,
                "charged": 0,
                "uncharged_streak": 0,
                "next_attempt_at": None,
                "retry_pending": False,
                "last_class": None,
                "last_reason": None,
            }
        card["issue_title"] = issue.title or None
        card["board_state"] = issue.state
        return card

    def _board_columns(self) -> list[dict[str, Any]]:
        """The board's own columns, in its order, each with its issues in the board's
        order (at most `max_cards`)."""
        by_column: dict[str, list[BoardIssue]] = {name: [] for name in self._column_names}
        for issue in self._issues:
            by_column.setdefault(issue.state, []).append(issue)
        tasks = {issue_of(task): task for task in self._tasks}
        columns = []
        for name, issues in by_column.items():
            shown = issues[: self.max_cards]
            columns.append(
                {
                    "state": name,
                    "count": len(issues),
                    "more": len(issues) - len(shown),
                    "cards": [self._issue_card(i, tasks.get(i.id)) for i in shown],
                }
            )
        return columns

    def _build(self, now: float) -> dict[str, Any]:
        by_state: dict[TaskState, list[Task]] = {state: [] for state in COLUMNS}
        for task in self._tasks:
            by_state.setdefault(task.state, []).append(task)
        columns = []
        for state in COLUMNS if self.board is None else ():
            tasks = by_state[state]
            # The newest first: what just changed is what the operator looks for.
            shown = sorted(tasks, key=lambda t: t.created_at, reverse=True)[: self.max_cards]
            columns.append(
                {
                    "state": state.value,
                    "count": len(tasks),
                    "more": len(tasks) - len(shown),
                    "cards": [self._card(t, self._last(t)) for t in shown],
                }
            )
        retrying = sorted(
            (
                t
                for t in self._tasks
                if t.attempts_started > 0 and t.state in (TaskState.BACKOFF, TaskState.READY)
            ),
            key=lambda t: (t.next_attempt_at or 0.0, t.id),
        )
        blocked = by_state[TaskState.BLOCKED]
        return {
            "now": now,
            "counts": {state.value: len(by_state[state]) for state in COLUMNS},
            # The board's own columns when it is given, else the ledger's task states.
            "columns_from": "ledger" if self.board is None else "board",
            "board_error": self._board_error,
            "columns": columns if self.board is None else self._board_columns(),
            "retries": [self._card(t, self._last(t)) for t in retrying[: self.max_cards]],
            "retries_more": max(0, len(retrying) - self.max_cards),
            "blocked": [self._card(t, self._last(t)) for t in blocked[: self.max_cards]],
            "in_flight": self._in_flight(),
            "chart": chart(
                self._all_runs, now, lane_of=self._lane_of, lanes_unread=self._lanes_unread
            ),
            "lanes": self._lanes,
            "notify": self._notify,
            "spend": self._spend,
        }

    def _in_flight(self) -> list[dict[str, Any]]:
        rows = []
        for task in self._tasks:
            if task.state is not TaskState.RUNNING:
                continue
            cached = self._runs.get(task.id)
            for run in cached[1] if cached else ():
                if run.status is AttemptStatus.RUNNING:
                    rows.append(
                        {
                            "task_id": task.id,
                            "issue": issue_of(task),
                            "issue_title": self._titles.get(issue_of(task) or ""),
                            "run_id": run.id,
                            "attempt": run.attempt,
                            "host": run.owner_host,
                            "pid": run.owner_pid,
                            "dispatcher": run.actor,
                            "since": run.started_at,
                            "lease_expires_at": run.lease_expires_at,
                            # Where its agent works (issue #46), when the run says.
                            "workspace": run.workspace,
                        }
                    )
        rows.sort(key=lambda row: (row["since"], row["run_id"]))
        return rows[: self.max_cards]


_CHART_CLASSES = ("work", "environment", "upstream", "succeeded", "abandoned")


def _empty_series(start: float, width: float, buckets: int) -> list[dict[str, Any]]:
    return [
        {
            "start": start + i * width,
            **dict.fromkeys(_CHART_CLASSES, 0),
            "charged": 0,
            "uncharged": 0,
        }
        for i in range(buckets)
    ]


def chart(
    runs: Iterable[Run],
    now: float,
    buckets: int = CHART_BUCKETS,
    *,
    lane_of: Mapping[str, str] | None = None,
    lanes_unread: int = 0,
    max_lanes: int = CHART_MAX_LANES,
) -> dict[str, Any]:
    """Finished attempts over time: `buckets` equal slices from the first attempt to `now`,
    each with its count per class and charged/uncharged (the running ones are left out).

    With `lane_of` (run id -> lane), `lanes` holds the same slices per lane: at most
    `max_lanes` lanes (the most attempts first, then by name), then `OTHER_LANES` for the
    rest and `NO_LANE` for runs `lane_of` does not name (`UNREAD_LANE` when `lanes_unread`
    lanes were not read), each `{lane, attempts, charged, uncharged, buckets}`; without it
    (a ledger with no lanes) `lanes` is None."""
    finished = [run for run in runs if run.status is not AttemptStatus.RUNNING]
    start = min((run.started_at for run in finished), default=now)
    span = max(now - start, 60.0)
    width = span / buckets
    series = _empty_series(start, width, buckets)
    slot_of: list[int] = []
    for run in finished:
        at = run.ended_at if run.ended_at is not None else run.started_at
        index = min(buckets - 1, max(0, int((at - start) / width)))
        slot_of.append(index)
        slot = series[index]
        slot[_class_of(run)] += 1
        slot["charged" if charged(run) else "uncharged"] += 1
    doc: dict[str, Any] = {
        "start": start,
        "end": start + span,
        "width_s": width,
        "buckets": series,
        "lanes": None,
    }
    if lane_of is None:
        return doc
    nameless = UNREAD_LANE if lanes_unread else NO_LANE
    names = [lane_of.get(run.id, nameless) for run in finished]
    counts: dict[str, int] = {}
    for name in names:
        if name != nameless:
            counts[name] = counts.get(name, 0) + 1
    ranked = sorted(counts, key=lambda name: (-counts[name], name))
    own = set(ranked[:max_lanes])
    order = [*sorted(own), *([OTHER_LANES] if len(ranked) > max_lanes else [])]
    if nameless in names:
        order.append(nameless)
    per_lane = {name: _empty_series(start, width, buckets) for name in order}
    totals_of = {name: {"attempts": 0, "charged": 0, "uncharged": 0} for name in order}
    for run, name, index in zip(finished, names, slot_of, strict=True):
        if name != nameless and name not in own:
            name = OTHER_LANES
        slot = per_lane[name][index]
        slot[_class_of(run)] += 1
        side = "charged" if charged(run) else "uncharged"
        slot[side] += 1
        totals_of[name]["attempts"] += 1
        totals_of[name][side] += 1
    doc["lanes"] = [{"lane": name, **totals_of[name], "buckets": per_lane[name]} for name in order]
    doc["lanes_unread"] = lanes_unread
    return doc


def totals(runs: Sequence[Run]) -> dict[tuple[str, bool], int]:
    """Finished attempts counted by (class, charged), for the metrics."""
    counted: dict[tuple[str, bool], int] = {}
    for run in runs:
        was = charged(run)
        if was is None:
            continue
        key = (_class_of(run), was)
        counted[key] = counted.get(key, 0) + 1
    return counted
