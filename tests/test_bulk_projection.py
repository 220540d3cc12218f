"""The listing's one projection, from a stored row to what is shown, checked against the
rule it replaced, on both backends: every kind of task lists as a decision on its whole
history says it stands (`decide` over its runs, the projection before the listing skipped
anything), its `--json` text is what `json.dumps` writes for it and its line is the line
the listing printed, while a done or cancelled task is shown without a decision or a
summary built, and `db check` validates a sound run without `Attempt`'s validators.

Nothing here is timed (benchmarks/bench_bulk.py measures the commands at 100,000 tasks);
the counts are of the work done per task and per run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from ledger_backends import AnyLedger

import execkit.ledger._core.base as base_module
import execkit.ledger._core.store as store_module
from execkit._budget import (
    Attempt,
    BlockedOn,
    Decision,
    ExplicitLimit,
    HistorySummary,
    TaskState,
    WorkBudget,
    decide_summary,
    summarize,
)
from execkit._classify import FailureClass
from execkit.cli._ledger import _task_line, task_json
from execkit.cli._output import safe_text
from execkit.ledger import Task, TaskStatus, iter_task_values, task_values

ME = "bench"
OPERATOR = "operator"
NOW = 5000.0


def _every_kind(ledger: AnyLedger, prefix: str = "task ") -> dict[str, str]:
    """One task of every kind a listing shows, by name: its id (its title `prefix` and
    the name)."""
    made: dict[str, str] = {}
    keys = iter(range(1000))

    def task(name: str, **limits: Any) -> str:
        made[name] = ledger.create_task(f"{prefix}{name}", actor=ME, now=1000.0, **limits).id
        return made[name]

    def run(task_id: str, status: str | None, at: float = 1001.0, **result: Any) -> None:
        started = ledger.start_run(
            task_id, actor=ME, request_key=f"k{next(keys)}", ignore_backoff=True, now=at
        )
        if status is not None:
            ledger.finish_run(started.id, status, now=at + 1.0, **result)

    upstream: dict[str, Any] = {"failure_class": FailureClass.UPSTREAM, "reason": "HTTP 503"}
    environment: dict[str, Any] = {
        "failure_class": FailureClass.ENVIRONMENT,
        "reason": "no credentials",
    }
    task("new")
    run(task("running"), None)
    run(task("done"), "succeeded")
    run(task("work failed, backoff over"), "failed", reason="tests failed")
    run(task("upstream, backing off"), "failed", at=NOW - 2.0, **upstream)
    run(task("vendor reset"), "failed", not_before=9000.0, **upstream)
    run(task("environment"), "failed", **environment)
    run(task("own ceiling", max_uncharged_attempts=1), "failed", **upstream)
    run(task("explicit limit", max_attempts=1), "failed")
    spent = task("work budget spent")
    for _ in range(3):
        run(spent, "failed", reason="tests failed again")
    run(task("stopped"), "abandoned", stopped=True)
    pending = task("retry pending")
    run(pending, "failed", **environment)
    ledger.retry_task(pending, actor=OPERATOR, reason="fixed", now=2000.0)
    given_up = task("given up")
    run(given_up, "failed", **environment)
    ledger.record_give_up(given_up, state="blocked", actor=ME, now=2000.0)
    ledger.cancel_task(task("cancelled"), actor=ME, now=2000.0)
    cancelled_after = task("cancelled after a run")
    run(cancelled_after, "failed", **upstream)
    ledger.cancel_task(cancelled_after, actor=ME, now=2000.0)
    made["odd title"] = ledger.create_task(
        'naïve "quoted" \\ ☃ \u2028 tab\tend', actor=ME, now=1000.0
    ).id
    return made


def _reference(ledger: AnyLedger, task: Task) -> dict[str, Any]:
    """What the task showed before the listing was made fast: the decision on the summary
    of its whole history (read run by run here), for every task, done or not."""
    history: list[Attempt] = ledger.history(task.id)
    pending = task.retry_pending
    decision = decide_summary(
        summarize(history),
        WorkBudget(max_uncharged_attempts=task.max_uncharged_attempts),
        ExplicitLimit(task.max_attempts) if task.max_attempts else None,
        ledger.backoff,
        NOW,
        None,
        force=pending,
        ignore_backoff=pending,
    )
    finished = task.status in (TaskStatus.DONE, TaskStatus.CANCELLED)
    state = TaskState(task.status) if finished else decision.state
    reason = None if finished else decision.reason
    if pending and state is TaskState.READY:
        reason = f"an operator's forced retry is pending ({OPERATOR})"
    return {
        **task.to_dict(),
        "state": str(state),
        "blocked_on": None if finished or decision.blocked_on is None else str(decision.blocked_on),
        "reason": reason,
        "ready": state is TaskState.READY,
        "attempts_started": len(history),
        "charged_attempts": decision.charged_attempts,
        "uncharged_streak": decision.uncharged_streak,
        "remaining": decision.remaining,
        "next_attempt_at": None if finished else decision.next_attempt_at,
    }


def test_every_kind_of_task_lists_as_its_whole_history_decides(ledger: AnyLedger) -> None:
    made = _every_kind(ledger)
    listed = {task.id: task for task in ledger.iter_tasks(now=NOW)}
    assert set(listed) == set(made.values())
    states = set()
    for name, task_id in made.items():
        task = listed[task_id]
        states.add((task.state, task.blocked_on))
        assert task.to_dict() == _reference(ledger, task), name
        assert task == ledger.get_task(task_id, now=NOW), name
    # The kinds above are not all alike: every state and bound a listing can show.
    assert {state for state, _ in states} == set(TaskState)
    assert {bound for _, bound in states} >= {
        None,
        "environment",
        "upstream",
        "attempt_limit",
        "work",
    }


def test_the_json_text_is_what_json_dumps_writes_for_every_kind(ledger: AnyLedger) -> None:
    _every_kind(ledger)
    for task in ledger.iter_tasks(now=NOW):
        assert task_json(task) == json.dumps(task.to_dict(), sort_keys=True)
        limit = task.max_attempts
        started = f"{task.attempts_started}/{limit} limit" if limit else task.attempts_started
        charged = task.charged_attempts if limit else f"{task.charged_attempts}/3"
        line = f"{task.id}  {task.state:<9} started {started}, charged {charged}  " + safe_text(
            task.title
        )
        assert _task_line(task) == line


def test_a_listing_writes_each_task_from_its_values_as_from_its_task(ledger: AnyLedger) -> None:
    """The listing's values (no Task built) are the Task's fields, and each is written as
    its Task is: the values a local ledger makes, and those read from any other ledger
    (a server's) through its Tasks."""
    _every_kind(ledger)
    tasks = list(ledger.iter_tasks(now=NOW))

    class Elsewhere:  # a ledger of another process: only its Tasks can be listed
        def iter_tasks(self, **kwargs: Any) -> Iterator[Task]:
            return ledger.iter_tasks(**kwargs)

    local = list(iter_task_values(ledger, now=NOW))
    remote = list(iter_task_values(Elsewhere(), now=NOW))  # type: ignore[arg-type]
    assert local == remote == [task_values(task) for task in tasks]
    for values, task in zip(local, tasks, strict=True):
        assert Task(*values) == task
        assert task_json(values) == json.dumps(task.to_dict(), sort_keys=True)
        assert _task_line(values) == _task_line(task)
    for state in TaskState:
        listed = list(ledger.iter_task_values(now=NOW, state=state))
        assert listed == [task_values(task) for task in tasks if task.state is state]


def test_a_listing_builds_no_task(ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _every_kind(ledger)
    built = _count_calls(monkeypatch, Task, "__init__")
    assert len(list(iter_task_values(ledger, now=NOW))) == len(made)
    assert built == []


class _Elsewhere:
    """A ledger of another process (a server's): only its Tasks can be listed, each
    task's values read from its Task. Every other call goes to `ledger`."""

    def __init__(self, ledger: AnyLedger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def test_the_status_of_every_kind_of_task_is_the_same_read_from_values_or_tasks(
    ledger: AnyLedger,
) -> None:
    from execkit.cli._status import status_table_lines
    from execkit.dispatch import DispatchConfig, issue_statuses

    _every_kind(ledger, prefix="board:")
    config = DispatchConfig(max_attempts=2)
    rows = issue_statuses(ledger, config, now=NOW)
    through_tasks = issue_statuses(_Elsewhere(ledger), config, now=NOW)
    assert len(rows) == len(through_tasks) > 10
    assert rows == through_tasks
    assert list(status_table_lines(rows, NOW)) == list(status_table_lines(through_tasks, NOW))
    assert {row.ledger_state for row in rows} == set(TaskState)


@pytest.mark.parametrize("cap", [2, -1])
def test_a_dashboard_row_is_its_tasks_fields_with_a_board_or_without(
    ledger: AnyLedger, cap: int
) -> None:
    """Each row `status` reads without a board (each task's values unpacked in one loop)
    is what its Task and last Attempt say, field by field, and what the board's way
    (each issue matched with its task, then the same row rule) makes of it."""
    from execkit.dispatch import (
        BoardIssue,
        BoardState,
        DispatchConfig,
        InMemoryBoard,
        IssueStatus,
        issue_statuses,
    )

    _every_kind(ledger, prefix="board:")
    config = DispatchConfig(max_attempts=cap)
    expected = []
    for task, last in ledger.iter_tasks_with_last(now=NOW, cap=config.cap, title_prefix="board:"):
        expected.append(
            IssueStatus(
                issue_id=task.title.removeprefix("board:"),
                title="",
                board_state=None,
                task_id=task.id,
                ledger_state=task.state,
                blocked_on=task.blocked_on,
                attempts=task.attempts_started,
                max_attempts=config.bound_for(task),
                charged_attempts=task.charged_attempts,
                uncharged_streak=task.uncharged_streak,
                next_attempt_at=task.next_attempt_at if task.state is TaskState.BACKOFF else None,
                last_class=None if last is None else last.failure_class,
                last_status=None if last is None else last.status,
                last_reason=None if last is None else last.reason,
                reason=task.reason,
                explicit_limit=task.max_attempts,
                max_uncharged_attempts=task.max_uncharged_attempts,
                waits_on="backoff" if task.state is TaskState.BACKOFF else None,
            )
        )
    rows = issue_statuses(ledger, config, now=NOW)
    assert rows == expected
    assert {row.max_attempts for row in rows} == ({1, 2} if cap == 2 else {1, None})
    # The board's way: every issue in a state the dispatcher never takes (no forced retry).
    board = InMemoryBoard(
        [BoardIssue(row.issue_id, f"title {n}", "parked") for n, row in enumerate(rows)],
        [BoardState("todo", eligible=True), BoardState("parked")],
    )
    by_board = issue_statuses(ledger, config, board=board, now=NOW)
    assert by_board == [
        attrs.evolve(row, title=f"title {n}", board_state="parked") for n, row in enumerate(rows)
    ]


def _reference_table(rows: list[Any], now: float) -> list[str]:
    """The status table as it was written from each `IssueStatus` before the rows were
    values: each cell from the row's fields, each column padded with `str.format` to its
    widest cell (one block: fewer than `LIST_PAGE` rows), the reason clipped at 160."""
    from execkit.cli._dispatch import _when

    lines = [
        (
            "ISSUE", "TASK", "BOARD", "LEDGER", "STARTED", "CHARGED", "UNCHARGED", "NEXT",
            "LAST CLASS", "REASON",
        )
    ]  # fmt: skip
    for row in rows:
        reason = row.last_reason
        if row.ledger_state is TaskState.BLOCKED:
            reason = row.reason
            if row.blocked_on == "work" and row.last_reason and row.last_reason != reason:
                reason = f"{reason or 'blocked on work'}; last failure: {row.last_reason}"
        reason = safe_text(reason or "-")
        state, bound = row.ledger_state, row.blocked_on
        lines.append(
            (
                safe_text(row.issue_id),
                row.task_id or "-",
                "-" if row.board_state is None else safe_text(row.board_state),
                "-" if state is None else f"{state} ({bound})" if bound else state,
                (
                    f"{row.attempts}/{row.max_attempts} "
                    + ("limit" if row.max_attempts == row.explicit_limit else "cap")
                    if row.max_attempts
                    else str(row.attempts)
                ),
                str(row.charged_attempts) if row.explicit_limit else f"{row.charged_attempts}/3",
                str(row.uncharged_streak)
                if row.max_uncharged_attempts is None
                else f"{row.uncharged_streak}/{row.max_uncharged_attempts}",
                _when(row.next_attempt_at, now),
                row.last_class.value if row.last_class else (row.last_status or "-"),
                reason if len(reason) <= 160 else reason[:159] + "\u2026",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(9)]
    padded = [
        "".join(f"{cell:<{w}}  " for cell, w in zip(line, widths, strict=False)) for line in lines
    ]
    return [(pads + line[9]).rstrip() for pads, line in zip(padded, lines, strict=True)]


def test_the_status_table_is_written_as_it_was_from_each_row(ledger: AnyLedger) -> None:
    """The table `status` writes from its rows' values is, byte for byte, the table
    written from each `IssueStatus` before: every kind of task, an issue never
    dispatched, and rows of hostile text (controls, `%` and `{}` in a cell, a reason too
    long or ending in spaces, wide characters)."""
    from execkit.cli._status import status_table_lines, status_value_lines
    from execkit.dispatch import (
        BoardIssue,
        BoardState,
        DispatchConfig,
        InMemoryBoard,
        issue_status_values,
        issue_statuses,
    )

    _every_kind(ledger, prefix="board:")
    dispatched = issue_statuses(ledger, DispatchConfig(max_attempts=2), now=NOW)
    board = InMemoryBoard(
        [
            *(BoardIssue(row.issue_id, "t", "parked") for row in dispatched),
            BoardIssue("never dispatched", "t", "todo"),
        ],
        [BoardState("todo", eligible=True), BoardState("parked")],
    )
    rows = issue_statuses(ledger, DispatchConfig(), board=board, now=NOW)
    first = rows[0]
    hostile = [
        attrs.evolve(first, issue_id="I-\x1b[2J\x9b%s{0}", board_state="to\rdo"),
        attrs.evolve(first, issue_id="\u2603 wide \U0001f600", last_reason="x" * 300),
        attrs.evolve(first, last_reason="ends in spaces   ", last_class=None),
        attrs.evolve(
            first,
            ledger_state=TaskState.BLOCKED,
            blocked_on=BlockedOn.WORK,
            reason=None,
            last_reason="tests failed\n%d",
        ),
        attrs.evolve(first, ledger_state=TaskState.BACKOFF, next_attempt_at=NOW + 7200.0),
        attrs.evolve(first, ledger_state=TaskState.BACKOFF, next_attempt_at=NOW - 1.0),
        attrs.evolve(first, max_attempts=None, attempts=12, charged_attempts=10),
    ]
    every = [*dispatched, *rows, *hostile]
    assert {row.ledger_state for row in every} >= set(TaskState) | {None}
    expected = _reference_table(every, NOW)
    assert list(status_table_lines(every, NOW)) == expected
    assert list(status_value_lines(map(issue_status_values, every), NOW)) == expected


def test_a_status_builds_no_task_and_no_attempt(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from execkit.dispatch import DispatchConfig, issue_statuses

    made = _every_kind(ledger, prefix="board:")
    built = _count_calls(monkeypatch, Task, "__init__")
    attempts = _count_calls(monkeypatch, store_module, "stored_attempt")
    rows = issue_statuses(ledger, DispatchConfig(), now=NOW)
    assert len(rows) == len(made) - 1  # every task but the odd title, which is no issue
    assert built == [], "each dashboard row is made from its task's values"
    assert attempts == [], "and its last attempt's outcome from its summary's columns"


@pytest.mark.parametrize(
    "changes",
    [
        {"next_attempt_at": float("nan")},
        {"next_attempt_at": 1e16, "created_at": 0.1},
        {"title": "\x00\x1b[2J\U0001f600", "reason": "\ud800"},
        {"max_attempts": True},  # a bool where an int is: written as json.dumps writes it
        {"created_by": TaskStatus.OPEN},  # an enum where a str is
    ],
)
def test_a_hand_made_task_is_written_as_json_dumps_writes_it(changes: dict[str, Any]) -> None:
    fields: dict[str, Any] = {
        "id": "t-1",
        "title": "t",
        "status": TaskStatus.OPEN,
        "state": TaskState.BACKOFF,
        "blocked_on": None,
        "reason": "r",
        "ready": False,
        "max_attempts": 0,
        "attempts_started": 1,
        "charged_attempts": 0,
        "uncharged_streak": 1,
        "remaining": 3,
        "next_attempt_at": 1010.5,
        "created_by": ME,
        "created_at": 1000.0,
        "max_uncharged_attempts": 3,
    }
    task = Task(**{**fields, **changes})
    assert task_json(task) == json.dumps(task.to_dict(), sort_keys=True)


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_listing_decides_and_builds_a_summary_only_for_open_tasks(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _every_kind(ledger)
    open_ids = {t.id for t in ledger.iter_tasks(now=NOW) if t.status is TaskStatus.OPEN}
    decisions = _count_calls(monkeypatch, base_module, "decision_values")
    built = _count_calls(monkeypatch, Decision, "__init__")
    summaries = _count_calls(monkeypatch, HistorySummary, "__init__")
    attempts = _count_calls(monkeypatch, Attempt, "__init__")
    listed = list(ledger.iter_tasks(now=NOW))
    assert len(listed) == len(made) > len(open_ids)
    assert len(decisions) == len(open_ids), "a done or cancelled task is not decided on"
    assert built == [], "a listed task is shown from the decision's fields, no Decision made"
    # The decision reads an open task's summary columns as they are: no summary and no
    # attempt is built for any task (`TaskRecord.summary` and `.last` are not read).
    assert summaries == [], "a listing builds no summary"
    assert attempts == [], "a stored attempt is not validated again at each listing"
    stored = _count_calls(monkeypatch, store_module, "stored_attempt")
    listed = list(ledger.iter_tasks(now=NOW))
    assert stored == [], "nor built without its validators"


def test_db_check_validates_a_sound_run_without_the_validating_constructor(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = len(_every_kind(ledger))
    runs = sum(len(ledger.history(t.id)) for t in ledger.iter_tasks(now=NOW))
    attempts = _count_calls(monkeypatch, Attempt, "__init__")
    summaries = _count_calls(monkeypatch, HistorySummary, "__init__")
    assert ledger.validate(now=1200.0) == []  # before the running run's lease ends
    assert attempts == []
    # Each sound history is folded from its runs' values (`counted_after`) and compared
    # with the stored columns: no summary built, one fold step a run that ended.
    assert summaries == []
    assert runs and tasks


def test_a_run_that_is_no_attempt_is_still_refused_by_its_own_message() -> None:
    from execkit._budget import AttemptStatus
    from execkit._errors import InvalidInput
    from execkit.ledger import Run
    from execkit.ledger._core.base import attempt_from_run
    from execkit.ledger._core.inspection import _checked_attempt

    sound = Run(
        id="r-1",
        task_id="t-1",
        attempt=1,
        status=AttemptStatus.FAILED,
        failure_class=None,
        reason="x",
        request_key="k",
        actor=ME,
        forced=False,
        started_at=1.0,
        ended_at=2.0,
    )
    assert _checked_attempt(sound) == attempt_from_run(sound)
    for bad in (
        {"attempt": 0},
        {"attempt": True},
        {"reason": 5},
        {"started_at": float("inf")},
        {"ended_at": "2"},
        {"forced": 1},
        {"stopped": True},
    ):
        broken = Run(**{**_run_fields(sound), **bad})
        with pytest.raises(InvalidInput) as fast:
            _checked_attempt(broken)
        with pytest.raises(InvalidInput) as slow:
            attempt_from_run(broken)
        assert fast.value.message == slow.value.message, bad
    # An int time is what `Attempt` converts: the same attempt either way.
    whole = Run(**{**_run_fields(sound), "started_at": 1})
    assert _checked_attempt(whole) == attempt_from_run(whole)


def _run_fields(run: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(run, recurse=False)


def test_db_checks_fold_of_run_values_is_summarize_for_every_short_history() -> None:
    """`db check` folds a sound history from its runs' values: for every history of up
    to three runs of every kind, what `summarize` gives (as the stored columns hold it),
    and None exactly where `validate_history` refuses the history."""
    import itertools

    from execkit._budget import AttemptStatus, validate_history
    from execkit._errors import HistoryError
    from execkit.ledger import Run
    from execkit.ledger._core.base import attempt_from_run
    from execkit.ledger._core.inspection import _sound_summary_values
    from execkit.ledger._core.store import summary_values

    kinds = [
        (status, klass, forced, stopped)
        for status in AttemptStatus
        for klass in (None, *FailureClass)
        for forced in (False, True)
        for stopped in (False, True)
        if not stopped or status is AttemptStatus.ABANDONED
    ]
    checked = 0
    for length in range(4):
        for history in itertools.product(kinds, repeat=length):
            runs = [
                Run(
                    id=f"r-{n}",
                    task_id="t-1",
                    attempt=n,
                    status=status,
                    failure_class=klass,
                    reason=f"reason {n}",
                    request_key=f"k{n}",
                    actor=ME,
                    forced=forced,
                    started_at=1000.0 + n,
                    ended_at=None if status is AttemptStatus.RUNNING else 1000.5 + n,
                    not_before=None,
                    stopped=stopped,
                )
                for n, (status, klass, forced, stopped) in enumerate(history, 1)
            ]
            attempts = [attempt_from_run(run) for run in runs]
            rows = [_history_row(run) for run in runs]
            try:
                validate_history(attempts)
            except HistoryError:
                assert _sound_summary_values(rows) is None, history
                continue
            assert _sound_summary_values(rows) == summary_values(summarize(attempts)), history
            checked += 1
    assert checked > 1000


def _history_row(run: Any) -> tuple[Any, ...]:
    """`run` as a row of `Tx.history_rows` holds it (an open task with no summary row)."""
    from execkit.ledger._core import HISTORY_ROW

    klass = None if run.failure_class is None else str(run.failure_class)
    task = {"task_id": run.task_id, "task_status": "open", "run_id": run.id}
    values = {**_run_fields(run), **task, "status": str(run.status), "failure_class": klass}
    return tuple(values.get(column) for column in HISTORY_ROW)


def test_a_status_computes_a_backoff_only_where_the_wait_may_not_be_over(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dashboard shows a time only for a task backing off: of the tasks ready to retry
    after a failure, it computes the backoff (a hash of the attempt's start) only of those
    whose longest wait (`max_s`) or vendor's time is not yet behind it, where a listing
    (which shows every time) computes it for each, and the rows are the same."""
    from execkit._backoff import Backoff
    from execkit.dispatch import DispatchConfig, issue_statuses

    _every_kind(ledger, prefix="board:")
    config = DispatchConfig()
    through_tasks = issue_statuses(_Elsewhere(ledger), config, now=NOW)
    delays = _count_calls(monkeypatch, Backoff, "delay")
    listed = list(iter_task_values(ledger, now=NOW))
    # Every failed task not blocked: the work failure, the two upstream ones (one backing
    # off, one waiting on its vendor's time), the one whose forced retry is pending.
    assert len(delays) == 4, [task.title for task in listed]
    delays.clear()
    rows = issue_statuses(ledger, config, now=NOW)
    # The one backing off (its wait ends after NOW) and the vendor's (its time is 9000).
    assert len(delays) == 2
    assert rows == through_tasks
