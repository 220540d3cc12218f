"""An API request served straight from the HTTP parser's callbacks (`_serve`'s httptools
protocol): no ASGI cycle, task, Starlette request or response, access-log middleware or
future between the parser and the ledger call.

For each request uvicorn runs the ASGI application in a task of its own, with an event the
body is awaited on, a message dict for each part of the body and of the answer, and the
application wraps it in Starlette's request and response objects and the access log's
`send`; the answer then came back from the worker thread as a future the task awaited.
None of that does anything an API request needs, and it was most of the event loop's work
per request. Here:

    head parsed      `LedgerApp.head` (path, token, role, query) and the declared length;
                     the request's deadline (`request_timeout_s`) armed as a loop timer
    body chunks      collected, bounded by `max_body_bytes` (413 as soon as it is over)
    message complete `LedgerApp.call_of` (body, roles, headers), then the ledger call goes
                     to a worker thread (`WorkerThreads.submit`) with `_done` as its callback
    `_done`          on the loop: the answer's head and body in one write, the access line
                     and the metrics (`AccessLog.record`), the connection's next request

A refusal is answered as soon as it is known, as the ASGI path answers it. Past the
deadline the answer is the same 503 as through ASGI and the ledger call's answer, when it
comes, is dropped (the worker finishes its transaction: the same key replays it). A client
gone before its answer gets none; the connection's keep-alive, pipelining and shutdown
stay the protocol's (`_protocol`; this object has what it reads of a cycle). A `HEAD` of a
`GET` route is that route's answer without its body (`head_only`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from execkit._api import Endpoint
from execkit.server._access_log import AccessLog
from execkit.server._app import Answer, Head, LedgerApp, Refused, raw_head, refusal

__all__ = ["ApiCycle", "Connection", "answer_bytes", "route_of"]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Connection(Protocol):
    """What a cycle needs of the connection's protocol."""

    loop: asyncio.AbstractEventLoop

    def write_now(self, data: bytes) -> None:
        """Write `data` on the connection, ahead of nothing (a whole answer)."""

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers the server adds to every answer (uvicorn's `date`)."""
        ...

    def response_complete(self) -> None:
        """The answer is sent: the connection's next request may start."""


class _NoEvent:
    """uvicorn's protocol sets its cycle's `message_event` when the client goes away; a
    cycle here awaits nothing."""

    def set(self) -> None:
        return None


_NO_EVENT = _NoEvent()


def answer_bytes(
    status: int,
    body: bytes,
    extra: Mapping[str, str] | None,
    default_headers: list[tuple[bytes, bytes]],
    *,
    close: bool,
    head_only: bool = False,
) -> bytes:
    """A whole JSON answer as written on the connection: the status line, the server's
    headers, the body's length and type and `extra`, `connection: close` when `close`,
    then the body (not for `head_only`: a HEAD's answer says the length it would have)."""
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    for name, value in raw_head(body, extra):
        head += [name, b": ", value, b"\r\n"]
    if close:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    if not head_only:
        head.append(body)
    return b"".join(head)


class ApiCycle:
    """One request of `endpoint` (see the module docstring). `response_complete`,
    `disconnected`, `keep_alive` and `message_event` are what uvicorn's protocol reads and
    sets on its current cycle."""

    __slots__ = (
        "_access",
        "_app",
        "_body",
        "_conn",
        "_endpoint",
        "_expect_100",
        "_head",
        "_head_only",
        "_headers",
        "_method",
        "_route",
        "_started",
        "_timer",
        "disconnected",
        "keep_alive",
        "message_event",
        "response_complete",
    )

    def __init__(
        self,
        conn: Connection,
        app: LedgerApp,
        access: AccessLog,
        endpoint: Endpoint[..., Any],
        route: str,
        headers: Mapping[str, str],
        *,
        keep_alive: bool,
        expect_100: bool,
        head_only: bool = False,
    ) -> None:
        self._conn = conn
        self._app = app
        self._access = access
        self._endpoint = endpoint
        self._head_only = head_only
        self._method = "HEAD" if head_only else endpoint.method
        self._route = route
        self._headers = headers
        self._expect_100 = expect_100
        self._started = access.clock()
        self._head: Head | None = None
        self._body = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.message_event = _NO_EVENT

    def start(self, params: Mapping[str, str], query: bytes, raw_path: bytes) -> None:
        """The head is parsed: its checks, then the deadline."""
        app, endpoint = self._app, self._endpoint
        try:
            head = app.head(endpoint, self._headers, params, query, raw_path)
            if head is None:
                self._answer((200, app.openapi_text, None))
                return
            if endpoint.body is not None:
                app.check_declared_length(self._headers)
        except Refused as exc:
            self._answer(refusal(exc))
            return
        except Exception:  # the last line of defence: a JSON 500, never a traceback
            self._answer(app.internal_error(endpoint))
            return
        self._head = head
        self._timer = self._conn.loop.call_later(app.request_timeout_s, self._expire)
        if self._expect_100 and endpoint.body is not None:
            self._conn.write_now(_CONTINUE)

    def body(self, chunk: bytes) -> None:
        """A piece of the body (ignored once answered, and for a route that reads none)."""
        if self.response_complete or self._endpoint.body is None:
            return
        self._body += chunk
        if len(self._body) > self._app.max_body_bytes:
            self._answer(refusal(self._app.too_large()))

    def complete(self) -> None:
        """The request is whole: the body's checks, then the ledger call."""
        if self.response_complete:
            return
        assert self._head is not None  # start() answered every request it did not set
        app = self._app
        try:
            call = app.call_of(self._head, self._headers, bytes(self._body))
            self._body = bytearray()
            app.workers.submit(self._conn.loop, self._done, app.call_ledger, self._endpoint, call)
        except Refused as exc:
            self._answer(refusal(exc))
        except Exception:
            self._answer(app.internal_error(self._endpoint))

    def _done(self, value: Any, error: BaseException | None) -> None:
        if self.response_complete:  # answered 503 at the deadline: this answer is dropped
            return
        if error is not None:
            self._answer(self._app.internal_error(self._endpoint, error))
        else:
            status, text = value
            self._answer((status, text, None))

    def _expire(self) -> None:
        self._timer = None
        if not self.response_complete:
            self._answer(self._app.timed_out())

    def _answer(self, answer: Answer) -> None:
        status, text, extra = answer
        self.response_complete = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        body = text.encode("utf-8")
        conn = self._conn
        # Answered before its body was whole (a refusal, the deadline), the connection
        # reads the rest and throws it away, within the protocol's bound (`_protocol`).
        close = not self.keep_alive
        if not conn.is_closing():
            conn.write_now(
                answer_bytes(
                    status,
                    body,
                    extra,
                    conn.default_headers(),
                    close=close,
                    head_only=self._head_only,
                )
            )
            if close:
                conn.close()
        self._access.record(
            self._method,
            self._route,
            status,
            body if status >= 400 else b"",
            0 if self._head_only else len(body),
            self._started,
        )
        conn.response_complete()


def route_of(
    app: LedgerApp,
) -> Callable[[str, str], tuple[Endpoint[..., Any], str, dict[str, str]] | None]:
    """The route table's `find` as (endpoint, route template, path parameters); a `HEAD`
    finds the `GET` route of its path."""

    def find(method: str, path: str) -> tuple[Endpoint[..., Any], str, dict[str, str]] | None:
        found = app.routes.find(method, path)
        if found is None:
            return None
        _handle, route, params = found
        return app.endpoints[route.path, "GET" if method == "HEAD" else method], route.path, params

    return find
