"""Boards: the trackers the dispatcher reads issues from and moves them on.

A board lists issues in states (columns); eligible states are dispatched from, terminal
ones never are. `InMemoryBoard` is for tests and embedding; `JsonFileBoard` keeps a board
in one JSON file an operator can edit (its format is in docs/formats.md). Each issue maps to
one ledger task whose idempotency key (and title) is `task_key(issue_id)`.
"""

from __future__ import annotations

import errno
import fcntl
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
from attrs.validators import deep_iterable, instance_of, max_len, optional

from execkit._errors import Conflict, Forbidden, InvalidInput, NotFound, StorageError
from execkit._json import to_json
from execkit._validate import checked, non_blank

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


def task_key(issue_id: str) -> str:
    """The ledger idempotency key (and task title) of a board issue: `board:<id>`."""
    return f"{TASK_TITLE_PREFIX}{issue_id}"


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
    model it asks for (None: the CLI's own default). `given_up_from` is the column a
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

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape; `adapter`, `model` and `given_up_from` only when set (a board
        written before they existed reads and writes back the same)."""
        doc = to_json(self)
        for key in ("adapter", "model", "given_up_from"):
            if doc[key] is None:
                del doc[key]
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
        "given_up_from",
    }
    unknown = set(raw) - allowed
    if unknown:
        raise InvalidInput(
            f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}", field=where
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
    `dispatch` object holds `DispatchConfig` settings.
    Moves take an exclusive lock on a sidecar `FILE.lock` and replace the file atomically
    (temp file + `os.replace`), so two dispatcher processes never lose each other's moves
    and a reader never sees half a file. Unknown keys are kept on rewrite.
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

    def _read(self, *, fresh: bool = False) -> _BoardDoc:
        cached = None if fresh else self._cached
        try:
            found = _read_regular_file(
                self.path, _MAX_BOARD_BYTES + 1, cached[0] if cached else None
            )
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
        version, data = found
        if data is None:
            assert cached is not None  # only a known version reads nothing
            return cached[1]
        doc = self._parse(data)
        if not fresh:
            self._cached = (version, doc)
        return doc

    def _parse(self, data: bytes) -> _BoardDoc:
        if len(data) > _MAX_BOARD_BYTES:
            raise InvalidInput(
                f"board file {self.path} is {len(data)} bytes; at most {_MAX_BOARD_BYTES}",
                field="board",
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"board file {self.path} is not UTF-8 text (byte {exc.start})", field="board"
            ) from None
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

    def ledger_binding(self) -> tuple[str, str] | None:
        """(ledger id, where it was) of the ledger that dispatched this board, or None."""
        bound = self._read().raw.get("ledger")
        if not isinstance(bound, Mapping):
            return None
        ledger_id, location = bound.get("id"), bound.get("location")
        if not isinstance(ledger_id, str) or not isinstance(location, str):
            raise InvalidInput(
                f'board file {self.path}: `ledger` must be {{"id": str, "location": str}}',
                field="ledger",
            )
        return ledger_id, location

    def bind_ledger(self, ledger_id: str, location: str) -> None:
        """Record the ledger dispatching this board (written once, under the file lock).

        Conflict when the board already belongs to another ledger: dispatching it from
        two ledgers would split its history in two.
        """
        try:
            with self._locked():
                doc = self._read(fresh=True)
                bound = doc.raw.get("ledger")
                if isinstance(bound, Mapping) and bound.get("id") == ledger_id:
                    return
                if isinstance(bound, Mapping) and bound.get("id"):
                    raise Conflict(
                        f"board file {self.path} belongs to ledger {bound.get('id')} at "
                        f"{bound.get('location')}; dispatch it with that ledger (--db), or "
                        "delete its `ledger` key to move it to a new one"
                    )
                doc.raw["ledger"] = {"id": ledger_id, "location": location}
                _write_atomic(self.path, doc.raw)
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
        try:
            with self._locked():
                doc = self._read(fresh=True)
                if state not in {s.name for s in doc.states}:
                    return False
                for raw_issue in doc.raw.get("issues", []):
                    if raw_issue.get("id") == issue_id:
                        if given_up:
                            raw_issue["given_up_from"] = raw_issue.get("state")
                        else:
                            raw_issue.pop("given_up_from", None)
                        raw_issue["state"] = state
                        break
                else:
                    return False
                _write_atomic(self.path, doc.raw)
                return True
        except OSError as exc:
            raise StorageError(f"cannot write board file {self.path}: {exc}") from exc


def _write_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    """Replace `path` with `doc` so a reader sees the old file or the new one, never half.

    The new file keeps the old one's permission bits (a board shared by a team must not
    turn private on the dispatcher's first move); a new board gets the umask's.
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
            json.dump(doc, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
