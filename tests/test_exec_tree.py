"""No process left behind: what a child leaves in its tree ends with it (real processes).

Each containment mechanism execkit can use here is forced in turn (`cgroup`, `subreaper`,
`session`; one this machine lacks is skipped), and every case checks, by bounded polling,
that the recorded pids are gone afterwards, or still there with `keep_descendants`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import NamedTuple, TypeVar

import kept_tails
import psutil
import pytest
from _support import (
    REPO,
    daemonizing_agent,
    gone,
    kill_marked,
    marked_left,
    wait_gone,
    written_pids,
)

import execkit._redact as _redact
from execkit._exec import TREE_MECHANISMS, TreeMechanism, spawn, tree, tree_mechanism
from execkit._exec import result as exec_result
from execkit._exec import tail as exec_tail
from execkit._exec.tree import cgroup
from execkit._redact import gate

PY = [sys.executable, "-I", "-S"]
T = TypeVar("T")
EXECKIT = [sys.executable, "-m", "execkit"]

# Writes its pids, one a line, to the file argv[1] (atomically, when all are started).
_WRITE_PIDS = """
import os, sys
def write_pids(path, pids):
    with open(path + ".tmp", "w") as f:
        f.write("".join(f"{p}\\n" for p in pids))
    os.replace(path + ".tmp", path)
"""

# A double-forked daemon (fork, setsid, fork; the middle one exits at once), made after
# argv[2] seconds; the child itself then stays argv[3] seconds more and exits 0.
DAEMON = (
    _WRITE_PIDS
    + """
import time
time.sleep(float(sys.argv[2]))
read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(read)
        os.write(write, str(os.getpid()).encode())
        os.close(write)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.close(write)
daemon = int(os.read(read, 64))
os.wait()
write_pids(sys.argv[1], [daemon])
time.sleep(float(sys.argv[3]))
"""
)

# Ignores SIGTERM; on it, forks argv[2] children that each leave the session (setsid) and
# sleep, writes their pids, then exits at once when argv[3] is "exit", else sleeps on.
FORKS_IN_GRACE = (
    _WRITE_PIDS
    + """
import signal, time
def on_term(_signum, _frame):
    pids = []
    for _ in range(int(sys.argv[2])):
        pid = os.fork()
        if pid == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(300)
            os._exit(0)
        pids.append(pid)
    write_pids(sys.argv[1], pids)
    if sys.argv[3] == "exit":
        os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
for _ in range(600):
    time.sleep(0.5)
"""
)

# For `execkit run`: a background job in the child's session and a double-forked daemon,
# their pids and the child's written to argv[1], then "ready", then sleep.
TREE = (
    _WRITE_PIDS
    + """
import subprocess, time
job = subprocess.Popen(["sleep", "300"])
read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(write, str(os.getpid()).encode())
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.close(write)
daemon = int(os.read(read, 64))
os.wait()
write_pids(sys.argv[1], [os.getpid(), job.pid, daemon])
print("ready", flush=True)
time.sleep(300)
"""
)


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def zombie_children() -> list[int]:
    """This process's children that died and that nobody reaped."""
    return [
        child.pid for child in psutil.Process().children() if child.status() == psutil.STATUS_ZOMBIE
    ]


@pytest.fixture(params=[m.value for m in TREE_MECHANISMS])
def mechanism(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each mechanism in turn, forced for the spawns of the test."""
    name: str = request.param
    if not tree.force_mechanism(name):
        pytest.skip(f"the {name} mechanism is not available here")
    try:
        yield name
    finally:
        tree.force_mechanism(None)


def _mechanisms_that_find_orphans(name: str) -> None:
    if name == TreeMechanism.SESSION:
        pytest.skip("the session mechanism cannot find a daemon that left the session")


# ------------------------------------------------------------------------ a normal exit


def test_a_background_grandchild_ends_with_the_child(mechanism: str) -> None:
    result = spawn(["sh", "-c", "sleep 300 & echo $!; exit 0"], timeout=60)
    grandchild = int(result.stdout_tail)
    try:
        assert result.ok
        assert wait_gone(grandchild), "the background job outlived its shell"
        assert result.tree_mechanism in TREE_MECHANISMS
    finally:
        kill_all([grandchild])


@pytest.mark.parametrize(
    ("made_after", "lingers"),
    [(0.0, 0.0), (0.0, 0.3), (0.2, 0.1)],
    ids=["made-at-once-child-exits", "made-at-once-child-lingers", "made-later"],
)
def test_a_double_forked_daemon_ends_with_the_child(
    mechanism: str, tmp_path: Path, made_after: float, lingers: float
) -> None:
    _mechanisms_that_find_orphans(mechanism)
    pidfile = tmp_path / "pids"
    try:
        result = spawn([*PY, "-c", DAEMON, str(pidfile), str(made_after), str(lingers)], timeout=60)
        assert result.ok, result
        (daemon,) = read_pids(pidfile)
        assert wait_gone(daemon), "the daemon outlived the child that made it"
        assert zombie_children() == [], "an adopted orphan was left unreaped"
    finally:
        kill_all(read_pids(pidfile))


def test_keep_descendants_leaves_them_running(mechanism: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    result = spawn(
        [*PY, "-c", DAEMON, str(pidfile), "0.0", "0.2"], timeout=60, keep_descendants=True
    )
    job = spawn(["sh", "-c", "sleep 300 & echo $!"], timeout=60, keep_descendants=True)
    kept = [*read_pids(pidfile), int(job.stdout_tail)]
    try:
        assert result.ok and job.ok
        time.sleep(0.2)
        assert len(kept) == 2 and not any(gone(pid) for pid in kept)
    finally:
        kill_all(kept)
        for pid in kept:
            assert wait_gone(pid)


def test_the_result_says_which_mechanism_ran(mechanism: str) -> None:
    assert tree_mechanism() == mechanism
    quick = spawn(["true"])
    slow = spawn(["sleep", "0.2"])
    assert spawn(["no-such-program-execkit"]).tree_mechanism is None
    if mechanism == TreeMechanism.CGROUP:
        # A child is moved into its cgroup once it has run for a while; until then (and
        # for one that is done before) the subreaper holds its tree.
        assert quick.tree_mechanism == TreeMechanism.SUBREAPER
        assert slow.tree_mechanism == TreeMechanism.CGROUP
    else:
        assert quick.tree_mechanism == slow.tree_mechanism == mechanism


def test_a_cgroup_is_made_at_once_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if not tree.force_mechanism("cgroup"):
        pytest.skip("no cgroup v2 this process may write to")
    monkeypatch.setattr(cgroup, "_CGROUP_AFTER_S", 0.0)
    pidfile = tmp_path / "pids"
    try:
        result = spawn([*PY, "-c", DAEMON, str(pidfile), "0.0", "0.0"], timeout=60)
        assert result.tree_mechanism == TreeMechanism.CGROUP
        (daemon,) = read_pids(pidfile)
        assert wait_gone(daemon)
    finally:
        tree.force_mechanism(None)
        kill_all(read_pids(pidfile))


def test_concurrent_spawns_end_their_own_leftovers_and_nobody_elses(mechanism: str) -> None:
    # Threads spawning at once: one's sweep must never take (kill, or reap behind its
    # Popen's back) another's child, however its start and the sweep interleave.
    def one(index: int) -> tuple[bool, int]:
        if index % 2:
            result = spawn(["sh", "-c", "sleep 300 & echo $!; exit 0"], timeout=60)
            return result.ok, int(result.stdout_tail)
        result = spawn(["sh", "-c", "exit 3"], timeout=60)
        return result.exit_code == 3, 0

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(one, i) for i in range(24)]
        outcomes = [future.result(timeout=120) for future in futures]
    jobs = [job for _, job in outcomes if job]
    try:
        assert all(ok for ok, _ in outcomes)
        assert all(wait_gone(job) for job in jobs)
    finally:
        kill_all(jobs)


def test_finding_popens_never_breaks_a_tuple_another_thread_builds() -> None:
    # A spawn's sweep asks which pids live Popens wait for (`popen_owned`). Listing every
    # object for it (`gc.get_objects`) also listed a tuple another thread was building from
    # a generator, as `subprocess.Popen` does at each start, and that thread's `tuple(...)`
    # failed with SystemError (seen in CI as a spawn of `sh -c 'exit 3'` failing). With it,
    # the builder below failed within 9-21 calls; it must survive 300.
    from execkit._exec import proctable

    child = subprocess.Popen(["sleep", "30"])
    failures: list[BaseException] = []
    done = threading.Event()

    def build() -> None:
        while not done.is_set():
            try:
                tuple(str(n) for n in range(50))
            except SystemError as exc:
                failures.append(exc)
                return

    builder = threading.Thread(target=build)
    builder.start()
    try:
        for _ in range(300):
            owned = proctable.popen_owned()  # None while another test's Popen starts
            assert owned is None or child.pid in owned
            if failures:
                break
    finally:
        done.set()
        builder.join(timeout=60)
        child.kill()
        child.wait()
    assert failures == []


def _wait_until(predicate: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# A spawn that waits for the file argv[1] (at most a minute), for as long as a test needs
# one running: created first, then polled.
WAITS_FOR_FILE = 'for _ in $(seq 3000); do [ -e "$0" ] && exit 0; sleep 0.02; done'


@pytest.mark.parametrize("clear_env", [False, True], ids=["daemon-inherits-env", "env-i"])
def test_concurrent_spawns_each_end_the_daemons_they_left(
    mechanism: str, tmp_path: Path, clear_env: bool
) -> None:
    # Issue 44: four spawns from four threads, each child leaving a setsid daemon that is
    # re-parented to execkit at once. No spawn is ever alone while they end: another one
    # runs throughout (the keeper, started after the daemons so it can claim none of
    # them). Each spawn's daemon must be gone when the spawns have returned.
    _mechanisms_that_find_orphans(mechanism)
    marker = f"execkit-orphan-{os.getpid()}-{os.urandom(4).hex()}"
    go, stop, keeper_up = tmp_path / "go", tmp_path / "stop", tmp_path / "keeper-up"
    pidfiles = [tmp_path / f"daemon-{n}" for n in range(4)]
    wait_go = f'for _ in $(seq 3000); do [ -e "{go}" ] && exit 0; sleep 0.02; done'
    with ThreadPoolExecutor(max_workers=5) as pool:
        try:
            spawns = [
                pool.submit(
                    spawn,
                    [
                        "bash",
                        "-c",
                        daemonizing_agent(
                            f"{marker}-{n}", pidfiles[n], wait_go, clear_env=clear_env
                        ),
                    ],
                    timeout=120,
                )
                for n in range(4)
            ]
            _wait_until(lambda: len(written_pids(pidfiles)) == 4, "every daemon")
            # /proc tells when a process started to the clock tick: a keeper started in a
            # daemon's tick may have made it, as far as execkit can tell, and an unmarked
            # daemon then rightly waits for the keeper too (CI met it on a loaded machine).
            # Two ticks on, the keeper's start is after every daemon's.
            time.sleep(2 / os.sysconf("SC_CLK_TCK"))
            keeper = pool.submit(
                spawn,
                ["bash", "-c", f': > "{keeper_up}"; {WAITS_FOR_FILE}', str(stop)],
                timeout=120,
            )
            _wait_until(keeper_up.exists, "the keeper to start")
            go.touch()
            results = [future.result(timeout=120) for future in spawns]
            left = marked_left(marker)
            stop.touch()
            assert keeper.result(timeout=120).ok
        finally:
            go.touch()
            stop.touch()
            kill_marked(marker)
    assert all(result.ok for result in results), results
    assert left == [], f"{len(left)} of 4 daemons outlived the spawns that made them"
    assert zombie_children() == []


def test_a_spawn_that_keeps_its_descendants_keeps_its_daemon_beside_others(
    mechanism: str, tmp_path: Path
) -> None:
    # The marks cut both ways: the daemons of the spawns beside it end with them, and the
    # daemon of the one that keeps its descendants is nobody else's to end, also once that
    # spawn is over while the others still run and look at what execkit adopted.
    _mechanisms_that_find_orphans(mechanism)
    marker = f"execkit-orphan-{os.getpid()}-{os.urandom(4).hex()}"
    gos = [tmp_path / "go-keeper", tmp_path / "go-others"]
    pidfiles = [tmp_path / f"daemon-{n}" for n in range(4)]

    def agent(n: int) -> list[str]:
        go = gos[min(n, 1)]
        wait_go = f'for _ in $(seq 3000); do [ -e "{go}" ] && exit 0; sleep 0.02; done'
        return ["bash", "-c", daemonizing_agent(f"{marker}-{n}", pidfiles[n], wait_go)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        try:
            spawns = [
                pool.submit(spawn, agent(n), timeout=120, keep_descendants=n == 0) for n in range(4)
            ]
            _wait_until(lambda: len(written_pids(pidfiles)) == 4, "every daemon")
            gos[0].touch()
            keeping = spawns[0].result(timeout=120)
            gos[1].touch()
            results = [keeping, *(future.result(timeout=120) for future in spawns[1:])]
            left = marked_left(marker, within=2.0)
            kept = marked_left(f"{marker}-0", within=0.0)
        finally:
            for go in gos:
                go.touch()
            kill_marked(marker)
    assert all(result.ok for result in results), results
    assert len(kept) == 1 and left == kept, (left, kept)


def test_a_kept_daemon_evicted_from_its_cgroup_stays_kept_beside_other_spawns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Under `cgroup`, a spawn that keeps its descendants moves them out of its cgroup when
    # its child exits. Spawns still running beside it, not moved into cgroups of their own
    # (each looks at what execkit adopted when its child exits), must take that daemon for
    # a kept one: not end it, and it is reaped once it dies.
    if not tree.force_mechanism("cgroup"):
        pytest.skip("no cgroup v2 this process may write to")
    marker = f"execkit-orphan-{os.getpid()}-{os.urandom(4).hex()}"
    made, go_keeper, go_others = tmp_path / "make", tmp_path / "go-keeper", tmp_path / "go-2"
    child, pidfiles = tmp_path / "keeper-child", [tmp_path / f"daemon-{n}" for n in range(3)]

    def waits_for(path: Path) -> str:
        return f'for _ in $(seq 3000); do [ -e "{path}" ] && break; sleep 0.02; done'

    keeper_agent = f'printf "%s\\n" $$ > "{child}"; {waits_for(made)}; ' + daemonizing_agent(
        f"{marker}-0", pidfiles[0], waits_for(go_keeper)
    )
    with ThreadPoolExecutor(max_workers=3) as pool:
        try:
            keeping = pool.submit(
                spawn, ["bash", "-c", keeper_agent], timeout=120, keep_descendants=True
            )
            _wait_until(lambda: len(written_pids([child])) == 1, "the keeping spawn")
            (keeper_pid,) = written_pids([child])
            cgroup_file = Path(f"/proc/{keeper_pid}/cgroup")
            _wait_until(lambda: "/execkit-" in cgroup_file.read_text(), "its cgroup")
            monkeypatch.setattr(cgroup, "_CGROUP_AFTER_S", 3600.0)  # the others stay out
            others = [
                pool.submit(
                    spawn,
                    [
                        "bash",
                        "-c",
                        daemonizing_agent(f"{marker}-{n}", pidfiles[n], waits_for(go_others)),
                    ],
                    timeout=120,
                )
                for n in (1, 2)
            ]
            _wait_until(lambda: len(written_pids(pidfiles[1:])) == 2, "the others' daemons")
            made.touch()  # the kept daemon, made after the others started
            _wait_until(lambda: len(written_pids(pidfiles)) == 3, "the kept daemon")
            go_keeper.touch()
            assert keeping.result(timeout=120).ok
            go_others.touch()
            assert all(future.result(timeout=120).ok for future in others)
            left = marked_left(marker, within=2.0)
            kept = marked_left(f"{marker}-0", within=0.0)
        finally:
            for path in (made, go_keeper, go_others):
                path.touch()
            kill_marked(marker)
            tree.force_mechanism(None)
    assert len(kept) == 1 and left == kept, (left, kept)
    assert wait_gone(kept[0])
    assert spawn(["sh", "-c", "sleep 0.1 & wait"]).ok  # a spawn reaps the kept that died
    assert zombie_children() == []


def _in_a_thread(work: Callable[[], T]) -> T:
    """`work()` run in a thread of its own: a spawn that may run beside others."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result(timeout=120)


def test_the_childs_environment_carries_its_spawns_mark_after_an_outer_one(
    mechanism: str,
) -> None:
    show = ["sh", "-c", 'printf %s "$EXECKIT_SPAWN"']
    own = _in_a_thread(lambda: spawn(show).stdout_tail)
    env = {**os.environ, "EXECKIT_SPAWN": "outer.1"}
    nested = _in_a_thread(lambda: spawn(show, env=env).stdout_tail)
    if mechanism == TreeMechanism.SESSION:
        # Nothing is attributed by mark there: the environment is left as it was asked for.
        assert (own, nested) == (os.environ.get("EXECKIT_SPAWN", ""), "outer.1")
        return
    mark = r"[0-9]+-[0-9a-f]{8}[.][0-9]+"
    assert re.fullmatch(mark, own.split()[-1]), own
    assert re.fullmatch(rf"outer[.]1 {mark}", nested), nested
    assert own.split()[-1] != nested.split()[-1], "two spawns, one mark"


def test_a_spawn_alone_in_a_single_threaded_process_leaves_the_environment_as_it_is() -> None:
    # No spawn can run beside it (`execkit run`, a script calling spawn): its orphans are
    # its own, so it needs no mark, and Popen inherits the environment as it is.
    show = 'printf %s "${EXECKIT_SPAWN-unset}"'
    script = f"from execkit._exec import spawn; print(spawn(['sh', '-c', {show!r}]).stdout_tail)"
    env = {k: v for k, v in os.environ.items() if k != "EXECKIT_SPAWN"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (0, "unset\n"), done.stderr
    run = subprocess.run(
        [*EXECKIT, "run", "--", "sh", "-c", show],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (run.returncode, run.stdout) == (0, "unset"), run.stderr


def test_an_injected_starter_is_handed_the_marked_environment_as_str(mechanism: str) -> None:
    seen: list[object] = []

    def start(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        seen.append(kwargs["env"])
        return subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload,no-any-return]

    assert _in_a_thread(lambda: spawn(["true"], start=start)).ok
    (env,) = seen
    if mechanism == TreeMechanism.SESSION:
        assert env is None
        return
    assert isinstance(env, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    assert env.pop("EXECKIT_SPAWN") and env == {
        k: v for k, v in os.environ.items() if k != "EXECKIT_SPAWN"
    }


# ---------------------------------------------------------------------- the kill grace


@pytest.mark.parametrize("then", ["stay", "exit"])
def test_setsid_children_forked_during_the_kill_grace_do_not_survive(
    mechanism: str, tmp_path: Path, then: str
) -> None:
    if then == "exit":
        _mechanisms_that_find_orphans(mechanism)
    pidfile = tmp_path / "pids"
    try:
        result = spawn(
            [*PY, "-c", FORKS_IN_GRACE, str(pidfile), "8", then], timeout=1.0, kill_grace=0.5
        )
        assert result.timed_out and result.stdout_tail.startswith("ready"), result
        pids = read_pids(pidfile)
        assert len(pids) == 8, "the child did not fork during the grace"
        survivors = [pid for pid in pids if not wait_gone(pid)]
        assert survivors == []
        assert zombie_children() == []
    finally:
        kill_all(read_pids(pidfile))


# ------------------------------------------------------------------- `execkit run` dies


def _start_run(pidfile: Path, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*EXECKIT, "run", *flags, "--", *PY, "-c", TREE, str(pidfile)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_ready(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(120), "the child never said it was ready"
    assert proc.stdout.readline().startswith(b"ready")


_SIGNALS = [
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGPIPE,
    signal.SIGXCPU,
    signal.SIGRTMIN,
]


@pytest.mark.parametrize("sig", _SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_execkit_run_ends_the_tree_then_exits_128_plus_n(
    tmp_path: Path, sig: int
) -> None:
    pidfile = tmp_path / "pids"
    proc = _start_run(pidfile)
    try:
        _wait_ready(proc)
        pids = read_pids(pidfile)
        assert len(pids) == 3 and not any(gone(pid) for pid in pids)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=120)
        expected = 130 if sig == signal.SIGINT else 128 + sig
        assert proc.returncode == expected, err
        if sig == signal.SIGINT:
            assert err == b"execkit: interrupted\n"
        survivors = [pid for pid in pids if not wait_gone(pid)]
        assert survivors == [], f"{signal.Signals(sig).name} left {survivors} running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
        kill_all(read_pids(pidfile))


def test_a_signal_ignored_from_the_start_stays_ignored(tmp_path: Path) -> None:
    # `nohup execkit run -- CMD`: a hangup must not end CMD.
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen(
        [*EXECKIT, "run", "--", *PY, "-c", TREE, str(pidfile)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    try:
        _wait_ready(proc)
        pids = read_pids(pidfile)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None and not any(gone(pid) for pid in pids)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM
        assert all(wait_gone(pid) for pid in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
        kill_all(read_pids(pidfile))


def test_sigkill_to_execkit_run_still_takes_the_child(tmp_path: Path) -> None:
    # Nothing in execkit runs after a SIGKILL: the kernel kills the child (PDEATHSIG).
    pidfile = tmp_path / "pids"
    proc = _start_run(pidfile)
    try:
        _wait_ready(proc)
        child = read_pids(pidfile)[0]
        proc.kill()
        proc.communicate(timeout=60)
        assert wait_gone(child), "the child outlived a SIGKILLed execkit run"
    finally:
        kill_all(read_pids(pidfile))


def test_execkit_run_keep_descendants(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    script = (
        _WRITE_PIDS
        + "import subprocess\n"
        + "write_pids(sys.argv[1], [subprocess.Popen(['sleep', '300']).pid])\n"
    )
    try:
        for flags, survives in (((), False), (("--keep-descendants",), True)):
            done = subprocess.run(
                [*EXECKIT, "run", *flags, "--", *PY, "-c", script, str(pidfile)],
                env={**os.environ, "PYTHONPATH": str(REPO)},
                capture_output=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            (job,) = read_pids(pidfile)
            if survives:
                time.sleep(0.2)
                assert not gone(job), "--keep-descendants did not keep the job"
            else:
                assert wait_gone(job), "the job outlived execkit run"
            kill_all([job])
    finally:
        kill_all(read_pids(pidfile))


# ------------------------------------------------------------------ the work after exit
# Counted, never timed (the wall-clock figures are benchmarks/bench_exec.py's): the calls
# the work after the exit makes, into C (`str.find`, `re.Pattern.finditer`, `str.count`,
# ...) and into Python functions, and the bytes it decodes, on cut tails of each kind
# (tests/kept_tails.py) at two sizes. What may grow with the size is said per kind.


class PostExitWork(NamedTuple):
    """What the work after the exit did on one kept tail."""

    c_calls: int  # calls into C: string methods, regex calls, builtins
    py_calls: int  # calls of Python functions
    whole_text: int  # C calls on a str or bytes at least a quarter as long as the tail
    decoded: int  # bytes decoded to text
    masks: int  # credentials masked in the stored tail

    @property
    def calls(self) -> int:
        return self.c_calls + self.py_calls


def post_exit_work(data: bytes, kept: int) -> PostExitWork:
    """Count what `spawn` does after its child wrote `data`, the last `kept` bytes of it
    kept (a cut tail, with context before it, when `kept < len(data)`).

    A smaller tail of the same kind is done first, uncounted: the first redaction in a
    process builds its tables (tens of thousands of calls, once).
    """
    exec_result._post_exit(data[len(data) // 2 :], kept // 2)()
    work = exec_result._post_exit(data, kept)
    counts: Counter[str] = Counter()
    decode = exec_tail._decode.__code__

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "c_call":
            counts["c"] += 1
            text = getattr(arg, "__self__", None)
            if isinstance(text, str | bytes | bytearray | memoryview) and len(text) * 4 >= kept:
                counts["whole"] += 1
        elif event == "call":
            counts["py"] += 1
            if frame.f_code is decode:
                counts["decoded"] += len(frame.f_locals["data"])

    # The collector could run the finalizers of earlier tests' garbage inside the counted
    # work (Python calls that are not this work's): collect first, and not during it.
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        done = work()
    finally:
        sys.setprofile(None)
        gc.enable()
    masks = done.stdout_tail.count("[REDACTED]")
    return PostExitWork(counts["c"], counts["py"], counts["whole"], counts["decoded"], masks)


KIB = 1024
SIZE = 256 * KIB

# Each kind of cut tail at SIZE and at four times SIZE, and what its work may grow with:
# - log lines holding the words redaction looks for, and no credential: nothing, and at
#   most 24 calls over the whole text (a fixed number of searches: 20 now);
# - binary output: nothing, and no more than spawn's own 4 calls over the whole text:
#   it is counted, never searched (while it was kept as text, its calls grew with it);
# - valid UTF-8 of four bytes a character, made of every character the rules look for:
#   only the rare candidates the rules find in it, and a scan of each chunk (about
#   32 KiB) for the anchors it holds: at most six calls a KiB (5.1 now, 4.0 before the
#   command-line and header shapes of issue #44, 0.9 before the chunks; a call for each
#   of its lines would be 14);
# - a credential on every line: the masks, at most 20 calls into C and 6 Python calls
#   each (11 and 2.4 now; 31 and 17 while the whole cut tail was traced).
GROWTH_BOUNDS = [
    pytest.param(kept_tails.log_lines, "nothing", id="log-lines"),
    pytest.param(kept_tails.random_bytes, "nothing", id="binary"),
    pytest.param(kept_tails.wide_text, "candidates", id="wide-text"),
    pytest.param(kept_tails.credential_log, "masks", id="dense"),
]
WHOLE_TEXT_CALLS: dict[Callable[[int], bytes], int] = {
    kept_tails.log_lines: 24,
    kept_tails.random_bytes: 4,
}
# Under the compiled engine a long text is scanned a chunk at a time (about 32 KiB each,
# redact/gate.py): each chunk costs a search for the newline that ends it (counted as a
# call over the whole text, though it reads only to that newline), one scan, and one
# report per anchor it holds (14 calls a chunk of log lines now).
PER_CHUNK_CALLS = 20


def _chunks(data: bytes, kept: int) -> int:
    """How many chunks the compiled engine scans the kept text of `data` in (0: whole)."""
    if _redact.engine_in_use() != "hyperscan":
        return 0
    text = data[-kept:].decode("utf-8", "replace")
    return len(gate.line_chunks(text, gate.CHUNK_CHARS)) if len(text) >= gate.CHUNKED_FROM else 0


@pytest.mark.parametrize(("build", "grows_with"), GROWTH_BOUNDS)
def test_post_exit_work_on_a_cut_tail_does_not_grow_with_its_size(
    build: Callable[[int], bytes], grows_with: str
) -> None:
    # Warm first: loading the rules and compiling patterns is done once per process, not
    # per tail, and must count on neither side (in a whole suite it is done already); the
    # larger tail can open rules the smaller one does not, so both sizes warm.
    post_exit_work(build(SIZE + 4096), SIZE)
    post_exit_work(build(4 * SIZE + 4096), 4 * SIZE)
    small = post_exit_work(build(SIZE + 4096), SIZE)
    big = post_exit_work(build(4 * SIZE + 4096), 4 * SIZE)
    # Each kept byte is decoded once, and so is the context before the cut.
    for work, kept in ((small, SIZE), (big, 4 * SIZE)):
        assert work.decoded <= kept + exec_result.REDACT_CONTEXT, work
    if grows_with == "nothing":
        small_chunks = _chunks(build(SIZE + 4096), SIZE)
        big_chunks = _chunks(build(4 * SIZE + 4096), 4 * SIZE)
        assert big.calls - small.calls <= PER_CHUNK_CALLS * (big_chunks - small_chunks), (
            small,
            big,
        )
        bound = WHOLE_TEXT_CALLS[build]
        assert big.whole_text - big_chunks <= bound, (small, big)
        assert small.whole_text - small_chunks <= bound, (small, big)
    elif grows_with == "candidates":
        # Linear in the candidates a text offers: a few checks a KiB of the added text. The
        # 457 provider rules' anchors (keywords before a token) offer about five a KiB in
        # random wide text, where the twelve hand-written shapes offered under one.
        assert big.calls - small.calls <= 6 * (3 * SIZE) // KIB, (small, big)
    else:
        more = big.masks - small.masks
        assert more >= 3 * small.masks > 0, (small, big)
        assert big.c_calls - small.c_calls <= 20 * more, (small, big)
        assert big.py_calls - small.py_calls <= 6 * more, (small, big)


def test_post_exit_work_besides_redaction_is_one_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    # What spawn itself does with a kept tail after the exit (join the ring, decode, look
    # for binary output, find the context, build the result), redaction aside: each byte
    # decoded once, one search over the text (for the replacement character), no more at
    # four times the size, and at most one copy of the tail alive at once besides the ring.
    monkeypatch.setattr(exec_result, "redact_tail", lambda tail, _context, _secrets=(): tail)
    size = 4 * 1024 * KIB
    line = b"plain log line without anything to mask, number 1234567890\n"
    data = (line * (size // len(line) + 1))[:size]
    work = post_exit_work(data, size)
    quarter = post_exit_work(data[: size // 4], size // 4)
    assert work.decoded == size
    assert work.whole_text <= 2, work
    assert work.calls <= quarter.calls, (quarter, work)
    finish = exec_result._post_exit(data, size)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        finish()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak <= size + size // 2, f"{peak} bytes allocated at once for a {size}-byte tail"


# -- the start: vfork, whatever the parent holds --------------------------------------------


def test_every_mechanism_starts_the_child_so_that_cpython_may_vfork(
    mechanism: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes CPython 3.11 fork (a copy of the parent's page tables, whose cost grows
    with the parent's memory) instead of vfork: a `preexec_fn`, or a uid, gid or groups to
    set. A spawn passes none of them under any mechanism (only `die_with_parent`, which
    `execkit run` asks for from a small single-threaded process, passes a `preexec_fn`), and
    leaves vfork allowed. Counted on the arguments `subprocess` hands `_posixsubprocess`;
    benchmarks/bench_exec.py measures it from a parent holding 1 GiB."""
    seen: list[tuple[object, ...]] = []
    real = subprocess._fork_exec  # type: ignore[attr-defined]

    def recording(*args: object) -> int:
        seen.append(args)
        pid: int = real(*args)
        return pid

    monkeypatch.setattr(subprocess, "_fork_exec", recording)
    assert spawn(["true"]).ok
    assert len(seen) == 1
    gid, gids, uid, _umask, preexec_fn, allow_vfork = seen[0][-6:]
    assert (preexec_fn, gid, gids, uid, allow_vfork) == (None, None, None, None, True)
