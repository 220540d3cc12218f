"""Where agents work (issue #46): a workspace per board issue (`Workspaces`).

Each issue gets its own folder, `ROOT/<workspace_name(issue id)>`: a safe name, never the
same for two issue ids. With a repository (`repo=PATH`) each workspace is a git worktree
of it on its own branch, `execkit/<name>`, made by git itself (a subprocess, no shell).

The dispatcher hands its `Workspaces` the issue in the slot that runs it, after the
issue's run was admitted: the ledger's lease on the issue's task is held, so no other
dispatcher (on this host or another sharing the filesystem) creates, uses or removes the
same workspace at once. `prepare` makes the workspace on the issue's first attempt and
keeps it for the next ones (a retry continues the work); `after_done` runs the board's
hook once the agent succeeded; `remove` deletes it once its issue is done (a worktree is
removed and pruned, its branch kept: the work is on it), unless `keep`. A blocked issue's
workspace stays for the person who looks.

A workspace counts as made only once its marker (`ROOT/.execkit/<name>.ready`) is
written, after the folder or worktree and its `after_create` hook; whatever a crash
left before that (a half-made folder, a worktree git registered) is cleared by the next
`prepare`, so it never blocks the next try. `remove` drops the marker first for the same
reason.

The board's hooks (`WorkspaceHooks`: `after_create`, `before_attempt`, `after_done`, each
an argv run without a shell) run in the workspace with a timeout. A hook that fails, a
git that fails, a workspace that cannot be made, and a filesystem below the free-space
floor (`min_free_mb`, checked before a new workspace only) are `environment` outcomes:
uncharged, the issue blocked with the fix named (the hook by name; the floor with both
numbers), nothing of the agent started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from execkit._attempt import RunOutcome
from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit._exec import spawn
from execkit._proof import RunStatus
from execkit._validate import is_number
from execkit.dispatch._board import workspace_name

__all__ = [
    "DEFAULT_HOOK_TIMEOUT_S",
    "DEFAULT_MIN_FREE_MB",
    "HOOK_NAMES",
    "WorkspaceHooks",
    "Workspaces",
    "workspace_name",
]

DEFAULT_MIN_FREE_MB = 1024
"""The free-space floor by default: below 1 GiB free no new workspace is started (a
checkout and its build seldom need less; a full disk fails every agent on the host)."""

DEFAULT_HOOK_TIMEOUT_S = 300.0
"""How long a workspace hook may run by default (an `npm ci`, a venv) before it is stopped
and counted as failed."""

HOOK_NAMES = ("after_create", "before_attempt", "after_done")

_GIT_TIMEOUT_S = 120.0
_MARKS = ".execkit"


def _argv(name: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(part, str) and part and "\0" not in part for part in value)
    ):
        return tuple(value)
    raise InvalidInput(
        f"workspace.{name} must be a non-empty list of strings (a program and its "
        f'arguments, run without a shell: ["sh", "-c", "..."] for one), got {value!r}',
        field=f"workspace.{name}",
    )


@attrs.frozen
class WorkspaceHooks:
    """The board's workspace hooks: each an argv (None: no hook), run in the workspace
    with `timeout_s`, without a shell, with `EXECKIT_ISSUE_ID` and `EXECKIT_WORKSPACE`
    added to the environment.

    `after_create` once, when the workspace is made (before its first attempt);
    `before_attempt` before each attempt; `after_done` once the agent succeeded, before the
    issue counts as done. A hook that fails (cannot start, exits non-zero, runs past
    `timeout_s`) stops the issue on `environment`, naming the hook.
    """

    after_create: tuple[str, ...] | None = None
    before_attempt: tuple[str, ...] | None = None
    after_done: tuple[str, ...] | None = None
    timeout_s: float = DEFAULT_HOOK_TIMEOUT_S

    def __attrs_post_init__(self) -> None:
        for name in HOOK_NAMES:
            _argv(name, getattr(self, name))
        if not is_number(self.timeout_s) or self.timeout_s <= 0:
            raise InvalidInput(
                f"workspace.hook_timeout_s must be a finite number of seconds > 0, got "
                f"{self.timeout_s!r}",
                field="workspace.hook_timeout_s",
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> WorkspaceHooks:
        """From a board's `workspace` object: `after_create`, `before_attempt`,
        `after_done` (argv lists) and `hook_timeout_s`; InvalidInput naming the key for an
        unknown key or a bad value."""
        if not isinstance(raw, Mapping):
            raise InvalidInput("workspace must be an object", field="workspace")
        allowed = {*HOOK_NAMES, "hook_timeout_s"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise InvalidInput(
                f"workspace: unknown keys {unknown}; allowed: {sorted(allowed)}",
                field="workspace",
            )
        return cls(
            after_create=_argv("after_create", raw.get("after_create")),
            before_attempt=_argv("before_attempt", raw.get("before_attempt")),
            after_done=_argv("after_done", raw.get("after_done")),
            timeout_s=raw.get("hook_timeout_s", DEFAULT_HOOK_TIMEOUT_S),
        )


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _stopped(reason: str, fix: str) -> RunOutcome:
    """An environment outcome: the agent never started; `fix` is what to do."""
    return RunOutcome(
        RunStatus.FAILED, failure_class=FailureClass.ENVIRONMENT, reason=reason, precondition=fix
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


class Workspaces:
    """The workspaces of one dispatcher: a folder per board issue under `root` (see the
    module docstring). `repo` makes each a git worktree of that repository; `keep` keeps a
    done issue's workspace; `min_free_mb` is the free-space floor below which no new
    workspace is made; `hooks` are the board's. `free_bytes` reads the free space of a
    path's filesystem (a test's seam). InvalidInput for a `min_free_mb` below 0 or a
    `repo` that is not a git work tree."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        repo: str | os.PathLike[str] | None = None,
        keep: bool = False,
        min_free_mb: int = DEFAULT_MIN_FREE_MB,
        hooks: WorkspaceHooks | None = None,
        free_bytes: Callable[[Path], int] = _free_bytes,
    ) -> None:
        if isinstance(min_free_mb, bool) or not isinstance(min_free_mb, int) or min_free_mb < 0:
            raise InvalidInput(
                f"min_free_mb must be an integer >= 0 (megabytes), got {min_free_mb!r}",
                field="min_free_mb",
            )
        self.root = Path(root).absolute()
        self.repo = None if repo is None else Path(repo).absolute()
        self.keep = keep
        self.min_free_mb = min_free_mb
        self.hooks = WorkspaceHooks() if hooks is None else hooks
        self._free_bytes = free_bytes
        if self.repo is not None:
            found = self._git("rev-parse", "--is-inside-work-tree")
            if found.returncode != 0 or found.stdout.strip() != "true":
                raise InvalidInput(
                    f"--repo {self.repo} is not a git work tree: {_last_line(found.stderr)}",
                    field="repo",
                )

    # -- names ---------------------------------------------------------------------------

    def path_for(self, issue_id: str) -> Path:
        """Where `issue_id`'s workspace is (made or not)."""
        return self.root / workspace_name(issue_id)

    def branch_for(self, issue_id: str) -> str:
        """The branch of `issue_id`'s worktree (with a repo)."""
        return f"execkit/{workspace_name(issue_id)}"

    def _marker(self, issue_id: str) -> Path:
        return self.root / _MARKS / f"{workspace_name(issue_id)}.ready"

    def made(self, issue_id: str) -> bool:
        """Whether `issue_id`'s workspace is made (its marker written, its folder there)."""
        return self._marker(issue_id).exists() and self.path_for(issue_id).is_dir()

    # -- the slot's calls ----------------------------------------------------------------

    def prepare(self, issue_id: str) -> Path | RunOutcome:
        """The workspace `issue_id`'s next attempt runs in: made on its first attempt
        (under the free-space floor, the folder or worktree, `after_create`), kept after;
        then `before_attempt`. An environment `RunOutcome` when any step fails."""
        path = self.path_for(issue_id)
        if not self.made(issue_id):
            try:
                made = self._make(issue_id, path)
            except OSError as exc:
                # The root unwritable, a leftover that would not go, a full disk.
                return _stopped(
                    "workspace not created",
                    f"the workspace {path} could not be made: {exc}; fix the folder "
                    "(--workspaces), then move the card back",
                )
            if made is not None:
                return made
        failed = self._hook("before_attempt", issue_id, path)
        return path if failed is None else failed

    def after_done(self, issue_id: str) -> RunOutcome | None:
        """Run the `after_done` hook in the workspace of an issue whose agent succeeded:
        None when it passed (or there is none), else the environment outcome naming it."""
        path = self.path_for(issue_id)
        if not path.is_dir():
            return None
        return self._hook("after_done", issue_id, path)

    def remove(self, issue_id: str) -> bool:
        """Remove a done issue's workspace, unless `keep`: its marker first, then the
        folder (a worktree through git, then pruned; its branch stays). Whether it was
        removed. Never raises for a workspace that is not there."""
        if self.keep:
            return False
        path = self.path_for(issue_id)
        with contextlib.suppress(FileNotFoundError):
            self._marker(issue_id).unlink()
        if not path.exists() and self.repo is None:
            return False
        with self._locked():
            self._clear(path)
        return True

    # -- making one ----------------------------------------------------------------------

    def _make(self, issue_id: str, path: Path) -> RunOutcome | None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / _MARKS).mkdir(mode=0o700, exist_ok=True)
        floor = self.min_free_mb * 1024 * 1024
        free = self._free_bytes(self.root)
        if free < floor:
            return _stopped(
                "disk space",
                f"{free // (1024 * 1024)} MB free on the filesystem of {self.root}, below "
                f"the floor of {self.min_free_mb} MB (--min-free-mb): no new workspace is "
                "started; free space there (or lower the floor), then move the card back",
            )
        with self._locked():
            # A crash before the marker left this: it blocks nothing, it is cleared.
            self._clear(path)
            failed = self._worktree(issue_id, path) if self.repo is not None else None
            if failed is not None:
                return failed
            if self.repo is None:
                path.mkdir(mode=0o700)
        failed = self._hook("after_create", issue_id, path)
        if failed is not None:
            return failed
        marker = self._marker(issue_id)
        temp = marker.with_name(marker.name + ".tmp")
        temp.write_text(f"{issue_id}\n", encoding="utf-8")
        os.replace(temp, marker)
        return None

    def _worktree(self, issue_id: str, path: Path) -> RunOutcome | None:
        branch = self.branch_for(issue_id)
        known = self._git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        if known.returncode == 0:
            # Its branch from an earlier workspace (the issue was done and reopened, or a
            # crash came after git made it): the work on it is kept.
            made = self._git("worktree", "add", str(path), branch)
        else:
            made = self._git("worktree", "add", "-b", branch, str(path), "HEAD")
        if made.returncode == 0:
            return None
        self._clear(path)
        return _stopped(
            "workspace not created",
            f"git could not make the worktree {path} of {self.repo} on branch {branch}: "
            f"{_last_line(made.stderr) or f'git exited {made.returncode}'}; fix the "
            "repository (or --repo), then move the card back",
        )

    def _clear(self, path: Path) -> None:
        """Remove what is at `path` (a worktree through git first) and prune the worktrees
        git still lists whose folder is gone. Called under the root's lock."""
        if self.repo is not None:
            if path.exists():
                self._git("worktree", "remove", "--force", str(path))
            if path.exists() or path.is_symlink():
                _rmtree(path)
            self._git("worktree", "prune")
        elif path.exists() or path.is_symlink():
            _rmtree(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One git worktree change at a time in this root, across threads and processes
        (git's own lock files would refuse a second at once rather than wait)."""
        (self.root / _MARKS).mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.root / _MARKS / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _git(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.repo is not None
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
        try:
            return subprocess.run(
                ["git", "-C", str(self.repo), *args],
                capture_output=True,
                text=True,
                timeout=_GIT_TIMEOUT_S,
                env=env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(["git", *args], 1, "", str(exc))

    # -- hooks ---------------------------------------------------------------------------

    def _hook(self, name: str, issue_id: str, path: Path) -> RunOutcome | None:
        argv: Sequence[str] | None = getattr(self.hooks, name)
        if argv is None:
            return None
        env = {**os.environ, "EXECKIT_ISSUE_ID": issue_id, "EXECKIT_WORKSPACE": str(path)}
        result = spawn(list(argv), cwd=path, env=env, timeout=self.hooks.timeout_s)
        if result.ok:
            return None
        if result.spawn_errno is not None:
            how = f"could not start: {result.spawn_error}"
        elif result.timed_out:
            how = f"did not finish within {self.hooks.timeout_s:g} s"
        elif result.signal is not None:
            how = f"was killed by signal {result.signal}"
        else:
            how = f"exited {result.exit_code}"
        said = _last_line(result.failure_text(2000))
        return _stopped(
            f"workspace hook {name} failed",
            f"workspace hook {name} ({argv[0]}) {how}{': ' + said if said else ''}; fix the "
            f"board's workspace.{name} (run in {path}), then move the card back",
        )


def _rmtree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)
