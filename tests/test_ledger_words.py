"""The ledger's words as enums: roles, audit actions, the one task-state enum, and the audit
entry as one value. The stored and sent strings are the ones they always were."""

from __future__ import annotations

import getpass
import json

import attrs
import pytest
from ledger_backends import AnyLedger, RawSql

import execkit
from execkit._budget import DecisionState, TaskState, WorkBudget, decide
from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit.ledger import (
    ADMIN_ROLE,
    KNOWN_ROLES,
    OPERATE_ROLE,
    AuditAction,
    AuditEntry,
    Role,
    SpendCap,
    SpendWindow,
)

# The audit actions as stored before they were an enum: a stored value must never change.
_STORED_ACTIONS = {
    "task.create",
    "task.set_attempt_limit",
    "task.retry",
    "task.give_up",
    "task.cancel",
    "task.repair_summary",
    "run.start",
    "run.finish",
    "run.abandon",
    "role.grant",
    "role.revoke",
    "lane.config",
    "lane.park",
    "lane.resume",
    "spend.caps",
    "spend.warning",
    "spend.override",
    "task.set_budget",
    "notify.add",
    "notify.remove",
    "notify.enable",
}


def test_roles_are_members_that_equal_their_old_strings() -> None:
    assert (OPERATE_ROLE, ADMIN_ROLE) == ("agent.operate", "ledger.admin")
    assert OPERATE_ROLE is Role.OPERATE and ADMIN_ROLE is Role.ADMIN
    assert KNOWN_ROLES == {"agent.operate", "ledger.admin"} == frozenset(Role)
    # A role read back from storage is a plain string: it must find the member, and the
    # member must find it, in sets as in comparisons.
    assert "agent.operate" in KNOWN_ROLES and OPERATE_ROLE in {"agent.operate"}
    assert json.dumps([OPERATE_ROLE]) == '["agent.operate"]' and f"{ADMIN_ROLE}" == "ledger.admin"


def test_the_audit_actions_are_exactly_the_stored_strings() -> None:
    assert {str(action) for action in AuditAction} == _STORED_ACTIONS


def test_an_audit_entry_is_one_value_with_a_member_for_its_action() -> None:
    detail = {"title": "t"}
    entry = AuditEntry(
        at=1.0, actor="a", action=AuditAction.TASK_CREATE, task_id="t-1", detail=detail
    )
    detail["title"] = "changed"  # the entry took its own copy
    assert (entry.task_id, entry.run_id, entry.detail) == ("t-1", None, {"title": "t"})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        entry.actor = "b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        AuditEntry(1.0, "a", AuditAction.TASK_CREATE)  # type: ignore[call-arg]
    # A bare string is refused even when it spells an action: every write names a member.
    with pytest.raises(InvalidInput, match="action"):
        AuditEntry(at=1.0, actor="a", action="task.create")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="actor"):
        AuditEntry(at=1.0, actor=" ", action=AuditAction.TASK_CREATE)
    with pytest.raises(InvalidInput, match="at"):
        AuditEntry(at=float("nan"), actor="a", action=AuditAction.TASK_CREATE)


def test_one_task_state_enum_under_both_names() -> None:
    assert DecisionState is TaskState
    assert execkit.DecisionState is execkit.TaskState is TaskState
    assert [str(state) for state in TaskState] == [
        "ready",
        "running",
        "backoff",
        "done",
        "blocked",
        "cancelled",
    ]
    assert str(DecisionState.BLOCKED) == "blocked" and "blocked" in set(DecisionState)
    decision = decide([], WorkBudget(), now=0.0)
    assert decision.state is TaskState.READY
    assert decision.to_dict()["state"] == "ready"


def test_every_action_the_ledger_writes_is_a_member_stored_as_before(
    ledger: AnyLedger, raw_sql: RawSql, backend: str
) -> None:
    owner = getpass.getuser()
    ledger.grant_role("op", OPERATE_ROLE, actor=owner)
    ledger.revoke_role("op", OPERATE_ROLE, actor=owner)
    task = ledger.create_task("t", max_attempts=1, actor=owner, now=1.0)
    run = ledger.start_run(task.id, request_key="1", actor=owner, now=2.0)
    ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK, now=3.0)
    ledger.retry_task(task.id, actor=owner, force=True, now=4.0)  # raises the limit too
    ledger.record_give_up(task.id, state="blocked", actor="dispatcher", now=5.0)
    lost = ledger.create_task("lost", actor=owner, now=6.0)
    ledger.start_run(lost.id, request_key="2", actor=owner, now=7.0, lease_s=1)
    ledger.abandon_expired_runs(now=100.0)
    ledger.cancel_task(lost.id, actor=owner, now=101.0)
    ledger.park_lane("claude/default", until=500.0, actor=owner, now=101.0)
    ledger.resume_lane("claude/default", actor=owner, now=101.0)
    ledger.set_lane_config(actor=owner, breaker_k=4, now=101.0)
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=owner, floor_usd=0.9, now=101.0)
    spender = ledger.create_task("spender", actor=owner, now=101.0)
    ledger.set_task_budget(
        spender.id, usd=5.0, tokens=None, expected_usd=None, expected_tokens=None, actor=owner
    )
    ledger.start_run(spender.id, request_key="3", actor=owner, now=101.0)  # 90% of the day's
    ledger.override_spend_cap("day", actor=owner, now=101.0)
    endpoint = ledger.add_notify_endpoint(
        "http://127.0.0.1:9/hook", events=["*"], actor=owner, now=101.0
    )
    sent = ledger.notify_test(endpoint.id, actor=owner, now=101.0)
    ledger.notify_settle(endpoint.id, sent.seq, "stopped", owner="s", error="410", now=101.0)
    ledger.enable_notify_endpoint(endpoint.id, actor=owner, now=101.0)
    ledger.remove_notify_endpoint(endpoint.id, actor=owner, now=101.0)
    summaries = "task_summaries" if backend == "sqlite" else "tasks"
    raw_sql(f"UPDATE {summaries} SET uncharged_streak = 3")
    assert ledger.repair(now=102.0)
    events = ledger.audit_events()
    assert {event.action for event in events} == _STORED_ACTIONS
    assert all(event.action in set(AuditAction) for event in events)
    assert {row[0] for row in raw_sql("SELECT DISTINCT action FROM audit")} == _STORED_ACTIONS
    via = next(e for e in events if e.action == AuditAction.TASK_SET_ATTEMPT_LIMIT)
    assert via.detail == {"from": 1, "to": 2, "via": "task.retry"}
