"""The dispatcher (ADR 015): bounded retries over a board that give up into a terminal state.

Rooms: `_board` (the board protocol and board files), `_github` (GitHub Issues as a
board, behind that protocol; its client loads githubkit, the extra
`execkit-runner[github]`, only when one is opened), `_github_project` (a GitHub Project
(v2) as a board, through GraphQL, on the same client, lane and outbox), `_tracker` (the
tracker contract every tracker board shares: outbox write-back, the status comment, the
tracker's lane; and `TRACKERS`, the one table of tracker kinds), `_config` (the
knobs), `_runner` (what one dispatch does), `_workspaces` (a workspace per issue: a folder
or a git worktree), `_slots` (where agents run side by side), `_status` (the operator's
dashboard), `_scheduler` (the loop itself, which names no tracker).
`import execkit` does not import this package: it loads on first use of a dispatcher name.
Nor does this package import its rooms: each name loads its own room on first use, so
`execkit status` (the board, the knobs, the dashboard) does not pay for the scheduler, the
runner, the adapter registry or the redactor that only a running dispatcher needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the room that defines it
_EXPORTS: dict[str, str] = {
    "DEFAULT_STATES": "execkit.dispatch._board",
    "BindableBoard": "execkit.dispatch._board",
    "Board": "execkit.dispatch._board",
    "BoardIssue": "execkit.dispatch._board",
    "BoardReport": "execkit.dispatch._board",
    "ReportingBoard": "execkit.dispatch._board",
    "GitHubBoard": "execkit.dispatch._github",
    "GitHubConfig": "execkit.dispatch._github",
    "GitHubProjectBoard": "execkit.dispatch._github_project",
    "GitHubProjectConfig": "execkit.dispatch._github_project",
    "read_board_config": "execkit.dispatch._github",
    "TRACKERS": "execkit.dispatch._tracker",
    "TrackerBoard": "execkit.dispatch._tracker",
    "open_tracker": "execkit.dispatch._tracker",
    "tracker_dispatch_states": "execkit.dispatch._tracker",
    "tracker_kind": "execkit.dispatch._tracker",
    "BoardState": "execkit.dispatch._board",
    "GiveUpBoard": "execkit.dispatch._board",
    "InMemoryBoard": "execkit.dispatch._board",
    "JsonFileBoard": "execkit.dispatch._board",
    "Tracker": "execkit.dispatch._board",
    "task_key": "execkit.dispatch._board",
    "MAX_CONCURRENT_AGENTS": "execkit.dispatch._config",
    "DispatchConfig": "execkit.dispatch._config",
    "AdapterRunner": "execkit.dispatch._runner",
    "Runner": "execkit.dispatch._runner",
    "RunOutcome": "execkit.dispatch._runner",
    "Slot": "execkit.dispatch._runner",
    "DISPATCH_ACTOR": "execkit.dispatch._scheduler",
    "STOPPED_REASON": "execkit.dispatch._scheduler",
    "Dispatcher": "execkit.dispatch._scheduler",
    "DispatchEvent": "execkit.dispatch._scheduler",
    "EventKind": "execkit.dispatch._scheduler",
    "InlineExecutor": "execkit.dispatch._slots",
    "SlotExecutor": "execkit.dispatch._slots",
    "ThreadPerSlot": "execkit.dispatch._slots",
    "WorkspaceHooks": "execkit.dispatch._workspaces",
    "Workspaces": "execkit.dispatch._workspaces",
    "workspace_name": "execkit.dispatch._board",
    "SpendBy": "execkit.dispatch._spend",
    "SpendGroup": "execkit.dispatch._spend",
    "SpendReport": "execkit.dispatch._spend",
    "spend_report": "execkit.dispatch._spend",
    "SPEND_WAIT": "execkit.dispatch._status",
    "IssueStatus": "execkit.dispatch._status",
    "IssueStatusValues": "execkit.dispatch._status",
    "issue_status_values": "execkit.dispatch._status",
    "issue_statuses": "execkit.dispatch._status",
    "iter_issue_status_values": "execkit.dispatch._status",
    "iter_issue_statuses": "execkit.dispatch._status",
}

if TYPE_CHECKING:
    from execkit.dispatch._board import (
        DEFAULT_STATES,
        BindableBoard,
        Board,
        BoardIssue,
        BoardReport,
        BoardState,
        GiveUpBoard,
        InMemoryBoard,
        JsonFileBoard,
        ReportingBoard,
        Tracker,
        task_key,
        workspace_name,
    )
    from execkit.dispatch._config import MAX_CONCURRENT_AGENTS, DispatchConfig
    from execkit.dispatch._github import GitHubBoard, GitHubConfig, read_board_config
    from execkit.dispatch._github_project import GitHubProjectBoard, GitHubProjectConfig
    from execkit.dispatch._runner import AdapterRunner, Runner, RunOutcome, Slot
    from execkit.dispatch._scheduler import (
        DISPATCH_ACTOR,
        STOPPED_REASON,
        Dispatcher,
        DispatchEvent,
        EventKind,
    )
    from execkit.dispatch._slots import InlineExecutor, SlotExecutor, ThreadPerSlot
    from execkit.dispatch._spend import SpendBy, SpendGroup, SpendReport, spend_report
    from execkit.dispatch._status import (
        SPEND_WAIT,
        IssueStatus,
        IssueStatusValues,
        issue_status_values,
        issue_statuses,
        iter_issue_status_values,
        iter_issue_statuses,
    )
    from execkit.dispatch._tracker import (
        TRACKERS,
        TrackerBoard,
        open_tracker,
        tracker_dispatch_states,
        tracker_kind,
    )
    from execkit.dispatch._workspaces import WorkspaceHooks, Workspaces

__all__ = [
    "DEFAULT_STATES",
    "DISPATCH_ACTOR",
    "MAX_CONCURRENT_AGENTS",
    "SPEND_WAIT",
    "STOPPED_REASON",
    "TRACKERS",
    "AdapterRunner",
    "BindableBoard",
    "Board",
    "BoardIssue",
    "BoardReport",
    "BoardState",
    "DispatchConfig",
    "DispatchEvent",
    "Dispatcher",
    "EventKind",
    "GitHubBoard",
    "GitHubConfig",
    "GitHubProjectBoard",
    "GitHubProjectConfig",
    "GiveUpBoard",
    "InMemoryBoard",
    "InlineExecutor",
    "IssueStatus",
    "IssueStatusValues",
    "JsonFileBoard",
    "ReportingBoard",
    "RunOutcome",
    "Runner",
    "Slot",
    "SlotExecutor",
    "SpendBy",
    "SpendGroup",
    "SpendReport",
    "ThreadPerSlot",
    "Tracker",
    "TrackerBoard",
    "WorkspaceHooks",
    "Workspaces",
    "issue_status_values",
    "issue_statuses",
    "iter_issue_status_values",
    "iter_issue_statuses",
    "open_tracker",
    "read_board_config",
    "spend_report",
    "task_key",
    "tracker_dispatch_states",
    "tracker_kind",
    "workspace_name",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'execkit.dispatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
