"""`execkit run [--timeout S] [--tail-bytes N] [--kill-grace S] [--adapter NAME] [--json]
-- CMD [ARGS...]`.

Streams the child's output through (or, with `--json`, captures it and prints the result
as one JSON object) and exits like a shell would: the child's exit code, 127 when it could
not be spawned, 124 on timeout, 128+N on death by signal N. Like `timeout`, it hands the
child its own stdin, so `... | execkit run -- CMD` feeds CMD; execkit never reads it, so
a stdin nobody closes cannot hold execkit up (`--timeout` still bounds the child).
With `--json` the object carries the failure's `class`, `reason` and `evidence` (null
when the run succeeded).
With `--adapter NAME` the ARGS go to that vendor's binary through its adapter instead.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TextIO

from execkit._classify import classification_fields
from execkit._errors import InvalidInput
from execkit._exec import MAX_TAIL_BYTES, SpawnResult, spawn
from execkit.cli._args import parse_seconds
from execkit.cli._output import print_json

__all__ = ["register"]

SPAWN_FAILED_EXIT = 127
TIMEOUT_EXIT = 124
SIGNAL_EXIT_BASE = 128

_DEFAULT_KILL_GRACE = 5.0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `execkit run`."""
    parser = sub.add_parser(
        "run",
        help="run a command, stream its output, exit with its status",
        description=(
            "Run CMD directly (no shell) with execkit's own stdin, stream its output through "
            "and exit with its exit code: 127 when it could not be spawned, 124 on timeout, "
            "128+N on signal N."
        ),
    )
    _add_run_options(parser)
    parser.set_defaults(handler=_handle)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options and the `-- CMD [ARGS...]` positional of `execkit run`."""
    # Plain strings, validated in the handler, so a bad value is an `invalid` error
    # (exit 3) naming the flag and its range rather than an argparse usage error.
    parser.add_argument(
        "--timeout", metavar="S", help="kill the process tree after S seconds (> 0)"
    )
    parser.add_argument(
        "--tail-bytes",
        metavar="N",
        help=f"bytes of each stream kept in the JSON result (1..{MAX_TAIL_BYTES}, default 65536)",
    )
    parser.add_argument(
        "--kill-grace",
        metavar="S",
        help="seconds between SIGTERM and SIGKILL on timeout (>= 0, default 5)",
    )
    parser.add_argument(
        "--adapter",
        metavar="NAME",
        help="run the vendor binary of adapter NAME with ARGS and print its AgentProof "
        "(class, reason, precondition); see `execkit adapters`",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="capture the output and print the result as one JSON object",
    )
    parser.add_argument(
        "command_argv",
        nargs=argparse.REMAINDER,
        metavar="-- CMD [ARGS...]",
        help="the command to run and its arguments",
    )


def _handle(args: argparse.Namespace) -> int:
    """Run the command; return the shell-style exit status."""
    if args.adapter is not None:
        # Imported here: the adapter path pulls in the adapters and the in-agent loop,
        # which a plain `execkit run` never needs.
        from execkit.cli._adapters import run_adapter_command

        return run_adapter_command(args, start=args.start)
    argv = _command(args.command_argv)
    timeout = parse_seconds("--timeout", args.timeout, allow_zero=False)
    grace = parse_seconds("--kill-grace", args.kill_grace, allow_zero=True)
    tail_bytes = _tail_bytes(args.tail_bytes)
    streaming = not args.json
    with _signals_unwind():
        result = spawn(
            argv,
            inherit_stdin=True,
            timeout=timeout,
            kill_grace=_DEFAULT_KILL_GRACE if grace is None else grace,
            tail_bytes=tail_bytes,
            on_stdout=_tee(sys.stdout) if streaming else None,
            on_stderr=_tee(sys.stderr) if streaming else None,
            start=args.start,
        )
    if args.json:
        print_json(_result_payload(result))
    elif result.spawn_errno is not None:
        print(f"execkit: {result.spawn_error}", file=sys.stderr)
    elif result.timed_out:
        print(f"execkit: timed out after {timeout:g}s; process tree stopped", file=sys.stderr)
    return _exit_status(result)


def _result_payload(result: SpawnResult) -> dict[str, Any]:
    """The JSON object `execkit run --json` prints: the result and its class (null if ok)."""
    payload = result.to_dict()
    payload.update(classification_fields(result))
    return payload


def _exit_status(result: SpawnResult) -> int:
    """The shell convention: 127 not spawned, 124 timed out, 128+N signal N, else the code."""
    if result.spawn_errno is not None:
        return SPAWN_FAILED_EXIT
    if result.timed_out:
        return TIMEOUT_EXIT
    if result.signal is not None:
        return SIGNAL_EXIT_BASE + result.signal
    return result.exit_code if result.exit_code is not None else 1


def _command(raw: list[str]) -> list[str]:
    argv = raw[1:] if raw and raw[0] == "--" else raw
    if not argv:
        raise InvalidInput("a command is required: execkit run [OPTIONS] -- CMD [ARGS...]")
    return argv


def _tail_bytes(raw: str | None) -> int:
    if raw is None:
        return 65536
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TAIL_BYTES:
        raise InvalidInput(
            f"--tail-bytes must be an integer from 1 to {MAX_TAIL_BYTES}, got {raw!r}"
        )
    return value


def _tee(stream: TextIO) -> Callable[[bytes], None]:
    """Write raw chunks straight through, flushed, so the user sees output as it comes."""
    binary = getattr(stream, "buffer", None)
    if binary is not None:

        def write_bytes(chunk: bytes) -> None:
            binary.write(chunk)
            binary.flush()

        return write_bytes

    # A character split across two chunks must not turn into two replacement characters.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write_text(chunk: bytes) -> None:
        stream.write(decoder.decode(chunk))
        stream.flush()

    return write_text


class _Terminated(SystemExit):
    """execkit itself got SIGTERM/SIGHUP: unwind so spawn kills the child's tree."""


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception while the child runs.

    The child leads its own session, so a signal aimed at execkit does not reach it; the
    default action would kill execkit and orphan the child. Raising instead lets spawn's
    cleanup kill the whole tree; the exit status is 128+N as if the signal had killed us.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, _frame: FrameType | None) -> None:
        raise _Terminated(SIGNAL_EXIT_BASE + signum)

    previous = {sig: signal.signal(sig, unwind) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
