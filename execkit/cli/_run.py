"""`execkit run [--timeout S] [--stall-timeout S] [--tail-bytes N] [--kill-grace S]
[--keep-descendants] [--adapter NAME] [--json] -- CMD [ARGS...]`.

Streams the child's output through (or, with `--json`, captures it and prints the result
as one JSON object) and exits like a shell would: the child's exit code, 127 when it could
not be spawned, 124 on timeout (or on a stall: no byte for `--stall-timeout` S), 128+N on
death by signal N. Like `timeout`, it hands the
child its own stdin, so `... | execkit run -- CMD` feeds CMD; execkit never reads it, so
a stdin nobody closes cannot hold execkit up (`--timeout` still bounds the child).
With `--json` the object carries the failure's `class`, `reason` and `evidence` (null
when the run succeeded).
With `--adapter NAME` the command is the adapter's, as `dispatch` builds it: the last ARG
is the prompt and the ARGS before it are added to the adapter's own argv (`execkit run
--adapter claude -- "say hi"` runs `claude -p --output-format stream-json --verbose "say
hi"`); an ARG the adapter sets itself is refused. `generic` takes CMD [ARGS...] as ever.

When CMD exits, whatever it left running in its process tree is ended too, unless
`--keep-descendants` is given. A signal that would end execkit (each of `_ENDING_SIGNALS`:
SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM, SIGPIPE, SIGVTALRM, SIGPROF,
SIGIO, SIGPWR, SIGXCPU, SIGSTKFLT and the real-time signals; not one that was ignored when
execkit started, as `nohup` does to SIGHUP) first ends CMD's whole tree, then execkit exits
128+N (SIGINT: 130, with one line on stderr).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TextIO

from execkit._errors import InvalidInput
from execkit._exec import (
    DEFAULT_KILL_GRACE_S,
    DEFAULT_TAIL_BYTES,
    MAX_TAIL_BYTES,
    SpawnCancelled,
    SpawnResult,
    spawn_cancellable,
)
from execkit.cli._args import parse_seconds
from execkit.cli._output import emit, print_json

__all__ = ["register"]

SPAWN_FAILED_EXIT = 127
TIMEOUT_EXIT = 124
SIGNAL_EXIT_BASE = 128


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
        epilog=(
            "Two ledger operations share the name: `execkit run start TASK_ID` admits the "
            "task's next attempt and records it as a running run (or refuses: budgets, "
            "limits), and `execkit run finish RUN_ID succeeded|failed|abandoned` records how "
            "that run ended, with its class and reason. See `execkit run start --help` and "
            "`execkit run finish --help`. The command to run always follows `--`, so the two "
            "never collide."
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
        "--stall-timeout",
        metavar="S",
        help="stop the process tree when it prints no byte on stdout or stderr for S seconds "
        "(> 0): exit 124, class work (`stalled: no output for S s`) unless the adapter reads "
        "that a vendor request was in flight",
    )
    parser.add_argument(
        "--tail-bytes",
        metavar="N",
        help=(
            f"bytes of each stream kept in the JSON result (1..{MAX_TAIL_BYTES}, "
            f"default {DEFAULT_TAIL_BYTES})"
        ),
    )
    parser.add_argument(
        "--kill-grace",
        metavar="S",
        help=(
            "seconds between SIGTERM and SIGKILL on timeout "
            f"(>= 0, default {DEFAULT_KILL_GRACE_S:g})"
        ),
    )
    parser.add_argument(
        "--keep-descendants",
        action="store_true",
        help="leave running what CMD leaves behind when it exits (daemons, background jobs); "
        "by default they are ended with it",
    )
    parser.add_argument(
        "--adapter",
        metavar="NAME",
        help="run adapter NAME's argv for the prompt (the last ARG; the ARGS before it are "
        "added to the adapter's own, as dispatch does) and print its AgentProof (class, "
        "reason, precondition); `generic` runs CMD [ARGS...]; see `execkit adapters`",
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
        from execkit._prices import load_prices
        from execkit.cli._adapters import run_adapter_command

        load_prices()  # a bad $EXECKIT_PRICES is refused before the agent runs

        # The adapter's loop spawns through the library, which watches no cancel pipe:
        # there an ending signal raises (once), and spawn's cleanup ends the tree.
        code: int | None = None
        with _signals_end_the_tree() as stop:
            stop.interruptible = True
            with contextlib.suppress(_Stopped):
                code = run_adapter_command(args, start=args.start)
        if stop.signum is not None or code is None:
            return stop.exit_status()
        return code
    argv = _command(args.command_argv)
    timeout = parse_seconds("--timeout", args.timeout, allow_zero=False)
    stall = parse_seconds("--stall-timeout", args.stall_timeout, allow_zero=False)
    grace = parse_seconds("--kill-grace", args.kill_grace, allow_zero=True)
    tail_bytes = _tail_bytes(args.tail_bytes)
    streaming = not args.json
    with _signals_end_the_tree() as stop:
        try:
            result = spawn_cancellable(
                stop.wake_fd,
                argv,
                inherit_stdin=True,
                timeout=timeout,
                kill_grace=DEFAULT_KILL_GRACE_S if grace is None else grace,
                tail_bytes=tail_bytes,
                on_stdout=_tee(sys.stdout, stop) if streaming else None,
                on_stderr=_tee(sys.stderr, stop) if streaming else None,
                keep_descendants=args.keep_descendants,
                # A small single-threaded process: a preexec_fn is safe and cheap here, so
                # the kernel kills the child too should execkit itself be SIGKILLed.
                die_with_parent=True,
                start=args.start,
                stall_timeout=stall,
            )
        except (SpawnCancelled, _Stopped):
            if stop.signum is None:
                raise
    if stop.signum is not None:
        return stop.exit_status()
    if args.json:
        print_json(_result_payload(result))
    elif result.spawn_errno is not None:
        emit(f"execkit: {result.spawn_error}", err=True)
    elif result.timed_out:
        emit(f"execkit: timed out after {timeout:g}s; process tree stopped", err=True)
    elif result.stalled_after_s is not None:
        from execkit._classify import stall_reason  # the verdict's words, loaded with it

        emit(f"execkit: {stall_reason(result.stalled_after_s)}; process tree stopped", err=True)
    return _exit_status(result)


def _result_payload(result: SpawnResult) -> dict[str, Any]:
    """The JSON object `execkit run --json` prints: the result and its class (null if ok)."""
    # Only --json classes the result: a plain `execkit run` starts without the classifier.
    from execkit._classify import classification_fields

    payload = result.to_dict()
    payload.update(classification_fields(result))
    return payload


def _exit_status(result: SpawnResult) -> int:
    """The shell convention: 127 not spawned, 124 timed out (or stalled), 128+N signal N,
    else the code."""
    if result.spawn_errno is not None:
        return SPAWN_FAILED_EXIT
    if result.timed_out or result.stalled_after_s is not None:
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
        return DEFAULT_TAIL_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TAIL_BYTES:
        raise InvalidInput(
            f"--tail-bytes must be an integer from 1 to {MAX_TAIL_BYTES}, got {raw!r}"
        )
    return value


def _tee(stream: TextIO, stop: _Stop) -> Callable[[bytes], None]:
    """Write raw chunks straight through, flushed, so the user sees output as it comes.

    A write may block (a terminal scrolled back, a reader that stopped reading): while it
    does, an ending signal interrupts it (see `_Stop`)."""
    binary = getattr(stream, "buffer", None)
    if binary is not None:

        def write_bytes(chunk: bytes) -> None:
            stop.interruptible = True
            try:
                binary.write(chunk)
                binary.flush()
            finally:
                stop.interruptible = False

        return write_bytes

    # A character split across two chunks must not turn into two replacement characters.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write_text(chunk: bytes) -> None:
        stop.interruptible = True
        try:
            stream.write(decoder.decode(chunk))
            stream.flush()
        finally:
            stop.interruptible = False

    return write_text


def _ending_signals() -> tuple[int, ...]:
    """Every signal whose default action ends a process and that a handler may catch.

    Left out: SIGKILL and SIGSTOP (no handler can catch them), the faults a process raises
    on itself (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP: Python cannot
    carry on after them), SIGXFSZ (Python ignores it, a too-large write fails instead), and
    the signals whose default is to be ignored or to stop (SIGCHLD, SIGWINCH, SIGURG,
    SIGCONT, SIGTSTP, SIGTTIN, SIGTTOU).
    """
    names = (
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGTERM",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGPIPE",
        "SIGVTALRM",
        "SIGPROF",
        "SIGIO",
        "SIGPWR",
        "SIGXCPU",
        "SIGSTKFLT",
    )
    found = {int(getattr(signal, name)) for name in names if hasattr(signal, name)}
    low, high = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1)
    found.update(range(int(low), int(high) + 1))
    return tuple(sorted(found))


_ENDING_SIGNALS = _ending_signals()


class _Stopped(BaseException):
    """An ending signal interrupted a blocked write of the child's output."""


class _Stop:
    """Which ending signal came, and the pipe that tells spawn's loop to end the tree.

    The handler only records the signal and writes a byte to the pipe: spawn notices at a
    safe point of its loop (never halfway through starting the child or ending its tree),
    SIGKILLs and reaps the tree, and raises `SpawnCancelled`. Only while the output is
    being written (a write that may block for good) does the handler raise instead, once,
    so the write gives up; spawn's cleanup then ends the tree just the same (and so it is
    for `--adapter`, whose spawns watch no pipe). SIGPIPE never raises: a reader that went
    away already makes that write fail (exit 141).
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.wake_fd = read_fd
        self._write_fd = write_fd
        self.signum: int | None = None
        self.interruptible = False  # raise from the handler (once) instead of waking spawn
        self._raised = False

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        with contextlib.suppress(OSError):  # full already: one byte is enough
            os.write(self._write_fd, b"\0")
        if self.interruptible and not self._raised and signum != signal.SIGPIPE:
            self._raised = True
            raise _Stopped

    def exit_status(self) -> int:
        """128+N; SIGINT is an interrupt like any other Ctrl-C (main prints its line, 130)."""
        assert self.signum is not None
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        return SIGNAL_EXIT_BASE + self.signum


@contextlib.contextmanager
def _signals_end_the_tree() -> Iterator[_Stop]:
    """While the child runs, a signal that would end execkit ends the child's tree first.

    The child leads its own session, so a signal aimed at execkit does not reach it; the
    default action would kill execkit and orphan the child. Outside the main thread (where
    no handler can be installed) the pipe is there but nothing writes to it.
    """
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    stop = _Stop(read_fd, write_fd)
    previous: dict[int, Any] = {}
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in _ENDING_SIGNALS:
                # One ignored from the start stays ignored (`nohup`, a background job's
                # SIGINT and SIGQUIT): it would not end execkit. SIGPIPE is the exception:
                # Python itself ignores it, so a SIGPIPE would otherwise end nothing.
                if sig != signal.SIGPIPE and signal.getsignal(sig) is signal.SIG_IGN:
                    continue
                with contextlib.suppress(OSError, ValueError):  # one the platform reserves
                    previous[sig] = signal.signal(sig, stop.handle)
        yield stop
    finally:
        for sig, handler in previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        os.close(read_fd)
        os.close(write_fd)
