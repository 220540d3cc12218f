"""The conformance corpus: every recorded real-CLI cell, as package data, for runner authors.

The repository's `fixtures/recorded/<cli>/<scenario>/` (written by tests/vendors/record.py)
is the source of truth; `build_corpus` folds it, with `fixtures/recorded/expected.json`,
into one compact document and `write_corpus` stores it gzipped as
`execkit/recorded_cells.json.gz`, so the corpus works from an installed wheel
(`tests/test_conformance_corpus.py` checks the packaged copy equals the source).

Compact: each stream keeps its last `STREAM_CHARS` characters, what `spawn` keeps by
default (the adapters and the classifier read no more); meta keeps only how the run
ended and the CLI's version. `RecordedCell.spawn_result()` rebuilds the `SpawnResult`
execkit would have produced, credentials masked as `spawn` masks them, so a cell run
through an adapter's `parse` takes the same path as the real CLI did.

Loading never touches the network or the recordings directory; a missing or unreadable
package file raises `FileNotFoundError` / `ValueError` naming it.
"""

from __future__ import annotations

import datetime
import gzip
import json
import math
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from execkit._classify import FailureClass
from execkit._exec import SpawnResult
from execkit._redact import redact

__all__ = [
    "CORPUS_FILE",
    "STREAM_CHARS",
    "RecordedCell",
    "build_corpus",
    "load_corpus",
    "recorded_cells",
    "write_corpus",
]

CORPUS_FILE = "recorded_cells.json.gz"
"""The package data file (inside the `execkit` package)."""

STREAM_CHARS = 65536
"""How much of each recorded stream the corpus keeps: its tail, as `spawn` keeps by default."""

_FORMAT = 1


def _wait(value: object) -> float | tuple[float, float] | None:
    if isinstance(value, list) and len(value) == 2:
        return (float(value[0]), float(value[1]))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


@attrs.frozen
class RecordedCell:
    """One recorded run of a real vendor CLI against the loopback fake API.

    `key` is `cli/scenario`. `stdout` and `stderr` are the recorded tails (scrubbed:
    `<HOME>`, `<PORT>`, `<KEY>`...). `exit_code`, `signal` and `timed_out` say how it
    ended (a timed-out run was sent SIGTERM). `expected_class` is the class an operator
    needs (None: the run succeeded), with `expected_reason` (execkit's reason on its
    adapter path), `expected_retry_after_s` (a number, a `(low, high)` range for a reset
    stated as a wall-clock time, or None) and `why`. `recorded_at` is when the CLI ended
    (epoch seconds, None when unknown): a reset it stated (a wall-clock time, printed in
    UTC, or an epoch) gives `expected_retry_after_s` when read against that clock; read
    now, one long past states no wait at all.
    """

    cli: str
    scenario: str
    version: str | None
    argv: tuple[str, ...]
    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    duration_s: float
    expected_class: FailureClass | None
    expected_reason: str | None
    expected_retry_after_s: float | tuple[float, float] | None
    why: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    recorded_at: float | None = None

    @property
    def key(self) -> str:
        """`cli/scenario`, the cell's id."""
        return f"{self.cli}/{self.scenario}"

    def spawn_result(self) -> SpawnResult:
        """The `SpawnResult` execkit's `spawn` would have returned for this run: the tails
        credential-masked as `spawn` masks them, the exit as recorded."""
        stdout, stderr = redact(self.stdout), redact(self.stderr)
        return SpawnResult(
            argv=self.argv,
            pid=4242,
            exit_code=self.exit_code,
            signal=self.signal,
            spawn_errno=None,
            spawn_error=None,
            timed_out=self.timed_out,
            duration_s=self.duration_s,
            stdout_tail=stdout,
            stderr_tail=stderr,
            stdout_bytes=len(self.stdout.encode()),
            stderr_bytes=len(self.stderr.encode()),
            stdout_truncated=self.stdout_truncated,
            stderr_truncated=self.stderr_truncated,
        )

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RecordedCell:
        """A cell from its corpus entry (`build_corpus`'s shape)."""
        expected = value.get("expected") or {}
        klass = expected.get("class")
        return cls(
            cli=str(value["cli"]),
            scenario=str(value["scenario"]),
            version=value.get("version"),
            argv=tuple(value["argv"]),
            stdout=str(value["stdout"]),
            stderr=str(value["stderr"]),
            exit_code=value.get("exit_code"),
            signal=value.get("signal"),
            timed_out=bool(value.get("timed_out")),
            duration_s=float(value.get("duration_s") or 0.0),
            expected_class=None if klass is None else FailureClass(klass),
            expected_reason=expected.get("reason"),
            expected_retry_after_s=_wait(expected.get("retry_after_s")),
            why=str(expected.get("why") or ""),
            stdout_truncated=bool(value.get("stdout_truncated")),
            stderr_truncated=bool(value.get("stderr_truncated")),
            recorded_at=_when(value.get("recorded_at")),
        )


def _tail(data: bytes) -> tuple[str, bool]:
    text = data.decode("utf-8", errors="replace")
    if len(text) <= STREAM_CHARS:
        return text, False
    return text[-STREAM_CHARS:], True


def _when(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    return None


def _ended_at(meta: Mapping[str, Any]) -> float | None:
    """When a recorded CLI ended: meta `ended_at`, else `date` plus `duration_s`."""
    ended = _when(meta.get("ended_at"))
    if ended is not None:
        return ended
    try:
        started = datetime.datetime.strptime(str(meta["date"]), "%Y-%m-%dT%H:%M:%SZ")
    except (KeyError, ValueError):
        return None
    started = started.replace(tzinfo=datetime.UTC)
    return started.timestamp() + float(meta.get("duration_s") or 0.0)


def build_corpus(recorded: Path) -> dict[str, Any]:
    """The corpus document for the recordings under `recorded` (one directory per
    `cli/scenario`, and `expected.json`). Pure: reads files, writes nothing."""
    expected = json.loads((recorded / "expected.json").read_text(encoding="utf-8"))["cells"]
    cells = []
    for meta_path in sorted(recorded.glob("*/*/meta.json")):
        cell_dir = meta_path.parent
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        argv = json.loads((cell_dir / "argv.json").read_text(encoding="utf-8"))
        stdout, stdout_cut = _tail((cell_dir / "stdout").read_bytes())
        stderr, stderr_cut = _tail((cell_dir / "stderr").read_bytes())
        key = f"{meta['cli']}/{meta['scenario']}"
        cells.append(
            {
                "cli": meta["cli"],
                "scenario": meta["scenario"],
                "version": meta.get("version"),
                "argv": argv,
                "stdout": stdout,
                "stderr": stderr,
                "stdout_truncated": stdout_cut or bool(meta.get("stdout_cut")),
                "stderr_truncated": stderr_cut or bool(meta.get("stderr_cut")),
                "exit_code": meta.get("exit_code"),
                "signal": meta.get("signal"),
                "timed_out": bool(meta.get("timed_out")),
                "duration_s": meta.get("duration_s"),
                "expected": expected.get(key, {}),
                "recorded_at": _ended_at(meta),
            }
        )
    return {"format": _FORMAT, "cells": cells}


def write_corpus(recorded: Path, target: Path) -> Path:
    """`build_corpus(recorded)` gzipped into `target` (byte-stable: no timestamp)."""
    data = json.dumps(build_corpus(recorded), sort_keys=True, separators=(",", ":")).encode()
    with target.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        out.write(data)
    return target


@cache
def load_corpus() -> dict[str, Any]:
    """The packaged corpus document (read once)."""
    resource = resources.files("execkit").joinpath(CORPUS_FILE)
    try:
        data = gzip.decompress(resource.read_bytes())
        document: dict[str, Any] = json.loads(data)
    except FileNotFoundError:
        raise FileNotFoundError(f"execkit's package data {CORPUS_FILE} is missing") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"execkit's package data {CORPUS_FILE} is unreadable: {exc}") from exc
    if document.get("format") != _FORMAT:
        raise ValueError(f"{CORPUS_FILE} has format {document.get('format')!r}, not {_FORMAT}")
    return document


def _matches(value: str, wanted: str | Iterable[str] | None) -> bool:
    if wanted is None:
        return True
    return value == wanted if isinstance(wanted, str) else value in set(wanted)


def recorded_cells(
    cli: str | Iterable[str] | None = None, scenario: str | Iterable[str] | None = None
) -> tuple[RecordedCell, ...]:
    """Every recorded cell, or those of `cli` and `scenario` (a name or several)."""
    return tuple(
        RecordedCell.from_dict(entry)
        for entry in load_corpus()["cells"]
        if _matches(entry["cli"], cli) and _matches(entry["scenario"], scenario)
    )
