"""The exec wrapper: spawn a vendor CLI and keep every fact about how it ended.

`spawn` never raises for a process that could not be started: the errno is kept on the
result (`spawn_errno`), because it is the durable structural signal the classifier needs
(ADR 0046: ENOENT from a direct spawn is not the same as a shell exiting 127).
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["SpawnResult"]

_CUT = "…"


def _keep_tail(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    if max_chars <= 1:
        return _CUT[:max_chars]
    return _CUT + text[-(max_chars - 1) :]


@attrs.frozen
class SpawnResult:
    """How one spawned process ended.

    Exactly one of these holds: `spawn_errno` is set (it never started; `exit_code` and
    `signal` are None), `signal` is set (death by signal; `exit_code` is None), or
    `exit_code` is set. `timed_out` is independent: the process was killed (or asked to
    stop) because its timeout elapsed, whatever it then exited with.
    """

    argv: tuple[str, ...]
    pid: int | None
    exit_code: int | None
    signal: int | None
    spawn_errno: int | None
    spawn_error: str | None
    timed_out: bool
    duration_s: float
    stdout_tail: str
    stderr_tail: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool

    @property
    def ok(self) -> bool:
        """True when the process started, was not timed out and exited 0."""
        return (
            self.spawn_errno is None
            and not self.timed_out
            and self.signal is None
            and self.exit_code == 0
        )

    def failure_text(self, max_chars: int = 500) -> str:
        """The spawn error, then stderr, then stdout, keeping the LAST `max_chars`.

        A stream whose tail was already cut at capture starts with `…`, and so does the
        joined text when `max_chars` cuts it.
        """
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        parts: list[str] = []
        if self.spawn_error:
            parts.append(self.spawn_error)
        for tail, truncated in (
            (self.stderr_tail, self.stderr_truncated),
            (self.stdout_tail, self.stdout_truncated),
        ):
            body = tail.strip()
            if body:
                parts.append(_CUT + body if truncated else body)
        return _keep_tail("\n".join(parts), max_chars)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe mapping of every field plus `ok`."""
        data = attrs.asdict(self)
        data["argv"] = list(self.argv)
        data["ok"] = self.ok
        return data
