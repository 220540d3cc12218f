"""The dispatcher (ADR 015, ADR 0033's orchestrator part): bounded retries over a board.

A board (`Tracker`) lists eligible issues and moves them between states. Each issue maps to
one ledger task (`idempotency_key=f"board:{issue_id}"`), and each dispatch is one ledger run:
`start_run` (the single place that refuses), the `Runner`, then `finish_run`. The
dispatcher keeps no retry counters of its own: attempt numbers, charged counts, the uncharged
streak and the backoff are all read back from the ledger's history, so a restarted
dispatcher (or a second one over the same ledger) sees exactly what the first one saw.

After a failure the ledger's decision says what happens next:

- backoff: the issue is skipped until `next_attempt_at`.
- blocked on environment, upstream, work or the dispatch cap: the dispatcher gives up and
  moves the issue to `DispatchConfig.failed_state`, so it leaves the eligible set and shows
  on the board. When that move is unavailable (no failed state configured, the board has no
  such state, or it refuses), a WARNING naming the issue and the state is logged at every
  exhaustion (once per attempt count) and the legacy behaviour is kept: the issue stays
  eligible, and for the dispatch cap the dispatcher keeps retrying past it rather than
  strand the issue (ADR 015's "never strand").
- blocked on `attempt_limit` (an explicit task limit, ADR 0033): the issue is NOT moved; it
  stays in progress and is reported as `attempt_limit` until an operator raises the limit,
  when scheduling resumes with the same task and history.

A success moves the issue to `DispatchConfig.done_state`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import secrets
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol, TypeGuard, runtime_checkable

import attrs

from adapters.base import Adapter, AgentRequest
from execkit.agent import AgentFailed, run_agent
from execkit.budget import Backoff, DispatchCap
from execkit.classify import FailureClass
from execkit.errors import (
    AdmissionRefused,
    Conflict,
    ExecKitError,
    InvalidInput,
    NotFound,
    UnsupportedMove,
)
from execkit.ledger.model import Ledger, Run, Task
from execkit.proof import AgentProof
from execkit.redact import redact

__all__ = [
    "DISPATCH_ACTOR",
    "AdapterRunner",
    "Board",
    "BoardIssue",
    "BoardState",
    "DispatchConfig",
    "DispatchEvent",
    "Dispatcher",
    "InMemoryBoard",
    "IssueStatus",
    "JsonFileBoard",
    "RunOutcome",
    "Runner",
    "Tracker",
    "issue_statuses",
    "task_key",
]

_log = logging.getLogger("execkit.dispatch")

DISPATCH_ACTOR = "dispatcher"
"""The actor the dispatcher records on the tasks it creates and the runs it starts."""

_TASK_TITLE_PREFIX = "board:"
_MAX_ID = 200
_MAX_DETAIL = 160

# Run ids this process is running right now. Two dispatchers in one process (threads, each
# with its own ledger connection) must not both run a replayed admission; across processes
# the owner pid on the run tells them apart.
_IN_FLIGHT: set[str] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def task_key(issue_id: str) -> str:
    """The ledger idempotency key (and task title) of a board issue: `board:<id>`."""
    return f"{_TASK_TITLE_PREFIX}{issue_id}"


# --- validation helpers ----------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_id(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_ID:
        raise InvalidInput(
            f"{attribute.name} must be a non-empty string of at most {_MAX_ID} characters, "
            f"got {value!r}"
        )


def _check_str(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str):
        raise InvalidInput(f"{attribute.name} must be a string, got {type(value).__name__}")


def _to_argv(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        # A bare string would be split into characters; say so instead.
        raise InvalidInput(f"argv must be a list of strings, not a single string: {value!r}")
    return tuple(value)


def _check_argv(_inst: object, _attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    for arg in value:
        if not isinstance(arg, str):
            raise InvalidInput(f"argv must contain only strings, got {arg!r}")


# --- the board ---------------------------------------------------------------------------


@attrs.frozen
class BoardState:
    """A column of a board. Eligible states are dispatched from; terminal ones never are."""

    name: str = attrs.field(validator=_check_id)
    eligible: bool = False
    terminal: bool = False

    def __attrs_post_init__(self) -> None:
        if self.eligible and self.terminal:
            raise InvalidInput(f"state {self.name!r} cannot be both eligible and terminal")


@attrs.frozen
class BoardIssue:
    """One issue on a board.

    `prompt` is what the agent is asked (a board's `body`); `argv`, when given, is the
    command the runner starts for this issue (the `generic` adapter's program and flags).
    """

    id: str = attrs.field(validator=_check_id)
    title: str = attrs.field(validator=_check_str)
    state: str = attrs.field(validator=_check_id)
    prompt: str = attrs.field(default="", validator=_check_str)
    argv: tuple[str, ...] = attrs.field(default=(), converter=_to_argv, validator=_check_argv)

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=False)
        data["argv"] = list(self.argv)
        return data


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


def _duplicates(values: Iterable[str]) -> list[str]:
    return sorted(value for value, seen in Counter(values).items() if seen > 1)


def _check_board(states: Sequence[BoardState], issues: Sequence[BoardIssue]) -> None:
    # Runs on every read of a board file (each pass reads it): linear, not quadratic.
    names = [s.name for s in states]
    duplicates = _duplicates(names)
    if duplicates:
        raise InvalidInput(f"states: duplicate state names {duplicates}")
    if not any(s.eligible for s in states):
        raise InvalidInput("states: at least one state must be eligible")
    duplicate_ids = _duplicates(i.id for i in issues)
    if duplicate_ids:
        raise InvalidInput(f"issues: duplicate issue ids {duplicate_ids}")
    known = set(names)
    for issue in issues:
        if issue.state not in known:
            raise InvalidInput(
                f"issues: issue {issue.id!r} is in unknown state {issue.state!r}; "
                f"states are {', '.join(names)}"
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
                raise InvalidInput(f"issues: duplicate issue ids [{issue.id!r}]")
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
            self._issues[issue_id] = attrs.evolve(issue, state=state)
            self.moves.append((issue_id, state))
            return True


def _state_from_json(index: int, raw: object) -> BoardState:
    where = f"states[{index}]"
    if isinstance(raw, str):
        return BoardState(raw)
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where}: must be a state name or an object, got {raw!r}")
    unknown = set(raw) - {"name", "eligible", "terminal"}
    if unknown:
        raise InvalidInput(
            f"{where}: unknown keys {sorted(unknown)}; allowed: name, eligible, terminal"
        )
    for flag in ("eligible", "terminal"):
        if not isinstance(raw.get(flag, False), bool):
            raise InvalidInput(f"{where}.{flag}: must be true or false, got {raw[flag]!r}")
    try:
        return BoardState(
            raw.get("name"),  # type: ignore[arg-type]  # validated by BoardState
            eligible=raw.get("eligible", False),
            terminal=raw.get("terminal", False),
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}") from None


def _issue_from_json(index: int, raw: object) -> BoardIssue:
    where = f"issues[{index}]"
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where}: must be an object, got {raw!r}")
    allowed = {"id", "title", "state", "prompt", "body", "argv"}
    unknown = set(raw) - allowed
    if unknown:
        raise InvalidInput(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    argv = raw.get("argv", [])
    if not isinstance(argv, list):
        raise InvalidInput(f"{where}.argv: must be a list of strings, got {argv!r}")
    try:
        return BoardIssue(
            # Each value is validated by BoardIssue, naming the field.
            id=raw.get("id", ""),
            title=raw.get("title", ""),
            state=raw.get("state", ""),
            prompt=raw.get("prompt", raw.get("body", "")),
            argv=argv,
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}") from None


@attrs.frozen
class _BoardDoc:
    states: tuple[BoardState, ...]
    issues: tuple[BoardIssue, ...]
    dispatch: Mapping[str, Any]
    raw: dict[str, Any]


class JsonFileBoard:
    """A board kept in one JSON file, re-read on every call so an operator's edits count.

    The file is `{"states": [...], "issues": [...], "dispatch": {...}}`: a state is a name
    or `{"name", "eligible", "terminal"}`; an issue is `{"id", "title", "state", "prompt"
    (or "body"), "argv"}`; the optional `dispatch` object holds `DispatchConfig` settings.
    Moves take an exclusive lock on a sidecar `FILE.lock` and replace the file atomically
    (temp file + `os.replace`), so two dispatcher processes never lose each other's moves
    and a reader never sees half a file. Unknown keys are kept on rewrite.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
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
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> _BoardDoc:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise NotFound(f"no board file at {self.path}") from None
        except OSError as exc:
            raise InvalidInput(f"cannot read board file {self.path}: {exc}") from exc
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(f"board file {self.path} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise InvalidInput(f"board file {self.path}: the top level must be an object")
        states_raw, issues_raw = raw.get("states"), raw.get("issues", [])
        if not isinstance(states_raw, list) or not states_raw:
            raise InvalidInput(f"board file {self.path}: `states` must be a non-empty list")
        if not isinstance(issues_raw, list):
            raise InvalidInput(f"board file {self.path}: `issues` must be a list")
        dispatch = raw.get("dispatch", {})
        if not isinstance(dispatch, dict):
            raise InvalidInput(f"board file {self.path}: `dispatch` must be an object")
        try:
            states = tuple(_state_from_json(n, s) for n, s in enumerate(states_raw))
            issues = tuple(_issue_from_json(n, i) for n, i in enumerate(issues_raw))
            _check_board(states, issues)
        except InvalidInput as exc:
            raise InvalidInput(f"board file {self.path}: {exc.message}") from None
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

    def move(self, issue_id: str, state: str) -> bool:
        """Move one issue; False for an unknown issue or state. ExecKitError naming the
        file when it cannot be written."""
        try:
            with self._locked():
                doc = self._read()
                if state not in {s.name for s in doc.states}:
                    return False
                for raw_issue in doc.raw.get("issues", []):
                    if raw_issue.get("id") == issue_id:
                        raw_issue["state"] = state
                        break
                else:
                    return False
                _write_atomic(self.path, doc.raw)
                return True
        except OSError as exc:
            raise ExecKitError(f"cannot write board file {self.path}: {exc}") from exc


def _write_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    """Replace `path` with `doc` so a reader sees the old file or the new one, never half.

    The new file keeps the old one's permission bits (a board shared by a team must not
    turn private on the dispatcher's first move); a new board gets the umask's.
    """
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


# --- configuration ----------------------------------------------------------------------


def _check_max_attempts(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value) or value == 0:
        # 0 is refused, not read as "no cap": a config that forgot the value must not
        # silently retry forever. Negative is the explicit opt-in (ADR 015).
        raise InvalidInput(
            f"{attribute.name}: must be an integer >= 1, or negative for no cap; got {value!r}"
        )


def _check_state_name(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None and attribute.name == "failed_state":
        return
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_ID:
        extra = ' or None ("none" in a config file)' if attribute.name == "failed_state" else ""
        raise InvalidInput(
            f"{attribute.name}: must be a non-empty state name{extra}; got {value!r}"
        )


def _check_seconds(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_number(value) or value <= 0:
        raise InvalidInput(
            f"{attribute.name}: must be a finite number of seconds > 0; got {value!r}"
        )


@attrs.frozen
class DispatchConfig:
    """The dispatcher's knobs (ADR 015).

    `max_attempts` caps the dispatches of one issue (initial run + retries); negative means
    no cap; 0 is refused. `failed_state` is where a given-up issue goes (None opts out of
    the move); `done_state` where a succeeded one goes. The retry backoff is exponential
    from `base_backoff_s`, capped at `max_retry_backoff_s`. InvalidInput names a bad field.
    """

    max_attempts: int = attrs.field(default=10, validator=_check_max_attempts)
    failed_state: str | None = attrs.field(default="blocked", validator=_check_state_name)
    base_backoff_s: float = attrs.field(default=10.0, validator=_check_seconds)
    max_retry_backoff_s: float = attrs.field(default=300.0, validator=_check_seconds)
    done_state: str = attrs.field(default="done", validator=_check_state_name)

    def __attrs_post_init__(self) -> None:
        if self.max_retry_backoff_s < self.base_backoff_s:
            raise InvalidInput(
                f"max_retry_backoff_s: must be >= base_backoff_s ({self.base_backoff_s!r}); "
                f"got {self.max_retry_backoff_s!r}"
            )
        if self.failed_state == self.done_state:
            raise InvalidInput(
                f"failed_state and done_state must differ; both are {self.done_state!r}"
            )

    @property
    def cap(self) -> DispatchCap:
        """The ledger's view of the cap (0 = no cap)."""
        return DispatchCap(max(self.max_attempts, 0))

    @property
    def backoff(self) -> Backoff:
        """The retry backoff the ledger computes `next_attempt_at` with."""
        return Backoff(base_s=float(self.base_backoff_s), max_s=float(self.max_retry_backoff_s))

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> DispatchConfig:
        """Build from a config file's mapping; `failed_state: "none"` (or null) means None.

        Unknown keys and bad values raise InvalidInput naming the key and what is allowed.
        """
        if not isinstance(data, Mapping):
            raise InvalidInput(f"dispatch config must be a mapping, got {type(data).__name__}")
        allowed = [f.name for f in attrs.fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise InvalidInput(
                f"dispatch config: unknown keys {unknown}; allowed: {', '.join(allowed)}"
            )
        values = dict(data)
        failed = values.get("failed_state", "blocked")
        if failed is None or (isinstance(failed, str) and failed.strip().lower() == "none"):
            values["failed_state"] = None
        return cls(**values)


# --- the runner --------------------------------------------------------------------------


def _check_outcome_status(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value not in ("succeeded", "failed"):
        raise InvalidInput(f"status must be 'succeeded' or 'failed', got {value!r}")


def _redact_text(value: str | None) -> str | None:
    return redact(value) if isinstance(value, str) else value


@attrs.frozen
class RunOutcome:
    """How one dispatch of an issue ended.

    `failure_class` is None for a success; a failure with no class is a charged work
    failure. `precondition` names what is missing (environment: binary and install hint).
    `detail` is a short line of the failure text, kept for the operator.
    """

    status: str = attrs.field(validator=_check_outcome_status)
    failure_class: FailureClass | None = None
    reason: str | None = None
    precondition: str | None = None
    # Redacted here: a custom runner's text reaches events and logs, not only the ledger.
    detail: str | None = attrs.field(default=None, converter=_redact_text)

    def __attrs_post_init__(self) -> None:
        if self.status == "succeeded" and self.failure_class is not None:
            raise InvalidInput("failure_class must be None for a succeeded outcome")

    @property
    def charged(self) -> bool:
        """True unless the failure is positively classed as uncharged (ADR 0046)."""
        return self.failure_class is None or self.failure_class.charged

    def ledger_reason(self) -> str | None:
        """The reason stored on the run: the precondition for environment (what to fix),
        else the class reason with the detail line."""
        if self.status == "succeeded":
            return None
        if self.precondition:
            return self.precondition
        parts = [p for p in (self.reason, self.detail) if p]
        return ": ".join(parts) or None


class Runner(Protocol):
    """Runs one dispatch of an issue. Failures are outcomes; raising is a dispatcher bug
    path (the attempt is then recorded as a charged work failure)."""

    def run(self, issue: BoardIssue, attempt: int) -> RunOutcome: ...


def _last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    return line if len(line) <= _MAX_DETAIL else line[: _MAX_DETAIL - 1] + "…"


class AdapterRunner:
    """A `Runner` over `execkit.agent.run_agent` and one adapter.

    The issue's prompt is the request's prompt and its `argv` the request's `extra_args`
    (for the `generic` adapter: the program and its flags). `agent_attempts` defaults to 1:
    the dispatcher owns retries across dispatches, so the in-agent loop must not also
    re-spawn (and sleep) inside one dispatch.
    """

    def __init__(
        self,
        adapter: Adapter,
        *,
        agent_attempts: int = 1,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not _is_int(agent_attempts) or agent_attempts < 1:
            raise InvalidInput(f"agent_attempts: must be an integer >= 1, got {agent_attempts!r}")
        self.adapter = adapter
        self._agent_attempts = agent_attempts
        self._timeout_s = timeout_s
        self._cwd = cwd
        self._env = dict(env) if env is not None else None
        self._sleep = sleep

    def request_for(self, issue: BoardIssue) -> AgentRequest:
        return AgentRequest(
            prompt=issue.prompt,
            cwd=self._cwd,
            timeout_s=self._timeout_s,
            extra_args=issue.argv,
            env=self._env,
        )

    def run(self, issue: BoardIssue, attempt: int) -> RunOutcome:
        request = self.request_for(issue)
        proof: AgentProof
        try:
            proof = run_agent(
                self.adapter, request, max_attempts=self._agent_attempts, sleep=self._sleep
            )
        except AgentFailed as failed:
            proof = failed.proof
        if proof.productive:
            return RunOutcome("succeeded")
        return RunOutcome(
            "failed",
            failure_class=proof.effective_class,
            reason=proof.reason,
            precondition=proof.precondition,
            detail=_last_line(proof.error),
        )


# --- events -----------------------------------------------------------------------------


@attrs.frozen
class DispatchEvent:
    """One thing the dispatcher did or reported for one issue.

    `kind`:
    - `dispatched`: a run was started and finished (`attempt`, `status`, `failure_class`,
      `charged`, `reason` of this run); `moved_to` is set when it then moved the issue
      (done, or given up into the failed state); `blocked_on` and `decision` when the
      history now blocks it; `next_attempt_at` when a retry is scheduled.
    - `gave_up`: moved to the failed state without a dispatch (found blocked or at the cap).
    - `blocked`: blocked but the failed-state move is unavailable; it stays eligible.
    - `attempt_limit`: the explicit task limit is used up; it stays in progress.
    - `done`: the task had already succeeded; the issue was moved to the done state.
    - `refused`: the ledger refused the admission (e.g. another dispatcher is running it).
    - `error`: a ledger or board error for this issue; the other issues went on.
    """

    kind: str
    issue_id: str
    at: float
    task_id: str | None = None
    attempt: int | None = None
    max_attempts: int | None = None  # the binding bound: dispatch cap or task limit; None = none
    status: str | None = None
    failure_class: FailureClass | None = None
    charged: bool | None = None
    reason: str | None = None
    precondition: str | None = None
    blocked_on: str | None = None
    decision: str | None = None  # the ledger's reason when the history blocks the issue
    moved_to: str | None = None
    next_attempt_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["failure_class"] = self.failure_class.value if self.failure_class else None
        return data


# --- status -----------------------------------------------------------------------------


@attrs.frozen
class IssueStatus:
    """One row of the operator's dashboard: the board's view and the ledger's, side by side."""

    issue_id: str
    title: str
    board_state: str | None
    task_id: str | None
    ledger_state: str | None  # ready | running | backoff | done | blocked | cancelled
    blocked_on: str | None
    attempts: int
    max_attempts: int | None  # the binding bound: dispatch cap or explicit limit; None = none
    charged_attempts: int
    uncharged_streak: int
    next_attempt_at: float | None
    last_class: FailureClass | None
    last_status: str | None
    last_reason: str | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["last_class"] = self.last_class.value if self.last_class else None
        return data


def _binding_max(cap: DispatchCap, task: Task | None) -> int | None:
    bounds = [cap.max_attempts] if cap.capped else []
    if task is not None and task.max_attempts:
        bounds.append(task.max_attempts)
    return min(bounds) if bounds else None


def _status_row(
    issue_id: str,
    title: str,
    board_state: str | None,
    task: Task | None,
    runs: Sequence[Run],
    cap: DispatchCap,
) -> IssueStatus:
    last = runs[-1] if runs else None
    return IssueStatus(
        issue_id=issue_id,
        title=title,
        board_state=board_state,
        task_id=task.id if task else None,
        ledger_state=task.state if task else None,
        blocked_on=task.blocked_on if task else None,
        attempts=task.attempts_started if task else 0,
        max_attempts=_binding_max(cap, task),
        charged_attempts=task.charged_attempts if task else 0,
        uncharged_streak=task.uncharged_streak if task else 0,
        next_attempt_at=task.next_attempt_at if task and task.state == "backoff" else None,
        last_class=last.failure_class if last else None,
        last_status=last.status if last else None,
        last_reason=last.reason if last else None,
        reason=task.reason if task else None,
    )


def issue_statuses(
    ledger: Ledger | None,
    config: DispatchConfig,
    *,
    board: Board | None = None,
    now: float | None = None,
) -> list[IssueStatus]:
    """The dashboard rows: every board issue (with `board`), else every ledger task the
    dispatcher created. Reads only; an issue never dispatched has no task (`task_id` None),
    and `ledger=None` (no ledger yet) means no issue was.

    A row at the dispatch cap whose give-up move is unavailable (`failed_state` None, or
    the issue still in an eligible board state) shows the retry the dispatcher will make
    past the cap (ADR 015's legacy behaviour), not a stop that will not happen.
    """
    at = time.time() if now is None else now
    cap = config.cap
    tasks = {
        t.title: t
        for t in (ledger.list_tasks(now=at) if ledger is not None else [])
        if t.title.startswith(_TASK_TITLE_PREFIX)
    }
    still_eligible = {i.id for i in board.list_candidates()} if board is not None else set()

    def row(issue_id: str, title: str, board_state: str | None, found: Task | None) -> IssueStatus:
        if ledger is None or found is None:
            return _status_row(issue_id, title, board_state, None, [], cap)
        task = ledger.get_task(found.id, now=at, cap=cap)
        if task.blocked_on == "dispatch_cap" and (
            config.failed_state is None or issue_id in still_eligible
        ):
            task = ledger.get_task(found.id, now=at)
        return _status_row(issue_id, title, board_state, task, ledger.runs(found.id), cap)

    if board is not None:
        return [
            row(issue.id, issue.title, issue.state, tasks.get(task_key(issue.id)))
            for issue in board.list_issues()
        ]
    return [row(title[len(_TASK_TITLE_PREFIX) :], "", None, t) for title, t in tasks.items()]


# --- the dispatcher ---------------------------------------------------------------------


@attrs.frozen
class _Unrecorded:
    run_id: str
    outcome: RunOutcome
    ended_at: float


class Dispatcher:
    """The scheduling loop over one board and one ledger (see the module docstring).

    The dispatcher owns the ledger's retry backoff: it sets `ledger.backoff` to
    `config.backoff`, so every projection of the history (here, in `execkit status`, in
    another dispatcher built with the same config) computes the same `next_attempt_at`.
    `clock` gives POSIX seconds (inject a virtual clock in tests and the demo);
    `on_event` is called with each event as it happens.
    """

    def __init__(
        self,
        tracker: Tracker,
        runner: Runner,
        ledger: Ledger,
        config: DispatchConfig | None = None,
        clock: Callable[[], float] = time.time,
        *,
        on_event: Callable[[DispatchEvent], None] | None = None,
    ) -> None:
        self.tracker = tracker
        self.runner = runner
        self.ledger = ledger
        self.config = DispatchConfig() if config is None else config
        self.clock = clock
        self._on_event = on_event
        self._cap = self.config.cap
        ledger.backoff = self.config.backoff
        # A cache of a stable mapping (the ledger replays the same task for the key), not
        # retry state: dropping it changes nothing.
        self._task_ids: dict[str, str] = {}
        # Results the ledger failed to take (busy past its timeout, disk full): retried at
        # the start of each pass, so the run does not stay `running` (and its issue stuck)
        # for as long as this process lives. Lost on exit, when abandon_stale_runs takes over.
        self._unrecorded: dict[str, _Unrecorded] = {}
        # Per issue, the (attempts, state) of the last "not moved" warning: one warning per
        # exhaustion, not one per pass that finds the same history again.
        self._warned: dict[str, tuple[int, str | None]] = {}

    # -- public --------------------------------------------------------------------------

    def tick(self) -> list[DispatchEvent]:
        """Dispatch every eligible issue whose backoff has elapsed, once; return the events.

        Runs are abandoned first when their owner process on this host died (so a crashed
        dispatcher's run does not hold its task forever), and results an earlier pass could
        not write are written. A ledger or board error on one issue becomes an `error`
        event and the other issues go on.
        """
        self.ledger.abandon_stale_runs(now=self.clock())
        self._record_pending()
        events: list[DispatchEvent] = []
        for issue in self.tracker.list_candidates():
            try:
                issue_events = self._tick_issue(issue)
            except ExecKitError as exc:
                _log.warning("issue %s: %s", issue.id, exc.message)
                issue_events = [
                    self._event("error", issue, None, reason=f"{exc.code}: {exc.message}")
                ]
            events.extend(issue_events)
        return events

    def next_due(self) -> float | None:
        """The earliest `next_attempt_at` among the eligible issues this dispatcher has
        ticked that wait in backoff, or None."""
        now = self.clock()
        due: list[float] = []
        for issue in self.tracker.list_candidates():
            task_id = self._task_ids.get(issue.id)
            if task_id is None:
                continue
            task = self.ledger.get_task(task_id, now=now)
            if task.state == "backoff" and task.next_attempt_at is not None:
                due.append(task.next_attempt_at)
        return min(due, default=None)

    def run_forever(
        self,
        interval_s: float,
        *,
        stop: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Tick, then sleep `interval_s`, until `stop()` is true (checked before each tick).

        The sleep is cut short when a backoff ends sooner, so a retry is not delayed by a
        long interval. An ExecKitError from a pass (a board file caught mid-edit, a busy
        ledger) is logged as a WARNING and the loop goes on. InvalidInput for an interval
        that is not a positive number.
        """
        if not _is_number(interval_s) or interval_s <= 0:
            raise InvalidInput(f"interval_s: must be a number of seconds > 0, got {interval_s!r}")
        while not stop():
            wait = interval_s
            try:
                self.tick()
                if stop():
                    return
                due = self.next_due()
                if due is not None:
                    wait = min(wait, max(due - self.clock(), 0.0))
            except ExecKitError as exc:
                _log.warning("dispatch pass failed, retrying in %gs: %s", wait, exc.message)
            sleep(max(wait, 0.01))

    # -- one issue -----------------------------------------------------------------------

    def _emit(self, event: DispatchEvent) -> DispatchEvent:
        if self._on_event is not None:
            self._on_event(event)
        return event

    def _event(
        self, kind: str, issue: BoardIssue, task: Task | None, **fields: Any
    ) -> DispatchEvent:
        return self._emit(
            DispatchEvent(
                kind=kind,
                issue_id=issue.id,
                at=self.clock(),
                task_id=task.id if task else None,
                max_attempts=_binding_max(self._cap, task),
                **fields,
            )
        )

    def _task_id(self, issue: BoardIssue) -> str:
        task_id = self._task_ids.get(issue.id)
        if task_id is None:
            key = task_key(issue.id)
            task = self.ledger.create_task(key, idempotency_key=key, actor=DISPATCH_ACTOR)
            task_id = self._task_ids[issue.id] = task.id
        return task_id

    def _tick_issue(self, issue: BoardIssue) -> list[DispatchEvent]:
        task_id = self._task_id(issue)
        now = self.clock()
        # The history alone (no cap): the ledger's own bounds and the backoff.
        task = self.ledger.get_task(task_id, now=now)
        if task.status == "done":
            moved = self._move(issue, task, self.config.done_state, why="it succeeded")
            return [self._event("done", issue, task, moved_to=moved, reason=task.reason)]
        if task.status == "cancelled":
            return [self._event("refused", issue, task, reason="task cancelled in the ledger")]
        if task.state in ("running", "backoff"):
            return []  # another dispatcher runs it, or its retry is not due yet
        if task.state == "blocked":
            if task.blocked_on == "attempt_limit":
                return [self._attempt_limit_event(issue, task)]
            return [self._give_up_event(issue, task)]
        capped = self.ledger.get_task(task_id, now=now, cap=self._cap)
        if capped.state == "blocked" and capped.blocked_on == "dispatch_cap":
            moved = self._give_up(issue, capped)
            if moved is not None:
                return [self._gave_up(issue, capped, moved)]
            # Legacy retry (ADR 015): the cap does not engage without a terminal state.
            return self._dispatch(issue, task, cap=None)
        return self._dispatch(issue, task, cap=self._cap)

    def _stopped_event(
        self, kind: str, issue: BoardIssue, task: Task, blocked_on: str | None, **fields: Any
    ) -> DispatchEvent:
        """An event for a task a bound stopped: its attempts so far and the ledger's why."""
        return self._event(
            kind,
            issue,
            task,
            attempt=task.attempts_started,
            blocked_on=blocked_on,
            decision=task.reason,
            **fields,
        )

    def _attempt_limit_event(self, issue: BoardIssue, task: Task) -> DispatchEvent:
        return self._stopped_event("attempt_limit", issue, task, "attempt_limit")

    def _gave_up(self, issue: BoardIssue, task: Task, moved: str) -> DispatchEvent:
        return self._stopped_event("gave_up", issue, task, task.blocked_on, moved_to=moved)

    def _give_up_event(self, issue: BoardIssue, task: Task) -> DispatchEvent:
        moved = self._give_up(issue, task)
        if moved is not None:
            return self._gave_up(issue, task, moved)
        return self._stopped_event("blocked", issue, task, task.blocked_on)

    def _give_up(self, issue: BoardIssue, task: Task) -> str | None:
        """Move a given-up issue to the failed state; the state moved to, or None."""
        why = task.reason or f"blocked on {task.blocked_on}"
        return self._move(issue, task, self.config.failed_state, why=why)

    def _move(self, issue: BoardIssue, task: Task, state: str | None, *, why: str) -> str | None:
        """Move the issue; when that is unavailable, log a WARNING naming issue and state.

        Logged once for each attempt count at which the move fails, so every exhaustion of
        the cap is heard (a board that cannot take the move leaves the cap disengaged, ADR
        015) without repeating it on each pass that re-reads the same history.
        """
        if state is None:
            problem = "no failed_state is configured (failed_state: none)"
        else:
            try:
                if self.tracker.move(issue.id, state):
                    self._warned.pop(issue.id, None)
                    return state
                problem = f"the board has no state {state!r} or refused the move"
            except UnsupportedMove as exc:
                problem = f"moving it to {state!r} is unsupported: {exc.message}"
        seen = (task.attempts_started, state)
        if self._warned.get(issue.id) != seen:
            self._warned[issue.id] = seen
            _log.warning(
                "issue %s was not moved (%s): %s; it stays in %r and remains eligible",
                issue.id,
                why,
                problem,
                issue.state,
            )
        return None

    def _dispatch(
        self, issue: BoardIssue, task: Task, *, cap: DispatchCap | None
    ) -> list[DispatchEvent]:
        expected = task.attempts_started + 1
        # Deterministic per attempt: a second dispatcher that read the same history gets
        # this run back as a replay (not a new run) and sees it is not its own.
        request_key = f"dispatch:{task_key(issue.id)}:{expected}"
        try:
            run = self.ledger.start_run(
                task.id, request_key=request_key, actor=DISPATCH_ACTOR, now=self.clock(), cap=cap
            )
        except AdmissionRefused as refused:
            if refused.code == "attempt_limit":
                return [
                    self._attempt_limit_event(
                        issue, self.ledger.get_task(task.id, now=self.clock())
                    )
                ]
            return [self._event("refused", issue, task, attempt=expected, reason=refused.message)]
        with _IN_FLIGHT_LOCK:
            mine = (
                run.status == "running"
                and run.owner_pid == os.getpid()
                and run.id not in _IN_FLIGHT
            )
            if mine:
                _IN_FLIGHT.add(run.id)
        if not mine:
            return [
                self._event(
                    "refused",
                    issue,
                    task,
                    attempt=run.attempt,
                    reason=f"attempt {run.attempt} was dispatched by another dispatcher",
                )
            ]
        try:
            outcome = self._run(issue, run)
        finally:
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT.discard(run.id)
        return [self._after_run(issue, run, outcome)]

    def _run(self, issue: BoardIssue, run: Run) -> RunOutcome:
        """Run the runner and record its outcome; ExecKitError when the ledger cannot take
        it (the result is kept and recorded again on the next pass)."""
        try:
            outcome = self.runner.run(issue, run.attempt)
        except Exception as exc:
            _log.exception("issue %s: the runner raised on attempt %d", issue.id, run.attempt)
            # Not positively identified as uninformative: it charges (ADR 0046).
            outcome = RunOutcome(
                "failed",
                failure_class=FailureClass.WORK,
                reason="runner error",
                detail=_last_line(f"{type(exc).__name__}: {exc}"),
            )
        except BaseException:
            # Interrupted mid-run (Ctrl-C): no proof of what happened, so abandoned (charged).
            # The interrupt is what must propagate; if the ledger cannot take this either,
            # abandon_stale_runs marks the run once this process has exited.
            with suppress(ExecKitError):
                self.ledger.finish_run(
                    run.id, "abandoned", reason="dispatcher interrupted", now=self.clock()
                )
            raise
        self._unrecorded[run.id] = _Unrecorded(run.id, outcome, self.clock())
        self._record(run.id)
        return outcome

    def _record(self, run_id: str) -> None:
        pending = self._unrecorded[run_id]
        outcome = pending.outcome
        self.ledger.finish_run(
            run_id,
            outcome.status,
            failure_class=outcome.failure_class if outcome.status == "failed" else None,
            reason=outcome.ledger_reason(),
            now=pending.ended_at,
        )
        del self._unrecorded[run_id]

    def _record_pending(self) -> None:
        for run_id in list(self._unrecorded):
            try:
                self._record(run_id)
            except Conflict:
                # Finished meanwhile as something else (abandoned by an operator or another
                # host): the history already says how it ended.
                del self._unrecorded[run_id]
            except ExecKitError as exc:
                _log.warning("run %s: its result is still not recorded: %s", run_id, exc.message)

    def _after_run(self, issue: BoardIssue, run: Run, outcome: RunOutcome) -> DispatchEvent:
        failed = outcome.status == "failed"
        after = self.ledger.get_task(run.task_id, now=self.clock(), cap=self._cap)
        fields: dict[str, Any] = {
            "attempt": run.attempt,
            "status": outcome.status,
            "failure_class": (outcome.failure_class or FailureClass.WORK) if failed else None,
            "charged": outcome.charged,
            "reason": outcome.ledger_reason(),
            "precondition": outcome.precondition,
        }
        if not failed:
            fields["moved_to"] = self._move(
                issue, after, self.config.done_state, why="it succeeded"
            )
        elif after.state == "blocked":
            fields["blocked_on"] = after.blocked_on
            fields["decision"] = after.reason
            if after.blocked_on != "attempt_limit":
                fields["moved_to"] = self._give_up(issue, after)
            if fields.get("moved_to") is None and after.blocked_on == "dispatch_cap":
                # Legacy retry past the cap: when it is due comes from the uncapped view.
                plain = self.ledger.get_task(run.task_id, now=self.clock())
                fields["next_attempt_at"] = plain.next_attempt_at
        else:
            fields["next_attempt_at"] = after.next_attempt_at
        return self._event("dispatched", issue, after, **fields)
