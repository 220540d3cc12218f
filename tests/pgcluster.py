"""A throwaway PostgreSQL cluster for the test run: a temp directory, a Unix socket in it.

    python tests/pgcluster.py --run -- CMD...   start a cluster, run CMD with
                                                TEST_PG_CLUSTER naming it, stop it
                                                (whatever CMD does, a signal included)

`Cluster.start()` runs initdb (trust authentication, local socket only), `pg_ctl start -w`
with a bounded timeout and creates the `execkit` database; `Cluster.stop()` runs `pg_ctl
stop -m fast`, then `-m immediate`, then kills the postmaster, and removes the directory.
Every started cluster is stopped at interpreter exit (atexit) and by a small watchdog
process that stops it if the process that started it dies without doing so (SIGKILL).
When euid is 0 the server runs as the `postgres` user (initdb refuses root).

The pytest fixtures (tests/conftest.py) reuse the cluster named by TEST_PG_CLUSTER
when `--run` started one, else start their own for the session.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ENV_VAR = "TEST_PG_CLUSTER"
INSTALL_HINT = "apt-get install postgresql"
DATABASE = "execkit"
SUPERUSER = "postgres"
PORT = 5432  # only names the socket file: the cluster listens on no TCP port
_TIMEOUT_S = 60

_BINARIES = ("initdb", "pg_ctl", "postgres")


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres: $TEST_PG_BINDIR when set (and
    then only it: `TEST_PG_BINDIR=/nowhere` runs the suite as on a machine without a
    server), else the one pg_ctl on PATH lives in, else the newest /usr/lib/postgresql/*/bin."""
    candidates: list[Path] = []
    if "TEST_PG_BINDIR" in os.environ:
        chosen = Path(os.environ["TEST_PG_BINDIR"])
        return chosen if all((chosen / name).is_file() for name in _BINARIES) else None
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in path.parent.name.split(".") if p.isdigit())

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for candidate in candidates:
        if all((candidate / name).is_file() for name in _BINARIES):
            return candidate
    return None


def _server_user() -> str | None:
    """The user the server runs as: `postgres` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise RuntimeError(
            "running as root, and initdb refuses root: create a `postgres` user "
            f"({INSTALL_HINT} does)"
        ) from None
    return SUPERUSER


class Cluster:
    """One PostgreSQL cluster in `base` (data in base/data, the socket in base)."""

    def __init__(self, base: Path, bindir: Path, *, owned: bool = True) -> None:
        self.base = base
        self.bindir = bindir
        self.data = base / "data"
        self.log = base / "server.log"
        self.owned = owned  # stop() only stops a cluster this process started
        self._stopped = False

    # -- describing ---------------------------------------------------------------------

    def url(self, database: str = DATABASE, **params: str) -> str:
        """A libpq URL for `database` over the cluster's socket (extra query parameters,
        e.g. options="-csearch_path=s1", are URL-encoded)."""
        query = urllib.parse.urlencode({"host": str(self.base), "port": str(PORT), **params})
        return f"postgresql://{SUPERUSER}@/{database}?{query}"

    def to_env(self) -> str:
        return json.dumps({"base": str(self.base), "bindir": str(self.bindir)})

    @classmethod
    def from_env(cls, value: str) -> Cluster:
        found = json.loads(value)
        return cls(Path(found["base"]), Path(found["bindir"]), owned=False)

    # -- running ------------------------------------------------------------------------

    def _run(self, *argv: str, timeout: float = _TIMEOUT_S, check: bool = True) -> str:
        done = subprocess.run(
            [str(self.bindir / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            user=_server_user(),
            cwd=self.base,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{argv[0]} failed ({done.returncode}): {done.stderr.strip() or done.stdout}\n"
                + self.log_tail()
            )
        return done.stdout

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "server log:\n" + "\n".join(text.splitlines()[-lines:])

    @classmethod
    def start(cls, bindir: Path | None = None) -> Cluster:
        """initdb, pg_ctl start -w, createdb; stopped at exit and if this process dies."""
        found = bindir or find_bindir()
        if found is None:
            raise FileNotFoundError(f"no PostgreSQL server binaries: {INSTALL_HINT}")
        base = Path(tempfile.mkdtemp(prefix="execkit-pg-"))
        cluster = cls(base, found)
        atexit.register(cluster.stop)
        user = _server_user()
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        try:
            cluster._run(
                "initdb",
                "--pgdata",
                str(cluster.data),
                "--auth=trust",
                f"--username={SUPERUSER}",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )
            settings = {
                "listen_addresses": "''",
                "unix_socket_directories": f"'{base}'",
                "port": str(PORT),
                "max_connections": "200",
                # A crash of the server process loses nothing without fsync (the kernel
                # keeps what was written); only the machine crashing would.
                "fsync": "off",
                "shared_buffers": "64MB",
                "log_min_messages": "warning",
                "deadlock_timeout": "200ms",
            }
            with (cluster.data / "postgresql.conf").open("a") as conf:
                conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
            cluster._watch()
            cluster._pg_ctl_start()
            cluster._run(
                "createdb", "--host", str(base), "--port", str(PORT), "-U", SUPERUSER, DATABASE
            )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _pg_ctl_start(self) -> None:
        self._run(
            "pg_ctl", "start", "--pgdata", str(self.data), "--log", str(self.log),
            "--wait", f"--timeout={_TIMEOUT_S}",
        )  # fmt: skip

    def restart(self, mode: str = "immediate") -> None:
        """`pg_ctl restart -m MODE` (immediate: a crash, then recovery), waiting until the
        server accepts connections again."""
        self._run(
            "pg_ctl", "restart", "--pgdata", str(self.data), "--log", str(self.log),
            "--mode", mode, "--wait", f"--timeout={_TIMEOUT_S}",
        )  # fmt: skip

    def _watch(self) -> None:
        """A detached watchdog that stops the cluster once this process is gone."""
        subprocess.Popen(
            [sys.executable, __file__, "--watch", str(os.getpid()), self.to_env()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        """Stop the server (fast, then immediate, then SIGKILL) and remove its directory."""
        if self._stopped or not self.owned:
            return
        self._stopped = True
        if self.data.exists():
            for mode in ("fast", "immediate"):
                with contextlib.suppress(Exception):
                    self._run(
                        "pg_ctl", "stop", "--pgdata", str(self.data), "--mode", mode,
                        "--wait", "--timeout=30", timeout=40,
                    )  # fmt: skip
                if self._postmaster_pid() is None:
                    break
            pid = self._postmaster_pid()
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def cluster_url() -> Iterator[str]:
    """The URL of the cluster `--run` started (named in the environment), else of one
    started here and stopped on leaving: what a benchmark that needs a server runs on."""
    if os.environ.get(ENV_VAR):
        yield Cluster.from_env(os.environ[ENV_VAR]).url()
        return
    own = Cluster.start()
    try:
        yield own.url()
    finally:
        own.stop()


def _watch(parent: int, cluster: Cluster) -> int:
    """The watchdog's body: wait for `parent` to go, then stop the cluster if it is still
    there (the parent normally stops it itself; then there is nothing left to do)."""
    cluster.owned = True
    while True:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        if not cluster.base.exists():
            return 0
        time.sleep(0.5)
    cluster.stop()
    return 0


def _run_wrapped(command: Sequence[str]) -> int:
    """Run `command` with a cluster named in its environment; stop the cluster afterwards,
    also when the command or this wrapper is interrupted (SIGINT, SIGTERM, SIGHUP)."""
    if not command:
        raise SystemExit("usage: pgcluster.py --run -- CMD...")
    env = dict(os.environ)
    cluster: Cluster | None = None
    if find_bindir() is None:
        print(f"pgcluster: no PostgreSQL server binaries ({INSTALL_HINT})", file=sys.stderr)
    else:
        cluster = Cluster.start()
        env[ENV_VAR] = cluster.to_env()
    child = subprocess.Popen(list(command), env=env)

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        code = child.wait()
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says it
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if cluster is not None:
            cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run CMD (after --) with a cluster")
    parser.add_argument("--watch", nargs=2, metavar=("PID", "CLUSTER"), help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="*")
    args = parser.parse_args(argv)
    if args.watch:
        return _watch(int(args.watch[0]), Cluster.from_env(args.watch[1]))
    if args.run:
        return _run_wrapped(args.command)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
