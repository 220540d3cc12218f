"""Replay a recorded vendor CLI run: a stand-in binary that prints what the real one did.

    bin_dir = write_replay(Path("fixtures/recorded/codex/server_500"), tmp_path)
    # put bin_dir first on PATH, then run execkit's real adapter path:
    execkit.run_command(execkit.get_adapter("codex"), ["codex", "exec", "--json", "x"])

The stand-in (named like the vendor binary: `codex`, `claude`, ...) writes the recorded
stdout and stderr bytes, then ends as the recording did: with its exit code, or by its
signal; for a recording that timed out it prints what was recorded and sleeps until it is
killed (at most `MAX_SLEEP_S`), and on SIGTERM it ends as the real CLI ended when the
recorder sent SIGTERM. Its arguments are ignored. It needs only this Python, no node.

`replay_spawn(recording, timeout_s=...)` does it all in one call through `execkit.spawn`
and returns the `SpawnResult` (what `measure.py` and the tests read).

A recording states its resets as the CLI printed them then (`try again at 4:00 PM`, a
`resetsAt` epoch): `adapter_for(recording)` is the cell's adapter reading them against the
recording's own clock (`recorded_at`: when the CLI ended), and `recorded_zone()` the zone
they were printed in (UTC), so a replay classes the same whatever day or hour it runs.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from execkit import Adapter, SpawnResult

__all__ = [
    "MAX_SLEEP_S",
    "Recording",
    "adapter_for",
    "load",
    "recorded_at",
    "recorded_zone",
    "replay_spawn",
    "write_replay",
]

# A replayed hang sleeps at most this long, so a forgotten one cannot outlive a test run.
MAX_SLEEP_S = 600.0

_SCRIPT = """\
#!{python}
# A replay of {cell} (tests/vendors/replay.py); its arguments are ignored.
import json, os, signal, sys, time

RECORDING = {recording!r}
meta = json.load(open(os.path.join(RECORDING, "meta.json"), encoding="utf-8"))


def end_as_recorded():
    if meta.get("signal") is not None:
        sig = int(meta["signal"])
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(5)
        sys.exit(128 + sig)
    sys.exit(int(meta.get("exit_code") or 0))


with open(os.path.join(RECORDING, "stdout"), "rb") as out:
    sys.stdout.buffer.write(out.read())
sys.stdout.buffer.flush()
with open(os.path.join(RECORDING, "stderr"), "rb") as err:
    sys.stderr.buffer.write(err.read())
sys.stderr.buffer.flush()
if meta.get("timed_out"):
    signal.signal(signal.SIGTERM, lambda *_: end_as_recorded())
    time.sleep({max_sleep})
end_as_recorded()
"""


@dataclass(frozen=True)
class Recording:
    """One recorded cell: `fixtures/recorded/<cli>/<scenario>/`."""

    path: Path
    argv: list[str]
    meta: dict[str, Any]

    @property
    def cli(self) -> str:
        return str(self.meta["cli"])

    @property
    def scenario(self) -> str:
        return str(self.meta["scenario"])

    @property
    def binary(self) -> str:
        return self.argv[0]

    def stdout(self) -> bytes:
        return (self.path / "stdout").read_bytes()

    def stderr(self) -> bytes:
        return (self.path / "stderr").read_bytes()


def load(path: Path) -> Recording:
    """The recording in `path` (raises OSError or ValueError for a broken one)."""
    argv = json.loads((path / "argv.json").read_text(encoding="utf-8"))
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"{path}/argv.json is not a non-empty list of strings")
    if not isinstance(meta, dict):
        raise ValueError(f"{path}/meta.json is not an object")
    return Recording(path.resolve(), argv, meta)


def recorded_at(cell: Recording) -> float:
    """When the recorded CLI ended (epoch seconds): meta `ended_at`, else (recordings made
    before it was kept) `date` plus `duration_s`."""
    ended = cell.meta.get("ended_at")
    if isinstance(ended, int | float):
        return float(ended)
    started = datetime.datetime.strptime(str(cell.meta["date"]), "%Y-%m-%dT%H:%M:%SZ")
    started = started.replace(tzinfo=datetime.UTC)
    return started.timestamp() + float(cell.meta.get("duration_s") or 0.0)


def adapter_for(cell: Recording) -> Adapter:
    """The cell's adapter, reading stated resets against the recording's clock when it
    takes one (its `clock` field), else as registered."""
    import attrs

    from execkit import get_adapter

    adapter = get_adapter(cell.cli)
    kind: type[Any] = type(adapter)
    if attrs.has(kind) and "clock" in attrs.fields_dict(kind):
        when = recorded_at(cell)
        return attrs.evolve(adapter, clock=lambda: when)  # type: ignore[misc]
    return adapter


@contextmanager
def recorded_zone() -> Iterator[None]:
    """This process's local zone set to the recorder's (UTC: record.py sets `TZ=UTC`), for
    a wall-clock reset read as local time; restored after."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


def write_replay(recording: Path, bin_dir: Path) -> Path:
    """Write the stand-in for `recording` into `bin_dir`; returns `bin_dir`."""
    cell = load(recording)
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / cell.binary
    script.write_text(
        _SCRIPT.format(
            python=sys.executable,
            cell=f"{cell.cli}/{cell.scenario}",
            recording=str(cell.path),
            max_sleep=MAX_SLEEP_S,
        ),
        encoding="utf-8",
    )
    script.chmod(0o755)
    return bin_dir


def replay_spawn(
    recording: Path, *, timeout_s: float = 30.0, kill_grace: float = 2.0
) -> SpawnResult:
    """Run the recording's argv against its stand-in through `execkit.spawn`.

    A recording that timed out is killed after `timeout_s` (as execkit would kill the
    real CLI), so keep it short for those.
    """
    from execkit import spawn

    cell = load(recording)
    bin_dir = Path(tempfile.mkdtemp(prefix="execkit-replay-"))
    try:
        write_replay(recording, bin_dir)
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
        return spawn(
            # The bare name, found on PATH, as execkit runs the real CLI.
            cell.argv,
            env=env,
            timeout=timeout_s,
            kill_grace=kill_grace,
            tail_bytes=4 * 1024 * 1024,
        )
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: replay.py RECORDING_DIR BIN_DIR", file=sys.stderr)
        return 2
    print(write_replay(Path(argv[1]), Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
