"""Per-request overhead of `execkit serve` against a minimal Starlette app on the same
uvicorn, with each HTTP parser uvicorn can use here (h11; httptools when installed).

    python benchmarks/bench_http.py [--requests N] [--rounds N]

Each server runs in a process of its own on 127.0.0.1 (a free port), configured as
`execkit serve` configures uvicorn (`execkit.server._serve._config`): with httptools,
execkit runs its own protocol (`execkit.server._protocol`: the connection's bounds, the
API's requests served from the parser's callbacks, `execkit.server._api_cycle`) and the
minimal app uvicorn's; with h11 both run uvicorn's (`execkit serve` itself no longer runs
on h11: the row is kept as a point of comparison).
One keep-alive client (http.client, in this process) sends `--requests` sequential `GET`s
per round, servers in a rotating order; the figure is the median per request over the
rounds. execkit answers an authenticated `GET /v1/capabilities` (token check, role gate,
the ledger's schema and id, in a worker thread); the minimal app answers `GET /` with a
JSON document of the same size. The overhead is execkit's time less the
minimal app's with the same parser (target <= 0.2 ms).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_SERVE = """
import sys, uvicorn
sys.path.insert(0, sys.argv[1])
kind, http_impl, port = sys.argv[2], sys.argv[3], int(sys.argv[4])
from execkit.server import _serve
if kind == "execkit":
    from execkit.ledger import open_ledger
    from execkit.server._app import LedgerApp
    from execkit.server._tokens import TokenFile
    app = LedgerApp(open_ledger(sys.argv[5]), TokenFile(sys.argv[6]))
    config = _serve._config(app, _serve.DEFAULT_LIMITS)
else:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    body = {"capabilities": ["x" * 20] * 6, "schema_version": 3, "ledger_id": "0" * 32}
    async def hello(request):
        return JSONResponse(body)
    minimal = Starlette(routes=[Route("/", hello)])
    # The same uvicorn configuration, serving the minimal app where execkit's front is.
    fake = type("App", (), {"front": type("Front", (), {"asgi": minimal}), "request_timeout_s": 60})
    config = _serve._config(fake(), _serve.DEFAULT_LIMITS)
if kind == "minimal" or http_impl == "h11":
    config.http = http_impl  # uvicorn's own protocol
# else: execkit's httptools protocol, as `execkit serve` runs it (the API's own cycle)
config.port = port
uvicorn.Server(config).run()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(port: int, path: str, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path, headers=headers)
            answer = conn.getresponse()
            answer.read()
            conn.close()
            if answer.status != 200:
                raise SystemExit(f"GET {path} answered {answer.status}")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _per_request(port: int, path: str, headers: dict[str, str], requests: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start = time.perf_counter()
    for _ in range(requests):
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        answer.read()
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    opts = parser.parse_args()
    impls = ["h11"] + (["httptools"] if importlib.util.find_spec("httptools") else [])
    sys.path.insert(0, str(REPO))
    from execkit.ledger import open_ledger
    from execkit.server import add_token

    procs: list[subprocess.Popen[bytes]] = []
    servers: dict[str, tuple[int, str, dict[str, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="execkit-bench-http-") as scratch:
        db, tokens = Path(scratch) / "ledger.db", Path(scratch) / "tokens.json"
        with open_ledger(str(db)):
            pass
        token = add_token(tokens, "bench")
        auth = {"Authorization": f"Bearer {token}"}
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        try:
            for impl in impls:
                for kind in ("minimal", "execkit"):
                    port = _free_port()
                    argv = [sys.executable, "-c", _SERVE, str(REPO), kind, impl, str(port)]
                    argv += [str(db), str(tokens)]
                    procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL))
                    path, headers = ("/v1/capabilities", auth) if kind == "execkit" else ("/", {})
                    _wait(port, path, headers)
                    servers[f"{kind} ({impl})"] = (port, path, headers)
            for port, path, headers in servers.values():
                _per_request(port, path, headers, opts.requests)  # warm-up
            times: dict[str, list[float]] = {name: [] for name in servers}
            names = list(servers)
            for round_no in range(opts.rounds):
                shift = round_no % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name].append(_per_request(*servers[name], opts.requests))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    print(f"$ {shlex.join([sys.executable, *sys.argv])}\n")
    print(f"{opts.rounds} rounds of {opts.requests} keep-alive GETs, median per request\n")
    print("| parser | minimal Starlette app | execkit (authenticated) | overhead | target |")
    print("|---|---:|---:|---:|---|")
    for impl in impls:
        floor, ours = medians[f"minimal ({impl})"], medians[f"execkit ({impl})"]
        print(
            f"| {impl} | {floor * 1e3:.3f} ms | {ours * 1e3:.3f} ms | "
            f"{(ours - floor) * 1e3:+.3f} ms | <= 0.2 ms |"
        )


if __name__ == "__main__":
    main()
