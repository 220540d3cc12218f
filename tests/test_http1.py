"""`execkit._http1.Connection`, the default transport's HTTP/1.1 connection, against a peer
on 127.0.0.1 that answers scripted bytes: the answer shapes it reads (Content-Length,
chunked, to the end of the stream), when it keeps or drops the connection, and that a
server's close of an idle connection costs no retry."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

import execkit._http1
from execkit._http1 import Connection
from execkit.remote import HttpRequest, HTTPTransport

Script = Callable[[socket.socket, int], bool]  # (peer, request number) -> keep the peer open


class Peer:
    """A listener that hands each request it reads to `script`; counts connections and the
    requests read, each request's bytes as received in one piece."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                peer, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with peer:
                while True:
                    data = peer.recv(65536)
                    if not data:
                        break
                    self.requests.append(data)
                    if not self.script(peer, len(self.requests)):
                        break

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def peer_of() -> Iterator[Callable[[Script], Peer]]:
    made: list[Peer] = []

    def make(script: Script) -> Peer:
        made.append(Peer(script))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


def _answer(body: bytes, *head: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *head]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_a_request_is_one_write_and_a_kept_connection_is_reused(
    peer_of: Callable[[Script], Peer],
) -> None:
    def script(peer: socket.socket, _n: int) -> bool:
        peer.sendall(_answer(b'{"ok": true}', "Content-Type: application/json"))
        return True

    peer = peer_of(script)
    conn = Connection("127.0.0.1", peer.port, tls=False, timeout_s=10)
    body = b'{"x": 1}'
    for _ in range(3):
        answer, closed = conn.request("POST", "/v1/x", {"A": "b"}, body, 1000)
        assert (answer.status, answer.body, closed) == (200, b'{"ok": true}', False)
        assert answer.headers["Content-Type"] == "application/json"
    conn.close()
    assert peer.connections == 1 and len(peer.requests) == 3
    head, _, sent = peer.requests[0].partition(b"\r\n\r\n")
    assert sent == body
    assert head.split(b"\r\n") == [
        b"POST /v1/x HTTP/1.1",
        f"Host: 127.0.0.1:{peer.port}".encode(),
        b"A: b",
        b"Content-Length: 8",
    ]


def test_chunked_close_and_http10_answers(peer_of: Callable[[Script], Peer]) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        _answer(b"closing", "Connection: close"),
        b"HTTP/1.0 404 Not Found\r\n\r\nto the end",
    ]

    def script(peer: socket.socket, n: int) -> bool:
        peer.sendall(answers[n - 1])
        return n == 1

    peer = peer_of(script)
    conn = Connection("127.0.0.1", peer.port, tls=False, timeout_s=10)
    first, closed = conn.request("GET", "/a", {}, None, 1000)
    assert (first.body, closed) == (b"abcde", False)
    second, closed = conn.request("GET", "/b", {}, None, 1000)
    assert (second.body, closed) == (b"closing", True)
    third, closed = conn.request("GET", "/c", {}, None, 1000)
    assert (third.status, third.body, closed) == (404, b"to the end", True)
    assert peer.connections == 2


def test_an_answer_over_the_limit_is_cut_and_its_connection_dropped(
    peer_of: Callable[[Script], Peer],
) -> None:
    def script(peer: socket.socket, _n: int) -> bool:
        peer.sendall(_answer(b"x" * 100))
        return True

    peer = peer_of(script)
    conn = Connection("127.0.0.1", peer.port, tls=False, timeout_s=10)
    answer, closed = conn.request("GET", "/big", {}, None, 10)
    assert (len(answer.body), closed) == (11, True)


@pytest.mark.parametrize(
    "reply",
    [
        b"NOT HTTP\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort",
        b"",
    ],
)
def test_a_broken_answer_is_a_connection_error(
    peer_of: Callable[[Script], Peer], reply: bytes
) -> None:
    def script(peer: socket.socket, _n: int) -> bool:
        peer.sendall(reply)
        return False

    peer = peer_of(script)
    conn = Connection("127.0.0.1", peer.port, tls=False, timeout_s=10)
    with pytest.raises(ConnectionError):
        conn.request("GET", "/", {}, None, 1000)


def test_trailers_without_end_are_refused_not_read_forever(
    peer_of: Callable[[Script], Peer],
) -> None:
    def script(peer: socket.socket, _n: int) -> bool:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
        peer.sendall(head + b"T: x\r\n" * 200)
        return True  # the connection stays open: a reader that goes on waits for more

    peer = peer_of(script)
    conn = Connection("127.0.0.1", peer.port, tls=False, timeout_s=30)
    with pytest.raises(ConnectionError, match="trailers"):
        conn.request("GET", "/", {}, None, 1000)


@pytest.mark.parametrize(
    ("target", "headers"),
    [("/a b", {}), ("/a\r\nX: y", {}), ("/a", {"X": "1\r\nInjected: 2"}), ("/é", {})],
)
def test_a_request_that_would_be_two_is_refused_unsent(
    peer_of: Callable[[Script], Peer], target: str, headers: dict[str, str]
) -> None:
    peer = peer_of(lambda _p, _n: True)
    conn = Connection("127.0.0.1", peer.port, tls=False, timeout_s=10)
    with pytest.raises(ValueError):
        conn.request("GET", target, headers, None, 1000)
    assert peer.connections == 0


def test_an_idle_connection_the_server_closed_is_replaced_without_a_retry(
    peer_of: Callable[[Script], Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes a keep-alive connection after its idle time (`execkit serve`: 5 s).
    The next request goes on a new connection at once: not written into the closed one,
    lost, and sent again after the client's pause."""
    monkeypatch.setattr(execkit._http1, "_CHECK_IDLE_S", 0.0)
    closed_by_server = threading.Event()

    def script(peer: socket.socket, _n: int) -> bool:
        peer.sendall(_answer(b"{}"))
        peer.close()  # after each answer, as after an idle timeout
        closed_by_server.set()
        return False

    peer = peer_of(script)
    transport = HTTPTransport(f"http://127.0.0.1:{peer.port}", timeout_s=10)
    request = HttpRequest("POST", "/v1/x", {"Idempotency-Key": "k"}, b"{}")
    assert transport.send(request).status == 200
    assert closed_by_server.wait(10)
    assert transport.send(request).status == 200
    transport.close()
    assert (peer.connections, len(peer.requests)) == (2, 2)


def test_closing_a_connection_ends_a_read_another_thread_waits_in(
    peer_of: Callable[[Script], Peer],
) -> None:
    # A long poll (the dispatcher's wake-up wait) is reading when the dispatcher stops and
    # closes its client: the close must end that read, not wait for the answer (it waited
    # for the whole poll, 20 s, per stopped dispatcher).
    peer = peer_of(lambda _peer, _n: True)  # reads the request, never answers
    conn = Connection("127.0.0.1", peer.port, tls=False, timeout_s=3600)
    failed: list[BaseException] = []

    def poll() -> None:
        try:
            conn.request("GET", "/v1/wake/wait", {}, None, 1000)
        except BaseException as exc:
            failed.append(exc)

    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    for _ in range(6000):  # until the request is on the wire and the reader is reading
        if peer.requests:
            break
        threading.Event().wait(0.01)
    closer = threading.Thread(target=conn.close, daemon=True)
    closer.start()
    closer.join(60)
    reader.join(60)
    assert not closer.is_alive() and not reader.is_alive()
    assert [type(exc) for exc in failed] == [ConnectionError]
