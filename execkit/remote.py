"""`RemoteLedger`: the `Ledger` interface over the HTTP API of `execkit serve`
(docs/remote.md), with the standard library only.

    from execkit.remote import RemoteLedger

    ledger = RemoteLedger("http://127.0.0.1:8750", token)
    Dispatcher(board, runner, ledger, config).run_forever(10)

Every rule is the server's ledger's: a refusal comes back as the same typed exception a
local ledger raises (`AttemptLimitReached`, `TaskBackingOff` with its `ready_at`, ...),
mapped from the error's `code`. Who acts is the token's actor, never the `actor` argument's
name (a client cannot choose who it is, as the local CLI cannot); an `Actor` with
`on_behalf_of` (else the `on_behalf_of` given here) is sent as `X-On-Behalf-Of`. The
server's clock decides `now`: the `now` arguments of the interface are accepted and not
sent. The budget and backoff are the server's too (`budget`, `backoff` read them from
`/v1/capabilities`); setting a different one is refused (`InvalidInput`) rather than
silently ignored.

Transport: one keep-alive connection per thread (the dispatcher renews leases from a
second thread), so calls from several threads never share a connection. Every POST carries
a fresh `Idempotency-Key` per logical call; when the connection drops before an answer
arrives the call is sent again with the same key, at most `retries` times, and the server
replays its stored answer instead of acting twice. A server that cannot be reached (or
answers something that is not the API) is `StorageError`. An unknown token (401) is
`Unauthenticated` (a `Forbidden`).

Capabilities (ADR 0033): before `create_task` with a limit, or `set_attempt_limit`, the
client reads `/v1/capabilities`; a server that does not advertise `tasks.attempt_limits`
may not enforce the limit, so the call is refused with `StorageError` (the family of "this
ledger cannot do that", exit 13), nothing sent.
"""

from __future__ import annotations

import enum
import http.client
import json
import socket
import threading
import time
import types
import typing
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from execkit._backoff import Backoff
from execkit._budget import Attempt, AttemptStatus, DispatchCap, WorkBudget
from execkit._classify import FailureClass
from execkit._errors import (
    ExecKitError,
    InvalidInput,
    StorageError,
    TaskBackingOff,
    error_types,
)
from execkit._proof import AgentFailed
from execkit.ledger import DEFAULT_LEASE_S, Actor, AuditEvent, Grant, Run, Task, attempt_from_run

__all__ = [
    "ATTEMPT_LIMITS",
    "REMOTE_ENV_VAR",
    "TOKEN_ENV_VAR",
    "RemoteLedger",
    "error_from_wire",
]

REMOTE_ENV_VAR = "EXECKIT_REMOTE"
TOKEN_ENV_VAR = "EXECKIT_TOKEN"
ATTEMPT_LIMITS = "tasks.attempt_limits"

_RETRY_PAUSES_S = (0.05, 0.25, 1.0, 2.0)
_MAX_ANSWER_BYTES = 64 * 1024 * 1024
_T = TypeVar("_T", bound=attrs.AttrsInstance)

_TYPES_BY_CODE: dict[str, type[ExecKitError]] = {}
for _kind in error_types():
    if _kind is not AgentFailed:
        _TYPES_BY_CODE.setdefault(_kind.code, _kind)


def error_from_wire(status: int, doc: object) -> ExecKitError:
    """The typed exception for an error answer `{"error": {"code", "message"}}`."""
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return StorageError(f"the server answered HTTP {status} without an execkit error")
    code: str = error["code"]
    message = str(error.get("message", ""))
    kind = _TYPES_BY_CODE.get(code, ExecKitError)
    if issubclass(kind, TaskBackingOff):
        ready_at = error.get("ready_at")
        at = float(ready_at) if isinstance(ready_at, int | float) else time.time()
        return kind(message, ready_at=at)
    try:
        return kind(message)
    except TypeError:  # pragma: no cover - every mapped type takes a message
        return ExecKitError(message)


# -- the wire shapes back into the ledger's types ------------------------------------------


def _value(annotation: Any, value: Any) -> Any:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        annotation = next(a for a in args if a is not type(None))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation(value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _from_wire(kind: type[_T], doc: object) -> _T:
    """An instance of the attrs wire type `kind` from its `to_dict()` shape (keys a newer
    server adds are ignored; a missing key with a default takes it)."""
    if not isinstance(doc, dict):
        raise StorageError(f"the server answered something that is not a {kind.__name__}")
    hints = _HINTS.get(kind)
    if hints is None:
        hints = _HINTS[kind] = typing.get_type_hints(kind)
    values: dict[str, Any] = {}
    try:
        for field in attrs.fields(kind):
            if field.name in doc:
                values[field.name] = _value(hints[field.name], doc[field.name])
        return kind(**values)
    except (TypeError, ValueError) as exc:
        raise StorageError(f"the server's {kind.__name__} could not be read: {exc}") from None


def _items(doc: Mapping[str, Any], key: str) -> list[Any]:
    found = doc.get(key)
    if not isinstance(found, list):
        raise StorageError(f"the server's answer has no list {key!r}")
    return found


def _no_delay(conn: http.client.HTTPConnection) -> None:
    # Small requests go out at once instead of waiting on the peer's delayed ACK.
    if conn.sock is not None:
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _HTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _no_delay(self)


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _no_delay(self)


class RemoteLedger:
    """The `Ledger` interface over `execkit serve` at `url` (see the module docstring).

    `token` is the bearer token (`execkit serve --add-token`); it is sent only in the
    `Authorization` header and never appears in a message or repr. `timeout_s` bounds each
    request; `retries` is how many times a call whose connection dropped is sent again
    (with the same idempotency key).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        on_behalf_of: str | None = None,
        retries: int = 2,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(
                f"a remote ledger is named by an http:// or https:// URL, got {url!r}",
                field="remote",
            )
        if parts.username or parts.password:
            raise InvalidInput(
                "the remote URL must not carry credentials: the token goes in "
                f"${TOKEN_ENV_VAR} (or the token argument)",
                field="remote",
            )
        if parts.query or parts.fragment:
            raise InvalidInput(f"the remote URL must not have a query: {url!r}", field="remote")
        if not isinstance(token, str) or not token.strip() or "\n" in token or "\r" in token:
            raise InvalidInput(
                f"a remote ledger needs its bearer token (${TOKEN_ENV_VAR})", field="token"
            )
        if not 0 < timeout_s <= 3600:
            raise InvalidInput("timeout_s must be in (0, 3600]", field="timeout_s")
        if not 0 <= retries <= len(_RETRY_PAUSES_S):
            raise InvalidInput(f"retries must be 0..{len(_RETRY_PAUSES_S)}", field="retries")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, self._prefix, "", ""))
        self.__token = token.strip()
        self.timeout_s = float(timeout_s)
        self.on_behalf_of = on_behalf_of
        self.retries = retries
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []
        self._ledger_id: str | None = None
        self._backoff: Backoff | None = None
        self._budget: WorkBudget | None = None

    def __repr__(self) -> str:
        return f"RemoteLedger({self._url!r})"

    def __enter__(self) -> RemoteLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport ----------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            kind = _HTTPSConnection if self._https else _HTTPConnection
            conn = kind(self._host, self._port, timeout=self.timeout_s)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _drop(self) -> None:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)

    def _headers(self, actor: Actor | str | None, key: str | None, body: bool) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.__token}", "Accept": "application/json"}
        behalf = actor.on_behalf_of if isinstance(actor, Actor) else None
        behalf = behalf or self.on_behalf_of
        if behalf:
            headers["X-On-Behalf-Of"] = urllib.parse.quote(behalf, safe="")
        if key is not None:
            headers["Idempotency-Key"] = key
        if body:
            headers["Content-Type"] = "application/json"
        return headers

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, Any] | None = None,
        actor: Actor | str | None = None,
    ) -> dict[str, Any]:
        """One logical call: sent, and sent again with the same key if the connection drops
        before the answer (at most `retries` times); the answer's JSON, or its error raised."""
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(
                {k: _query_text(v) for k, v in query.items() if v is not None}
            )
        data = None if body is None else json.dumps(body, allow_nan=False).encode("utf-8")
        key = str(uuid.uuid4()) if method == "POST" else None
        headers = self._headers(actor, key, data is not None)
        attempt = 0
        while True:
            try:
                conn = self._connection()
                conn.request(method, target, body=data, headers=headers)
                answer = conn.getresponse()
                status = answer.status
                raw = answer.read(_MAX_ANSWER_BYTES + 1)
                if answer.will_close:
                    self._drop()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if attempt >= self.retries:
                    raise StorageError(
                        f"cannot reach the execkit server at {self._url}: "
                        f"{type(exc).__name__}: {exc}"
                        + (
                            " (the request may have been applied; repeating it is safe)"
                            if key
                            else ""
                        )
                    ) from None
                time.sleep(_RETRY_PAUSES_S[attempt])
                attempt += 1
        return self._answer(status, raw)

    def _answer(self, status: int, raw: bytes) -> dict[str, Any]:
        if len(raw) > _MAX_ANSWER_BYTES:
            raise StorageError(f"the server at {self._url} answered more than 64 MiB")
        try:
            doc = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, ValueError):
            doc = None
        if 200 <= status < 300:
            if not isinstance(doc, dict):
                raise StorageError(f"the server at {self._url} did not answer JSON (HTTP {status})")
            return doc
        if doc is None:
            shown = raw[:200].decode("utf-8", "replace").strip()
            raise StorageError(f"the server at {self._url} answered HTTP {status}: {shown}")
        raise error_from_wire(status, doc)

    # -- capabilities ---------------------------------------------------------------------

    def _capabilities_doc(self) -> dict[str, Any]:
        doc = self._request("GET", "/v1/capabilities")
        ledger_id = doc.get("ledger_id")
        if isinstance(ledger_id, str):
            self._ledger_id = ledger_id
        try:
            if isinstance(doc.get("backoff"), dict):
                self._backoff = Backoff(**doc["backoff"])
            if isinstance(doc.get("budget"), dict):
                self._budget = WorkBudget(**doc["budget"])
        except (TypeError, InvalidInput):
            pass  # a server that describes them otherwise: keep what is known
        return doc

    def capabilities(self) -> frozenset[str]:
        """What the server advertises (read afresh on every call)."""
        found = self._capabilities_doc().get("capabilities")
        if not isinstance(found, list):
            raise StorageError(f"the server at {self._url} advertises no capabilities")
        return frozenset(str(name) for name in found)

    def _require(self, capability: str, what: str) -> None:
        if capability not in self.capabilities():
            raise StorageError(
                f"the server at {self._url} does not advertise {capability}: it may not "
                f"enforce {what} (ADR 0033), so nothing was sent; upgrade the server"
            )

    def schema_version(self) -> int:
        version = self._capabilities_doc().get("schema_version")
        if not isinstance(version, int):
            raise StorageError(f"the server at {self._url} gives no schema version")
        return version

    def ledger_id(self) -> str:
        if self._ledger_id is None:
            self._capabilities_doc()
        if self._ledger_id is None:
            raise StorageError(f"the server at {self._url} gives no ledger id")
        return self._ledger_id

    def location(self) -> str:
        """The server's URL (no credentials are ever in it)."""
        return self._url

    @property
    def backoff(self) -> Backoff:
        """The server's backoff (it decides every `next_attempt_at`)."""
        if self._backoff is None:
            self._capabilities_doc()
        return self._backoff if self._backoff is not None else Backoff()

    @backoff.setter
    def backoff(self, value: Backoff) -> None:
        if value != self.backoff:
            raise InvalidInput(
                f"the server at {self._url} decides the backoff ({_describe(self.backoff)}); "
                f"this asks for {_describe(value)}: configure the same one, or a local ledger",
                field="backoff",
            )

    @property
    def budget(self) -> WorkBudget:
        """The server's work budget."""
        if self._budget is None:
            self._capabilities_doc()
        return self._budget if self._budget is not None else WorkBudget()

    @budget.setter
    def budget(self, value: WorkBudget) -> None:
        if value != self.budget:
            raise InvalidInput(
                f"the server at {self._url} decides the work budget ({self.budget}); "
                f"this asks for {value}",
                field="budget",
            )

    # -- tasks ----------------------------------------------------------------------------

    def create_task(
        self,
        title: str,
        *,
        max_attempts: int = 0,
        max_uncharged_attempts: int | None = None,
        idempotency_key: str | None = None,
        actor: Actor | str,
        now: float | None = None,
    ) -> Task:
        if max_attempts:
            self._require(ATTEMPT_LIMITS, "an attempt limit")
        body: dict[str, Any] = {"title": title, "max_attempts": max_attempts}
        if max_uncharged_attempts is not None:
            body["max_uncharged_attempts"] = max_uncharged_attempts
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return _from_wire(Task, self._request("POST", "/v1/tasks", body, actor=actor))

    def get_task(
        self,
        task_id: str,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        force: bool = False,
    ) -> Task:
        query = {"cap": None if cap is None else cap.max_attempts, "force": force or None}
        return _from_wire(Task, self._request("GET", f"/v1/tasks/{_seg(task_id)}", query=query))

    def list_tasks(self, *, now: float | None = None) -> list[Task]:
        doc = self._request("GET", "/v1/tasks")
        return [_from_wire(Task, item) for item in _items(doc, "tasks")]

    def runs(self, task_id: str) -> list[Run]:
        doc = self._request("GET", f"/v1/tasks/{_seg(task_id)}/runs")
        return [_from_wire(Run, item) for item in _items(doc, "runs")]

    def run(self, run_id: str) -> Run:
        return _from_wire(Run, self._request("GET", f"/v1/runs/{_seg(run_id)}"))

    def history(self, task_id: str) -> list[Attempt]:
        return [attempt_from_run(run) for run in self.runs(task_id)]

    def set_attempt_limit(
        self,
        task_id: str,
        max_attempts: int,
        *,
        expected_max_attempts: int,
        actor: Actor | str,
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Task:
        self._require(ATTEMPT_LIMITS, "an attempt limit")
        body: dict[str, Any] = {
            "max_attempts": max_attempts,
            "expected_max_attempts": expected_max_attempts,
        }
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        doc = self._request("POST", f"/v1/tasks/{_seg(task_id)}/attempt-limit", body, actor=actor)
        return _from_wire(Task, doc)

    def retry_task(
        self,
        task_id: str,
        *,
        actor: Actor | str,
        reason: str | None = None,
        force: bool = False,
        now: float | None = None,
    ) -> Task:
        body = {"reason": reason, "force": force}
        return _from_wire(
            Task, self._request("POST", f"/v1/tasks/{_seg(task_id)}/retry", body, actor=actor)
        )

    def record_give_up(
        self, task_id: str, *, state: str, actor: Actor | str, now: float | None = None
    ) -> Task:
        body = {"state": state}
        doc = self._request("POST", f"/v1/tasks/{_seg(task_id)}/give-up", body, actor=actor)
        return _from_wire(Task, doc)

    def cancel_task(self, task_id: str, *, actor: Actor | str, now: float | None = None) -> Task:
        return _from_wire(
            Task, self._request("POST", f"/v1/tasks/{_seg(task_id)}/cancel", {}, actor=actor)
        )

    # -- runs -----------------------------------------------------------------------------

    def start_run(
        self,
        task_id: str,
        *,
        request_key: str,
        actor: Actor | str,
        forced: bool = False,
        ignore_backoff: bool = False,
        lease_s: float = DEFAULT_LEASE_S,
        now: float | None = None,
        cap: DispatchCap | None = None,
    ) -> Run:
        body: dict[str, Any] = {
            "request_key": request_key,
            "forced": forced,
            "ignore_backoff": ignore_backoff,
            "lease_s": lease_s,
            "cap": None if cap is None else cap.max_attempts,
        }
        return _from_wire(
            Run, self._request("POST", f"/v1/tasks/{_seg(task_id)}/runs", body, actor=actor)
        )

    def heartbeat(
        self, run_id: str, *, lease_s: float | None = None, now: float | None = None
    ) -> Run:
        body = {"lease_s": lease_s}
        return _from_wire(Run, self._request("POST", f"/v1/runs/{_seg(run_id)}/heartbeat", body))

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        not_before: float | None = None,
        now: float | None = None,
    ) -> Run:
        # Sent as given: the server's ledger checks them, with the same words as a local one.
        body = {
            "status": status.value if isinstance(status, enum.Enum) else status,
            "failure_class": (
                failure_class.value if isinstance(failure_class, enum.Enum) else failure_class
            ),
            "reason": reason,
            "not_before": not_before,
        }
        return _from_wire(Run, self._request("POST", f"/v1/runs/{_seg(run_id)}/finish", body))

    def abandon_expired_runs(self, *, now: float | None = None) -> list[Run]:
        doc = self._request("POST", "/v1/runs/abandon-expired", {})
        return [_from_wire(Run, item) for item in _items(doc, "runs")]

    # -- roles, audit, checks ---------------------------------------------------------------

    def grant_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> Grant:
        body = {"principal": principal, "role": role}
        return _from_wire(Grant, self._request("POST", "/v1/grants", body, actor=actor))

    def revoke_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> bool:
        body = {"principal": principal, "role": role}
        doc = self._request("POST", "/v1/grants/revoke", body, actor=actor)
        return bool(doc.get("revoked"))

    def grants(self, principal: str | None = None) -> list[Grant]:
        doc = self._request("GET", "/v1/grants", query={"principal": principal})
        return [_from_wire(Grant, item) for item in _items(doc, "grants")]

    def audit_events(self, task_id: str | None = None) -> list[AuditEvent]:
        doc = self._request("GET", "/v1/audit", query={"task_id": task_id})
        return [_from_wire(AuditEvent, item) for item in _items(doc, "events")]

    def validate(self, *, now: float | None = None) -> list[str]:
        return [str(line) for line in _items(self._request("GET", "/v1/check"), "problems")]

    def repair(self, *, now: float | None = None) -> list[str]:
        doc = self._request("POST", "/v1/check/repair", {})
        return [str(line) for line in _items(doc, "repaired")]

    def close(self) -> None:
        """Close every connection this ledger opened (in any thread); a later call opens
        a new one."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()


def _seg(value: object) -> str:
    """One path segment (an id), percent-encoded."""
    return urllib.parse.quote(str(value), safe="")


def _query_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _describe(backoff: Backoff) -> str:
    return (
        f"base {backoff.base_s:g} s, max {backoff.max_s:g} s, factor {backoff.factor:g}, "
        f"jitter {backoff.jitter:g}"
    )
