"""The route table of the HTTP API: every endpoint of docs/remote.md, once.

`LedgerRoutes` holds one row (`Endpoint`, row.py) per `Ledger` operation served over HTTP,
each named after the method it binds; `CAPABILITIES` and `OPENAPI` are the two routes that
bind none. `ENDPOINTS` is all of them in the document's order. The server (`execkit.server`)
routes requests with `ENDPOINTS` and the OpenAPI document (openapi.py) is generated from
it; the client (`execkit.remote.RemoteLedger`, a subclass of `LedgerRoutes`) has each row as
its method. So a new route is one row here (with its handler) plus the ledger's method
(in `Ledger` and `LedgerCore`), and the two ends and the document cannot differ. Nothing
here knows HTTP framing: a handler takes a `Call` (the checked inputs, the acting `Actor`,
the ledger) and returns (status, JSON document).

Roles, in two layers. The token's `roles` (the tokens file) gate routes here: an operation
that can need a role in the ledger needs it in the token too, so a token can be made for
less than its actor holds (a dispatcher's token without `agent.operate`). The ledger then
applies its own rule with the actor's grants (its owner holds every role):

    route                                   token role          the ledger's own check
    POST /v1/tasks/{task_id}/attempt-limit  agent.operate       creator before the first
                                                                run, else agent.operate
    POST /v1/tasks/{task_id}/retry          agent.operate when  agent.operate past an
                                            "force" is true     explicit limit
    POST /v1/grants, /v1/grants/revoke      ledger.admin        owner or ledger.admin
    POST /v1/check/repair                   ledger.admin        -
    POST /v1/lanes/park, /v1/lanes/resume   agent.operate       agent.operate
    POST /v1/lanes/config                   agent.operate       agent.operate
    every other route                       any valid token     -
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import attrs

from execkit._api.row import Call, Endpoint, Field, Needs
from execkit._api.wire import (
    ATTEMPT_LIMITS,
    LANES,
    WAKE,
    both,
    cap_number,
    document,
    flag,
    listed,
    member,
    one,
    optional,
    text,
)
from execkit._budget import Attempt, DispatchCap
from execkit._errors import InvalidInput, StorageError
from execkit._json import to_json
from execkit._lanes import LaneConfig, LaneEvent, LaneView
from execkit._usage import Usage
from execkit.ledger import (
    ADMIN_ROLE,
    NOTIFY_ENABLE_CAPABILITY,
    OPERATE_ROLE,
    SESSIONS_CAPABILITY,
    SPEND_CAPABILITY,
    SPEND_ROOM_CAPABILITY,
    AuditEvent,
    Grant,
    Ledger,
    NotifyEndpoint,
    NotifyEvent,
    OutboxEntry,
    Run,
    RunOwner,
    SpendCap,
    SpendConfig,
    SpendRoom,
    SpendRow,
    Task,
    TaskBudget,
    WindowUse,
)

__all__ = ["CAPABILITIES", "ENDPOINTS", "OPENAPI", "LedgerRoutes"]


# -- handlers -----------------------------------------------------------------------------


def _owner(value: object) -> RunOwner | None:
    """A `RunOwner` from its JSON object; its validators word a bad member."""
    if value is None:
        return None
    assert isinstance(value, dict)
    try:
        return RunOwner(**value)
    except TypeError as exc:
        raise InvalidInput(f"owner: {exc}", field="owner") from None


def owner_document(owner: RunOwner | None) -> dict[str, Any] | None:
    """A `RunOwner` on the wire (the client's encoder)."""
    return None if owner is None else owner.to_dict()


def _usage(value: object) -> Usage | None:
    """A run's cost from its JSON object; `Usage`'s validators word a bad member."""
    if value is None:
        return None
    assert isinstance(value, dict)
    try:
        return Usage(**value)
    except TypeError as exc:
        raise InvalidInput(f"usage: {exc}", field="usage") from None


def usage_document(usage: Usage | None) -> dict[str, Any] | None:
    """A run's cost on the wire (the client's encoder)."""
    return None if usage is None else to_json(usage)


def _cap(value: object) -> DispatchCap | None:
    if value is None:
        return None
    assert isinstance(value, int)
    return DispatchCap(max_attempts=value)


def _capabilities(call: Call) -> tuple[int, dict[str, Any]]:
    ledger = call.ledger
    return 200, {
        "capabilities": sorted(call.capabilities),
        "schema_version": ledger.schema_version(),
        "ledger_id": call.ledger_id or ledger.ledger_id(),
        "backoff": attrs.asdict(ledger.backoff),
        "budget": attrs.asdict(ledger.budget),
    }


def _create_task(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    task = call.ledger.create_task(
        body["title"],
        max_attempts=body.get("max_attempts", 0),
        max_uncharged_attempts=body.get("max_uncharged_attempts"),
        idempotency_key=body.get("idempotency_key") or call.idempotency_key,
        actor=call.actor,
    )
    return 201, task.to_dict()


def _list_tasks(call: Call) -> tuple[int, dict[str, Any]]:
    query = call.query
    tasks = call.ledger.list_tasks(
        state=query.get("state"), limit=query.get("limit"), after=query.get("after")
    )
    return 200, {"tasks": [task.to_dict() for task in tasks]}


def _list_tasks_with_last(call: Call) -> tuple[int, dict[str, Any]]:
    query = call.query
    page = call.ledger.list_tasks_with_last(
        cap=_cap(query.get("cap")),
        title_prefix=query.get("title_prefix"),
        limit=query.get("limit"),
        after=query.get("after"),
    )
    return 200, {
        "tasks": [
            {"task": task.to_dict(), "last_attempt": None if last is None else to_json(last)}
            for task, last in page
        ]
    }


def _get_task(call: Call) -> tuple[int, dict[str, Any]]:
    task = call.ledger.get_task(
        call.path["task_id"],
        cap=_cap(call.query.get("cap")),
        force=bool(call.query.get("force", False)),
    )
    return 200, task.to_dict()


def _task_runs(call: Call) -> tuple[int, dict[str, Any]]:
    task_id = call.path["task_id"]
    return 200, {"task_id": task_id, "runs": [r.to_dict() for r in call.ledger.runs(task_id)]}


def _set_attempt_limit(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    task = call.ledger.set_attempt_limit(
        call.path["task_id"],
        body["max_attempts"],
        expected_max_attempts=body["expected_max_attempts"],
        actor=call.actor,
        idempotency_key=body.get("idempotency_key") or call.idempotency_key,
    )
    return 200, task.to_dict()


def _retry(call: Call) -> tuple[int, dict[str, Any]]:
    task = call.ledger.retry_task(
        call.path["task_id"],
        actor=call.actor,
        reason=call.body.get("reason"),
        force=call.body.get("force", False),
        idempotency_key=call.body.get("idempotency_key") or call.idempotency_key,
    )
    return 200, task.to_dict()


def _cancel(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, call.ledger.cancel_task(call.path["task_id"], actor=call.actor).to_dict()


def _give_up(call: Call) -> tuple[int, dict[str, Any]]:
    task = call.ledger.record_give_up(
        call.path["task_id"], state=call.body["state"], actor=call.actor
    )
    return 200, task.to_dict()


def _start_run(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    # The run's request key: the body's, else the request's Idempotency-Key (so a replay
    # after a lost answer is the ledger's replay too), else a fresh one.
    key = body.get("request_key") or call.idempotency_key or f"http-{uuid.uuid4()}"
    options: dict[str, Any] = {}
    if body.get("lease_s") is not None:
        options["lease_s"] = body["lease_s"]
    run = call.ledger.start_run(
        call.path["task_id"],
        request_key=key,
        actor=call.actor,
        forced=body.get("forced", False),
        ignore_backoff=body.get("ignore_backoff", False),
        cap=_cap(body.get("cap")),
        owner=_owner(body.get("owner")),
        lane=body.get("lane"),
        workspace=body.get("workspace"),
        resumed_session=body.get("resumed_session"),
        fell_back=body.get("fell_back"),
        **options,
    )
    return 201, run.to_dict()


def _get_run(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, call.ledger.run(call.path["run_id"]).to_dict()


def _heartbeat(call: Call) -> tuple[int, dict[str, Any]]:
    run = call.ledger.heartbeat(call.path["run_id"], lease_s=call.body.get("lease_s"))
    return 200, run.to_dict()


def _finish(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    run = call.ledger.finish_run(
        call.path["run_id"],
        body["status"],
        failure_class=body.get("failure_class"),
        reason=body.get("reason"),
        not_before=body.get("not_before"),
        stopped=body.get("stopped", False),
        lane_cause=body.get("lane_cause"),
        usage=_usage(body.get("usage")),
        session_id=body.get("session_id"),
    )
    return 200, run.to_dict()


def _running_runs(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {"runs": [run.to_dict() for run in call.ledger.running_runs()]}


def _abandon_run(call: Call) -> tuple[int, dict[str, Any]]:
    run = call.ledger.abandon_run(call.path["run_id"], reason=call.body["reason"], actor=call.actor)
    return 200, run.to_dict()


def _abandon_expired(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {"runs": [run.to_dict() for run in call.ledger.abandon_expired_runs()]}


def _audit(call: Call) -> tuple[int, dict[str, Any]]:
    events = call.ledger.audit_events(call.query.get("task_id"))
    return 200, {"events": [event.to_dict() for event in events]}


def _grants(call: Call) -> tuple[int, dict[str, Any]]:
    grants = call.ledger.grants(call.query.get("principal"))
    return 200, {"grants": [grant.to_dict() for grant in grants]}


def _grant(call: Call) -> tuple[int, dict[str, Any]]:
    grant = call.ledger.grant_role(call.body["principal"], call.body["role"], actor=call.actor)
    return 201, grant.to_dict()


def _revoke(call: Call) -> tuple[int, dict[str, Any]]:
    removed = call.ledger.revoke_role(call.body["principal"], call.body["role"], actor=call.actor)
    return 200, {"revoked": removed}


def _list_lanes(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {"lanes": [lane.to_dict() for lane in call.ledger.list_lanes()]}


def _get_lane(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, call.ledger.get_lane(call.query.get("lane")).to_dict()  # type: ignore[arg-type]


def _lane_history(call: Call) -> tuple[int, dict[str, Any]]:
    lane = call.query.get("lane")
    events = call.ledger.lane_history(lane)  # type: ignore[arg-type] # the ledger checks it
    return 200, {"lane": lane, "events": [e.to_dict() for e in events]}


def _task_lane(call: Call) -> tuple[int, dict[str, Any]]:
    found = call.ledger.task_lane(call.path["task_id"])
    return 200, {"lane": None if found is None else found.to_dict()}


def _park_lane(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    lane = call.ledger.park_lane(
        body["lane"], until=body["until"], actor=call.actor, reason=body.get("reason")
    )
    return 200, lane.to_dict()


def _resume_lane(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    lane = call.ledger.resume_lane(body["lane"], actor=call.actor, reason=body.get("reason"))
    return 200, lane.to_dict()


def _lane_config(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, call.ledger.lane_config().to_dict()


def _set_lane_config(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    config = call.ledger.set_lane_config(
        actor=call.actor,
        breaker_k=body.get("breaker_k"),
        breaker_window_s=body.get("breaker_window_s"),
        cool_base_s=body.get("cool_base_s"),
        cool_max_s=body.get("cool_max_s"),
        max_park_s=body.get("max_park_s"),
        reset_margin_s=body.get("reset_margin_s"),
        recheck_s=body.get("recheck_s"),
        max_trips=body.get("max_trips"),
    )
    return 200, config.to_dict()


# -- spend caps (issue #45) --------------------------------------------------------------


def _spend_cap(value: object) -> SpendCap | None:
    """A `SpendCap` from its JSON object; its validators word a bad member."""
    if value is None:
        return None
    assert isinstance(value, dict)
    try:
        return SpendCap(**value)
    except TypeError as exc:
        raise InvalidInput(f"cap: {exc}", field="cap") from None


def cap_document(cap: SpendCap | None) -> dict[str, Any] | None:
    """A `SpendCap` on the wire (the client's encoder)."""
    return None if cap is None else cap.to_dict()


def _spend_config(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, call.ledger.spend_config().to_dict()


def _set_spend_cap(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    config = call.ledger.set_spend_cap(
        _spend_cap(body.get("cap")),
        actor=call.actor,
        floor_usd=body.get("floor_usd"),
        floor_tokens=body.get("floor_tokens"),
    )
    return 200, config.to_dict()


def _spend_windows(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {"windows": [use.to_dict() for use in call.ledger.spend_windows()]}


def _spend_rows(call: Call) -> tuple[int, dict[str, Any]]:
    raw = call.query.get("since")
    try:
        since = 0.0 if raw is None else float(raw)
    except ValueError:
        raise InvalidInput(f"since must be POSIX seconds, got {raw!r}", field="since") from None
    rows = call.ledger.spend_rows(since=since)
    return 200, {"runs": [row.to_dict() for row in rows]}


def _set_subscription_lane(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    config = call.ledger.set_subscription_lane(body["lane"], body["subscription"], actor=call.actor)
    return 200, config.to_dict()


def _override_spend_cap(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    config = call.ledger.override_spend_cap(body["window"], lane=body.get("lane"), actor=call.actor)
    return 200, config.to_dict()


def _spend_room(call: Call) -> tuple[int, dict[str, Any]]:
    spent = call.body.get("spent")
    try:
        used = None if spent is None else Usage(**spent)
    except (TypeError, InvalidInput) as exc:
        raise InvalidInput(f"spent: {exc}", field="spent") from None
    room = call.ledger.spend_room(call.path["run_id"], spent=used)
    return 200, room.to_dict()


def _task_budget(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, call.ledger.task_budget(call.path["task_id"]).to_dict()


def _set_task_budget(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    budget = call.ledger.set_task_budget(
        call.path["task_id"],
        usd=body.get("usd"),
        tokens=body.get("tokens"),
        expected_usd=body.get("expected_usd"),
        expected_tokens=body.get("expected_tokens"),
        actor=call.actor,
    )
    return 200, budget.to_dict()


def _read_spend_config(doc: dict[str, Any]) -> SpendConfig:
    try:
        return SpendConfig.from_dict(doc)
    except InvalidInput as exc:
        raise StorageError(f"the server's spend configuration could not be read: {exc}") from None


# -- tracker boards (issue #47) ----------------------------------------------------------


def _record_lane_call(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    lane = call.ledger.record_lane_call(
        body["lane"],
        body["outcome"],
        until=body.get("until"),
        reason=body.get("reason"),
        actor=call.actor,
    )
    return 200, lane.to_dict()


def _outbox_put(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    return 200, call.ledger.outbox_put(body["board"], body["item"], body["fields"]).to_dict()


def _outbox_claim(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    claimed = call.ledger.outbox_claim(
        body["board"],
        owner=body["owner"],
        lease_s=body.get("lease_s", 60.0),
        limit=body.get("limit", 50),
    )
    return 200, {"entries": [entry.to_dict() for entry in claimed]}


def _outbox_settle(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    entry = call.ledger.outbox_settle(
        body["board"],
        body["item"],
        body["seq"],
        owner=body["owner"],
        ref=body.get("ref"),
        error=body.get("error"),
        retry_at=body.get("retry_at"),
    )
    return 200, entry.to_dict()


def _outbox_entries(call: Call) -> tuple[int, dict[str, Any]]:
    board, pending = call.query.get("board"), bool(call.query.get("pending"))
    entries = call.ledger.outbox_entries(board, pending=pending)  # type: ignore[arg-type]
    return 200, {"entries": [entry.to_dict() for entry in entries]}


def _comma_list(kinds: object) -> str:
    """An endpoint's event kinds on the wire: one string, comma-separated."""
    if isinstance(kinds, str):
        return kinds
    return ",".join(str(kind) for kind in kinds)  # type: ignore[attr-defined]


def _add_notify_endpoint(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    endpoint = call.ledger.add_notify_endpoint(
        body["url"],
        events=str(body["events"]).split(","),
        format=body.get("format", "json"),
        secret=body.get("secret"),
        actor=call.actor,
    )
    return 201, endpoint.to_dict()


def _remove_notify_endpoint(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {
        "removed": call.ledger.remove_notify_endpoint(call.body["endpoint_id"], actor=call.actor)
    }


def _notify_endpoints(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {"endpoints": [e.to_dict() for e in call.ledger.notify_endpoints()]}


def _notify_test(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, call.ledger.notify_test(call.body["endpoint_id"], actor=call.actor).to_dict()


def _enable_notify_endpoint(call: Call) -> tuple[int, dict[str, Any]]:
    endpoint = call.ledger.enable_notify_endpoint(call.body["endpoint_id"], actor=call.actor)
    return 200, endpoint.to_dict()


def _note_delivery(call: Call) -> tuple[int, dict[str, Any]]:
    body = call.body
    return 200, {"new": call.ledger.note_delivery(body["source"], body["delivery"])}


# A wait holds a worker thread: at most this many wait at once, and a request past them is
# answered at once with the number as it is (its client waits a moment before asking again).
_WAKE_WAITERS = threading.BoundedSemaphore(4)
# The longest a request waits, well inside the server's request timeout.
_WAKE_WAIT_CAP_S = 25.0


def _wake_number(value: object) -> int:
    """A wake number on the wire: a whole number (a server's garbage is a StorageError)."""
    if type(value) is not int:
        raise StorageError(f"the server's wake number is not a whole number: {value!r}")
    return value


def _wake_seq(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {"wake": call.ledger.wake_seq()}


def _wait_for_wake(call: Call) -> tuple[int, dict[str, Any]]:
    seen, timeout_s = call.query.get("seen"), call.query.get("timeout_s")
    if not _WAKE_WAITERS.acquire(blocking=False):
        return 200, {"wake": call.ledger.wake_seq()}
    try:
        wait = min(float(timeout_s), _WAKE_WAIT_CAP_S) if timeout_s is not None else 0.0
        return 200, {"wake": call.ledger.wait_for_wake(seen, wait)}  # type: ignore[arg-type]
    finally:
        _WAKE_WAITERS.release()


def _check(call: Call) -> tuple[int, dict[str, Any]]:
    problems = call.ledger.validate()
    return 200, {"ok": not problems, "problems": problems}


def _repair(call: Call) -> tuple[int, dict[str, Any]]:
    return 200, {"repaired": call.ledger.repair()}


def _not_served(_call: Call) -> tuple[int, dict[str, Any]]:  # pragma: no cover
    raise InvalidInput("served by the application itself")


# -- the table ----------------------------------------------------------------------------

_TASK_ID = "/v1/tasks/{task_id}"
_RUN_ID = "/v1/runs/{run_id}"
_KEY = Field(
    "idempotency_key",
    "string",
    nullable=True,
    description="the ledger's own idempotency key (default: the request's Idempotency-Key)",
    omit_none=True,
)
_LIMITS = Needs(ATTEMPT_LIMITS, "an attempt limit")
_OWNERS = "runs.owners"
_OWNERS_WHEN_OWNER = Needs(_OWNERS, "a run's owner", when="owner")


def _true_or_none(value: object) -> bool | None:
    # Sent only when true, so a server older than `stopped` takes every other finish.
    return True if value else None


# Query fields more than one listing takes: a dispatch cap, and a page's bounds.
_CAP_QUERY = Field(
    "cap", "integer", description="a dispatch cap to add to the bounds", encode=cap_number
)
_PAGE_QUERY = (
    Field("limit", "integer", description="at most this many (1..10000)"),
    Field("after", "string", description="after this task (a page's last id)"),
)
_TASK = one(Task)
_ATTEMPT = one(Attempt)
_RUN = one(Run)
_LANE = one(LaneView)
_NEEDS_LANES = Needs(LANES, "a vendor lane")
_LANE_QUERY = Field("lane", "string", required=True, description="ADAPTER/CREDENTIAL[@HOST]")
_OUTBOX_ENTRY = one(OutboxEntry)
OUTBOX = "boards.outbox"
_NEEDS_SPEND = Needs(SPEND_CAPABILITY, "spend caps")
_NEEDS_NOTIFY = Needs("notify.endpoints", "notification endpoints")
_NEEDS_NOTIFY_ENABLE = Needs(NOTIFY_ENABLE_CAPABILITY, "enabling a stopped notification endpoint")
_NOTIFY_ENDPOINT = one(NotifyEndpoint)

CAPABILITIES: Endpoint[[], dict[str, Any]] = Endpoint(
    "GET",
    "/v1/capabilities",
    "capabilities",
    "What this server's ledger enforces, its schema version and id",
    _capabilities,
    "Capabilities",
    read=document,
)


class LedgerRoutes:
    """The routes that bind a `Ledger` method, in the document's order; on a `Sender`
    (row.py) each is that method."""

    create_task = Endpoint(
        "POST",
        "/v1/tasks",
        "createTask",
        "Create a task, with an optional explicit attempt limit",
        _create_task,
        "Task",
        status=201,
        body=(
            Field("title", "string", required=True),
            Field("max_attempts", "integer", description="0 = no explicit limit, else 1..10000"),
            Field("max_uncharged_attempts", "integer", nullable=True, omit_none=True),
            _KEY,
        ),
        binds=Ledger.create_task,
        read=_TASK,
        needs=Needs(ATTEMPT_LIMITS, "an attempt limit", when="max_attempts"),
    )
    list_tasks = Endpoint(
        "GET",
        "/v1/tasks",
        "listTasks",
        "Tasks in creation order: every one, or a page",
        _list_tasks,
        "TaskList",
        query=(
            Field("state", "string", description="only tasks in this state"),
            *_PAGE_QUERY,
        ),
        binds=Ledger.list_tasks,
        read=listed("tasks", _TASK),
    )
    # Beside /v1/tasks, not under it: a path /v1/tasks/NAME is a task's (getTask).
    list_tasks_with_last = Endpoint(
        "GET",
        "/v1/tasks-with-last",
        "listTasksWithLast",
        "Tasks in creation order, each with its last attempt (null before its first run): "
        "every one, or a page",
        _list_tasks_with_last,
        "TaskWithLastList",
        query=(
            _CAP_QUERY,
            Field("title_prefix", "string", description="only tasks whose title starts with this"),
            *_PAGE_QUERY,
        ),
        binds=Ledger.list_tasks_with_last,
        read=listed("tasks", both(member("task", _TASK), optional("last_attempt", _ATTEMPT))),
    )
    get_task = Endpoint(
        "GET",
        _TASK_ID,
        "getTask",
        "One task and the budget projection of its history",
        _get_task,
        "Task",
        query=(
            _CAP_QUERY,
            Field("force", "boolean", description="what a forced admission would meet"),
        ),
        binds=Ledger.get_task,
        read=_TASK,
    )
    runs = Endpoint(
        "GET",
        f"{_TASK_ID}/runs",
        "taskRuns",
        "A task's runs",
        _task_runs,
        "RunList",
        binds=Ledger.runs,
        read=listed("runs", _RUN),
    )
    set_attempt_limit = Endpoint(
        "POST",
        f"{_TASK_ID}/attempt-limit",
        "setAttemptLimit",
        "Compare-and-set a task's explicit attempt limit",
        _set_attempt_limit,
        "Task",
        role=OPERATE_ROLE,
        body=(
            Field("max_attempts", "integer", required=True),
            Field("expected_max_attempts", "integer", required=True),
            _KEY,
        ),
        binds=Ledger.set_attempt_limit,
        read=_TASK,
        needs=_LIMITS,
    )
    retry_task = Endpoint(
        "POST",
        f"{_TASK_ID}/retry",
        "retryTask",
        "Ask for one forced retry of a stopped task",
        _retry,
        "Task",
        role_if=("force", OPERATE_ROLE),
        body=(Field("reason", "string", nullable=True), Field("force", "boolean"), _KEY),
        binds=Ledger.retry_task,
        read=_TASK,
    )
    cancel_task = Endpoint(
        "POST",
        f"{_TASK_ID}/cancel",
        "cancelTask",
        "Cancel an open task",
        _cancel,
        "Task",
        body=(),
        binds=Ledger.cancel_task,
        read=_TASK,
    )
    record_give_up = Endpoint(
        "POST",
        f"{_TASK_ID}/give-up",
        "giveUp",
        "Record that a dispatcher gave the task's issue up",
        _give_up,
        "Task",
        body=(Field("state", "string", required=True),),
        binds=Ledger.record_give_up,
        read=_TASK,
    )
    start_run = Endpoint(
        "POST",
        f"{_TASK_ID}/runs",
        "startRun",
        "Admit one run of the task, or refuse",
        _start_run,
        "Run",
        status=201,
        body=(
            Field("request_key", "string", nullable=True),
            Field("forced", "boolean"),
            Field("ignore_backoff", "boolean"),
            Field("lease_s", "number", nullable=True),
            Field("cap", "integer", nullable=True, encode=cap_number),
            Field(
                "owner",
                "object",
                shape="RunOwner",
                description="the process that will run it (default: the server's)",
                omit_none=True,
                encode=owner_document,
            ),
            Field(
                "lane",
                "string",
                nullable=True,
                omit_none=True,
                description="the vendor lane ADAPTER/CREDENTIAL the run uses",
            ),
            Field(
                "workspace",
                "string",
                nullable=True,
                omit_none=True,
                description="where the run's agent works (a dispatcher's workspace of the issue)",
            ),
            Field(
                "resumed_session",
                "string",
                nullable=True,
                omit_none=True,
                description="the vendor session the run's agent continues (after an upstream "
                "refusal)",
            ),
            Field(
                "fell_back",
                "string",
                nullable=True,
                omit_none=True,
                description="a dispatcher's announcement that the run went to a later adapter "
                "of its issue's order (its first lanes were closed)",
            ),
        ),
        binds=Ledger.start_run,
        read=_RUN,
        needs=(_OWNERS_WHEN_OWNER, Needs(LANES, "a vendor lane", when="lane")),
    )
    run = Endpoint(
        "GET", _RUN_ID, "getRun", "One run", _get_run, "Run", binds=Ledger.run, read=_RUN
    )
    heartbeat = Endpoint(
        "POST",
        f"{_RUN_ID}/heartbeat",
        "heartbeat",
        "Renew a running run's lease",
        _heartbeat,
        "Run",
        body=(Field("lease_s", "number", nullable=True),),
        binds=Ledger.heartbeat,
        read=_RUN,
    )
    finish_run = Endpoint(
        "POST",
        f"{_RUN_ID}/finish",
        "finishRun",
        "Record how a running run ended",
        _finish,
        "Run",
        # Sent as given (enums as their values): the server's ledger checks them, with the
        # same words as a local one.
        body=(
            Field("status", "string", required=True),
            Field("failure_class", "string", nullable=True),
            Field("reason", "string", nullable=True),
            Field("not_before", "number", nullable=True),
            Field(
                "lane_cause",
                "string",
                nullable=True,
                omit_none=True,
                description="reset | credentials | billing | binary_missing, from structure",
            ),
            Field("stopped", "boolean", omit_none=True, encode=_true_or_none),
            Field(
                "usage",
                "object",
                shape="Usage",
                description="what the run cost, read from the CLI's structure (issue #45)",
                omit_none=True,
                encode=usage_document,
            ),
            Field(
                "session_id",
                "string",
                nullable=True,
                omit_none=True,
                description="the vendor session the run's agent ran in (issue #46): the "
                "task's next attempt resumes it after an upstream refusal",
            ),
        ),
        binds=Ledger.finish_run,
        read=_RUN,
        needs=(
            Needs(_OWNERS, "a stopped run", when="stopped"),
            Needs(LANES, "a vendor lane", when="lane_cause"),
            Needs(SPEND_CAPABILITY, "a run's cost", when="usage"),
            Needs(SESSIONS_CAPABILITY, "a run's vendor session", when="session_id"),
        ),
    )
    running_runs = Endpoint(
        "GET",
        "/v1/running",
        "runningRuns",
        "Every running run: where it runs, since when, until when its lease holds",
        _running_runs,
        "RunList",
        binds=Ledger.running_runs,
        read=listed("runs", _RUN),
        needs=Needs(_OWNERS, "run owners"),
    )
    abandon_run = Endpoint(
        "POST",
        f"{_RUN_ID}/abandon",
        "abandonRun",
        "Abandon a running run whose owner is known to be gone",
        _abandon_run,
        "Run",
        body=(Field("reason", "string", required=True),),
        binds=Ledger.abandon_run,
        read=_RUN,
        needs=Needs(_OWNERS, "abandoning a run"),
    )
    abandon_expired_runs = Endpoint(
        "POST",
        "/v1/runs/abandon-expired",
        "abandonExpired",
        "Abandon every running run whose lease expired",
        _abandon_expired,
        "RunList",
        body=(),
        binds=Ledger.abandon_expired_runs,
        read=listed("runs", _RUN),
    )
    audit_events = Endpoint(
        "GET",
        "/v1/audit",
        "audit",
        "Audit records, all or one task's",
        _audit,
        "AuditList",
        query=(Field("task_id", "string"),),
        binds=Ledger.audit_events,
        read=listed("events", one(AuditEvent)),
    )
    grants = Endpoint(
        "GET",
        "/v1/grants",
        "grants",
        "Every grant, or one principal's",
        _grants,
        "GrantList",
        query=(Field("principal", "string"),),
        binds=Ledger.grants,
        read=listed("grants", one(Grant)),
    )
    grant_role = Endpoint(
        "POST",
        "/v1/grants",
        "grantRole",
        "Grant a role",
        _grant,
        "Grant",
        status=201,
        role=ADMIN_ROLE,
        body=(Field("principal", "string", required=True), Field("role", "string", required=True)),
        binds=Ledger.grant_role,
        read=one(Grant),
    )
    revoke_role = Endpoint(
        "POST",
        "/v1/grants/revoke",
        "revokeRole",
        "Revoke a role",
        _revoke,
        "Revoked",
        role=ADMIN_ROLE,
        body=(Field("principal", "string", required=True), Field("role", "string", required=True)),
        binds=Ledger.revoke_role,
        read=flag("revoked"),
    )
    list_lanes = Endpoint(
        "GET",
        "/v1/lanes",
        "listLanes",
        "Every vendor lane the ledger has seen, as it stands now",
        _list_lanes,
        "LaneList",
        binds=Ledger.list_lanes,
        read=listed("lanes", _LANE),
        needs=_NEEDS_LANES,
    )
    get_lane = Endpoint(
        "GET",
        "/v1/lanes/show",
        "getLane",
        "One vendor lane as it stands now",
        _get_lane,
        "Lane",
        query=(_LANE_QUERY,),
        binds=Ledger.get_lane,
        read=_LANE,
        needs=_NEEDS_LANES,
    )
    lane_history = Endpoint(
        "GET",
        "/v1/lanes/history",
        "laneHistory",
        "A vendor lane's events in order",
        _lane_history,
        "LaneHistory",
        query=(_LANE_QUERY,),
        binds=Ledger.lane_history,
        read=listed("events", one(LaneEvent)),
        needs=_NEEDS_LANES,
    )
    task_lane = Endpoint(
        "GET",
        f"{_TASK_ID}/lane",
        "taskLane",
        "The vendor lane of the task's last run, as it stands now (null for none)",
        _task_lane,
        "TaskLane",
        binds=Ledger.task_lane,
        read=optional("lane", _LANE),
        needs=_NEEDS_LANES,
    )
    park_lane = Endpoint(
        "POST",
        "/v1/lanes/park",
        "parkLane",
        "Park a vendor lane until a time (audited)",
        _park_lane,
        "Lane",
        role=OPERATE_ROLE,
        body=(
            Field("lane", "string", required=True),
            Field("until", "number", required=True),
            Field("reason", "string", nullable=True),
        ),
        binds=Ledger.park_lane,
        read=_LANE,
        needs=_NEEDS_LANES,
    )
    resume_lane = Endpoint(
        "POST",
        "/v1/lanes/resume",
        "resumeLane",
        "Re-open a vendor lane; the task that stopped it gets one forced retry (audited)",
        _resume_lane,
        "Lane",
        role=OPERATE_ROLE,
        body=(Field("lane", "string", required=True), Field("reason", "string", nullable=True)),
        binds=Ledger.resume_lane,
        read=_LANE,
        needs=_NEEDS_LANES,
    )
    lane_config = Endpoint(
        "GET",
        "/v1/lanes/config",
        "laneConfig",
        "The lanes' configuration in force: the breaker and the bounds of every wait",
        _lane_config,
        "LaneConfig",
        binds=Ledger.lane_config,
        read=one(LaneConfig),
        needs=_NEEDS_LANES,
    )
    set_lane_config = Endpoint(
        "POST",
        "/v1/lanes/config",
        "setLaneConfig",
        "Change the fields given of the lanes' configuration, for every host (audited)",
        _set_lane_config,
        "LaneConfig",
        role=OPERATE_ROLE,
        body=(
            Field("breaker_k", "integer", nullable=True, omit_none=True),
            Field("breaker_window_s", "number", nullable=True, omit_none=True),
            Field("cool_base_s", "number", nullable=True, omit_none=True),
            Field("cool_max_s", "number", nullable=True, omit_none=True),
            Field("max_park_s", "number", nullable=True, omit_none=True),
            Field("reset_margin_s", "number", nullable=True, omit_none=True),
            Field("recheck_s", "number", nullable=True, omit_none=True),
            Field("max_trips", "integer", nullable=True, omit_none=True),
        ),
        binds=Ledger.set_lane_config,
        read=one(LaneConfig),
        needs=Needs(LANES, "the lanes' configuration"),
    )
    record_lane_call = Endpoint(
        "POST",
        "/v1/lanes/calls",
        "recordLaneCall",
        "What a call to an outside service met on its own lane (a tracker's API)",
        _record_lane_call,
        "Lane",
        body=(
            Field("lane", "string", required=True),
            Field("outcome", "string", required=True, description="success, upstream, reset, stop"),
            Field("until", "number", nullable=True, omit_none=True),
            Field("reason", "string", nullable=True, omit_none=True),
        ),
        binds=Ledger.record_lane_call,
        read=_LANE,
        needs=Needs(OUTBOX, "a tracker's lane"),
    )
    spend_config = Endpoint(
        "GET",
        "/v1/spend/caps",
        "spendConfig",
        "The ledger's spend caps and the floor of a run's reservation",
        _spend_config,
        "SpendConfig",
        binds=Ledger.spend_config,
        read=_read_spend_config,
        needs=_NEEDS_SPEND,
    )
    set_spend_cap = Endpoint(
        "POST",
        "/v1/spend/caps",
        "setSpendCap",
        "Set one spend cap (neither usd nor tokens: remove it) and/or the reservation's "
        "floor, for every host (audited)",
        _set_spend_cap,
        "SpendConfig",
        role=OPERATE_ROLE,
        body=(
            Field(
                "cap",
                "object",
                shape="SpendCap",
                nullable=True,
                omit_none=True,
                encode=cap_document,
                description="window (day, 5h, week), lane (null: ledger-wide), usd, tokens, tz",
            ),
            Field("floor_usd", "number", nullable=True, omit_none=True),
            Field("floor_tokens", "integer", nullable=True, omit_none=True),
        ),
        binds=Ledger.set_spend_cap,
        read=_read_spend_config,
        needs=_NEEDS_SPEND,
    )
    set_subscription_lane = Endpoint(
        "POST",
        "/v1/spend/subscription",
        "setSubscriptionLane",
        "Mark a vendor lane as a subscription (its USD recorded, held to tokens only) or not",
        _set_subscription_lane,
        "SpendConfig",
        role=OPERATE_ROLE,
        body=(
            Field("lane", "string", required=True),
            Field("subscription", "boolean", required=True),
        ),
        binds=Ledger.set_subscription_lane,
        read=_read_spend_config,
        needs=Needs(SPEND_ROOM_CAPABILITY, "a subscription lane"),
    )
    override_spend_cap = Endpoint(
        "POST",
        "/v1/spend/override",
        "overrideSpendCap",
        "Lift one spend cap for the window that holds now, for every host (audited)",
        _override_spend_cap,
        "SpendConfig",
        role=OPERATE_ROLE,
        body=(
            Field("window", "string", required=True, description="day, 5h or week"),
            Field("lane", "string", nullable=True, omit_none=True),
        ),
        binds=Ledger.override_spend_cap,
        read=_read_spend_config,
        needs=Needs(SPEND_ROOM_CAPABILITY, "a spend cap's override"),
    )
    spend_windows = Endpoint(
        "GET",
        "/v1/spend/windows",
        "spendWindows",
        "What each spend cap's window holds now, and when it reopens",
        _spend_windows,
        "WindowUseList",
        binds=Ledger.spend_windows,
        read=listed("windows", one(WindowUse)),
        needs=_NEEDS_SPEND,
    )
    spend_rows = Endpoint(
        "GET",
        "/v1/spend/runs",
        "spendRows",
        "Every run started since a time, with its task, lane and cost",
        _spend_rows,
        "SpendRowList",
        query=(Field("since", "number", nullable=True, description="POSIX seconds; 0: all"),),
        binds=Ledger.spend_rows,
        read=listed("runs", one(SpendRow)),
        needs=_NEEDS_SPEND,
    )
    spend_room = Endpoint(
        "POST",
        f"{_RUN_ID}/spend-room",
        "spendRoom",
        "What a running run may spend before it asks again: its reservation grown as it "
        "spends, or the cap that stops it",
        _spend_room,
        "SpendRoom",
        body=(
            Field(
                "spent",
                "object",
                shape="Usage",
                nullable=True,
                omit_none=True,
                encode=usage_document,
                description="what the run spent so far, read from the CLI's structure",
            ),
        ),
        binds=Ledger.spend_room,
        read=one(SpendRoom),
        needs=Needs(SPEND_ROOM_CAPABILITY, "a running run's spend"),
    )
    task_budget = Endpoint(
        "GET",
        f"{_TASK_ID}/budget",
        "taskBudget",
        "The task's own spend cap",
        _task_budget,
        "TaskBudget",
        binds=Ledger.task_budget,
        read=one(TaskBudget),
        needs=_NEEDS_SPEND,
    )
    set_task_budget = Endpoint(
        "POST",
        f"{_TASK_ID}/budget",
        "setTaskBudget",
        "Compare-and-set the task's own spend cap (audited)",
        _set_task_budget,
        "TaskBudget",
        body=(
            Field("usd", "number", nullable=True),
            Field("tokens", "integer", nullable=True),
            Field("expected_usd", "number", nullable=True),
            Field("expected_tokens", "integer", nullable=True),
        ),
        binds=Ledger.set_task_budget,
        read=one(TaskBudget),
        needs=_NEEDS_SPEND,
    )
    outbox_put = Endpoint(
        "POST",
        "/v1/outbox/put",
        "outboxPut",
        "Record what a board item must show on its tracker (merged over the last put)",
        _outbox_put,
        "OutboxEntry",
        body=(
            Field("board", "string", required=True),
            Field("item", "string", required=True),
            Field("fields", "object", required=True, description="at most 16 scalar members"),
        ),
        binds=Ledger.outbox_put,
        read=_OUTBOX_ENTRY,
        needs=Needs(OUTBOX, "the board outbox"),
    )
    outbox_claim = Endpoint(
        "POST",
        "/v1/outbox/claim",
        "outboxClaim",
        "Claim the due entries of a board for sending (a lease)",
        _outbox_claim,
        "OutboxEntryList",
        body=(
            Field("board", "string", required=True),
            Field("owner", "string", required=True),
            Field("lease_s", "number"),
            Field("limit", "integer"),
        ),
        binds=Ledger.outbox_claim,
        read=listed("entries", _OUTBOX_ENTRY),
        needs=Needs(OUTBOX, "the board outbox"),
    )
    outbox_settle = Endpoint(
        "POST",
        "/v1/outbox/settle",
        "outboxSettle",
        "What came of sending one put of an entry: delivered, or failed and when to retry",
        _outbox_settle,
        "OutboxEntry",
        body=(
            Field("board", "string", required=True),
            Field("item", "string", required=True),
            Field("seq", "integer", required=True),
            Field("owner", "string", required=True),
            Field("ref", "string", nullable=True, omit_none=True),
            Field("error", "string", nullable=True, omit_none=True),
            Field("retry_at", "number", nullable=True, omit_none=True),
        ),
        binds=Ledger.outbox_settle,
        read=_OUTBOX_ENTRY,
        needs=Needs(OUTBOX, "the board outbox"),
    )
    outbox_entries = Endpoint(
        "GET",
        "/v1/outbox",
        "outboxEntries",
        "A board's outbox entries by item (pending: only those not delivered yet)",
        _outbox_entries,
        "OutboxEntryList",
        query=(Field("board", "string", required=True), Field("pending", "boolean")),
        binds=Ledger.outbox_entries,
        read=listed("entries", _OUTBOX_ENTRY),
        needs=Needs(OUTBOX, "the board outbox"),
    )
    add_notify_endpoint = Endpoint(
        "POST",
        "/v1/notify/endpoints",
        "addNotifyEndpoint",
        "Store a notification endpoint (admin; audited): sent the events of its kinds "
        "written from now on; its URL's path and its secret are never shown",
        _add_notify_endpoint,
        "NotifyEndpoint",
        status=201,
        role=ADMIN_ROLE,
        body=(
            Field("url", "string", required=True),
            Field(
                "events",
                "string",
                required=True,
                description="event kinds, comma-separated, or *",
                encode=_comma_list,
            ),
            Field("format", "string", description="json (default) or slack"),
            Field("secret", "string", nullable=True, omit_none=True),
        ),
        binds=Ledger.add_notify_endpoint,
        read=_NOTIFY_ENDPOINT,
        needs=_NEEDS_NOTIFY,
    )
    remove_notify_endpoint = Endpoint(
        "POST",
        "/v1/notify/endpoints/remove",
        "removeNotifyEndpoint",
        "Remove a notification endpoint (admin; audited)",
        _remove_notify_endpoint,
        "Removed",
        role=ADMIN_ROLE,
        body=(Field("endpoint_id", "string", required=True),),
        binds=Ledger.remove_notify_endpoint,
        read=flag("removed"),
        needs=_NEEDS_NOTIFY,
    )
    notify_endpoints = Endpoint(
        "GET",
        "/v1/notify/endpoints",
        "notifyEndpoints",
        "Every notification endpoint with its health (delivered, failed, backlog, stopped)",
        _notify_endpoints,
        "NotifyEndpointList",
        binds=Ledger.notify_endpoints,
        read=listed("endpoints", _NOTIFY_ENDPOINT),
        needs=_NEEDS_NOTIFY,
    )
    notify_test = Endpoint(
        "POST",
        "/v1/notify/test",
        "notifyTest",
        "Send a notify.test event to one endpoint (admin)",
        _notify_test,
        "NotifyEvent",
        role=ADMIN_ROLE,
        body=(Field("endpoint_id", "string", required=True),),
        binds=Ledger.notify_test,
        read=one(NotifyEvent),
        needs=_NEEDS_NOTIFY,
    )
    enable_notify_endpoint = Endpoint(
        "POST",
        "/v1/notify/endpoints/enable",
        "enableNotifyEndpoint",
        "Send again to an endpoint a refusal stopped, its waiting events in order (admin; audited)",
        _enable_notify_endpoint,
        "NotifyEndpoint",
        role=ADMIN_ROLE,
        body=(Field("endpoint_id", "string", required=True),),
        binds=Ledger.enable_notify_endpoint,
        read=_NOTIFY_ENDPOINT,
        needs=_NEEDS_NOTIFY_ENABLE,
    )
    note_delivery = Endpoint(
        "POST",
        "/v1/deliveries",
        "noteDelivery",
        "A tracker's webhook delivery: true (and the dispatchers woken) the first time",
        _note_delivery,
        "Delivery",
        body=(Field("source", "string", required=True), Field("delivery", "string", required=True)),
        binds=Ledger.note_delivery,
        read=flag("new"),
        needs=Needs(OUTBOX, "a webhook delivery"),
    )
    wake_seq = Endpoint(
        "GET",
        "/v1/wake",
        "wakeSeq",
        "The ledger's wake number: it grows when an operator lets work run again",
        _wake_seq,
        "Wake",
        binds=Ledger.wake_seq,
        read=member("wake", _wake_number),
        needs=Needs(WAKE, "wake-ups"),
    )
    wait_for_wake = Endpoint(
        "GET",
        "/v1/wake/wait",
        "waitForWake",
        "The wake number once it differs from seen, or after timeout_s (at most 25 s here)",
        _wait_for_wake,
        "Wake",
        query=(
            Field("seen", "integer", required=True, description="the number last seen"),
            Field("timeout_s", "number", required=True, description="0..300 seconds"),
        ),
        binds=Ledger.wait_for_wake,
        read=member("wake", _wake_number),
        needs=Needs(WAKE, "wake-ups"),
    )
    validate = Endpoint(
        "GET",
        "/v1/check",
        "check",
        "Validate every history",
        _check,
        "Check",
        binds=Ledger.validate,
        read=listed("problems", text),
    )
    repair = Endpoint(
        "POST",
        "/v1/check/repair",
        "repair",
        "Abandon expired runs and rebuild summaries from their histories",
        _repair,
        "Repaired",
        role=ADMIN_ROLE,
        body=(),
        binds=Ledger.repair,
        read=listed("repaired", text),
    )


OPENAPI: Endpoint[..., Any] = Endpoint(
    "GET",
    "/openapi.json",
    "openapi",
    "This document",
    _not_served,
    "OpenApi",
    authenticated=False,
)

ENDPOINTS: tuple[Endpoint[..., Any], ...] = (
    CAPABILITIES,
    *(row for row in vars(LedgerRoutes).values() if isinstance(row, Endpoint)),
    OPENAPI,
)
