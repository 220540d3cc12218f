"""A loopback webhook receiver for the notification tests (issue #49): it verifies each
JSON delivery's signature, records what it got, and answers from a script per path (a
status, a status with headers, `hang` until released, `close` without an answer), 200
once the script is spent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from execkit._notify import verify


class Receiver:
    def __init__(self, secret: str | None = None, port: int = 0) -> None:
        self.secret = secret
        self.scripts: dict[str, list[Any]] = {}
        self.got: list[dict[str, Any]] = []  # every request, in arrival order
        self.bad_signatures = 0
        self.released = threading.Event()
        self.hanging = threading.Event()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.take(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def take(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        headers = {name.lower(): value for name, value in handler.headers.items()}
        signature = headers.get("x-execkit-signature")
        if self.secret is not None and signature is not None:
            good = verify(self.secret, headers.get("x-execkit-timestamp", ""), body, signature)
            if not good:
                self.bad_signatures += 1
        with self.lock:
            self.got.append({"path": handler.path, "headers": headers, "body": json.loads(body)})
            script = self.scripts.get(handler.path) or []
            step = script.pop(0) if script else 200
        if step == "hang":
            self.hanging.set()
            self.released.wait(60)
            return
        if step == "close":
            handler.close_connection = True
            return
        status, extra = (step, {}) if isinstance(step, int) else step
        handler.send_response(status)
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def ids(self, path: str) -> list[str]:
        """The event ids delivered to `path`, each once (a receiver de-duplicates), in the
        order first received."""
        seen: dict[str, None] = {}
        for request in self.got:
            if request["path"] == path:
                seen.setdefault(request["headers"]["x-execkit-event-id"], None)
        return list(seen)

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiving(secret: str | None = None, port: int = 0) -> Iterator[Receiver]:
    receiver = Receiver(secret, port)
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.stop()
