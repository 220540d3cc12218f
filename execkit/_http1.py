"""One keep-alive HTTP/1.1 client connection, for `execkit.remote.HTTPTransport`.

Why not `http.client`: it writes a request's head and body in two `send` calls (so the
server wakes twice for one request, and on a loaded host each wake-up is a scheduling
round) and parses every answer's head with the `email` package; both were about a third
of a client's time per admission through `execkit serve`. Here a request is one buffer
and one `sendall`, and an answer's head is split on CRLF and colons.

What it speaks is what the API needs: a request with a `Content-Length` body (or none);
an answer with a `Content-Length` body, a chunked one, or one that ends when the server
closes (HTTP/1.0). An answer's body is read up to `limit` bytes and one more (the caller
refuses more); past that the connection is closed, never reused with bytes unread.
`Connection: close` (or HTTP/1.0) closes it after the answer.

Errors: a socket error is raised as it is (`OSError`); an answer that is not HTTP/1.x,
or a connection closed before the answer was whole, is `ConnectionError`. Either way the
connection is closed: the next request opens a new one. Not thread-safe: one connection
per thread (the transport keeps them apart).
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import time
from typing import BinaryIO

__all__ = ["Answer", "Connection"]

_MAX_LINE = 65536
_MAX_HEADERS = 100
# A connection idle this long is checked before it is written to: the server closes idle
# keep-alive connections (`execkit serve` after 5 s), and a request written into a closed
# one is lost (then sent again, after the client's pause).
_CHECK_IDLE_S = 1.0


class Answer:
    """An answer as read: status, headers (names as sent), body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _bad(message: str) -> ConnectionError:
    return ConnectionError(f"the server's answer is not HTTP/1.1: {message}")


# Visible ASCII only: a CR, LF or space would split the request line or a header (another
# request). One regular expression, not a test per character (3.8 -> 1.1 us a request).
_VISIBLE = re.compile(r"[\x21-\x7e]*")


def _visible(text: str, what: str) -> str:
    if not _VISIBLE.fullmatch(text):
        raise ValueError(f"{what} holds a space, a control or a non-ASCII character")
    return text


class Connection:
    """A keep-alive connection to `host`:`port` (TLS with `tls`, the host's certificate
    checked by the default context), opened at the first request, each socket operation
    bounded by `timeout_s`."""

    def __init__(self, host: str, port: int | None, *, tls: bool, timeout_s: float) -> None:
        self.host = host
        self.port = port or (443 if tls else 80)
        self.tls = tls
        self.timeout_s = timeout_s
        default = (443 if tls else 80) == self.port
        shown = f"[{host}]" if ":" in host else host
        self._host_header = shown if default else f"{shown}:{self.port}"
        self._sock: socket.socket | None = None
        self._file: BinaryIO | None = None
        self._used_at = 0.0

    def _open(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        try:
            # Small requests go out at once instead of waiting on the peer's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._file = sock.makefile("rb")

    def _closed_by_peer(self, sock: socket.socket) -> bool:
        """True when the server closed this idle connection (or sent something unasked)."""
        if self.tls:
            return False  # a TLS record cannot be peeked at: the client's retry covers it
        try:
            sock.setblocking(False)
            try:
                sock.recv(1, socket.MSG_PEEK)  # end of stream, or bytes nobody asked for
                return True
            finally:
                sock.settimeout(self.timeout_s)
        except BlockingIOError:
            return False  # nothing to read: open
        except OSError:
            return True

    def request(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None, limit: int
    ) -> tuple[Answer, bool]:
        """Send one request and read its answer (the body up to `limit` + 1 bytes); also
        says whether the connection was closed after it. ValueError for a method, target
        or header that would not be one request line or header (nothing sent)."""
        lines = [f"{_visible(method, 'the method')} {_visible(target, 'the target')} HTTP/1.1"]
        lines.append(f"Host: {self._host_header}")
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"the header {name} holds a line break")
            lines.append(f"{_visible(name, 'a header name')}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        sock = self._sock
        idle = sock is not None and time.monotonic() - self._used_at > _CHECK_IDLE_S
        if sock is not None and idle and self._closed_by_peer(sock):
            self.close()
        if self._sock is None:
            self._open()
        assert self._sock is not None and self._file is not None
        try:
            self._sock.sendall(head + body if body else head)
            answer, closing = self._read(method, limit)
        except BaseException:
            self.close()
            raise
        if closing:
            self.close()
        else:
            self._used_at = time.monotonic()
        return answer, closing

    def _line(self, file: BinaryIO) -> bytes:
        line = file.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise _bad("a line of the head is over 64 KiB")
        if not line.endswith(b"\n"):
            raise ConnectionError("the server closed the connection before its answer was whole")
        return line

    def _read(self, method: str, limit: int) -> tuple[Answer, bool]:
        file = self._file
        assert file is not None
        while True:
            status_line = self._line(file)
            version, _, rest = status_line.partition(b" ")
            code = rest[:3]
            if version not in (b"HTTP/1.1", b"HTTP/1.0") or not code.isdigit():
                raise _bad("its first line is not an HTTP/1.x status line")
            status = int(code)
            headers: dict[str, str] = {}
            lowered: dict[str, str] = {}
            for _ in range(_MAX_HEADERS + 1):
                line = self._line(file)
                if line in (b"\r\n", b"\n"):
                    break
                name, colon, value = line.decode("latin-1").partition(":")
                if not colon:
                    raise _bad("a header line without a colon")
                name, value = name.strip(), value.strip()
                headers[name] = value
                lowered[name.lower()] = value
            else:
                raise _bad(f"more than {_MAX_HEADERS} headers")
            if not 100 <= status < 200:
                break  # an interim answer (100 Continue) is followed by the answer
        closing = version == b"HTTP/1.0" or "close" in lowered.get("connection", "").lower()
        if method == "HEAD" or status in (204, 304):
            return Answer(status, headers, b""), closing
        if "chunked" in lowered.get("transfer-encoding", "").lower():
            body, whole = self._chunked(file, limit)
            return Answer(status, headers, body), closing or not whole
        length = lowered.get("content-length")
        if length is None:
            body = file.read(limit + 1)  # the body ends where the connection does
            return Answer(status, headers, body), True
        if not length.isdigit():
            raise _bad("Content-Length is not a number")
        size = int(length)
        body = file.read(min(size, limit + 1))
        if len(body) < min(size, limit + 1):
            raise ConnectionError("the server closed the connection before its answer was whole")
        return Answer(status, headers, body), closing or size > limit + 1

    def _chunked(self, file: BinaryIO, limit: int) -> tuple[bytes, bool]:
        """The body and whether it was read to its end (else the connection is dropped)."""
        parts: list[bytes] = []
        size = 0
        while True:
            line = self._line(file)
            digits = line.split(b";", 1)[0].strip()
            try:
                chunk = int(digits, 16)
            except ValueError:
                raise _bad("a chunk size is not hexadecimal") from None
            if chunk == 0:
                for _ in range(_MAX_HEADERS + 1):  # trailers, unread (as many as headers)
                    if self._line(file) in (b"\r\n", b"\n"):
                        return b"".join(parts), True
                raise _bad(f"more than {_MAX_HEADERS} trailers")
            if size + chunk > limit + 1:
                parts.append(file.read(limit + 1 - size))
                return b"".join(parts), False
            data = file.read(chunk)
            if len(data) < chunk:
                raise ConnectionError("the server closed the connection inside a chunk")
            parts.append(data)
            size += chunk
            self._line(file)  # the CRLF after the chunk

    def close(self) -> None:
        """Close the connection, from any thread: a request another thread is reading the
        answer of ends at once (`ConnectionError`), as for a server that closed."""
        file, sock, self._file, self._sock = self._file, self._sock, None, None
        if sock is not None:
            # The shutdown first: closing the file waits for the lock of a read in progress
            # (a long poll), and closing the socket alone leaves that read blocked.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if file is not None:
            file.close()
        if sock is not None:
            sock.close()
