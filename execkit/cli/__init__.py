"""The `execkit` command line. Surfaces only: every rule lives in the library.

Each subcommand group lives in its own private module exposing `register(subparsers)`;
a handler takes the parsed namespace and returns the process exit code (one that spawns
starts its processes with `args.start`, the `ProcessStarter` given to `main`). Errors the
library raises on purpose (`ExecKitError`) become one line on stderr, or a JSON object
with `--json`, and a documented exit code; no traceback reaches the user.

Start-up is kept short: argv is read first, and only the group module of the command being
run is imported and given a parser (`_COMMANDS` names each command's module and holds its
one-line help, so `execkit --help` imports no group at all). This module imports nothing
heavy at its top, so `from execkit.cli import main` is cheap and Ctrl-C handling is in
place before the real work starts.

The common options `--json`, `--db PATH`, `--remote URL` and `--on-behalf-of NAME` may come
before the command as well as after it: `execkit --json task show t-1` is
`execkit task show t-1 --json`. A command that does not take one refuses it (`invalid`).
Anything after `--` belongs to the command `execkit run` runs.

Ctrl-C: when `main` runs the process's own command line (`argv` is None: the console
script, `python -m execkit`), an interrupt at any moment, while importing, parsing, running
a handler or printing, ends the process with exit 130 and one line on stderr, never a
traceback. While a handler runs, Ctrl-C is a `KeyboardInterrupt` so that the library's
cleanups run (a spawned process tree is killed) before that line; at every other moment the
process writes the line and exits at once. Given an explicit `argv`, `main` leaves the
caller's signal handlers alone and only turns a `KeyboardInterrupt` into that line and 130.
"""

from __future__ import annotations

import os
import signal
import sys

# Not `typing.TYPE_CHECKING`: this module imports only what the interpreter has loaded
# already (type checkers treat the name alike).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import FrameType
    from typing import Any

    from execkit._exec import ProcessStarter

__all__ = ["main"]

INTERRUPTED_EXIT = 130
_INTERRUPTED_LINE = b"execkit: interrupted\n"
_SIGPIPE_EXIT = 128 + 13

# Every public command: name -> (the private module under execkit.cli that registers it,
# its one-line help for `execkit --help`). Keep the help equal to what the module registers
# (tests/test_cli_startup.py checks both ways).
_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("_run", "run a command, stream its output, exit with its status"),
    "classify": ("_classify", "class a failure text: upstream (uncharged) or work (charged)"),
    "adapters": ("_adapters", "list vendor adapters and whether each binary is on PATH"),
    "decide": ("_decide", "explain what the attempt budgets say about a history"),
    "task": ("_ledger", "durable tasks with optional attempt limits"),
    "role": ("_ledger", "roles granted in the ledger (agent.operate, ledger.admin)"),
    "capabilities": ("_ledger", "what this ledger enforces"),
    "db": ("_ledger", "the ledger (a file or a PostgreSQL URL): schema, checks"),
    "lane": ("_lanes", "vendor lanes: list, show, resume, park"),
    "budget": ("_spend", "spend caps: per day, rolling 5h or week; per lane"),
    "spend": ("_spend", "what runs cost: USD and tokens by task, issue, lane, day or model"),
    "notify": ("_notify", "notification endpoints: add, list, test, enable, remove"),
    "dispatch": ("_dispatch", "dispatch the eligible issues of a board, with bounded retries"),
    "status": ("_status", "the dispatcher dashboard: issues, attempts, charges, next retry"),
    "serve": ("_serve", "serve a ledger over HTTP with token auth (for --remote and the SDKs)"),
    "demo": ("_demo", "run the dispatcher over a four-issue demo board (a few seconds)"),
}

# Internal commands, reached only as `execkit run start|finish` (the command to run after
# `execkit run` always follows `--`, so the two never collide). They are never listed,
# suggested or reachable under these names.
_INTERNAL: dict[str, str] = {
    "run-start": "_ledger",
    "run-finish": "_ledger",
    "run-heartbeat": "_ledger",
    "run-list": "_ledger",
}
_RUN_LEDGER_VERBS = {
    "start": "run-start",
    "finish": "run-finish",
    "heartbeat": "run-heartbeat",
    "list": "run-list",
}

# Options every command that has them accepts before the command too: flag -> namespace dest.
_COMMON_FLAGS = {
    "--json": "json",
    "--db": "db",
    "--remote": "remote",
    "--on-behalf-of": "on_behalf_of",
}
_VALUED_FLAGS = frozenset({"--db", "--remote", "--on-behalf-of"})

_DESCRIPTION = "Run vendor CLIs and charge retries only for informative attempts."
_EPILOG = (
    "--json, --db, --remote and --on-behalf-of may also come after COMMAND (`execkit --json "
    "task show t-1` is `execkit task show t-1 --json`); a command that does not take one "
    "refuses it. --remote URL (or $EXECKIT_REMOTE, when no --db is given) sends every ledger "
    "command to `execkit serve` at URL, with the bearer token in $EXECKIT_TOKEN. "
    "Everything after `--` belongs to the command `execkit run` runs. "
    "See `execkit COMMAND --help` for each command."
)


# -- Ctrl-C -----------------------------------------------------------------------------


class _Interrupts:
    """How one `main` call handles Ctrl-C (see the module docstring)."""

    def __init__(self, *, own_process: bool) -> None:
        # A process started with SIGINT ignored (a background job of a script) keeps
        # ignoring it, as Python itself does.
        self.own_process = own_process and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        self.reported = False

    def _exit_now(self, _signum: int, _frame: FrameType | None) -> None:
        self.report()
        os._exit(INTERRUPTED_EXIT)

    def exit_at_once(self) -> None:
        """Own process only: from now on Ctrl-C writes the line and exits 130 at once."""
        if self.own_process:
            signal.signal(signal.SIGINT, self._exit_now)

    def raise_while_running(self) -> None:
        """Own process only: Ctrl-C raises KeyboardInterrupt, so cleanups run first."""
        if self.own_process:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def ignore_from_now(self) -> None:
        """Own process only: the work is done and its output flushed; ignore Ctrl-C until
        the process has exited (the interpreter's finalization would otherwise restore
        SIGINT's default action, which ends a process quietly with -SIGINT)."""
        if self.own_process:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def report(self) -> int:
        """Write the one line (once) and return the exit code."""
        if not self.reported:
            self.reported = True
            try:
                if self.own_process:
                    # Straight to the descriptor: safe inside a signal handler, even one
                    # that interrupted a write to sys.stderr.
                    os.write(2, _INTERRUPTED_LINE)
                else:
                    sys.stderr.write(_INTERRUPTED_LINE.decode())
                    sys.stderr.flush()
            except (OSError, ValueError):
                pass  # no usable stderr: the exit code still says it
        return INTERRUPTED_EXIT


# -- parsing ----------------------------------------------------------------------------


def _new_parser(**kwargs: Any) -> argparse.ArgumentParser:
    """A `CliParser` (`execkit.cli._args`): usage errors are `invalid` input."""
    from execkit.cli._args import CliParser

    return CliParser(**kwargs)


def _help_parser() -> argparse.ArgumentParser:
    """`execkit --help`: every public command with its one-line help; imports no group."""
    parser = _new_parser(prog="execkit", description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument(
        "--json", action="store_true", help="print JSON (every command that prints)"
    )
    parser.add_argument(
        "--db",
        metavar="PATH",
        help="ledger file, for the commands that use one "
        "(default: $EXECKIT_DB, else ./.execkit/ledger.db)",
    )
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="send ledger commands to `execkit serve` at URL instead of opening --db "
        "(default: $EXECKIT_REMOTE; the token is read from $EXECKIT_TOKEN, never a flag)",
    )
    parser.add_argument(
        "--on-behalf-of",
        metavar="NAME",
        help="you act for NAME (recorded as 'you on behalf of NAME'; you are the "
        "operating-system user running execkit, and your roles are yours)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, one_line) in _COMMANDS.items():
        sub.add_parser(name, help=one_line, add_help=False)
    return parser


def _usage_error(message: str) -> Exception:
    from execkit._errors import InvalidInput

    return InvalidInput(f"execkit: {message} (see 'execkit --help')")


def _split_common(tokens: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    """The common options before the command, and the command with everything after it.

    `-h`/`--help` there prints the top-level help and `--version` the installed version;
    each raises SystemExit(0), as argparse does.
    """
    given: dict[str, str | bool] = {}
    index = 0
    while index < len(tokens) and tokens[index].startswith("-") and tokens[index] != "-":
        token = tokens[index]
        if token in ("-h", "--help"):
            _help_parser().print_help()
            raise SystemExit(0)
        if token == "--version":
            from execkit._version import installed_version

            sys.stdout.write(f"execkit {installed_version()}\n")
            raise SystemExit(0)
        flag, equals, value = token.partition("=")
        if flag not in _COMMON_FLAGS or (equals and flag not in _VALUED_FLAGS):
            raise _usage_error(f"unrecognized option before the command: {token!r}")
        index += 1
        if flag in _VALUED_FLAGS:
            if not equals:
                if index >= len(tokens):
                    raise _usage_error(f"argument {flag}: expected one argument")
                value = tokens[index]
                index += 1
            given[_COMMON_FLAGS[flag]] = value
        else:
            given[_COMMON_FLAGS[flag]] = True
    return given, tokens[index:]


def _unknown_command(command: str) -> Exception:
    import difflib

    public = list(_COMMANDS)
    close = difflib.get_close_matches(command, public, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return _usage_error(
        f"unknown command {command!r}{hint} (choose from {', '.join(map(repr, public))})"
    )


def _leaf(parser: argparse.ArgumentParser, tokens: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser that `tokens` end up in: the one whose options they were given."""
    import argparse

    current = parser
    for token in tokens:
        actions = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions:
            break
        chosen = actions[0].choices.get(token)
        if isinstance(chosen, argparse.ArgumentParser):
            current = chosen
    return current


def _parse(tokens: list[str]) -> argparse.Namespace:
    """Read argv: the common options, the command, then only that command's parser."""
    given, rest = _split_common(tokens)
    if not rest:
        raise _usage_error("the following arguments are required: COMMAND")
    command = rest[0]
    if command == "run" and len(rest) > 1 and rest[1] in _RUN_LEDGER_VERBS:
        name = _RUN_LEDGER_VERBS[rest[1]]
        module, argv = _INTERNAL[name], [name, *rest[2:]]
    elif command in _COMMANDS:
        module, argv = _COMMANDS[command][0], rest
    else:
        raise _unknown_command(command)
    parser = _new_parser(prog="execkit", description=_DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # `__import__` rather than importlib.import_module: the same import, and one that
    # `python -X importtime` reports (import_module bypasses its accounting).
    __import__(f"execkit.cli.{module}", fromlist=["register"]).register(sub)
    args = parser.parse_args(argv)
    if given:
        _apply_common(args, given, _leaf(parser, argv).prog)
    if hasattr(args, "db"):
        from execkit.cli._args import parse_db

        args.db = parse_db(args.db)
    return args


def _apply_common(args: argparse.Namespace, given: dict[str, str | bool], prog: str) -> None:
    """Put the common options given before the command onto its namespace."""
    from execkit._errors import InvalidInput

    for dest, value in given.items():
        flag = f"--{dest.replace('_', '-')}"
        if not hasattr(args, dest):
            raise InvalidInput(
                f"{prog}: {flag} does not apply to this command (see '{prog} --help')",
                field=flag,
            )
        current = getattr(args, dest)
        if dest != "json" and current is not None and current != value:
            raise InvalidInput(
                f"{prog}: {flag} given both before and after the command, with different "
                f"values ({value!r}, {current!r})",
                field=flag,
            )
        setattr(args, dest, value)


def _asks_for_json(args_list: list[str]) -> bool:
    """Whether `--json` was given to execkit itself (not to a command after `--`)."""
    own = args_list[: args_list.index("--")] if "--" in args_list else args_list
    return "--json" in own


# -- running ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *, start: ProcessStarter | None = None) -> int:
    """Run the CLI and return its exit code; raises only SystemExit for `--help` (given an
    explicit `argv`; for the process's own arguments it returns that code too).

    `argv` defaults to the process's own arguments, and then `main` also owns the
    process's Ctrl-C handling (module docstring). `start` is how the commands that spawn
    (`run`, `run --adapter`, `dispatch`) start their processes (`spawn`'s seam; default
    `subprocess.Popen`); a test passes `fake_vendor.start`.
    """
    interrupts = _Interrupts(own_process=argv is None)
    interrupts.exit_at_once()
    try:
        tokens = list(sys.argv[1:] if argv is None else argv)
        code = _main(tokens, start, interrupts)
    except KeyboardInterrupt:
        interrupts.exit_at_once()
        code = interrupts.report()
    except SystemExit as exc:  # `--help`, printed already
        if not interrupts.own_process or not isinstance(exc.code, int | None):
            raise
        interrupts.exit_at_once()
        code = exc.code or 0
    if interrupts.own_process:
        # Flushed here, where Ctrl-C still exits at once, rather than at interpreter exit.
        code = _flush_stdout(code)
        interrupts.ignore_from_now()
    return code


def _flush_stdout(code: int) -> int:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        return code if code == INTERRUPTED_EXIT else _SIGPIPE_EXIT
    except (OSError, ValueError):
        pass  # stdout closed or unusable: nothing more to say
    return code


def _stdout_to_devnull() -> None:
    # Point stdout at /dev/null so Python's flush at exit does not complain again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _main(tokens: list[str], start: ProcessStarter | None, interrupts: _Interrupts) -> int:
    from execkit._errors import ExecKitError, InvalidInput

    try:
        args = _parse(tokens)
    except InvalidInput as exc:
        from execkit.cli._output import report_error

        return report_error(exc, as_json=_asks_for_json(tokens))
    # Every group imports _output itself; `execkit --help` (above) never needs it.
    from execkit.cli._output import report_error, report_internal_error

    if start is None:
        # The default starter, from `subprocess` where the command's group already loaded
        # it: every group that starts processes (run, dispatch, demo, adapters, classify)
        # imports it with the spawner, and a ledger command does not pay for importing it.
        loaded = sys.modules.get("subprocess")
        start = None if loaded is None else loaded.Popen
    # On the namespace, so every handler keeps the one-argument shape `handler(args)`.
    args.start = start
    as_json = bool(getattr(args, "json", False))
    try:
        interrupts.raise_while_running()
        code: int = args.handler(args)
        interrupts.exit_at_once()
        return code
    except ExecKitError as exc:
        interrupts.exit_at_once()
        return report_error(exc, as_json=as_json)
    except BrokenPipeError:
        interrupts.exit_at_once()
        # The reader went away (`| head`): exit as a shell reports death by SIGPIPE.
        _stdout_to_devnull()
        return _SIGPIPE_EXIT
    except Exception as exc:  # the last line of defence: never a traceback
        interrupts.exit_at_once()
        if os.environ.get("EXECKIT_DEBUG"):
            raise
        return report_internal_error(exc)
