"""Bulk reads: `list_tasks` pages and filters, `iter_tasks` a page at a time (`db check`
streams: test_ledger_check_stream.py),
and the JSON writer they print with, on both backends.

Nothing here is timed (benchmarks/bench_bulk.py measures them at 100,000 tasks); what makes
them scale is bounded by counts: the rows a page holds, the reads made, the objects built.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from _support import REPO, spy_on_reads
from ledger_backends import AnyLedger

import execkit.ledger._core.inspection as inspection
import execkit.ledger._core.tasks as tasks_module
from execkit._adapter import MappedResult
from execkit._budget import Attempt, Decision, HistorySummary, decide
from execkit._classify import FailureClass, classify_text
from execkit._errors import InvalidInput, NotFound
from execkit._json import _OMIT, JSON_KEY, to_json
from execkit.ledger import LIST_PAGE, TaskState

ME = "bench"


def _tasks(ledger: AnyLedger, count: int) -> list[str]:
    """`count` tasks: every third one done, every third failed upstream, the rest new."""
    ids = []
    for n in range(count):
        task = ledger.create_task(f"task {n}", actor=ME, now=1000.0)
        ids.append(task.id)
        _run_the_nth(ledger, task.id, n)
    return ids


def _run_the_nth(ledger: AnyLedger, task_id: str, n: int) -> None:
    """The `n`th task of `_tasks`: left new, done, or failed upstream, by `n % 3`."""
    if n % 3 == 0:
        return
    run = ledger.start_run(task_id, actor=ME, request_key=f"k{n}", now=1001.0)
    if n % 3 == 1:
        ledger.finish_run(run.id, "succeeded", now=1002.0)
    else:
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, now=1002.0)


def test_list_tasks_pages_in_creation_order(ledger: AnyLedger) -> None:
    ids = _tasks(ledger, 7)
    assert [t.id for t in ledger.list_tasks()] == ids
    first = ledger.list_tasks(limit=3)
    assert [t.id for t in first] == ids[:3]
    second = ledger.list_tasks(limit=3, after=first[-1].id)
    assert [t.id for t in second] == ids[3:6]
    assert [t.id for t in ledger.list_tasks(limit=3, after=second[-1].id)] == ids[6:]
    assert ledger.list_tasks(after=ids[-1]) == []
    assert list(ledger.iter_tasks(now=5000.0)) == ledger.list_tasks(now=5000.0)


def test_list_tasks_filters_by_state(ledger: AnyLedger) -> None:
    ids = _tasks(ledger, 9)
    every = ledger.list_tasks(now=5000.0)
    for state in TaskState:
        wanted = [t.id for t in every if t.state is state]
        assert [t.id for t in ledger.list_tasks(now=5000.0, state=state)] == wanted
        assert [t.id for t in ledger.list_tasks(now=5000.0, state=str(state))] == wanted
    done = [t.id for t in every if t.state is TaskState.DONE]
    assert len(done) == 3
    assert [t.id for t in ledger.list_tasks(state="done", limit=2, after=ids[0])] == done[:2]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"state": "sleeping"}, "state"),
        ({"state": 3}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": True}, "limit"),
        ({"after": ""}, "after"),
    ],
)
def test_a_bad_filter_is_invalid_input(
    ledger: AnyLedger, arguments: dict[str, Any], field: str
) -> None:
    _tasks(ledger, 1)
    with pytest.raises(InvalidInput) as caught:
        ledger.list_tasks(**arguments)
    assert caught.value.field == field


def test_a_page_after_a_task_that_is_not_there_is_not_found(ledger: AnyLedger) -> None:
    _tasks(ledger, 1)
    with pytest.raises(NotFound):
        ledger.list_tasks(after="t-999")


def _mixed(ledger: AnyLedger) -> list[str]:
    """Ten tasks as `_tasks` makes them, and after each third one a task titled "other":
    their ids in order."""
    ids = []
    for n in range(10):
        task = ledger.create_task(f"task {n}", actor=ME, now=1000.0)
        ids.append(task.id)
        if n % 3 == 2:
            ids.append(ledger.create_task(f"other {n}", actor=ME, now=1000.0).id)
        _run_the_nth(ledger, task.id, n)
    return ids


def test_list_tasks_with_last_pages_every_task_once_in_creation_order(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _mixed(ledger)
    every = list(ledger.iter_tasks_with_last(now=5000.0))
    assert [task.id for task, _ in every] == ids
    assert ledger.list_tasks_with_last(now=5000.0) == every
    assert [last is None for _, last in every] == [task.attempts_started == 0 for task, _ in every]
    # Pages smaller than the store's, and store pages smaller than a page (3 rows a read).
    for store_page in (LIST_PAGE, 3):
        monkeypatch.setattr(tasks_module, "LIST_PAGE", store_page)
        for prefix in (None, "task ", "other "):
            wanted = [pair for pair in every if prefix is None or pair[0].title.startswith(prefix)]
            paged: list[Any] = []
            after = None
            while True:
                page = ledger.list_tasks_with_last(
                    now=5000.0, title_prefix=prefix, limit=2, after=after
                )
                paged += page
                if len(page) < 2:
                    break
                after = page[-1][0].id
            assert paged == wanted, (store_page, prefix)
    # A page may start after a task its prefix does not list.
    other = next(task.id for task, _ in every if task.title.startswith("other "))
    after_other = ledger.list_tasks_with_last(now=5000.0, title_prefix="task ", after=other)
    assert [task.id for task, _ in after_other] == [
        task.id for task, _ in every[ids.index(other) + 1 :] if task.title.startswith("task ")
    ]
    assert ledger.list_tasks_with_last(after=ids[-1]) == []


@pytest.mark.parametrize(
    ("arguments", "field", "words"),
    [
        ({"limit": 0}, "limit", "1..10000"),
        ({"limit": 10_001}, "limit", "1..10000"),
        ({"limit": True}, "limit", "1..10000"),
        ({"limit": "3"}, "limit", "1..10000"),
        ({"after": ""}, "after", "after"),
        ({"title_prefix": ""}, "title_prefix", "title_prefix"),
    ],
)
def test_a_bad_page_of_tasks_with_last_is_invalid_input(
    ledger: AnyLedger, arguments: dict[str, Any], field: str, words: str
) -> None:
    _tasks(ledger, 1)
    with pytest.raises(InvalidInput, match=words) as caught:
        ledger.list_tasks_with_last(**arguments)
    assert caught.value.field == field
    with pytest.raises(NotFound):
        ledger.list_tasks_with_last(after="t-999")


def _counting_pages(monkeypatch: pytest.MonkeyPatch, ledger: AnyLedger) -> list[int]:
    """The rows of each `task_page` the ledger's store reads, in order."""
    pages: list[int] = []

    class Counting:
        def __init__(self, tx: Any) -> None:
            self._tx = tx

        def __getattr__(self, name: str) -> Any:
            return getattr(self._tx, name)

        def task_page(self, *args: Any) -> Any:
            page = self._tx.task_page(*args)
            pages.append(len(page))
            return page

    spy_on_reads(monkeypatch, ledger._store, Counting)
    return pages


def test_iter_tasks_holds_one_page_at_a_time(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _tasks(ledger, 8)
    monkeypatch.setattr(tasks_module, "LIST_PAGE", 3)
    pages = _counting_pages(monkeypatch, ledger)
    listing = ledger.iter_tasks(now=5000.0)
    assert next(listing).id == ids[0]
    assert pages == [3], "the first task is yielded once its page alone is read"
    assert [t.id for t in listing] == ids[1:]
    assert pages == [3, 3, 2]
    pages.clear()
    assert len(ledger.list_tasks(limit=4)) == 4
    assert pages == [3, 3], "a page of 4 reads no more pages than it needs"


def test_the_listing_page_is_a_thousand() -> None:
    assert LIST_PAGE == 1000
    assert tasks_module.LIST_PAGE is inspection.LIST_PAGE is LIST_PAGE  # type: ignore[attr-defined]


# -- the JSON writers ---------------------------------------------------------------------


def _reference(inst: Any) -> dict[str, Any]:
    """What `to_json` gave when it was `attrs.asdict` with a serializer and a renaming
    pass: the value it must still give."""
    import enum
    import os

    def plain(_inst: object, _field: object, value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, tuple | list):
            return [plain(None, None, item) for item in value]
        if isinstance(value, frozenset | set):
            return sorted(value)
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        return value

    def keys(inst: Any, data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in attrs.fields(type(inst)):
            key = field.metadata.get(JSON_KEY, field.name)
            if key is _OMIT:
                continue
            value = data[field.name]
            nested = getattr(inst, field.name)
            if attrs.has(type(nested)):
                value = keys(nested, value)
            elif isinstance(nested, tuple | list) and nested and attrs.has(type(nested[0])):
                value = [keys(item, part) for item, part in zip(nested, value, strict=True)]
            out[key] = value
        return out

    return keys(inst, attrs.asdict(inst, value_serializer=plain))


def test_to_json_writes_what_asdict_wrote(ledger: AnyLedger) -> None:
    _tasks(ledger, 3)
    values: list[Any] = [*ledger.list_tasks(now=5000.0)]
    values += [run for task in values[:3] for run in ledger.runs(task.id)]
    values += ledger.audit_events()
    history = [Attempt(number=1, status="failed", failure_class=FailureClass.UPSTREAM)]
    decision = decide(history, now=5000.0)
    assert isinstance(decision, Decision)
    values += [
        decision,
        HistorySummary(),
        classify_text("HTTP/1.1 503 Service Unavailable"),
        MappedResult(ok=False, failure_class=FailureClass.UPSTREAM, reason="http 503"),
    ]
    for value in values:
        assert to_json(value) == _reference(value), type(value).__name__


def test_the_streamed_json_listing_is_the_document_json_dumps_writes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}

    def execkit(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "execkit", *args, "--db", str(db)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    for n in range(4):
        execkit("task", "create", f"t {n}")
    streamed = execkit("task", "list", "--json")
    doc = json.loads(streamed)
    assert streamed == json.dumps(doc, sort_keys=True) + "\n"
    assert [t["title"] for t in doc["tasks"]] == [f"t {n}" for n in range(4)]
    page = json.loads(execkit("task", "list", "--json", "--limit", "3"))
    assert [t["title"] for t in page["tasks"]] == ["t 0", "t 1", "t 2"]
    rest = json.loads(
        execkit("task", "list", "--json", "--limit", "3", "--after", page["next_after"])
    )
    assert [t["title"] for t in rest["tasks"]] == ["t 3"] and rest["next_after"] is None
    text = execkit("task", "list", "--limit", "2").splitlines()
    assert text[-1] == f"more: continue with --after {doc['tasks'][1]['id']}"
    assert execkit("task", "list", "--state", "done") == ""
