"""The access log of `execkit serve`: one JSON line per request on the logger
`execkit.server.access`, and the same facts handed to the metrics (`_metrics`).

A line holds the method, the route's template (`/v1/tasks/{task_id}/runs`, or
`(unmatched)`), the status, the error code of an error answer, the bytes sent and the
seconds taken. Never a header, a query string, a cookie or the raw path: a token sent in
any of them, or typed into a URL by mistake, cannot reach the log.

The error code is read from the first 4 KiB of an error answer's JSON body (the API's
`{"error": {"code": ...}}`); a body that is not that shape gives no code.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import attrs

__all__ = ["ACCESS_LOGGER", "AccessLog", "Request"]

ACCESS_LOGGER = "execkit.server.access"
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_MAX_ERROR_BODY = 4096

_log = logging.getLogger(ACCESS_LOGGER)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]


@attrs.frozen
class Request:
    """What one request did, as logged and measured (no header, query or raw path)."""

    method: str
    route: str
    status: int
    code: str | None
    bytes_sent: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "route": self.route,
            "status": self.status,
            "code": self.code,
            "bytes": self.bytes_sent,
            "ms": round(self.seconds * 1000, 3),
        }


class _Line:
    """A request's log line, serialized when a handler formats the record (once, whatever
    the number of handlers; never, when every handler drops the record)."""

    __slots__ = ("_request", "_text")

    def __init__(self, request: Request) -> None:
        self._request = request
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = json.dumps(self._request.to_dict(), sort_keys=True)
        return self._text


def _write(request: Request) -> None:
    # As `Logger.info` does it, less looking up the caller's frame (`findCaller`): the
    # line names no source file, so the walk up the stack was the record's dearest part.
    record = _log.makeRecord(_log.name, logging.INFO, "", 0, "%s", (_Line(request),), None)
    _log.handle(record)


def _code(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


class AccessLog:
    """ASGI middleware around the whole application (see the module docstring).
    `observers` are called with each `Request` after its answer was sent; `clock` is a
    monotonic clock (injected for tests)."""

    def __init__(
        self,
        app: ASGIApp,
        observers: tuple[Callable[[Request], None], ...] = (),
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.app = app
        self.observers = observers
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = self.clock()
        status = 500
        sent = 0
        error_body = bytearray()

        async def sending(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                sent += len(chunk)
                if status >= 400 and len(error_body) < _MAX_ERROR_BODY:
                    error_body.extend(chunk[: _MAX_ERROR_BODY - len(error_body)])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) if route is not None else None
            method = str(scope.get("method", ""))
            self.record(
                method,
                template if isinstance(template, str) and template else "(unmatched)",
                status,
                bytes(error_body),
                sent,
                started,
            )

    def record(
        self, method: str, route: str, status: int, error_body: bytes, sent: int, started: float
    ) -> None:
        """One answered request: logged and handed to the observers. `error_body` is the
        start of an error answer's body (else empty), `sent` the body's bytes, `started`
        when the request began by `clock` (what serves the API without this middleware,
        `_serve`'s own cycle, records its requests here)."""
        done = Request(
            method=method if method in _METHODS else "OTHER",
            route=route,
            status=status,
            code=_code(error_body[:_MAX_ERROR_BODY]) if error_body else None,
            bytes_sent=sent,
            seconds=max(0.0, self.clock() - started),
        )
        if _log.isEnabledFor(logging.INFO):  # the line is built only when it is written
            _write(done)
        for observe in self.observers:
            observe(done)
