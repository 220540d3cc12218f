"""The `execkit` command line. Surfaces only: every rule lives in the library.

Each subcommand group lives in its own private module exposing `register(subparsers)`;
a handler takes the parsed namespace and returns the process exit code (one that spawns
starts its processes with `args.start`, the `ProcessStarter` given to `main`). Errors the
library raises on purpose (`ExecKitError`) become one line on stderr, or a JSON object
with `--json`, and a documented exit code; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import NoReturn

from execkit._errors import ExecKitError, InvalidInput
from execkit._exec import ProcessStarter
from execkit.cli import _adapters, _classify, _decide, _demo, _dispatch, _ledger, _run
from execkit.cli._output import INTERNAL_ERROR_EXIT, report_error

__all__ = ["main"]

_GROUPS = (_run, _classify, _adapters, _decide, _ledger, _dispatch, _demo)

# `execkit run -- CMD` runs a command; `execkit run start|finish` are ledger operations.
# The command to run always follows `--`, so the two never collide.
_SIGPIPE_EXIT = 128 + 13

_RUN_LEDGER_VERBS = {"start": "run-start", "finish": "run-finish"}


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are `invalid` input like any other.

    Plain argparse prints usage and exits 2; raising instead gives a bad flag value the
    same documented exit code and, with `--json`, the same JSON error object as every
    other invalid input. Subparsers inherit the class.
    """

    def error(self, message: str) -> NoReturn:
        raise InvalidInput(f"{self.prog}: {message} (see '{self.prog} --help')")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="execkit",
        description="Run vendor CLIs and charge retries only for informative attempts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in _GROUPS:
        group.register(sub)
    return parser


def _rewrite(argv: list[str]) -> list[str]:
    if len(argv) >= 2 and argv[0] == "run" and argv[1] in _RUN_LEDGER_VERBS:
        return [_RUN_LEDGER_VERBS[argv[1]], *argv[2:]]
    return argv


def _asks_for_json(args_list: list[str]) -> bool:
    """Whether `--json` was given to execkit itself (not to a command after `--`)."""
    own = args_list[: args_list.index("--")] if "--" in args_list else args_list
    return "--json" in own


def main(argv: Sequence[str] | None = None, *, start: ProcessStarter = subprocess.Popen) -> int:
    """Run the CLI and return its exit code; raises only SystemExit for `--help`.

    `start` is how the commands that spawn (`run`, `run --adapter`, `dispatch`) start
    their processes (`spawn`'s seam); a test passes `fake_vendor.start`.
    """
    args_list = _rewrite(list(sys.argv[1:] if argv is None else argv))
    try:
        args = _build_parser().parse_args(args_list)
    except InvalidInput as exc:
        return report_error(exc, as_json=_asks_for_json(args_list))
    # On the namespace, so every handler keeps the one-argument shape `handler(args)`.
    args.start = start
    as_json = bool(getattr(args, "json", False))
    try:
        code: int = args.handler(args)
        return code
    except ExecKitError as exc:
        return report_error(exc, as_json=as_json)
    except KeyboardInterrupt:
        print("execkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): exit as a shell reports death by SIGPIPE, and
        # point stdout at /dev/null so Python's flush at exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _SIGPIPE_EXIT
    except Exception as exc:  # the last line of defence: never a traceback
        if os.environ.get("EXECKIT_DEBUG"):
            raise
        print(
            f"execkit: internal error: {type(exc).__name__}: {exc} "
            "(set EXECKIT_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return INTERNAL_ERROR_EXIT
