"""The failure classifier (ADR 0046): placeholder until issue 3 lands."""

from __future__ import annotations

import enum

__all__ = ["FailureClass"]


class FailureClass(enum.Enum):
    """Did a failed attempt produce information about the work?"""

    WORK = "work"
    ENVIRONMENT = "environment"
    UPSTREAM = "upstream"

    @property
    def charged(self) -> bool:
        """Only work failures spend the charged budget."""
        return self is FailureClass.WORK
