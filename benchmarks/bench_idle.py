"""`/healthz` of `execkit serve` while clients hold more connections than it serves: 1,100
that send nothing, then 1,100 that send a header line every 5 s (a slowloris), each opened
again as soon as the server closes it, so that the count stays held.

    python benchmarks/bench_idle.py [--connections N] [--probes N] [--hold S]

`execkit serve` runs as a process of its own with its defaults (`--max-connections 1024`,
`--idle-timeout 5`, `--head-timeout 10`). One thread of this process holds the
connections (a selector, re-opening each one the server closed); the main thread sends
`--probes` `GET /healthz`, each on a new connection, one after the other, spread over
`--hold` seconds, and `GET /v1/capabilities` on a new connection and on a keep-alive one
opened before the others. The figures: each probe's time from connect to the whole answer
(median, 95th percentile, max), the answers' statuses, and how many of the held
connections the server closed (the idle and head timeouts at work). Before any is held,
the same probes give the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import selectors
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Holder:
    """`count` connections to (host, port), each opened again when the server closes it;
    with `trickle_s`, each sends a request line, then a header line every `trickle_s`."""

    def __init__(self, address: tuple[str, int], count: int, trickle_s: float | None) -> None:
        self.address = address
        self.count = count
        self.trickle_s = trickle_s
        self.closed_by_server = 0
        self.answers: Counter[str] = Counter()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Holder:
        self._thread.start()
        if not self._ready.wait(120):
            raise SystemExit("the connections could not be opened")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _open(self, selector: selectors.DefaultSelector, due: dict[socket.socket, float]) -> None:
        sock = socket.create_connection(self.address, timeout=30)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        if self.trickle_s is not None:
            sock.send(b"GET /v1/tasks HTTP/1.1\r\nHost: bench\r\n")
            due[sock] = time.monotonic() + self.trickle_s

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        due: dict[socket.socket, float] = {}
        for _ in range(self.count):
            self._open(selector, due)
        self._ready.set()
        line = 0
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data.startswith(b"HTTP/1.1 "):
                    self.answers[data[9:12].decode()] += 1
                with contextlib.suppress(OSError):
                    while data:  # read to the close
                        data = sock.recv(65536)
                selector.unregister(sock)
                due.pop(sock, None)
                sock.close()
                self.closed_by_server += 1
                self._open(selector, due)
            now = time.monotonic()
            for sock, when in list(due.items()):
                if when <= now:
                    line += 1
                    with contextlib.suppress(OSError):
                        sock.send(b"X-Trickle-%d: a\r\n" % line)
                    due[sock] = now + (self.trickle_s or 0)
        for key in list(selector.get_map().values()):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            sock.close()
        selector.close()


def _probe(address: tuple[str, int], path: str, token: str | None = None) -> tuple[float, int]:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n{auth}Connection: close\r\n\r\n"
    start = time.perf_counter()
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(request.encode())
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    elapsed = time.perf_counter() - start
    return elapsed, int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else 0


class Kept:
    """A keep-alive connection opened before the others are held, asking for
    `/v1/capabilities` at least once a second (within the idle timeout); a request that
    found it closed counts as status 0 (http.client opens it again for the next)."""

    def __init__(self, address: tuple[str, int], token: str) -> None:
        self._conn = http.client.HTTPConnection(*address, timeout=30)
        self._auth = {"Authorization": f"Bearer {token}"}
        self._last = 0.0
        self.statuses: Counter[int] = Counter()
        self.ask()

    def ask(self) -> None:
        try:
            self._conn.request("GET", "/v1/capabilities", headers=self._auth)
            answer = self._conn.getresponse()
            answer.read()
            self.statuses[answer.status] += 1
        except (http.client.HTTPException, OSError):
            # Closed by the server (idle longer than its timeout while a probe waited):
            # counted, and opened again.
            self.statuses[0] += 1
            self._conn.close()
        self._last = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() - self._last >= 1.0:
            self.ask()

    def close(self) -> None:
        self._conn.close()


def _probes(
    address: tuple[str, int], count: int, spread_s: float, kept: Kept
) -> tuple[list[float], Counter[int]]:
    times: list[float] = []
    statuses: Counter[int] = Counter()
    pause = spread_s / count
    for _ in range(count):
        elapsed, status = _probe(address, "/healthz")
        times.append(elapsed)
        statuses[status] += 1
        kept.tick()
        time.sleep(pause)
    return times, statuses


def _row(name: str, times: list[float], statuses: Counter[int], extra: str) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    shown = ", ".join(f"{status}: {n}" for status, n in sorted(statuses.items()))
    return (
        f"| {name} | {statistics.median(times) * 1e3:.2f} ms | {p95 * 1e3:.2f} ms | "
        f"{max(times) * 1e3:.2f} ms | {shown} | {extra} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--hold", type=float, default=15.0, help="seconds each phase lasts")
    opts = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = opts.connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    sys.path.insert(0, str(REPO))
    from execkit.server import add_token

    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="execkit-bench-idle-") as scratch:
        tokens = Path(scratch) / "tokens.json"
        token = add_token(tokens, "bench")
        argv = [sys.executable, "-m", "execkit", "serve", "--db", f"{scratch}/ledger.db"]
        argv += ["--tokens", str(tokens), "--listen", "127.0.0.1:0", "--json"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        server = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True
        )
        try:
            assert server.stdout is not None
            url = json.loads(server.stdout.readline())["url"]
            host, port = url.removeprefix("http://").rsplit(":", 1)
            address = (host, int(port))
            kept = Kept(address, token)
            times, statuses = _probes(address, opts.probes, 2.0, kept)
            rows.append(_row("none held", times, statuses, "-"))
            for name, trickle in (("idle", None), ("a header line every 5 s", 5.0)):
                kept.statuses.clear()
                with Holder(address, opts.connections, trickle) as holder:
                    times, statuses = _probes(address, opts.probes, opts.hold, kept)
                    _, fresh = _probe(address, "/v1/capabilities", token)
                    extra = (
                        f"closed by the server: {holder.closed_by_server} "
                        f"(answered: {dict(holder.answers) or 'none'}); the API on a new "
                        f"connection: {fresh}, on one held before: {dict(kept.statuses)}"
                    )
                    label = f"{opts.connections:,} {name}"
                    rows.append(_row(label, times, statuses, extra))
                kept.ask()
            kept.close()
        finally:
            server.send_signal(2)
            server.wait(timeout=60)
    print(f"$ {shlex.join([sys.executable, *sys.argv])}\n")
    print(
        f"GET /healthz on a new connection, {opts.probes} one after the other over "
        f"{opts.hold:g} s, while the connections are held (execkit serve's defaults)\n"
    )
    print("| connections held | median | p95 | max | statuses | the held connections |")
    print("|---|---:|---:|---:|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
