"""execkit: run vendor CLIs for agent runners; charge retries only for informative attempts.

The public API, in the order of the one-way flow: exec ➜ classify ➜ proofs and the
in-agent loop ➜ budgets ➜ ledger and dispatcher. Vendor adapters live in the top-level
`adapters` package; the pytest plugin in `execkit.testing`. Everything else is private.

`execkit.classify` is the function (`classify(result)`); its module is still importable
with `from execkit.classify import ...`. Redaction stays in `execkit.redact`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from execkit.budget import (
    MAX_UNCHARGED_REPLANS,
    Attempt,
    AttemptStatus,
    Backoff,
    Decision,
    DispatchCap,
    ExplicitLimit,
    Plan,
    ReplanDecision,
    WorkBudget,
    decide,
    decide_replans,
    validate_history,
)
from execkit.classify import Classification, FailureClass, classify, classify_text
from execkit.errors import (
    AdmissionRefused,
    Conflict,
    ExecKitError,
    Forbidden,
    HistoryError,
    InvalidInput,
    NotFound,
    SchemaTooNew,
    UnknownAdapter,
    UnsupportedMove,
)
from execkit.exec import SpawnResult, spawn, spawn_async
from execkit.ledger import Ledger, Run, Task, open_ledger
from execkit.proof import (
    AgentProof,
    AgentStatus,
    RunProof,
    RunStatus,
    load_agent_proof,
    load_run_proof,
    rollup_class,
)

# The in-agent loop and the dispatcher stand below the `adapters` package in the flow, and
# `adapters` itself imports execkit's lower layers (exec, classify). Importing them eagerly
# here would make `import adapters` circular, so their names load on first use.
_LAZY_EXPORTS = {
    "AgentFailed": "execkit.agent",
    "run_agent": "execkit.agent",
    "BoardIssue": "execkit.dispatch",
    "DispatchConfig": "execkit.dispatch",
    "Dispatcher": "execkit.dispatch",
    "InMemoryBoard": "execkit.dispatch",
    "IssueStatus": "execkit.dispatch",
    "JsonFileBoard": "execkit.dispatch",
    "Runner": "execkit.dispatch",
    "RunOutcome": "execkit.dispatch",
    "Tracker": "execkit.dispatch",
    "issue_statuses": "execkit.dispatch",
}

if TYPE_CHECKING:
    from execkit.agent import AgentFailed, run_agent
    from execkit.dispatch import (
        BoardIssue,
        DispatchConfig,
        Dispatcher,
        InMemoryBoard,
        IssueStatus,
        JsonFileBoard,
        Runner,
        RunOutcome,
        Tracker,
        issue_statuses,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'execkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "MAX_UNCHARGED_REPLANS",
    "AdmissionRefused",
    "AgentFailed",
    "AgentProof",
    "AgentStatus",
    "Attempt",
    "AttemptStatus",
    "Backoff",
    "BoardIssue",
    "Classification",
    "Conflict",
    "Decision",
    "DispatchCap",
    "DispatchConfig",
    "Dispatcher",
    "ExecKitError",
    "ExplicitLimit",
    "FailureClass",
    "Forbidden",
    "HistoryError",
    "InMemoryBoard",
    "InvalidInput",
    "IssueStatus",
    "JsonFileBoard",
    "Ledger",
    "NotFound",
    "Plan",
    "ReplanDecision",
    "Run",
    "RunOutcome",
    "RunProof",
    "RunStatus",
    "Runner",
    "SchemaTooNew",
    "SpawnResult",
    "Task",
    "Tracker",
    "UnknownAdapter",
    "UnsupportedMove",
    "WorkBudget",
    "__version__",
    "classify",
    "classify_text",
    "decide",
    "decide_replans",
    "issue_statuses",
    "load_agent_proof",
    "load_run_proof",
    "open_ledger",
    "rollup_class",
    "run_agent",
    "spawn",
    "spawn_async",
    "validate_history",
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
