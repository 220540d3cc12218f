"""execkit: run vendor CLIs for agent runners; charge retries only for informative attempts.

The public API, in the order of the one-way flow: exec ➜ classify ➜ the adapter contract ➜
proofs and the in-agent loop ➜ budgets ➜ ledger and dispatcher. Every name below lives in a
private room (`execkit._exec`, `execkit._classify`, ..., `execkit.ledger`,
`execkit.dispatch`) and is re-exported here; `execkit.adapterkit` (helpers for adapter
authors) and `execkit.testing` (the pytest plugin) are the public modules. The vendor
adapters live in the top-level `adapters` package, which imports execkit, never the reverse.

Each name is imported on first use, not at `import execkit`: a CLI command or a program that
only spawns does not pay for the ledger (sqlite3), asyncio, psutil or the classifier's
patterns. No import cycle needs this; it is only about start-up time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "AdmissionRefused": "execkit._errors",
    "AgentFailed": "execkit._proof",
    "AttemptLimitReached": "execkit._errors",
    "Conflict": "execkit._errors",
    "ExecKitError": "execkit._errors",
    "Forbidden": "execkit._errors",
    "HistoryError": "execkit._errors",
    "InvalidInput": "execkit._errors",
    "NotFound": "execkit._errors",
    "SchemaTooNew": "execkit._errors",
    "StorageError": "execkit._errors",
    "TaskBackingOff": "execkit._errors",
    "TaskBlocked": "execkit._errors",
    "TaskFinished": "execkit._errors",
    "Unauthenticated": "execkit._errors",
    "UnknownAdapter": "execkit._errors",
    "UnsupportedMove": "execkit._errors",
    "ProcessStarter": "execkit._exec",
    "SpawnFailure": "execkit._exec",
    "SpawnResult": "execkit._exec",
    "spawn": "execkit._exec",
    "Cancellation": "execkit._exec",
    "SpawnCancelled": "execkit._exec",
    "spawn_async": "execkit._exec",
    "Classification": "execkit._classify",
    "FailureClass": "execkit._classify",
    "Reason": "execkit._classify",
    "classify": "execkit._classify",
    "classify_text": "execkit._classify",
    "Adapter": "execkit._adapter",
    "AgentRequest": "execkit._adapter",
    "Envelope": "execkit._adapter",
    "MappedResult": "execkit._adapter",
    "map_result": "execkit._adapter",
    "adapter_names": "execkit._registry",
    "available_adapters": "execkit._registry",
    "find_binary": "execkit._registry",
    "get_adapter": "execkit._registry",
    "AgentProof": "execkit._proof",
    "AgentStatus": "execkit._proof",
    "RunProof": "execkit._proof",
    "RunStatus": "execkit._proof",
    "load_agent_proof": "execkit._proof",
    "load_run_proof": "execkit._proof",
    "rollup_class": "execkit._proof",
    "AttemptContext": "execkit._agent",
    "PriorOutcome": "execkit._agent",
    "RunRecorder": "execkit._agent",
    "run_agent": "execkit._agent",
    "run_command": "execkit._agent",
    "MAX_UNCHARGED_REPLANS": "execkit._budget",
    "Attempt": "execkit._budget",
    "AttemptStatus": "execkit._budget",
    "Backoff": "execkit._backoff",
    "BlockedOn": "execkit._budget",
    "Decision": "execkit._budget",
    "DecisionState": "execkit._budget",
    "DispatchCap": "execkit._budget",
    "ExplicitLimit": "execkit._budget",
    "NextAction": "execkit._budget",
    "Plan": "execkit._budget",
    "ReplanDecision": "execkit._budget",
    "TaskState": "execkit._budget",
    "WorkBudget": "execkit._budget",
    "decide": "execkit._budget",
    "decide_replans": "execkit._budget",
    "validate_history": "execkit._budget",
    "Ledger": "execkit.ledger",
    "Run": "execkit.ledger",
    "Task": "execkit.ledger",
    "TaskStatus": "execkit.ledger",
    "open_ledger": "execkit.ledger",
    "AdapterRunner": "execkit.dispatch",
    "BoardIssue": "execkit.dispatch",
    "BoardState": "execkit.dispatch",
    "DispatchConfig": "execkit.dispatch",
    "DispatchEvent": "execkit.dispatch",
    "Dispatcher": "execkit.dispatch",
    "EventKind": "execkit.dispatch",
    "InMemoryBoard": "execkit.dispatch",
    "IssueStatus": "execkit.dispatch",
    "JsonFileBoard": "execkit.dispatch",
    "RunOutcome": "execkit.dispatch",
    "Runner": "execkit.dispatch",
    "Tracker": "execkit.dispatch",
    "issue_statuses": "execkit.dispatch",
}

if TYPE_CHECKING:
    __version__: str
    from execkit._adapter import (
        Adapter,
        AgentRequest,
        Envelope,
        MappedResult,
        map_result,
    )
    from execkit._agent import (
        AttemptContext,
        PriorOutcome,
        RunRecorder,
        run_agent,
        run_command,
    )
    from execkit._backoff import Backoff
    from execkit._budget import (
        MAX_UNCHARGED_REPLANS,
        Attempt,
        AttemptStatus,
        BlockedOn,
        Decision,
        DecisionState,
        DispatchCap,
        ExplicitLimit,
        NextAction,
        Plan,
        ReplanDecision,
        TaskState,
        WorkBudget,
        decide,
        decide_replans,
        validate_history,
    )
    from execkit._classify import (
        Classification,
        FailureClass,
        Reason,
        classify,
        classify_text,
    )
    from execkit._errors import (
        AdmissionRefused,
        AttemptLimitReached,
        Conflict,
        ExecKitError,
        Forbidden,
        HistoryError,
        InvalidInput,
        NotFound,
        SchemaTooNew,
        StorageError,
        TaskBackingOff,
        TaskBlocked,
        TaskFinished,
        Unauthenticated,
        UnknownAdapter,
        UnsupportedMove,
    )
    from execkit._exec import (
        Cancellation,
        ProcessStarter,
        SpawnCancelled,
        SpawnFailure,
        SpawnResult,
        spawn,
        spawn_async,
    )
    from execkit._proof import (
        AgentFailed,
        AgentProof,
        AgentStatus,
        RunProof,
        RunStatus,
        load_agent_proof,
        load_run_proof,
        rollup_class,
    )
    from execkit._registry import (
        adapter_names,
        available_adapters,
        find_binary,
        get_adapter,
    )
    from execkit.dispatch import (
        AdapterRunner,
        BoardIssue,
        BoardState,
        DispatchConfig,
        Dispatcher,
        DispatchEvent,
        EventKind,
        InMemoryBoard,
        IssueStatus,
        JsonFileBoard,
        Runner,
        RunOutcome,
        Tracker,
        issue_statuses,
    )
    from execkit.ledger import (
        Ledger,
        Run,
        Task,
        TaskStatus,
        open_ledger,
    )


__all__ = [
    "MAX_UNCHARGED_REPLANS",
    "Adapter",
    "AdapterRunner",
    "AdmissionRefused",
    "AgentFailed",
    "AgentProof",
    "AgentRequest",
    "AgentStatus",
    "Attempt",
    "AttemptContext",
    "AttemptLimitReached",
    "AttemptStatus",
    "Backoff",
    "BlockedOn",
    "BoardIssue",
    "BoardState",
    "Cancellation",
    "Classification",
    "Conflict",
    "Decision",
    "DecisionState",
    "DispatchCap",
    "DispatchConfig",
    "DispatchEvent",
    "Dispatcher",
    "Envelope",
    "EventKind",
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
    "MappedResult",
    "NextAction",
    "NotFound",
    "Plan",
    "PriorOutcome",
    "ProcessStarter",
    "Reason",
    "ReplanDecision",
    "Run",
    "RunOutcome",
    "RunProof",
    "RunRecorder",
    "RunStatus",
    "Runner",
    "SchemaTooNew",
    "SpawnCancelled",
    "SpawnFailure",
    "SpawnResult",
    "StorageError",
    "Task",
    "TaskBackingOff",
    "TaskBlocked",
    "TaskFinished",
    "TaskState",
    "TaskStatus",
    "Tracker",
    "Unauthenticated",
    "UnknownAdapter",
    "UnsupportedMove",
    "WorkBudget",
    "__version__",
    "adapter_names",
    "available_adapters",
    "classify",
    "classify_text",
    "decide",
    "decide_replans",
    "find_binary",
    "get_adapter",
    "issue_statuses",
    "load_agent_proof",
    "load_run_proof",
    "map_result",
    "open_ledger",
    "rollup_class",
    "run_agent",
    "run_command",
    "spawn",
    "spawn_async",
    "validate_history",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # Read on first use: importlib.metadata costs more than `import execkit` itself.
        from execkit._version import installed_version

        value = globals()["__version__"] = installed_version()
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'execkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
