"""`execkit dispatch`: the scheduling loop over a board (`execkit status` is in `_status`).

Settings come from the board file's `dispatch` object, then the flags; the rules are all in
`execkit.dispatch`. With `--remote URL` (or `$EXECKIT_REMOTE`) both work on the ledger
`execkit serve` serves there (the dispatcher runs unchanged over `RemoteLedger`); the
backoff is then the server's, and a board asking for another one is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from execkit._budget import BlockedOn
from execkit._errors import InvalidInput, LaneStopped, TaskBlocked
from execkit.cli._ledger import open_remote, remote_url
from execkit.cli._output import emit, print_json, safe_text
from execkit.dispatch import MAX_CONCURRENT_AGENTS, DispatchConfig, JsonFileBoard
from execkit.ledger import Ledger, open_ledger

# What only a running dispatcher needs (the scheduler, the runner and through them the
# adapter registry, the redactor and the log machinery) is imported where it runs (each
# name of `execkit.dispatch` loads its own room): `execkit status` reads its options and
# helpers from this module and runs none of it.
if TYPE_CHECKING:
    from execkit.dispatch import Board, Dispatcher, DispatchEvent, Workspaces

__all__ = ["describe_event", "register"]

_DEFAULT_INTERVAL_S = 10.0
_DEFAULT_DRAIN_S = 30.0
# `--until-idle`'s exit when an issue ended blocked: the `blocked` error's exit code.
_BLOCKED_EXIT = TaskBlocked.exit_code
# `--until-idle`'s exit when issues are left that a stopped vendor lane holds (only a
# person opens it): the `lane_stopped` error's exit code.
_LANE_STOPPED_EXIT = LaneStopped.exit_code


def _max_attempts_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 1, or negative for no cap; got {text!r}"
        ) from None


def _concurrency_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CONCURRENT_AGENTS:
        raise argparse.ArgumentTypeError(
            f"must be an integer from 1 to {MAX_CONCURRENT_AGENTS}; got {text!r}"
        )
    return value


def _adapter_cap_arg(text: str) -> tuple[str, int]:
    name, equals, count = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"must be NAME=N (an adapter and a count); got {text!r}")
    return name.strip(), _concurrency_arg(count)


def _drain_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0; got {text!r}")
    return value


def _interval_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0; got {text!r}")
    return value


# Here, not imported: `execkit status` loads this module and must not load the workspaces.
DEFAULT_MIN_FREE_MB = 1024


def _free_mb_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 (megabytes); got {text!r}")
    return value


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `dispatch` (`status` is `_status`'s)."""
    dispatch = sub.add_parser(
        "dispatch",
        help="dispatch the eligible issues of a board, with bounded retries",
        description=(
            "Dispatch every eligible board issue whose backoff has elapsed through an "
            "adapter, recording each dispatch in the ledger. A failure is retried with "
            "capped exponential backoff while its class allows (environment: never; "
            "upstream: up to the uncharged ceiling; work: up to the work budget) and the "
            "dispatch cap holds; then the issue is moved to the failed state. Moving it "
            "back to an eligible state retries it once."
        ),
    )
    dispatch.add_argument(
        "--board",
        required=True,
        metavar="BOARD",
        help="a board JSON file, github:OWNER/REPO (a repository's issues), "
        "github-project:OWNER/NUMBER (a GitHub Project's items; the token in $GITHUB_TOKEN or "
        "$GH_TOKEN, the API in $GITHUB_API_URL), linear:TEAM (a Linear team's issues; the "
        "key in $LINEAR_API_KEY), gitlab:GROUP/PROJECT (a GitLab project's issues; the token "
        "in $GITLAB_TOKEN, the instance in $GITLAB_URL) or jira:PROJECT (a Jira project's "
        "issues; $JIRA_URL, $JIRA_EMAIL and $JIRA_API_TOKEN)",
    )
    dispatch.add_argument(
        "--board-config",
        metavar="FILE",
        help="with a tracker board, a JSON file of its settings: a `github` object "
        "(labels, comments in the prompt, close on done), a `github_project` object (the "
        "Status options that are eligible, terminal, done, failed), a `linear` object (the "
        "workflow states), a `gitlab` object (labels, close on done), a `jira` object (JQL, "
        "statuses) and a `dispatch` object (docs/formats.md)",
    )
    dispatch.add_argument(
        "--adapter",
        metavar="NAME",
        help="the adapter of every issue that names none (default: the board's "
        "dispatch.default_adapter, else generic)",
    )
    dispatch.add_argument(
        "--concurrency",
        type=_concurrency_arg,
        metavar="N",
        help=f"agents running at once, each in its own slot (1..{MAX_CONCURRENT_AGENTS}; "
        "default 4)",
    )
    dispatch.add_argument(
        "--adapter-concurrency",
        action="append",
        type=_adapter_cap_arg,
        metavar="NAME=N",
        help="at most N agents at once on adapter NAME (repeatable)",
    )
    dispatch.add_argument(
        "--drain-timeout",
        type=_drain_arg,
        default=_DEFAULT_DRAIN_S,
        metavar="S",
        help="on SIGTERM or Ctrl-C, seconds the running agents get to finish before their "
        f"trees are stopped and their runs recorded as stopped (default {_DEFAULT_DRAIN_S:g}; "
        "a second signal stops them at once)",
    )
    mode = dispatch.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one pass, then exit")
    dispatch.add_argument(
        "--until-idle",
        action="store_true",
        help="run until no agent runs and no issue is ready or backing off, then exit: "
        f"{_LANE_STOPPED_EXIT} when issues are left that only a person can let run (a "
        f"stopped vendor lane: the message names the fix), {_BLOCKED_EXIT} when an issue "
        "ended blocked, else 0 (for cron and CI)",
    )
    mode.add_argument(
        "--interval",
        type=_interval_arg,
        metavar="S",
        help=f"seconds between passes (default {_DEFAULT_INTERVAL_S:g}); runs until Ctrl-C",
    )
    _add_common(dispatch)
    dispatch.add_argument(
        "--timeout", type=_interval_arg, metavar="S", help="kill one agent run after S seconds"
    )
    dispatch.add_argument(
        "--workspaces",
        metavar="DIR",
        help="give each issue a workspace of its own, DIR/<issue id>, made before its first "
        "attempt and kept across its attempts: its agent's working directory; removed when "
        "the issue is done (unless --keep-workspaces), kept when it is blocked; hooks: the "
        "board's `workspace` object",
    )
    dispatch.add_argument(
        "--repo",
        metavar="PATH",
        help="with --workspaces: make each workspace a git worktree of the repository PATH "
        "on its own branch, execkit/<issue id>",
    )
    dispatch.add_argument(
        "--keep-workspaces",
        action="store_true",
        help="with --workspaces: keep a done issue's workspace",
    )
    dispatch.add_argument(
        "--min-free-mb",
        type=_free_mb_arg,
        metavar="N",
        help="with --workspaces: start no new workspace while the filesystem has less than "
        f"N MB free (an environment stop naming both numbers; default {DEFAULT_MIN_FREE_MB})",
    )
    dispatch.add_argument(
        "--stall-timeout",
        type=_interval_arg,
        metavar="S",
        help="stop an agent that prints no byte for S seconds: a charged work failure "
        "(`stalled: no output for S s`) unless its adapter reads that a vendor request was "
        "in flight (then upstream); default: the adapter's own, if it sets one",
    )
    dispatch.set_defaults(handler=_dispatch)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH", help="ledger file (default $EXECKIT_DB)")
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="the ledger `execkit serve` serves at URL (default $EXECKIT_REMOTE when no --db "
        "is given; the token is read from $EXECKIT_TOKEN)",
    )
    parser.add_argument(
        "--max-attempts",
        type=_max_attempts_arg,
        metavar="N",
        help="dispatch cap per issue (default 10; negative = no cap)",
    )
    parser.add_argument(
        "--failed-state",
        metavar="S|none",
        help="board state for a given-up issue (default blocked; none = never move)",
    )
    parser.add_argument("--json", action="store_true", help="JSON output")


def _workspaces(args: argparse.Namespace, board: JsonFileBoard | None) -> Workspaces | None:
    """The dispatcher's workspaces from `--workspaces`, `--repo`, `--keep-workspaces`,
    `--min-free-mb` and the board's `workspace` hooks; None without `--workspaces`."""
    given = [
        flag
        for flag, value in (
            ("--repo", args.repo),
            ("--keep-workspaces", args.keep_workspaces),
            ("--min-free-mb", args.min_free_mb),
        )
        if value not in (None, False)
    ]
    if args.workspaces is None:
        if given:
            raise InvalidInput(
                f"execkit dispatch: {given[0]} needs --workspaces DIR (where the issues' "
                "workspaces go)",
                field="workspaces",
            )
        return None
    from execkit.dispatch import WorkspaceHooks, Workspaces

    hooks = WorkspaceHooks.from_mapping(board.workspace_settings() if board else {})
    return Workspaces(
        args.workspaces,
        repo=args.repo,
        keep=args.keep_workspaces,
        min_free_mb=DEFAULT_MIN_FREE_MB if args.min_free_mb is None else args.min_free_mb,
        hooks=hooks,
    )


def _config(
    args: argparse.Namespace, board: JsonFileBoard | None, extra: Any = None
) -> DispatchConfig:
    settings: dict[str, Any] = board.dispatch_settings() if board is not None else {}
    settings.update(extra or {})
    if args.max_attempts is not None:
        settings["max_attempts"] = args.max_attempts
    if args.failed_state is not None:
        settings["failed_state"] = args.failed_state
    if getattr(args, "adapter", None) is not None:
        settings["default_adapter"] = args.adapter
    if getattr(args, "concurrency", None) is not None:
        settings["max_concurrent_agents"] = args.concurrency
    if getattr(args, "adapter_concurrency", None):
        caps = dict(settings.get("max_concurrent_per_adapter") or {})
        caps.update(args.adapter_concurrency)
        settings["max_concurrent_per_adapter"] = caps
    return DispatchConfig.from_mapping(settings)


def _when(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    delta = at - now
    if delta <= 0:
        return "due"
    return f"in {_duration(delta)}"


def _duration(seconds: float) -> str:
    from execkit._stamp import span

    return span(seconds)


def describe_event(event: DispatchEvent, now: float | None = None) -> str:
    """One line for a human: issue, attempt n/max, class, reason, charged, what next.

    Its control characters are escaped (`safe_text`): the issue id, reason and states come
    from the board and the agent, and must not rewrite the operator's terminal.
    """
    return safe_text(_describe(event, now))


def _resumed(event: DispatchEvent) -> str:
    """ " (resumed session ID after the usage limit)" for a run that resumed its vendor
    session (issue #46), else ""."""
    if event.resumed_session is None:
        return ""
    from execkit._attempt import resume_line

    said = resume_line(
        event.resumed_session, event.resumed_after, refused=bool(event.resume_refused)
    )
    return f" ({said})"


def _describe(event: DispatchEvent, now: float | None) -> str:
    from execkit._proof import RunStatus
    from execkit.dispatch import EventKind

    at = event.at if now is None else now
    cap = f"/{event.max_attempts}" if event.max_attempts else ""
    attempt = f"attempt {event.attempt}{cap}" if event.attempt else "-"
    if event.kind is EventKind.DISPATCHED:
        if event.status is RunStatus.SUCCEEDED:
            head = f"{event.issue_id}  {attempt}  succeeded"
        else:
            klass = (
                event.failure_class.value
                if event.failure_class
                else "work"
                if event.charged is not False
                else "stopped"  # by a spend window (issue #45): no class, uncharged
            )
            charged = "charged" if event.charged else "uncharged"
            head = f"{event.issue_id}  {attempt}  {klass} ({charged}): {event.reason or '-'}"
        if event.moved_to:
            tail = f" -> moved to {event.moved_to}"
            if event.lane_stopped:
                # The fix said one way: the lane's resume brings this card back too.
                tail += (
                    f" (its lane stopped: fix it, then `execkit lane resume {event.lane_stopped}`)"
                )
            elif event.blocked_on is BlockedOn.SPEND:
                # The fix said one way: the raise its reason names brings this card back.
                tail += f" ({event.decision or event.blocked_on}; the raise brings the card back)"
            elif event.blocked_on and event.blocked_on is not BlockedOn.ENVIRONMENT:
                tail += f" ({event.decision or event.blocked_on}; move the card back to retry once)"
            elif event.blocked_on:
                tail += " (blocked on environment: fix it, then move the card back to retry once)"
        elif event.falls_back:
            # Issue #46: its own run closed its lane; another adapter of its order is open.
            tail = " -> its lane is closed: the next attempt falls back to the next open adapter"
        elif event.blocked_on:
            tail = f" -> blocked on {event.blocked_on}, not moved: {event.decision or '-'}"
            if event.next_attempt_at is not None:
                tail += f"; retry {_when(event.next_attempt_at, at)}"
        elif event.next_attempt_at is not None:
            tail = f" -> retry {_when(event.next_attempt_at, at)}"
        else:
            tail = ""
        if event.workspace is not None and event.blocked_on:
            # Blocked: its workspace stays for the person who looks (issue #46).
            tail += f"; workspace kept: {event.workspace}"
        fell_back = f" ({event.fell_back})" if event.fell_back else ""
        return head + fell_back + _resumed(event) + tail
    if event.kind is EventKind.GAVE_UP:
        said = f"{event.issue_id}  gave up -> moved to {event.moved_to}: {event.decision or '-'}"
        if event.blocked_on is BlockedOn.SPEND and event.moved_to:
            said += "; the raise brings the card back"
        return said
    if event.kind is EventKind.DONE:
        where = f" -> moved to {event.moved_to}" if event.moved_to else " (board move failed)"
        return f"{event.issue_id}  already succeeded{where}"
    if event.kind is EventKind.WAITING:
        # Said once a lane's wait: the lane's other issues wait with it, unprinted.
        return (
            f"{event.issue_id}  waiting: {event.reason or '-'} "
            "(its lane's other issues wait too: `execkit status` lists them)"
        )
    reason = event.decision or event.reason or "-"
    return f"{event.issue_id}  {event.kind}: {reason}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _setup_logging() -> None:
    import logging

    from execkit.cli._output import log_handler

    # The give-up warnings are for the operator: show them on stderr (basicConfig is a
    # no-op when the embedding program configured logging already).
    logging.basicConfig(level=logging.WARNING, handlers=[log_handler("execkit")])


def _dispatch(args: argparse.Namespace) -> int:
    if args.once and args.until_idle:
        raise InvalidInput(
            "execkit dispatch: --once and --until-idle are two different ends: give one "
            "(see 'execkit dispatch --help')",
            field="until_idle",
        )
    from execkit._attempt import AttemptOptions
    from execkit._prices import load_prices
    from execkit._registry import get_adapter
    from execkit.dispatch import AdapterRunner, Dispatcher

    # An operator's price file ($EXECKIT_PRICES) is read by each run's result: a bad one
    # stops the command here, before anything runs, not as a runner error in every slot.
    load_prices()
    _setup_logging()
    tracker = _tracker_spec(args.board)
    board_file = None if tracker is not None else JsonFileBoard(args.board)
    board_config = board_config_of(args, tracker)
    config = _config(args, board_file, board_config.get("dispatch"))
    # The default adapter is the command's own choice: a name nobody knows stops here
    # (not_found), before anything runs. An issue's own unknown adapter stops that issue.
    # `main` takes the default starter from `subprocess` where the group's import loaded
    # it; this group loads the spawner only here, so the default is taken here too.
    start = args.start
    if start is None:
        import subprocess

        start = subprocess.Popen
    runner = AdapterRunner(
        get_adapter(config.default_adapter),
        AttemptOptions(start=start, stall_timeout_s=args.stall_timeout),
        timeout_s=args.timeout,
    )
    ended_blocked: dict[str, bool] = {}
    people: list[LaneStopped] = []

    def show(event: DispatchEvent) -> None:
        ended_blocked[event.issue_id] = _ends_blocked(event, config)
        if args.json:
            print_json(event.to_dict())
        else:
            emit(describe_event(event))

    url = remote_url(args)
    ledger: Ledger = (
        open_remote(url) if url is not None else open_ledger(args.db, backoff=config.backoff)
    )
    try:
        board: Board = (
            board_file if board_file is not None else tracker_board(tracker, ledger, board_config)
        )
        dispatcher = Dispatcher(
            board,
            runner,
            ledger,
            config,
            time.time,
            on_event=show,
            workspaces=_workspaces(args, board_file),
        )
        from execkit._notify import sender_owner, sending

        # Issue #49: this dispatcher sends the ledger's notifications while it runs (a
        # ledger behind a server: the server sends them).
        opener = None if url is not None else functools.partial(open_ledger, args.db)
        with (
            sending(opener, sender_owner("dispatch")),
            _StopOnSignals(dispatcher) as signals,
        ):
            try:
                if args.once:
                    ran = dispatcher.tick() or dispatcher.running
                    if not ran and not args.json:  # "did it run?": no, and when it will
                        from execkit.cli._due import nothing_due_line

                        emit(nothing_due_line(board, ledger, config))
                elif args.until_idle:
                    interval = args.interval or _DEFAULT_INTERVAL_S
                    if dispatcher.idle() and not args.json:
                        # Nothing to do from the start: one line, not a silent exit.
                        from execkit.cli._due import nothing_due_line

                        emit(nothing_due_line(board, ledger, config))
                    dispatcher.run_forever(interval, stop=dispatcher.idle)
                    people = dispatcher.waiting_on_people()
                else:
                    interval = args.interval if args.interval is not None else _DEFAULT_INTERVAL_S
                    dispatcher.run_forever(interval)
            finally:
                # Each event of a slot that ends during the drain reaches `show` through
                # the dispatcher's event hook as it happens; the list `shutdown` returns
                # holds the same events again (for callers with no hook), so it is not shown.
                dispatcher.shutdown(args.drain_timeout)
                if url is None:
                    _tell_stopped(ledger, dispatcher, signals.received, people)
        if signals.received is not None:
            return 128 + signals.received
    finally:
        ledger.close()
    if args.until_idle and people:
        for stopped in people:
            emit(f"execkit: {_people_line(stopped)}", err=True)
        return _LANE_STOPPED_EXIT
    if args.until_idle and any(ended_blocked.values()):
        return _BLOCKED_EXIT
    return 0


def _tracker_spec(spec: str) -> str | None:
    """The spec of a tracker board (`github:OWNER/REPO`, `linear:TEAM`, ...: the kinds
    `execkit.dispatch.TRACKERS` names), else None (a board file's path)."""
    from execkit.dispatch import tracker_kind

    return spec if tracker_kind(spec) is not None else None


def _tell_stopped(
    ledger: Ledger, dispatcher: Any, signal_number: int | None, people: list[LaneStopped]
) -> None:
    """Issue #49: a dispatcher that ends with work left says so (`tell_dispatcher_stopped`);
    telling must not hide how the dispatcher ended."""
    if signal_number is None and not people:
        return
    from execkit._notify import sender_owner, tell_dispatcher_stopped

    with contextlib.suppress(Exception):
        tell_dispatcher_stopped(
            ledger,
            sender_owner("dispatch"),
            left=len(list(dispatcher.tracker.list_candidates())),
            signal_number=signal_number,
            stopped_lanes=[p.lane or "-" for p in people],
        )


def board_config_of(args: argparse.Namespace, tracker: str | None) -> dict[str, Any]:
    """The `--board-config` file's settings ({} without one); refused with a board file
    (whose settings are in the file itself). A tracker whose configuration names its done
    and failed states (a project board, Linear) starts `dispatch` from them."""
    path = getattr(args, "board_config", None)
    if path is not None and tracker is None:
        raise InvalidInput(
            "--board-config goes with a tracker board (github:, github-project:, linear:, "
            "...); a board file holds its own settings",
            field="board_config",
        )
    settings: dict[str, Any] = {}
    if path is not None:
        from execkit.dispatch import read_board_config

        settings = read_board_config(path)
    if tracker is not None:
        from execkit.dispatch import tracker_dispatch_states

        implied = tracker_dispatch_states(tracker, settings, os.environ)
        if implied:
            settings["dispatch"] = {**implied, **settings.get("dispatch", {})}
    return settings


def tracker_board(
    spec: str | None, ledger: Ledger, settings: Mapping[str, Any], *, read_only: bool = False
) -> Board:
    """The tracker board `spec` names (docs/formats.md): its credentials from the
    environment, the rest from `settings` (the board configuration file). InvalidInput
    naming what is missing."""
    assert spec is not None
    from execkit.dispatch import open_tracker

    return open_tracker(spec, ledger, os.environ, settings, read_only=read_only)


def _people_line(stopped: LaneStopped) -> str:
    """Why `--until-idle` ended with work left: the stopped lane, its fix, the command."""
    fix = f" ({stopped.fix})" if stopped.fix else ""
    return safe_text(
        f"nothing more can run until a person acts: lane {stopped.lane} is stopped{fix}; "
        f"fix it, then `execkit lane resume {stopped.lane}`"
    )


def _ends_blocked(event: DispatchEvent, config: DispatchConfig) -> bool:
    """Whether the issue stands blocked after `event` (given up into the failed state,
    blocked where it stands, or at its explicit limit)."""
    from execkit.dispatch import EventKind

    if event.kind in (EventKind.GAVE_UP, EventKind.BLOCKED, EventKind.ATTEMPT_LIMIT):
        return True
    if event.kind is EventKind.DISPATCHED:
        return event.blocked_on is not None
    return False


class _StopOnSignals:
    """While the dispatcher runs: the first SIGTERM or SIGINT (Ctrl-C) asks it to stop
    taking work and drain; a second one stops its agents at once. The handlers in place
    before are put back after."""

    _SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._before: dict[int, Any] = {}
        self.received: int | None = None

    def _handle(self, signum: int, _frame: object) -> None:
        hurry = self.received is not None
        self.received = signum
        if not hurry:
            running = len(self._dispatcher.running)
            os.write(
                2,
                f"execkit: stopping ({signal.Signals(signum).name}): no new work; "
                f"{running} agent(s) running (a second signal stops them now)\n".encode(),
            )
        self._dispatcher.request_stop(hurry=hurry)

    def __enter__(self) -> _StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self._SIGNALS:
                self._before[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)
