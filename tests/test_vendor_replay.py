"""The recorded real-CLI runs replay byte for byte (tests/vendors/replay.py; no node needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENDORS = REPO / "tests" / "vendors"
RECORDED = REPO / "fixtures" / "recorded"
if str(VENDORS) not in sys.path:
    sys.path.insert(0, str(VENDORS))

from replay import load, replay_spawn, write_replay  # noqa: E402

import execkit  # noqa: E402

# One cell of each ending: a success, a failure's exit code, and a run killed on timeout.
EXITED = ["claude/server_500", "codex/success", "gemini/auth_401"]
TIMED_OUT = "codex/hang"
MAX_FILE_BYTES = 2 * 1024 * 1024


def _env(bin_dir: Path) -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}


@pytest.mark.parametrize("cell", EXITED)
def test_replayed_streams_and_exit_code_are_the_recorded_ones(cell: str, tmp_path: Path) -> None:
    recording = load(RECORDED / cell)
    write_replay(recording.path, tmp_path)
    done = subprocess.run(
        recording.argv,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.stdout == recording.stdout()
    assert done.stderr == recording.stderr()
    assert recording.meta["signal"] is None and not recording.meta["timed_out"]
    assert done.returncode == recording.meta["exit_code"]


def test_a_replayed_hang_prints_then_waits_until_killed(tmp_path: Path) -> None:
    recording = load(RECORDED / TIMED_OUT)
    assert recording.meta["timed_out"] is True
    write_replay(recording.path, tmp_path)
    proc = subprocess.Popen(
        recording.argv,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.0)
        assert proc.poll() is None, "a recorded hang must keep running until it is killed"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert out == recording.stdout()
    assert err == recording.stderr()
    if recording.meta["signal"] is not None:
        assert proc.returncode == -recording.meta["signal"]
    else:
        assert proc.returncode == recording.meta["exit_code"]


def test_the_adapter_reads_a_replayed_spawn() -> None:
    result = replay_spawn(RECORDED / "claude" / "server_500", timeout_s=60)
    assert result.exit_code == 1 and not result.timed_out
    mapped = execkit.get_adapter("claude").parse(result)
    assert not mapped.ok
    assert mapped.error is not None and "500" in mapped.error


def test_a_replay_through_execkit_times_out_like_the_real_cli() -> None:
    result = replay_spawn(RECORDED / TIMED_OUT, timeout_s=1.0, kill_grace=1.0)
    assert result.timed_out
    assert result.stdout_tail == (RECORDED / TIMED_OUT / "stdout").read_text(encoding="utf-8")


def test_every_recording_is_whole_small_and_scrubbed() -> None:
    cells = sorted(p.parent for p in RECORDED.glob("*/*/meta.json"))
    assert cells, "no recordings under fixtures/recorded"
    expected = json.loads((RECORDED / "expected.json").read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        recording = load(cell)
        assert f"{recording.cli}/{recording.scenario}" in expected
        assert recording.argv[0] == recording.cli
        for name in ("argv.json", "stdout", "stderr", "meta.json"):
            data = (cell / name).read_bytes()
            assert len(data) <= MAX_FILE_BYTES, f"{cell}/{name}"
            for leak in (b"/tmp/", b"/work/", b"execkit-vendor-", b"sk-test-execkit", b"AIzaSy"):
                assert leak not in data, f"{cell}/{name} holds {leak!r}"
