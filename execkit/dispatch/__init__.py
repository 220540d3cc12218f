"""The dispatcher (ADR 015): bounded retries over a board that give up into a terminal state.

Rooms: `_board` (trackers and board files), `_config` (the knobs), `_runner` (what one
dispatch does), `_status` (the operator's dashboard), `_scheduler` (the loop itself).
`import execkit` does not import this package: it loads on first use of a dispatcher name.
"""

from __future__ import annotations

from execkit.dispatch._board import (
    DEFAULT_STATES,
    BindableBoard,
    Board,
    BoardIssue,
    BoardState,
    InMemoryBoard,
    JsonFileBoard,
    Tracker,
    task_key,
)
from execkit.dispatch._config import DispatchConfig
from execkit.dispatch._runner import AdapterRunner, Runner, RunOutcome
from execkit.dispatch._scheduler import DISPATCH_ACTOR, Dispatcher, DispatchEvent, EventKind
from execkit.dispatch._status import IssueStatus, issue_statuses

__all__ = [
    "DEFAULT_STATES",
    "DISPATCH_ACTOR",
    "AdapterRunner",
    "BindableBoard",
    "Board",
    "BoardIssue",
    "BoardState",
    "DispatchConfig",
    "DispatchEvent",
    "Dispatcher",
    "EventKind",
    "InMemoryBoard",
    "IssueStatus",
    "JsonFileBoard",
    "RunOutcome",
    "Runner",
    "Tracker",
    "issue_statuses",
    "task_key",
]
