"""The CLI's start-up: the command table, what each command imports, and Ctrl-C at any moment.

Real `python -m execkit` processes where the process itself is the point (imports, signals).
Nothing here is timed: start-up speed is measured by benchmarks/bench_cli.py; these tests
pin what makes it fast (the modules a command does not import) and what Ctrl-C prints.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import os
import re
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
from _support import REPO, run_execkit, wait_gone

import execkit
import execkit.cli as cli
from execkit.cli import main

PUBLIC = [
    "run",
    "classify",
    "adapters",
    "decide",
    "task",
    "role",
    "capabilities",
    "db",
    "lane",
    "budget",
    "spend",
    "notify",
    "dispatch",
    "status",
    "serve",
    "demo",
]
INTERNAL = ["run-start", "run-finish", "run-heartbeat", "run-list"]
INTERRUPTED = "execkit: interrupted"


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EXECKIT_DB", None)
    return env


def _imported(*args: str) -> set[str]:
    """The modules `python -m execkit ARGS` imports, read off `-X importtime`."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "execkit", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and not line.rstrip().endswith("| package"):
            names.add(line.rsplit("|", 1)[1].strip())
    assert names, done.stderr
    return names


# -- the command table ----------------------------------------------------------------


def _registered(module: str) -> dict[str, str | None]:
    """name -> help of every command `execkit.cli.<module>.register` adds."""
    parser = argparse.ArgumentParser(prog="execkit")
    sub = parser.add_subparsers()
    importlib.import_module(f"execkit.cli.{module}").register(sub)
    helps: dict[str, str | None] = {name: None for name in sub.choices}
    for action in sub._choices_actions:
        helps[action.dest] = action.help
    return helps


def test_the_table_names_every_command_its_module_registers_with_the_same_help() -> None:
    assert list(cli._COMMANDS) == PUBLIC
    assert sorted(cli._INTERNAL) == sorted(INTERNAL)
    modules = {module for module, _ in cli._COMMANDS.values()} | set(cli._INTERNAL.values())
    for module in sorted(modules):
        registered = _registered(module)
        public = {name for name, (mod, _) in cli._COMMANDS.items() if mod == module}
        internal = {name for name, mod in cli._INTERNAL.items() if mod == module}
        assert set(registered) == public | internal, module
        for name in public:
            assert registered[name] == cli._COMMANDS[name][1], name
        for name in internal:
            assert registered[name] is None, f"{name} must not have a listing help"


def test_help_lists_every_public_command_and_no_internal_one() -> None:
    done = run_execkit("--help")
    assert done.returncode == 0, done.stderr
    listing = done.stdout.split("positional arguments:", 1)[1].split("options:", 1)[0]
    listed = re.findall(r"^    (\S+)", listing, re.MULTILINE)
    assert listed == PUBLIC
    for name, (_module, one_line) in cli._COMMANDS.items():
        # argparse wraps the help: compare it with the whitespace squeezed out.
        assert " ".join(one_line.split()) in " ".join(listing.split()), name
    for name in INTERNAL:
        assert name not in done.stdout
    # argparse wraps a long usage line: compare it with the whitespace squeezed out.
    usage = " ".join(done.stdout.split("\n\n", 1)[0].split())
    assert usage == (
        "usage: execkit [-h] [--version] [--json] [--db PATH] [--remote URL] "
        "[--on-behalf-of NAME] COMMAND ..."
    )


def test_version_prints_the_installed_distributions_version() -> None:
    from importlib.metadata import version

    done = run_execkit("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"execkit {version('execkit-runner')}\n"
    assert execkit.__version__ == version("execkit-runner")


def test_importing_execkit_reads_no_metadata_until_the_version_is_asked_for() -> None:
    probe = (
        "import sys, execkit; before = 'importlib.metadata' in sys.modules; "
        "execkit.__version__; print(before, 'importlib.metadata' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_run_help_names_run_start_and_run_finish() -> None:
    done = run_execkit("run", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "execkit run start TASK_ID" in text and "execkit run finish RUN_ID" in text
    assert "admits" in text and "records how that run ended" in text
    assert all(name not in done.stdout for name in INTERNAL)


@pytest.mark.parametrize("typed", ["run-start", "run-finish", "run-strat", "rn", "nope"])
def test_an_unknown_command_never_names_or_suggests_an_internal_one(
    typed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([typed, "t-1"]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"execkit: invalid: execkit: unknown command {typed!r}")
    rest = err.split(f"{typed!r}", 1)[1]
    assert all(name not in rest for name in INTERNAL)
    choices = re.search(r"choose from ([^)]*)\)", rest)
    assert choices and choices.group(1).split(", ") == [repr(name) for name in PUBLIC]
    suggested = re.findall(r"did you mean '([^']+)'", rest)
    assert set(suggested) <= set(PUBLIC)
    if typed == "rn":
        assert suggested == ["run"]


def test_internal_commands_are_reached_as_run_start_and_run_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "l.db")
    assert main(["task", "create", "x", "--db", db]) == 0
    assert main(["run", "start", "t-1", "--db", db]) == 0
    assert main(["run", "finish", "r-1", "succeeded", "--db", db]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["run", "finish", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: execkit run finish ")


# -- what start-up imports ------------------------------------------------------------

HEAVY = {"sqlite3", "asyncio", "psutil", "execkit.ledger", "execkit.dispatch"}
GROUPS = {f"execkit.cli.{module}" for module, _ in cli._COMMANDS.values()}


def test_run_imports_no_ledger_asyncio_psutil_dispatcher_or_other_group() -> None:
    loaded = _imported("run", "--", "true")
    assert "execkit.cli._run" in loaded
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
    assert not loaded & {"execkit._agent", "execkit._registry", "importlib.metadata"}
    assert loaded & GROUPS == {"execkit.cli._run"}


def test_help_imports_no_command_group() -> None:
    loaded = _imported("--help")
    assert not loaded & GROUPS, sorted(loaded & GROUPS)
    assert not loaded & (HEAVY | {"execkit._exec", "execkit._classify", "subprocess"})


def test_a_command_imports_only_its_own_group() -> None:
    assert _imported("classify", "/dev/null") & GROUPS == {"execkit.cli._classify"}


# What a ledger listing must not import: the spawner and what only it needs, the
# classifier's rules (the ledger stores a FailureClass, which loads alone), the agent
# loop, adapters, the dispatcher, the server and the remote client, PostgreSQL, a new
# ledger's uuid and the package metadata.
NOT_FOR_A_LISTING = {
    "execkit._exec",
    "execkit._classify.entry",
    "execkit._classify.rules",
    "execkit._classify.scan",
    "execkit._classify.patterns",
    "execkit._classify.structure",
    "execkit._agent",
    "execkit._adapter",
    "execkit._registry",
    "execkit.dispatch",
    "execkit.server",
    "execkit.remote",
    "execkit.ledger._postgres",
    "subprocess",
    "psutil",
    "asyncio",
    "ctypes",
    "uuid",
    "psycopg",
    "starlette",
    "uvicorn",
    "http.client",
    "importlib.metadata",
    # What a listing of tasks whose text holds no credential never needs: the redactor
    # (loaded at the first string that could hold one), the proof types, the log
    # machinery, `secrets` (a run owner's id), shutil (argparse's terminal width) and
    # OpenSSL's hashes (a lane's credential fingerprint, a masked name's tag).
    "execkit._redact",
    "execkit._proof",
    "logging",
    "secrets",
    "shutil",
    "hashlib",
    "hmac",
}
# `--version` reads the installed distribution's metadata and nothing of execkit beyond
# its front door, the CLI's and the version's modules (importlib.metadata imports shutil).
NOT_FOR_THE_VERSION = NOT_FOR_A_LISTING - {"importlib.metadata", "shutil"} | {
    "attrs",
    "json",
    "sqlite3",
    "execkit.ledger",
    "execkit._classify",
    "execkit._proof",
    "execkit._redact",
    "execkit.cli._output",
}


def test_task_list_imports_only_the_ledger_it_reads(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    subprocess.run(
        [sys.executable, "-m", "execkit", "task", "create", "one", "--db", str(db)],
        env=_env(),
        capture_output=True,
        timeout=60,
        check=True,
    )
    loaded = _imported("task", "list", "--db", str(db))
    assert {"execkit.cli._ledger", "execkit.ledger._sqlite", "execkit._classify.verdict"} <= loaded
    assert not loaded & NOT_FOR_A_LISTING, sorted(loaded & NOT_FOR_A_LISTING)
    assert loaded & GROUPS == {"execkit.cli._ledger"}
    assert len(_own(loaded)) <= LISTING_MODULES_MAX, sorted(_own(loaded))


def _loaded(*args: str) -> set[str]:
    """The modules in `sys.modules` once `python -m execkit ARGS` has run (exit code 0).
    Unlike `-X importtime`, this sees the modules a package's `__getattr__` imports on
    first use of a name (`execkit.dispatch`'s rooms), which `importlib` loads unreported."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['execkit', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('execkit', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stderr.strip().splitlines()[-1].split())


# What `execkit status` must not import: what only a running dispatcher needs (the
# scheduler, the runner and its slots, the lanes it admits through, the adapter registry
# and the adapters, the spawner, the agent loop, the proof types, the log machinery), the
# classifier's rules, the package metadata, a board write's `secrets`, the server, the
# remote client, PostgreSQL. (The redactor loads for `--json`, which masks its head; the
# table of a ledger's own rows masks nothing, and the title prefix the dashboard reads by,
# which the ledger masks, is one of `_mask.PLAIN_TEXTS`.)
NOT_FOR_A_STATUS = {
    "execkit.dispatch._scheduler",
    "execkit.dispatch._runner",
    "execkit.dispatch._slots",
    "execkit.dispatch._lanes",
    "execkit._registry",
    "execkit._adapter",
    "execkit._agent",
    "execkit._attempt",
    "execkit._exec",
    "execkit._proof",
    "execkit._classify.rules",
    "execkit.server",
    "execkit.remote",
    "execkit.ledger._postgres",
    "importlib.metadata",
    "subprocess",
    "concurrent.futures",
    "logging",
    "secrets",
    "asyncio",
    "psutil",
    "psycopg",
}
# How many of execkit's own modules `status` has loaded when it ends (56 when this was
# written, 85 before), and the table alone without the redactor's (44, 56 before; 45 with
# the ledger's wake-ups, `ledger/_core/wake.py`, a concern of its own since issue 51; 58 and 46
# with its board outbox, `ledger/_core/outbox.py`, since issue 47; 61 and 49 with spend,
# issue 45: a run's cost `_usage.py`, the caps `ledger/_spend.py` and their admission
# `ledger/_core/spend.py`, which every run and every ledger carries; 62 and 50 with the
# notification outbox, `ledger/_core/notify.py`, since issue 49).
STATUS_MODULES_MAX = 62
STATUS_TABLE_MODULES_MAX = 50


def test_status_imports_the_dashboard_and_nothing_of_a_running_dispatcher(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    for title in ("board:I-1", "board:I-2"):
        subprocess.run(
            [sys.executable, "-m", "execkit", "task", "create", title, "--db", str(db)],
            env=_env(),
            capture_output=True,
            timeout=60,
            check=True,
        )
    for args in (["status"], ["status", "--json"]):
        loaded = _loaded(*args, "--db", str(db))
        assert {"execkit.cli._status", "execkit.dispatch._status"} <= loaded
        assert not loaded & NOT_FOR_A_STATUS, sorted(loaded & NOT_FOR_A_STATUS)
        assert len(_own(loaded)) <= STATUS_MODULES_MAX, sorted(_own(loaded))
        if args == ["status"]:  # the table masks nothing: no redactor (60 ms) is loaded
            assert not any(name.startswith("execkit._redact") for name in loaded)
            assert len(_own(loaded)) <= STATUS_TABLE_MODULES_MAX, sorted(_own(loaded))
        else:
            assert "execkit._redact" in loaded


def test_importing_the_dispatch_package_imports_none_of_its_rooms() -> None:
    code = "import sys, execkit.dispatch; print(sorted(m for m in sys.modules if 'dispatch' in m))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "['execkit.dispatch']", done.stderr


def test_version_imports_only_the_metadata() -> None:
    loaded = _imported("--version")
    assert "importlib.metadata" in loaded
    assert not loaded & NOT_FOR_THE_VERSION, sorted(loaded & NOT_FOR_THE_VERSION)
    assert {m for m in loaded if m.startswith("execkit")} == {
        "execkit",
        "execkit._errors",
        "execkit._version",
        "execkit.cli",
    }


# What a plain `execkit run -- true` (streams, exits with the child's status) must not
# import: the classifier and the proof types (only `--json` classes the result), the log
# machinery (only dispatch and serve log), OpenSSL's hashes (a masked name's tag, a backoff's
# jitter) and shutil (argparse's terminal width, found without it).
NOT_FOR_A_PLAIN_RUN = {
    "execkit._classify",
    "execkit._classify.verdict",
    "execkit._proof",
    "logging",
    "hashlib",
    "shutil",
}
# How many of execkit's own modules `run -- true` and `task list` import (27 and 38 when
# this was written; 30 and 45 before): a new module on either path has to be worth it.
# 28 and 39 since issues 51 and 52: the exec stage's line hook (`_exec/lines.py`, which
# every spawn's supervisor splits lines with when asked) and the ledger's wake-ups; the
# listing 40 since issue 47: the ledger's board outbox (`ledger/_core/outbox.py`), one of
# the ledger's operations every ledger class carries; 43 since issue 45: a run's cost and
# the spend caps (`_usage.py`, `ledger/_spend.py`, `ledger/_core/spend.py`); 44 since issue
# 49: its notification outbox (`ledger/_core/notify.py`).
RUN_MODULES_MAX = 28
LISTING_MODULES_MAX = 44


def _own(modules: set[str]) -> set[str]:
    return {name for name in modules if name == "execkit" or name.startswith("execkit.")}


def test_a_plain_run_imports_no_classifier_logging_hashlib_or_shutil() -> None:
    loaded = _imported("run", "--", "true")
    assert not loaded & NOT_FOR_A_PLAIN_RUN, sorted(loaded & NOT_FOR_A_PLAIN_RUN)
    assert len(_own(loaded)) <= RUN_MODULES_MAX, sorted(_own(loaded))


def test_execkits_own_modules_compile_no_regex_on_the_way_to_run_or_list(tmp_path: Path) -> None:
    """`re.compile` calls made by execkit's own modules while `run -- true` and `task list`
    start and run (the classifier's patterns compile on first use; a pattern string used
    with `re.fullmatch` is compiled and cached by `re` at its first use). The redactor's
    two name patterns are the only ones left, compiled when it is imported, which an
    empty listing never does."""
    probe = (
        "import collections, re, runpy, sys\n"
        "calls = collections.Counter()\n"
        "real = re.compile\n"
        "def counting(pattern, flags=0):\n"
        "    calls[sys._getframe(1).f_globals.get('__name__')] += 1\n"
        "    return real(pattern, flags)\n"
        "re.compile = counting\n"
        "sys.argv = ['execkit', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('execkit', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in calls if m and m.startswith('execkit')), file=sys.stderr)\n"
    )
    db = tmp_path / "ledger.db"
    # A ledger to list (a missing one is an error, whose message is masked: the first text
    # masked in a process loads the redactor's rule table, which an error may pay for).
    subprocess.run(
        [sys.executable, "-m", "execkit", "db", "init", "--db", str(db)],
        env=_env(),
        capture_output=True,
        check=True,
        timeout=60,
    )
    redactor = ["execkit._redact.env", "execkit._redact.words"]
    for args, expected in (
        (["run", "--", "true"], redactor),
        (["task", "list", "--db", str(db)], []),  # nothing to mask: no redactor at all
    ):
        done = subprocess.run(
            [sys.executable, "-c", probe, *args],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.stderr.strip().splitlines()[-1] == str(expected), done.stderr


def test_importing_the_cli_is_light_and_changes_no_signal_handler() -> None:
    probe = (
        "import signal, sys\n"
        "before = signal.getsignal(signal.SIGINT)\n"
        "import execkit.cli\n"
        "assert signal.getsignal(signal.SIGINT) is before\n"
        "print(sorted(m for m in sys.modules if m.startswith(('execkit', 'argparse'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['execkit', 'execkit.cli']"


def test_the_classifier_compiles_its_patterns_on_first_use_not_at_import() -> None:
    probe = (
        "import execkit._classify as c\n"
        "from execkit._classify.patterns import FLAGS, compiled\n"
        "from execkit._classify.rules import RULES\n"
        "assert compiled.cache_info().currsize == 0, 'compiled at import'\n"
        "patterns = [a.pattern for rule in RULES for a in rule.alternatives]\n"
        "assert len(patterns) > 30, len(patterns)\n"
        "assert all(p.flags & FLAGS == FLAGS for p in patterns)\n"
        "assert patterns[0] is RULES[0].alternatives[0].pattern, 'compiled once'\n"
        "print(c.classify_text('HTTP/1.1 503 Service Unavailable').reason)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "http 503"


def test_a_handler_keeps_the_callers_sigint_handler_in_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = signal.getsignal(signal.SIGINT)
    assert main(["classify", "/dev/null"]) == 0
    assert signal.getsignal(signal.SIGINT) is before
    capsys.readouterr()


def test_keyboard_interrupt_in_process_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import execkit.cli._classify as group

    def interrupted(_path: str) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(group, "_read_tail", interrupted)
    assert main(["classify", "-"]) == 130
    assert capsys.readouterr().err == f"{INTERRUPTED}\n"


# -- Ctrl-C in a real process ---------------------------------------------------------


def _start(*args: str, stdout: int | IO[Any] | None = subprocess.PIPE) -> subprocess.Popen[str]:
    """`python -X importtime -m execkit ARGS` with SIGINT at its default, stdin a pipe
    left open (so `classify -` waits for it), stderr a pipe."""
    return subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "execkit", *args],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        # Whatever the test runner did with SIGINT, the child starts with the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _own_lines(stderr: str) -> list[str]:
    """stderr without the `-X importtime` report."""
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


def _lines_until(proc: subprocess.Popen[str], module: str) -> Iterator[str]:
    """stderr up to `-X importtime`'s line for `module` (bounded: a watchdog kills the
    process if that line never comes)."""
    assert proc.stderr is not None
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        for line in proc.stderr:
            yield line
            if line.startswith("import time:") and line.rsplit("|", 1)[1].strip() == module:
                return
    finally:
        watchdog.cancel()
    raise AssertionError(f"{module} was never imported")


def _finish(proc: subprocess.Popen[str], head: list[str]) -> tuple[int, list[str]]:
    try:
        _out, rest = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, _own_lines("".join(head) + rest)


def test_ctrl_c_the_moment_the_process_starts_kills_it_quietly() -> None:
    # Before the interpreter has set up any handler, SIGINT's default action ends the
    # process (a shell reports 130); nothing is printed, certainly no traceback.
    proc = _start("classify", "-")
    proc.send_signal(signal.SIGINT)
    code, lines = _finish(proc, [])
    assert (code, lines) in [(-signal.SIGINT, []), (130, [INTERRUPTED])]


# Modules imported after execkit's own code took over Ctrl-C: by the CLI module, while
# reading argv, and while importing the command's group; SIGINT lands at or after each.
@pytest.mark.parametrize(
    "module", ["execkit.cli", "execkit.cli._output", "argparse", "execkit._classify"]
)
def test_ctrl_c_during_start_up_is_one_line_and_130(module: str) -> None:
    proc = _start("classify", "-")
    head = list(_lines_until(proc, module))
    proc.send_signal(signal.SIGINT)
    code, lines = _finish(proc, head)
    assert (code, lines) == (130, [INTERRUPTED])


def test_ctrl_c_while_a_handler_waits_is_one_line_and_130() -> None:
    proc = _start("classify", "-")
    head = list(_lines_until(proc, "execkit.cli._classify"))
    time.sleep(0.3)  # most likely reading stdin by now; any moment after gives the same
    proc.send_signal(signal.SIGINT)
    code, lines = _finish(proc, head)
    assert (code, lines) == (130, [INTERRUPTED])


def test_a_second_ctrl_c_still_prints_one_line() -> None:
    proc = _start("classify", "-")
    head = list(_lines_until(proc, "execkit.cli._classify"))
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    code, lines = _finish(proc, head)
    assert (code, lines) == (130, [INTERRUPTED])


def _pipe_bytes(fd: int) -> int:
    buffered = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buffered)
    return int.from_bytes(buffered, sys.byteorder)


def test_ctrl_c_while_printing_is_one_line_and_130(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    script = (
        "import sys\nfrom execkit.ledger import open_ledger\n"
        "with open_ledger(sys.argv[1]) as ledger:\n"
        "    for _ in range(400): ledger.create_task('a title long enough ' * 10, actor='a')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(db)], env=_env(), check=True, timeout=120)
    read_end, write_end = os.pipe()
    try:
        proc = _start("task", "list", "--db", str(db), stdout=write_end)
        os.close(write_end)
        # Nobody reads: once the pipe is full (it stops filling), execkit is blocked printing.
        deadline = time.monotonic() + 60
        filled, steady = -1, 0
        while steady < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
            now = _pipe_bytes(read_end)
            steady = steady + 1 if now == filled and now >= 32768 else 0
            filled = now
        assert proc.poll() is None, "the listing fit in the pipe"
        proc.send_signal(signal.SIGINT)
        os.set_blocking(read_end, False)
        while proc.poll() is None:  # drain, so the flush at exit cannot block
            try:
                os.read(read_end, 1 << 16)
            except BlockingIOError:
                time.sleep(0.01)
        code, lines = _finish(proc, [])
    finally:
        os.close(read_end)
    assert (code, lines) == (130, [INTERRUPTED])


def test_ctrl_c_during_a_long_run_exits_130_with_one_line() -> None:
    # `execkit run`'s own signal handling lives in cli/_run.py; here only what the
    # operator sees: exit 130, one line, and the child does not outlive execkit.
    proc = _start("run", "--", "sleep", "5", stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    children: list[psutil.Process] = []
    while not children and time.monotonic() < deadline:
        children = [c for c in psutil.Process(proc.pid).children() if c.name() == "sleep"]
        time.sleep(0.01)
    assert children, "sleep never started"
    proc.send_signal(signal.SIGINT)
    code, lines = _finish(proc, [])
    assert code == 130
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert wait_gone(children[0].pid)


def test_an_inherited_ignored_sigint_stays_ignored() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "execkit", "classify", "-"],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate("HTTP/1.1 503 Service Unavailable\n", timeout=30)
    assert proc.returncode == 0, err
    assert out.startswith("upstream: http 503")
