"""Vendor adapters: built-in ones and any registered under the `execkit.adapters` group.

    import adapters
    codex = adapters.get("codex")
    adapters.names()        # built-in and registered names, sorted

A third-party package registers an adapter (an instance, or a class/factory called with
no arguments) in its packaging metadata:

    [project.entry-points."execkit.adapters"]
    mycli = "mypkg.adapter:MyCliAdapter"

Built-in names win over registered ones, so a plugin cannot silently replace `codex`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from importlib import metadata

from adapters.base import Adapter, AdapterRawResult, AgentRequest, Envelope
from adapters.claude import ClaudeAdapter
from adapters.codex import CodexAdapter
from adapters.gemini import GeminiAdapter
from adapters.generic import GenericAdapter
from adapters.opencode import OpencodeAdapter
from execkit.errors import InvalidInput, UnknownAdapter

__all__ = [
    "ENTRY_POINT_GROUP",
    "Adapter",
    "AdapterRawResult",
    "AgentRequest",
    "ClaudeAdapter",
    "CodexAdapter",
    "Envelope",
    "GeminiAdapter",
    "GenericAdapter",
    "OpencodeAdapter",
    "available",
    "get",
    "names",
    "which",
]

ENTRY_POINT_GROUP = "execkit.adapters"

_BUILTIN: dict[str, Callable[[], Adapter]] = {
    "claude": ClaudeAdapter,
    "codex": CodexAdapter,
    "gemini": GeminiAdapter,
    "generic": GenericAdapter,
    "opencode": OpencodeAdapter,
}


def _registered() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """Every adapter name, built-in and registered, sorted; loads no plugin code."""
    return sorted(set(_BUILTIN) | set(_registered()))


def _load(entry_point: metadata.EntryPoint) -> Adapter:
    try:
        target = entry_point.load()
        # A class or factory is called; an instance is used as is. A class is checked
        # first because the class object itself carries the Adapter attribute names.
        if isinstance(target, type) or (callable(target) and not isinstance(target, Adapter)):
            target = target()
    except Exception as exc:
        raise InvalidInput(
            f"adapter {entry_point.name!r} ({entry_point.value}) failed to load: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(target, Adapter):
        raise InvalidInput(
            f"adapter {entry_point.name!r} ({entry_point.value}) does not provide name, "
            "binary, install_hint, login_hint, build_argv and parse"
        )
    return target


def get(name: str) -> Adapter:
    """The adapter called `name`.

    Raises UnknownAdapter listing the known names when there is none; InvalidInput when
    a registered adapter fails to load or lacks the Adapter members.
    """
    factory = _BUILTIN.get(name)
    if factory is not None:
        return factory()
    entry_point = _registered().get(name)
    if entry_point is None:
        raise UnknownAdapter(f"unknown adapter {name!r}; known adapters: {', '.join(names())}")
    return _load(entry_point)


def available() -> list[Adapter]:
    """One instance of every adapter that loads, sorted by name (broken plugins skipped)."""
    found: list[Adapter] = []
    for name in names():
        try:
            found.append(get(name))
        except InvalidInput:
            continue
    return found


def which(adapter: Adapter) -> str | None:
    """Where the adapter's binary is on PATH, or None (also None for `generic`)."""
    return shutil.which(adapter.binary) if adapter.binary else None
