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

The methods are the route table's rows (`execkit._api`, the one description of the API the
server is built from too): each `Ledger` operation is one row naming its path, query and
body fields and how its answer reads, and every row goes through one call path here,
`_send`. So a new route is one row and the ledger's method; nothing here changes.

Transport: `transport` sends one request and returns the answer (status, headers, body),
or raises `OSError` when no answer came back (the seam, as in httpx's
`Client(transport=...)`). The default, `HTTPTransport`, keeps one keep-alive connection per
thread (the dispatcher renews leases from a second thread), so calls from several threads
never share a connection. Every POST carries a fresh `Idempotency-Key` per logical call;
when no answer arrives the call is sent again with the same key, at most `retries` times
after a pause (`sleep`), and the server's ledger answers the key as it answered it first
instead of acting twice (docs/remote.md, "Idempotency").
A server that cannot be reached (or answers something that is not the API) is
`StorageError`. An unknown token (401) is `Unauthenticated` (a `Forbidden`).

Capabilities (ADR 0033): before `create_task` with a limit, or `set_attempt_limit`, the
client reads `/v1/capabilities`; a server that does not advertise `tasks.attempt_limits`
may not enforce the limit, so the call is refused with `StorageError` (the family of "this
ledger cannot do that", exit 13), nothing sent. The rows say which calls need what.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from execkit._api import ATTEMPT_LIMITS, CAPABILITIES, Endpoint, LedgerRoutes, Needs
from execkit._backoff import Backoff
from execkit._budget import Attempt, DispatchCap, WorkBudget
from execkit._errors import (
    ExecKitError,
    InvalidInput,
    LaneStopped,
    LaneWaiting,
    NotFound,
    SpendCapReached,
    StorageError,
    TaskBackingOff,
    error_types,
)
from execkit._http1 import Connection
from execkit._lanes import LaneView
from execkit._proof import AgentFailed
from execkit.ledger import LIST_PAGE, Actor, Run, Task, TaskState, attempt_from_run

if TYPE_CHECKING:
    from execkit.ledger import Ledger

__all__ = [
    "ATTEMPT_LIMITS",
    "REMOTE_ENV_VAR",
    "TOKEN_ENV_VAR",
    "HTTPTransport",
    "HttpAnswer",
    "HttpRequest",
    "RemoteLedger",
    "Transport",
    "error_from_wire",
]

REMOTE_ENV_VAR = "EXECKIT_REMOTE"
TOKEN_ENV_VAR = "EXECKIT_TOKEN"

_RETRY_PAUSES_S = (0.05, 0.25, 1.0, 2.0)
_MAX_ANSWER_BYTES = 64 * 1024 * 1024
_R = TypeVar("_R")

_TYPES_BY_CODE: dict[str, type[ExecKitError]] = {}
for _kind in error_types():
    if _kind is not AgentFailed:
        _TYPES_BY_CODE.setdefault(_kind.code, _kind)


def error_from_wire(status: int, doc: object) -> ExecKitError:
    """The typed exception for an error answer `{"error": {"code", "message"}}`, with what
    the answer carries beside them (`ready_at`, `lane`, `opens_at`, `fix`, `field`)."""
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
    if issubclass(kind, LaneWaiting):
        opens = error.get("opens_at")
        opens_at = float(opens) if isinstance(opens, int | float) else None
        return kind(message, lane=str(error.get("lane", "")), opens_at=opens_at)
    if issubclass(kind, SpendCapReached):
        reopens = error.get("reopens_at")
        reopens_at = float(reopens) if isinstance(reopens, int | float) else None
        return kind(message, cap=str(error.get("cap", "")), reopens_at=reopens_at)
    if issubclass(kind, InvalidInput):
        field = error.get("field")
        return kind(message, field=field if isinstance(field, str) else None)
    if issubclass(kind, LaneStopped):
        fix = error.get("fix")
        return kind(
            message, lane=str(error.get("lane", "")), fix=fix if isinstance(fix, str) else None
        )
    try:
        return kind(message)
    except TypeError:  # pragma: no cover - every mapped type takes a message
        return ExecKitError(message)


# -- the transport seam -----------------------------------------------------------------


@attrs.frozen
class HttpRequest:
    """One request as a transport sends it: `target` is the path and query (the URL's path
    prefix included), `body` the JSON bytes or None."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes | None


@attrs.frozen
class HttpAnswer:
    """What came back: the status, the headers (as sent), the body's bytes (a transport
    may stop reading past 64 MiB and one byte: more is refused anyway)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Transport(Protocol):
    """Sends one request to the server and returns its answer, whatever the status; raises
    `OSError` (`ConnectionError`, `TimeoutError`, ...) when no answer came back, which the
    client may send again with the same idempotency key. May be called from several
    threads at once."""

    def send(self, request: HttpRequest) -> HttpAnswer: ...


class HTTPTransport:
    """The default transport: one keep-alive HTTP/1.1 connection per thread to the host
    and port of `url` (`execkit._http1`: a request is one write), each socket operation
    bounded by `timeout_s`. A connection that fails, or that the server will close, is
    dropped (the next request opens a new one); an answer that is not HTTP is raised as
    `ConnectionError`."""

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[Connection] = []

    def _connection(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = Connection(self._host, self._port, tls=self._tls, timeout_s=self.timeout_s)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def send(self, request: HttpRequest) -> HttpAnswer:
        conn = self._connection()
        try:
            answer, _closed = conn.request(
                request.method,
                request.target,
                dict(request.headers),
                request.body,
                _MAX_ANSWER_BYTES,
            )
        except ValueError as exc:  # nothing was sent: a header or target no request can hold
            raise InvalidInput(f"cannot send this request: {exc}", field="remote") from None
        return HttpAnswer(answer.status, answer.headers, answer.body)

    def close(self) -> None:
        """Close every connection this transport opened (in any thread); a later request
        opens a new one."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.close()


# -- the client -------------------------------------------------------------------------


class RemoteLedger(LedgerRoutes):
    """The `Ledger` interface over `execkit serve` at `url` (see the module docstring).

    `token` is the bearer token (`execkit serve --add-token`); it is sent only in the
    `Authorization` header and never appears in a message or repr. `timeout_s` bounds each
    request of the default transport; `retries` is how many times a call that got no
    answer is sent again (with the same idempotency key), `sleep` what waits between the
    tries. `transport` replaces the default `HTTPTransport` (the caller then closes it).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        on_behalf_of: str | None = None,
        retries: int = 2,
        transport: Transport | None = None,
        sleep: Callable[[float], None] = time.sleep,
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
        self._prefix = parts.path.rstrip("/")
        self._url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, self._prefix, "", ""))
        self.__token = token.strip()
        self.timeout_s = float(timeout_s)
        self.on_behalf_of = on_behalf_of
        self.retries = retries
        self._own_transport = HTTPTransport(self._url, timeout_s=self.timeout_s)
        self._transport: Transport = transport or self._own_transport
        self._sleep = sleep
        self._ledger_id: str | None = None
        self._backoff: Backoff | None = None
        self._budget: WorkBudget | None = None

    def __repr__(self) -> str:
        return f"RemoteLedger({self._url!r})"

    def __enter__(self) -> RemoteLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def iter_tasks(
        self,
        *,
        now: float | None = None,
        state: TaskState | str | None = None,
        after: str | None = None,
    ) -> Iterator[Task]:
        """`Ledger.iter_tasks` over the API: `list_tasks` a page of `LIST_PAGE` at a time,
        so a listing of any length holds one page (`now` is the server's, as everywhere)."""
        while True:
            page = self.list_tasks(state=state, limit=LIST_PAGE, after=after)
            yield from page
            if len(page) < LIST_PAGE:
                return
            after = page[-1].id

    def iter_tasks_with_last(
        self,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        title_prefix: str | None = None,
    ) -> Iterator[tuple[Task, Attempt | None]]:
        """`Ledger.iter_tasks_with_last` over the API: `list_tasks_with_last` a page of
        `LIST_PAGE` at a time, one request a page (each page projected at the server's
        `now`). A server older than that route answers its first page 404 (no ledger
        answers NotFound for a first page: only `after` can name no task); its tasks are
        then read as they were before it, each again with `cap` and its history."""
        after = None
        while True:
            try:
                page = self.list_tasks_with_last(
                    cap=cap, title_prefix=title_prefix, limit=LIST_PAGE, after=after
                )
            except NotFound:
                if after is not None:
                    raise
                yield from self._with_last_task_by_task(cap, title_prefix)
                return
            yield from page
            if len(page) < LIST_PAGE:
                return
            after = page[-1][0].id

    def task_lanes(
        self, task_ids: Sequence[str], *, now: float | None = None
    ) -> dict[str, LaneView]:
        """`Ledger.task_lanes` over the API: the API reads one task's lane a request
        (`task_lane`), so this is a request a task; a task that is not there is left out,
        as locally (`now` is the server's, as everywhere)."""
        found: dict[str, LaneView] = {}
        for task_id in task_ids:
            try:
                lane = self.task_lane(task_id)
            except NotFound:
                continue
            if lane is not None:
                found[task_id] = lane
        return found

    def announced_runs(self, task_ids: Sequence[str]) -> dict[str, list[Run]]:
        """`Ledger.announced_runs` over the API: the API reads one task's runs a request,
        so this is a request a task (each id checked by the server, as `runs` is)."""
        found: dict[str, list[Run]] = {}
        for task_id in task_ids:
            try:
                runs = self.runs(task_id)
            except NotFound:
                continue
            if runs and (runs[-1].resumed_session is not None or runs[-1].fell_back is not None):
                found[task_id] = runs
        return found

    def _with_last_task_by_task(
        self, cap: DispatchCap | None, title_prefix: str | None
    ) -> Iterator[tuple[Task, Attempt | None]]:
        """The listing from a server without `/v1/tasks-with-last`: three requests a task."""
        for listed in self.iter_tasks():
            if title_prefix is None or listed.title.startswith(title_prefix):
                task = self.get_task(listed.id, cap=cap)
                history = self.history(listed.id)
                yield task, history[-1] if history else None

    # -- the one call path --------------------------------------------------------------

    def _send(self, endpoint: Endpoint[Any, _R], arguments: Mapping[str, Any]) -> _R:
        """One logical call of a row: its capability checked, its request built from the
        arguments, sent (and sent again with the same key when no answer came back, at most
        `retries` times), and its answer read, or its error raised as the typed exception."""
        for needs in endpoint.needs_check(arguments):
            self._require(needs)
        body = endpoint.payload(arguments)
        key = str(uuid.uuid4()) if endpoint.method == "POST" else None
        request = HttpRequest(
            endpoint.method,
            self._prefix + endpoint.target(arguments),
            self._headers(arguments.get("actor"), key, body is not None),
            body,
        )
        attempt = 0
        while True:
            try:
                answer = self._transport.send(request)
                break
            except OSError as exc:
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
                self._sleep(_RETRY_PAUSES_S[attempt])
                attempt += 1
        read = endpoint.read
        assert read is not None, f"{endpoint.operation_id} has no reader"
        return read(self._answer(answer.status, answer.body))

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
        doc = self._send(CAPABILITIES, {})
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

    def _require(self, needs: Needs) -> None:
        if needs.capability not in self.capabilities():
            raise StorageError(
                f"the server at {self._url} does not advertise {needs.capability}: it may not "
                f"enforce {needs.what} (ADR 0033), so nothing was sent; upgrade the server"
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

    # -- what no route answers by itself ---------------------------------------------------

    def history(self, task_id: str) -> list[Attempt]:
        return [attempt_from_run(run) for run in self.runs(task_id)]

    def close(self) -> None:
        """Close every connection the default transport opened (in any thread); a later
        call opens a new one. A transport given to the constructor is the caller's."""
        self._own_transport.close()


def _describe(backoff: Backoff) -> str:
    return (
        f"base {backoff.base_s:g} s, max {backoff.max_s:g} s, factor {backoff.factor:g}, "
        f"jitter {backoff.jitter:g}"
    )


if TYPE_CHECKING:

    def _is_a_ledger(remote: RemoteLedger) -> Ledger:
        return remote  # mypy checks here that the rows and the methods above make a Ledger
