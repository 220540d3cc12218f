"""Finding adapters: every one, built-in ones included, through the `execkit.adapters`
entry-point group.

execkit never imports a vendor module by name: the built-in adapters (the top-level
`adapters` package) are registered by this distribution's own metadata exactly as a
third-party package registers its own:

    [project.entry-points."execkit.adapters"]
    mycli = "mypkg.adapter:MyCliAdapter"

An entry point names an instance, or a class or factory called with no arguments. When two
distributions register one name, the one shipped with execkit wins, so a plugin cannot
silently replace `codex`. Looking names up reads packaging metadata only; a vendor module is
imported when its adapter is first asked for.
"""

from __future__ import annotations

import functools
import shutil
import sys
from importlib import metadata

from execkit._adapter import Adapter
from execkit._errors import InvalidInput, UnknownAdapter

__all__ = ["ENTRY_POINT_GROUP", "adapter_names", "available_adapters", "find_binary", "get_adapter"]

ENTRY_POINT_GROUP = "execkit.adapters"

# The distribution whose entry points are the built-in adapters.
_OWN_DISTRIBUTION = "execkit-runner"


def _is_own(entry_point: metadata.EntryPoint) -> bool:
    dist = entry_point.dist
    return dist is not None and dist.name == _OWN_DISTRIBUTION


def _registered() -> dict[str, metadata.EntryPoint]:
    # Reading every distribution's entry points costs milliseconds (a file per installed
    # distribution), and a dispatcher asks for each run: read once per import path.
    return dict(_registered_on(tuple(sys.path)))


@functools.lru_cache(maxsize=8)
def _registered_on(path: tuple[str, ...]) -> dict[str, metadata.EntryPoint]:
    """The entry points found on import path `path` (the cache key: a plugin installed
    onto the path at run time is seen)."""
    found: dict[str, metadata.EntryPoint] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        current = found.get(entry_point.name)
        if current is None or not _is_own(current):
            found[entry_point.name] = entry_point
    return found


def adapter_names() -> list[str]:
    """Every adapter name, built-in and registered, sorted; imports no adapter code."""
    return sorted(_registered())


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
            f"{type(exc).__name__}: {exc}",
            field="adapter",
        ) from exc
    if not isinstance(target, Adapter):
        raise InvalidInput(
            f"adapter {entry_point.name!r} ({entry_point.value}) does not provide name, "
            "binary, install_hint, login_hint, build_argv and parse",
            field="adapter",
        )
    return target


def get_adapter(name: str) -> Adapter:
    """A fresh instance of the adapter called `name`.

    Raises UnknownAdapter listing the known names when there is none (and saying how to
    install execkit's metadata when there are none at all); InvalidInput when a registered
    adapter fails to load or lacks the Adapter members.
    """
    registered = _registered()
    entry_point = registered.get(name)
    if entry_point is None:
        known = ", ".join(sorted(registered))
        if not known:
            raise UnknownAdapter(
                f"unknown adapter {name!r}: no adapter is registered at all; install "
                f"{_OWN_DISTRIBUTION} (pip install -e .) so its entry points exist"
            )
        raise UnknownAdapter(f"unknown adapter {name!r}; known adapters: {known}")
    return _load(entry_point)


def available_adapters() -> list[Adapter]:
    """One instance of every adapter that loads, sorted by name (broken plugins skipped)."""
    found: list[Adapter] = []
    for entry_point in sorted(_registered().values(), key=lambda ep: ep.name):
        try:
            found.append(_load(entry_point))
        except InvalidInput:
            continue
    return found


def find_binary(adapter: Adapter) -> str | None:
    """Where the adapter's binary is on PATH, or None (also None for `generic`)."""
    return shutil.which(adapter.binary) if adapter.binary else None
