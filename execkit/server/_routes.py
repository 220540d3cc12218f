"""The HTTP API's route table: every endpoint of docs/remote.md, once.

Each `Endpoint` names its method and path, the token role it needs (the server's layer;
the ledger checks its own grants beneath it), the fields of its query and body with their
JSON types, its answer and the ledger call that makes it. The application (`_app`) routes
requests with this table and the OpenAPI document (`_openapi`) is generated from it, so the
two cannot differ. Nothing here knows HTTP framing: a handler takes a `Call` (the checked
inputs, the acting `Actor`, the ledger) and returns (status, JSON document).

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
    every other route                       any valid token     -
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from execkit._budget import DispatchCap
from execkit._errors import InvalidInput
from execkit.ledger import ADMIN_ROLE, OPERATE_ROLE, Actor, Ledger

__all__ = ["ENDPOINTS", "Call", "Endpoint", "Field", "Handler"]


@attrs.frozen
class Field:
    """One query parameter or body member: its JSON type ("string", "integer", "number",
    "boolean"), whether it must be given and whether null is allowed."""

    name: str
    type: str
    required: bool = False
    nullable: bool = False
    description: str = ""


@attrs.frozen
class Call:
    """One checked request, as a handler sees it."""

    ledger: Ledger
    actor: Actor
    path: Mapping[str, str]
    query: Mapping[str, Any]
    body: Mapping[str, Any]
    idempotency_key: str | None
    capabilities: frozenset[str]


Handler = Callable[[Call], tuple[int, dict[str, Any]]]


@attrs.frozen
class Endpoint:
    method: str
    path: str
    operation_id: str
    summary: str
    handler: Handler
    response: str  # a schema name in the OpenAPI document's components
    status: int = 200
    role: str | None = None  # the token role every call needs
    role_if: tuple[str, str] | None = None  # (boolean body field, role) when it is true
    query: tuple[Field, ...] = ()
    body: tuple[Field, ...] | None = None  # None: no body (GET)
    authenticated: bool = True

    def roles_needed(self, body: Mapping[str, Any]) -> frozenset[str]:
        needed = {self.role} if self.role else set()
        if self.role_if is not None and body.get(self.role_if[0]) is True:
            needed.add(self.role_if[1])
        return frozenset(needed)

    def path_params(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]


# -- handlers -----------------------------------------------------------------------------


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
        "ledger_id": ledger.ledger_id(),
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
    return 200, {"tasks": [task.to_dict() for task in call.ledger.list_tasks()]}


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
    )
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
)

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/v1/capabilities",
        "capabilities",
        "What this server's ledger enforces, its schema version and id",
        _capabilities,
        "Capabilities",
    ),
    Endpoint(
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
            Field("max_uncharged_attempts", "integer", nullable=True),
            _KEY,
        ),
    ),
    Endpoint("GET", "/v1/tasks", "listTasks", "Every task", _list_tasks, "TaskList"),
    Endpoint(
        "GET",
        _TASK_ID,
        "getTask",
        "One task and the budget projection of its history",
        _get_task,
        "Task",
        query=(
            Field("cap", "integer", description="a dispatch cap to add to the bounds"),
            Field("force", "boolean", description="what a forced admission would meet"),
        ),
    ),
    Endpoint("GET", f"{_TASK_ID}/runs", "taskRuns", "A task's runs", _task_runs, "RunList"),
    Endpoint(
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
    ),
    Endpoint(
        "POST",
        f"{_TASK_ID}/retry",
        "retryTask",
        "Ask for one forced retry of a stopped task",
        _retry,
        "Task",
        role_if=("force", OPERATE_ROLE),
        body=(Field("reason", "string", nullable=True), Field("force", "boolean")),
    ),
    Endpoint(
        "POST", f"{_TASK_ID}/cancel", "cancelTask", "Cancel an open task", _cancel, "Task", body=()
    ),
    Endpoint(
        "POST",
        f"{_TASK_ID}/give-up",
        "giveUp",
        "Record that a dispatcher gave the task's issue up",
        _give_up,
        "Task",
        body=(Field("state", "string", required=True),),
    ),
    Endpoint(
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
            Field("cap", "integer", nullable=True),
        ),
    ),
    Endpoint("GET", _RUN_ID, "getRun", "One run", _get_run, "Run"),
    Endpoint(
        "POST",
        f"{_RUN_ID}/heartbeat",
        "heartbeat",
        "Renew a running run's lease",
        _heartbeat,
        "Run",
        body=(Field("lease_s", "number", nullable=True),),
    ),
    Endpoint(
        "POST",
        f"{_RUN_ID}/finish",
        "finishRun",
        "Record how a running run ended",
        _finish,
        "Run",
        body=(
            Field("status", "string", required=True),
            Field("failure_class", "string", nullable=True),
            Field("reason", "string", nullable=True),
            Field("not_before", "number", nullable=True),
        ),
    ),
    Endpoint(
        "POST",
        "/v1/runs/abandon-expired",
        "abandonExpired",
        "Abandon every running run whose lease expired",
        _abandon_expired,
        "RunList",
        body=(),
    ),
    Endpoint(
        "GET",
        "/v1/audit",
        "audit",
        "Audit records, all or one task's",
        _audit,
        "AuditList",
        query=(Field("task_id", "string"),),
    ),
    Endpoint(
        "GET",
        "/v1/grants",
        "grants",
        "Every grant, or one principal's",
        _grants,
        "GrantList",
        query=(Field("principal", "string"),),
    ),
    Endpoint(
        "POST",
        "/v1/grants",
        "grantRole",
        "Grant a role",
        _grant,
        "Grant",
        status=201,
        role=ADMIN_ROLE,
        body=(Field("principal", "string", required=True), Field("role", "string", required=True)),
    ),
    Endpoint(
        "POST",
        "/v1/grants/revoke",
        "revokeRole",
        "Revoke a role",
        _revoke,
        "Revoked",
        role=ADMIN_ROLE,
        body=(Field("principal", "string", required=True), Field("role", "string", required=True)),
    ),
    Endpoint("GET", "/v1/check", "check", "Validate every history", _check, "Check"),
    Endpoint(
        "POST",
        "/v1/check/repair",
        "repair",
        "Abandon expired runs and rebuild summaries from their histories",
        _repair,
        "Repaired",
        role=ADMIN_ROLE,
        body=(),
    ),
    Endpoint(
        "GET",
        "/openapi.json",
        "openapi",
        "This document",
        _not_served,
        "OpenApi",
        authenticated=False,
    ),
)
