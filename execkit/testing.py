"""pytest plugin (entry point `pytest11`): fake vendor CLIs for testing adapters and runners.

One fixture, `fake_vendor`. Register what a vendor CLI does, by program name, and pass
`start=fake_vendor.start` to whatever spawns it (`spawn`, `spawn_async`, `run_agent`,
`run_command`, `AdapterRunner`, `run_adapter_command`, `execkit.cli.main`):

    def test_missing_codex_stops(fake_vendor):
        fake_vendor.register("codex", missing=True)
        with pytest.raises(AgentFailed) as failed:
            run_agent(
                get_adapter("codex"), AgentRequest(prompt="fix the test"), start=fake_vendor.start
            )
        assert failed.value.proof.failure_class is FailureClass.ENVIRONMENT

`fake_vendor.start` is a `ProcessStarter` (`spawn`'s seam). For a registered name it either
raises at start, exactly as the kernel reports a program that cannot run (`missing=True`:
FileNotFoundError, errno ENOENT; `start_errno=errno.EACCES`: PermissionError; nothing is
spawned), or starts a REAL child process, a tiny Python replay program that prints the
registered transcript (a string, bytes, or a `pathlib.Path` to a fixture file) on stdout,
then stderr, and exits with `exit_code` (-N: dies by signal N), or with `hang=True` waits
until a signal ends it. So spawn's one supervision path, its timeouts and its tree kill run
for real. Registrations of one name are consumed in order, one per start, and the last one
registered without `occurrences` stays for every later start, so a failure registered once
is what every retry of `run_agent` meets; `occurrences=N` limits a registration to N starts,
after which the next registration, or a refusal, follows. A name never registered goes to
`subprocess.Popen` as looked up at that moment (under pytest-subprocess, which refuses what
it was not told about).

`fake_vendor.sleep` is a `sleep` seam that waits for nothing and records each wait asked
for (`fake_vendor.sleeps`): pass it as `sleep=` to `run_agent`, `AdapterRunner` or
`run_command` and an upstream retry costs no wall time.

The fixture is built on pytest-subprocess's `fp` (its public API only): every registration
is also made there, so code that calls `subprocess` directly, not through `spawn`, sees the
same fake (`subprocess.run(["codex", ...])` raises FileNotFoundError after
`register("codex", missing=True)`), and anything not registered still raises
`ProcessNotRegisteredError`. A direct call uses each registration `occurrences` times,
and one registered without `occurrences` once: pytest-subprocess cannot keep one
registration of a command without keeping every last one, the user's own included.
Without pytest-subprocess the plugin loads and only tests that
use `fake_vendor` fail, saying how to install it.

**The conformance corpus.** Every real vendor CLI run execkit records (fixtures/recorded:
15 CLIs, each in every scenario it can be put in: 401, 429 with a reset, 5xx, a cut or
overloaded stream, no key, not logged in, unreachable, a hang...) ships as package data,
with the class an operator needs. Check your own adapter or classifier against them:

    def test_my_adapter_on_real_transcripts(recorded_cell):
        mapped = MyClaudeAdapter().parse(recorded_cell.spawn_result())
        assert mapped.failure_class == recorded_cell.expected_class, recorded_cell.why

A test that takes the `recorded_cell` fixture runs once per recorded cell (ids
`cli/scenario`); `@pytest.mark.recorded_cells(cli="claude")` (and/or `scenario=...`, a
name or a list) narrows it. `recorded_cells(...)` returns the cells themselves and
`recorded_cell_params(...)` the `pytest.param`s for a `parametrize` of your own. Each
`RecordedCell` has the recorded `stdout`, `stderr`, `exit_code`, `signal`, `timed_out`,
the expected class, reason and reset (`expected_retry_after_s`: seconds, or a `(low,
high)` range for a reset stated as a wall-clock time), and `spawn_result()`: the
`SpawnResult` execkit's `spawn` would have produced (credentials masked as it masks them).
"""

from __future__ import annotations

import collections
import errno
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from execkit._corpus import RecordedCell, recorded_cells
from execkit._errors import InvalidInput
from execkit._validate import integer_arg, number_arg

try:
    from pytest_subprocess import FakeProcess, ProcessNotRegisteredError
except ImportError:  # pragma: no cover - exercised in a subprocess by the plugin tests
    # pytest loads this plugin for everyone who installs execkit-runner; without
    # pytest-subprocess it must not break their test runs, only `fake_vendor` itself.
    _HAVE_PYTEST_SUBPROCESS = False
else:
    _HAVE_PYTEST_SUBPROCESS = True

__all__ = [
    "HANG_LIMIT_S",
    "FakeVendor",
    "RecordedCell",
    "fake_vendor",
    "recorded_cell_params",
    "recorded_cells",
]

HANG_LIMIT_S = 30.0
"""A hanging fake gives up after this long even if nobody signals it, so a test that forgets
a timeout fails instead of hanging the suite."""

# The fakes must be real processes whatever a test patched, so the real class is captured
# when pytest loads the plugin, before any test's `fp` replaces `subprocess.Popen`. In a
# tuple, not bound to a name of its own: while its fixture is active, pytest-subprocess
# (1.6) rebinds every module-level name bound to `subprocess.Popen` itself to its fake.
_REAL_POPEN: tuple[type[subprocess.Popen[bytes]]] = (subprocess.Popen,)

# Signals whose default action does not end a process: a fake "killed" by one would stop
# or carry on instead of dying, which no real exit status can express.
_NOT_FATAL = frozenset(
    {
        signal.SIGCHLD,
        signal.SIGCONT,
        signal.SIGURG,
        signal.SIGWINCH,
        signal.SIGSTOP,
        signal.SIGTSTP,
        signal.SIGTTIN,
        signal.SIGTTOU,
    }
)

# The replay program, run as `python -I -S -c _REPLAY SPEC`: isolated from the user's
# environment and site-packages, so it starts fast and behaves the same everywhere.
_REPLAY = r"""
import json, os, signal, sys, time
with open(sys.argv[1], "rb") as f:
    spec = json.load(f)
# As a native binary: SIGINT and SIGPIPE end it (Python would raise or ignore them).
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
if spec["stdin"] is not None:
    data = sys.stdin.buffer.read()
    with open(spec["stdin"], "wb") as f:
        f.write(data)
for key, fd in (("stdout", 1), ("stderr", 2)):
    if spec[key] is not None:
        with open(spec[key], "rb") as f:
            view = memoryview(f.read())
        while view:
            view = view[os.write(fd, view):]
if spec["hang"]:
    time.sleep(spec["hang_limit_s"])  # a signal with its default action ends it first
    os.write(2, b"fake_vendor: hang limit reached and nobody stopped this fake\n")
code = spec["exit_code"]
if code < 0:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGSEGV, SIGABRT: no core file
    try:
        signal.signal(-code, signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL cannot be caught, so it needs no reset
    os.kill(os.getpid(), -code)
    code = 128 - code
os._exit(code)
"""


def _start_error(name: str, code: int) -> OSError:
    """The OSError Popen raises for a program that cannot be executed: OSError picks the
    subclass from the errno (FileNotFoundError for ENOENT, PermissionError for EACCES)."""
    return OSError(code, os.strerror(code), name)


def _take(queue: collections.deque[_Registration]) -> _Behaviour | None:
    """The next start's behaviour from one name's registrations, or None: used up."""
    if not queue:
        return None
    head = queue[0]
    if head.starts_left is None:
        if len(queue) > 1:  # a later registration takes over after this one start
            queue.popleft()
        return head.behaviour
    head.starts_left -= 1
    if head.starts_left == 0:
        queue.popleft()
    return head.behaviour


def _argv_of(args: object) -> tuple[str, ...]:
    """Popen's `args` as a tuple of str: a sequence, or one program (str, bytes, path)."""
    if isinstance(args, str | bytes | os.PathLike):
        return (os.fsdecode(args),)
    if isinstance(args, Sequence):
        return tuple(os.fsdecode(a) if isinstance(a, bytes | os.PathLike) else str(a) for a in args)
    return ()


def _transcript(field: str, value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, Path):
        return value.read_bytes()
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    raise InvalidInput(
        f"{field} must be a str, bytes, a pathlib.Path or None, got {type(value).__name__}",
        field=field,
    )


def _check_flag(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{field} must be True or False, got {value!r}", field=field)
    return value


def _check_start_errno(missing: bool, start_errno: object) -> int | None:
    if start_errno is None:
        return errno.ENOENT if missing else None
    if missing:
        raise InvalidInput(
            "missing=True is start_errno=errno.ENOENT: give one of them", field="start_errno"
        )
    code = integer_arg("start_errno", start_errno, 1)
    if code not in errno.errorcode:
        raise InvalidInput(f"start_errno must be an errno value, got {code}", field="start_errno")
    return code


def _check_exit_code(exit_code: object) -> int:
    code = integer_arg("exit_code", exit_code, -(signal.NSIG - 1), 255)
    if code < 0 and (-code not in signal.valid_signals() or -code in _NOT_FATAL):
        raise InvalidInput(
            f"exit_code {code} must name a signal whose default action ends a process",
            field="exit_code",
        )
    return code


@attrs.frozen
class _Behaviour:
    """What one start of a registered name does."""

    name: str
    stdout: Path | None  # the transcript files the replay program prints
    stderr: Path | None
    exit_code: int
    start_errno: int | None  # set: the start itself fails with this errno
    hang: bool


@attrs.define
class _Registration:
    """One `register` call: its behaviour and how many starts it still serves (None: one
    while a later registration follows, every start while it is the last)."""

    behaviour: _Behaviour
    starts_left: int | None


@attrs.frozen
class _StartFails:
    """pytest-subprocess callback of a fake that cannot start, for direct `subprocess`
    calls: pytest-subprocess re-raises its error from the caller's `wait()` or
    `communicate()`, so `subprocess.run` raises it as it would for the real program."""

    name: str
    code: int

    def __call__(self, process: Any) -> None:
        raise _start_error(self.name, self.code)


class _Hang:
    """pytest-subprocess callback of a hanging fake: blocks until `on_signal` (terminate,
    kill, interrupt) sets the fake's returncode, or the hang limit, or `release()`."""

    def __init__(self, limit_s: float) -> None:
        self._released = threading.Event()
        self._limit_s = limit_s

    def __call__(self, process: Any) -> None:
        self._released.wait(self._limit_s)

    def on_signal(self, process: Any, sig: int) -> None:
        if process.returncode is None and sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
            process.returncode = -sig
            self.release()

    def release(self) -> None:
        self._released.set()


class FakeVendor:
    """Fake vendor CLIs by program name (argv[0], exact match); see the module docstring.

    `start` is the `ProcessStarter` to pass as `start=`. `calls(name)` lists the argv of
    every start of `name` (failed starts and direct `subprocess` calls included), so a test
    can assert how many times a binary was tried; `inputs(name)` what each fake process of
    `name` read on its stdin. The files the fakes read and write live in `workdir`. Safe to
    use from several threads at once.
    """

    def __init__(
        self, fp: FakeProcess, workdir: Path, *, hang_limit_s: float = HANG_LIMIT_S
    ) -> None:
        self.fp = fp
        self._workdir = workdir
        self._hang_limit_s = number_arg("hang_limit_s", hang_limit_s, allow_zero=True)
        self._lock = threading.Lock()
        self._files = itertools.count(1)
        self._queues: dict[str, collections.deque[_Registration]] = {}
        self._limited: dict[str, int | None] = {}
        self._sleeps: list[float] = []
        self._registered: collections.Counter[str] = collections.Counter()
        self._calls: list[tuple[str, ...]] = []
        # Per fake process started: its name and where it records its stdin (None: it was
        # given no stdin pipe, so it reads nothing).
        self._stdin_files: list[tuple[str, Path | None]] = []
        self._started: list[subprocess.Popen[Any]] = []
        # pytest-subprocess's record of the direct calls, per registration, in order.
        self._direct: list[tuple[str, Any]] = []
        self._hangs: list[_Hang] = []

    def register(
        self,
        name: str,
        *,
        stdout: str | bytes | Path | None = None,
        stderr: str | bytes | Path | None = None,
        exit_code: int = 0,
        missing: bool = False,
        start_errno: int | None = None,
        hang: bool = False,
        occurrences: int | None = None,
    ) -> None:
        """Add starts of `name` (with any arguments) that behave as asked.

        `occurrences`: how many starts this registration serves. Without it, one start if
        another registration of `name` follows, and every later start while it is the
        last, so a retried failure fails again until the test registers what comes next.

        `stdout`/`stderr`: the transcript, a str (UTF-8), bytes, or a Path read now.
        `exit_code`: 0..255, or -N to die by signal N. `missing`: the start raises
        FileNotFoundError (ENOENT), as for an absent binary; `start_errno` (EACCES,
        ENOEXEC, ...): the start raises the OSError of that errno. `hang`: the process
        prints its transcript, then runs until a signal ends it (it dies by that signal),
        or until the hang limit, when it exits with `exit_code`.
        Raises InvalidInput (a ValueError) naming the field for a bad value, or for
        `missing` with `start_errno`, or a start error with `hang`; nothing is registered.
        """
        if not isinstance(name, str) or not name or "\0" in name:
            raise InvalidInput(
                f"name must be a non-empty program name without NUL, got {name!r}", field="name"
            )
        out, err = _transcript("stdout", stdout), _transcript("stderr", stderr)
        code = _check_exit_code(exit_code)
        missing, hang = _check_flag("missing", missing), _check_flag("hang", hang)
        if missing and hang:
            raise InvalidInput("a fake vendor is either missing or hangs, not both", field="hang")
        start_code = _check_start_errno(missing, start_errno)
        if start_code is not None and hang:
            raise InvalidInput(
                "a fake vendor either fails to start (start_errno) or hangs, not both",
                field="hang",
            )
        limit = None if occurrences is None else integer_arg("occurrences", occurrences, 1)
        count = 1 if limit is None else limit
        behaviour = _Behaviour(
            name=name,
            stdout=self._write_file(out, "stdout"),
            stderr=self._write_file(err, "stderr"),
            exit_code=code,
            start_errno=start_code,
            hang=hang,
        )
        with self._lock:
            self._queues.setdefault(name, collections.deque()).append(
                _Registration(behaviour, limit)
            )
            self._limited[name] = limit
            self._registered[name] += 1
        self._register_direct(behaviour, out, err, count)

    def _write_file(self, data: bytes | None, stream: str) -> Path | None:
        if data is None:
            return None
        path = self._workdir / f"transcript-{next(self._files)}.{stream}"
        path.write_bytes(data)
        return path

    def _register_direct(
        self, behaviour: _Behaviour, out: bytes | None, err: bytes | None, count: int
    ) -> None:
        """The same fake on pytest-subprocess, for code that calls `subprocess` itself."""
        command: list[Any] = [behaviour.name, self.fp.any()]
        if behaviour.hang:
            # Each hanging fake waits for its own signal, so each is its own registration.
            for _ in range(count):
                hang = _Hang(self._hang_limit_s)
                self._hangs.append(hang)
                recorder = self.fp.register(
                    command,
                    stdout=out,
                    stderr=err,
                    returncode=behaviour.exit_code,
                    callback=hang,
                    signal_callback=hang.on_signal,
                )
                self._direct.append((behaviour.name, recorder))
            return
        # A plain transcript gets no callback: with one, pytest-subprocess leaves the
        # fake's stdout unreadable by `proc.stdout.read()`.
        fails = (
            None
            if behaviour.start_errno is None
            else _StartFails(behaviour.name, behaviour.start_errno)
        )
        recorder = self.fp.register(
            command,
            stdout=out,
            stderr=err,
            returncode=behaviour.exit_code,
            callback=fails,
            occurrences=count,
        )
        self._direct.append((behaviour.name, recorder))

    def start(self, args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        """A `ProcessStarter`: fake a registered program, pass any other to Popen.

        For a registered name: records the call, takes its next registration and raises
        its start error, or starts the real replay process (with the caller's `stdin`,
        `stdout`, `stderr`, `cwd`, `env` and other Popen arguments; it reads its stdin
        only when that is `subprocess.PIPE`). Once every registration of the name is
        used, raises pytest-subprocess's ProcessNotRegisteredError. Any other name goes
        to `subprocess.Popen` looked up now (pytest-subprocess refuses it unless the test
        allowed unregistered commands); TypeError if that returns a fake without real
        pipes (a command registered on `fp` directly: register it with `fake_vendor`).
        """
        argv = _argv_of(args)
        name = argv[0] if argv else ""
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                behaviour = None
            else:
                self._calls.append(argv)
                behaviour = _take(queue)
        if queue is None:
            return self._not_ours(args, kwargs)
        if behaviour is None:
            raise ProcessNotRegisteredError(
                f"The process {' '.join(argv)!r} was not registered: fake_vendor's "
                f"{self._registered[name]} registration(s) of {name!r} are used up (the "
                f"last was limited to occurrences={self._limited[name]}; register what "
                "the next start should do)"
            )
        if behaviour.start_errno is not None:
            raise _start_error(name, behaviour.start_errno)
        return self._replay(behaviour, kwargs)

    def _replay(self, behaviour: _Behaviour, kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
        run_dir = self._workdir / f"start-{next(self._files)}"
        run_dir.mkdir()
        stdin_file = run_dir / "stdin" if kwargs.get("stdin") == subprocess.PIPE else None
        spec = {
            "stdout": None if behaviour.stdout is None else str(behaviour.stdout),
            "stderr": None if behaviour.stderr is None else str(behaviour.stderr),
            "stdin": None if stdin_file is None else str(stdin_file),
            "exit_code": behaviour.exit_code,
            "hang": behaviour.hang,
            "hang_limit_s": self._hang_limit_s,
        }
        spec_file = run_dir / "spec.json"
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        # The replay replaces the program, so nothing may pick another one to run.
        popen_kwargs = {k: v for k, v in kwargs.items() if k not in ("executable", "shell")}
        proc: subprocess.Popen[bytes] = _REAL_POPEN[0](
            [sys.executable, "-I", "-S", "-c", _REPLAY, str(spec_file)], **popen_kwargs
        )
        with self._lock:
            self._started.append(proc)
            self._stdin_files.append((behaviour.name, stdin_file))
        return proc

    def _not_ours(self, args: Any, kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
        # Looked up now, not at import: under `fp` this is pytest-subprocess's dispatcher.
        proc = subprocess.Popen(args, **kwargs)
        if not isinstance(proc, _REAL_POPEN):
            shown = _argv_of(args)[:1] or (repr(args),)
            raise TypeError(
                f"{shown[0]!r} is registered on pytest-subprocess's fp directly, whose fake "
                "has no real pipes for spawn to supervise: register it with "
                f"fake_vendor.register({shown[0]!r}, ...) instead"
            )
        return proc

    def sleep(self, seconds: float) -> None:
        """A `sleep` seam that records `seconds` and returns at once (see `sleeps`)."""
        with self._lock:
            self._sleeps.append(float(seconds))

    @property
    def sleeps(self) -> list[float]:
        """Each wait `sleep` was asked for, in order (a copy)."""
        with self._lock:
            return list(self._sleeps)

    def calls(self, name: str) -> list[tuple[str, ...]]:
        """The argv of each start of `name`: those through `start` in order (failed starts
        included), then the direct `subprocess` calls in order."""
        with self._lock:
            started = [argv for argv in self._calls if argv[:1] == (name,)]
            direct = [
                _argv_of(process.args)
                for owner, recorder in self._direct
                if owner == name
                for process in recorder.calls
            ]
        return started + direct

    def call_count(self, name: str) -> int:
        """How many times `name` was started (failed starts included)."""
        return len(self.calls(name))

    def inputs(self, name: str) -> list[bytes]:
        """What each fake process `start` ran for `name` read on its stdin, in order: the
        spawn's `input`, or b"" for one given no input (a failed start ran no process).
        Meant for after the process exited: one killed before it read to the end shows
        b"". Direct `subprocess` calls are not included."""
        with self._lock:
            files = [path for owner, path in self._stdin_files if owner == name]
        return [b"" if path is None or not path.exists() else path.read_bytes() for path in files]

    def close(self) -> None:
        """End what the test left running: release direct hangs, kill live fakes."""
        for hang in self._hangs:
            hang.release()
        with self._lock:
            started = list(self._started)
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


if _HAVE_PYTEST_SUBPROCESS:

    @pytest.fixture
    def fake_vendor(
        fp: FakeProcess, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[FakeVendor]:
        """A `FakeVendor` over pytest-subprocess's `fp` fixture, undone after the test."""
        vendor = FakeVendor(fp, tmp_path_factory.mktemp("fake_vendor"))
        try:
            yield vendor
        finally:
            vendor.close()

else:  # pragma: no cover - exercised in a subprocess by the plugin tests

    @pytest.fixture
    def fake_vendor() -> Iterator[FakeVendor]:
        """Fails the test: the fake needs pytest-subprocess."""
        pytest.fail(
            "fake_vendor needs pytest-subprocess: pip install 'execkit-runner[testing]'",
            pytrace=False,
        )
        yield  # unreachable; keeps this a generator like the real fixture


# --- the conformance corpus -----------------------------------------------------------------

_CORPUS_MARK = "recorded_cells"


def recorded_cell_params(
    cli: str | Sequence[str] | None = None, scenario: str | Sequence[str] | None = None
) -> list[Any]:
    """`pytest.param(cell, id="cli/scenario")` for each recorded cell (filtered as
    `recorded_cells`), for `@pytest.mark.parametrize("cell", recorded_cell_params())`."""
    return [pytest.param(cell, id=cell.key) for cell in recorded_cells(cli, scenario)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_CORPUS_MARK}(cli=None, scenario=None): narrow the recorded_cell fixture "
        "to these CLIs and scenarios",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes `recorded_cell` runs once per recorded cell (see the docstring)."""
    if "recorded_cell" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker(_CORPUS_MARK)
    filters = dict(marker.kwargs) if marker is not None else {}
    unknown = set(filters) - {"cli", "scenario"}
    if unknown:
        raise InvalidInput(
            f"@pytest.mark.{_CORPUS_MARK} takes cli= and scenario=, not {sorted(unknown)}",
            field=_CORPUS_MARK,
        )
    cells = recorded_cells(filters.get("cli"), filters.get("scenario"))
    metafunc.parametrize("recorded_cell", cells, ids=[cell.key for cell in cells])
