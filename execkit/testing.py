"""pytest plugin (entry point `pytest11`): fake vendor CLIs for testing adapters and runners.

Built on pytest-subprocess's `fp` fixture, so `subprocess.Popen` (and `execkit.spawn`) see
the fakes; anything not registered still raises `ProcessNotRegisteredError`.

    def test_missing_codex_stops(fake_vendor):
        fake_vendor.register("codex", missing=True)
        with pytest.raises(AgentFailed) as failed:
            run_agent(adapters.get("codex"), AgentRequest(prompt="fix the test"))
        assert failed.value.proof.failure_class is FailureClass.ENVIRONMENT

A fake CLI prints a transcript (a string, or a `pathlib.Path` to a fixture file) on stdout
and stderr and exits with a code; or is missing (Popen raises FileNotFoundError, errno
ENOENT, exactly as for an absent binary); or hangs until it is terminated or killed (the
caller's timeout fires at once: no test sleeps through it). Registrations of one name are
consumed in order, one per spawn.
"""

from __future__ import annotations

import errno
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from execkit._errors import InvalidInput

try:
    from pytest_subprocess import FakeProcess
    from pytest_subprocess.process_dispatcher import ProcessDispatcher
except ImportError:  # pragma: no cover - exercised in a subprocess by the plugin tests
    # pytest loads this plugin for everyone who installs execkit-runner; without
    # pytest-subprocess it must not break their test runs, only `fake_vendor` itself.
    _HAVE_PYTEST_SUBPROCESS = False
else:
    _HAVE_PYTEST_SUBPROCESS = True

__all__ = ["FakeVendor", "fake_vendor"]

# A hanging fake gives up after this long even if nobody kills it, so a test that forgets
# a timeout fails instead of hanging the suite.
HANG_LIMIT_S = 30.0


def _missing_error(name: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "No such file or directory", name)


@attrs.frozen
class _Missing:
    """Callback of a missing fake. Popen raises before it runs; if a future
    pytest-subprocess bypasses the hook, raising here still reaches the caller's wait()."""

    name: str

    def __call__(self, process: Any) -> None:
        raise _missing_error(self.name)


class _Hang:
    """Callback of a hanging fake: blocks until a signal arrives (or HANG_LIMIT_S)."""

    def __init__(self, limit_s: float) -> None:
        self._signalled = threading.Event()
        self._limit_s = limit_s

    def __call__(self, process: Any) -> None:
        self._signalled.wait(self._limit_s)

    def on_signal(self, process: Any, sig: int) -> None:
        if process.returncode is None and sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
            process.returncode = -sig
            self._signalled.set()


def _text(value: str | Path | None) -> str | None:
    if isinstance(value, Path):
        return value.read_text(encoding="utf-8")
    return value


class FakeVendor:
    """Registers fake vendor CLIs on a pytest-subprocess `FakeProcess`.

    `calls(name)` lists the argv of every spawn of `name` (missing ones included), so a
    test can assert how many times a binary was tried.
    """

    def __init__(self, fp: FakeProcess, *, hang_limit_s: float = HANG_LIMIT_S) -> None:
        self.fp = fp
        self._hang_limit_s = hang_limit_s
        self._calls: list[tuple[str, ...]] = []
        self._names: set[str] = set()

    def register(
        self,
        name: str,
        *,
        stdout: str | Path | None = None,
        stderr: str | Path | None = None,
        exit_code: int = 0,
        missing: bool = False,
        hang: bool = False,
        occurrences: int = 1,
    ) -> None:
        """Add `occurrences` spawns of `name` (with any arguments) that behave as asked.

        `stdout`/`stderr`: the transcript, a string or a Path to read. `missing`: Popen
        raises FileNotFoundError (ENOENT). `hang`: runs until terminated or killed, then
        dies by that signal (its transcript, if any, is what it printed before).
        Raises InvalidInput (a ValueError) for `missing` with `hang`, or `occurrences`
        that is not an integer >= 1.
        """
        if missing and hang:
            raise InvalidInput("a fake vendor is either missing or hangs, not both")
        if isinstance(occurrences, bool) or not isinstance(occurrences, int) or occurrences < 1:
            raise InvalidInput(f"occurrences must be an integer >= 1, got {occurrences!r}")
        self._names.add(name)
        command: list[Any] = [name, self.fp.any()]
        out, err = _text(stdout), _text(stderr)
        for _ in range(occurrences):
            if missing:
                self.fp.register(command, callback=_Missing(name))
            elif hang:
                hang_callback = _Hang(self._hang_limit_s)
                self.fp.register(
                    command,
                    stdout=out,
                    stderr=err,
                    returncode=exit_code,
                    callback=hang_callback,
                    signal_callback=hang_callback.on_signal,
                )
            else:
                self.fp.register(command, stdout=out, stderr=err, returncode=exit_code)

    def calls(self, name: str) -> list[tuple[str, ...]]:
        """The argv of each spawn of `name`, in order."""
        return [argv for argv in self._calls if argv and argv[0] == name]

    def call_count(self, name: str) -> int:
        return len(self.calls(name))

    def _dispatch(self, original: Callable[..., Any], command: Any, **kwargs: Any) -> Any:
        argv = tuple(str(part) for part in command) if isinstance(command, list | tuple) else ()
        if argv and argv[0] in self._names:
            self._calls.append(argv)
        process = original(command, **kwargs)
        # pytest-subprocess has no public way to make Popen() itself raise (as it does for
        # an absent binary), nor to hang under a callback while `wait(timeout)` expires;
        # both read private FakePopen attributes, hence the <1.7 pin in pyproject.toml.
        callback = getattr(process, "_callback", None)
        if isinstance(callback, _Missing):
            raise _missing_error(callback.name)
        if isinstance(callback, _Hang):
            # `wait(timeout)` is emulated from this budget: an infinite one makes every
            # finite timeout expire at once, without sleeping.
            process._wait_timeout = float("inf")
        return process


if _HAVE_PYTEST_SUBPROCESS:

    @pytest.fixture
    def fake_vendor(fp: FakeProcess) -> Iterator[FakeVendor]:
        """A `FakeVendor` over pytest-subprocess's `fp` fixture, undone after the test."""
        yield from _patched_vendor(fp)

else:  # pragma: no cover - exercised in a subprocess by the plugin tests

    @pytest.fixture
    def fake_vendor() -> Iterator[FakeVendor]:
        """Fails the test: the fake needs pytest-subprocess."""
        pytest.fail(
            "fake_vendor needs pytest-subprocess: pip install 'execkit-runner[testing]'",
            pytrace=False,
        )
        yield  # unreachable; keeps this a generator like the real fixture


def _patched_vendor(fp: FakeProcess) -> Iterator[FakeVendor]:
    vendor = FakeVendor(fp)
    original = ProcessDispatcher.dispatch

    def dispatch(cls: type[ProcessDispatcher], /, command: Any, **kwargs: Any) -> Any:
        return vendor._dispatch(original, command, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProcessDispatcher, "dispatch", classmethod(dispatch))
        yield vendor
