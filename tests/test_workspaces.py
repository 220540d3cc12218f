"""A workspace per board issue (issue #46), with real git and real agents.

Four issues at `--concurrency 4` each edit their own git worktree and none sees another's
file; a workspace is kept across an issue's attempts, removed (its worktree pruned, its
branch kept) once the issue is done and kept when it is blocked; the board's hooks run in
it and a hook's failure is `environment` naming the hook; a filesystem below the floor
starts no workspace and says both numbers; a crash mid-create blocks nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _support import REPO, kill_marked, marked_left, run_execkit, write_board
from hypothesis import given
from hypothesis import strategies as st

from adapters import GenericAdapter
from execkit import InvalidInput
from execkit._classify import FailureClass
from execkit.cli import _dispatch as cli_dispatch
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    DispatchEvent,
    InlineExecutor,
    InMemoryBoard,
    RunOutcome,
    WorkspaceHooks,
    Workspaces,
    workspace_name,
)
from execkit.dispatch import _workspaces as workspaces_module
from execkit.ledger import open_ledger

PY = sys.executable


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "t@example.invalid")
    git(path, "config", "user.name", "t")
    (path / "README").write_text("the project\n")
    git(path, "add", "README")
    git(path, "commit", "-q", "-m", "start")
    return path


# An agent that writes its own file in its working directory, waits (bounded) until all
# four agents have written theirs, then lists what it sees there: run at once, none may see
# another's file.
_AGENT = """
import os, pathlib, sys, time
me, meeting, n = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
pathlib.Path(f"{me}.txt").write_text(me)
(meeting / me).write_text(os.getcwd())
deadline = time.monotonic() + 60
while len(list(meeting.iterdir())) < n and time.monotonic() < deadline:
    time.sleep(0.02)
seen = sorted(p.name for p in pathlib.Path(".").iterdir() if p.name != ".git")
(meeting.parent / "seen" / me).write_text(",".join(seen) + f";{len(list(meeting.iterdir()))}")
"""


def test_four_issues_at_concurrency_4_each_edit_their_own_worktree(
    tmp_path: Path, repo: Path
) -> None:
    meeting, seen = tmp_path / "meeting", tmp_path / "seen"
    meeting.mkdir()
    seen.mkdir()
    agent = tmp_path / "agent.py"
    agent.write_text(_AGENT)
    ids = ["W-1", "W-2", "W-3", "W-4"]
    board = write_board(
        tmp_path / "board.json",
        [
            {"id": i, "title": i, "state": "todo", "argv": [PY, str(agent), i, str(meeting), "4"]}
            for i in ids
        ],
    )
    root = tmp_path / "ws"
    done = run_execkit(
        "dispatch",
        "--board",
        str(board),
        "--db",
        str(tmp_path / "l.db"),
        "--adapter",
        "generic",
        "--until-idle",
        "--concurrency",
        "4",
        "--workspaces",
        str(root),
        "--repo",
        str(repo),
        "--keep-workspaces",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted((e["issue_id"], e["moved_to"]) for e in events) == [(i, "done") for i in ids]
    assert {e["workspace"] for e in events} == {str(root / i) for i in ids}
    for i in ids:
        listing, met = (seen / i).read_text().split(";")
        # All four had written their file when each looked: they ran at once.
        assert met == "4"
        assert listing == f"README,{i}.txt"
        assert (meeting / i).read_text() == str(root / i)
        assert git(root / i, "rev-parse", "--abbrev-ref", "HEAD").strip() == f"execkit/{i}"
    # The run records where its agent worked; `task show` and `status` show it.
    with open_ledger(tmp_path / "l.db") as ledger:
        recorded = {r.workspace for t in ledger.list_tasks() for r in ledger.runs(t.id)}
    assert recorded == {str(root / i) for i in ids}
    shown = run_execkit("task", "show", "W-2", "--db", str(tmp_path / "l.db"))
    assert f"  workspace: {root / 'W-2'} (attempt 1)" in shown.stdout.splitlines(), shown
    status = run_execkit("status", "--board", str(board), "--workspaces", str(root), "--json")
    rows = json.loads(status.stdout)["issues"]
    assert {(r["issue_id"], r["workspace"]) for r in rows} == {(i, str(root / i)) for i in ids}
    table = run_execkit("status", "--board", str(board), "--workspaces", str(root)).stdout
    assert f"W-3    {root / 'W-3'}" in table.splitlines()
    # The repository's own checkout saw none of it.
    assert sorted(p.name for p in repo.iterdir() if p.name != ".git") == ["README"]
    listed = git(repo, "worktree", "list", "--porcelain")
    assert all(f"worktree {root / i}" in listed for i in ids)


def _dispatcher(
    tmp_path: Path, board: InMemoryBoard, workspaces: Workspaces, **config: object
) -> Dispatcher:
    settings = {"base_backoff_s": 0.01, "max_retry_backoff_s": 0.02, **config}
    ledger = open_ledger(tmp_path / "l.db")
    return Dispatcher(
        board,
        AdapterRunner(GenericAdapter()),
        ledger,
        DispatchConfig.from_mapping(settings),
        executor=InlineExecutor(),
        workspaces=workspaces,
    )


def _until_settled(dispatcher: Dispatcher, board: InMemoryBoard) -> list[DispatchEvent]:
    events: list[DispatchEvent] = []
    for _ in range(200):  # bounded: a few attempts with backoffs of 10-20 ms
        if not board.list_candidates():
            return events
        events.extend(dispatcher.tick())
        time.sleep(0.02)
    raise AssertionError("the board did not settle")


# Fails until its third attempt, counting attempts in a file of its working directory:
# the count survives only if the workspace is kept across attempts.
_THIRD_TIME = (
    "import pathlib, sys\n"
    "count = pathlib.Path('count')\n"
    "n = int(count.read_text()) + 1 if count.exists() else 1\n"
    "count.write_text(str(n))\n"
    "sys.exit(0 if n >= 3 else 1)\n"
)


def _log_hook(name: str, log: Path) -> list[str]:
    code = f"import os; open({str(log)!r}, 'a').write({name!r} + ' ' + os.getcwd() + '\\n')"
    return [PY, "-c", code]


def test_a_workspace_is_kept_across_attempts_and_the_hooks_run_in_it(
    tmp_path: Path, repo: Path
) -> None:
    log = tmp_path / "hooks.log"
    hooks = WorkspaceHooks(
        after_create=tuple(_log_hook("after_create", log)),
        before_attempt=tuple(_log_hook("before_attempt", log)),
        after_done=tuple(_log_hook("after_done", log)),
    )
    root = tmp_path / "ws"
    workspaces = Workspaces(root, repo=repo, hooks=hooks)
    board = InMemoryBoard([BoardIssue("K-1", "k", "todo", argv=[PY, "-c", _THIRD_TIME])])
    dispatcher = _dispatcher(tmp_path, board, workspaces, max_attempts=5)
    events = _until_settled(dispatcher, board)
    assert board.get("K-1").state == "done"
    where = str(root / "K-1")
    assert log.read_text().splitlines() == [
        f"after_create {where}",
        f"before_attempt {where}",
        f"before_attempt {where}",
        f"before_attempt {where}",
        f"after_done {where}",
    ]
    # Done: the workspace is gone, its worktree pruned, its branch (the work) kept.
    assert not (root / "K-1").exists()
    (event,) = [e for e in events if e.moved_to == "done"]
    assert (event.workspace, event.workspace_removed) == (str(root / "K-1"), True)
    assert str(root / "K-1") not in git(repo, "worktree", "list", "--porcelain")
    assert "execkit/K-1" in git(repo, "branch", "--list", "execkit/*")
    runs = dispatcher.ledger.runs(dispatcher.ledger.list_tasks()[0].id)
    assert [r.status for r in runs] == ["failed", "failed", "succeeded"]


def test_a_failing_hook_is_environment_naming_it_and_the_workspace_stays(tmp_path: Path) -> None:
    hooks = WorkspaceHooks(after_create=(PY, "-c", "import sys; print('no node'); sys.exit(3)"))
    root = tmp_path / "ws"
    board = InMemoryBoard([BoardIssue("H-1", "h", "todo", argv=[PY, "-c", "pass"])])
    dispatcher = _dispatcher(tmp_path, board, Workspaces(root, hooks=hooks))
    (event,) = dispatcher.tick()
    assert (event.failure_class, event.charged, event.moved_to) == (
        FailureClass.ENVIRONMENT,
        False,
        "blocked",
    )
    assert event.precondition is not None
    assert event.precondition.startswith("workspace hook after_create (")
    assert "exited 3: no node" in event.precondition
    # Blocked: kept for the person who looks (not marked made: the next try makes it anew).
    assert (root / "H-1").is_dir() and event.workspace == str(root / "H-1")


def test_before_attempt_and_after_done_failures_name_their_hook(tmp_path: Path) -> None:
    fail = (PY, "-c", "import sys; sys.exit(1)")
    for name in ("before_attempt", "after_done"):
        hooks = WorkspaceHooks(**{name: fail})  # type: ignore[arg-type]
        board = InMemoryBoard([BoardIssue("B-1", "b", "todo", argv=[PY, "-c", "pass"])])
        place = tmp_path / name
        place.mkdir()
        dispatcher = _dispatcher(place, board, Workspaces(place / "ws", hooks=hooks))
        (event,) = dispatcher.tick()
        assert event.failure_class is FailureClass.ENVIRONMENT
        assert (event.precondition or "").startswith(f"workspace hook {name} (")
        assert board.get("B-1").state == "blocked"
        assert (place / "ws" / "B-1").is_dir()


def test_below_the_free_space_floor_no_workspace_is_started(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    workspaces = Workspaces(root, min_free_mb=2048, free_bytes=lambda _path: 300 * 1024 * 1024)
    ran = tmp_path / "ran"
    board = InMemoryBoard(
        [BoardIssue("D-1", "d", "todo", argv=[PY, "-c", f"open({str(ran)!r}, 'w')"])]
    )
    (event,) = _dispatcher(tmp_path, board, workspaces).tick()
    assert event.failure_class is FailureClass.ENVIRONMENT
    assert event.precondition is not None
    assert "300 MB free" in event.precondition and "floor of 2048 MB" in event.precondition
    assert not (root / "D-1").exists() and not ran.exists()


def test_a_crash_mid_create_leaves_nothing_that_blocks_the_next_try(
    tmp_path: Path, repo: Path
) -> None:
    root = tmp_path / "ws"
    workspaces = Workspaces(root, repo=repo)
    # What a crash after `git worktree add` and before the marker leaves: a registered
    # worktree with a half-written file, its branch, and no marker.
    git(repo, "worktree", "add", "-q", "-b", "execkit/C-1", str(root / "C-1"), "HEAD")
    (root / "C-1" / "half").write_text("half")
    # And one from a crash before git finished: a folder git never registered.
    (root / "C-2").mkdir(parents=True)
    (root / "C-2" / "junk").write_text("junk")
    for issue_id in ("C-1", "C-2"):
        made = workspaces.prepare(issue_id)
        assert made == root / issue_id, made
        assert sorted(p.name for p in made.iterdir() if p.name != ".git") == ["README"]
        assert workspaces.made(issue_id)
    # Made: the next attempt reuses it as it is.
    (root / "C-1" / "work").write_text("kept")
    assert workspaces.prepare("C-1") == root / "C-1"
    assert (root / "C-1" / "work").read_text() == "kept"


def test_a_plain_folder_without_a_repo(tmp_path: Path) -> None:
    workspaces = Workspaces(tmp_path / "ws")
    made = workspaces.prepare("P-1")
    assert made == tmp_path / "ws" / "P-1" and made.is_dir() and not list(made.iterdir())
    assert (made.stat().st_mode & 0o777) == 0o700
    assert workspaces.remove("P-1") and not made.exists()
    kept = Workspaces(tmp_path / "ws", keep=True)
    kept.prepare("P-2")
    assert not kept.remove("P-2") and (tmp_path / "ws" / "P-2").is_dir()


@given(st.lists(st.text(min_size=1, max_size=60), min_size=2, max_size=6, unique=True))
def test_two_issue_ids_never_share_a_workspace(ids: list[str]) -> None:
    names = [workspace_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    for name in names:
        assert "/" not in name and name not in (".", "..") and not name.startswith(".")
        assert len(name) <= 80 and "\0" not in name
        # A valid git branch name below execkit/.
        assert ".." not in name and not name.endswith((".lock", "."))


def test_names_that_are_plain_stay_as_they_are() -> None:
    assert workspace_name("ISS-7") == "ISS-7"
    assert workspace_name("owner/repo#12").startswith("owner_repo_12-")
    hashed = workspace_name("a/b")
    # An id that looks like a hashed name is hashed too: it cannot take another's name.
    assert workspace_name(hashed) != hashed


def test_bad_workspace_settings_are_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="workspace: unknown keys") as unknown:
        WorkspaceHooks.from_mapping({"after_creat": ["true"]})
    assert unknown.value.field == "workspace"
    with pytest.raises(InvalidInput, match=r"workspace\.after_done must be a non-empty list"):
        WorkspaceHooks.from_mapping({"after_done": "make clean"})
    with pytest.raises(InvalidInput, match="hook_timeout_s"):
        WorkspaceHooks.from_mapping({"hook_timeout_s": 0})
    with pytest.raises(InvalidInput, match="min_free_mb"):
        Workspaces(tmp_path, min_free_mb=-1)
    with pytest.raises(InvalidInput, match="is not a git work tree"):
        Workspaces(tmp_path / "ws", repo=tmp_path)


def test_the_cli_floor_default_is_the_library_one(tmp_path: Path) -> None:
    assert cli_dispatch.DEFAULT_MIN_FREE_MB == workspaces_module.DEFAULT_MIN_FREE_MB
    board = write_board(tmp_path / "board.json", [])
    refused = run_execkit(
        "dispatch", "--board", str(board), "--db", str(tmp_path / "l.db"), "--once", "--repo", "."
    )
    assert refused.returncode != 0 and "--repo needs --workspaces DIR" in refused.stderr


def test_the_board_schema_and_the_code_agree_on_the_workspace_object(tmp_path: Path) -> None:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped, unused-ignore]

    schema = json.loads((REPO / "docs" / "schemas" / "board.schema.json").read_text())
    check = Draft202012Validator(schema)
    states = [{"name": "todo", "eligible": True}]
    good = {"states": states, "workspace": {"after_create": ["npm", "ci"], "hook_timeout_s": 60}}
    assert list(check.iter_errors(good)) == []
    WorkspaceHooks.from_mapping(good["workspace"])  # type: ignore[arg-type]
    for bad in ({"after_creat": ["x"]}, {"after_done": "make"}, {"hook_timeout_s": 0}):
        assert list(check.iter_errors({"states": states, "workspace": bad})) != []
        with pytest.raises(InvalidInput):
            WorkspaceHooks.from_mapping(bad)
    board = write_board(tmp_path / "board.json", [], workspace=["not", "an", "object"])
    refused = run_execkit(
        "dispatch", "--board", str(board), "--db", str(tmp_path / "l.db"), "--once",
        "--workspaces", str(tmp_path / "ws"),
    )  # fmt: skip
    assert refused.returncode == 3 and "`workspace` must be an object" in refused.stderr


def test_a_dispatcher_killed_mid_create_leaves_nothing_that_blocks_the_next(
    tmp_path: Path, repo: Path
) -> None:
    """A real crash: the dispatcher is SIGKILLed while the issue's `after_create` hook runs
    (the worktree made, its marker not yet written). The next dispatcher on this host
    abandons the dead one's run, clears what was left and makes the workspace anew."""
    started = tmp_path / "hook-started"
    hook_code = (
        "import os, pathlib, sys, time\n"
        f"flag = pathlib.Path({str(started)!r})\n"
        "if not flag.exists():\n"
        "    pathlib.Path('half-made').write_text('x')\n"
        "    flag.write_text(str(os.getpid()))\n"
        "    time.sleep(600)\n"
    )
    board = write_board(
        tmp_path / "board.json",
        [{"id": "X-1", "title": "x", "state": "todo", "argv": [PY, "-c", "open('done', 'w')"]}],
        workspace={"after_create": [PY, "-c", hook_code]},
        dispatch={"base_backoff_s": 0.05, "max_retry_backoff_s": 0.1},
    )
    root, db = tmp_path / "ws", tmp_path / "l.db"
    argv = [
        sys.executable, "-m", "execkit", "dispatch", "--board", str(board), "--db", str(db),
        "--adapter", "generic", "--until-idle", "--workspaces", str(root), "--repo", str(repo),
        "--keep-workspaces",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(3000):  # bounded: the hook starts within seconds
            if started.exists() and started.read_text():
                break
            time.sleep(0.02)
        assert started.read_text(), "the hook never started"
        first.kill()
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=60)
        # The hook the kill orphaned: its own pid, never a group or -1.
        written = started.read_text() if started.exists() else ""
        if written.isdigit() and int(written) > 1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(written), signal.SIGKILL)
    assert (root / "X-1" / "half-made").exists()  # what the crash left
    # One pass abandons the run whose dispatcher is gone (`--until-idle` alone would find
    # it still running and stop there); then attempt 2 runs.
    once = [*(part for part in argv if part != "--until-idle"), "--once"]
    abandoned = subprocess.run(once, env=env, capture_output=True, text=True, timeout=120)
    assert "abandoned, its owner pid" in abandoned.stderr, abandoned.stdout + abandoned.stderr
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "X-1  attempt 2/10  succeeded -> moved to done" in done.stdout.splitlines()
    assert sorted(p.name for p in (root / "X-1").iterdir() if p.name != ".git") == [
        "README",
        "done",
    ]
    listed = git(repo, "worktree", "list", "--porcelain")
    assert listed.count(f"worktree {root / 'X-1'}\n") == 1


def test_a_hook_that_runs_past_its_timeout_is_stopped_with_its_tree(
    tmp_path: Path,
) -> None:
    marker = f"execkit-hook-{os.getpid()}"
    hang = (
        PY,
        "-c",
        "import subprocess, time\n"
        f"subprocess.Popen(['bash', '-c', 'exec -a {marker} sleep 600'])\n"
        "time.sleep(600)\n",
    )
    workspaces = Workspaces(tmp_path / "ws", hooks=WorkspaceHooks(before_attempt=hang, timeout_s=1))
    try:
        failed = workspaces.prepare("T-1")
        assert isinstance(failed, RunOutcome) and failed.failure_class is FailureClass.ENVIRONMENT
        assert (failed.precondition or "").startswith(
            "workspace hook before_attempt (" + PY + ") did not finish within 1 s"
        )
        assert marked_left(marker) == []
    finally:
        kill_marked(marker)
