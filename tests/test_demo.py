"""`execkit demo` (what `make demo` runs) in a real process: the four issues end as designed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


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


def table_rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    header = next(n for n, line in enumerate(lines) if line.startswith("ISSUE "))
    rows: dict[str, list[str]] = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break  # the table ends at the first blank line
        rows[line.split()[0]] = line.split()
    return rows


def test_demo_shows_the_four_outcomes(tmp_path: Path) -> None:
    result = run_demo("--keep", str(tmp_path / "kept"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    rows = table_rows(out)
    assert set(rows) == {"DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"}
    # One succeeds at once.
    assert rows["DEMO-1"][1:4] == ["done", "done", "1/10"]
    # The missing binary stops at once, uncharged, naming the install hint.
    assert rows["DEMO-2"][1:5] == ["blocked", "blocked", "(environment)", "1/10"]
    assert rows["DEMO-2"][5] == "0"
    assert "acme-agent CLI not found on PATH; install: pip install acme-agent" in out
    # A vendor 503 twice, then success: three dispatches, only the success charged.
    assert rows["DEMO-3"][1:5] == ["done", "done", "3/10", "1"]
    assert out.count("DEMO-3  attempt") == 3
    assert out.count("upstream (uncharged): http 503") == 2
    # Always wrong: charged until the charged budget is spent, then Blocked.
    assert rows["DEMO-4"][1:6] == ["blocked", "blocked", "(work)", "3/10", "3"]
    assert "charged budget spent: 3 of 3 attempts" in out
    # The kept board and ledger say the same thing afterwards.
    board = json.loads((tmp_path / "kept" / "board.json").read_text())
    assert {i["id"]: i["state"] for i in board["issues"]} == {
        "DEMO-1": "done",
        "DEMO-2": "blocked",
        "DEMO-3": "done",
        "DEMO-4": "blocked",
    }
    assert (tmp_path / "kept" / "ledger.db").exists()


def test_demo_keep_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    result = run_demo("--keep", str(tmp_path))
    assert result.returncode == 3
    assert "--keep" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["something"]
