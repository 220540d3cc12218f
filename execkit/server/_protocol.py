"""The HTTP/1.1 protocol of `execkit serve`: uvicorn's httptools protocol with the bounds a
server facing clients it does not trust needs and uvicorn's lacks, every answer it makes in
the API's error shape, and the API's requests served from the parser's callbacks
(`_api_cycle`).

What uvicorn's protocol leaves open, and what is done here (docs/remote.md, "The server"):

- Time. uvicorn arms its keep-alive timer only after an answer, and any byte cancels it: a
  connection that never sends a byte, or sends one every few seconds, is held forever.
  Here each connection has one timer, in one of four phases:

      idle   no request under way (just connected, or the last one answered): closed
             after `idle_timeout_s`, without an answer (as a keep-alive timeout is)
      head   from a request's first byte until its head is whole: `head_timeout_s` in
             total, never pushed back by later bytes (a trickle gets no longer); past it,
             408 and closed
      body   a request's body until whole: `request_timeout_s` (the application's); past
             it, 408 and closed. The API's own cycle answers 503 at that time itself, so
             its body is timed here only once it is answered (the rest read and dropped)
      busy   the request is whole and not yet answered: the application's deadline

- Connections. uvicorn's `limit_concurrency` counts every connection, idle ones too, and
  past it refuses every request, /healthz included, as a text page. Here the first
  `max_connections` connections are served (a place is taken at connection, or at a
  request if one has freed since); a request on a connection past them is answered 503
  `storage` (`Retry-After: 1`) and the connection closed, except `GET` or `HEAD` of
  `/healthz` and `/readyz`, answered whatever the count.

- The head. httptools takes a head of any size (it buffers a header line until it is
  whole). It is counted as parsed (the target and each header line) and as received while
  incomplete (whole reads after its first: asyncio hands over at most 256 KiB at a time,
  which bounds what httptools holds): at most `MAX_HEAD_BYTES` and `MAX_HEADER_LINES`
  lines, else 431 (414 when the request target alone is over).

- Malformed requests. What the parser refuses (a NUL in a header, a garbage request line,
  `Content-Length: -1`, a bad chunk) uvicorn answered with its own text page: here 400
  `invalid` in the API's error shape, naming the parser's reason (its own words, never the
  bytes sent), and the connection closed, as after every answer made here.

Every answer made here is written to the access log with the route `(unparsed)`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from execkit.server._api_cycle import ApiCycle, answer_bytes, route_of
from execkit.server._app import LedgerApp, Refused, headers_of, refusal
from execkit.server._listen import ConnectionLimits

__all__ = ["MAX_HEADER_LINES", "MAX_HEAD_BYTES", "PROBES", "UNPARSED", "http_protocol"]

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADER_LINES = 100
PROBES = frozenset({"/healthz", "/readyz"})
UNPARSED = "(unparsed)"

_log = logging.getLogger("execkit.server")


class _Phase(enum.Enum):
    IDLE = "idle"
    HEAD = "head"
    BODY = "body"
    BUSY = "busy"


class _Stop(Exception):
    """Raised from a parser callback to stop parsing: the refusal it set is answered."""


class _CoalescedWrites:
    """A connection's transport whose writes in one turn of the event loop go out as one:
    uvicorn writes an answer's head and its body apart, and each write on an idle socket is
    a `send` of its own, so the client woke for the head and again for the body. The
    writes are joined and handed on when the loop turns (`call_soon`), or at once when the
    connection is closed. Everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def write_now(self, data: bytes) -> None:
        """`data` written at once, after anything pending (an answer made whole already)."""
        if self._pending:
            self._pending.append(bytes(data))
            self._flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _parser_reason(exc: BaseException) -> str | None:
    """The parser's own words for what it refused (llhttp's fixed messages, which never
    quote the request), or None for an exception that is not the parser's."""
    if isinstance(exc, httptools.HttpParserCallbackError):
        # A callback raised: uvicorn's own (the target as a URL) is the parser's kind.
        cause = exc.__context__
        return _parser_reason(cause) if cause is not None else None
    if isinstance(exc, httptools.HttpParserError):
        return str(exc) or "malformed request"
    return None


def http_protocol(app: LedgerApp, limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The protocol class of one server (see the module docstring): its connections'
    places (`max_connections`) are counted across the connections it makes."""
    served, find, access = app, route_of(app), app.front.asgi
    request_timeout_s = app.request_timeout_s
    admitted: set[asyncio.Protocol] = set()  # the connections holding a place

    class ExeckitHttp(HttpToolsProtocol):
        _phase = _Phase.IDLE
        _timer: asyncio.TimerHandle | None = None
        _admitted = False
        _started = 0.0  # when the request under way began, by the access log's clock
        _head_bytes = 0  # of the head parsed so far: its target and each header line
        _url_bytes = 0
        _header_lines = 0
        _head_received = 0  # bytes received while the head was incomplete
        _refusal: tuple[int, str, str, Mapping[str, str] | None] | None = None

        # -- the connection ---------------------------------------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._writes = _CoalescedWrites(transport, self.loop)
            super().connection_made(self._writes)  # type: ignore[arg-type]
            self._admit()
            self._arm(_Phase.IDLE, limits.idle_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            admitted.discard(self)
            self._disarm()
            super().connection_lost(exc)

        def _admit(self) -> bool:
            if not self._admitted and len(admitted) < limits.max_connections:
                admitted.add(self)
                self._admitted = True
            return self._admitted

        # -- the timer ----------------------------------------------------------------

        def _arm(self, phase: _Phase, seconds: float) -> None:
            self._disarm()
            self._phase = phase
            self._timer = self.loop.call_later(seconds, self._expired, phase)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self, phase: _Phase) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if phase is _Phase.HEAD:
                self._answer_unparsed(
                    408,
                    "invalid",
                    f"the request head did not arrive whole within {limits.head_timeout_s:g} s",
                    method=self._method_or_blank(),
                )
                return
            cycle = self.cycle
            if phase is _Phase.BODY and cycle is not None and not cycle.response_complete:
                # The application waits for the rest of the body: it will get a disconnect,
                # and what it answers then goes nowhere.
                cycle.disconnected = True
                cycle.message_event.set()
                if not getattr(cycle, "response_started", True):
                    self._answer_unparsed(
                        408,
                        "invalid",
                        f"the request body did not arrive whole within {request_timeout_s:g} s",
                        logged=False,  # the access log has the request, as the application ends it
                    )
                    return
            self.transport.close()

        def _settle(self) -> None:
            """The timer for where the connection stands, after a request was whole or
            answered: idle once the last request is both; the rest of an answered body
            within `request_timeout_s`."""
            if self.transport.is_closing():
                self._disarm()
                return
            cycle = self.cycle
            answered = cycle is None or cycle.response_complete
            if self._phase is _Phase.BODY:
                if answered and self._timer is None:
                    self._arm(_Phase.BODY, request_timeout_s)
            elif self._phase is _Phase.BUSY:
                if answered and not self.pipeline:
                    self._arm(_Phase.IDLE, limits.idle_timeout_s)
                else:
                    self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # uvicorn arms its keep-alive timer here, which any byte cancels: the idle
            # phase stands for it.
            self._unset_keepalive_if_required()
            self._settle()

        # -- answers made here ----------------------------------------------------------

        def _answer_unparsed(
            self,
            status: int,
            code: str,
            message: str,
            extra: Mapping[str, str] | None = None,
            method: str = "",
            *,
            logged: bool = True,
        ) -> None:
            """An answer in the API's shape to a request no application saw (`logged`: on
            the access log; not when an application has it), then the connection closed
            (what follows on it cannot be trusted to be a request)."""
            self._disarm()
            _status, text, headers = refusal(Refused(status, code, message))
            body = text.encode("utf-8")
            if not self.transport.is_closing():
                self._writes.write_now(
                    answer_bytes(
                        status,
                        body,
                        {**(headers or {}), **(extra or {})},
                        self.server_state.default_headers,
                        close=True,
                        head_only=method == "HEAD",
                    )
                )
                self._writes.close()
            if logged:
                sent = 0 if method == "HEAD" else len(body)
                access.record(method, UNPARSED, status, body, sent, self._started)

        def _refuse(
            self, status: int, message: str, extra: Mapping[str, str] | None = None
        ) -> None:
            """Stop parsing (from a callback): `data_received` answers the refusal."""
            code = "storage" if status == 503 else "invalid"
            self._refusal = (status, code, message, extra)
            raise _Stop(message)

        # -- the bytes ------------------------------------------------------------------

        def data_received(self, data: bytes) -> None:
            head_was_open = self._phase is _Phase.HEAD
            if self._phase is _Phase.IDLE:
                self._begin_head()
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                # No WebSocket is served (uvicorn's `ws="none"`): uvicorn's own warning,
                # the request served as any other.
                self._unsupported_upgrade_warning()
                return
            except Exception as exc:
                self._failed(exc)
                return
            if head_was_open and self._phase is _Phase.HEAD and not self.transport.is_closing():
                # A header line not yet whole is held by httptools, not yet counted.
                self._head_received += len(data)
                if self._head_received > MAX_HEAD_BYTES:
                    self._answer_unparsed(
                        431, "invalid", f"the request head is over {MAX_HEAD_BYTES} bytes"
                    )

        def _failed(self, exc: Exception) -> None:
            if self.transport.is_closing():
                return  # answered already (the 503 past the limit) or the client went
            refused, self._refusal = self._refusal, None
            method = self._method_or_blank()
            if refused is not None:
                status, code, message, extra = refused
                self._answer_unparsed(status, code, message, extra, method)
                return
            cycle = self.cycle
            in_body = self._phase is _Phase.BODY and cycle is not None
            if in_body and cycle.response_complete:
                # The body of a request answered already (refused at its head): a second
                # answer would read as the answer to a request never sent.
                self.transport.close()
                return
            if in_body:
                # Its application's answer, when it comes, goes nowhere (and is logged
                # there, so not here too).
                cycle.disconnected = True
                cycle.message_event.set()
            reason = _parser_reason(exc)
            if reason is None:  # not the request's fault: a JSON 500, never a traceback
                _log.error("internal error reading a request", exc_info=exc)
                status, code, message = 500, "error", "internal server error"
            else:
                status, code = 400, "invalid"
                message = f"the request is not valid HTTP/1.1: {reason}"
            self._answer_unparsed(status, code, message, method=method, logged=not in_body)

        def _method_or_blank(self) -> str:
            """The request's method once the parser has read it (its target began), else
            "" (before that, httptools answers its first method, DELETE, whatever came)."""
            if not self._url_bytes:
                return ""
            try:
                return str(self.parser.get_method().decode("ascii"))
            except Exception:  # pragma: no cover - the method precedes the target
                return ""

        def _begin_head(self) -> None:
            self._started = access.clock()
            self._head_bytes = self._url_bytes = self._header_lines = self._head_received = 0
            self._arm(_Phase.HEAD, limits.head_timeout_s)

        # -- the parser's callbacks -------------------------------------------------------

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._phase is not _Phase.HEAD:  # pipelined behind a request in flight
                self._begin_head()

        def on_url(self, url: bytes) -> None:
            self._url_bytes += len(url)
            if self._url_bytes > MAX_HEAD_BYTES:
                self._refuse(414, f"the request target is over {MAX_HEAD_BYTES} bytes")
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_lines += 1
            if self._header_lines > MAX_HEADER_LINES:
                self._refuse(431, f"the request has over {MAX_HEADER_LINES} header lines")
            self._count(len(name) + len(value) + 4)  # ": " and CRLF
            super().on_header(name, value)

        def _count(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, f"the request head is over {MAX_HEAD_BYTES} bytes")

        def on_headers_complete(self) -> None:
            self._disarm()
            self._phase = _Phase.BODY
            if not self._admit() and not self._is_probe():
                self._refuse(
                    503,
                    f"the server is serving its limit of {limits.max_connections} "
                    "connections; nothing was done: try again shortly",
                    {"Retry-After": "1"},
                )
            try:
                taken = self._api_cycle()
            except (UnicodeDecodeError, httptools.HttpParserInvalidURLError):
                taken = False  # as uvicorn would take it
            if not taken:
                super().on_headers_complete()
                # An ASGI request's body is timed from here; the API's cycle times its own.
                self._arm(_Phase.BODY, request_timeout_s)

        def on_body(self, body: bytes) -> None:
            cycle = self.cycle
            if isinstance(cycle, ApiCycle):
                cycle.body(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            cycle = self.cycle
            if isinstance(cycle, ApiCycle):
                cycle.complete()
            else:
                super().on_message_complete()
            if self._phase is _Phase.BODY:  # not answered and closed meanwhile
                self._phase = _Phase.BUSY
                self._settle()

        def _is_probe(self) -> bool:
            """`GET` or `HEAD` of /healthz or /readyz (answered past the connection limit)."""
            if self.parser.get_method() not in (b"GET", b"HEAD"):
                return False
            try:
                path = httptools.parse_url(self.url).path
            except httptools.HttpParserInvalidURLError:
                return False
            return path.decode("ascii", "replace") in PROBES

        # -- the API's own cycle (_api_cycle): what it needs of the connection ------------

        def write_now(self, data: bytes) -> None:
            self._writes.write_now(data)

        def is_closing(self) -> bool:
            return self.transport.is_closing()

        def close(self) -> None:
            self.transport.close()

        def default_headers(self) -> list[tuple[bytes, bytes]]:
            return self.server_state.default_headers

        def response_complete(self) -> None:
            self.on_response_complete()

        def _api_cycle(self) -> bool:
            """Start an `ApiCycle` for the request whose head was just parsed when it is
            one: a route of the API's table (a `HEAD` of one of its `GET` routes too), no
            request of the connection still in flight, no upgrade. False leaves it to
            uvicorn's ASGI cycle."""
            if self.root_path:
                return False
            if self.cycle is not None and not self.cycle.response_complete:
                return False  # pipelined behind one in flight: uvicorn queues it
            if self.parser.should_upgrade():
                return False
            url = httptools.parse_url(self.url)
            raw_path: bytes = url.path
            path = raw_path.decode("ascii")
            if not (path.startswith("/v1/") or path == "/openapi.json"):
                return False
            if "%" in path:
                path = urllib.parse.unquote(path)
            method = self.parser.get_method().decode("ascii")
            found = find(method, path)
            if found is None:
                return False  # the API's 404 or 405, answered through ASGI
            endpoint, route, params = found
            version = self.parser.get_http_version()
            cycle = ApiCycle(
                self,
                served,
                access,
                endpoint,
                route,
                headers_of(self.headers),
                keep_alive=version != "1.0" and self.parser.should_keep_alive(),
                expect_100=self.expect_100_continue,
                head_only=method == "HEAD",
            )
            self.cycle = cycle  # type: ignore[assignment]
            cycle.start(params, url.query or b"", raw_path)
            return True

    return ExeckitHttp
