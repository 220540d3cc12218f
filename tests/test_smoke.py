import subprocess
import sys

import execkit


def test_package_exports_are_declared() -> None:
    for name in execkit.__all__:
        assert hasattr(execkit, name), name


def test_python_m_execkit_help_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "execkit", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert "execkit" in proc.stdout
