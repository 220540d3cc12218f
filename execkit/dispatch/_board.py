"""Boards: the trackers the dispatcher reads issues from and moves them on.

A board lists issues in states (columns); eligible states are dispatched from, terminal
ones never are. `InMemoryBoard` is for tests and embedding; `JsonFileBoard` keeps a board
in one JSON file an operator can edit (its format is in docs/formats.md). Each issue maps to
one ledger task whose idempotency key (and title) is `task_key(issue_id)`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs
from attrs.validators import deep_iterable, ge, gt, instance_of, max_len, optional

from execkit._errors import Conflict, Forbidden, InvalidInput, NotFound, StorageError
from execkit._json import to_json
from execkit._validate import checked, finite, integer, non_blank, opt_checked

__all__ = [
    "DEFAULT_STATES",
    "TASK_TITLE_PREFIX",
    "BindableBoard",
    "Board",
    "BoardIssue",
    "BoardReport",
    "BoardState",
    "GiveUpBoard",
    "InMemoryBoard",
    "JsonFileBoard",
    "ReportingBoard",
    "Tracker",
    "task_key",
]

TASK_TITLE_PREFIX = "board:"
_MAX_ID = 200

_ID = checked(f"a non-empty string of at most {_MAX_ID} characters", non_blank, max_len(_MAX_ID))
_TEXT = checked("a string", instance_of(str))
_NAME = checked(
    f"None or a non-empty string of at most {_MAX_ID} characters",
    optional([non_blank, max_len(_MAX_ID)]),
)


# At most this many adapters in an issue's order (`BoardIssue.adapters`).
MAX_ADAPTERS = 16


def adapter_order(value: object, field: str = "adapters") -> tuple[str, ...]:
    """An ordered list of adapter names (issue #46's announced fallback: the first is tried
    first): each a non-empty name of at most 400 characters, no name twice, at most 16.
    Raises InvalidInput naming `field`."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidInput(f"{field} must be a list of adapter names, got {value!r}", field=field)
    names = tuple(value)
    if len(names) > MAX_ADAPTERS:
        raise InvalidInput(
            f"{field} must name at most {MAX_ADAPTERS} adapters, got {len(names)}", field=field
        )
    for name in names:
        if not isinstance(name, str) or not name.strip() or len(name) > _MAX_ID:
            raise InvalidInput(
                f"{field}: {name!r} is not an adapter name (a non-empty string of at most "
                f"{_MAX_ID} characters)",
                field=field,
            )
    if len(set(names)) != len(names):
        raise InvalidInput(f"{field} names an adapter twice: {list(names)}", field=field)
    return names


def task_key(issue_id: str) -> str:
    """The ledger idempotency key (and task title) of a board issue: `board:<id>`."""
    return f"{TASK_TITLE_PREFIX}{issue_id}"


# Workspace names (`workspace_name`, issue #46): a plain issue id as it is, else its plain
# characters and a hash of the whole id.
_NAME_MAX = 80
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# The suffix a hashed name ends with: an id that already looks like one is hashed too, so
# an id used as it is can never be the hashed name of another.
_HASHED = re.compile(r".*-[0-9a-f]{16}")


def workspace_name(issue_id: str) -> str:
    """The folder (and branch) name of an issue's workspace: the id itself when it is a
    plain name (letters, digits, `.`, `_`, `-`; no `..`, no `.lock` end, at most 80
    characters), else its plain characters with a hash of the whole id appended, so two
    issue ids never share a name. Raises InvalidInput for an empty id."""
    if not isinstance(issue_id, str) or not issue_id:
        raise InvalidInput("issue id must be a non-empty string", field="issue_id")
    plain = (
        _SAFE.fullmatch(issue_id) is not None
        and len(issue_id) <= _NAME_MAX
        and ".." not in issue_id
        and not issue_id.endswith((".lock", "."))
        and _HASHED.fullmatch(issue_id) is None
    )
    if plain:
        return issue_id
    kept = re.sub(r"[^A-Za-z0-9._-]+", "_", issue_id).strip("._-").replace("..", "_")
    digest = hashlib.sha256(issue_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{kept[:40] or 'issue'}-{digest}"


_MAX_BOARD_BYTES = 64 * 1024 * 1024
_MAX_NESTING = 64


# A JSON string (an unterminated one runs to the end of the text), and what is not a bracket.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def _nesting(text: str) -> int:
    """How deep `[`/`{` nest in a JSON text (strings skipped). The strings and everything
    but the brackets are removed by two regular-expression passes first, so the loop
    below walks only the brackets (a 200,000-issue board has a few hundred thousand of its
    several million characters)."""
    brackets = _NOT_BRACKETS.sub("", _JSON_STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_nul(_inst: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for index, arg in enumerate(value):
        if "\0" in arg:
            raise InvalidInput(
                f"argv[{index}] must not contain a NUL character", field=attribute.name
            )


def _redacted(text: str) -> str:
    from execkit._redact import redact  # only a board that reports loads the redactor

    return redact(text)


def _redacted_lines(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(_redacted(line) for line in lines)


def _to_argv(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        # A bare string would be split into characters; say so instead.
        raise InvalidInput(
            f"argv must be a list of strings, not a single string: {value!r}", field="argv"
        )
    return tuple(value)


@attrs.frozen
class BoardState:
    """A column of a board. Eligible states are dispatched from; terminal ones never are."""

    name: str = attrs.field(validator=_ID)
    eligible: bool = False
    terminal: bool = False

    def __attrs_post_init__(self) -> None:
        if self.eligible and self.terminal:
            raise InvalidInput(
                f"state {self.name!r} cannot be both eligible and terminal", field="eligible"
            )


@attrs.frozen
class BoardIssue:
    """One issue on a board.

    `prompt` is what the agent is asked (a board's `body`); `argv`, when given, is the
    command the runner starts for this issue (the `generic` adapter's program and flags;
    a vendor adapter's extra arguments). `adapter` names the agent CLI this issue runs on
    (None: the dispatcher's default, `DispatchConfig.default_adapter`) and `model` the
    model it asks for (None: the CLI's own default). `adapters` (issue #46) names the
    adapters the issue may run on, in order, instead of `adapter`: when the first's vendor
    lane is parked, cooling or stopped, the dispatcher runs it on the next open one and says
    so (never after a `work` failure). `given_up_from` is the column a
    dispatcher gave the issue up from (`GiveUpBoard.give_up`): where it moves the card
    back when an operator lets its task run again, also after a restart; any other move
    clears it.
    """

    id: str = attrs.field(validator=_ID)
    title: str = attrs.field(validator=_TEXT)
    state: str = attrs.field(validator=_ID)
    prompt: str = attrs.field(default="", validator=_TEXT)
    argv: tuple[str, ...] = attrs.field(
        default=(),
        converter=_to_argv,
        validator=[checked("a list of only strings", deep_iterable(instance_of(str))), _no_nul],
    )
    adapter: str | None = attrs.field(default=None, validator=_NAME)
    model: str | None = attrs.field(default=None, validator=_NAME)
    given_up_from: str | None = attrs.field(default=None, validator=_NAME)
    # Issue #45: the task's own spend cap, set on the task the dispatcher makes for it
    # (when the task has none yet): USD > 0 and/or tokens >= 1.
    budget_usd: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number > 0 (USD)", finite, gt(0))
    )
    budget_tokens: int | None = attrs.field(
        default=None, validator=opt_checked("an integer >= 1", integer, ge(1))
    )
    adapters: tuple[str, ...] = attrs.field(default=(), converter=adapter_order)

    def __attrs_post_init__(self) -> None:
        if self.adapters and self.adapter is not None:
            raise InvalidInput(
                "give either adapter or adapters (an order whose first is tried first), not both",
                field="adapters",
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape; `adapter`, `model`, `given_up_from`, the budget and `adapters`
        only when set (a board written before they existed reads and writes back the same)."""
        doc = to_json(self)
        for key in ("adapter", "model", "given_up_from", "budget_usd", "budget_tokens"):
            if doc[key] is None:
                del doc[key]
        if not doc["adapters"]:
            del doc["adapters"]
        return doc


@runtime_checkable
class Tracker(Protocol):
    """What the dispatcher needs of a board.

    `move` returns False (or raises `UnsupportedMove`) when the board has no such state or
    refuses the transition; the dispatcher then keeps the issue where it is.
    """

    def list_candidates(self) -> list[BoardIssue]: ...

    def move(self, issue_id: str, state: str) -> bool: ...


@runtime_checkable
class Board(Tracker, Protocol):
    """A tracker that can also list every issue (for the status table)."""

    def list_issues(self) -> list[BoardIssue]: ...


@runtime_checkable
class GiveUpBoard(Protocol):
    """A board that keeps, on the issue itself, the column a dispatcher gave it up from
    (`BoardIssue.given_up_from`), so that a restarted dispatcher, or another one, can still
    bring the card back when an operator lets its task run again."""

    def give_up(self, issue_id: str, state: str) -> bool:
        """Move the issue to terminal `state` and record the column it stood in as its
        `given_up_from`; False (nothing changed) for an unknown issue or state."""
        ...


@runtime_checkable
class BindableBoard(Protocol):
    """A board that remembers which ledger dispatched it, so that a status table is never
    read from the wrong one (a table of blanks for issues that ledger has never seen)."""

    def ledger_binding(self) -> tuple[str, str] | None: ...

    def bind_ledger(self, ledger_id: str, location: str) -> None: ...


@attrs.frozen(kw_only=True)
class BoardReport:
    """What the dispatcher tells a board that shows its work (`ReportingBoard`) about one
    issue: the claim while an agent runs (`running`, the `host` and `attempt`), and after
    each run what came of it (`status`, the `failure_class` and `reason` of a failure,
    the `fix` to make for an environment failure, where the card was moved, when the next
    attempt is due). `lines` are further lines to show ("fell back", "resumed"), `spend`
    what the run cost when it is known. Text is redacted on construction."""

    attempt: int
    running: bool = False
    host: str | None = None
    max_attempts: int | None = None
    status: str | None = None
    failure_class: str | None = None
    reason: str | None = attrs.field(default=None, converter=attrs.converters.optional(_redacted))
    fix: str | None = attrs.field(default=None, converter=attrs.converters.optional(_redacted))
    moved_to: str | None = None
    next_attempt_at: float | None = None
    lines: tuple[str, ...] = attrs.field(default=(), converter=_redacted_lines)
    spend: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


@runtime_checkable
class ReportingBoard(Protocol):
    """A board that shows the dispatcher's work on its issues (a tracker's labels and
    status comment). `report` records what an issue must show and returns at once (a
    tracker board records it in the ledger's outbox: nothing is lost if the tracker is
    down); `catch_up` sends what is recorded and not shown yet, once per pass, and never
    raises for one issue's failed write (it is retried at a later pass)."""

    def report(self, issue_id: str, report: BoardReport) -> None: ...

    def catch_up(self) -> None: ...


def _duplicates(values: Iterable[str]) -> list[str]:
    return sorted(value for value, seen in Counter(values).items() if seen > 1)


def _check_board(states: Sequence[BoardState], issues: Sequence[BoardIssue]) -> None:
    # Runs on every read of a board file (each pass reads it): linear, not quadratic.
    names = [s.name for s in states]
    duplicates = _duplicates(names)
    if duplicates:
        raise InvalidInput(f"states: duplicate state names {duplicates}", field="states")
    if not any(s.eligible for s in states):
        raise InvalidInput("states: at least one state must be eligible", field="states")
    duplicate_ids = _duplicates(i.id for i in issues)
    if duplicate_ids:
        raise InvalidInput(f"issues: duplicate issue ids {duplicate_ids}", field="issues")
    known = set(names)
    for issue in issues:
        if issue.state not in known:
            raise InvalidInput(
                f"issues: issue {issue.id!r} is in unknown state {issue.state!r}; "
                f"states are {', '.join(names)}",
                field="issues",
            )


DEFAULT_STATES = (
    BoardState("todo", eligible=True),
    BoardState("done", terminal=True),
    BoardState("blocked", terminal=True),
)


class InMemoryBoard:
    """A board held in memory (tests, embedding). Not shared between processes."""

    def __init__(
        self,
        issues: Iterable[BoardIssue] = (),
        states: Iterable[BoardState] = DEFAULT_STATES,
    ) -> None:
        self._states = tuple(states)
        issue_list = list(issues)
        _check_board(self._states, issue_list)
        self._issues = {issue.id: issue for issue in issue_list}
        self._lock = threading.Lock()
        self.moves: list[tuple[str, str]] = []

    @property
    def states(self) -> tuple[BoardState, ...]:
        return self._states

    def add(self, issue: BoardIssue) -> None:
        """Add an issue (InvalidInput for a duplicate id or an unknown state)."""
        with self._lock:
            if issue.id in self._issues:
                raise InvalidInput(f"issues: duplicate issue ids [{issue.id!r}]", field="issues")
            _check_board(self._states, [issue])
            self._issues[issue.id] = issue

    def get(self, issue_id: str) -> BoardIssue:
        with self._lock:
            try:
                return self._issues[issue_id]
            except KeyError:
                raise NotFound(f"no issue {issue_id!r} on the board") from None

    def list_issues(self) -> list[BoardIssue]:
        with self._lock:
            return list(self._issues.values())

    def list_candidates(self) -> list[BoardIssue]:
        eligible = {s.name for s in self._states if s.eligible}
        return [i for i in self.list_issues() if i.state in eligible]

    def move(self, issue_id: str, state: str) -> bool:
        with self._lock:
            issue = self._issues.get(issue_id)
            if issue is None or state not in {s.name for s in self._states}:
                return False
            self._issues[issue_id] = attrs.evolve(issue, state=state, given_up_from=None)
            self.moves.append((issue_id, state))
            return True

    def give_up(self, issue_id: str, state: str) -> bool:
        # Through `move`, so a board that refuses a move (a subclass) refuses this too.
        origin = self._issues[issue_id].state if issue_id in self._issues else None
        if not self.move(issue_id, state):
            return False
        with self._lock:
            moved = self._issues[issue_id]
            self._issues[issue_id] = attrs.evolve(moved, given_up_from=origin)
        return True


def _state_from_json(index: int, raw: object) -> BoardState:
    where = f"states[{index}]"
    if isinstance(raw, str):
        return BoardState(raw)
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where}: must be a state name or an object, got {raw!r}", field=where)
    unknown = set(raw) - {"name", "eligible", "terminal"}
    if unknown:
        raise InvalidInput(
            f"{where}: unknown keys {sorted(unknown)}; allowed: name, eligible, terminal",
            field=where,
        )
    for flag in ("eligible", "terminal"):
        if not isinstance(raw.get(flag, False), bool):
            raise InvalidInput(
                f"{where}.{flag}: must be true or false, got {raw[flag]!r}", field=f"{where}.{flag}"
            )
    try:
        return BoardState(
            raw.get("name"),  # type: ignore[arg-type]  # validated by BoardState
            eligible=raw.get("eligible", False),
            terminal=raw.get("terminal", False),
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}", field=f"{where}.{exc.field}") from None


def _issue_from_json(index: int, raw: object) -> BoardIssue:
    where = f"issues[{index}]"
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where}: must be an object, got {raw!r}", field=where)
    allowed = {
        *("id", "title", "state", "prompt", "body", "argv", "adapter", "model"),
        *("given_up_from", "budget_usd", "budget_tokens", "adapters"),
    }
    unknown = set(raw) - allowed
    if unknown:
        raise InvalidInput(
            f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}", field=where
        )
    if "adapters" in raw and ("adapter" in raw or raw["adapters"] == []):
        said = "not both adapter and adapters" if "adapter" in raw else "at least one adapter"
        raise InvalidInput(
            f"{where}.adapters: an order of adapters, the first tried first: {said}",
            field=f"{where}.adapters",
        )
    argv = raw.get("argv", [])
    if not isinstance(argv, list):
        raise InvalidInput(
            f"{where}.argv: must be a list of strings, got {argv!r}", field=f"{where}.argv"
        )
    try:
        return BoardIssue(
            # Each value is validated by BoardIssue, naming the field.
            id=raw.get("id", ""),
            title=raw.get("title", ""),
            state=raw.get("state", ""),
            prompt=raw.get("prompt", raw.get("body", "")),
            argv=argv,
            adapter=raw.get("adapter"),
            model=raw.get("model"),
            given_up_from=raw.get("given_up_from"),
            budget_usd=raw.get("budget_usd"),
            budget_tokens=raw.get("budget_tokens"),
            adapters=raw.get("adapters", ()),
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}", field=f"{where}.{exc.field}") from None


@attrs.frozen
class _BoardDoc:
    states: tuple[BoardState, ...]
    issues: tuple[BoardIssue, ...]
    dispatch: Mapping[str, Any]
    raw: dict[str, Any]


# What tells one version of a board file from another: a move or a binding replaces the
# file (a new inode); an edit in place changes its size, mtime or ctime.
_Version = tuple[int, int, int, int, int]


def _read_regular_file(
    path: Path, limit: int, known: _Version | None = None
) -> tuple[_Version, bytes | None] | None:
    """(its version, at most `limit` bytes) of the regular file at `path`; its version and
    None when that is `known` (nothing read); None when it is not a regular file. Opened
    without blocking (a FIFO with no writer would block `open` itself, and one written
    forever would block a read), its type checked on the open descriptor, so a file
    swapped in after a check cannot slip past it. OSError as raised (FileNotFoundError,
    IsADirectoryError, ...)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(info.st_mode):
            return None
        version = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        if version == known:
            return version, None
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            chunk = os.read(fd, min(1 << 20, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return version, b"".join(chunks)
    finally:
        os.close(fd)


class JsonFileBoard:
    """A board kept in one JSON file, re-read on every call so an operator's edits count.

    The file is `{"states": [...], "issues": [...], "dispatch": {...}}`: a state is a name
    or `{"name", "eligible", "terminal"}`; an issue is `{"id", "title", "state", "prompt"
    (or "body"), "argv", "adapter", "model", "given_up_from"}` (the last written by a
    dispatcher's give-up, `give_up`, and removed by any other move); the optional
    `dispatch` object holds `DispatchConfig` settings, the optional `workspace` object the
    workspace hooks (`WorkspaceHooks`).
    Moves take an exclusive lock on a sidecar `FILE.lock` and replace the file atomically
    (temp file + `os.replace`), so two dispatcher processes never lose each other's moves
    and a reader never sees half a file. A move edits the file's text, not a re-encoding
    of it: only the moved issue's `state` and `given_up_from` change; the layout, the key
    order, the escapes and unknown keys are the author's. The ledger that dispatched the
    board is recorded beside it, in `FILE.ledger` (`bind_ledger`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # The last document read and the file version it came from: a board is read for
        # its states, its candidates, its settings and its binding in one command, and a
        # 200,000-issue file costs seconds to parse and check; an unchanged file is
        # parsed once. Writers read it fresh (they change `raw`).
        self._cached: tuple[_Version, _BoardDoc] | None = None
        self._read()  # fail early, naming the field, on a bad file

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        issues: Iterable[BoardIssue],
        states: Iterable[BoardState] = DEFAULT_STATES,
        dispatch: Mapping[str, Any] | None = None,
    ) -> JsonFileBoard:
        """Write a new board file (replacing any) and open it."""
        state_list, issue_list = list(states), list(issues)
        _check_board(state_list, issue_list)
        doc: dict[str, Any] = {
            "states": [
                {"name": s.name, "eligible": s.eligible, "terminal": s.terminal} for s in state_list
            ],
            "issues": [i.to_dict() for i in issue_list],
        }
        if dispatch:
            doc["dispatch"] = dict(dispatch)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(target, doc)
        return cls(target)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        # O_NONBLOCK: a FIFO put where the lock file goes fails to open (ENXIO) instead
        # of waiting for a reader forever.
        # An OSError is the caller's to word ("cannot write board file ...").
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(lock_path, flags, 0o666)
        with os.fdopen(fd, "a") as lock:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StorageError(
                    f"cannot write board file {self.path}: its lock file {lock_path} is not "
                    "a regular file"
                )
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _fetch(self, known: _Version | None) -> tuple[_Version, bytes | None]:
        """The file's version and bytes (None when its version is `known`), or the error
        a reader gets, naming the file."""
        try:
            found = _read_regular_file(self.path, _MAX_BOARD_BYTES + 1, known)
        except FileNotFoundError:
            raise NotFound(f"no board file at {self.path}") from None
        except IsADirectoryError:
            raise InvalidInput(f"board file {self.path} is a directory", field="board") from None
        except OSError as exc:
            raise StorageError(f"cannot read board file {self.path}: {exc}") from exc
        if found is None:
            raise InvalidInput(
                f"board file {self.path} is not a regular file (a FIFO, a device or a "
                "socket): a board must be a JSON file",
                field="board",
            )
        return found

    def _read(self) -> _BoardDoc:
        cached = self._cached
        version, data = self._fetch(cached[0] if cached else None)
        if data is None:
            assert cached is not None  # only a known version reads nothing
            return cached[1]
        doc = self._parse(self._decode(data))
        self._cached = (version, doc)
        return doc

    def _read_fresh(self) -> tuple[str, _BoardDoc]:
        """The file's text and its document, read now (for a writer, under the lock)."""
        _version, data = self._fetch(None)
        assert data is not None  # nothing is known: the file is read
        text = self._decode(data)
        return text, self._parse(text)

    def _decode(self, data: bytes) -> str:
        if len(data) > _MAX_BOARD_BYTES:
            raise InvalidInput(
                f"board file {self.path} is {len(data)} bytes; at most {_MAX_BOARD_BYTES}",
                field="board",
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"board file {self.path} is not UTF-8 text (byte {exc.start})", field="board"
            ) from None

    def _parse(self, text: str) -> _BoardDoc:
        if _nesting(text) > _MAX_NESTING:
            # json.loads recurses: a 100,000-deep file would end in RecursionError.
            raise InvalidInput(
                f"board file {self.path} nests deeper than {_MAX_NESTING} levels", field="board"
            )
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(
                f"board file {self.path} is not valid JSON: {exc}", field="board"
            ) from None
        if not isinstance(raw, dict):
            raise InvalidInput(
                f"board file {self.path}: the top level must be an object", field="board"
            )
        states_raw, issues_raw = raw.get("states"), raw.get("issues", [])
        if not isinstance(states_raw, list) or not states_raw:
            raise InvalidInput(
                f"board file {self.path}: `states` must be a non-empty list", field="states"
            )
        if not isinstance(issues_raw, list):
            raise InvalidInput(f"board file {self.path}: `issues` must be a list", field="issues")
        dispatch = raw.get("dispatch", {})
        if not isinstance(dispatch, dict):
            raise InvalidInput(
                f"board file {self.path}: `dispatch` must be an object", field="dispatch"
            )
        try:
            states = tuple(_state_from_json(n, s) for n, s in enumerate(states_raw))
            issues = tuple(_issue_from_json(n, i) for n, i in enumerate(issues_raw))
            _check_board(states, issues)
        except InvalidInput as exc:
            raise InvalidInput(f"board file {self.path}: {exc.message}", field=exc.field) from None
        return _BoardDoc(states, issues, dispatch, raw)

    @property
    def states(self) -> tuple[BoardState, ...]:
        return self._read().states

    def dispatch_settings(self) -> dict[str, Any]:
        """The file's `dispatch` object (for `DispatchConfig.from_mapping`), or {}."""
        return dict(self._read().dispatch)

    def workspace_settings(self) -> dict[str, Any]:
        """The file's `workspace` object (the workspace hooks, for
        `WorkspaceHooks.from_mapping`), or {}; InvalidInput when it is not an object."""
        raw = self._read().raw.get("workspace", {})
        if not isinstance(raw, dict):
            raise InvalidInput(
                f"board file {self.path}: `workspace` must be an object", field="workspace"
            )
        return dict(raw)

    def list_issues(self) -> list[BoardIssue]:
        return list(self._read().issues)

    def list_candidates(self) -> list[BoardIssue]:
        doc = self._read()
        eligible = {s.name for s in doc.states if s.eligible}
        return [i for i in doc.issues if i.state in eligible]

    def ensure_private(self) -> None:
        """Refuse a board file that someone else could write (Forbidden), as ssh refuses a
        key others can write: its `argv` are commands the dispatcher runs as itself.

        The file must belong to this user (or root) and not be writable by group or others;
        the same for its folder, unless that folder is sticky (like /tmp: others cannot
        replace a file they do not own there)."""
        me = os.geteuid()
        for target, is_folder in ((self.path, False), (self.path.resolve().parent, True)):
            try:
                info = target.stat()
            except OSError as exc:
                raise StorageError(f"cannot inspect {target}: {exc}") from exc
            what = "the folder of board file" if is_folder else "board file"
            if info.st_uid not in (me, 0):
                raise Forbidden(
                    f"{what} {self.path} belongs to another user (uid {info.st_uid}); its "
                    "commands would run as you: refusing to dispatch it"
                )
            writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if writable and not (is_folder and info.st_mode & stat.S_ISVTX):
                raise Forbidden(
                    f"{what} {self.path} can be written by others (mode "
                    f"{stat.S_IMODE(info.st_mode):o}); its commands would run as you: "
                    f"`chmod go-w {target}` to dispatch it"
                )

    @property
    def binding_path(self) -> Path:
        """Where the ledger that dispatched this board is recorded: `FILE.ledger`, beside
        the board, so the board file stays as its author wrote it."""
        return self.path.with_name(self.path.name + ".ledger")

    def ledger_binding(self) -> tuple[str, str] | None:
        """(ledger id, where it was) of the ledger that dispatched this board, or None:
        the board's own `ledger` key when it is an object (a board bound before the
        binding moved beside it, or bound by hand), else `FILE.ledger`. InvalidInput for
        either when it is not `{"id": str, "location": str}`."""
        inside = self._read().raw.get("ledger")
        if isinstance(inside, Mapping):
            return self._binding_of(inside, f"board file {self.path}: `ledger`")
        return self._read_binding_file()

    def _binding_of(self, bound: Mapping[str, Any], where: str) -> tuple[str, str]:
        ledger_id, location = bound.get("id"), bound.get("location")
        if not isinstance(ledger_id, str) or not isinstance(location, str):
            raise InvalidInput(f'{where} must be {{"id": str, "location": str}}', field="ledger")
        return ledger_id, location

    def _read_binding_file(self) -> tuple[str, str] | None:
        where = self.binding_path
        try:
            found = _read_regular_file(where, _MAX_BINDING_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {where}: {exc}") from exc
        bound: object = None
        if found is not None and found[1] is not None and len(found[1]) <= _MAX_BINDING_BYTES:
            with suppress(ValueError):  # UnicodeDecodeError is a ValueError too
                bound = json.loads(found[1].decode("utf-8"))
        what = f"{where} (the ledger that dispatched board {self.path.name})"
        if not isinstance(bound, Mapping):
            raise InvalidInput(
                f'{what} must be a JSON object {{"id": str, "location": str}}; delete it to '
                "bind the board afresh",
                field="ledger",
            )
        return self._binding_of(bound, what)

    def bind_ledger(self, ledger_id: str, location: str) -> None:
        """Record the ledger dispatching this board (written once, under the file lock) in
        `FILE.ledger` beside it: the board file itself is not changed.

        Conflict when the board already belongs to another ledger (its own `ledger` key,
        else `FILE.ledger`): dispatching it from two ledgers would split its history in
        two.
        """
        try:
            with self._locked():
                _text, doc = self._read_fresh()
                inside = doc.raw.get("ledger")
                bound: tuple[str, str] | None
                if isinstance(inside, Mapping):
                    bound = self._binding_of(inside, f"board file {self.path}: `ledger`")
                    undo = "delete the board's `ledger` key"
                else:
                    bound = self._read_binding_file()
                    undo = f"delete {self.binding_path}"
                if bound is not None and bound[0] == ledger_id:
                    return
                if bound is not None:
                    raise Conflict(
                        f"board file {self.path} belongs to ledger {bound[0]} at "
                        f"{bound[1]}; dispatch it with that ledger (--db), or {undo} to move "
                        "it to a new one"
                    )
                record = {"id": ledger_id, "location": location}
                _write_text_atomic(self.binding_path, json.dumps(record, indent=2) + "\n")
        except OSError as exc:
            raise StorageError(f"cannot write board file {self.path}: {exc}") from exc

    def move(self, issue_id: str, state: str) -> bool:
        """Move one issue (and drop its `given_up_from`); False for an unknown issue or
        state. ExecKitError naming the file when it cannot be written."""
        return self._move(issue_id, state, given_up=False)

    def give_up(self, issue_id: str, state: str) -> bool:
        """Move one issue to `state`, writing the column it stood in as its
        `given_up_from` (see `GiveUpBoard`); otherwise as `move`."""
        return self._move(issue_id, state, given_up=True)

    def _move(self, issue_id: str, state: str, *, given_up: bool) -> bool:
        """The move as an edit of the file's text: the issue's `state` value replaced, its
        `given_up_from` written beside it or taken out; every other byte of the file is
        kept (its layout, key order, escapes and unknown keys are its author's)."""
        try:
            with self._locked():
                text, doc = self._read_fresh()
                if state not in {s.name for s in doc.states}:
                    return False
                issues = doc.raw.get("issues", [])
                index = next((n for n, i in enumerate(issues) if i.get("id") == issue_id), None)
                if index is None:
                    return False
                origin = issues[index].get("state") if given_up else None
                _write_text_atomic(self.path, _edit_issue(text, index, state, origin))
                return True
        except OSError as exc:
            raise StorageError(f"cannot write board file {self.path}: {exc}") from exc


# A binding file is a line of JSON; anything much longer is not one.
_MAX_BINDING_BYTES = 64 * 1024

# A move edits the board's text where its values are, found by walking the text (already
# parsed, so well formed): JSON whitespace, strings, and any other value through the
# decoder's C scanner, which returns where the value ends.
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_DECODER = json.JSONDecoder()


@attrs.frozen
class _Member:
    """Where one `"key": value` member of an object is in a text."""

    key: str
    start: int  # the key's opening quote
    key_end: int  # after the key's closing quote
    value_start: int
    value_end: int


def _skip(text: str, at: int) -> int:
    match = _WHITESPACE.match(text, at)
    assert match is not None  # `*`: it always matches
    return match.end()


def _value_end(text: str, at: int) -> int:
    if text[at] == '"':
        match = _STRING.match(text, at)
        assert match is not None
        return match.end()
    _value, end = _DECODER.raw_decode(text, at)
    return end


def _members(text: str, at: int) -> list[_Member]:
    """The members of the object whose `{` is at `at`, in the order written."""
    members: list[_Member] = []
    at = _skip(text, at + 1)
    while text[at] != "}":
        key = _STRING.match(text, at)
        assert key is not None
        value_start = _skip(text, _skip(text, key.end()) + 1)  # past the colon
        value_end = _value_end(text, value_start)
        members.append(_Member(json.loads(key.group()), at, key.end(), value_start, value_end))
        at = _skip(text, value_end)
        if text[at] == ",":
            at = _skip(text, at + 1)
    return members


def _element(text: str, at: int, wanted: int) -> int:
    """Where element `wanted` of the array whose `[` is at `at` starts."""
    at = _skip(text, at + 1)
    for _ in range(wanted):
        at = _skip(text, _skip(text, _value_end(text, at)) + 1)  # past the comma
    return at


def _last(members: Sequence[_Member], key: str) -> _Member | None:
    # Of two members with one name, JSON parsers (and so the board) keep the last.
    found = [member for member in members if member.key == key]
    return found[-1] if found else None


def _edit_issue(text: str, index: int, state: str, origin: str | None) -> str:
    """`text` with issue `index` moved to `state`: its `state` value replaced; with an
    `origin`, `given_up_from` set to it (beside the state, in the object's own spacing),
    else every `given_up_from` member taken out. Nothing else of the text changes."""
    issues = _last(_members(text, _skip(text, 0)), "issues")
    assert issues is not None  # the issue was found in the parsed document
    members = _members(text, _element(text, issues.value_start, index))
    # A file written in ASCII (non-ASCII text as \u escapes) stays so.
    ascii_only = text.isascii()

    def set_to(key: str, value: str) -> list[tuple[int, int, str]]:
        # A value that is already `value` keeps its author's spelling.
        return [
            (m.value_start, m.value_end, json.dumps(value, ensure_ascii=ascii_only))
            for m in members
            if m.key == key and json.loads(text[m.value_start : m.value_end]) != value
        ]

    edits = set_to("state", state)
    given = {n for n, m in enumerate(members) if m.key == "given_up_from"}
    if origin is None:
        edits += _removals(members, given)
    elif given:
        edits += set_to("given_up_from", origin)
    else:
        value = json.dumps(origin, ensure_ascii=ascii_only)
        edits.append(_inserted_beside(text, members, "given_up_from", value))
    for start, end, new in sorted(edits, reverse=True):  # from the end: offsets hold
        text = text[:start] + new + text[end:]
    return text


def _inserted_beside(
    text: str, members: Sequence[_Member], key: str, value: str
) -> tuple[int, int, str]:
    """The edit that adds `key: value` right after the (last) `state` member, with the
    separator and the colon that member is written with."""
    state = _last(members, "state")
    assert state is not None  # a parsed issue has a state
    n = members.index(state)
    if n > 0:
        separator = text[members[n - 1].value_end : state.start]
    else:  # the first member: the separator after it (an issue has an id too)
        separator = text[state.value_end : members[n + 1].start]
    colon = text[state.key_end : state.value_start]
    return state.value_end, state.value_end, f'{separator}"{key}"{colon}{value}'


def _removals(members: Sequence[_Member], gone: set[int]) -> list[tuple[int, int, str]]:
    """The edits that take out the members numbered `gone`, each with the separator
    before it (leading ones with the separator after them); never all of them (an issue
    keeps its id and state)."""
    lead = 0
    while lead in gone:
        lead += 1
    edits = [(members[0].start, members[lead].start, "")] if lead else []
    edits += [(members[n - 1].value_end, members[n].value_end, "") for n in gone if n > lead]
    return edits


def _write_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    """Write `doc` as a new board file at `path` (indented JSON), as `_write_text_atomic`."""
    _write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


def _write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so a reader sees the old file or the new one, never half.

    The new file keeps the old one's permission bits (a board shared by a team must not
    turn private on the dispatcher's first move); a new file gets the umask's.
    """
    import secrets  # only a board that is written needs it (`status` reads one)

    try:
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    # O_EXCL: never write through a file or link that someone else put at this name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
