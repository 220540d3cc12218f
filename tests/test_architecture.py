"""The shape of the house, checked: one-way imports, private rooms, a thin front door.

These read the source (ast) and start fresh interpreters; they fail when someone imports a
higher layer from a lower one, makes an implementation module public, lets `execkit`
import the vendor package, or makes `import execkit` pay for the ledger.
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import execkit
from execkit._errors import ExecKitError, error_types

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "execkit"

# The public modules: the front door, the adapter authors' helpers, the pytest plugin, the
# CLI entry point, the remote ledger client, and the three subpackages whose own __init__ is
# a thin front door.
PUBLIC_MODULES = {
    "execkit",
    "execkit.__main__",
    "execkit.adapterkit",
    "execkit.testing",
    "execkit.cli",
    "execkit.ledger",
    "execkit.dispatch",
    "execkit.remote",
    "execkit.server",
}

# Each room's place in the one-way flow; a module may import only rooms of its rank or
# below (type-only imports under `if TYPE_CHECKING:` excepted: they never run).
RANKS = {
    "execkit._errors": 0,
    "execkit._validate": 0,
    "execkit._json": 0,
    "execkit._redact": 0,
    "execkit._mask": 0,
    "execkit._backoff": 0,
    "execkit._version": 0,
    "execkit._trace": 0,
    # The one printer of a time and of a length of time, total (`utc_stamp`, `span`).
    "execkit._stamp": 0,
    # The client's HTTP/1.1 connection (`execkit.remote`'s transport): the standard library only.
    "execkit._http1": 0,
    "execkit._exec": 1,
    # What a run cost (issue #45): the value and its price table are helpers; the meter
    # reads lines from the exec stage's hook.
    "execkit._usage": 0,
    "execkit._prices": 0,
    "execkit._meter": 1,
    "execkit._classify": 2,
    "execkit.adapterkit": 3,
    "execkit._adapter": 3,
    "execkit._registry": 3,
    "execkit._proof": 4,
    "execkit._agent": 5,
    # The retry libraries' helpers read only the failure types (and the agent's backoff).
    "execkit._retry": 5,
    "execkit._budget": 6,
    "execkit._lanes": 6,
    "execkit.ledger": 7,
    # One attempt of a task end to end (`run_attempt`): the agent loop over the ledger,
    # below the dispatcher that does the same for each issue of a board.
    "execkit._attempt": 7.5,
    # Sending the ledger's notification events (issue #49): over the ledger and the HTTP
    # client, below the dispatcher and the server that each run a sender.
    "execkit._notify": 7.5,
    "execkit.dispatch": 8,
    # The HTTP API described once (the route table, its OpenAPI document): above the
    # ledger it calls, below the server and the client built from it, so neither can be
    # imported back by it.
    "execkit._api": 8,
    "execkit.cli": 9,
    "execkit.testing": 9,
    "execkit._corpus": 9,
    "execkit.remote": 9,
    "execkit.server": 9,
    "execkit": 10,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room_of(name: str) -> str:
    """The room a module belongs to: its longest prefix in RANKS."""
    while name not in RANKS:
        name = name.rpartition(".")[0]
    return name


def runtime_imports(path: Path) -> set[str]:
    """Modules `path` imports when it runs (imports under `if TYPE_CHECKING:` left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_execkit_never_imports_the_vendor_package(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            assert name != "adapters" and not name.startswith("adapters."), (
                f"{module_name(path)} imports {name}: adapters are found through entry points"
            )


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_flow_one_way(path: Path) -> None:
    me = room_of(module_name(path))
    for imported in runtime_imports(path):
        if imported != "execkit" and not imported.startswith("execkit."):
            continue
        them = room_of(imported)
        assert RANKS[them] <= RANKS[me], f"{me} (rank {RANKS[me]}) imports {them} ({RANKS[them]})"


def test_implementation_modules_are_private() -> None:
    # A module outside PUBLIC_MODULES is private: its first `_` part marks the private room,
    # which must hang directly off a public module. Inside a private package (execkit/_exec/)
    # the files take plain names: the package's leading underscore already says "private".
    for path in SOURCES:
        name = module_name(path)
        if name in PUBLIC_MODULES:
            continue
        parts = name.split(".")
        private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
        assert private is not None, f"{name} is a public module; make it private"
        room = ".".join(parts[:private])
        assert room in PUBLIC_MODULES, f"{name} lives under a private package of {room}"


def private_owner(name: str) -> str | None:
    """The package only whose own modules may import `name`, or None when any may.

    The first private part of a dotted name decides: a private module of a package
    (`execkit.ledger._postgres`) belongs to that package (`execkit.ledger`); a file inside
    a private package (`execkit._exec.supervisor`, plain names inside) belongs to that
    private package (`execkit._exec`). `execkit._errors` belongs to `execkit`: every
    package of execkit shares the rooms at its top."""
    parts = name.split(".")
    private = next(
        (i for i, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")),
        None,
    )
    if private is None:
        return None
    inside = private + 1 if len(parts) > private + 1 else private
    return ".".join(parts[:inside])


@pytest.mark.parametrize(
    "path",
    [*SOURCES, *sorted((REPO / "adapters").glob("*.py"))],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_a_private_room_is_imported_only_from_inside_its_package(path: Path) -> None:
    # `execkit.ledger._postgres` is the ledger's own business: another package goes through
    # `execkit.ledger` (`open_ledger`), so a backend is chosen in one place; a package offers
    # what it wants used in its `__init__` and keeps the right to move the rest.
    me = module_name(path)
    for name in _imported_names(path):
        while name not in MODULES and name.count(".") > 1:
            name = name.rpartition(".")[0]
        owner = private_owner(name)
        if owner is None or not owner.startswith("execkit"):
            continue
        assert me == owner or me.startswith(owner + "."), (
            f"{me} imports {name}, a private room of {owner}: import it from {owner}"
        )


def test_the_owner_of_a_private_room() -> None:
    assert private_owner("execkit.ledger._postgres") == "execkit.ledger"
    assert private_owner("execkit._exec.supervisor") == "execkit._exec"
    assert private_owner("execkit._exec.tree.cgroup") == "execkit._exec"
    assert private_owner("execkit._errors") == "execkit"
    assert private_owner("execkit.ledger") is None


def test_vendor_adapters_use_only_the_public_api() -> None:
    for path in sorted((REPO / "adapters").glob("*.py")):
        for imported in runtime_imports(path):
            if imported.startswith("execkit"):
                assert imported in {"execkit", "execkit.adapterkit"}, (path.name, imported)


def test_the_front_door_declares_exactly_what_it_exports() -> None:
    exports = execkit._EXPORTS
    assert sorted(execkit.__all__) == sorted([*exports, "__version__"])
    for name in exports:
        value = getattr(execkit, name)
        if not (isinstance(value, type) or inspect.isfunction(value)):
            continue  # a constant or a type alias: its module is where it was built
        defined_in = value.__module__
        # Each name is the object of a private room (or a subpackage's front door).
        assert defined_in.startswith(("execkit._", "execkit.ledger", "execkit.dispatch")), (
            name,
            defined_in,
        )


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded: list[str] = json.loads(done.stdout)
    return set(loaded)


def test_importing_execkit_loads_no_ledger_sqlite_asyncio_or_psutil() -> None:
    loaded = _modules_after("import execkit")
    heavy = {"sqlite3", "asyncio", "psutil", "execkit.ledger", "execkit.dispatch", "adapters"}
    assert not loaded & heavy, sorted(loaded & heavy)
    assert {m for m in loaded if m.startswith("execkit")} == {"execkit"}


def test_a_spawn_loads_neither_the_ledger_nor_asyncio() -> None:
    loaded = _modules_after("from execkit import spawn; spawn(['true'])")
    assert not loaded & {"sqlite3", "asyncio", "psutil", "execkit.ledger", "adapters"}


def test_each_error_code_has_its_own_exit_code() -> None:
    kinds = error_types()
    assert kinds[0] is ExecKitError
    by_code: dict[str, int] = {}
    for kind in kinds:
        by_code.setdefault(kind.code, kind.exit_code)
        assert by_code[kind.code] == kind.exit_code, kind
    specific = {code: exit for code, exit in by_code.items() if exit != 1}
    assert len(set(specific.values())) == len(specific), specific
    assert all(issubclass(kind, ExecKitError) for kind in kinds)


# -- the import graph: no circles, no reaching into another package's rooms ---------------

MODULES = {module_name(path): path for path in SOURCES}


def _imported_names(path: Path) -> set[str]:
    """Every module `path` names in an import, type-only and function-level ones included
    (a circle through a type-only import is still two rooms that need each other), with a
    relative import made absolute. `from P import name` names `P.name` when that is a
    module (a submodule, not the package's `__init__`), else `P`."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in MODULES else module)
    return found


def _module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges = set()
        for imported in _imported_names(path):
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.add(imported)
        graph[name] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere_in_execkit() -> None:
    assert _circles(_module_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    # The check above is only as good as this: a two-room and a three-room circle are found.
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert _circles(graph) == [["a", "b"], ["c", "d", "e"]]
