"""CLI group placeholder: filled in by its issue."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this group's subcommands (none yet)."""
