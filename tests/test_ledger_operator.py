"""The operator's side of the ledger: retrying what stopped, per-task ceilings, reset times,
request keys that must not be reused for another request, and the dispatcher's give-up.
Every test runs on both backends (the `ledger` fixture, conftest.py)."""

from __future__ import annotations

import getpass

import pytest
from ledger_backends import AnyLedger

from execkit._classify import FailureClass
from execkit._errors import (
    AttemptLimitReached,
    Conflict,
    Forbidden,
    InvalidInput,
    TaskBackingOff,
    TaskBlocked,
    TaskFinished,
)
from execkit.ledger import OPERATE_ROLE, Actor

FAR = 10.0**10


def fail(
    ledger: AnyLedger,
    task_id: str,
    key: str,
    klass: FailureClass | None,
    *,
    at: float,
    reason: str = "x",
) -> None:
    run = ledger.start_run(task_id, request_key=key, actor="a", now=at, ignore_backoff=True)
    ledger.finish_run(run.id, "failed", failure_class=klass, reason=reason, now=at + 1)


# -- task retry -------------------------------------------------------------------------


def test_a_keyed_retry_replayed_after_its_run_was_admitted_asks_for_no_second_one(
    ledger: AnyLedger,
) -> None:
    """A client whose answer to a retry was lost sends it again with the same key, after a
    dispatcher already admitted the run it asked for: the ledger replays (no second forced
    attempt, no second audit record); a different request with the key is a Conflict."""
    task = ledger.create_task("t", actor="a")
    fail(ledger, task.id, "1", FailureClass.WORK, at=100)
    fail(ledger, task.id, "2", FailureClass.WORK, at=110)
    fail(ledger, task.id, "3", FailureClass.WORK, at=120)
    assert ledger.get_task(task.id, now=FAR).blocked_on == "work"
    first = ledger.retry_task(task.id, actor="op", force=True, idempotency_key="r1", now=200)
    assert first.retry_pending
    run = ledger.start_run(task.id, request_key="4", actor="dispatcher", now=201)
    assert run.forced
    ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK, now=202)
    again = ledger.retry_task(task.id, actor="op", force=True, idempotency_key="r1", now=203)
    assert (again.id, again.retry_pending, again.blocked_on) == (task.id, False, "work")
    retries = [e for e in ledger.audit_events(task.id) if e.action == "task.retry"]
    assert len(retries) == 1
    for other in ({"actor": "eve", "force": True}, {"actor": "op", "force": False}):
        with pytest.raises(Conflict, match="idempotency key 'r1'"):
            ledger.retry_task(task.id, idempotency_key="r1", now=204, **other)  # type: ignore[arg-type]
    # Without the key the same request asks again.
    assert ledger.retry_task(task.id, actor="op", force=True, now=205).retry_pending


def test_a_retry_after_an_environment_stop_runs_once_with_the_budget_intact(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", actor="a")
    fail(ledger, task.id, "1", FailureClass.ENVIRONMENT, at=100, reason="codex not found")
    assert ledger.get_task(task.id, now=FAR).blocked_on == "environment"
    retried = ledger.retry_task(task.id, actor="alice", reason="installed codex", now=200)
    # One truth: the task is ready at once, and admission does what `ready` says.
    assert (retried.state, retried.ready, retried.retry_pending) == ("ready", True, True)
    run = ledger.start_run(task.id, request_key="2", actor="dispatcher", now=201)
    assert run.forced
    ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK, now=202)
    after = ledger.get_task(task.id, now=FAR)
    # The stop was uncharged: the work budget is whole, and the request was used once.
    assert (after.state, after.charged_attempts, after.retry_pending) == ("ready", 1, False)
    retry = next(e for e in ledger.audit_events(task.id) if e.action == "task.retry")
    assert (retry.actor, retry.detail["reason"], retry.detail["force"]) == (
        "alice",
        "installed codex",
        False,
    )
    start = [e for e in ledger.audit_events(task.id) if e.action == "run.start"][-1]
    assert start.detail["retry_requested_by"] == "alice"


def test_a_forced_start_after_the_upstream_ceiling_resets_the_streak(
    ledger: AnyLedger,
) -> None:
    # ADR 015: "the operator re-opens them once the host recovers".
    task = ledger.create_task("t", actor="a")
    for n in range(3):
        fail(ledger, task.id, str(n), FailureClass.UPSTREAM, at=100 + n * 10, reason="http 503")
    assert ledger.get_task(task.id, now=FAR).blocked_on == "upstream"
    run = ledger.start_run(task.id, request_key="f", actor="op", forced=True, now=FAR)
    ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, now=FAR + 1)
    after = ledger.get_task(task.id, now=FAR * 2)
    assert (after.state, after.uncharged_streak, after.charged_attempts) == ("ready", 1, 0)


def test_a_retry_after_a_work_stop_needs_force_and_is_audited(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    for n in range(3):
        fail(ledger, task.id, str(n), FailureClass.WORK, at=100 + n * 10)
    assert ledger.get_task(task.id, now=FAR).blocked_on == "work"
    with pytest.raises(TaskBlocked, match="--force"):
        ledger.retry_task(task.id, actor="alice", now=200)
    assert not ledger.get_task(task.id, now=FAR).retry_pending
    retried = ledger.retry_task(task.id, actor="alice", force=True, now=201)
    assert retried.ready
    run = ledger.start_run(task.id, request_key="4", actor="a", now=202)
    ledger.finish_run(run.id, "failed", now=203)
    # It ran once: the spent budget stops it again.
    assert ledger.get_task(task.id, now=FAR).blocked_on == "work"
    retry = next(e for e in ledger.audit_events(task.id) if e.action == "task.retry")
    assert retry.detail["force"] is True


def test_a_retry_past_an_explicit_limit_raises_it_and_needs_the_role(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", max_attempts=1, actor="a")
    fail(ledger, task.id, "1", FailureClass.WORK, at=100)
    with pytest.raises(AttemptLimitReached, match="set-attempt-limit"):
        ledger.retry_task(task.id, actor="bob", now=200)
    with pytest.raises(Forbidden, match=OPERATE_ROLE):
        ledger.retry_task(task.id, actor="bob", force=True, now=200)
    assert ledger.get_task(task.id, now=FAR).max_attempts == 1
    ledger.grant_role("bob", OPERATE_ROLE, actor=getpass.getuser())
    retried = ledger.retry_task(task.id, actor="bob", force=True, now=201)
    # ADR 0033: no run passes the limit; the operator extended it by one.
    assert (retried.max_attempts, retried.ready) == (2, True)
    assert ledger.start_run(task.id, request_key="2", actor="a", now=202).attempt == 2
    actions = [e.action for e in ledger.audit_events(task.id)]
    assert actions[-3:] == ["task.set_attempt_limit", "task.retry", "run.start"]


def test_nothing_to_retry_while_running_or_finished(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a", now=1)
    with pytest.raises(TaskBlocked, match="in progress"):
        ledger.retry_task(task.id, actor="op", now=2)
    ledger.finish_run(run.id, "succeeded", now=3)
    with pytest.raises(TaskFinished):
        ledger.retry_task(task.id, actor="op", now=4)
    with pytest.raises(InvalidInput, match="force"):
        ledger.retry_task(task.id, actor="op", force="yes")  # type: ignore[arg-type]


# -- per-task uncharged ceiling (ADR 0046 "max_uncharged_attempts as a per-item field") ----


def test_a_task_may_carry_its_own_uncharged_ceiling(ledger: AnyLedger) -> None:
    patient = ledger.create_task("patient", max_uncharged_attempts=5, actor="a")
    default = ledger.create_task("default", actor="a")
    assert (patient.max_uncharged_attempts, default.max_uncharged_attempts) == (5, 3)
    for task, refusals in ((patient, 4), (default, 3)):
        for n in range(refusals):
            fail(ledger, task.id, f"{task.id}-{n}", FailureClass.UPSTREAM, at=100 + n * 10)
    assert ledger.get_task(patient.id, now=FAR).state == "ready"
    assert ledger.get_task(default.id, now=FAR).blocked_on == "upstream"
    fail(ledger, patient.id, "p-5", FailureClass.UPSTREAM, at=200)
    assert ledger.get_task(patient.id, now=FAR).blocked_on == "upstream"


@pytest.mark.parametrize("bad", [0, 1001, -1, 2.5, True, "3"])
def test_the_per_task_ceiling_is_1_to_1000(ledger: AnyLedger, bad: object) -> None:
    with pytest.raises(InvalidInput, match=r"max_uncharged_attempts.*1\.\.1000"):
        ledger.create_task("t", max_uncharged_attempts=bad, actor="a")  # type: ignore[arg-type]
    assert ledger.list_tasks() == []


def test_the_per_task_ceiling_is_part_of_the_creation_request(ledger: AnyLedger) -> None:
    ledger.create_task("t", max_uncharged_attempts=5, idempotency_key="k", actor="a")
    with pytest.raises(Conflict):
        ledger.create_task("t", idempotency_key="k", actor="a")
    assert ledger.create_task("t", max_uncharged_attempts=5, idempotency_key="k", actor="a")


# -- the vendor's reset time ---------------------------------------------------------------


def test_a_recorded_reset_time_holds_the_next_admission(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a", now=100)
    finished = ledger.finish_run(
        run.id, "failed", failure_class=FailureClass.UPSTREAM, not_before=5000.0, now=101
    )
    assert finished.not_before == 5000.0
    shown = ledger.get_task(task.id, now=1000)
    assert (shown.state, shown.next_attempt_at) == ("backoff", 5000.0)
    with pytest.raises(TaskBackingOff) as refused:
        ledger.start_run(task.id, request_key="2", actor="a", now=1000)
    assert refused.value.ready_at == 5000.0
    assert ledger.start_run(task.id, request_key="3", actor="a", now=5000).attempt == 2
    assert ledger.history(task.id)[0].not_before == 5000.0


# -- request keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change", [{"actor": "mallory"}, {"forced": True}], ids=["actor", "forced"]
)
def test_a_request_key_reused_for_another_request_is_a_conflict(
    ledger: AnyLedger, change: dict[str, object]
) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="k", actor="alice", now=1)
    request: dict[str, object] = {"actor": "alice", "forced": False, **change}
    with pytest.raises(Conflict, match="request key 'k'"):
        ledger.start_run(task.id, request_key="k", now=2, **request)  # type: ignore[arg-type]
    assert ledger.start_run(task.id, request_key="k", actor="alice", now=3) == run
    assert len(ledger.runs(task.id)) == 1


# -- identity -----------------------------------------------------------------------------


def test_an_actor_on_behalf_of_someone_is_recorded_as_both(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(
        task.id, request_key="1", actor=Actor("ci-bot", on_behalf_of="alice"), now=1
    )
    assert run.actor == "ci-bot on behalf of alice"
    # Roles are the acting identity's, never the one it acts for.
    ledger.grant_role("alice", OPERATE_ROLE, actor=getpass.getuser())
    ledger.finish_run(run.id, "failed", now=2)
    with pytest.raises(Forbidden):
        ledger.set_attempt_limit(
            task.id, 5, expected_max_attempts=0, actor=Actor("ci-bot", on_behalf_of="alice")
        )


# -- the dispatcher's give-up ------------------------------------------------------------


def test_a_give_up_is_remembered_with_the_attempt_count(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="a")
    fail(ledger, task.id, "1", FailureClass.ENVIRONMENT, at=100)
    given_up = ledger.record_give_up(task.id, state="blocked", actor="dispatcher", now=150)
    assert given_up.gave_up_at_attempt == 1
    event = ledger.audit_events(task.id)[-1]
    assert (event.action, event.detail["state"], event.detail["blocked_on"]) == (
        "task.give_up",
        "blocked",
        "environment",
    )


def test_abandoning_a_run_again_with_the_same_reason_returns_it(ledger: AnyLedger) -> None:
    """A retried abandon (its answer lost) is answered as the first; another reason, or a
    run that ended otherwise, is a Conflict; only one abandonment is recorded."""
    task = ledger.create_task("t", actor="a")
    run = ledger.start_run(task.id, request_key="1", actor="a", now=100)
    first = ledger.abandon_run(run.id, reason="pid 7 is gone", actor="d", now=101)
    again = ledger.abandon_run(run.id, reason="pid 7 is gone", actor="d", now=102)
    assert again == first and first.status == "abandoned"
    with pytest.raises(Conflict, match="not running"):
        ledger.abandon_run(run.id, reason="another reason", actor="d", now=103)
    assert [e.action for e in ledger.audit_events(task.id)].count("run.abandon") == 1
    done = ledger.start_run(task.id, request_key="2", actor="a", now=200, ignore_backoff=True)
    ledger.finish_run(done.id, "succeeded", now=201)
    with pytest.raises(Conflict, match="not running"):
        ledger.abandon_run(done.id, reason="pid 7 is gone", actor="d", now=202)
