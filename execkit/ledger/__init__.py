"""The durable ledger (ADR 0033): tasks, runs, attempt limits, audit, idempotency.

`open_ledger()` is the entry point and the one place that turns a target into a backend
(`_open`): a file path opens the embedded SQLite backend (`_sqlite`), a `postgresql://` (or
`postgres://`) URL the PostgreSQL one (`_postgres`, shared by dispatchers on many hosts;
psycopg is the optional extra `execkit-runner[postgres]`). Its options say what may happen
on open (create a missing ledger, migrate an older schema); `migrate()` and
`ledger_status()` work on either backend the same way. Callers code against `Ledger`
(`_model`), so either backend serves them unchanged; no other package imports a backend
module. `import execkit` does not import this package: it loads on first use of a ledger
name, and the PostgreSQL backend's names (`PostgresLedger`, `PostgresMigration`) load on
first use of one of them.

The rooms, in the order a call meets them:

- `_model.py`: the `Ledger` protocol and the values it speaks (`Task`, `Run`, `RunOwner`,
  `Actor`, the roles, the audit words, `CAPABILITIES`);
- `_owner.py`: a process's `RunOwner`, read from the OS, and whether a run's owner is gone;
- `_open.py`: `open_ledger`, `migrate`, `ledger_status`, and where a ledger is by default;
- `_core/`: the rules, written once over the `Store`/`Tx` protocols: `LedgerCore`, composed
  from one class of operations per concern (tasks and limits; admission and runs; leases;
  roles; the audit trail, check and repair);
- `_rows.py`: the row shapes both SQL backends share, read by column name;
- `_sqlite/`, `_postgres/`: the two backends, peers with their own SQL, locking and schema
  numbers, each with its schema and migrations apart from its store.

A new concern (a fact on runs, a table of its own) is its operations in a new file of
`_core/`, its reads and writes added to `Tx`, and in each backend a schema step and the
statements that implement them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from execkit.ledger._core import (
    Spend,
    TaskCostReader,
    attempt_from_run,
    iter_task_values,
    iter_task_values_with_last,
    spend_of,
    task_cost_reader,
)
from execkit.ledger._model import (
    ADMIN_ROLE,
    CAPABILITIES,
    DEFAULT_LEASE_S,
    KNOWN_ROLES,
    LANES_CAPABILITY,
    LIST_PAGE,
    MAX_ATTEMPT_LIMIT,
    MAX_LEASE_S,
    MAX_UNCHARGED_LIMIT,
    NOTIFY_CAPABILITY,
    NOTIFY_ENABLE_CAPABILITY,
    OPERATE_ROLE,
    OUTBOX_CAPABILITY,
    SESSIONS_CAPABILITY,
    WAKE_CAPABILITY,
    Actor,
    AuditAction,
    AuditEntry,
    AuditEvent,
    Grant,
    LastOutcome,
    Ledger,
    NotifyEndpoint,
    NotifyEvent,
    NotifyKind,
    OutboxEntry,
    Role,
    Run,
    RunOwner,
    Task,
    TaskState,
    TaskStatus,
    TaskValues,
    last_outcome,
    task_values,
    user_name,
)
from execkit.ledger._open import (
    DB_ENV_VAR,
    default_db_path,
    ledger_status,
    migrate,
    open_ledger,
)
from execkit.ledger._owner import current_owner, owner_lost
from execkit.ledger._spend import (
    SPEND_CAPABILITY,
    SPEND_ROOM_CAPABILITY,
    SpendCap,
    SpendConfig,
    SpendRoom,
    SpendRow,
    SpendWindow,
    TaskBudget,
    TaskCost,
    WindowUse,
    task_costs_of,
    window_bounds,
)
from execkit.ledger._sqlite import SCHEMA_VERSION, Migration, SqliteLedger

if TYPE_CHECKING:
    from execkit.ledger._postgres import PostgresLedger, PostgresMigration

__all__ = [
    "ADMIN_ROLE",
    "CAPABILITIES",
    "DB_ENV_VAR",
    "DEFAULT_LEASE_S",
    "KNOWN_ROLES",
    "LANES_CAPABILITY",
    "LIST_PAGE",
    "MAX_ATTEMPT_LIMIT",
    "MAX_LEASE_S",
    "MAX_UNCHARGED_LIMIT",
    "NOTIFY_CAPABILITY",
    "NOTIFY_ENABLE_CAPABILITY",
    "OPERATE_ROLE",
    "OUTBOX_CAPABILITY",
    "SCHEMA_VERSION",
    "SESSIONS_CAPABILITY",
    "SPEND_CAPABILITY",
    "SPEND_ROOM_CAPABILITY",
    "WAKE_CAPABILITY",
    "Actor",
    "AuditAction",
    "AuditEntry",
    "AuditEvent",
    "Grant",
    "LastOutcome",
    "Ledger",
    "Migration",
    "NotifyEndpoint",
    "NotifyEvent",
    "NotifyKind",
    "OutboxEntry",
    "PostgresLedger",
    "PostgresMigration",
    "Role",
    "Run",
    "RunOwner",
    "Spend",
    "SpendCap",
    "SpendConfig",
    "SpendRoom",
    "SpendRow",
    "SpendWindow",
    "SqliteLedger",
    "Task",
    "TaskBudget",
    "TaskCost",
    "TaskCostReader",
    "TaskState",
    "TaskStatus",
    "TaskValues",
    "WindowUse",
    "attempt_from_run",
    "current_owner",
    "default_db_path",
    "iter_task_values",
    "iter_task_values_with_last",
    "last_outcome",
    "ledger_status",
    "migrate",
    "open_ledger",
    "owner_lost",
    "spend_of",
    "task_cost_reader",
    "task_costs_of",
    "task_values",
    "user_name",
    "window_bounds",
]

# The PostgreSQL backend's public names, imported on first use: a program that only ever
# opens a file does not load the backend module.
_LAZY = {
    "PostgresLedger": "execkit.ledger._postgres",
    "PostgresMigration": "execkit.ledger._postgres",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'execkit.ledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
