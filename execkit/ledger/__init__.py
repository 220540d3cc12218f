"""The durable ledger (ADR 0033): placeholder until issue 6 lands."""

from __future__ import annotations

from execkit.ledger.model import CAPABILITIES, Ledger, Run, Task

__all__ = ["CAPABILITIES", "Ledger", "Run", "Task"]
