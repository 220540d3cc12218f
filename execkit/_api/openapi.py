"""The OpenAPI 3.1 document of the HTTP API, generated from the route table (routes.py)
and from the ledger's own wire types (`Task`, `Run`, `Attempt`, `Grant`, `AuditEvent`, and
the `Backoff` and `WorkBudget` in the capabilities: their attrs fields and annotations), so the
document describes exactly what the server routes and answers. Served at
`GET /openapi.json` without authentication; `python -m execkit.server --openapi` prints it,
and the TypeScript SDK's wire types are generated from it (sdk/typescript/scripts/).

An enum field's schema carries the enum's name as its `title` (`TaskState`, and
`ErrorCode` for the error codes), so a generator can name the type; `ERROR_STATUSES` is
every code the server answers with, and the error schema lists exactly those.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import attrs

from execkit._api.routes import ENDPOINTS
from execkit._api.row import Endpoint, Field
from execkit._budget import Attempt, Backoff, WorkBudget
from execkit._lanes import LaneConfig, LaneEvent, LaneView
from execkit._usage import Usage
from execkit.ledger import (
    AuditEvent,
    Grant,
    NotifyEndpoint,
    NotifyEvent,
    OutboxEntry,
    Run,
    RunOwner,
    SpendCap,
    SpendRoom,
    SpendRow,
    Task,
    TaskBudget,
    WindowUse,
)

__all__ = ["ERROR_STATUSES", "openapi_document", "package_version"]

# docs/remote.md, "Errors": the HTTP status of every error code.
ERROR_STATUSES: dict[str, int] = {
    "invalid": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "blocked": 409,
    "finished": 409,
    "backoff": 409,
    "lane_waiting": 409,
    "lane_stopped": 409,
    "spend_cap": 409,
    "unsupported_move": 409,
    "attempt_limit": 422,
    "invalid_history": 422,
    "storage": 503,
    "schema_too_new": 503,
    "error": 500,
}

_JSON = "application/json"


def _schema_of(annotation: Any) -> dict[str, Any]:
    """The JSON Schema of one field annotation of a wire type."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        inner = _schema_of(next(a for a in args if a is not type(None)))
        if "enum" in inner:
            return {**inner, "type": [inner["type"], "null"], "enum": [*inner["enum"], None]}
        return {"type": [inner["type"], "null"]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        return {"type": "string", "enum": values, "title": annotation.__name__}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if annotation is str:
        return {"type": "string"}
    if typing.get_origin(annotation) is dict or annotation is dict:
        return {"type": "object"}
    if typing.get_origin(annotation) is tuple:  # tuple[X, ...]: a JSON array of X
        return {"type": "array", "items": _schema_of(args[0])}
    raise TypeError(f"no JSON schema for {annotation!r}")  # pragma: no cover


# What a wire field means where its name does not say it all (the ledger's comments on
# its fields), for readers of the document and of the types generated from it.
_DESCRIPTIONS: dict[type, dict[str, str]] = {
    Task: {
        "ready": 'state is "ready", including that an attempt is still available',
        "max_attempts": "the explicit attempt limit; 0 = none",
        "max_uncharged_attempts": (
            "the ceiling on consecutive upstream attempts in force (the task's, else the ledger's)"
        ),
        "retry_pending": "an operator asked for one forced retry",
        "gave_up_at_attempt": "a dispatcher gave the task's issue up at this attempt count",
    },
    Run: {
        "attempt": "gapless 1..N per task",
        "stopped": "abandoned by its own runner on purpose: uncharged",
    },
    Attempt: {
        "number": "the attempt's number, 1..N per task (its run's attempt)",
        "not_before": "the vendor's reset time: the next attempt waits for it",
        "stopped": "abandoned by its own runner on purpose: uncharged",
    },
    RunOwner: {
        "boot_id": "the kernel's boot id: with pid_namespace, where pid means something",
        "pid_started_at": "the process's start time (a reused pid has another)",
        "instance": "a random id the owner drew when it started",
    },
    LaneView: {
        "state": "as it stands now (half_open: the wait passed; one probe attempt goes first)",
        "admits": "the next admission on the lane may go",
        "probe": "the next admission is the half-open probe",
        "opens_at": "when a parked or cooling lane opens; null when only a result or an "
        "operator opens it",
        "capped": "the vendor's stated reset was further than the cap and was cut to it",
    },
    LaneConfig: {
        "breaker_k": "upstream failures on a lane within breaker_window_s that cool it (1..1000)",
        "breaker_window_s": "the breaker's window in seconds (1..86400)",
        "cool_base_s": "the first cooling's length; it doubles per trip in a row (1..3600)",
        "cool_max_s": "the longest cooling (cool_base_s..86400)",
        "max_park_s": "a stated reset further away is capped here (60..2592000)",
        "reset_margin_s": "the probe after a stated reset goes this far past it, plus a "
        "jitter of up to as much again (0..300)",
        "recheck_s": "a probe that meets the vendor's limit again waits this, doubling per "
        "such probe in a row up to cool_max_s (1..3600)",
        "max_trips": "closings in a row with no answer before the lane stops for a person "
        "(1..1000)",
        "rules": "the version of the fold's rules (2; 1 for events from before it)",
    },
}


def _wire_schema(kind: type) -> dict[str, Any]:
    hints = typing.get_type_hints(kind)
    fields = attrs.fields(kind)
    described = _DESCRIPTIONS.get(kind, {})
    properties = {}
    for field in fields:
        schema = _schema_of(hints[field.name])
        if field.name in described:
            schema["description"] = described[field.name]
        properties[field.name] = schema
    return {
        "type": "object",
        "properties": properties,
        "required": [field.name for field in fields],
    }


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _array_of(name: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(name)}


def _components() -> dict[str, Any]:
    codes = sorted(ERROR_STATUSES)
    schemas: dict[str, Any] = {
        "Task": _wire_schema(Task),
        "Run": _wire_schema(Run),
        "RunOwner": _wire_schema(RunOwner),
        "Usage": _wire_schema(Usage),
        "SpendCap": _wire_schema(SpendCap),
        "SpendConfig": _object(
            {
                "caps": _array_of("SpendCap"),
                "floor_usd": {"type": "number"},
                "floor_tokens": {"type": "integer"},
                "task_budgets": {"type": "boolean"},
                "overrides": {"type": "object", "additionalProperties": {"type": "number"}},
                "subscription_lanes": {"type": "array", "items": {"type": "string"}},
            }
        ),
        "TaskBudget": _wire_schema(TaskBudget),
        "SpendRoom": _wire_schema(SpendRoom),
        "WindowUse": _wire_schema(WindowUse),
        "SpendRow": _wire_schema(SpendRow),
        "SpendRowList": _object({"runs": _array_of("SpendRow")}),
        "WindowUseList": _object({"windows": _array_of("WindowUse")}),
        "Grant": _wire_schema(Grant),
        "AuditEvent": _wire_schema(AuditEvent),
        "TaskList": _object({"tasks": _array_of("Task")}),
        "Attempt": _wire_schema(Attempt),
        "TaskWithLast": _object(
            {"task": _ref("Task"), "last_attempt": {"oneOf": [_ref("Attempt"), {"type": "null"}]}}
        ),
        "TaskWithLastList": _object({"tasks": _array_of("TaskWithLast")}),
        "RunList": _object({"runs": _array_of("Run")}, optional={"task_id": {"type": "string"}}),
        "AuditList": _object({"events": _array_of("AuditEvent")}),
        "GrantList": _object({"grants": _array_of("Grant")}),
        "Revoked": _object({"revoked": {"type": "boolean"}}),
        "Check": _object(
            {"ok": {"type": "boolean"}, "problems": {"type": "array", "items": {"type": "string"}}}
        ),
        "Repaired": _object({"repaired": {"type": "array", "items": {"type": "string"}}}),
        "Lane": _wire_schema(LaneView),
        "LaneEvent": _wire_schema(LaneEvent),
        "LaneList": _object({"lanes": _array_of("Lane")}),
        "LaneHistory": _object({"lane": {"type": "string"}, "events": _array_of("LaneEvent")}),
        "TaskLane": _object({"lane": {"oneOf": [_ref("Lane"), {"type": "null"}]}}),
        "LaneConfig": _wire_schema(LaneConfig),
        "Wake": _object({"wake": {"type": "integer"}}),
        "OutboxEntry": _wire_schema(OutboxEntry),
        "OutboxEntryList": _object({"entries": _array_of("OutboxEntry")}),
        "Delivery": _object({"new": {"type": "boolean"}}),
        "NotifyEndpoint": _wire_schema(NotifyEndpoint),
        "NotifyEndpointList": _object({"endpoints": _array_of("NotifyEndpoint")}),
        "NotifyEvent": _wire_schema(NotifyEvent),
        "Removed": _object({"removed": {"type": "boolean"}}),
        "Capabilities": _object(
            {
                "capabilities": {"type": "array", "items": {"type": "string"}},
                "schema_version": {"type": "integer"},
                "ledger_id": {"type": "string"},
                "backoff": _ref("Backoff"),
                "budget": _ref("WorkBudget"),
            }
        ),
        "Backoff": _wire_schema(Backoff),
        "WorkBudget": _wire_schema(WorkBudget),
        "OpenApi": {"type": "object"},
        "Error": _object(
            {
                "error": _object(
                    {
                        "code": {"type": "string", "enum": codes, "title": "ErrorCode"},
                        "message": {"type": "string"},
                    },
                    optional={
                        "ready_at": {"type": "number"},
                        "lane": {"type": "string"},
                        "opens_at": {"type": ["number", "null"]},
                        "fix": {"type": ["string", "null"]},
                        "field": {"type": "string"},
                    },
                )
            }
        ),
    }
    return {
        "schemas": schemas,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    }


def _object(required: dict[str, Any], *, optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
    }


def _field_schema(field: Field) -> dict[str, Any]:
    if field.shape is not None:
        shaped = _ref(field.shape)
        schema: dict[str, Any] = {"anyOf": [shaped, {"type": "null"}]} if field.nullable else shaped
        if field.description:
            schema["description"] = field.description
        return schema
    schema = {"type": [field.type, "null"] if field.nullable else field.type}
    if field.description:
        schema["description"] = field.description
    return schema


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref("Error")}}}


def _operation(endpoint: Endpoint[..., Any]) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in endpoint.path_params()
    ]
    parameters += [
        {"name": field.name, "in": "query", "required": False, "schema": _field_schema(field)}
        for field in endpoint.query
    ]
    responses: dict[str, Any] = {
        str(endpoint.status): {
            "description": endpoint.summary,
            "content": {_JSON: {"schema": _ref(endpoint.response)}},
        }
    }
    operation: dict[str, Any] = {
        "operationId": endpoint.operation_id,
        "summary": endpoint.summary,
        "responses": responses,
    }
    if endpoint.authenticated:
        operation["security"] = [{"bearer": []}]
        responses["401"] = _error_response("no token, or an unknown one")
        responses["403"] = _error_response("the token lacks a role the operation needs")
        responses["400"] = _error_response("invalid input")
        responses["404"] = _error_response("no such task or run")
        responses["409"] = _error_response("a conflict or a refused admission")
        responses["422"] = _error_response("an attempt limit, or a broken history")
        responses["503"] = _error_response("the ledger could not be read or written")
        roles = sorted({r for r in (endpoint.role, endpoint.role_if and endpoint.role_if[1]) if r})
        if roles:
            when = f" when {endpoint.role_if[0]} is true" if endpoint.role_if else ""
            operation["description"] = f"Needs the token role {', '.join(roles)}{when}."
    if endpoint.body is not None:
        parameters.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 200},
            }
        )
        responses["413"] = _error_response("the request body is over the server's limit")
        operation["requestBody"] = {
            "required": False,
            "content": {
                _JSON: {
                    "schema": {
                        "type": "object",
                        "properties": {f.name: _field_schema(f) for f in endpoint.body},
                        "required": [f.name for f in endpoint.body if f.required],
                        "additionalProperties": False,
                    }
                }
            },
        }
    if endpoint.authenticated:
        parameters.append(
            {
                "name": "X-On-Behalf-Of",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 200},
            }
        )
    if parameters:
        operation["parameters"] = parameters
    return operation


def openapi_document(version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `ENDPOINTS` (a fresh dict on every call)."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "execkit ledger",
            "version": version,
            "description": "The execkit ledger over HTTP (docs/remote.md).",
        },
        "paths": paths,
        "components": _components(),
    }


def package_version() -> str:
    """The installed execkit's version, the document's `info.version` ("0" in a source
    checkout that is not installed as a distribution)."""
    try:
        from importlib.metadata import version

        return version("execkit-runner")
    except Exception:  # not installed as a distribution (a source checkout)
        return "0"
