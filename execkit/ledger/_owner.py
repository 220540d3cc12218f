"""Who a run's owner is, read from the OS, and whether that process is gone.

`current_owner()` builds the `RunOwner` of the calling process: its host name, the kernel's
boot id, its pid namespace, its pid and start time (psutil), and a random instance id that
the caller keeps for its lifetime (a dispatcher draws one when it is built). Nothing here
comes from a flag or an environment variable: identity is the OS's.

`owner_lost(run, here)` says why a running run's owner process is certainly gone, or None
when it may live. It only judges runs owned on `here`'s host: another host's processes are
the business of their own dispatcher (or of the lease). On the same host, a run is lost
when the kernel booted since (another boot id), or when, in the same boot and pid
namespace, no process has its pid with its start time. Runs from another pid namespace of
the same boot (another container with the same host name) are never judged.
"""

from __future__ import annotations

import os
import socket

from execkit.ledger._model import Run, RunOwner

# psutil is imported where it is used: a command that only reads the ledger never needs it.

__all__ = ["current_owner", "owner_lost", "process_owner"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
# A start time read twice differs by rounding only (psutil reads clock ticks).
_START_SLACK_S = 1.0


def _boot_id() -> str:
    try:
        with open(_BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip() or "unknown"
    except OSError:
        # Not Linux: the boot time stands in (it changes with each boot too).
        import psutil

        return f"boot-{int(psutil.boot_time())}"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def current_owner(instance: str | None = None) -> RunOwner:
    """The calling process as a `RunOwner`; `instance` is a fresh random id unless given
    (a caller that admits several runs passes the one it drew, so they share it)."""
    import secrets  # with hmac and random under it: only a command that admits pays

    import psutil

    pid = os.getpid()
    return RunOwner(
        host=socket.gethostname() or "unknown",
        boot_id=_boot_id(),
        pid_namespace=_pid_namespace(),
        pid=pid,
        pid_started_at=psutil.Process(pid).create_time(),
        instance=instance if instance is not None else secrets.token_hex(8),
    )


_PROCESS_OWNER: dict[int, RunOwner] = {}


def process_owner() -> RunOwner:
    """The calling process's own `RunOwner`, one instance id for its lifetime (drawn
    again in a forked child, whose pid differs): the owner of the runs a caller admits
    without naming one."""
    pid = os.getpid()
    owner = _PROCESS_OWNER.get(pid)
    if owner is None:
        owner = _PROCESS_OWNER[pid] = current_owner()
    return owner


def owner_lost(run: Run, here: RunOwner) -> str | None:
    """Why `run`'s owner process is certainly gone, judged from `here` (see the module
    docstring); None when it may still live or is not ours to judge."""
    owner = run.owner
    if owner is None or owner.host != here.host:
        return None
    who = f"pid {owner.pid} on {owner.host} (instance {owner.instance})"
    if owner.boot_id != here.boot_id:
        return f"its owner {who} is gone: the host has booted since"
    if owner.pid_namespace != here.pid_namespace:
        return None
    import psutil

    try:
        started = psutil.Process(owner.pid).create_time()
    except psutil.NoSuchProcess:
        return f"its owner {who} is gone: no such process"
    except psutil.Error:
        return None  # it exists but cannot be read: it may be ours, leave it to the lease
    if abs(started - owner.pid_started_at) > _START_SLACK_S:
        return f"its owner {who} is gone: the pid now belongs to another process"
    return None
