"""A fleet of dispatchers: three `execkit dispatch` processes, concurrency 4 each, over one
30-issue board, sharing one ledger through one `execkit serve` in its own process, or one
PostgreSQL ledger; a dispatcher that starts where another was killed; and one dispatcher
at concurrency 4 whose agents each leave a daemon behind, however it ends.

What the ledger must show afterwards: every issue ran exactly once (one run, succeeded),
each run's owner is the dispatcher process that ran it (never the server), nothing is left
`running` or abandoned (a dispatcher that refused its own admission would leave one), and
`db check` finds nothing. The killed dispatcher's run is abandoned at once by the next
dispatcher on the host, audited with a reason naming the lost process, not after its lease.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from _support import (
    REPO,
    daemonizing_agent,
    kill_marked,
    marked_left,
    write_board,
    written_pids,
)
from test_dispatch_multihost import (
    SLOW,
    assert_never_twice_at_once,
    stop,
    vendor_spans,
    wait_for,
)

from execkit.ledger import AuditAction, Ledger, open_ledger

ISSUES = 30
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _board(tmp_path: Path, log: Path) -> Path:
    issues = [
        {
            "id": f"I{n}",
            "title": "t",
            "state": "todo",
            "argv": [SLOW, "--seconds", "0.2", "--log", str(log), "--key", f"I{n}"],
        }
        for n in range(ISSUES)
    ]
    board = write_board(tmp_path / "board.json", issues)
    board.chmod(0o600)
    return board


def _fleet(board: Path, target: list[str], env: dict[str, str]) -> list[subprocess.Popen[str]]:
    command = [sys.executable, "-m", "execkit", "dispatch", "--board", str(board), *target]
    command += ["--adapter", "generic", "--concurrency", "4", "--interval", "0.05"]
    return [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]


def _settle(board: Path, fleet: list[subprocess.Popen[str]]) -> list[str]:
    def settled() -> bool:
        states = {i["state"] for i in json.loads(board.read_text())["issues"]}
        return states == {"done"}

    try:
        wait_for(settled, 120, "every issue to be done")
    finally:
        outputs = [stop(process, grace=1) for process in fleet]
    return outputs


def _assert_each_ran_once(
    ledger: Ledger, log: Path, fleet: list[subprocess.Popen[str]], errors: list[str]
) -> None:
    for err in errors:
        assert "Traceback" not in err, err
    spans, unfinished = vendor_spans(log)
    assert unfinished == []
    assert_never_twice_at_once(spans)
    assert {key: len(runs) for key, runs in spans.items()} == {f"I{n}": 1 for n in range(ISSUES)}
    tasks = ledger.list_tasks()
    assert len(tasks) == ISSUES
    pids = {process.pid for process in fleet}
    owners: set[int] = set()
    for task in tasks:
        (run,) = ledger.runs(task.id)
        assert (run.attempt, run.status, run.stopped) == (1, "succeeded", False)
        assert run.owner_pid in pids, (run.owner_pid, pids)  # the dispatcher, not the server
        assert run.owner_instance is not None
        owners.add(run.owner_pid)
    assert len(owners) >= 2, "one dispatcher did all the work: the fleet was not exercised"
    assert ledger.running_runs() == []
    assert ledger.validate() == []


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`execkit serve` in its own process on loopback: (url, a dispatcher's token)."""
    from execkit.server import add_token

    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, "fleet", ["agent.operate"])
    argv = [sys.executable, "-m", "execkit", "serve", "--db", str(tmp_path / "ledger.db")]
    argv += ["--tokens", str(tokens), "--listen", "127.0.0.1:0", "--json"]
    with (tmp_path / "serve.log").open("w") as err:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=ENV)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, (tmp_path / "serve.log").read_text()
        yield json.loads(line)["url"], token
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.mark.slow
def test_three_dispatchers_through_one_server_run_every_issue_once(
    tmp_path: Path, server: tuple[str, str]
) -> None:
    url, token = server
    log = tmp_path / "vendor.log"
    board = _board(tmp_path, log)
    env = {**ENV, "EXECKIT_REMOTE": url, "EXECKIT_TOKEN": token}
    fleet = _fleet(board, [], env)
    errors = _settle(board, fleet)
    with open_ledger(tmp_path / "ledger.db") as ledger:
        _assert_each_ran_once(ledger, log, fleet, errors)


@pytest.mark.slow
def test_three_dispatchers_on_one_postgresql_ledger_run_every_issue_once(
    tmp_path: Path, pg_url: str
) -> None:
    log = tmp_path / "vendor.log"
    board = _board(tmp_path, log)
    with open_ledger(pg_url):
        pass  # the schema, once, before the race
    fleet = _fleet(board, ["--db", pg_url], ENV)
    errors = _settle(board, fleet)
    with open_ledger(pg_url) as ledger:
        _assert_each_ran_once(ledger, log, fleet, errors)


def _killed_mid_run(
    tmp_path: Path, dispatch: dict[str, float] | None = None
) -> tuple[Path, Path, list[str], int]:
    """A dispatcher SIGKILLed (its agent too) while its one issue, LONG (600 s), runs:
    (the board, the ledger, the dispatch command, the dead dispatcher's pid)."""
    log = tmp_path / "vendor.log"
    db = tmp_path / "ledger.db"
    issue = {
        "id": "LONG",
        "title": "t",
        "state": "todo",
        "argv": [SLOW, "--seconds", "600", "--log", str(log), "--key", "LONG"],
    }
    board = tmp_path / "board.json"
    if dispatch is None:
        write_board(board, [issue])
    else:
        write_board(board, [issue], dispatch=dispatch)
    board.chmod(0o600)
    command = [sys.executable, "-m", "execkit", "dispatch", "--board", str(board)]
    command += ["--adapter", "generic", "--db", str(db)]
    doomed = subprocess.Popen(
        command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: log.exists() and "start LONG" in log.read_text(), 60, "LONG to start")
        agents = psutil.Process(doomed.pid).children(recursive=True)
        doomed.kill()
        for agent in agents:
            agent.kill()
        doomed.wait(30)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(30)
    return board, db, command, doomed.pid


def test_a_dispatcher_abandons_at_once_what_a_killed_one_left_running(tmp_path: Path) -> None:
    _board, db, command, doomed_pid = _killed_mid_run(tmp_path)

    listed = subprocess.run(
        [sys.executable, "-m", "execkit", "run", "list", "--running", "--db", str(db), "--json"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    (running,) = json.loads(listed.stdout)["runs"]
    assert (running["owner_pid"], running["status"]) == (doomed_pid, "running")
    assert running["lease_expires_at"] > running["started_at"]

    # The next dispatcher on this host: the run is abandoned before its lease (60 s) ends
    # (attempt 2 then waits out the backoff an abandoned, charged attempt sets).
    again = subprocess.run(
        [*command, "--once"], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in again.stderr, again.stderr
    with open_ledger(db) as ledger:
        (task,) = ledger.list_tasks()
        first = ledger.runs(task.id)[0]
        assert (first.status, first.stopped) == ("abandoned", False)
        assert f"pid {doomed_pid} on" in (first.reason or "") and "gone" in (first.reason or "")
        assert first.ended_at is not None and first.lease_expires_at is not None
        assert first.ended_at < first.lease_expires_at  # at once, not by the lease
        abandon = [e for e in ledger.audit_events(task.id) if e.action == AuditAction.RUN_ABANDON]
        assert [(e.actor, e.run_id) for e in abandon] == [("dispatcher", first.id)]
        assert ledger.running_runs() == []


def test_until_idle_abandons_what_a_killed_dispatcher_left_running_then_runs_it(
    tmp_path: Path,
) -> None:
    # `--until-idle` asked "is anything due?" before its first pass had abandoned the dead
    # dispatcher's run: the task was `running`, nothing was due, and it exited at once
    # with the run left to its lease and the issue not done.
    fast = {"base_backoff_s": 0.05, "max_retry_backoff_s": 0.1}
    board, db, command, doomed_pid = _killed_mid_run(tmp_path, fast)
    # A person shortens the work before the next dispatcher takes it again.
    written = json.loads(board.read_text())
    written["issues"][0]["argv"][2] = "0.05"
    board.write_text(json.dumps(written))

    again = subprocess.run(
        [*command, "--until-idle", "--interval", "0.05"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr, again.stderr
    assert {i["id"]: i["state"] for i in json.loads(board.read_text())["issues"]} == {
        "LONG": "done"
    }
    with open_ledger(db) as ledger:
        (task,) = ledger.list_tasks()
        first, second = ledger.runs(task.id)
        assert (first.status, second.status) == ("abandoned", "succeeded")
        assert f"pid {doomed_pid} on" in (first.reason or "")
        assert ledger.running_runs() == []


def test_run_list_needs_running_and_says_when_nothing_runs(tmp_path: Path) -> None:
    db = str(tmp_path / "ledger.db")
    base = [sys.executable, "-m", "execkit", "run", "list", "--db", db]
    with open_ledger(db):
        pass
    bare = subprocess.run(base, env=ENV, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 3 and "--running" in bare.stderr, bare.stderr
    quiet = subprocess.run(
        [*base, "--running"], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert (quiet.returncode, quiet.stdout) == (0, "nothing is running\n"), quiet.stderr


# ------------------------------------------- no descendant left, at concurrency above 1

# `execkit dispatch` with the tree mechanism argv[1] forced (tests only), then the CLI.
_FORCED_DISPATCH = """
import sys
from execkit._exec.tree import force_mechanism
if not force_mechanism(sys.argv[1]):
    sys.exit(99)
from execkit.cli import main
sys.argv = ["execkit", *sys.argv[2:]]
sys.exit(main())
"""

# How the dispatcher ends: the agents' last command, its flags, and the exit it gives.
_ENDINGS = {
    "normal-exit": ("sleep 1", ["--until-idle"], 0),
    "timeout": ("sleep 600", ["--until-idle", "--timeout", "3", "--max-attempts", "1"], 8),
    "sigterm-drain": ("sleep 600", ["--drain-timeout", "0.5"], 128 + signal.SIGTERM),
    "second-signal": ("sleep 600", ["--drain-timeout", "600"], 128 + signal.SIGINT),
}


def _read_line(stream: object, within: float) -> str:
    """One line of the dispatcher's stderr, waited for at most `within` seconds."""
    assert hasattr(stream, "readline")
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert selector.select(within), "the dispatcher said nothing"
    line: str = stream.readline()
    return line


@pytest.mark.parametrize("mechanism", ["cgroup", "subreaper"])
@pytest.mark.parametrize("ending", list(_ENDINGS))
def test_dispatch_at_concurrency_4_leaves_no_descendant(
    tmp_path: Path, ending: str, mechanism: str
) -> None:
    # Issue 44: four agents at once, each leaving a setsid daemon (re-parented to the
    # dispatcher at once, as `( setsid bash -c "exec -a NAME sleep 600" & )` does). Counted
    # by the name each daemon carries in its argv: 0 left, however the dispatcher ends.
    from execkit._exec import tree

    if not tree.force_mechanism(mechanism):
        pytest.skip(f"the {mechanism} mechanism is not available here")
    tree.force_mechanism(None)
    then, flags, expected = _ENDINGS[ending]
    marker = f"execkit-fleet-orphan-{os.getpid()}-{os.urandom(4).hex()}"
    pidfiles = [tmp_path / f"daemon-{n}" for n in range(4)]
    issues = [
        {
            "id": f"I{n}",
            "title": "t",
            "state": "todo",
            "argv": ["bash", "-c", daemonizing_agent(f"{marker}-{n}", pidfiles[n], then)],
        }
        for n in range(4)
    ]
    board = write_board(tmp_path / "board.json", issues)
    board.chmod(0o600)
    command = [sys.executable, "-c", _FORCED_DISPATCH, mechanism, "dispatch"]
    command += ["--board", str(board), "--db", str(tmp_path / "ledger.db"), "--adapter"]
    command += ["generic", "--concurrency", "4", "--interval", "0.05", *flags]
    dispatcher = subprocess.Popen(
        command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: len(written_pids(pidfiles)) == 4, 60, "every agent's daemon")
        if ending in ("sigterm-drain", "second-signal"):
            dispatcher.send_signal(signal.SIGTERM)
        if ending == "second-signal":
            assert dispatcher.stderr is not None
            assert "stopping" in _read_line(dispatcher.stderr, 60)
            dispatcher.send_signal(signal.SIGINT)
        _out, err = dispatcher.communicate(timeout=120)
        left = marked_left(marker)
    finally:
        if dispatcher.poll() is None:
            dispatcher.kill()
            dispatcher.communicate(timeout=60)
        kill_marked(marker)
    assert "Traceback" not in err, err
    assert dispatcher.returncode == expected, err
    assert left == [], f"{len(left)} of 4 daemons left by dispatch ({ending}, {mechanism})"
