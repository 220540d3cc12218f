"""Where secrets are masked, checked as the shape of the code (docs/architecture.md, "Where
secrets are masked"): a new sink cannot be added without going through one of the layers.

- Into the ledger: every text argument of a public ledger operation (`execkit/ledger/_core`)
  is read only through a masking check of `inputs` (`check_text`, `as_actor`,
  `clean_reason`), or is an id that is only looked up, or a value checked against a closed
  set (a role, a run status).
- Errors: every `ExecKitError` masks its message when it is built.
- Out of the CLI: only `execkit/cli/_output.py` writes to stdout or stderr, or makes a log
  handler; the one unmasked line (a new server token, shown once) is allowed in
  `execkit serve --add-token` only.
- Out of the server: every answer body is serialized by `_app._dumps` (which masks) and every
  `Response` built by `_app._response`.

These read the source (ast); tests/test_secret_sinks_everywhere.py checks the bytes.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from secrets_corpus import SAMPLES, leaked

from execkit._errors import ExecKitError, error_types

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "execkit"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _calls(tree: ast.AST) -> list[tuple[ast.Call, str]]:
    """Every call in `tree` with the dotted name of what it calls (`sys.stdout.write`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found.append((node, ast.unparse(node.func)))
    return found


def _enclosing_functions(tree: ast.AST) -> dict[int, str]:
    """id(node) -> the name of the innermost function that holds it."""
    owner: dict[int, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else name
            )
            owner[id(child)] = inner
            visit(child, inner)

    visit(tree, "<module>")
    return owner


# ------------------------------------------------------------------ out of the CLI

_WRITERS = {
    "print",
    "sys.stdout.write",
    "sys.stderr.write",
    "sys.stdout.buffer.write",
    "sys.stderr.buffer.write",
    "sys.__stdout__.write",
    "sys.__stderr__.write",
    "logging.StreamHandler",
}
# Writes outside cli/_output.py, each a fixed text that holds nothing from outside:
# `execkit --version`, the Ctrl-C line of `execkit` (written before any command group, and
# so before `_output`, is imported), `python -m execkit.server`'s OpenAPI document, and the
# lines signal handlers write straight to descriptor 2 (a signal name and a count: a
# handler must not take the locks a masked write may).
_FIXED_WRITES = {
    ("execkit/__main__.py", "os.write"): 1,
    ("execkit/cli/__init__.py", "os.write"): 1,
    ("execkit/cli/__init__.py", "sys.stdout.write"): 1,
    ("execkit/cli/__init__.py", "sys.stderr.write"): 1,
    ("execkit/cli/_dispatch.py", "os.write"): 1,
    ("execkit/server/__main__.py", "sys.stdout.write"): 1,
}


def test_only_the_cli_output_module_writes_to_the_terminal() -> None:
    found: dict[tuple[str, str], int] = {}
    for path in SOURCES:
        rel = _rel(path)
        if rel == "execkit/cli/_output.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, name in _calls(tree):
            writes_os = name == "os.write" and ast.unparse(node.args[0]) in ("1", "2")
            if name in _WRITERS or writes_os or (name == "print" and node.args):
                found[(rel, name)] = found.get((rel, name), 0) + 1
    assert found == _FIXED_WRITES, (
        "write through execkit.cli._output (emit, print_json, log_handler), which masks"
    )


def test_an_unmasked_lead_is_a_literal() -> None:
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, name in _calls(tree):
            for keyword in node.keywords:
                if name == "emit" and keyword.arg == "lead":
                    assert isinstance(keyword.value, ast.Constant), f"{_rel(path)}:{node.lineno}"


def test_the_one_unmasked_line_is_a_new_token_shown_once() -> None:
    uses: list[str] = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, name in _calls(tree):
            if name == "show_credential" or any(k.arg == "credential" for k in node.keywords):
                uses.append(f"{_rel(path)}:{node.lineno}")
    assert [use.partition(":")[0] for use in uses] == ["execkit/cli/_serve.py"] * 2, uses


# ---------------------------------------------------------------- out of the server


def test_every_server_answer_is_serialized_by_the_masking_dumps() -> None:
    path = PACKAGE / "server" / "_app.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owner = _enclosing_functions(tree)
    for node, name in _calls(tree):
        if name == "json.dumps":
            assert owner[id(node)] == "_dumps", f"json.dumps at {node.lineno}"
        if name.endswith("Response"):
            assert owner[id(node)] == "_response", f"{name} at line {node.lineno}"
    dumps = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "_dumps"
    )
    assert "mask_json(" in ast.unparse(dumps)
    # The dashboard's JSON goes through one function that masks it too; its page and its
    # redirect are fixed bytes, and /metrics, /healthz and /readyz carry only counts and
    # fixed words. No other server module builds an answer.
    dashboard = ast.parse((PACKAGE / "server" / "_dashboard_http.py").read_text("utf-8"))
    owner = _enclosing_functions(dashboard)
    for node, name in _calls(dashboard):
        if name == "json.dumps":
            assert owner[id(node)] == "_json", f"json.dumps at line {node.lineno}"
    json_answer = next(
        node
        for node in ast.walk(dashboard)
        if isinstance(node, ast.FunctionDef) and node.name == "_json"
    )
    assert "mask_json(" in ast.unparse(json_answer)
    # GitHub's webhook route (_hooks) answers through one function that masks too.
    hooks = ast.parse((PACKAGE / "server" / "_hooks.py").read_text("utf-8"))
    owner = _enclosing_functions(hooks)
    for node, name in _calls(hooks):
        if name == "json.dumps" or name.endswith("Response"):
            assert owner[id(node)] == "_answer", f"{name} at line {node.lineno}"
    hook_answer = next(
        node
        for node in ast.walk(hooks)
        if isinstance(node, ast.FunctionDef) and node.name == "_answer"
    )
    assert "mask_json(" in ast.unparse(hook_answer)
    answering = {"_app.py", "_dashboard_http.py", "_metrics.py", "_hooks.py"}
    for other in sorted((PACKAGE / "server").glob("*.py")):
        if other.name in answering:
            continue
        names = {name for _, name in _calls(ast.parse(other.read_text(encoding="utf-8")))}
        assert not {n for n in names if n.endswith("Response") and n != "StoredResponse"}, other


# ------------------------------------------------------------------------- errors

SHAPED = [sample for sample in SAMPLES if not sample.extra_secrets]


def _build(kind: type[ExecKitError], message: str) -> ExecKitError:
    params = inspect.signature(kind.__init__).parameters
    extra = {"ready_at": 0.0} if "ready_at" in params else {}
    return kind(message, **extra)


# Built from a message (AgentFailed, built from a proof, hands the message it words to
# ExecKitError.__init__ like the rest: the next test checks none sets it otherwise).
BUILT_FROM_A_MESSAGE = [
    kind for kind in error_types() if "proof" not in inspect.signature(kind.__init__).parameters
]


@pytest.mark.parametrize("kind", BUILT_FROM_A_MESSAGE, ids=lambda kind: kind.__name__)
def test_every_error_masks_its_message_when_it_is_built(kind: type[ExecKitError]) -> None:
    for sample in SHAPED:
        exc = _build(kind, f"task {sample.text} not found")
        assert not leaked(sample.secret, exc.message), (kind, sample.name)
        assert not leaked(sample.secret, str(exc)), (kind, sample.name)


def test_no_error_type_sets_its_message_past_the_mask() -> None:
    # A subclass (AgentFailed too, defined in _proof) builds its message and hands it to
    # ExecKitError.__init__; none assigns `.message` or `.args` itself.
    error_names = {kind.__name__ for kind in error_types()} | {"AgentFailed"}
    checked = 0
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            if not {ast.unparse(base) for base in cls.bases} & error_names:
                continue
            checked += 1
            for node in ast.walk(cls):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        assert ast.unparse(target) not in ("self.message", "self.args"), (
                            f"{_rel(path)}:{node.lineno}: {cls.name} sets its message itself"
                        )
    assert checked >= len(error_names) - 1  # every subclass, ExecKitError itself aside


# ------------------------------------------------------------------ into the ledger

_MASKERS = {"check_text", "check_name", "check_json", "as_actor", "clean_reason"}
# Only a hash of what they are given is stored (a request's fingerprint).
_HASHERS = {"creation_fingerprint", "fingerprint_of"}
# Arguments that are only looked up (a miss is NotFound, whose message is masked when it is
# built, or for `task_ids` a task left out of the answer), or checked against a closed set
# or a strict format before use (a lane name is ADAPTER/HEX-FINGERPRINT, a lane cause and a
# state are enum members).
_NOT_STORED = {
    "task_id",
    "task_ids",
    "run_id",
    "role",
    "status",
    "after",
    "state",
    "lane",
    "lane_cause",
    "outcome",
    "format",
    "window",  # a spend window: day, 5h or week (`SpendWindow`)
}
# A lookup by a name that was masked when it was stored; and what a notification endpoint
# must keep as the operator gave it to be reached at all (issue #49: a Slack webhook's URL
# is its credential, a signing secret is one): stored, never shown (a listing and the audit
# show the URL's scheme and host, and whether there is a secret).
_LOOKUPS = {
    ("grants", "principal"),
    ("add_notify_endpoint", "url"),
    ("add_notify_endpoint", "secret"),
    ("add_notify_endpoint", "events"),  # checked against the closed set of kinds
    # Issue #46: a vendor session id is handed back to the vendor's CLI to resume it, so it
    # is kept as the vendor wrote it (`check_session`: bounded, no control character).
    ("finish_run", "session_id"),
}


def _text_parameters(fn: ast.FunctionDef) -> list[str]:
    args = fn.args.args[1:] + fn.args.kwonlyargs
    return [
        arg.arg
        for arg in args
        if arg.annotation is not None
        and ("str" in ast.unparse(arg.annotation) or "Actor" in ast.unparse(arg.annotation))
    ]


def _operations() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted((PACKAGE / "ledger" / "_core").glob("*.py")):
        if path.name in ("inputs.py", "store.py"):  # the checks themselves; the protocols
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_"):
                    found.append((f"{path.name}:{cls.name}.{fn.name}", fn))
    return found


OPERATIONS = _operations()


def test_the_operations_are_found() -> None:
    names = {name.rpartition(".")[2] for name, _ in OPERATIONS}
    assert {"create_task", "start_run", "finish_run", "retry_task", "grant_role"} <= names


@pytest.mark.parametrize("fn", [fn for _, fn in OPERATIONS], ids=[name for name, _ in OPERATIONS])
def test_every_text_argument_of_a_ledger_operation_is_masked_before_use(
    fn: ast.FunctionDef,
) -> None:
    for param in _text_parameters(fn):
        if param in _NOT_STORED or (fn.name, param) in _LOOKUPS:
            continue
        # Each read of the argument is an argument of a masking check, or comes after the
        # argument was replaced by one (`title = check_text("title", title, ...)`).
        masked_from: int | None = None
        for stmt in ast.walk(fn):
            if (
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == param for t in stmt.targets)
                and isinstance(stmt.value, ast.Call)
                and ast.unparse(stmt.value.func) in _MASKERS
            ):
                masked_from = stmt.lineno if masked_from is None else min(masked_from, stmt.lineno)
        inside_masker: set[int] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in _MASKERS:
                inside_masker.update(id(arg) for arg in node.args)
            if isinstance(node, ast.Call) and ast.unparse(node.func) in _HASHERS:
                inside_masker.update(id(part) for arg in node.args for part in ast.walk(arg))
            # `if key is not None:` reads no text.
            if (
                isinstance(node, ast.Compare)
                and all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops)
                and all(isinstance(c, ast.Constant) and c.value is None for c in node.comparators)
            ):
                inside_masker.add(id(node.left))
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id == param and isinstance(node.ctx, ast.Load):
                ok = id(node) in inside_masker or (
                    masked_from is not None and node.lineno > masked_from
                )
                assert ok, (
                    f"{fn.name} reads {param} at line {node.lineno} before masking it "
                    f"(pass it through one of {sorted(_MASKERS)} in ledger/_core/inputs.py)"
                )
