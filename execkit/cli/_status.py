"""`execkit status`: the dashboard in a terminal.

The table has one row per issue: its task id, board state, ledger state, attempt n/max,
charged, uncharged streak, next attempt, last class and a reason; for an issue blocked on
`work` the reason is the block's and then the last failure's own ("...; last failure:
..."), since "charged budget spent" alone hides what failed. `--watch` redraws it in place
every `--interval` seconds on a terminal (cursor home, clear, table) until Ctrl-C, or
`--count` redraws; not on a terminal it prints each table after a blank line. Every cell
is escaped (`safe_text`): ids, states and reasons come from the board and the agents.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from execkit._budget import BlockedOn, WorkBudget
from execkit._errors import Conflict, InvalidInput, NotFound
from execkit._lanes import LANE_WAIT
from execkit._mask import mask_text
from execkit.cli._dispatch import (
    _add_common,
    _clip,
    _config,
    _tracker_spec,
    _when,
    board_config_of,
    tracker_board,
)
from execkit.cli._ledger import is_remote_url, open_remote, open_target, remote_url
from execkit.cli._output import (
    charged_cell,
    emit,
    print_json_list,
    safe_text,
    started_cell,
    uncharged_cell,
    utc_stamp,
    write_lines,
)
from execkit.dispatch import (
    SPEND_WAIT,
    Board,
    DispatchConfig,
    IssueStatus,
    IssueStatusValues,
    JsonFileBoard,
    issue_status_values,
    iter_issue_status_values,
    workspace_name,
)
from execkit.ledger import (
    DB_ENV_VAR,
    LIST_PAGE,
    SPEND_CAPABILITY,
    Ledger,
    TaskState,
    task_cost_reader,
)

__all__ = ["format_status_table", "register", "status_table_lines", "status_value_lines"]

# Cursor home, then clear the screen: the next table is drawn where the last one was.
REDRAW = "\x1b[H\x1b[2J"
_DEFAULT_WATCH_S = 2.0
_REASON_WIDTH = 160  # a longer reason is clipped with an ellipsis


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.05 <= value <= 86400:
        raise argparse.ArgumentTypeError("must be 0.05..86400 seconds")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `status`."""
    status = sub.add_parser(
        "status",
        help="the dispatcher dashboard: issues, attempts, charges, next retry",
        description="A table of issues: task id, board state, ledger state, attempt n/max, "
        "charged, uncharged streak, next attempt time, last class and reason (for an issue "
        "blocked on work, the last failure's reason too). --watch redraws it in place.",
    )
    status.add_argument(
        "--board",
        metavar="BOARD",
        help="board JSON file (all its issues), or a tracker board: github:OWNER/REPO, "
        "github-project:OWNER/NUMBER, linear:TEAM, gitlab:GROUP/PROJECT, jira:PROJECT (read "
        "through the "
        "dispatcher's client, the token from the environment; with --db or --remote)",
    )
    status.add_argument(
        "--board-config",
        metavar="FILE",
        help="with a tracker board, its settings file (as `execkit dispatch` takes it)",
    )
    status.add_argument(
        "--watch", action="store_true", help="redraw the table in place until Ctrl-C"
    )
    status.add_argument(
        "--interval",
        type=_positive_seconds,
        default=_DEFAULT_WATCH_S,
        metavar="S",
        help=f"seconds between redraws with --watch (default {_DEFAULT_WATCH_S:g})",
    )
    status.add_argument(
        "--count", type=_count, metavar="N", help="with --watch: stop after N redraws"
    )
    status.add_argument(
        "--workspaces",
        metavar="DIR",
        help="each issue's workspace under DIR (as `execkit dispatch --workspaces DIR` made "
        "it): a WORKSPACE table after the issues (`workspace` in --json), `-` for an issue "
        "with none (not made yet, or done and removed)",
    )
    _add_common(status)
    status.set_defaults(handler=_status)


# The work budget's charged bound when the caller names none: `WorkBudget()`'s.
_DEFAULT_BUDGET = WorkBudget().max_attempts


def format_status_table(
    rows: Iterable[IssueStatus], now: float, *, budget: int | None = _DEFAULT_BUDGET
) -> str:
    """The dashboard as an aligned text table: `status_table_lines` joined."""
    return "\n".join(status_table_lines(rows, now, budget=budget))


def status_table_lines(
    rows: Iterable[IssueStatus], now: float, *, budget: int | None = _DEFAULT_BUDGET
) -> Iterator[str]:
    """`status_value_lines` of the rows' values."""
    return status_value_lines(map(issue_status_values, rows), now, budget=budget)


def status_value_lines(
    rows: Iterable[IssueStatusValues],
    now: float,
    *,
    budget: int | None = _DEFAULT_BUDGET,
    spend: SpendCells | None = None,
) -> Iterator[str]:
    """The dashboard as the lines of an aligned text table (the reason column is not
    padded), yielded as `rows` yields them: each row from its values, as `status` reads
    them (no `IssueStatus` built). `status_value_blocks`, a line at a time."""
    return itertools.chain.from_iterable(status_value_blocks(rows, now, budget=budget, spend=spend))


def budget_shown(ledger: Ledger, config: DispatchConfig) -> int | None:
    """The work budget's charged bound a status row shows: the ledger's, or None where a
    negative dispatch cap lifts it (ADR 015's escape hatch)."""
    return None if config.max_attempts < 0 else ledger.budget.max_attempts


def status_value_blocks(
    rows: Iterable[IssueStatusValues],
    now: float,
    *,
    budget: int | None = _DEFAULT_BUDGET,
    spend: SpendCells | None = None,
) -> Iterator[list[str]]:
    """The lines of `status_value_lines`, a block of up to `LIST_PAGE` at a time (the
    header in the first), each block as soon as its rows are read. The counts are named
    as on every surface (`started_cell`, `charged_cell`, `uncharged_cell`): attempts
    started against the binding bound (`1/10 cap`, `1/5 limit`), charged attempts against
    `budget` (the work budget's bound; a row with an explicit limit has none), the
    uncharged streak against its ceiling. NEXT is the later of a task's own backoff and
    its vendor lane's opening, and says which (`in 54s (lane)`).

    `spend` (issue #45) reads the SPEND cells of a block's task ids (`$0.42`, `$0.42+?`
    when some run's USD is unknown; `task_spend_cells`), once a block: the column is shown
    only with it.

    Every cell is escaped (`safe_text`) before the columns are measured, so a control
    character in an issue id, state or reason neither rewrites the terminal nor breaks the
    alignment. Columns are measured over a block at a time and never narrow from one block
    to the next: a table of up to `LIST_PAGE` rows is aligned as a whole, a longer one is
    printed a block at a time, never held whole.
    """
    header: tuple[str, ...] = (
        "ISSUE",
        "TASK",
        "BOARD",
        "LEDGER",
        "STARTED",
        "CHARGED",
        "UNCHARGED",
        "NEXT",
        "LAST CLASS",
        "REASON",
    )
    if spend:
        header = (*header[:-1], "SPEND", header[-1])
    widths = [0] * (len(header) - 1)  # after `header` is final (a SPEND column or not)
    block: list[tuple[str, ...]] = [header]
    append = block.append
    blocked, work = TaskState.BLOCKED, BlockedOn.WORK
    for page, spent in _with_spend(rows, spend):
        for (
            issue_id, _, board_state, task_id, state, bound, attempts, limit, charged, streak,
            at, last_class, last_status, last_reason, reason, explicit, ceiling, waits_on,
        ) in page:  # fmt: skip
            # The reason: the last failure's, or the block's (a work block names both); an open
            # task held by a vendor lane says so first.
            if state is not blocked:
                if reason is None or not reason.startswith((LANE_WAIT, SPEND_WAIT)):
                    reason = last_reason
                elif last_reason:
                    reason = f"{reason}; last failure: {last_reason}"
            elif bound == work and last_reason and last_reason != reason:
                reason = f"{reason or 'blocked on work'}; last failure: {last_reason}"
            reason = reason or "-"
            if not reason.isprintable():  # `safe_text`'s own test, saving its call on a row
                reason = safe_text(reason)
            cells: tuple[Any, ...] = (
                issue_id if issue_id.isprintable() else safe_text(issue_id),
                task_id or "-",
                "-" if board_state is None else safe_text(board_state),
                "-" if state is None else f"{state} ({bound})" if bound else state,
                started_cell(attempts, explicit, limit),
                charged_cell(charged, None if explicit else budget),
                uncharged_cell(streak, ceiling),
                _next_cell(at, waits_on, now),
                last_class or last_status or "-",  # a StrEnum: `%s` writes its value
                reason if len(reason) <= _REASON_WIDTH else _clip(reason, _REASON_WIDTH),
            )
            if spend:
                cells = (*cells[:-1], spent.get(task_id or "", "-"), cells[-1])
            append(cells)
            if len(block) >= LIST_PAGE:
                yield _aligned(block, widths)
                block.clear()
    if block:
        yield _aligned(block, widths)


SpendCells = Callable[[list[str]], Mapping[str, str]]
"""Reads the SPEND cells of a page of task ids (`task_spend_cells`)."""


def task_spend_cells(ledger: Ledger) -> SpendCells | None:
    """How to read each task's SPEND cell (issue #45): the USD its runs reported (`+?`
    when some run's is unknown), a page of task ids at a time (`task_cost_reader`: a read
    a page, so the table's memory does not grow with the ledger); None when no run of the
    ledger reported a cost (the table then shows no SPEND column) or the ledger cannot say
    (a server without `spend.caps`)."""
    if SPEND_CAPABILITY not in ledger.capabilities():
        return None
    read = task_cost_reader(ledger)
    if read is None:
        return None

    def cells(task_ids: list[str]) -> dict[str, str]:
        return {
            task: f"${cost.usd:,.2f}" + ("+?" if cost.unknown_usd else "")
            for task, cost in read(task_ids).items()
        }

    return cells


def _with_spend(
    rows: Iterable[IssueStatusValues], spend: SpendCells | None
) -> Iterator[tuple[list[IssueStatusValues], Mapping[str, str]]]:
    """`rows`, a block's worth at a time (`status_value_blocks`: the first block's header
    takes a line of it), each with its tasks' SPEND cells (none without `spend`): a row is
    read no sooner than the block it is printed in."""
    rows = iter(rows)
    size = max(1, LIST_PAGE - 1)
    while page := list(itertools.islice(rows, size)):
        yield page, spend([row[3] for row in page if row[3]]) if spend else {}
        size = LIST_PAGE


def _aligned(block: list[tuple[str, ...]], widths: list[int]) -> list[str]:
    """`block`'s lines, each column padded to its widest cell so far (`widths`, updated).
    Measured a column at a time and written with one `%` format a line (its pads in it; a
    cell is a `str`, which `%s` writes as it is): a status of 100,000 issues writes 100,000
    lines."""
    for i, column in enumerate(list(zip(*block, strict=True))[:-1]):
        widths[i] = max(widths[i], *map(len, column))
    line_format = "".join(f"%-{width}s  " for width in widths) + "%s"
    return [(line_format % line).rstrip() for line in block]


class _Table(NamedTuple):
    """What `_rows` reads a table from (see there)."""

    now: float
    config: DispatchConfig
    budget: int | None
    rows: Iterator[IssueStatusValues]
    spend: SpendCells | None
    ledger: Ledger


@contextlib.contextmanager
def _rows(args: argparse.Namespace) -> Iterator[_Table]:
    """The dashboard's rows, read while the ledger is open: streamed from one pass over it
    without a board; with one, every issue's row first (a ledger that has no task for any
    of them is refused before anything is printed). With them the time they were read at,
    the dispatch configuration, the work budget's bound the rows show (`budget_shown`),
    the reader of the tasks' SPEND cells (`task_spend_cells`) and the open ledger."""
    tracker = _tracker_spec(args.board) if args.board else None
    board = JsonFileBoard(args.board) if args.board and tracker is None else None
    settings = board_config_of(args, tracker)
    config = _config(args, board, settings.get("dispatch"))
    now = time.time()
    ledger = _status_ledger(args, board)
    try:
        ledger.backoff = config.backoff
        shown: Board | None = board
        if tracker is not None:
            # Read only: the table reads the tracker and the ledger, and writes to neither.
            shown = tracker_board(tracker, ledger, settings, read_only=True)
        rows = iter_issue_status_values(ledger, config, board=shown, now=now)
        if board is not None:
            held = list(rows)
            if held and not any(row.task_id for row in held):
                # A ledger that never saw this board would print a table of blanks.
                raise NotFound(
                    f"the ledger at {ledger.location()} has no task for any issue of "
                    f"{board.path}: it is not the ledger this board was dispatched with (--db?)"
                )
            rows = iter(held)
        yield _Table(
            now, config, budget_shown(ledger, config), rows, task_spend_cells(ledger), ledger
        )
    finally:
        ledger.close()


def _next_cell(at: float | None, waits_on: str | None, now: float) -> str:
    """NEXT: when the row's task is next due (`in 14s`), and on what, where a lane holds
    it (`in 54s (lane)`; a lane only an operator or its probe opens: `on its lane`)."""
    on_lane = waits_on == "lane"  # `IssueStatus.waits_on`
    if at is None:
        return "on its lane" if on_lane else "-"
    shown = _when(at, now)
    if waits_on == "spend":  # a full spend window (issue #45)
        return f"{shown} (budget)"
    return f"{shown} (lane)" if on_lane else shown


def _empty(args: argparse.Namespace) -> str:
    return "no issues" if args.board else "no dispatched issues in the ledger"


def _read(args: argparse.Namespace) -> tuple[float, str]:
    """The table as one text (what `--watch` draws), and the time it was read at."""
    with _rows(args) as table:
        now = table.now
        lines = status_value_lines(table.rows, now, budget=table.budget, spend=table.spend)
        text = "\n".join(lines)
    if args.board is not None:  # masked as the table `status` prints once is
        text = mask_text(text)
    return now, text if "\n" in text else _empty(args)


def _status(args: argparse.Namespace) -> int:
    if args.watch:
        if args.json:
            raise InvalidInput("execkit status: --watch draws a table; drop --json", field="json")
        return watch(args, sys.stdout, time.sleep)
    if args.count is not None:
        raise InvalidInput("execkit status: --count goes with --watch", field="count")
    with _rows(args) as table:
        now, config, budget, rows = table.now, table.config, table.budget, table.rows
        first = list(itertools.islice(rows, 1))  # an error at the first read prints nothing
        if args.workspaces is not None:
            held = [*first, *rows]
            return _with_workspaces(args, now, config, budget, held, Path(args.workspaces))
        if args.json:
            head = {"now": now, "config": config.to_dict()}
            issues = (IssueStatus(*row).to_dict() for row in itertools.chain(first, rows))
            # A board's issues are text from outside: every string masked. Without one,
            # every string is the ledger's (masked as it was stored), as `task list --json`.
            print_json_list("issues", issues, head=head, masked=args.board is not None)
        elif not first:
            emit(_empty(args))
        else:
            # The table as the JSON: masked with a board (its ids and states are outside
            # text), not without (every cell is the ledger's, masked as it was stored, or
            # execkit's own words), as `task list` prints it.
            announced: list[str] = []
            tapped = _tap_announced(table.ledger, itertools.chain(first, rows), announced)
            lines = status_value_lines(tapped, now, budget=budget, spend=table.spend)
            write_lines(lines, masked=args.board is not None)
            if announced:
                write_lines(["", *announced], masked=args.board is not None)
    return 0


# The states of an issue still being worked on: its latest attempt is in flight or due.
_ACTIVE = frozenset({TaskState.RUNNING, TaskState.BACKOFF, TaskState.READY})


def _tap_announced(
    ledger: Ledger, rows: Iterable[IssueStatusValues], said: list[str]
) -> Iterator[IssueStatusValues]:
    """`rows` as they are, adding to `said` the line of each active issue that ran whose
    latest attempt resumed its vendor session after an upstream refusal (`ISS-1  attempt
    2: resumed session ID after the usage limit`) or fell back to a later adapter of its
    order (`ISS-1  attempt 1: fell back from claude/x (stopped ...) to codex/y`) (issue
    #46): only such an issue has one to say. Its tasks are asked a page at a time as the
    rows go by (`Ledger.announced_runs`), so nothing is held but those lines."""
    active: list[tuple[str, str]] = []
    for row in rows:
        if row.task_id and row.attempts >= 1 and row.ledger_state in _ACTIVE:
            active.append((row.issue_id, row.task_id))
            if len(active) >= LIST_PAGE:
                said += _announced_lines(ledger, active)
                active.clear()
        yield row
    if active:
        said += _announced_lines(ledger, active)


def _announced_lines(ledger: Ledger, active: list[tuple[str, str]]) -> list[str]:
    """`_tap_announced`'s lines for a page of `active` issues (their ids and their tasks')."""
    from execkit._attempt import announced

    found = ledger.announced_runs([task_id for _, task_id in active])
    lines: list[str] = []
    for issue_id, task_id in active:
        runs = found.get(task_id)
        if runs:
            last = runs[-1]
            lines += [
                f"{safe_text(issue_id)}  attempt {last.attempt}: {safe_text(said)}"
                for said in announced(runs, last)
            ]
    return lines


def _workspace_at(root: Path, issue_id: str) -> str | None:
    """Where `issue_id`'s workspace is under `root`, when it is there."""
    place = root / workspace_name(issue_id)
    return str(place) if place.is_dir() else None


def _with_workspaces(
    args: argparse.Namespace,
    now: float,
    config: DispatchConfig,
    budget: int | None,
    rows: list[IssueStatusValues],
    root: Path,
) -> int:
    """`status --workspaces DIR`: the rows, and each issue's workspace under DIR (the
    dispatcher's `--workspaces`; the ledger keeps each run's on the run too, `task
    show`)."""
    root = root.absolute()
    places = [_workspace_at(root, row.issue_id) for row in rows]
    masked = args.board is not None
    if args.json:
        head = {"now": now, "config": config.to_dict(), "workspaces": str(root)}
        issues = (
            {**IssueStatus(*row).to_dict(), "workspace": place}
            for row, place in zip(rows, places, strict=True)
        )
        print_json_list("issues", issues, head=head, masked=masked)
        return 0
    if not rows:
        emit(_empty(args))
        return 0
    write_lines(status_value_lines(rows, now, budget=budget), masked=masked)
    widths = max(len("ISSUE"), *(len(safe_text(row.issue_id)) for row in rows))
    lines = [f"{'ISSUE':<{widths}}  WORKSPACE ({safe_text(str(root))})"]
    lines += [
        f"{safe_text(row.issue_id):<{widths}}  {'-' if place is None else safe_text(place)}"
        for row, place in zip(rows, places, strict=True)
    ]
    write_lines(["", *lines], masked=masked)
    return 0


def watch(args: argparse.Namespace, out: Any, sleep: Callable[[float], None]) -> int:
    """Redraw the table every `args.interval` seconds (see the module docstring); `sleep`
    is injected for tests. Ctrl-C ends it with exit 0."""
    terminal = out.isatty()
    drawn = 0
    try:
        while True:
            now, text = _read(args)
            stamp = f"every {args.interval:g}s, Ctrl-C to stop · {utc_stamp(now)}"
            if terminal:
                out.write(f"{REDRAW}{text}\n\n{stamp}\n")
            else:
                out.write(f"{'' if drawn == 0 else os.linesep}{text}\n")
            out.flush()
            drawn += 1
            if args.count is not None and drawn >= args.count:
                return 0
            sleep(args.interval)
    except KeyboardInterrupt:
        if terminal:
            out.write("\n")
        return 0


def _status_ledger(args: argparse.Namespace, board: JsonFileBoard | None) -> Ledger:
    """The ledger a status table is read from: the one `--remote` or `--db` (or their
    variables) names, else the one the board remembers dispatching it (a file, or a server
    URL); refused when the two disagree, or when a board names none and none is given.
    Opened for reading only."""
    binding = board.ledger_binding() if board is not None else None
    url = remote_url(args)
    given = url is not None or args.db is not None or bool(os.environ.get(DB_ENV_VAR))
    if board is not None and binding is None and not given:
        raise NotFound(
            f"board {board.path} names no ledger: it has not been dispatched yet "
            "(`execkit dispatch` records its ledger in it), or give --db"
        )
    ledger: Ledger
    if url is not None:
        target, ledger = url, open_remote(url)
    elif not given and binding is not None and is_remote_url(binding[1]):
        target, ledger = binding[1], open_remote(binding[1])
    else:
        ledger = open_target(
            args.db if given or binding is None else binding[1], create=False, write=False
        )
        target = ledger.location()
    if binding is not None and ledger.ledger_id() != binding[0]:
        ledger.close()
        raise Conflict(
            f"board {board.path if board else ''} was dispatched with ledger {binding[0]} at "
            f"{binding[1]}, not with the one at {target}; drop --db to read the right one"
        )
    return ledger
