"""The ASGI application of `execkit serve` (Starlette): the route table (`execkit._api`, the
one description of the API, shared with the client) bound to one ledger, with
authentication, role gates, input checks, idempotency and bounds.

One request, in order: the bearer token is looked up (401 `unauthenticated`), the route's
token role checked (403 `forbidden`), the body read within `max_body_bytes` (413) and every
query parameter and body member checked against the route's fields (400 `invalid`); then,
in a worker thread, the ledger is called with the request's `Idempotency-Key`.

The server stores no answers of its own (docs/remote.md, "Idempotency"): the key goes to
the ledger, which keeps it in the transaction of the operation it keys (a task's creation,
a limit, a retry, a run's admission) and replays it there, 409 `conflict` for a different
request; every other write is idempotent in the ledger itself. So a retry is answered the
same whether it reaches this server, another one or this one restarted, including after a
crash between the ledger's commit and the answer. The whole request is bounded by
`request_timeout_s`: past it the answer is 503 `storage` saying the outcome is unknown (the
worker finishes its transaction, so the same key replays it). Errors keep one shape,
`{"error": {"code", "message"}}`. Every answer body is serialized by `_dumps`, which
masks every string in the document first (`execkit._mask.mask_json`), and every
`Response` is built by `_response`; a refusal names the offending field and its type,
never the value sent. Nothing is logged of a request's headers: a token never reaches a
log.

The ledger is shared by the worker threads (a SQLite ledger serialises its transactions on
a lock of its own; a PostgreSQL one runs them on a bounded pool of connections); the pool of
`workers` threads bounds how many requests reach it at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from execkit._api import ENDPOINTS, ERROR_STATUSES, Call, Endpoint, Field, openapi_document
from execkit._errors import (
    ExecKitError,
)
from execkit._mask import mask_json
from execkit.dispatch import Board
from execkit.ledger import Actor, Ledger
from execkit.server._front import Front
from execkit.server._tokens import Principal, TokenFile
from execkit.server._workers import WorkerThreads

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_WORKERS",
    "Answer",
    "Head",
    "LedgerApp",
    "Refused",
    "error_answer",
    "headers_of",
    "raw_head",
    "refusal",
]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_WORKERS = 32

_log = logging.getLogger("execkit.server")
_KEY = re.compile(r"[\x21-\x7e]{1,200}")
_INT = re.compile(r"[+-]?[0-9]{1,19}")
_INT64 = (-(2**63), 2**63 - 1)
_MAX_NAME = 200
_JSON = "application/json"
_ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)


class Refused(Exception):
    """An answer that is an error, before the ledger is called."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _dumps(doc: Mapping[str, Any]) -> str:
    """The one serializer of an answer: every string in `doc` masked, then JSON."""
    return json.dumps(mask_json(doc), sort_keys=True)


def _error_doc(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def error_answer(exc: ExecKitError) -> tuple[int, dict[str, Any]]:
    """An ExecKitError as (HTTP status, JSON document)."""
    status = ERROR_STATUSES.get(exc.code)
    if status is None or exc.code == "error":
        return 500, _error_doc("error", exc.message)
    return status, _error_doc(exc.code, exc.message, **exc.details())


def _response(status: int, text: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(text, status_code=status, media_type=_JSON, headers=dict(headers or {}))


async def server_error(_request: Request, _exc: Exception) -> Response:
    """Starlette's answer to an exception no route caught (its `ServerErrorMiddleware` logs
    it and re-raises it to the server, which closes the connection): a JSON 500 in the
    API's error shape, never Starlette's text page or a traceback."""
    return _response(500, _dumps(_error_doc("error", "internal server error")))


# An answer before it is sent: status, JSON text, extra headers (or None).
Answer = tuple[int, str, Mapping[str, str] | None]


def refusal(exc: Refused) -> Answer:
    """The answer to a refused request (401s say which scheme to use)."""
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return exc.status, _dumps(_error_doc(exc.code, exc.message)), headers


def raw_head(body: bytes, headers: Mapping[str, str] | None) -> list[tuple[bytes, bytes]]:
    """An answer's headers as sent (those a Starlette `Response` of `body` would send):
    its length, its type, then `headers`."""
    head = [
        (b"content-length", str(len(body)).encode("ascii")),
        (b"content-type", _JSON.encode("ascii")),
    ]
    for name, value in (headers or {}).items():
        head.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    return head


def headers_of(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """A request's headers by lower-case name, the first of a repeated one (as Starlette's
    `Headers.get` reads them), latin-1 decoded."""
    found: dict[str, str] = {}
    for name, value in raw:
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


class Head:
    """A request past the checks made before its body (`LedgerApp.head`): its route, who
    sent it, its path parameters and query, checked."""

    __slots__ = ("endpoint", "path", "principal", "query")

    def __init__(
        self,
        endpoint: Endpoint[..., Any],
        principal: Principal,
        path: dict[str, str],
        query: dict[str, Any],
    ) -> None:
        self.endpoint = endpoint
        self.principal = principal
        self.path = path
        self.query = query


# An object member (a `RunOwner`) is a few scalars: anything bigger is not one.
_MAX_OBJECT_MEMBERS = 16


def _invalid(message: str) -> Refused:
    return Refused(400, "invalid", message)


def _checked_text(where: str, value: str) -> str:
    if "\x00" in value:
        raise _invalid(f"{where} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"{where} is not valid Unicode text") from None
    return value


def _kind(value: Any) -> str:
    """How a refusal names a wrong-typed value: its JSON type, never the value (a string
    sent where a number belongs may be a credential pasted into the wrong field)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def _checked_value(where: str, field: Field, value: Any) -> Any:
    if value is None:
        if field.nullable:
            return None
        raise _invalid(f"{where} must not be null")
    kind = field.type
    if kind == "string":
        if not isinstance(value, str):
            raise _invalid(f"{where} must be a string, got {type(value).__name__}")
        return _checked_text(where, value)
    if kind == "boolean":
        if not isinstance(value, bool):
            raise _invalid(f"{where} must be true or false, got {_kind(value)}")
        return value
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(f"{where} must be a whole number, got {_kind(value)}")
        if not _INT64[0] <= value <= _INT64[1]:
            raise _invalid(f"{where} is out of range")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _invalid(f"{where} must be a number, got {_kind(value)}")
        if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
            raise _invalid(f"{where} is out of range")
        if not math.isfinite(value):
            raise _invalid(f"{where} must be a finite number")
        return value
    if kind == "object":
        if not isinstance(value, dict) or len(value) > _MAX_OBJECT_MEMBERS:
            raise _invalid(
                f"{where} must be a JSON object of at most {_MAX_OBJECT_MEMBERS} members"
            )
        for member, item in value.items():
            if isinstance(item, dict | list):
                raise _invalid(f"{where}.{member} must be a string, number or boolean")
            if isinstance(item, str):
                _checked_text(f"{where}.{member}", item)
        return value
    raise AssertionError(kind)  # pragma: no cover


def _query_value(field: Field, raw: str) -> Any:
    where = f"query parameter {field.name}"
    if field.type == "boolean":
        if raw not in ("true", "false"):
            raise _invalid(f"{where} must be true or false")
        return raw == "true"
    if field.type == "integer":
        if not _INT.fullmatch(raw):
            raise _invalid(f"{where} must be a whole number")
        return _checked_value(where, field, int(raw))
    return _checked_text(where, raw)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # `{"cap": 1, "cap": -1}`: Python keeps the last, another parser the first, so two
    # readers of one body could disagree about what was asked. Refuse it.
    doc: dict[str, Any] = {}
    for name, value in pairs:
        if name in doc:
            raise ValueError(f"the member {name!r} is given twice")
        doc[name] = value
    return doc


# The least value a field takes over HTTP, where the ledger allows less. A negative dispatch
# cap is ADR 015's "retry forever": it lifts the charged work budget, an operator's choice
# for a dispatcher's own configuration, not a request parameter any token may send.
_MINIMUM = {"cap": 0}


def _check_minimum(where: str, name: str, value: Any) -> None:
    least = _MINIMUM.get(name)
    if least is not None and isinstance(value, int) and value < least:
        raise _invalid(
            f"{where} must be at least {least} over HTTP (a negative cap lifts the "
            "charged budget: set it in a dispatcher's own configuration)"
        )


def _body(raw: bytes, headers: Mapping[str, str], endpoint: Endpoint[..., Any]) -> dict[str, Any]:
    if not raw.strip():
        doc: Any = {}
    else:
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != _JSON:
            raise Refused(415, "invalid", f"a request body must be sent as Content-Type: {_JSON}")
        try:
            doc = json.loads(
                raw.decode("utf-8"),
                parse_constant=_reject_constant,
                object_pairs_hook=_unique_members,
            )
        except (ValueError, RecursionError) as exc:
            raise _invalid(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _invalid("the request body must be a JSON object")
    fields = {field.name: field for field in endpoint.body or ()}
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise _invalid(f"unknown field(s) in the request body: {', '.join(unknown)}")
    checked: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in doc:
            if field.required:
                raise _invalid(f"the request body needs {name!r}")
            continue
        checked[name] = _checked_value(name, field, doc[name])
        _check_minimum(name, name, checked[name])
    return checked


def _on_behalf_of(headers: Mapping[str, str]) -> str | None:
    raw = headers.get("x-on-behalf-of")
    if raw is None:
        return None
    try:
        name = urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise _invalid("X-On-Behalf-Of must be UTF-8, percent-encoded") from None
    if not name.strip() or len(name) > _MAX_NAME:
        raise _invalid(f"X-On-Behalf-Of must be a name of 1..{_MAX_NAME} characters")
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in name):
        raise _invalid("X-On-Behalf-Of must not hold control characters")
    return _checked_text("X-On-Behalf-Of", name)


def _idempotency_key(headers: Mapping[str, str]) -> str | None:
    raw = headers.get("idempotency-key")
    if raw is None:
        return None
    if not _KEY.fullmatch(raw):
        raise _invalid("Idempotency-Key must be 1..200 visible ASCII characters")
    # Handed to the ledger as sent: every ledger operation that keeps a key masks it as it
    # enters (`mask_name`: unique and stable, so a replay still finds its first answer),
    # and nothing else here writes it anywhere. Masking it here too redacted each
    # request's fresh key twice, and a finish's key, which no operation keeps, once for
    # nothing.
    return raw


def _route(endpoint: Endpoint[..., Any], handle: Callable[[Request], Awaitable[Response]]) -> Route:
    # Starlette answers HEAD for every GET route (the GET's answer, without its body), as
    # every other route of the server does; docs/remote.md says so once for them all.
    return Route(endpoint.path, handle, methods=[endpoint.method])


Handle = Callable[[Request], Awaitable[Response]]
_Found = tuple[Handle, Route, dict[str, str]]


class RouteTable:
    """The API's routes by the request's method and path, as Starlette's router picks
    them (the first route of the table whose path and method match), without trying each
    route's pattern in turn: a path without parameters is one dict lookup, one with
    parameters is compared segment by segment with the routes of as many segments (a
    parameter is one non-empty segment, as Starlette's `{name}`).

    `find` answers None for what no route matches with its method (a 404 or 405, which
    the Starlette application answers); the caller hands such a request to it. A `HEAD`
    finds the `GET` route of its path (whose answer it gets without the body)."""

    def __init__(self, routes: Sequence[tuple[Route, Handle]]) -> None:
        self._static: dict[tuple[str, str], tuple[Handle, Route]] = {}
        # Per segment count: each segment a literal, or (for a parameter) its name and True.
        self._shaped: dict[int, list[tuple[tuple[tuple[str, bool], ...], str, Handle, Route]]]
        self._shaped = {}
        for route, handle in routes:
            (method,) = (route.methods or {"GET"}) - {"HEAD"}
            shape = tuple(
                (part[1:-1], True) if part.startswith("{") else (part, False)
                for part in route.path.split("/")
            )
            if not any(is_param for _, is_param in shape):
                self._static.setdefault((method, route.path), (handle, route))
            else:
                self._shaped.setdefault(len(shape), []).append((shape, method, handle, route))
        # A static path that a route with parameters listed before it also matches would
        # be that route's in Starlette's order: the table has none (checked, not assumed).
        for method, path in self._static:
            if self._match_shaped(method, path) is not None:
                raise ValueError(f"{method} {path} is shadowed by a route with parameters")

    def _match_shaped(self, method: str, path: str) -> _Found | None:
        segments = path.split("/")
        for shape, wanted, handle, route in self._shaped.get(len(segments), ()):
            if wanted != method:
                continue
            params: dict[str, str] = {}
            for (text, is_param), part in zip(shape, segments, strict=True):
                if is_param:
                    if not part:
                        break
                    params[text] = part
                elif text != part:
                    break
            else:
                return handle, route, params
        return None

    def find(self, method: str, path: str) -> _Found | None:
        """The handler, route and path parameters of `method` `path`, or None."""
        if method == "HEAD":
            method = "GET"
        static = self._static.get((method, path))
        if static is not None:
            return static[0], static[1], {}
        return self._match_shaped(method, path)


class LedgerApp:
    """The application over one ledger; `app` is the ASGI callable (see the module
    docstring), `api` the same with its route table in front (what `front` serves).
    `capabilities` is what `/v1/capabilities` advertises: the ledger's less `without`
    (`--without-capability`, a stand-in for an older server). `board` is the board the
    dashboard takes its columns and titles from (`execkit serve --board`);
    `webhook_secrets` (a secret by tracker: `github`, `linear`, `gitlab`) adds each tracker's
    `POST /hooks/<tracker>` (`_hooks`; InvalidInput naming `webhook_secrets` for a tracker
    without a webhook); `github_webhook_secret` is `webhook_secrets={"github": ...}`."""

    def __init__(
        self,
        ledger: Ledger,
        tokens: TokenFile,
        *,
        without: frozenset[str] = frozenset(),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        workers: int = DEFAULT_WORKERS,
        version: str = "0",
        board: Board | None = None,
        github_webhook_secret: bytes | None = None,
        webhook_secrets: Mapping[str, bytes] | None = None,
    ) -> None:
        secrets = dict(webhook_secrets or {})
        if github_webhook_secret is not None:
            secrets["github"] = github_webhook_secret
        self.ledger = ledger
        self.tokens = tokens
        self.capabilities = frozenset(ledger.capabilities()) - without
        self.ledger_id = ledger.ledger_id()
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.openapi = openapi_document(version)
        self._openapi_text = _dumps(self.openapi)
        self._workers = WorkerThreads(workers)
        handles = [self._endpoint(endpoint) for endpoint in ENDPOINTS]
        routes = [
            _route(endpoint, handle) for endpoint, handle in zip(ENDPOINTS, handles, strict=True)
        ]
        self.routes = RouteTable(list(zip(routes, handles, strict=True)))
        self.endpoints = {(endpoint.path, endpoint.method): endpoint for endpoint in ENDPOINTS}
        self.app = Starlette(
            routes=list(routes),
            exception_handlers={
                HTTPException: self._http_exception,
                Exception: server_error,
            },
        )
        # A path the API does not have is 404, with or without a trailing slash: a 307 to
        # the other spelling would invite a client to resend its token and body.
        self.app.router.redirect_slashes = False
        # What the listener serves: the dashboard and monitoring in front of the API (_front).
        # `board`: the board the dashboard shows its columns and titles from (_dashboard).
        self.front = Front(
            self.api,
            ledger,
            tokens,
            self._http_exception,
            server_error,
            board=board,
            webhook_secrets=secrets,
        )

    def close(self) -> None:
        """Stop the worker threads (after the ones running finish)."""
        self._workers.close()

    async def api(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The API as an ASGI application: `app`, with a request its route table finds
        handed straight to the route's handler (Starlette's router tries each route's
        pattern in turn, and wraps each request in two middlewares whose work the handler
        does: it answers every exception itself). A request the table does not find (a
        404 or a 405) goes to `app`, which answers it."""
        found = None
        if scope["type"] == "http" and not scope.get("root_path"):
            found = self.routes.find(scope["method"], scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        _handle, route, params = found
        scope["app"] = self.app
        scope["route"] = route  # as Starlette's router sets it: the access log's template
        scope["path_params"] = params
        method = scope["method"]
        endpoint = self.endpoints[route.path, "GET" if method == "HEAD" else method]
        status, text, headers = await self._answer(endpoint, scope, receive, params)
        body = text.encode("utf-8")
        await send(
            {"type": "http.response.start", "status": status, "headers": raw_head(body, headers)}
        )
        # A HEAD's body is dropped by the server (uvicorn's cycle, as for Starlette's routes).
        await send({"type": "http.response.body", "body": body})

    # -- plumbing ---------------------------------------------------------------------

    async def _http_exception(self, _request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            doc = _error_doc("not_found", "no such endpoint (see GET /openapi.json)")
        elif exc.status_code == 405:
            doc = _error_doc("invalid", "method not allowed on this endpoint")
        else:
            doc = _error_doc("invalid", str(exc.detail))
        return _response(exc.status_code, _dumps(doc), exc.headers)

    def _endpoint(self, endpoint: Endpoint[..., Any]) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            status, text, headers = await self._answer(
                endpoint, request.scope, request.receive, request.path_params
            )
            return _response(status, text, headers)

        handle.__name__ = endpoint.operation_id
        return handle

    async def _answer(
        self,
        endpoint: Endpoint[..., Any],
        scope: Scope,
        receive: Receive,
        params: Mapping[str, str],
    ) -> Answer:
        """One request of `endpoint` over ASGI, answered whatever happens: its checks, its
        body read from `receive`, its ledger call in a worker thread, all within
        `request_timeout_s`."""
        try:
            # A deadline on this task, not `wait_for` (which wraps the request in a
            # task of its own: about 5% of a GET's time on the event loop).
            async with asyncio.timeout(self.request_timeout_s):
                headers = headers_of(scope["headers"])
                head = self.head(
                    endpoint,
                    headers,
                    params,
                    scope.get("query_string", b""),
                    scope.get("raw_path", b""),
                )
                if head is None:
                    return 200, self._openapi_text, None
                raw = b""
                if endpoint.body is not None:
                    raw = await self._read_body(headers, receive)
                call = self.call_of(head, headers, raw)
                status, text = await self._workers.run(self.call_ledger, endpoint, call)
                return status, text, None
        except TimeoutError:
            return self.timed_out()
        except Refused as exc:
            return refusal(exc)
        except Exception:  # the last line of defence: a JSON 500, never a traceback
            return self.internal_error(endpoint)

    def timed_out(self) -> Answer:
        """The answer to a request not answered within `request_timeout_s`."""
        message = (
            f"the request did not finish within {self.request_timeout_s:g} s; its "
            "outcome is unknown: repeat it with the same Idempotency-Key"
        )
        return 503, _dumps(_error_doc("storage", message)), None

    def internal_error(
        self, endpoint: Endpoint[..., Any], error: BaseException | None = None
    ) -> Answer:
        """The answer to an exception no check expected: `error`, else the one being
        handled (logged here, with its traceback: no request header is in it)."""
        _log.error(
            "internal error serving %s %s",
            endpoint.method,
            endpoint.path,
            exc_info=error if error is not None else True,
        )
        return 500, _dumps(_error_doc("error", "internal server error")), None

    def head(
        self,
        endpoint: Endpoint[..., Any],
        headers: Mapping[str, str],
        params: Mapping[str, str],
        query_string: bytes,
        raw_path: bytes,
    ) -> Head | None:
        """The checks a request passes before its body is read, in order: the path, the
        token (401), the token role the route always needs (403), the path parameters and
        the query (400). None for the route that needs no token (the OpenAPI document,
        answered `openapi_text`). Raises `Refused`."""
        if not endpoint.authenticated:
            return None
        if _ENCODED_SLASH.search(raw_path):
            # The server decodes `%2F` before routing, so `/v1/tasks/a%2Fruns` would reach
            # another endpoint than the one the client named. No id holds a `/`: 404.
            raise Refused(404, "not_found", "no such endpoint: a path segment holds %2F")
        principal = self._authenticate(headers)
        self._check_roles(principal, endpoint.roles_needed({}), endpoint)
        path = {name: _checked_text(name, str(value)) for name, value in params.items()}
        query = self._query(query_string, endpoint)
        return Head(endpoint, principal, path, query)

    @property
    def openapi_text(self) -> str:
        """The OpenAPI document's answer body."""
        return self._openapi_text

    def check_declared_length(self, headers: Mapping[str, str]) -> None:
        """Refuses a body whose `Content-Length` is not a number (400) or over the limit
        (413) before any of it is read."""
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise _invalid("Content-Length must be a number of bytes")
            if int(declared) > self.max_body_bytes:
                raise self.too_large()

    def too_large(self) -> Refused:
        """The refusal of a body over `max_body_bytes` (413)."""
        return Refused(413, "invalid", f"the request body is over {self.max_body_bytes} bytes")

    async def _read_body(self, headers: Mapping[str, str], receive: Receive) -> bytes:
        self.check_declared_length(headers)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                raise _invalid("the client disconnected before its request body was whole")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self.too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def call_of(self, head: Head, headers: Mapping[str, str], raw: bytes) -> Call:
        """The ledger call of a request that passed `head`, with its whole body `raw` (its
        size already bounded): the body checked (415, 400), the token roles it needs
        (403), `X-On-Behalf-Of` and `Idempotency-Key` (400). Raises `Refused`."""
        endpoint = head.endpoint
        body = _body(raw, headers, endpoint) if endpoint.body is not None else {}
        self._check_roles(head.principal, endpoint.roles_needed(body), endpoint)
        on_behalf_of = _on_behalf_of(headers)
        key = _idempotency_key(headers) if endpoint.method == "POST" else None
        return Call(
            ledger=self.ledger,
            actor=Actor(head.principal.actor, on_behalf_of=on_behalf_of),
            path=head.path,
            query=head.query,
            body=body,
            idempotency_key=key,
            capabilities=self.capabilities,
            ledger_id=self.ledger_id,
        )

    @property
    def workers(self) -> WorkerThreads:
        """The worker threads the ledger calls run on."""
        return self._workers

    def _authenticate(self, headers: Mapping[str, str]) -> Principal:
        header = headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "unauthenticated", "send Authorization: Bearer TOKEN")
        try:
            principal = self.tokens.lookup(token.strip())
        except ExecKitError as exc:
            raise Refused(
                503, "storage", f"the server cannot check tokens: {exc.message}"
            ) from None
        if principal is None:
            raise Refused(401, "unauthenticated", "unknown token")
        return principal

    def _query(self, query_string: bytes, endpoint: Endpoint[..., Any]) -> dict[str, Any]:
        if not query_string:
            return {}  # most requests: no query to parse
        fields = {field.name: field for field in endpoint.query}
        found: dict[str, Any] = {}
        # As Starlette's `QueryParams` reads it: latin-1, blank values kept.
        pairs = urllib.parse.parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
        for name, raw in pairs:
            field = fields.get(name)
            if field is None:
                raise _invalid(f"unknown query parameter {name!r}")
            if name in found:
                raise _invalid(f"query parameter {name!r} given twice")
            found[name] = _query_value(field, raw)
            _check_minimum(f"query parameter {name}", name, found[name])
        return found

    def _check_roles(
        self, principal: Principal, needed: frozenset[str], endpoint: Endpoint[..., Any]
    ) -> None:
        missing = sorted(needed - principal.roles)
        if missing:
            raise Refused(
                403,
                "forbidden",
                f"{endpoint.method} {endpoint.path} needs the token role(s) "
                f"{', '.join(missing)}; this token ({principal.actor}) has "
                f"{', '.join(sorted(principal.roles)) or 'none'}",
            )

    def call_ledger(self, endpoint: Endpoint[..., Any], call: Call) -> tuple[int, str]:
        """The ledger call (in a worker thread): its answer's status and masked JSON; a
        refusal of the ledger is its error answer, any other exception raised."""
        try:
            status, doc = endpoint.handler(call)
        except ExecKitError as exc:
            status, doc = error_answer(exc)
        return status, _dumps(doc)
