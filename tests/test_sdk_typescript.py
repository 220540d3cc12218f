"""The TypeScript SDK (sdk/typescript/): its generated wire types are the server's OpenAPI
document's, and it passes its own suite against a real `execkit serve`.

`src/wire.ts` is generated from the document (scripts/generate_wire.py, `npm run wire`) and
committed; the first test writes it again into a temporary folder, from the document made
in-process and from the one `python -m execkit.server --openapi` prints, and fails naming
the difference when the committed file is not what the document says. It needs no node.

`npm ci` installs the pinned dev dependencies (TypeScript, Node's types) when node_modules is
missing or older than package-lock.json; `npm test` compiles with `tsc` and runs
`node --test`, whose tests start `execkit serve` with this interpreter (`EXECKIT_PYTHON`)
and this checkout on PYTHONPATH. Without node and npm (or the server's Starlette and
uvicorn) the test skips, saying why; under CI=true it fails instead. Every step is bounded,
and on a timeout the whole process group (npm, node and the servers it started) is killed.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
SDK = REPO / "sdk" / "typescript"
INSTALL_TIMEOUT_S = 180.0
TEST_TIMEOUT_S = 180.0


WIRE = SDK / "src" / "wire.ts"
GENERATOR = SDK / "scripts" / "generate_wire.py"


@pytest.mark.parametrize("source", ["in-process", "dumped"])
def test_the_generated_wire_types_are_the_documents(tmp_path: Path, source: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(GENERATOR), "--out", str(tmp_path / "wire.ts")]
    if source == "dumped":
        dumped = subprocess.run(
            [sys.executable, "-m", "execkit.server", "--openapi"],
            env=env,
            capture_output=True,
            check=True,
            timeout=60,
        )
        (tmp_path / "openapi.json").write_bytes(dumped.stdout)
        command += ["--document", str(tmp_path / "openapi.json")]
    subprocess.run(command, env=env, check=True, timeout=60, capture_output=True)
    fresh = (tmp_path / "wire.ts").read_bytes()
    committed = WIRE.read_bytes()
    if fresh != committed:
        diff = difflib.unified_diff(
            committed.decode().splitlines(),
            fresh.decode().splitlines(),
            "sdk/typescript/src/wire.ts (committed)",
            "what the OpenAPI document says",
            lineterm="",
        )
        shown = "\n".join(list(diff)[:80])
        pytest.fail(
            "sdk/typescript/src/wire.ts differs from the server's OpenAPI document; "
            f"regenerate it (cd sdk/typescript && npm run wire) and commit it:\n{shown}"
        )


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the TypeScript SDK's tests must run here)")
    pytest.skip(reason)


def _run(command: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> tuple[int, str]:
    """Run `command` in sdk/typescript in a session of its own; (exit status, output).

    On a timeout the whole session is killed, so no node or server process outlives it.
    """
    with subprocess.Popen(
        list(command),
        cwd=SDK,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            pytest.fail(
                f"{' '.join(command)} did not finish within {timeout_s:g} s:\n{output[-20000:]}"
            )
        finally:
            if proc.poll() is None:  # an interrupted test (Ctrl-C) ends its children too
                os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output


def _needs_install() -> bool:
    marker = SDK / "node_modules" / ".package-lock.json"  # written by every npm ci
    lock = SDK / "package-lock.json"
    return not marker.is_file() or marker.stat().st_mtime < lock.stat().st_mtime


def test_typescript_sdk_suite() -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _unavailable("node and npm are needed for the TypeScript SDK's tests (install Node 20+)")
    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        _unavailable(
            f"execkit serve needs {', '.join(missing)}: pip install 'execkit-runner[server]'"
        )
    env = dict(os.environ)
    env["EXECKIT_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(REPO), env.get("PYTHONPATH", "")) if part
    )
    env["npm_config_update_notifier"] = "false"
    env["npm_config_fund"] = "false"
    env["npm_config_audit"] = "false"
    if _needs_install():
        status, output = _run(
            [npm, "ci", "--no-audit", "--no-fund"], env=env, timeout_s=INSTALL_TIMEOUT_S
        )
        assert status == 0, f"npm ci failed ({status}):\n{output[-20000:]}"
    status, output = _run([npm, "test"], env=env, timeout_s=TEST_TIMEOUT_S)
    assert status == 0, f"npm test failed ({status}):\n{output[-20000:]}"
    passed = re.search(r"^# pass (\d+)$", output, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) > 0, output[-20000:]
    assert re.search(r"^# fail 0$", output, re.MULTILINE), output[-20000:]
