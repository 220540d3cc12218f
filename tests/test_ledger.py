"""The ledger's operations on both backends (a real file, a real PostgreSQL server): tasks,
runs, limits, idempotency, audit. The SQLite-only checks (files, WAL) open a file with
`open_ledger` themselves and run once."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from ledger_backends import AnyLedger, Opener, RawSql

from execkit._budget import Backoff, DispatchCap, WorkBudget
from execkit._classify import FailureClass
from execkit._errors import (
    AdmissionRefused,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    StorageError,
    TaskBackingOff,
)
from execkit.ledger import (
    CAPABILITIES,
    OPERATE_ROLE,
    SCHEMA_VERSION,
    default_db_path,
    ledger_status,
    migrate,
    open_ledger,
)

# `ledger`, `opener`, `ledger_target` and `raw_sql` (conftest.py) run each test below on
# SQLite and on PostgreSQL; the tests of SQLite files open a file themselves.


def _fail(ledger: AnyLedger, task_id: str, key: str, **finish: object) -> None:
    # Most tests here are about bounds, not time: they start the next run at once.
    run = ledger.start_run(task_id, request_key=key, actor="a", ignore_backoff=True)
    ledger.finish_run(run.id, "failed", **finish)  # type: ignore[arg-type]


def _operator(ledger: AnyLedger, name: str = "op") -> str:
    """A principal holding agent.operate, granted by the ledger's owner (this user)."""
    ledger.grant_role(name, OPERATE_ROLE, actor=_owner())
    return name


def _owner() -> str:
    import getpass

    return getpass.getuser()


# -- opening ---------------------------------------------------------------------------


def test_default_path_prefers_argument_then_env_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EXECKIT_DB", raising=False)
    assert default_db_path() == tmp_path / ".execkit" / "ledger.db"
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "env.db"))
    assert default_db_path() == tmp_path / "env.db"
    assert default_db_path(tmp_path / "arg.db") == tmp_path / "arg.db"


def test_open_ledger_creates_the_default_file_in_wal_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EXECKIT_DB", raising=False)
    with open_ledger() as ledger:
        assert ledger.schema_version() == SCHEMA_VERSION
        assert ledger.status_info()["journal_mode"] == "wal"
        assert ledger.capabilities() == CAPABILITIES
        assert "tasks.attempt_limits" in ledger.capabilities()
        ledger.create_task("t", actor="a")  # something in the WAL too
        path = tmp_path / ".execkit" / "ledger.db"
        # Owner-only: the ledger holds reasons and audit rows that are nobody else's.
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.stat().st_mode & 0o777 == 0o700
        for extra in (path.with_name("ledger.db-wal"), path.with_name("ledger.db-shm")):
            assert extra.stat().st_mode & 0o077 == 0, extra
    assert path.is_file()


def test_create_false_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no ledger"):
        open_ledger(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_a_non_ledger_file_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StorageError, match="not a usable ledger"):
        open_ledger(junk)
    assert junk.read_bytes() == b"this is not sqlite at all" * 100


def test_open_options_mean_the_same_on_either_backend(ledger_target: str, backend: str) -> None:
    # Nothing there yet: neither a read nor `create=False` makes a ledger, and the error
    # names the command that does (issue 44, item 14).
    with pytest.raises(NotFound, match=r"no ledger.*`execkit db init"):
        open_ledger(ledger_target, create=False)
    with pytest.raises(NotFound, match="no ledger"):
        ledger_status(ledger_target)
    with pytest.raises(NotFound, match="no ledger"):
        migrate(ledger_target, backed_up=True)
    with open_ledger(ledger_target, create=True) as made:
        assert made.migration is not None and made.migration.from_version == 0
        key, where = made.where()
        assert (key, where) == (
            ("path", ledger_target) if backend == "sqlite" else ("url", ledger_target)
        )
        made.create_task("t", actor="a")
    with open_ledger(ledger_target, create=False, upgrade=False) as again:
        assert again.migration is None and again.get_task("t-1").title == "t"
    status = ledger_status(ledger_target)
    assert (status["tasks"], status["needs_migration"]) == (1, False)
    assert status[key] == ledger_target
    # Already current: migrating does nothing, whatever the backup flag says.
    for backed_up in (False, True):
        done = migrate(ledger_target, backed_up=backed_up)
        assert done.from_version == done.to_version


def test_lock_timeout_bounds_the_wait_for_another_writer(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    open_ledger(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with (
            open_ledger(db, lock_timeout_s=0.1) as impatient,
            pytest.raises(StorageError, match="busy"),
        ):
            impatient.create_task("t", actor="a")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with open_ledger(db) as ledger:
        assert ledger.list_tasks() == []


# -- creation and idempotency -------------------------------------------------------------


def test_create_task_defaults_to_no_explicit_limit(ledger: AnyLedger) -> None:
    task = ledger.create_task("write the parser", actor="alice", now=100.0)
    assert task.id == "t-1"
    assert (task.status, task.state, task.ready) == ("open", "ready", True)
    assert task.max_attempts == 0
    assert task.attempts_started == 0
    assert task.remaining == 3  # the WorkBudget's charged bound
    assert (task.created_by, task.created_at) == ("alice", 100.0)
    assert ledger.create_task("second", actor="alice").id == "t-2"


@pytest.mark.parametrize("bad", [-1, 10001, 2.5, "3", True, None])
def test_create_task_rejects_a_bad_limit_and_writes_nothing(ledger: AnyLedger, bad: object) -> None:
    with pytest.raises(InvalidInput, match=r"max_attempts.*1\.\.10000"):
        ledger.create_task("t", max_attempts=bad, actor="a")  # type: ignore[arg-type]
    assert ledger.list_tasks() == []
    assert ledger.audit_events() == []


@pytest.mark.parametrize("title", ["", "   ", "x" * 1001])
def test_create_task_rejects_a_bad_title(ledger: AnyLedger, title: str) -> None:
    with pytest.raises(InvalidInput, match="title"):
        ledger.create_task(title, actor="a")
    assert ledger.list_tasks() == []


def test_replaying_a_creation_key_returns_the_same_task(ledger: AnyLedger) -> None:
    first = ledger.create_task("t", max_attempts=5, idempotency_key="k", actor="a")
    again = ledger.create_task("t", max_attempts=5, idempotency_key="k", actor="a")
    assert again.id == first.id
    assert len(ledger.list_tasks()) == 1
    assert [e.action for e in ledger.audit_events()] == ["task.create"]


@pytest.mark.parametrize(
    ("title", "limit"), [("other title", 5), ("t", 6), ("t", 0)], ids=["title", "limit", "none"]
)
def test_the_same_creation_key_with_another_request_is_a_conflict(
    ledger: AnyLedger, title: str, limit: int
) -> None:
    ledger.create_task("t", max_attempts=5, idempotency_key="k", actor="a")
    with pytest.raises(Conflict, match="idempotency key 'k'"):
        ledger.create_task(title, max_attempts=limit, idempotency_key="k", actor="a")
    assert len(ledger.list_tasks()) == 1


def test_creation_fingerprint_is_the_legacy_one_without_a_limit(
    ledger: AnyLedger, raw_sql: RawSql
) -> None:
    import hashlib

    ledger.create_task("legacy", idempotency_key="k0", actor="a")
    ledger.create_task("limited", max_attempts=4, idempotency_key="k4", actor="a")
    rows: dict[str, str] = dict(raw_sql("SELECT key, fingerprint FROM idempotency"))

    def sha(obj: object) -> str:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    assert rows["k0"] == sha({"title": "legacy"})
    assert rows["k4"] == sha({"max_attempts": 4, "title": "limited"})


# -- admission -----------------------------------------------------------------------------


def test_start_run_numbers_attempts_and_records_the_owner(ledger: AnyLedger) -> None:
    import os
    import socket

    task = ledger.create_task("t", max_attempts=3, actor="a")
    run = ledger.start_run(task.id, request_key="r1", actor="bob", now=10.0)
    assert (run.id, run.attempt, run.status, run.actor) == ("r-1", 1, "running", "bob")
    assert (run.owner_pid, run.owner_host) == (os.getpid(), socket.gethostname())
    assert run.started_at == 10.0
    shown = ledger.get_task(task.id, now=11.0)
    assert (shown.state, shown.ready, shown.attempts_started) == ("running", False, 1)
    finished = ledger.finish_run(run.id, "failed", now=12.0)
    assert (finished.status, finished.ended_at) == ("failed", 12.0)
    second = ledger.start_run(task.id, request_key="r2", actor="bob", now=13.0 + 3600)
    assert second.attempt == 2


def test_replaying_a_request_key_returns_the_same_run_and_creates_none(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", max_attempts=3, actor="a")
    run = ledger.start_run(task.id, request_key="same", actor="a")
    assert ledger.start_run(task.id, request_key="same", actor="a") == run
    ledger.finish_run(run.id, "failed")
    replay = ledger.start_run(task.id, request_key="same", actor="a")
    assert (replay.id, replay.status) == (run.id, "failed")
    assert len(ledger.runs(task.id)) == 1


def test_a_request_key_replayed_for_another_task_is_a_conflict(ledger: AnyLedger) -> None:
    one = ledger.create_task("one", actor="a")
    two = ledger.create_task("two", actor="a")
    ledger.start_run(one.id, request_key="k", actor="a")
    with pytest.raises(Conflict):
        ledger.start_run(two.id, request_key="k", actor="a")
    assert ledger.runs(two.id) == []


def test_a_second_run_while_one_runs_is_blocked(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=5, actor="a")
    ledger.start_run(task.id, request_key="1", actor="a")
    with pytest.raises(AdmissionRefused, match="still running") as refused:
        ledger.start_run(task.id, request_key="2", actor="a")
    assert refused.value.code == "blocked"
    assert len(ledger.runs(task.id)) == 1


def test_the_explicit_limit_counts_every_run_and_refuses_with_attempt_limit(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="a")
    _fail(ledger, task.id, "1", failure_class=FailureClass.UPSTREAM)  # uncharged still counts
    run = ledger.start_run(task.id, request_key="2", actor="a", ignore_backoff=True)
    ledger.finish_run(run.id, "abandoned")
    with pytest.raises(AdmissionRefused, match="2 of 2") as refused:
        ledger.start_run(task.id, request_key="3", actor="a")
    assert refused.value.code == "attempt_limit"
    shown = ledger.get_task(task.id)
    assert (shown.state, shown.blocked_on, shown.ready) == ("blocked", "attempt_limit", False)
    assert shown.status == "open"  # stays in progress, not finished (ADR 0033)
    assert shown.remaining == 0


def test_forced_never_passes_the_explicit_limit(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=1, actor="a")
    _fail(ledger, task.id, "1", failure_class=FailureClass.ENVIRONMENT, reason="codex missing")
    with pytest.raises(AdmissionRefused) as refused:
        ledger.start_run(task.id, request_key="2", actor="op", forced=True)
    assert refused.value.code == "attempt_limit"


def test_an_environment_stop_blocks_until_an_operator_forces(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    _fail(ledger, task.id, "1", failure_class=FailureClass.ENVIRONMENT, reason="codex missing")
    shown = ledger.get_task(task.id)
    assert (shown.state, shown.blocked_on) == ("blocked", "environment")
    assert "codex missing" in (shown.reason or "")
    with pytest.raises(AdmissionRefused, match="codex missing") as refused:
        ledger.start_run(task.id, request_key="2", actor="a")
    assert refused.value.code == "blocked"
    # An operator's start, at once: forced past the stop, and not waiting out the backoff.
    forced = ledger.start_run(
        task.id, request_key="3", actor="op", forced=True, ignore_backoff=True
    )
    assert (forced.attempt, forced.forced) == (2, True)
    start_events = [e for e in ledger.audit_events(task.id) if e.action == "run.start"]
    assert start_events[-1].detail["forced"] is True
    assert start_events[-1].actor == "op"


def test_without_a_limit_the_work_budget_blocks(opener: Opener) -> None:
    with opener(budget=WorkBudget(max_attempts=2)) as ledger:
        task = ledger.create_task("t", actor="a")
        _fail(ledger, task.id, "1")
        _fail(ledger, task.id, "2")
        with pytest.raises(AdmissionRefused, match="charged budget") as refused:
            ledger.start_run(task.id, request_key="3", actor="a")
        assert refused.value.code == "blocked"
        assert ledger.get_task(task.id).blocked_on == "work"


def test_the_uncharged_bound_blocks_on_upstream(opener: Opener) -> None:
    with opener(budget=WorkBudget(max_uncharged_attempts=2)) as ledger:
        task = ledger.create_task("t", max_attempts=10, actor="a")
        _fail(ledger, task.id, "1", failure_class=FailureClass.UPSTREAM, reason="http 503")
        _fail(ledger, task.id, "2", failure_class=FailureClass.UPSTREAM, reason="http 503")
        with pytest.raises(AdmissionRefused) as refused:
            ledger.start_run(task.id, request_key="3", actor="a")
        assert refused.value.code == "blocked"
        assert ledger.get_task(task.id).blocked_on == "upstream"


def test_the_dispatch_cap_is_passed_to_the_policy(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=10, actor="a")
    _fail(ledger, task.id, "1", failure_class=FailureClass.UPSTREAM)
    with pytest.raises(AdmissionRefused, match="dispatch cap") as refused:
        ledger.start_run(task.id, request_key="2", actor="d", cap=DispatchCap(1))
    assert refused.value.code == "blocked"
    assert ledger.get_task(task.id, cap=DispatchCap(1)).blocked_on == "dispatch_cap"
    third = ledger.start_run(task.id, request_key="3", actor="d", ignore_backoff=True)
    assert third.attempt == 2


def test_admission_honours_the_backoff_that_ready_shows(ledger: AnyLedger) -> None:
    # One truth about "ready": what `get_task` says is what `start_run` does.
    task = ledger.create_task("t", max_attempts=5, actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a", now=1000.0)
    ledger.finish_run(run.id, "failed", now=1001.0)
    shown = ledger.get_task(task.id, now=1002.0)
    assert shown.state == "backoff"
    assert shown.next_attempt_at is not None and shown.next_attempt_at > 1002.0
    assert not shown.ready
    with pytest.raises(TaskBackingOff, match="ready at") as refused:
        ledger.start_run(task.id, request_key="2", actor="a", now=1002.0)
    assert (refused.value.code, refused.value.exit_code) == ("backoff", 14)
    assert refused.value.ready_at == shown.next_attempt_at
    assert len(ledger.runs(task.id)) == 1
    # At the time `ready` names, admission admits.
    assert ledger.get_task(task.id, now=shown.next_attempt_at).ready
    # An explicit override admits now, and the audit says it was one.
    overridden = ledger.start_run(
        task.id, request_key="3", actor="a", now=1002.0, ignore_backoff=True
    )
    assert overridden.attempt == 2
    start = [e for e in ledger.audit_events(task.id) if e.action == "run.start"][-1]
    assert start.detail["ignored_backoff_until"] == shown.next_attempt_at


def test_a_succeeded_run_finishes_the_task(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=5, actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    ledger.finish_run(run.id, "succeeded")
    shown = ledger.get_task(task.id)
    assert (shown.status, shown.state, shown.ready) == ("done", "done", False)
    with pytest.raises(AdmissionRefused) as refused:
        ledger.start_run(task.id, request_key="2", actor="a")
    assert refused.value.code == "finished"


def test_a_cancelled_task_admits_nothing_and_keeps_its_policy(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="a")
    cancelled = ledger.cancel_task(task.id, actor="op")
    assert (cancelled.status, cancelled.state, cancelled.ready) == ("cancelled", "cancelled", False)
    assert ledger.cancel_task(task.id, actor="op").status == "cancelled"  # idempotent
    with pytest.raises(AdmissionRefused) as refused:
        ledger.start_run(task.id, request_key="1", actor="a")
    assert refused.value.code == "finished"
    with pytest.raises(AdmissionRefused) as refused:
        ledger.set_attempt_limit(task.id, 5, expected_max_attempts=2, actor=_operator(ledger))
    assert refused.value.code == "finished"
    assert ledger.get_task(task.id).max_attempts == 2


def test_unknown_ids_are_not_found(ledger: AnyLedger) -> None:
    for call in (
        lambda: ledger.get_task("t-9"),
        lambda: ledger.runs("t-9"),
        lambda: ledger.start_run("t-9", request_key="k", actor="a"),
        lambda: ledger.finish_run("r-9", "failed"),
        lambda: ledger.set_attempt_limit("t-9", 3, expected_max_attempts=0, actor="a"),
        lambda: ledger.cancel_task("t-9", actor="a"),
    ):
        with pytest.raises(NotFound):
            call()


def test_a_run_whose_lease_expired_is_abandoned_by_the_next_admission(
    ledger: AnyLedger,
) -> None:
    # No pid or host is looked at: the lease alone says whether the runner is still there.
    task = ledger.create_task("t", max_attempts=3, actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a", now=100.0, lease_s=60)
    assert run.lease_expires_at == 160.0
    with pytest.raises(AdmissionRefused, match="still running"):
        ledger.start_run(task.id, request_key="2", actor="a", now=159.0)
    # The next admission abandons the run whose lease expired; the abandonment stands even
    # though this admission then waits out the backoff that failure earned.
    with pytest.raises(TaskBackingOff):
        ledger.start_run(task.id, request_key="3", actor="a", now=161.0)
    first = ledger.run(run.id)
    assert (first.status, first.ended_at) == ("abandoned", 161.0)
    assert "lease expired" in (first.reason or "")
    shown = ledger.get_task(task.id, now=162.0)
    # ADR 0033: every admitted run counts; it charges as an unclassed failure.
    assert (shown.attempts_started, shown.charged_attempts, shown.state) == (1, 1, "backoff")
    second = ledger.start_run(task.id, request_key="4", actor="a", now=161.0 + 600)
    assert second.attempt == 2
    actions = [e.action for e in ledger.audit_events(task.id)]
    assert actions[-2:] == ["run.abandon", "run.start"]
    with pytest.raises(Conflict, match="abandoned"):
        ledger.finish_run(run.id, "succeeded", now=800.0)  # the late result cannot land
    assert ledger.validate(now=801.0) == []


def test_a_heartbeat_renews_the_lease(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a", now=100.0, lease_s=60)
    renewed = ledger.heartbeat(run.id, now=150.0)
    assert renewed.lease_expires_at == 210.0  # the lease it was started with
    assert ledger.heartbeat(run.id, lease_s=600, now=151.0).lease_expires_at == 751.0
    assert ledger.heartbeat(run.id, now=152.0).lease_expires_at == 752.0
    with pytest.raises(AdmissionRefused, match="still running"):
        ledger.start_run(task.id, request_key="2", actor="a", now=700.0)
    ledger.finish_run(run.id, "failed", now=701.0)
    with pytest.raises(Conflict, match="not running"):
        ledger.heartbeat(run.id, now=702.0)
    with pytest.raises(InvalidInput, match="lease_s"):
        ledger.heartbeat(run.id, lease_s=0)


# -- finishing -----------------------------------------------------------------------------


def test_finish_run_validates_its_input_and_changes_nothing(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    with pytest.raises(InvalidInput, match="status"):
        ledger.finish_run(run.id, "running")
    with pytest.raises(InvalidInput, match="failure_class"):
        ledger.finish_run(run.id, "failed", failure_class="cosmic")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="succeeded"):
        ledger.finish_run(run.id, "succeeded", failure_class=FailureClass.WORK)
    assert ledger.runs(task.id)[0].status == "running"


def test_finishing_twice_is_idempotent_but_different_values_conflict(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    done = ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="503")
    again = ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="503")
    assert again == done
    with pytest.raises(Conflict, match="already finished"):
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK, reason="503")
    with pytest.raises(Conflict):
        ledger.finish_run(run.id, "succeeded")
    assert ledger.runs(task.id) == [done]


def test_reasons_are_redacted_before_they_are_stored(ledger: AnyLedger, raw_sql: RawSql) -> None:
    secret = "sk-" + "A1b2C3d4E5f6G7h8I9j0" * 2
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    finished = ledger.finish_run(run.id, "failed", reason=f"401 with key {secret}")
    assert secret not in (finished.reason or "")
    assert "[REDACTED]" in (finished.reason or "")
    ((stored,),) = raw_sql("SELECT reason FROM runs")
    assert secret not in stored


def test_a_long_reason_keeps_its_end(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    finished = ledger.finish_run(run.id, "failed", reason="x" * 10000 + "THE END")
    assert finished.reason is not None
    assert len(finished.reason) == 4000
    assert finished.reason.endswith("THE END")


def test_abandon_expired_runs_marks_every_expired_run_and_they_still_count(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="a")
    other = ledger.create_task("u", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a", now=10.0, lease_s=30)
    alive = ledger.start_run(other.id, request_key="2", actor="a", now=10.0, lease_s=300)
    assert ledger.abandon_expired_runs(now=39.0) == []  # lease still live: left alone
    abandoned = ledger.abandon_expired_runs(now=50.0)
    assert [(r.id, r.status, r.ended_at) for r in abandoned] == [(run.id, "abandoned", 50.0)]
    assert ledger.abandon_expired_runs(now=51.0) == []
    assert ledger.run(alive.id).status == "running"
    shown = ledger.get_task(task.id, now=10**10)
    assert (shown.attempts_started, shown.charged_attempts) == (1, 1)
    assert ledger.start_run(task.id, request_key="3", actor="a").attempt == 2
    assert ledger.validate(now=60.0) == []


# -- set_attempt_limit ----------------------------------------------------------------------


def test_the_creator_may_set_the_limit_before_the_first_run(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="alice")
    updated = ledger.set_attempt_limit(task.id, 4, expected_max_attempts=0, actor="alice")
    assert updated.max_attempts == 4
    assert updated.remaining == 4
    event = ledger.audit_events(task.id)[-1]
    assert (event.action, event.actor, event.detail["from"], event.detail["to"]) == (
        "task.set_attempt_limit",
        "alice",
        0,
        4,
    )


def test_others_and_the_creator_after_a_run_need_agent_operate(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="alice")
    with pytest.raises(Forbidden, match=r"agent\.operate"):
        ledger.set_attempt_limit(task.id, 3, expected_max_attempts=2, actor="mallory")
    _fail(ledger, task.id, "1")
    with pytest.raises(Forbidden, match="after its first run"):
        ledger.set_attempt_limit(task.id, 3, expected_max_attempts=2, actor="alice")
    assert ledger.get_task(task.id).max_attempts == 2
    # The role is a grant stored in the ledger, never a claim the caller makes.
    with pytest.raises(Forbidden, match=r"agent\.operate"):
        ledger.set_attempt_limit(task.id, 3, expected_max_attempts=2, actor="op")
    updated = ledger.set_attempt_limit(task.id, 3, expected_max_attempts=2, actor=_operator(ledger))
    assert updated.max_attempts == 3


def test_a_stale_expected_value_is_a_conflict_naming_the_current_one(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="alice")
    with pytest.raises(Conflict, match="current limit of task t-1: 2"):
        ledger.set_attempt_limit(task.id, 5, expected_max_attempts=3, actor="alice")
    assert ledger.get_task(task.id).max_attempts == 2
    assert [e.action for e in ledger.audit_events(task.id)] == ["task.create"]


@pytest.mark.parametrize("bad", [0, -1, 10001, 2.5, "3", True])
def test_set_attempt_limit_requires_1_to_10000(ledger: AnyLedger, bad: object) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="alice")
    with pytest.raises(InvalidInput, match=r"max_attempts must be .*1\.\.10000"):
        ledger.set_attempt_limit(task.id, bad, expected_max_attempts=2, actor="alice")  # type: ignore[arg-type]
    assert ledger.get_task(task.id).max_attempts == 2


def test_set_attempt_limit_replays_its_keyed_response(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="alice")
    first = ledger.set_attempt_limit(
        task.id, 4, expected_max_attempts=2, actor="alice", idempotency_key="raise-1"
    )
    # A transport retry: expected no longer matches, but the key says it already happened.
    again = ledger.set_attempt_limit(
        task.id, 4, expected_max_attempts=2, actor="alice", idempotency_key="raise-1"
    )
    assert again.max_attempts == first.max_attempts == 4
    assert sum(e.action == "task.set_attempt_limit" for e in ledger.audit_events()) == 1
    with pytest.raises(Conflict, match="raise-1"):
        ledger.set_attempt_limit(
            task.id, 5, expected_max_attempts=4, actor="alice", idempotency_key="raise-1"
        )
    assert ledger.get_task(task.id).max_attempts == 4


def test_raising_the_limit_makes_an_exhausted_task_ready_with_its_history(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", max_attempts=1, actor="alice")
    _fail(ledger, task.id, "1", failure_class=FailureClass.UPSTREAM)
    assert ledger.get_task(task.id, now=10**10).blocked_on == "attempt_limit"
    before = ledger.runs(task.id)
    ledger.set_attempt_limit(task.id, 3, expected_max_attempts=1, actor=_operator(ledger))
    shown = ledger.get_task(task.id, now=10**10)
    assert (shown.state, shown.ready, shown.remaining, shown.attempts_started) == (
        "ready",
        True,
        2,
        1,
    )
    assert ledger.runs(task.id) == before
    assert ledger.start_run(task.id, request_key="2", actor="a", ignore_backoff=True).attempt == 2


def test_lowering_the_limit_leaves_the_running_run_and_refuses_the_next(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", max_attempts=5, actor="alice")
    _fail(ledger, task.id, "1")
    running = ledger.start_run(task.id, request_key="2", actor="a", ignore_backoff=True)
    ledger.set_attempt_limit(task.id, 1, expected_max_attempts=5, actor=_operator(ledger))
    assert ledger.runs(task.id)[-1] == running
    assert ledger.finish_run(running.id, "failed").status == "failed"
    with pytest.raises(AdmissionRefused) as refused:
        ledger.start_run(task.id, request_key="3", actor="a", ignore_backoff=True)
    assert refused.value.code == "attempt_limit"


def test_a_done_task_refuses_a_limit_change(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", max_attempts=2, actor="alice")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    ledger.finish_run(run.id, "succeeded")
    with pytest.raises(AdmissionRefused, match="can no longer change") as refused:
        ledger.set_attempt_limit(task.id, 5, expected_max_attempts=2, actor=_operator(ledger))
    assert refused.value.code == "finished"


# -- restart and validation ------------------------------------------------------------------

_SHOW = """
import json, sys
from execkit._budget import Backoff, WorkBudget
from execkit.ledger import open_ledger
with open_ledger(sys.argv[1], budget=WorkBudget(max_attempts=4), backoff=Backoff()) as ledger:
    print(json.dumps(ledger.get_task(sys.argv[2], now=float(sys.argv[3])).to_dict()))
"""


def test_counts_and_backoff_come_from_history_after_a_restart(
    opener: Opener, ledger_target: str
) -> None:
    budget = WorkBudget(max_attempts=4)
    with opener(budget=budget, backoff=Backoff()) as ledger:
        task = ledger.create_task("t", actor="a")
        for i, klass in enumerate([FailureClass.WORK, FailureClass.UPSTREAM, None]):
            run = ledger.start_run(task.id, request_key=str(i), actor="a", now=1000.0 + i * 100)
            ledger.finish_run(run.id, "failed", failure_class=klass, now=1001.0 + i * 100)
        before = ledger.get_task(task.id, now=1210.0)
    assert before.state == "backoff"
    assert (before.attempts_started, before.charged_attempts) == (3, 2)
    # A new process (nothing shared but the file, or the server) gives the same answer.
    proc = subprocess.run(
        [sys.executable, "-c", _SHOW, ledger_target, task.id, "1210.0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(proc.stdout) == before.to_dict()
    with opener(budget=budget, backoff=Backoff()) as reopened:
        assert reopened.get_task(task.id, now=1210.0) == before
        assert reopened.start_run(task.id, request_key="3", actor="a").attempt == 4


def test_validate_reports_a_broken_history(ledger: AnyLedger, raw_sql: RawSql) -> None:
    task = ledger.create_task("t", actor="a")
    _fail(ledger, task.id, "1")
    assert ledger.validate() == []
    # Damage the file the way only a bug or a hand edit could: a gap in the numbers.
    raw_sql("UPDATE runs SET attempt = 3 WHERE id = 'r-1'")
    problems = ledger.validate()
    assert len(problems) == 1
    assert problems[0].startswith("t-1: ")
    assert "gapless" in problems[0]


def test_validate_reports_a_done_task_without_success(ledger: AnyLedger, raw_sql: RawSql) -> None:
    ledger.create_task("t", actor="a")
    raw_sql("UPDATE tasks SET status = 'done'")
    assert ledger.validate() == ["t-1: task is done but no run succeeded"]


def test_list_tasks_projects_every_task_in_creation_order(ledger: AnyLedger) -> None:
    one = ledger.create_task("one", max_attempts=1, actor="a")
    two = ledger.create_task("two", actor="a")
    _fail(ledger, one.id, "1")
    listed = ledger.list_tasks(now=10**10)
    assert [t.id for t in listed] == [one.id, two.id]
    assert [t.state for t in listed] == ["blocked", "ready"]
    assert listed == [ledger.get_task(one.id, now=10**10), ledger.get_task(two.id, now=10**10)]


def test_wire_shapes_are_json_safe(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    run = ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM)
    assert json.loads(json.dumps(run.to_dict()))["failure_class"] == "upstream"
    shown = json.loads(json.dumps(ledger.get_task(task.id).to_dict()))
    assert {"max_attempts", "attempts_started", "ready", "state", "blocked_on"} <= set(shown)
    for event in ledger.audit_events():
        json.dumps(event.to_dict())


# -- input that must change nothing ----------------------------------------------------------


def test_roles_are_granted_only_by_the_owner_or_an_admin(ledger: AnyLedger) -> None:
    owner = _owner()
    with pytest.raises(Forbidden, match="owner"):
        ledger.grant_role("mallory", OPERATE_ROLE, actor="mallory")
    assert ledger.grants() == []
    grant = ledger.grant_role("alice", "ledger.admin", actor=owner, now=5.0)
    assert (grant.principal, grant.role, grant.granted_by, grant.granted_at) == (
        "alice",
        "ledger.admin",
        owner,
        5.0,
    )
    # An admin may grant; the grant is idempotent and audited once.
    ledger.grant_role("bob", OPERATE_ROLE, actor="alice")
    again = ledger.grant_role("bob", OPERATE_ROLE, actor="alice")
    assert again.granted_by == "alice"
    assert [(g.principal, g.role) for g in ledger.grants()] == [
        ("alice", "ledger.admin"),
        ("bob", OPERATE_ROLE),
    ]
    with pytest.raises(InvalidInput, match="role must be one of"):
        ledger.grant_role("bob", "root", actor=owner)
    assert ledger.revoke_role("bob", OPERATE_ROLE, actor="alice") is True
    assert ledger.revoke_role("bob", OPERATE_ROLE, actor="alice") is False
    with pytest.raises(Forbidden):
        ledger.revoke_role("alice", "ledger.admin", actor="bob")
    actions = [e.action for e in ledger.audit_events()]
    assert actions == ["role.grant", "role.grant", "role.revoke"]


@pytest.mark.parametrize("forced", ["no", 1, None])
def test_forced_must_be_a_real_bool(ledger: AnyLedger, forced: object) -> None:
    task = ledger.create_task("t", actor="a")
    _fail(ledger, task.id, "1", failure_class=FailureClass.ENVIRONMENT, reason="codex missing")
    with pytest.raises(InvalidInput, match="forced"):
        ledger.start_run(task.id, request_key="2", actor="op", forced=forced)  # type: ignore[arg-type]
    assert len(ledger.runs(task.id)) == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "now", True])
def test_a_time_that_is_not_a_finite_number_is_refused(ledger: AnyLedger, bad: object) -> None:
    task = ledger.create_task("t", max_attempts=3, actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a")
    before = (ledger.runs(task.id), ledger.audit_events())
    for call in (
        lambda: ledger.finish_run(run.id, "failed", now=bad),  # type: ignore[arg-type]
        lambda: ledger.create_task("u", actor="a", now=bad),  # type: ignore[arg-type]
        lambda: ledger.cancel_task(task.id, actor="a", now=bad),  # type: ignore[arg-type]
        lambda: ledger.abandon_expired_runs(now=bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidInput, match="now must be a finite number"):
            call()
    assert (ledger.runs(task.id), ledger.audit_events()) == before
    assert ledger.validate() == []


def test_an_environment_stop_is_named_before_a_used_up_limit(ledger: AnyLedger) -> None:
    # Admission refuses for the same reason the task shows: the policy's order.
    task = ledger.create_task("t", max_attempts=1, actor="a")
    _fail(ledger, task.id, "1", failure_class=FailureClass.ENVIRONMENT, reason="codex missing")
    assert ledger.get_task(task.id).blocked_on == "environment"
    with pytest.raises(AdmissionRefused, match="codex missing") as refused:
        ledger.start_run(task.id, request_key="2", actor="a")
    assert refused.value.code == "blocked"
    with pytest.raises(AdmissionRefused, match="1 of 1 runs of task t-1") as refused:
        ledger.start_run(task.id, request_key="3", actor="op", forced=True)
    assert refused.value.code == "attempt_limit"
