"""Bulk reads bounded by counts: `status` reads the ledger a page of tasks at a time (never a
read per issue), its table is streamed, and a board's issues are matched with their tasks
without a redactor call per issue. On both backends where a ledger is read.

Nothing here is timed (benchmarks/bench_bulk.py measures the commands at 100,000 tasks).
"""

from __future__ import annotations

from typing import Any

import pytest
from ledger_backends import AnyLedger

import execkit._mask as mask_module
import execkit.dispatch._status as status_module
import execkit.ledger._core.tasks as tasks_module
from execkit._classify import FailureClass
from execkit.cli._status import format_status_table, status_table_lines
from execkit.dispatch import (
    BoardIssue,
    BoardState,
    DispatchConfig,
    InMemoryBoard,
    issue_statuses,
    task_key,
)

ME = "bench"


def _dispatched(ledger: AnyLedger, count: int, first: int = 0) -> list[str]:
    """`count` dispatched tasks (`board:I-n`): every third new, every third done, the rest
    failed upstream twice."""
    ids = []
    for n in range(first, first + count):
        task = ledger.create_task(task_key(f"I-{n}"), actor=ME, now=1000.0)
        ids.append(task.id)
        for attempt in range(n % 3):
            run = ledger.start_run(
                task.id, actor=ME, request_key=f"k{n}-{attempt}", ignore_backoff=True, now=1001.0
            )
            if n % 3 == 1:
                ledger.finish_run(run.id, "succeeded", now=1002.0)
            else:
                ledger.finish_run(
                    run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="503", now=1002.0
                )
    return ids


def _counting_reads(monkeypatch: pytest.MonkeyPatch, ledger: AnyLedger) -> dict[str, int]:
    """How many read transactions the ledger's store opens, and how many `get_task` and
    `runs` calls the ledger answers."""
    counts = {"reads": 0, "get_task": 0, "runs": 0}
    store = ledger._store
    real_read = store.read

    def read() -> Any:
        counts["reads"] += 1
        return real_read()

    monkeypatch.setattr(store, "read", read)
    for name in ("get_task", "runs"):
        real = getattr(ledger, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(ledger, name, counted)
    return counts


def test_status_reads_a_page_of_tasks_at_a_time_never_one_task_at_a_time(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _dispatched(ledger, 10)
    config = DispatchConfig(max_attempts=4)
    expected = [(task_id, ledger.runs(task_id)) for task_id in ids]
    monkeypatch.setattr(tasks_module, "LIST_PAGE", 3)
    counts = _counting_reads(monkeypatch, ledger)
    rows = issue_statuses(ledger, config, now=2e9)
    assert counts["get_task"] == counts["runs"] == 0, "no read per issue"
    # Four pages of tasks (3, 3, 3, 1) and the lanes: nothing grows with the tasks.
    assert counts["reads"] <= 4 + 2, counts
    assert [row.task_id for row in rows] == ids
    for row, (task_id, runs) in zip(rows, expected, strict=True):
        last = runs[-1] if runs else None
        assert row.issue_id == f"I-{ids.index(task_id)}"
        assert row.last_status == (last.status if last else None)
        assert row.last_class == (last.failure_class if last else None)
        assert row.last_reason == (last.reason if last else None)
        assert row.attempts == len(runs)
        assert row.max_attempts == 4


def test_status_of_a_board_matches_issues_without_masking_each_key(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _dispatched(ledger, 4)
    board = InMemoryBoard(
        [BoardIssue(f"I-{n}", f"issue {n}", "todo") for n in range(6)],
        [BoardState("todo", eligible=True), BoardState("done", terminal=True)],
    )
    calls = []
    real_mask = mask_module.mask_text

    def counted(text: str) -> str:
        calls.append(text)
        return real_mask(text)

    monkeypatch.setattr(status_module, "mask_text", counted)
    rows = issue_statuses(ledger, DispatchConfig(max_attempts=4), board=board, now=2e9)
    assert [row.task_id for row in rows] == [*ids, None, None]
    assert calls == [], "no stored title is masked: each key is looked up as it is"


def test_a_board_issue_whose_id_held_a_credential_finds_its_masked_task(
    ledger: AnyLedger,
) -> None:
    secret_id = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    task = ledger.create_task(task_key(secret_id), actor=ME, now=1000.0)
    assert secret_id not in task.title
    board = InMemoryBoard([BoardIssue(secret_id, "t", "todo")], [BoardState("todo", eligible=True)])
    rows = issue_statuses(ledger, DispatchConfig(), board=board, now=2e9)
    assert [row.task_id for row in rows] == [task.id]


def _row(n: int, issue: str) -> status_module.IssueStatus:
    return status_module.IssueStatus(
        issue_id=issue,
        title="",
        board_state=None,
        task_id=f"t-{n}",
        ledger_state=None,
        blocked_on=None,
        attempts=0,
        max_attempts=None,
        charged_attempts=0,
        uncharged_streak=0,
        next_attempt_at=None,
        last_class=None,
        last_status=None,
        last_reason=None,
        reason=None,
    )


def test_the_status_table_is_aligned_a_block_at_a_time_and_streamed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import execkit.cli._status as cli_status

    monkeypatch.setattr(cli_status, "LIST_PAGE", 4)
    consumed = []

    def rows() -> Any:
        for n in range(10):
            consumed.append(n)
            yield _row(n, "I" * (n + 1))

    lines = status_table_lines(rows(), 0.0)
    first = [next(lines) for _ in range(4)]  # the header and the first block's 3 rows
    assert consumed == [0, 1, 2], "a block is printed once it is read, not the whole table"
    rest = list(lines)
    widths = [line.index("t-") for line in first[1:] + rest]
    assert widths == sorted(widths), "a column never narrows from one block to the next"
    assert len({line.index("t-") for line in first[1:]}) == 1, "a block is aligned"
    small = format_status_table([_row(n, "I" * (n + 1)) for n in range(3)], 0.0).splitlines()
    assert len({line.index("t-") for line in small[1:]}) == 1


# -- listing and checking: statements and objects per task ---------------------------------


def _statements(ledger: AnyLedger, read: Any) -> int:
    """How many SQL statements `read()` makes on a SQLite ledger's connection."""
    made: list[str] = []
    conn = ledger._store._conn  # type: ignore[attr-defined]  # the SQLite store's own
    conn.set_trace_callback(made.append)
    try:
        read()
    finally:
        conn.set_trace_callback(None)
    return len(made)


def _sqlite_tasks(tmp_path: Any, count: int, more: int) -> tuple[Any, Any]:
    from execkit.ledger import open_ledger

    ledger = open_ledger(str(tmp_path / "l.db"))
    _dispatched(ledger, count)
    return ledger, lambda: _dispatched(ledger, more, count)


def test_a_listing_makes_as_many_statements_for_thirty_tasks_as_for_three(
    tmp_path: Any,
) -> None:
    ledger, grow = _sqlite_tasks(tmp_path, 3, 27)
    with ledger:
        reads = {
            "iter_tasks": lambda: list(ledger.iter_tasks(now=2e9)),
            "with_last": lambda: list(ledger.iter_tasks_with_last(now=2e9)),
            "status": lambda: issue_statuses(ledger, DispatchConfig(), now=2e9),
        }
        before = {name: _statements(ledger, read) for name, read in reads.items()}
        grow()
        after = {name: _statements(ledger, read) for name, read in reads.items()}
    assert after == before, "a page is one read, whatever it holds"


def test_db_check_evolves_nothing_per_run(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attrs

    _dispatched(ledger, 12)
    calls: list[type] = []
    real = attrs.evolve

    def counted(inst: Any, **changes: Any) -> Any:
        calls.append(type(inst))
        return real(inst, **changes)

    monkeypatch.setattr(attrs, "evolve", counted)
    assert ledger.validate(now=2e9) == []
    assert calls == [], "a history is folded by building each summary, never by evolving one"


def test_db_checks_stored_values_are_read_in_one_scan_a_table(tmp_path: Any) -> None:
    """The domain and type checks of the stored values read each table once (they were a
    scan a check: six of the runs, three of the tasks)."""
    ledger, _ = _sqlite_tasks(tmp_path, 3, 0)
    with ledger:
        made: list[str] = []
        conn = ledger._store._conn  # the SQLite store's own
        conn.set_trace_callback(made.append)
        try:
            assert ledger._store.storage_problems() == []
        finally:
            conn.set_trace_callback(None)
    scans = [sql for sql in made if " FROM runs " in sql or " FROM tasks " in sql]
    assert len(scans) == 2, scans


@pytest.mark.parametrize("writer", ["lines", "json"])
def test_a_streamed_listing_starts_no_collection_per_page(
    writer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A listing holds a page of rows in flight (a few tuples a row, none in a cycle): the
    collector's first threshold is raised while it is written, so 20 pages of 1,000 rows
    start no collection, where the default threshold (700) started one every 700 tuples;
    the thresholds are as they were afterwards."""
    import gc

    from execkit.cli._output import print_json_list, write_lines

    def pages() -> Any:
        for page in range(20):
            held = [(page, row, [row]) for row in range(1000)]  # a page in flight
            yield from (f"{row}" for row in held)

    before = gc.get_threshold()
    collections = gc.get_stats()[0]["collections"]
    if writer == "lines":
        write_lines(pages())
    else:
        print_json_list("items", pages())
    assert gc.get_stats()[0]["collections"] - collections <= 1
    assert gc.get_threshold() == before
    assert len(capsys.readouterr().out) > 20_000
