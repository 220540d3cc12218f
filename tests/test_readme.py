"""The README's code runs as written: the Python API example, the adapter example and the
pytest plugin example. A README that drifts from the code fails here."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

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
