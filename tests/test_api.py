"""The declared public API: every exported name resolves, and no import order is circular."""

from __future__ import annotations

import subprocess
import sys

import pytest

import execkit
import execkit.dispatch


@pytest.mark.parametrize("name", execkit.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(execkit, name) is not None
    assert name in dir(execkit)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = execkit.no_such_thing


@pytest.mark.parametrize(
    "first_import",
    [
        "adapters",
        "adapters.codex",
        "execkit",
        "execkit._agent",
        "execkit.dispatch",
        "execkit.testing",
    ],
)
def test_any_module_can_be_imported_first(first_import: str) -> None:
    # A fresh interpreter each time: the package init must not close an import cycle.
    code = f"import {first_import}; from execkit import *; import adapters; get_adapter('codex')"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_lazy_exports_are_the_library_objects() -> None:
    from execkit._agent import run_agent
    from execkit.dispatch import Dispatcher

    assert execkit.run_agent is run_agent
    assert execkit.Dispatcher is Dispatcher


@pytest.mark.parametrize("name", execkit.dispatch.__all__)
def test_every_dispatch_name_resolves_to_its_rooms_object(name: str) -> None:
    """`execkit.dispatch` loads a room on first use of one of its names: each name is the
    object its room defines, and listed by `dir`."""
    import importlib

    room = importlib.import_module(execkit.dispatch._EXPORTS[name])
    assert getattr(execkit.dispatch, name) is getattr(room, name)
    assert name in dir(execkit.dispatch)
    assert set(execkit.dispatch._EXPORTS) == set(execkit.dispatch.__all__)


def test_an_unknown_dispatch_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = execkit.dispatch.no_such_thing
