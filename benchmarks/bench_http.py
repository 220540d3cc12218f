"""Per-request overhead of `execkit serve` against a minimal Starlette app on the same
uvicorn, with each HTTP parser uvicorn can use here (h11; httptools when installed); with
`--others`, the same two apps on granian and hypercorn too, where they are installed.

    python benchmarks/bench_http.py [--requests N] [--rounds N] [--others]

Each server runs in a process of its own on 127.0.0.1 (a free port), configured as
`execkit serve` configures uvicorn (`execkit.server._serve._config`): with httptools,
execkit runs its own protocol (`execkit.server._protocol`: the connection's bounds, the
API's requests served from the parser's callbacks, `execkit.server._api_cycle`) and the
minimal app uvicorn's; with h11 both run uvicorn's (`execkit serve` itself no longer runs
on h11: the row is kept as a point of comparison). On granian (one worker, HTTP/1.1) and
hypercorn (asyncio) execkit's application runs as any ASGI application (`front.asgi`: the
API's requests through Starlette and the access-log middleware), since neither can run
execkit's protocol; neither is a dependency of execkit (`pip install granian hypercorn`
into the environment to measure them).
One keep-alive client (http.client, in this process) sends `--requests` sequential `GET`s
per round, servers in a rotating order; the figure is the median per request over the
rounds. execkit answers an authenticated `GET /v1/capabilities` (token check, role gate,
the ledger's schema and id, in a worker thread); the minimal app answers `GET /` with a
JSON document of the same size. The overhead is execkit's time less the
minimal app's with the same server and parser (target <= 0.2 ms on uvicorn and httptools,
what `execkit serve` runs).
"""

from __future__ import annotations

import argparse
import contextlib
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

import psutil

REPO = Path(__file__).resolve().parent.parent

_SERVE = """
import os, sys
sys.path.insert(0, sys.argv[1])
kind, impl, port = sys.argv[2], sys.argv[3], int(sys.argv[4])
db, tokens = sys.argv[5], sys.argv[6]


def execkit_app():
    from execkit.ledger import open_ledger
    from execkit.server._app import LedgerApp
    from execkit.server._tokens import TokenFile
    return LedgerApp(open_ledger(os.environ["BENCH_DB"]), TokenFile(os.environ["BENCH_TOKENS"]))


def minimal_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    body = {"capabilities": ["x" * 20] * 6, "schema_version": 3, "ledger_id": "0" * 32}
    async def hello(request):
        return JSONResponse(body)
    return Starlette(routes=[Route("/", hello)])


def asgi():  # granian's factory: the application to serve
    return execkit_app().front.asgi if kind == "execkit" else minimal_app()


if __name__ == "__main__":
    os.environ["BENCH_DB"], os.environ["BENCH_TOKENS"] = db, tokens
    if impl == "granian":
        from granian import Granian
        from granian.constants import HTTPModes, Interfaces
        Granian(
            target="bench_http_serve:asgi", factory=True, interface=Interfaces.ASGI,
            port=port, http=HTTPModes.http1, workers=1, log_enabled=False,
        ).serve()
    elif impl == "hypercorn":
        import asyncio
        from hypercorn.asyncio import serve
        from hypercorn.config import Config
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = config.errorlog = None
        asyncio.run(serve(asgi(), config))
    else:
        import uvicorn
        from execkit.server import _serve
        if kind == "execkit":
            config = _serve._config(execkit_app(), _serve.DEFAULT_LIMITS)
        else:
            front = type("Front", (), {"asgi": minimal_app()})
            fake = type("App", (), {"front": front, "request_timeout_s": 60})
            # The same uvicorn configuration, serving the minimal app where execkit's is.
            config = _serve._config(fake(), _serve.DEFAULT_LIMITS)
        if kind == "minimal" or impl == "h11":
            config.http = impl  # uvicorn's own protocol
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


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) of process `pid` and its children (granian's worker)."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


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
    parser.add_argument(
        "--others", action="store_true", help="granian and hypercorn too, where installed"
    )
    opts = parser.parse_args()
    impls = ["h11"] + (["httptools"] if importlib.util.find_spec("httptools") else [])
    if opts.others:
        impls += [name for name in ("granian", "hypercorn") if importlib.util.find_spec(name)]
    sys.path.insert(0, str(REPO))
    from execkit.ledger import open_ledger
    from execkit.server import add_token

    procs: list[subprocess.Popen[bytes]] = []
    servers: dict[str, tuple[int, str, dict[str, str]]] = {}
    pids: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="execkit-bench-http-") as scratch:
        db, tokens = Path(scratch) / "ledger.db", Path(scratch) / "tokens.json"
        with open_ledger(str(db)):
            pass
        token = add_token(tokens, "bench")
        auth = {"Authorization": f"Bearer {token}"}
        # The server's script as a module (granian imports its application by name).
        script = Path(scratch) / "bench_http_serve.py"
        script.write_text(_SERVE, encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), scratch])}
        try:
            for impl in impls:
                for kind in ("minimal", "execkit"):
                    port = _free_port()
                    argv = [sys.executable, str(script), str(REPO), kind, impl, str(port)]
                    argv += [str(db), str(tokens)]
                    procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL))
                    path, headers = ("/v1/capabilities", auth) if kind == "execkit" else ("/", {})
                    _wait(port, path, headers)
                    servers[f"{kind} ({impl})"] = (port, path, headers)
                    pids[f"{kind} ({impl})"] = procs[-1].pid
            for port, path, headers in servers.values():
                _per_request(port, path, headers, opts.requests)  # warm-up
            times: dict[str, list[float]] = {name: [] for name in servers}
            cpu: dict[str, float] = dict.fromkeys(servers, 0.0)
            names = list(servers)
            for round_no in range(opts.rounds):
                shift = round_no % len(names)
                for name in names[shift:] + names[:shift]:
                    before = _cpu_s(pids[name])
                    times[name].append(_per_request(*servers[name], opts.requests))
                    cpu[name] += _cpu_s(pids[name]) - before
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    per_cpu = {name: spent / (opts.rounds * opts.requests) for name, spent in cpu.items()}
    print(f"$ {shlex.join([sys.executable, *sys.argv])}\n")
    print(
        f"{opts.rounds} rounds of {opts.requests} keep-alive GETs: the median time per "
        "request, and the server's CPU time per request (its processes, user and system; "
        "less moved by other work on the machine)\n"
    )
    print(
        "| server | minimal Starlette app | execkit (authenticated) | overhead | target | "
        "server CPU: minimal / execkit |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for impl in impls:
        floor, ours = medians[f"minimal ({impl})"], medians[f"execkit ({impl})"]
        name = {"h11": "uvicorn, h11", "httptools": "uvicorn, httptools"}.get(impl, impl)
        target = "<= 0.2 ms" if impl == "httptools" else "-"
        cpu_floor, cpu_ours = per_cpu[f"minimal ({impl})"], per_cpu[f"execkit ({impl})"]
        print(
            f"| {name} | {floor * 1e3:.3f} ms | {ours * 1e3:.3f} ms | "
            f"{(ours - floor) * 1e3:+.3f} ms | {target} | "
            f"{cpu_floor * 1e3:.3f} / {cpu_ours * 1e3:.3f} ms |"
        )


if __name__ == "__main__":
    main()
