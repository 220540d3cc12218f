"""`execkit adapters` and `run_adapter_command` (the `execkit run --adapter` handler)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from execkit._errors import InvalidInput, UnknownAdapter
from execkit.cli import main
from execkit.cli._adapters import run_adapter_command
from execkit.testing import FakeVendor

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def ns(
    adapter: str, *argv: str, as_json: bool = True, timeout: str | None = None
) -> argparse.Namespace:
    return argparse.Namespace(
        adapter=adapter, command_argv=["--", *argv], json=as_json, timeout=timeout
    )


def test_adapters_lists_every_adapter_and_whether_it_is_on_path(tmp_path: Path) -> None:
    fake_bin = tmp_path / "claude"
    fake_bin.write_text("#!/bin/sh\nexit 0\n")
    fake_bin.chmod(0o755)
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "execkit", "adapters", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)["adapters"]}
    assert {"codex", "claude", "gemini", "opencode", "generic"} <= set(rows)
    assert rows["claude"]["on_path"] is True
    assert rows["claude"]["path"] == str(fake_bin)
    assert rows["codex"]["on_path"] is False
    assert rows["codex"]["install_hint"] == "npm install -g @openai/codex"
    text = subprocess.run(
        [sys.executable, "-m", "execkit", "adapters"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert (
        "codex" in text.stdout
        and "not on PATH; install: npm install -g @openai/codex" in text.stdout
    )


def test_run_adapter_missing_binary_prints_the_precondition(
    fake_vendor: FakeVendor, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_vendor.register("codex", missing=True)
    code = run_adapter_command(ns("codex", "fix the test"), start=fake_vendor.start)
    out = json.loads(capsys.readouterr().out)
    assert code == 127
    assert out["class"] == "environment"
    assert out["reason"] == "spawn errno ENOENT"
    assert out["precondition"].startswith(
        "codex CLI not found on PATH; install: npm install -g @openai/codex"
    )
    assert fake_vendor.calls("codex") == [("codex", "exec", "--json", "fix the test")]


def test_run_adapter_upstream_and_success(
    fake_vendor: FakeVendor, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_vendor.register("claude", stdout=FIXTURES / "claude" / "overloaded.json", exit_code=1)
    fake_vendor.register("claude", stdout=FIXTURES / "claude" / "success.json")
    start = fake_vendor.start
    assert run_adapter_command(ns("claude", "x"), start=start) == 1
    failed = json.loads(capsys.readouterr().out)
    assert (failed["class"], failed["reason"], failed["precondition"]) == (
        "upstream",
        "http 529",
        None,
    )
    assert run_adapter_command(ns("claude", "x", as_json=False), start=start) == 0
    assert "Renamed `fetch_rows`" in capsys.readouterr().out


def test_run_adapter_builds_the_argv_dispatch_builds_and_classes_a_429_the_same(
    fake_vendor: FakeVendor, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 51 item 8: `run --adapter claude -- "say hi"` ran bare `claude "say hi"` (no -p,
    # no output format), so claude's 429 was charged work while dispatch classed it upstream.
    from execkit import AgentRequest, get_adapter
    from execkit.dispatch import AdapterRunner, BoardIssue

    recorded = FIXTURES / "recorded" / "claude" / "rate_limit_429"
    fake_vendor.register("claude", stdout=recorded / "stdout", exit_code=1)
    code = run_adapter_command(ns("claude", "--model", "m1", "say hi"), start=fake_vendor.start)
    proof = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (proof["class"], proof["reason"]) == ("upstream", "http 429")
    # The argv is the dispatcher's for the same issue, the extra ARGS added, not instead.
    issue = BoardIssue(id="ISS-1", title="t", state="todo", prompt="say hi", argv=("--model", "m1"))
    dispatch_argv = get_adapter("claude").build_argv(AdapterRunner().request_for(issue))
    assert fake_vendor.calls("claude") == [tuple(dispatch_argv)]
    assert dispatch_argv == get_adapter("claude").build_argv(
        AgentRequest(prompt="say hi", extra_args=("--model", "m1"))
    )
    assert dispatch_argv[:5] == ["claude", "-p", "--output-format", "stream-json", "--verbose"]


@pytest.mark.parametrize(
    ("adapter", "given", "field", "named"),
    [
        ("claude", [], "prompt", "needs a prompt after --"),
        ("claude", ["--output-format", "text", "say hi"], "extra_args", "'--output-format'"),
        ("claude", ["--output-format=text", "say hi"], "extra_args", "'--output-format=text'"),
        ("claude", ["say hi", "-p"], "extra_args", "'-p'"),
        ("codex", ["exec", "fix it"], "extra_args", "'exec'"),
        ("codex", ["--json", "fix it"], "extra_args", "'--json'"),
        ("gemini", ["--prompt=x", "y"], "extra_args", "'--prompt=x'"),
        ("generic", [], "extra_args", "needs the command after --"),
    ],
)
def test_run_adapter_refuses_what_its_adapter_could_not_read(
    fake_vendor: FakeVendor, adapter: str, given: list[str], field: str, named: str
) -> None:
    fake_vendor.register(adapter, stdout="never run\n")
    with pytest.raises(InvalidInput, match=named) as raised:
        run_adapter_command(ns(adapter, *given), start=fake_vendor.start)
    assert raised.value.field == field
    assert fake_vendor.calls(adapter) == []


def test_run_adapter_human_failure_line(
    fake_vendor: FakeVendor, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_vendor.register("gemini", missing=True)
    args = ns("gemini", "x", as_json=False)
    assert run_adapter_command(args, start=fake_vendor.start) == 127
    err = capsys.readouterr().err
    assert err.startswith("execkit: gemini failed (environment: spawn errno ENOENT): gemini CLI")


def test_run_adapter_generic_runs_a_real_process(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_adapter_command(ns("generic", sys.executable, "-c", "print('hello')"))
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (out["status"], out["class"], out["output"]) == ("succeeded", None, "hello")


def test_run_adapter_bad_input_is_a_clear_error() -> None:
    with pytest.raises(UnknownAdapter, match="known adapters"):
        run_adapter_command(ns("nope", "x"))
    with pytest.raises(InvalidInput, match="needs the command after --"):
        run_adapter_command(ns("generic"))
    with pytest.raises(InvalidInput, match="--timeout"):
        run_adapter_command(ns("generic", "true", timeout="-1"))
    with pytest.raises(InvalidInput, match="--timeout"):
        run_adapter_command(ns("generic", "true", timeout="soon"))
    bad_grace = ns("generic", "true")
    bad_grace.kill_grace = "-2"
    with pytest.raises(InvalidInput, match="--kill-grace"):
        run_adapter_command(bad_grace)


def test_run_adapter_timeout_kills_a_hung_vendor(
    fake_vendor: FakeVendor, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_vendor.register("opencode", hang=True)
    args = ns("opencode", "x", timeout="0.5")  # a real process: a real timeout
    args.kill_grace = "0"
    assert run_adapter_command(args, start=fake_vendor.start) == 124
    assert json.loads(capsys.readouterr().out)["reason"] == "timeout"


def test_main_hands_its_starter_to_run_and_run_adapter(
    fake_vendor: FakeVendor, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_vendor.register("codex", missing=True)
    fake_vendor.register("mycli", stdout="hi\n", exit_code=3)
    argv = ["run", "--adapter", "codex", "--json", "--", "x"]
    assert main(argv, start=fake_vendor.start) == 127
    assert json.loads(capsys.readouterr().out)["reason"] == "spawn errno ENOENT"
    assert main(["run", "--json", "--", "mycli", "a"], start=fake_vendor.start) == 3
    assert json.loads(capsys.readouterr().out)["stdout_tail"] == "hi\n"
    assert fake_vendor.calls("codex") == [("codex", "exec", "--json", "x")]
    assert fake_vendor.calls("mycli") == [("mycli", "a")]


def test_adapters_says_whether_credentials_look_present_by_name_only(tmp_path: Path) -> None:
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "auth.json").write_text('{"tokens": "sk-proj-FileSecretValue1234"}')
    secret = "sk-ant-api03-EnvSecretValueAbCdEfGh1234567890"
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "ANTHROPIC_API_KEY": secret}
    run = [sys.executable, "-m", "execkit", "adapters"]
    as_json = subprocess.run(
        [*run, "--json"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert as_json.returncode == 0, as_json.stderr
    rows = {row["name"]: row for row in json.loads(as_json.stdout)["adapters"]}
    assert rows["claude"]["credentials"]["present"] is True
    assert rows["claude"]["credentials"]["found"] == ["ANTHROPIC_API_KEY"]
    assert rows["codex"]["credentials"]["found"] == ["~/.codex/auth.json"]
    assert rows["gemini"]["credentials"]["present"] is False
    assert rows["gemini"]["credentials"]["env"][0] == "GEMINI_API_KEY"
    assert rows["generic"]["credentials"]["known"] is False
    text = subprocess.run(run, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert "credentials: present (ANTHROPIC_API_KEY)" in text.stdout
    assert "credentials: present (~/.codex/auth.json)" in text.stdout
    assert "credentials: none found (no GEMINI_API_KEY" in text.stdout
    assert "log in: run `gemini` once to sign in with Google" in text.stdout
    for output in (as_json.stdout, text.stdout):
        assert secret not in output and "EnvSecret" not in output
        assert "FileSecretValue" not in output
