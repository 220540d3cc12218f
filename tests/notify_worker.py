"""A notification sender in a process of its own (issue #49), as a dispatcher runs one
(`execkit._notify.sending`), with short waits for the tests: `python notify_worker.py
LEDGER OWNER`. It sends until it is killed."""

from __future__ import annotations

import sys
import threading

from execkit._backoff import Backoff
from execkit._notify import NotifySender
from execkit.ledger import open_ledger


def main() -> None:
    target, owner = sys.argv[1], sys.argv[2]
    ledger = open_ledger(target)
    sender = NotifySender(
        ledger,
        owner,
        timeout_s=0.5,
        lease_s=1.0,
        backoff=Backoff(base_s=0.05, factor=2.0, max_s=0.2, jitter=0.2),
    )
    print("ready", flush=True)
    stop = threading.Event()
    while not stop.wait(0.05):
        sender.drain()


if __name__ == "__main__":
    main()
