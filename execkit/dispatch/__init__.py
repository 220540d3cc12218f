"""The dispatcher (ADR 015): bounded retries over a board that give up into a terminal state.

Rooms: `_board` (trackers and board files), `_config` (the knobs), `_runner` (what one
dispatch does), `_slots` (where agents run side by side), `_status` (the operator's
dashboard), `_scheduler` (the loop itself).
`import execkit` does not import this package: it loads on first use of a dispatcher name.
"""

from __future__ import annotations

from execkit.dispatch._board import (
    DEFAULT_STATES,
    BindableBoard,
    Board,
    BoardIssue,
    BoardState,
    GiveUpBoard,
    InMemoryBoard,
    JsonFileBoard,
    Tracker,
    task_key,
)
from execkit.dispatch._config import MAX_CONCURRENT_AGENTS, DispatchConfig
from execkit.dispatch._runner import AdapterRunner, Runner, RunOutcome, Slot
from execkit.dispatch._scheduler import (
    DISPATCH_ACTOR,
    STOPPED_REASON,
    Dispatcher,
    DispatchEvent,
    EventKind,
)
from execkit.dispatch._slots import InlineExecutor, SlotExecutor, ThreadPerSlot
from execkit.dispatch._status import IssueStatus, issue_statuses, iter_issue_statuses

__all__ = [
    "DEFAULT_STATES",
    "DISPATCH_ACTOR",
    "MAX_CONCURRENT_AGENTS",
    "STOPPED_REASON",
    "AdapterRunner",
    "BindableBoard",
    "Board",
    "BoardIssue",
    "BoardState",
    "DispatchConfig",
    "DispatchEvent",
    "Dispatcher",
    "EventKind",
    "GiveUpBoard",
    "InMemoryBoard",
    "InlineExecutor",
    "IssueStatus",
    "JsonFileBoard",
    "RunOutcome",
    "Runner",
    "Slot",
    "SlotExecutor",
    "ThreadPerSlot",
    "Tracker",
    "issue_statuses",
    "iter_issue_statuses",
    "task_key",
]
