"""Running the application on uvicorn: the listening address, the server's bounds, and a
server in a background thread (for tests, benchmarks and programs that embed one).

The socket is bound here, before uvicorn starts, so `--listen 127.0.0.1:0` gets a free port
that can be printed, and so a non-loopback address is refused before anything listens
(`allow_non_loopback` lifts that: the API is plain HTTP, meant for one host unless a TLS
proxy stands in front of it). uvicorn runs with its access log off and no `Server` header,
keep-alive connections closed after 5 idle seconds, at most `limit_concurrency` connections
and tasks at once (503 beyond), and a 16 KiB bound on an incomplete request head.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import uvicorn

from execkit._api import package_version
from execkit._errors import StorageError
from execkit.dispatch import JsonFileBoard
from execkit.ledger import Ledger, open_ledger
from execkit.server._app import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_TIMEOUT_S,
    LedgerApp,
    headers_of,
)
from execkit.server._listen import DEFAULT_LISTEN, parse_listen
from execkit.server._tokens import TokenFile

__all__ = [
    "DEFAULT_LISTEN",
    "ServerThread",
    "bind",
    "parse_listen",
    "serve",
    "serving",
    "url_of",
]

_log = logging.getLogger("execkit.server")
_LIMIT_CONCURRENCY = 1024
_KEEP_ALIVE_S = 5
_MAX_HEAD_BYTES = 16 * 1024


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); StorageError when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it a response's head and body wait out the peer's delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise StorageError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


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


def _http_protocol(app: LedgerApp | None = None) -> type[asyncio.Protocol] | str:
    """uvicorn's httptools protocol with the request head bounded to `_MAX_HEAD_BYTES`,
    where httptools is installed (the `server` extra installs it: it parses a request in C,
    about 0.1 ms less per request than h11 here); else h11, bounded by its own option.
    With `app`, a request its API's route table routes is served by `_api_cycle.ApiCycle`
    straight from the parser's callbacks (everything else, and everything under h11, goes
    through uvicorn's ASGI cycle to `app.front.asgi`).

    uvicorn bounds only h11's incomplete head; its httptools protocol takes a head of any
    size, and httptools buffers a header until it is whole. So the head is counted twice:
    as it is parsed (the target and each header line) and as it is received while still
    incomplete (whole chunks: asyncio hands over at most 64 KiB at a time, which bounds
    what httptools holds); past the bound on either, the request is answered 400 and the
    connection closed, as h11 answers a head too large."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        from execkit.server._api_cycle import ApiCycle, route_of
    except ImportError:  # no httptools: uvicorn's h11 protocol
        return "h11"
    # The application, its route table's lookup and its access log, for the API's cycle.
    api = (app, route_of(app), app.front.asgi) if app is not None else None

    class BoundedHttpTools(HttpToolsProtocol):
        _head_open = False
        _head_bytes = 0  # of the head parsed so far: its target and each header line
        _head_received = 0  # bytes received while the head is incomplete

        def _count(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > _MAX_HEAD_BYTES:  # answered 400 by data_received's caller
                raise httptools.HttpParserError("request head too large")

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._writes = _CoalescedWrites(transport, asyncio.get_running_loop())
            super().connection_made(self._writes)  # type: ignore[arg-type]

        # -- the API's own cycle (_api_cycle): what it needs of the connection

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
            one: a route of the API's table, no request of the connection still in
            flight, no upgrade, the server within its connection limit. False leaves it
            to uvicorn's ASGI cycle."""
            if api is None or self.root_path:
                return False
            served, find, access = api
            if self.cycle is not None and not self.cycle.response_complete:
                return False  # pipelined behind one in flight: uvicorn queues it
            limit = self.limit_concurrency
            if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
                return False  # answered 503 by uvicorn
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
            )
            self.cycle = cycle  # type: ignore[assignment]
            cycle.start(params, url.query or b"", raw_path)
            return True

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_open = True
            self._head_bytes = self._head_received = 0

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)  # ": " and CRLF
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_open = False
            try:
                taken = self._api_cycle()
            except (UnicodeDecodeError, httptools.HttpParserInvalidURLError):
                taken = False  # as uvicorn would take it
            if not taken:
                super().on_headers_complete()

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

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_open and not self.transport.is_closing():
                # A header not yet whole is held by httptools, not yet counted above.
                self._head_received += len(data)
                if self._head_received > _MAX_HEAD_BYTES:
                    self.send_400_response("Invalid HTTP request received.")

    return BoundedHttpTools


def _config(app: LedgerApp) -> uvicorn.Config:
    return uvicorn.Config(
        app.front.asgi,  # the API behind the dashboard, monitoring and access log (_front)
        http=_http_protocol(app),
        loop="asyncio",
        lifespan="off",
        # uvicorn's access log prints the raw path and query; execkit's own (_access_log)
        # prints route templates only, so no token typed into a URL reaches a log.
        access_log=False,
        log_config=None,
        server_header=False,
        proxy_headers=False,
        timeout_keep_alive=_KEEP_ALIVE_S,
        limit_concurrency=_LIMIT_CONCURRENCY,
        h11_max_incomplete_event_size=_MAX_HEAD_BYTES,
    )


def serve(
    target: str | None,
    tokens: str | os.PathLike[str],
    *,
    listen: str = DEFAULT_LISTEN,
    idempotency_db: str | os.PathLike[str] | None = None,
    without: Iterable[str] = (),
    allow_non_loopback: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ready: Callable[[str, Ledger], None] | None = None,
    board: str | os.PathLike[str] | None = None,
) -> None:
    """Serve the ledger `target` names (`open_ledger`: a file, a postgresql:// URL, None for
    the default) until interrupted; `ready(url, ledger)` is called once the socket listens.
    `board` is a board file whose columns and titles the dashboard shows (`JsonFileBoard`;
    Conflict when it was dispatched with another ledger).

    `idempotency_db` is deprecated and ignored: the ledger keeps every Idempotency-Key in
    its own transactions (docs/remote.md, "Idempotency"); no file is opened or written."""
    host, port = parse_listen(listen, allow_non_loopback=allow_non_loopback)
    token_file = TokenFile(tokens)
    with contextlib.ExitStack() as stack:
        sock = bind(host, port)
        stack.callback(sock.close)
        ledger = open_ledger(target)
        stack.callback(ledger.close)
        if idempotency_db is not None:
            _log.warning(
                "--idempotency-db is deprecated and ignored: the ledger keeps the "
                "Idempotency-Key answers in its own transactions"
            )
        app = LedgerApp(
            ledger,
            token_file,
            without=frozenset(without),
            max_body_bytes=max_body_bytes,
            request_timeout_s=request_timeout_s,
            version=package_version(),
            board=None if board is None else JsonFileBoard(board),
        )
        stack.callback(app.close)
        if ready is not None:
            ready(url_of(sock), ledger)
        uvicorn.Server(_config(app)).run(sockets=[sock])


class ServerThread:
    """`app` served on a loopback port in a background thread (a context manager):
    `url` is where; leaving the block stops the server and waits for it."""

    def __init__(self, app: LedgerApp, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self._sock = bind(host, port)
        self.url = url_of(self._sock)
        self._server = uvicorn.Server(_config(app))
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            name="execkit-serve",
            daemon=True,
        )

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise StorageError("the server thread did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._sock.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def serving(app: LedgerApp) -> Iterator[str]:
    """`with serving(app) as url:` — `ServerThread` as a one-liner."""
    with ServerThread(app) as running:
        yield running.url
