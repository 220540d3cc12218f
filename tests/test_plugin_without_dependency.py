"""Installing execkit-runner registers its pytest plugin for everyone: without
pytest-subprocess it must leave other test suites alone and fail only `fake_vendor`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_suite_without_pytest_subprocess_still_runs(tmp_path: Path) -> None:
    # A package that shadows pytest-subprocess and fails to import, as if not installed;
    # pytest's own registration of that plugin is switched off with -p no:.
    shadow = tmp_path / "shadow" / "pytest_subprocess"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed')\n")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_user.py").write_text(
        "def test_unrelated():\n    assert True\n\ndef test_uses_the_fake(fake_vendor):\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:pytest-subprocess", "-p", "no:cacheprovider",
         "-q", str(suite)],
        capture_output=True, text=True, env=env, cwd=suite, timeout=120, check=False,
    )  # fmt: skip
    assert "1 passed" in done.stdout, done.stdout + done.stderr
    assert "1 error" in done.stdout or "1 failed" in done.stdout, done.stdout
    assert "fake_vendor needs pytest-subprocess" in done.stdout
