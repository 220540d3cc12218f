"""`execkit demo` (what `make demo` runs): the dispatcher over four issues, in seconds.

A temporary board of four issues and a fresh ledger; the `generic` adapter runs small real
scripts standing in for a vendor CLI. They ship inside the package (`_demo_agents/`, package
data, run with this interpreter so no executable bit or `#!` line is relied on), so the demo
works from an installed wheel as from a checkout; the repository's `fixtures/bin/` links to
them for the tests. The clock is
virtual: when nothing is due it jumps to the next retry time, so the backoff is real but
nobody waits for it.

With `--json` the demo prints JSON lines instead of text (the shape is in `_JSON_HELP`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from execkit._adapter import AgentRequest, MappedResult, map_result
from execkit._attempt import AttemptOptions
from execkit._errors import InvalidInput, NotFound
from execkit._exec import ProcessStarter, SpawnResult
from execkit.cli._decide import attempt_to_json
from execkit.cli._dispatch import describe_event
from execkit.cli._output import emit, print_json, safe_text
from execkit.cli._status import format_status_table
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    BoardState,
    DispatchConfig,
    Dispatcher,
    DispatchEvent,
    EventKind,
    InlineExecutor,
    JsonFileBoard,
    issue_statuses,
    task_key,
)
from execkit.ledger import open_ledger

__all__ = ["register"]

# Bounds the loop whatever happens: the demo needs about ten passes.
_MAX_PASSES = 200
_MISSING_BINARY = "acme-agent"
_INSTALL_HINT = f"pip install {_MISSING_BINARY} (left out on purpose)"
# Where the virtual clock starts (2025-01-01 00:28 UTC). Fixed, not today's time, because
# the backoff jitter is seeded by the history's times: a fixed start prints the same
# retry times on every run, the ones the README quotes.
_VIRTUAL_EPOCH = 1_735_691_280.0

_JSON_HELP = (
    "With --json, stdout is JSON lines (one object per line) instead of text: one "
    '{"event": EVENT, "t": S} per dispatcher event as it happens (EVENT as `execkit '
    "dispatch --json` prints it; S: seconds of virtual time since the start), then one "
    'final {"status": {"now": T, "config": CONFIG, "issues": [ROW, ...]}, "kept": KEPT} '
    "(the dashboard as `execkit status --json` prints it, at virtual time T; KEPT is null, "
    'or with --keep {"dir": DIR, "board": FILE, "db": FILE, "histories": [FILE, ...]}).'
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `demo`."""
    demo = sub.add_parser(
        "demo",
        help="run the dispatcher over a four-issue demo board (a few seconds)",
        description=(
            "Dispatch a demo board of four issues through real scripts standing in for a "
            "vendor CLI: one succeeds, one's binary is missing, one hits a vendor 503 twice "
            "then succeeds, one always produces wrong output. Ends with the status table."
        ),
        epilog=_JSON_HELP,
    )
    demo.add_argument(
        "--keep",
        metavar="DIR",
        help="write the board and ledger into DIR (new or empty) and keep them",
    )
    demo.add_argument(
        "--json",
        action="store_true",
        help="print JSON lines: one object per event, then one with the status rows",
    )
    demo.set_defaults(handler=_demo)


@attrs.frozen
class _StandInAdapter:
    """The demo's stand-in vendor: any program, given per issue as its `argv` (like the
    `generic` adapter), whose install hint names the binary the demo leaves out. Defined
    here because execkit never imports the `adapters` package."""

    name: str = "demo"
    binary: str = ""
    install_hint: str = _INSTALL_HINT
    login_hint: str | None = None

    def build_argv(self, request: AgentRequest) -> list[str]:
        return [*request.extra_args, *([request.prompt] if request.prompt else [])]

    def parse(self, result: SpawnResult) -> MappedResult:
        return map_result(self, result)


class _VirtualClock:
    def __init__(self, start: float) -> None:
        self.start = start
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_to(self, at: float) -> None:
        self.now = max(self.now, at)


_AGENTS = Path(__file__).resolve().parent / "_demo_agents"


def _agent(name: str, *args: str) -> list[str]:
    """The argv that runs the stand-in agent `name` with this interpreter."""
    script = _AGENTS / name
    if not script.is_file():
        raise NotFound(
            f"the demo's stand-in agent {name} is missing from {_AGENTS}: "
            "reinstall execkit-runner (the directory is package data)"
        )
    return [sys.executable, str(script), *args]


def _issues() -> list[BoardIssue]:
    return [
        BoardIssue(
            "DEMO-1",
            "Fix the typo in the README",
            "todo",
            prompt="fix the typo in README.md",
            argv=_agent("fake-agent-ok"),
        ),
        BoardIssue(
            "DEMO-2",
            f"Summarise the changelog with {_MISSING_BINARY}",
            "todo",
            prompt="summarise CHANGELOG.md",
            argv=[_MISSING_BINARY],
        ),
        BoardIssue(
            "DEMO-3",
            "Draft release notes (the vendor is down for a while)",
            "todo",
            prompt="draft the release notes",
            argv=_agent("fake-agent-flaky", "--fail-times", "2", "--key", "DEMO-3"),
        ),
        BoardIssue(
            "DEMO-4",
            "Compute the answer (the agent always gets it wrong)",
            "todo",
            prompt="what is six times seven?",
            argv=_agent("fake-agent-wrong"),
        ),
    ]


def _workdir(keep: str | None) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    if keep is None:
        holder = tempfile.TemporaryDirectory(prefix="execkit-demo-")
        return Path(holder.name), holder
    path = Path(keep)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InvalidInput(f"--keep: {path} must be a new or empty directory", field="--keep")
    path.mkdir(parents=True, exist_ok=True)
    return path, None


def run_hint(which: Callable[[str], str | None], executable: str, cwd: Path) -> str | None:
    """How to run the `execkit` the demo ran as, when typing `execkit` would not run it
    (None when it would). `make demo` runs `.venv/bin/python -m execkit demo` from a shell
    whose PATH does not hold `.venv/bin`, so the README's `execkit ...` was "command not
    found" right after it. `which` is `shutil.which`, `executable` this interpreter and
    `cwd` the folder the user types in (a path under it is shown relative to it)."""
    bin_dir = Path(executable).parent
    command = bin_dir / "execkit"
    found = which("execkit")
    if found is not None and Path(found).resolve() == command.resolve():
        return None
    try:
        shown = bin_dir.relative_to(cwd)
    except ValueError:
        shown = bin_dir
    where = "" if found is None else f" (the `execkit` on your PATH is {found}, another one)"
    if not command.is_file():
        python = shown / Path(executable).name
        return f"execkit is not installed as a command here{where}: run `{python} -m execkit ...`"
    if (bin_dir / "activate").is_file():
        return (
            f"execkit is installed in {shown.parent}, which is not on your PATH{where}: run "
            f"`. {shown}/activate` first (then `execkit ...` as the README shows), or call "
            f"`{shown}/execkit ...`"
        )
    return (
        f"execkit is installed in {shown}{where}: add {shown} to your PATH, or call "
        f"`{shown}/execkit ...`"
    )


def _ledger_path(workdir: Path) -> Path:
    """Where the demo keeps its ledger: where `execkit` looks when run in `workdir` with no
    --db (`./.execkit/ledger.db`), so `cd DIR && execkit status` reads the kept demo."""
    return workdir / ".execkit" / "ledger.db"


def _demo(args: argparse.Namespace) -> int:
    workdir, holder = _workdir(args.keep)
    try:
        status = _run(workdir, args.start, as_json=args.json)
        kept: dict[str, Any] | None = None
        if args.keep:
            board, db = workdir / "board.json", _ledger_path(workdir)
            histories = _write_histories(workdir)
            kept = {
                "dir": str(workdir),
                "board": str(board),
                "db": str(db),
                "histories": [str(path) for path in histories],
            }
            if not args.json:
                last = histories[-1].relative_to(workdir)
                line = (
                    f"kept in {workdir}: cd {shlex.quote(str(workdir))} && execkit status; "
                    f"then execkit status --board board.json, execkit task show "
                    f"{last.stem}, execkit decide --history {last}"
                )
                emit(f"\n{safe_text(line)}")
        if args.json:
            print_json({"status": status, "kept": kept})
        else:
            hint = run_hint(shutil.which, sys.executable, Path.cwd())
            if hint is not None:
                emit(f"\n{safe_text(hint)}")
    finally:
        if holder is not None:
            holder.cleanup()
    return 0


def _run(workdir: Path, start: ProcessStarter, *, as_json: bool) -> dict[str, Any]:
    """Dispatch the demo board until it settles, printing as it goes (text or JSON lines);
    return the final dashboard as `execkit status --json` shapes it."""
    config = DispatchConfig(default_adapter=_StandInAdapter().name)
    states = [
        BoardState("todo", eligible=True),
        BoardState("done", terminal=True),
        BoardState("blocked", terminal=True),
    ]
    board = JsonFileBoard.create(
        workdir / "board.json", _issues(), states, dispatch=config.to_dict()
    )
    state_dir = workdir / "fixture-state"
    state_dir.mkdir()
    runner = AdapterRunner(
        _StandInAdapter(),
        AttemptOptions(start=start),
        env={"EXECKIT_FIXTURE_STATE": str(state_dir)},
    )
    clock = _VirtualClock(_VIRTUAL_EPOCH)

    def show(event: DispatchEvent) -> None:
        if as_json:
            print_json({"event": event.to_dict(), "t": event.at - clock.start})
        else:
            emit(f"t+{event.at - clock.start:>4.0f}s  {describe_event(event)}")

    started = time.monotonic()
    with open_ledger(_ledger_path(workdir), backoff=config.backoff) as ledger:
        budget = ledger.budget
        intro = (
            "execkit demo: 4 board issues; the generic adapter runs small scripts "
            "standing in for a vendor CLI.\n"
            f"Per issue: {budget.max_attempts} charged attempts (work), "
            f"{budget.max_uncharged_attempts} upstream failures in a row (uncharged), "
            f"{config.max_attempts} dispatches in all; retries back off "
            f"{config.base_backoff_s:g}s..{config.max_retry_backoff_s:g}s on a virtual clock "
            "(no real waiting).\n"
        )
        if not as_json:
            emit(intro)
        # One agent at a time, in the board's order: on a virtual clock, running side by
        # side would only shuffle the lines, and the README quotes them.
        dispatcher = Dispatcher(
            board, runner, ledger, config, clock, on_event=show, executor=InlineExecutor()
        )
        for _ in range(_MAX_PASSES):
            events = dispatcher.tick()
            due = dispatcher.next_due()
            if due is None:
                if not any(e.kind is EventKind.DISPATCHED for e in events):
                    break  # nothing ran and nothing waits: every issue has settled
                continue
            clock.advance_to(due)
        rows = issue_statuses(ledger, config, board=board, now=clock())
    elapsed = time.monotonic() - started
    status = {"now": clock(), "config": config.to_dict(), "issues": [r.to_dict() for r in rows]}
    if as_json:
        return status
    emit(f"\nstatus after {clock() - clock.start:.0f}s of virtual time ({elapsed:.1f}s real):\n")
    emit(format_status_table(rows, clock()))
    emit(
        "\nSTARTED counts every dispatch against the dispatch cap; CHARGED only the attempts "
        "that said something about the work,\nagainst the work budget; UNCHARGED is the "
        "current run of upstream failures against its ceiling.\nMissing binaries and vendor "
        "outages cost no budget."
    )
    return status


def _write_histories(workdir: Path) -> list[Path]:
    """Write each dispatched issue's attempt history, read back from the ledger, to
    `history/<ISSUE>.json` in the `execkit decide --history` format; the files, in board
    order."""
    out = workdir / "history"
    out.mkdir()
    written: list[Path] = []
    with open_ledger(_ledger_path(workdir)) as ledger:
        tasks = {task.title: task.id for task in ledger.list_tasks()}
        for issue in JsonFileBoard(workdir / "board.json").list_issues():
            task_id = tasks.get(task_key(issue.id))
            if task_id is None:
                continue
            attempts = [attempt_to_json(attempt) for attempt in ledger.history(task_id)]
            path = out / f"{issue.id}.json"
            path.write_text(json.dumps(attempts, indent=2) + "\n", encoding="utf-8")
            written.append(path)
    return written
