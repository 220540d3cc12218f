"""`execkit demo` (what `make demo` runs) in a real process: the four issues end as designed,
the output is the same on every run, and the README quotes it as it is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _support import REPO, table_columns

README = REPO / "README.md"


def run_demo(*extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EXECKIT_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "execkit", "demo", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def event_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("t+")]


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One demo run for the module (it spawns a dozen processes): stdout and its --keep dir."""
    where = tmp_path_factory.mktemp("demo") / "kept"
    result = run_demo("--keep", str(where))
    assert result.returncode == 0, result.stderr
    return result.stdout, where


def test_demo_shows_the_four_outcomes(kept: tuple[str, Path]) -> None:
    out, where = kept
    rows = {row["ISSUE"]: row for row in table_columns(out)}
    assert set(rows) == {"DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"}
    columns = ["BOARD", "LEDGER", "STARTED", "CHARGED", "UNCHARGED", "NEXT", "LAST CLASS"]

    def cells(issue: str) -> list[str]:
        return [rows[issue][c] for c in columns]

    # One succeeds at once.
    assert cells("DEMO-1") == ["done", "done", "1/10 cap", "1/3", "0/3", "-", "succeeded"]
    # The missing binary stops at once, uncharged, naming the install hint.
    assert cells("DEMO-2") == [
        "blocked",
        "blocked (environment)",
        "1/10 cap",
        "0/3",
        "0/3",
        "-",
        "environment",
    ]
    assert rows["DEMO-2"]["REASON"].startswith(
        "environment: acme-agent CLI not found on PATH; install: pip install acme-agent"
    )
    # A vendor 503 twice, then success: three dispatches, only the success charged.
    assert cells("DEMO-3") == ["done", "done", "3/10 cap", "1/3", "0/3", "-", "succeeded"]
    events = event_lines(out)
    assert [line.split()[3:5] for line in events if "DEMO-3" in line] == [
        ["attempt", "1/10"],
        ["attempt", "2/10"],
        ["attempt", "3/10"],
    ]
    upstream = [line for line in events if "upstream (uncharged): http 503" in line]
    assert [line.split()[2] for line in upstream] == ["DEMO-3", "DEMO-3"]
    # Always wrong: charged until the charged budget is spent, then Blocked.
    assert cells("DEMO-4") == ["blocked", "blocked (work)", "3/10 cap", "3/3", "0/3", "-", "work"]
    # The block and then the last failure itself (issue #31: the block alone hides it).
    assert rows["DEMO-4"]["REASON"] == (
        "charged budget spent: 3 of 3 attempts; last failure: default: check failed: "
        "expected 42, got 41"
    )
    assert events[-1].endswith(
        "-> moved to blocked (charged budget spent: 3 of 3 attempts; "
        "move the card back to retry once)"
    )
    # The kept board and ledger say the same thing afterwards.
    board = json.loads((where / "board.json").read_text())
    assert {i["id"]: i["state"] for i in board["issues"]} == {
        "DEMO-1": "done",
        "DEMO-2": "blocked",
        "DEMO-3": "done",
        "DEMO-4": "blocked",
    }
    # Kept where the commands look: `execkit status` in the folder finds its ledger.
    assert (where / ".execkit" / "ledger.db").exists()


def run_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`execkit ARGS` as a user runs it in `folder`, with no $EXECKIT_DB set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXECKIT_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "execkit", *args],
        env=env, cwd=folder, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_kept_demo_answers_the_commands_run_in_its_folder(kept: tuple[str, Path]) -> None:
    # Issue 44, item 14: `cd DIR && execkit status` said "no ledger database at
    # DIR/.execkit/ledger.db", as the demo kept its ledger as DIR/ledger.db.
    out, where = kept
    assert any(f"cd {where} && execkit status" in line for line in out.splitlines()[-3:])
    for args in (["status"], ["status", "--board", "board.json"]):
        done = run_in(where, *args)
        assert done.returncode == 0, done.stderr
        rows = {row["ISSUE"]: row for row in table_columns(done.stdout)}
        assert set(rows) == {"DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"}
        assert rows["DEMO-4"]["LEDGER"] == "blocked (work)"
    shown = run_in(where, "task", "show", "DEMO-4")
    assert shown.returncode == 0, shown.stderr
    assert "blocked" in shown.stdout


def test_a_missing_ledger_names_the_command_that_makes_one(tmp_path: Path) -> None:
    done = run_in(tmp_path, "status")
    assert done.returncode == 4
    assert "no ledger database at" in done.stderr and "`execkit db init" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".execkit").exists()  # nothing is created by a read


def _readme_demo_block() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## What `make demo` shows") :]
    match = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert match, "the README's demo section has no output block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_the_readme_quotes_the_demo_as_it_prints(kept: tuple[str, Path]) -> None:
    # The virtual clock starts at a fixed time, so the retry times do not vary between runs;
    # the README may elide the middle of a long line with "...".
    again = run_demo()
    assert again.returncode == 0, again.stderr
    assert event_lines(again.stdout) == event_lines(kept[0])
    printed = [line.rstrip() for line in again.stdout.splitlines() if line.strip()]
    quoted = _readme_demo_block()
    assert quoted
    for line in quoted:
        head, _, tail = line.partition("...")
        found = [p for p in printed if p.startswith(head) and p.endswith(tail)]
        assert found, f"the README quotes a line the demo does not print: {line!r}"


def test_demo_keep_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    result = run_demo("--keep", str(tmp_path))
    assert result.returncode == 3
    assert "--keep" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["something"]


def test_demo_json_is_one_object_per_event_then_the_status(kept: tuple[str, Path]) -> None:
    result = run_demo("--json")
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    *events, final = objects
    # The same events as the text run, with the same virtual times.
    text_events = event_lines(kept[0])
    assert len(events) == len(text_events)
    for event, line in zip(events, text_events, strict=True):
        assert set(event) == {"event", "t"}
        assert line.startswith(f"t+{event['t']:>4.0f}s  {event['event']['issue_id']}  ")
        assert event["event"]["kind"] == "dispatched"
    assert set(final) == {"status", "kept"}
    assert final["kept"] is None
    status = final["status"]
    assert set(status) == {"now", "config", "issues"}
    assert status["config"]["max_attempts"] == 10
    rows = {row["issue_id"]: row for row in status["issues"]}
    assert set(rows) == {"DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"}
    assert rows["DEMO-2"]["last_class"] == "environment"
    assert rows["DEMO-4"]["charged_attempts"] == 3
    assert status["now"] - events[0]["event"]["at"] == events[-1]["t"]


def test_demo_json_with_keep_names_the_kept_files(tmp_path: Path) -> None:
    where = tmp_path / "kept"
    result = run_demo("--keep", str(where), "--json")
    assert result.returncode == 0, result.stderr
    final = json.loads(result.stdout.splitlines()[-1])
    assert final["kept"] == {
        "dir": str(where),
        "board": str(where / "board.json"),
        "db": str(where / ".execkit" / "ledger.db"),
        "histories": [str(where / "history" / f"DEMO-{n}.json") for n in range(1, 5)],
    }
    assert all(Path(path).is_file() for path in final["kept"]["histories"])


def test_demo_help_documents_the_json_shape() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "execkit", "demo", "--help"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert '{"event": EVENT, "t": S}' in text and '"status": {"now": T' in text


def test_the_demo_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    # What a user who ran `pip install execkit-runner` gets: the wheel built from this
    # checkout, installed into a folder of its own and run from elsewhere, with nothing of
    # the repository (fixtures/, the source tree) on the path.
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("*.whl")
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("EXECKIT_DB", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            env=env,
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=120,
        )

    where = run(
        "-c", "import execkit.cli._demo as d, adapters; print(d.__file__, adapters.__file__)"
    )
    assert where.stdout.split() and all(
        path.startswith(str(site)) for path in where.stdout.split()
    ), where.stdout + where.stderr
    demo = run("-m", "execkit", "demo")
    assert demo.returncode == 0, demo.stderr
    assert event_lines(demo.stdout) == event_lines(run_demo().stdout)
    assert (site / "adapters" / "py.typed").is_file()


def test_the_last_lines_say_how_to_run_execkit_when_it_is_not_on_path(tmp_path: Path) -> None:
    # Issue 44, item 12: after `make demo` (which runs .venv/bin/python -m execkit demo),
    # `execkit ...` from the README was `command not found`. The demo's last lines say how.
    from execkit.cli._demo import run_hint

    venv = tmp_path / "proj" / ".venv" / "bin"
    venv.mkdir(parents=True)
    for name in ("python", "execkit", "activate"):
        (venv / name).write_text("")
    python = str(venv / "python")

    def nowhere(_name: str) -> str | None:
        return None

    # Run from the project folder: the paths it names are the ones to type there.
    hint = run_hint(nowhere, python, tmp_path / "proj")
    assert hint is not None
    assert "`. .venv/bin/activate`" in hint and "`.venv/bin/execkit ...`" in hint
    # From a folder below it: relative to there; from elsewhere: the full paths.
    hint = run_hint(nowhere, python, tmp_path)
    assert hint is not None and "`. proj/.venv/bin/activate`" in hint
    hint = run_hint(nowhere, python, tmp_path / "elsewhere")
    assert hint is not None and f"`. {venv}/activate`" in hint and f"`{venv}/execkit ...`" in hint
    # Another execkit first on PATH is not this one: say so too.
    other = tmp_path / "elsewhere" / "execkit"
    hint = run_hint(lambda _n: str(other), python, tmp_path / "proj")
    assert hint is not None and str(other) in hint and "`.venv/bin/execkit ...`" in hint
    # This one on PATH: nothing to say.
    assert run_hint(lambda _n: str(venv / "execkit"), python, tmp_path / "proj") is None
    # Installed without the command beside the interpreter (a wheel unpacked on
    # PYTHONPATH): `python -m execkit`.
    (venv / "execkit").unlink()
    hint = run_hint(nowhere, python, tmp_path / "proj")
    assert hint is not None and "`.venv/bin/python -m execkit ...`" in hint
    # A bin folder that is not a virtual environment (pip install --user): add it to PATH.
    (venv / "execkit").write_text("")
    (venv / "activate").unlink()
    hint = run_hint(nowhere, python, tmp_path / "proj")
    assert hint is not None and "add .venv/bin to your PATH" in hint


def test_make_demo_ends_saying_how_to_use_the_venv(tmp_path: Path) -> None:
    """The demo as `make demo` runs it: this interpreter's bin folder not on PATH."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "execkit").is_file():
        pytest.skip("this interpreter has no execkit command beside it (not an install)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXECKIT_")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != bin_dir
    )
    done = subprocess.run(
        [sys.executable, "-m", "execkit", "demo"],
        env=env, cwd=bin_dir.parent.parent, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    last = done.stdout.rstrip().splitlines()[-1]
    assert f"{bin_dir.relative_to(bin_dir.parent.parent)}/execkit ..." in last
    # With it on PATH (an activated venv), the README's commands work as written.
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    again = subprocess.run(
        [sys.executable, "-m", "execkit", "demo"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "execkit ..." not in again.stdout
