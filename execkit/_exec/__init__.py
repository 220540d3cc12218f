"""The exec stage: spawn a vendor CLI and keep every fact about how it ended.

`spawn` runs argv directly, never through a shell, and never raises for a process that
could not be started: the errno is kept on the result (`spawn_errno`, with
`spawn_failure` saying what it meant), because it is the durable structural signal the
classifier needs (ADR 0046: ENOENT from a direct spawn is not the same as a shell exiting
127). Its tree is contained and what it leaves running is killed when it exits; a
timeout sends SIGTERM, waits `kill_grace`, then SIGKILLs the tree; `heartbeat=` renews a
ledger lease while the child lives. Each stream keeps a bounded tail, credentials masked.
This room never classifies and never retries.

One concern a file, in the order a spawn meets them:

- `entry.py`: the entry points `spawn`, `spawn_async` (a thread per call, cancellable
  from asyncio) and `spawn_cancellable` (a cancel descriptor, for `execkit run`);
- `options.py`: `SpawnOptions`, the arguments checked once (TypeError or `InvalidInput`
  naming the field), and the defaults (`DEFAULT_KILL_GRACE_S`, `DEFAULT_HEARTBEAT_S`,
  `DEFAULT_TAIL_BYTES`), the `ProcessStarter` seam;
- `tree/`: how the child's process tree is contained (`cgroup`, `subreaper`, `session`,
  one file each), chosen once per process in `tree/__init__.py`;
- `supervisor.py`: the poll loop over the pipes, the exit, the timeout and the heartbeat;
- `proctable.py`: /proc read, descendants found, processes signalled and reaped by pid
  and start time;
- `tail.py`: the bounded tail of each stream (a ring), and what of it is kept as text;
- `lines.py`: the line hook (`on_line`): each complete line handed over as it arrives,
  cut at `LINE_BYTES`, and `StopTree`, the hook's way to end the spawn;
- `cancel.py`: `Cancellation`, a one-shot signal from any thread that a spawn watches.
- `result.py`: `SpawnResult`, `SpawnFailure`, `TreeMechanism`, the wording of a failed
  start and the redaction of everything a result keeps.

Rooms outside this package import from `execkit._exec` only, never from its files.
"""

from execkit._exec.cancel import Cancellation
from execkit._exec.entry import spawn, spawn_async, spawn_cancellable
from execkit._exec.lines import LINE_BYTES, Line, LineHook, StopTree
from execkit._exec.options import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KILL_GRACE_S,
    DEFAULT_TAIL_BYTES,
    MAX_TAIL_BYTES,
    OutputCallback,
    ProcessStarter,
)
from execkit._exec.result import (
    BINARY_NOTICE,
    TREE_MECHANISMS,
    SpawnFailure,
    SpawnResult,
    TreeMechanism,
)
from execkit._exec.supervisor import SpawnCancelled
from execkit._exec.tree import tree_mechanism

__all__ = [
    "BINARY_NOTICE",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_KILL_GRACE_S",
    "DEFAULT_TAIL_BYTES",
    "LINE_BYTES",
    "MAX_TAIL_BYTES",
    "TREE_MECHANISMS",
    "Cancellation",
    "Line",
    "LineHook",
    "OutputCallback",
    "ProcessStarter",
    "SpawnCancelled",
    "SpawnFailure",
    "SpawnResult",
    "StopTree",
    "TreeMechanism",
    "spawn",
    "spawn_async",
    "spawn_cancellable",
    "tree_mechanism",
]
