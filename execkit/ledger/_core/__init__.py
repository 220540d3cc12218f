"""The ledger's rules, once, over any storage backend (ADR 0033).

`LedgerCore` implements every `Ledger` operation: it checks the input, opens one
transaction of its `Store`, reads what the rule needs, decides with the budget policies and
writes. A backend (SQLite, PostgreSQL) implements only `Store` and `Tx`: its own SQL, its
own locking and its own migrations, so the two stay peers rather than ports of each other,
and neither can drift from the rules (the contract tests run both).

One concern a file; `LedgerCore` is composed from one class of operations per concern:

- `store.py`: the backend contract, `Store` and `Tx`, and `TaskRecord` (what a backend
  stores of a task), with what a backend's transaction promises;
- `inputs.py`: every argument checked (`InvalidInput` naming the field) before a
  transaction opens, and the fingerprint of a keyed request;
- `base.py`: `CoreBase`, what every operation shares: the store and the policies, the
  lookups, the idempotency replay, the decision on a task's summary and the `Task` shown,
  who holds which role; `attempt_from_run`;
- `tasks.py`: `TaskOps`, tasks and their attempt policy: creation, reads, cancel, explicit
  limits, an operator's forced retry, a dispatcher's give-up;
- `runs.py`: `RunOps`, admission (`start_run`), finishing a run and the run history;
- `leases.py`: `LeaseOps`, a run's lease renewed (`heartbeat`) and an expired one abandoned;
- `roles.py`: `RoleOps`, roles granted in the ledger;
- `inspection.py`: `InspectionOps`, the audit trail, `db check` and its repair;
- `lanes.py`: `LaneOps`, vendor lanes at admission and on a result, operators' lane
  operations, and the calls a tracker records on its own lane (`record_lane_call`);
- `wake.py`: `WakeOps`, the wake number dispatchers wait on;
- `outbox.py`: `OutboxOps`, the board outbox a tracker board records its writes in before
  they are sent (issue #47), and its webhook deliveries;
- `spend.py`: what runs cost (issue #45): a run's cost checked and stored with its
  result, and `Spend`, what runs cost together (`spend_of`);
- `ledger.py`: `LedgerCore` composed from them, and what the ledger says about itself.

A new concern is a new file: its operations in a class over `CoreBase`, added to
`LedgerCore`'s bases, and the facts it stores added to `Tx` for each backend to implement.
Rooms outside this package import from `execkit.ledger._core` only, never from its files.
"""

from execkit.ledger._core.base import FINISHED_STATUSES, attempt_from_run
from execkit.ledger._core.ledger import LedgerCore
from execkit.ledger._core.spend import Spend, TaskCostReader, spend_of, task_cost_reader
from execkit.ledger._core.store import (
    HISTORY_ROW,
    LANE_CONFIG_META_KEY,
    SUMMARY_AT,
    SpendPlan,
    StaleCopy,
    Store,
    TaskRecord,
    Tx,
    domain,
    stored_attempt,
    summary_row,
    summary_values,
)
from execkit.ledger._core.tasks import iter_task_values, iter_task_values_with_last

__all__ = [
    "FINISHED_STATUSES",
    "HISTORY_ROW",
    "LANE_CONFIG_META_KEY",
    "SUMMARY_AT",
    "LedgerCore",
    "Spend",
    "SpendPlan",
    "StaleCopy",
    "Store",
    "TaskCostReader",
    "TaskRecord",
    "Tx",
    "attempt_from_run",
    "domain",
    "iter_task_values",
    "iter_task_values_with_last",
    "spend_of",
    "stored_attempt",
    "summary_row",
    "summary_values",
    "task_cost_reader",
]
