"""The README's "The dashboard" block runs as written, twice (tests/test_readme.py's way),
but for its port (a free one) and its `&` line, which the test's shell starts in the
background, waits on until it listens (bounded), and stops at the end."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from test_readme import _free_port, _sh_block, _shell_with_execkit


def test_the_dashboard_block_runs_as_written(tmp_path: Path) -> None:
    block = _sh_block("# A token for an operator and one for a viewer")
    assert "127.0.0.1:8751" in block
    lines = block.replace("127.0.0.1:8751", f"127.0.0.1:{_free_port()}").splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.split("#")[0].rstrip().endswith("&")]
    serve = lines[at].split("#")[0].rstrip().removesuffix("&").strip()
    lines[at] = (
        f"{serve} > serve.out 2> serve.err & server=$!\n"
        "trap 'kill $server; wait $server || true' EXIT\n"
        "for _ in $(seq 600); do grep -q listening serve.out && break; sleep 0.1; done\n"
        "grep -q listening serve.out"
    )
    script = "\n".join(lines) + "\nsleep 0.2; cat serve.err >&2\n"
    work = tmp_path / "work"
    work.mkdir()
    env = _shell_with_execkit(tmp_path)
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout.splitlines()
        assert out[0] == '{"status": "ok"}'
        assert out[1].startswith('{"status": "ready", "schema_version": ')
        assert re.fullmatch(r'execkit_tasks\{state="ready"\} 0\.0', out[2])
        assert len([line for line in out if line.startswith("execkit_tasks{")]) == 6
        # The server's access log: one JSON line per request, no token in any of them.
        folders = sorted((tmp_path / "scratch").iterdir(), key=lambda p: p.stat().st_mtime)
        token = (folders[-1] / "viewer.token").read_text().strip()
        assert '"route": "/metrics"' in done.stderr and token not in done.stderr
        # Each token file is the holder's whole identity: owner-only, as the PostgreSQL
        # example writes its own (issue 44, item 16).
        for name in ("operator.token", "viewer.token", "tokens.json"):
            mode = (folders[-1] / name).stat().st_mode
            assert mode & 0o077 == 0, f"{name} is readable by others: {oct(mode)}"
