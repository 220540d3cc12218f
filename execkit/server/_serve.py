"""Running the application on uvicorn: the listening address, the server's bounds, and a
server in a background thread (for tests, benchmarks and programs that embed one).

The socket is bound here, before uvicorn starts, so `--listen 127.0.0.1:0` gets a free port
that can be printed, and so a non-loopback address is refused before anything listens
(`allow_non_loopback` lifts that: the API is plain HTTP, meant for one host unless a TLS
proxy stands in front of it). uvicorn runs execkit's own protocol (`_protocol`: the
connection limit, the idle, head and body timeouts, the head's bounds, every answer it
makes in the API's error shape), with its access log off, no `Server` header and no
WebSocket.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType

import uvicorn

from execkit._api import package_version
from execkit._errors import InvalidInput, StorageError
from execkit.dispatch import JsonFileBoard
from execkit.ledger import Ledger, open_ledger
from execkit.server._app import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_TIMEOUT_S,
    LedgerApp,
)
from execkit.server._hooks import HOOK_KINDS, read_webhook_secret
from execkit.server._listen import DEFAULT_LISTEN, ConnectionLimits, parse_listen
from execkit.server._protocol import http_protocol
from execkit.server._tokens import TokenFile

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_LISTEN",
    "ServerThread",
    "bind",
    "parse_listen",
    "serve",
    "serving",
    "url_of",
]

_log = logging.getLogger("execkit.server")
DEFAULT_LIMITS = ConnectionLimits()


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


def _config(app: LedgerApp, limits: ConnectionLimits) -> uvicorn.Config:
    return uvicorn.Config(
        app.front.asgi,  # the API behind the dashboard, monitoring and access log (_front)
        http=http_protocol(app, limits),
        ws="none",
        loop="asyncio",
        lifespan="off",
        # uvicorn's access log prints the raw path and query; execkit's own (_access_log)
        # prints route templates only, so no token typed into a URL reaches a log.
        access_log=False,
        log_config=None,
        server_header=False,
        proxy_headers=False,
        # The connection limit and every timeout are the protocol's (_protocol): uvicorn's
        # limit refuses /healthz too, and its keep-alive timer any byte cancels.
        limit_concurrency=None,
        timeout_keep_alive=max(1, math.ceil(limits.idle_timeout_s)),
    )


def _raise_file_limit(limits: ConnectionLimits) -> None:
    """The process's soft limit on open files raised towards its hard limit, to hold
    `max_connections` and the connections past them that are answered 503 (a soft limit of
    1,024, common, would make the kernel refuse connections before the server could answer
    them: no /healthz either). A warning when the hard limit is too low."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    wanted = 2 * limits.max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
    if soft != resource.RLIM_INFINITY and soft < limits.max_connections + 64:
        _log.warning(
            "the open-file limit (%d) is below --max-connections %d: raise it (ulimit -n) "
            "or lower --max-connections",
            soft,
            limits.max_connections,
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
    limits: ConnectionLimits = DEFAULT_LIMITS,
    ready: Callable[[str, Ledger], None] | None = None,
    board: str | os.PathLike[str] | None = None,
    github_webhook_secret_file: str | os.PathLike[str] | None = None,
    webhook_secret_files: Mapping[str, str | os.PathLike[str]] | None = None,
) -> None:
    """Serve the ledger `target` names (`open_ledger`: a file, a postgresql:// URL, None for
    the default) until interrupted; `ready(url, ledger)` is called once the socket listens.
    `limits` bounds the connections (`ConnectionLimits`); the process's open-file limit is
    raised to hold them.
    `board` is a board file whose columns and titles the dashboard shows (`JsonFileBoard`;
    Conflict when it was dispatched with another ledger). `webhook_secret_files` holds, by
    tracker (`github`, `linear`, `gitlab`), the file of its webhook's secret: `POST
    /hooks/<tracker>` wakes the dispatchers on each authenticated delivery (`_hooks`;
    InvalidInput naming `<tracker>_webhook_secret_file` for a file that is unreadable, empty
    or open to others, and `webhook_secrets` for a tracker without a webhook);
    `github_webhook_secret_file` is `webhook_secret_files={"github": ...}`.

    `idempotency_db` is deprecated and ignored: the ledger keeps every Idempotency-Key in
    its own transactions (docs/remote.md, "Idempotency"); no file is opened or written."""
    host, port = parse_listen(listen, allow_non_loopback=allow_non_loopback)
    token_file = TokenFile(tokens)
    files = dict(webhook_secret_files or {})
    if github_webhook_secret_file is not None:
        files["github"] = github_webhook_secret_file
    unknown = sorted(set(files) - set(HOOK_KINDS))
    if unknown:
        raise InvalidInput(
            f"no webhook for {', '.join(unknown)} (known: {', '.join(sorted(HOOK_KINDS))})",
            field="webhook_secrets",
        )
    # Every secret file is read before anything listens: a bad one is refused at start.
    secrets = {
        name: read_webhook_secret(path, field=f"{name}_webhook_secret_file")
        for name, path in files.items()
    }
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
            webhook_secrets=secrets,
        )
        stack.callback(app.close)
        _raise_file_limit(limits)
        # Issue #49: the server sends the ledger's notifications while it serves (each
        # dispatcher through it has none of its own); the lease keeps one sender per
        # endpoint when a local dispatcher sends too.
        from execkit._notify import sender_owner, sending

        stack.enter_context(
            sending(
                functools.partial(open_ledger, target),
                sender_owner("serve"),
                dashboard_url=url_of(sock),
                final_wait_s=5.0,
            )
        )
        if ready is not None:
            ready(url_of(sock), ledger)
        uvicorn.Server(_config(app, limits)).run(sockets=[sock])


class ServerThread:
    """`app` served on a loopback port in a background thread (a context manager):
    `url` is where; leaving the block stops the server and waits for it. `limits` bounds
    its connections as `serve`'s do (the open-file limit is left as it is)."""

    def __init__(
        self,
        app: LedgerApp,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ConnectionLimits = DEFAULT_LIMITS,
    ) -> None:
        self.app = app
        self._sock = bind(host, port)
        self.url = url_of(self._sock)
        self._server = uvicorn.Server(_config(app, limits))
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

    @property
    def connections(self) -> int:
        """How many connections the server holds open now."""
        return len(self._server.server_state.connections)

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
