"""The README's code runs as written, and twice in the same folder (a reader tries a block
again): the Python API example, the adapter example, the pytest plugin example and every
shell block. A README that drifts from the code fails here."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["pytester"]

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _python_block(starts_with: str) -> str:
    found: list[str] = _BLOCK.findall(README.read_text(encoding="utf-8"))
    blocks = [b for b in found if starts_with in b]
    assert len(blocks) == 1, f"expected one README python block containing {starts_with!r}"
    return blocks[0]


def test_the_python_api_example_prints_what_its_comments_say(tmp_path: Path) -> None:
    code = _python_block("from execkit import AgentFailed, AgentRequest, classify")
    lines = code.splitlines()
    # The comment right under each print() is what it prints.
    expected = [
        line.removeprefix("# ")
        for before, line in itertools.pairwise(lines)
        if before.startswith("print(") and line.startswith("# ")
    ]
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}  # no vendor CLI on PATH
    for _ in range(2):  # the second run meets the first one's ledger.db
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
            timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        printed = done.stdout.splitlines()
        assert len(printed) == len(expected) == 3
        for got, want in zip(printed, expected, strict=True):
            # A comment may elide the end of a long line with "...".
            assert got.startswith(want.removesuffix("...").rstrip()), (got, want)


def test_the_adapter_example_classes_its_envelope() -> None:
    namespace: dict[str, object] = {}
    exec(_python_block("class AcmeAdapter"), namespace)
    adapter = namespace["AcmeAdapter"]()  # type: ignore[operator]

    from execkit import Adapter, FailureClass, spawn

    assert isinstance(adapter, Adapter)
    refused = spawn(
        [sys.executable, "-c", 'print(\'{"error": "busy", "status": 503}\'); raise SystemExit(1)']
    )
    raw = adapter.parse(refused)
    assert raw.failure_class is FailureClass.UPSTREAM
    answered = spawn([sys.executable, "-c", 'print(\'{"answer": "42"}\')'])
    assert adapter.parse(answered).text == "42"
    missing = adapter.parse(spawn(["acme-not-installed-here"]))
    assert missing.failure_class is FailureClass.ENVIRONMENT
    assert "pip install acme-cli" in (missing.precondition or "")


def test_the_plugin_example_passes(pytester: pytest.Pytester) -> None:
    # Verbatim: the block carries its own imports and reads no file it does not make.
    pytester.makepyfile(_python_block("import json"))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def _sh_block(starts_with: str) -> str:
    found: list[str] = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    blocks = [b for b in found if b.startswith(starts_with)]
    assert len(blocks) == 1, f"expected one README sh block starting {starts_with!r}"
    return blocks[0]


def _shell_with_execkit(tmp_path: Path) -> dict[str, str]:
    """An environment whose `execkit` is this checkout's, whatever is installed, and whose
    `mktemp -d` makes its folders under tmp_path/scratch (where the test finds them)."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (tmp_path / "scratch").mkdir()
    shim = shims / "execkit"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m execkit "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXECKIT_")}
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(README.parent)
    env["TMPDIR"] = str(tmp_path / "scratch")
    return env


def _run_twice(block: str, work: Path, env: dict[str, str]) -> list[str]:
    """Run a shell block as written, twice in the same folder; the two outputs."""
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    return outputs


def test_the_operator_loop_runs_as_written(tmp_path: Path) -> None:
    block = _sh_block('cd "$(mktemp -d)"                 # a scratch folder for the board')
    work = tmp_path / "work"
    work.mkdir()
    for output in _run_twice(block, work, _shell_with_execkit(tmp_path)):
        lines = output.splitlines()
        first = next(line for line in lines if "attempt 1/10" in line)
        assert "environment (uncharged): acme-agent CLI not found on PATH" in first
        assert "moved to blocked" in first
        # `execkit status` names the task beside the issue (issue #31).
        assert any(line.startswith("ISS-1  t-1   blocked  blocked (environment)") for line in lines)
        assert "ISS-1  attempt 2/10  succeeded -> moved to done" in lines
        runs = [line for line in lines if line.startswith("r-")]
        assert [run.split()[4:6] for run in runs] == [
            ["failed", "environment"],
            ["succeeded", "-"],
        ]
        assert runs[1].endswith("forced")
    boards = sorted((tmp_path / "scratch").glob("*/board.json"))
    assert len(boards) == 2
    for board in boards:
        assert json.loads(board.read_text(encoding="utf-8"))["issues"][0]["state"] == "done"


def test_the_spend_tour_runs_as_written(tmp_path: Path) -> None:
    block = _sh_block("# Spend: caps held when a run is admitted")
    work = tmp_path / "work"
    work.mkdir()
    for output in _run_twice(block, work, _shell_with_execkit(tmp_path)):
        lines = output.splitlines()
        assert lines[0].split() == ["day", "ledger-wide", "$1.00", "(UTC)"]
        assert "r-1  t-1 attempt 1  succeeded  -  $0.42 1,500 tokens" in lines
        refused = next(line for line in lines if "spend_cap" in line)
        assert "waiting on the day's budget until" in refused and "nothing was charged" in refused
        assert "exit 18" in lines
        assert any(line.split()[-3:] == ["1", "$0.42", "1,500"] for line in lines)
        assert "$ per done issue: $0.42 (1 done, 1 run, failed ones included)" in lines


def test_the_cli_tour_runs_as_written(tmp_path: Path) -> None:
    block = _sh_block("# Run a command directly")
    work = tmp_path / "work"
    work.mkdir()
    # Nothing is prepared: the block makes its own scratch folder, ledger and board.
    for output in _run_twice(block, work, _shell_with_execkit(tmp_path)):
        lines = output.splitlines()
        assert lines[0] == "hello"
        # The stall watchdog: one line, then silence, stopped by the stall (not the sleep).
        assert lines[1:3] == ["one line", "exit 124"]
        assert json.loads(lines[3])["class"] == "upstream"
        assert lines[4] == "exit 1"
        assert json.loads(lines[5])["precondition"].startswith("acme-agent CLI not found on PATH")
        assert lines[6] == "exit 127"
        assert "r-1  t-1 attempt 1  failed  upstream  http 503" in lines
        assert "ci-bot  agent.operate" in output
        assert "ISS-7  attempt 1/10  succeeded -> moved to done" in lines
    assert not list(work.iterdir()), "the tour wrote outside its scratch folder"


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_outgrowing_one_machine_runs_as_written(tmp_path: Path, pg_url: str) -> None:
    """As written but for the two things that name this machine: the database URL (a fresh
    schema on the test run's cluster) and the port (a free one). The `&` line is started
    here, as the shell would, and waited on until it says it listens."""
    block = _sh_block("# The ledger on a PostgreSQL server")
    assert "postgresql://execkit@db.internal:5432/execkit" in block and ":8750" in block
    block = block.replace(
        "postgresql://execkit@db.internal:5432/execkit", shlex.quote(pg_url)
    ).replace("127.0.0.1:8750", f"127.0.0.1:{_free_port()}")
    lines = block.splitlines()
    (serve_at,) = [i for i, line in enumerate(lines) if line.endswith(" &")]
    before, serve, after = lines[:serve_at], lines[serve_at], lines[serve_at + 1 :]
    work = tmp_path / "work"
    work.mkdir()
    env = _shell_with_execkit(tmp_path)

    def shell(script: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", "\n".join(script)],
            cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    for round_ in (1, 2):  # as written, then again in the same folder on the same database
        env.pop("EXECKIT_DB", None)
        first = shell(before)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"t-{round_}" in first.stdout
        env["EXECKIT_DB"] = pg_url  # what `export` set for the rest of the reader's shell
        server = subprocess.Popen(
            ["bash", "-c", f"exec {serve.removesuffix(' &')}"],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            ready = server.stdout.readline()  # one line once the socket listens (or EOF)
            if "listening on http://127.0.0.1:" not in ready:
                server.kill()
                _, why = server.communicate(timeout=30)
                raise AssertionError(f"execkit serve did not start: {ready!r} {why}")
            done = shell(after)
        finally:
            server.terminate()
            server.wait(timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
        printed = done.stdout.splitlines()
        assert printed[0].startswith("t-1  port the parser")
        run = json.loads(printed[-1])
        # The second round's start replays the first's request key: the same run, not a new one.
        assert (run["id"], run["task_id"], run["attempt"], run["status"]) == (
            "r-1",
            "t-1",
            1,
            "running",
        )
        assert run["actor"] == "ci-bot"
    assert (work / "tokens.json").stat().st_mode & 0o077 == 0
    assert "sha256" in (work / "tokens.json").read_text(encoding="utf-8")
    assert (work / "ci-bot.token").stat().st_mode & 0o077 == 0
    token = (work / "ci-bot.token").read_text(encoding="utf-8").strip()
    assert token and token not in (work / "tokens.json").read_text(encoding="utf-8")


def test_the_make_lines_name_targets_that_exist() -> None:
    block = _sh_block("make demo")
    targets = [line.split()[1] for line in block.splitlines() if line.startswith("make ")]
    assert targets == ["demo", "test"]
    for target in targets:
        dry = subprocess.run(
            ["make", "-n", target], cwd=README.parent, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert dry.returncode == 0, dry.stderr
    assert (
        "-m execkit demo"
        in subprocess.run(
            ["make", "-n", "demo"], cwd=README.parent, capture_output=True, text=True, timeout=60
        ).stdout
    )


def test_the_entry_point_registers_the_example_adapter(tmp_path: Path) -> None:
    """The toml block, installed as a distribution's metadata would be, makes the README's
    adapter findable by name in a fresh interpreter."""
    import tomllib

    found = re.findall(r"```toml\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert len(found) == 1
    groups = tomllib.loads(found[0])["project"]["entry-points"]
    assert list(groups) == ["execkit.adapters"]
    (name, target), = groups["execkit.adapters"].items()  # fmt: skip
    module, _, attr = target.partition(":")
    (tmp_path / f"{module}.py").write_text(_python_block("class AcmeAdapter"), encoding="utf-8")
    info = tmp_path / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[execkit.adapters]\n{name} = {module}:{attr}\n")
    probe = (
        "import execkit; a = execkit.get_adapter('acme'); "
        "print(type(a).__name__, a.binary, 'acme' in execkit.adapter_names())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{README.parent}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["AcmeAdapter", "acme", "True"]


def _comments_after_code(code: str) -> list[str]:
    """The block's closing comment lines (what it prints), without their `# `."""
    lines = code.rstrip().splitlines()
    tail: list[str] = []
    while lines and lines[-1].startswith("# "):
        tail.insert(0, lines.pop().removeprefix("# "))
    return tail


def _run_block(code: str, cwd: Path) -> list[str]:
    env = {**os.environ, "PATH": str(cwd / "empty-bin")}  # no vendor CLI on PATH
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _matches(printed: list[str], expected: list[str]) -> None:
    assert len(printed) == len(expected), (printed, expected)
    for got, want in zip(printed, expected, strict=True):
        assert got.startswith(want.removesuffix("...").rstrip()), (got, want)


def test_the_runner_example_is_at_most_25_lines_and_settles_every_task(tmp_path: Path) -> None:
    code = _python_block("run_attempt(ledger, task_id, claude")
    expected = _comments_after_code(code)
    # The runner's own lines; the closing comments are what it prints.
    assert len(code.rstrip().splitlines()) - len(expected) <= 25
    # The first task finds the CLI missing; the second is held by the lane it stopped.
    _matches(_run_block(code, tmp_path), expected)
    # Again in the same folder: the tasks are the same ones, the first already blocked and
    # not re-run, the second still held (nothing reached the vendor).
    _matches(_run_block(code, tmp_path), [expected[2], expected[1]])


def test_the_retry_library_example_does_not_retry_an_environment_failure(
    tmp_path: Path,
) -> None:
    code = _python_block("wait=wait_for_reset()")
    for _ in range(2):
        _matches(_run_block(code, tmp_path), _comments_after_code(code))


def test_the_workspaces_example_runs_as_written(tmp_path: Path) -> None:
    block = _sh_block("# A workspace per issue")
    work = tmp_path / "work"
    work.mkdir()
    for output in _run_twice(block, work, _shell_with_execkit(tmp_path)):
        lines = output.splitlines()
        assert "WS-1  attempt 1/10  succeeded -> moved to done" in lines
        assert "WS-2  attempt 1/10  succeeded -> moved to done" in lines
        one, two = output.split("ws/WS-2:")
        assert "one.txt" in one and "two.txt" not in one and ".made-by-hook" in one
        assert "two.txt" in two and "one.txt" not in two and ".made-by-hook" in two
        assert [line.strip("+* ") for line in lines if "execkit/WS-" in line] == [
            "execkit/WS-1",
            "execkit/WS-2",
        ]
        assert lines[-1].startswith("  workspace: ") and lines[-1].endswith("/ws/WS-1 (attempt 1)")
    assert not list(work.iterdir()), "the example wrote outside its scratch folder"


def test_the_webhook_check_accepts_execkits_signature_and_nothing_else() -> None:
    import time

    from execkit._notify import render, sign
    from execkit.ledger import NotifyEvent

    namespace: dict[str, Any] = {}
    exec(_python_block("def verify_execkit("), namespace)
    verify = namespace["verify_execkit"]
    event = NotifyEvent(seq=1, id="evt_1", kind="lane.stopped", subject="c/d", payload={}, at=1.0)
    body = render(event, "json")
    stamp = str(int(time.time()))
    headers = {"X-Execkit-Timestamp": stamp, "X-Execkit-Signature": sign("s3cret", stamp, body)}
    assert verify(b"s3cret", headers, body)
    assert not verify(b"other", headers, body)
    assert not verify(b"s3cret", headers, body + b" ")
    old = str(int(stamp) - 3600)
    assert not verify(
        b"s3cret",
        {"X-Execkit-Timestamp": old, "X-Execkit-Signature": sign("s3cret", old, body)},
        body,
    )
    assert not verify(b"s3cret", {}, body)
