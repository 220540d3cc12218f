"""`LedgerCore`: every `Ledger` operation, composed from one class per concern over one
`Store`, and what the ledger says about itself (capabilities, schema, location, identity).
"""

from __future__ import annotations

from execkit._errors import ExecKitError
from execkit.ledger._core.inspection import InspectionOps
from execkit.ledger._core.lanes import LaneOps
from execkit.ledger._core.leases import LeaseOps
from execkit.ledger._core.notify import NotifyOps
from execkit.ledger._core.outbox import OutboxOps
from execkit.ledger._core.roles import RoleOps
from execkit.ledger._core.runs import RunOps
from execkit.ledger._core.tasks import TaskOps
from execkit.ledger._model import CAPABILITIES

__all__ = ["LedgerCore"]


class LedgerCore(TaskOps, RunOps, RoleOps, InspectionOps, LeaseOps, LaneOps, OutboxOps, NotifyOps):
    """Every ledger operation, written once over a `Store` (see `execkit.ledger._core`).

    Each public method is one transaction; errors are `ExecKitError`s. Not thread-safe:
    one per thread or process, as its store.
    """

    def close(self) -> None:
        """Close the backend's connection; the ledger is unusable afterwards."""
        self._store.close()

    def capabilities(self) -> frozenset[str]:
        """What this ledger enforces; includes "tasks.attempt_limits"."""
        return CAPABILITIES

    def schema_version(self) -> int:
        return self._store.schema_version()

    def location(self) -> str:
        """Where this ledger is, as an operator would give it back (`--db`), credentials
        left out: a file path, or a server URL without its password."""
        return self._store.location()

    def ledger_id(self) -> str:
        """This ledger's identity (stable across restarts and hosts): boards remember it."""
        with self._store.read() as tx:
            found = tx.meta("ledger_id")
        if found is None:  # pragma: no cover - every schema >= 3 writes one
            raise ExecKitError("this ledger has no id; run `execkit db migrate`")
        return found
