"""The vendor adapters that ship with execkit: one module per vendor CLI.

This package holds vendor code only. It imports `execkit` (the adapter contract and its
helpers); execkit never imports it, and finds these adapters the way it finds any other:
through the `execkit.adapters` entry points this distribution declares
(`execkit.get_adapter("codex")`).
"""

from __future__ import annotations

from adapters.claude import ClaudeAdapter
from adapters.codex import CodexAdapter
from adapters.gemini import GeminiAdapter
from adapters.generic import GenericAdapter
from adapters.opencode import OpencodeAdapter

__all__ = [
    "ClaudeAdapter",
    "CodexAdapter",
    "GeminiAdapter",
    "GenericAdapter",
    "OpencodeAdapter",
]
