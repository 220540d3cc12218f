"""Every error execkit raises on purpose, caught by type.

    ExecKitError                      code "error"            exit 1
    ├── InvalidInput (ValueError)     "invalid"               3    `.field` names the bad value
    │   └── HistoryError              "invalid_history"       11
    ├── NotFound (LookupError)        "not_found"             4
    │   └── UnknownAdapter
    ├── Conflict                      "conflict"              5
    ├── Forbidden                     "forbidden"             6
    │   └── Unauthenticated           "unauthenticated"       15   a server knows no such token
    ├── AdmissionRefused              (a run was not admitted; never raised itself)
    │   ├── AttemptLimitReached       "attempt_limit"         7
    │   ├── TaskBlocked               "blocked"               8
    │   ├── TaskFinished              "finished"              9
    │   ├── TaskBackingOff            "backoff"               14   `.ready_at` says when
│   ├── LaneWaiting               "lane_waiting"          16   `.lane`, `.opens_at`
│   ├── LaneStopped               "lane_stopped"          17   `.lane`, `.fix`
│   └── SpendCapReached           "spend_cap"             18   `.cap`, `.reopens_at`
    ├── StorageError                  "storage"               13   I/O, locks, corruption
    │   └── SchemaTooNew              "schema_too_new"        10
    ├── UnsupportedMove               "unsupported_move"      12
    └── AgentFailed                   "agent_failed"          1    `.proof` says why
                                      (defined beside the proof it carries, in `_proof`)

Every message is masked when the error is built (`ExecKitError.__init__` runs it through
`execkit._mask.mask_text`): an error is where a value given by a caller (a task id, a field
name, a wrong-typed value, a finish reason) is echoed back, and it travels to every surface
from here (the CLI's stderr, the server's error documents, the SDKs' exceptions rebuilt from
them), so it is masked once, at birth, before anything can print or store it.

`code` is the stable machine-readable name (`{"error": {"code", "message"}}` in JSON) and
`exit_code` the CLI's documented exit status for it. Both are class attributes, so a
caller can map a type without an instance, and no two leaf codes share an exit code except
the generic ones (1). Subclassing the builtin an error resembles lets code that knows
nothing of execkit still catch it sensibly (`except ValueError`).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "INTERNAL_ERROR_EXIT",
    "AdmissionRefused",
    "AttemptLimitReached",
    "Conflict",
    "ExecKitError",
    "Forbidden",
    "HistoryError",
    "InvalidInput",
    "LaneStopped",
    "LaneWaiting",
    "NotFound",
    "SchemaTooNew",
    "StorageError",
    "TaskBackingOff",
    "TaskBlocked",
    "TaskFinished",
    "Unauthenticated",
    "UnknownAdapter",
    "UnsupportedMove",
    "error_types",
]

INTERNAL_ERROR_EXIT = 70
"""The exit status of a bug: anything that is not an `ExecKitError`."""


class ExecKitError(Exception):
    """Base of every error execkit raises on purpose."""

    code: ClassVar[str] = "error"
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str) -> None:
        # Imported here, not at the top: `_errors` is loaded by every room, the redactor
        # only when an error is actually built (start-up time matters).
        from execkit._mask import mask_text

        masked = mask_text(message)
        super().__init__(masked)
        self.message = masked

    def details(self) -> dict[str, Any]:
        """What the error says beyond its code and message, by name (JSON values): what a
        caller acts on (`field`, `ready_at`, `lane`...). The CLI's `--json` error and the
        server's error document both carry it, so both name the same things."""
        return {}


class InvalidInput(ExecKitError, ValueError):
    """A value is outside its allowed range or of the wrong shape; nothing was changed.

    `field` names the value (an argument, an attribute, a flag, a key of a file), or is
    None where no single one is to blame.
    """

    code = "invalid"
    exit_code = 3

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def details(self) -> dict[str, Any]:
        return {} if self.field is None else {"field": self.field}


class HistoryError(InvalidInput):
    """An attempt history breaks an invariant (gapless 1..N, one running, nothing after success)."""

    code = "invalid_history"
    exit_code = 11


class NotFound(ExecKitError, LookupError):
    """The named task, run, adapter or file does not exist."""

    code = "not_found"
    exit_code = 4


class UnknownAdapter(NotFound):
    """No built-in or registered adapter has this name."""


class Conflict(ExecKitError):
    """An idempotency key was replayed with a different request, or a compare-and-set lost."""

    code = "conflict"
    exit_code = 5


class Forbidden(ExecKitError):
    """The actor lacks the role the operation needs."""

    code = "forbidden"
    exit_code = 6


class Unauthenticated(Forbidden):
    """A server refused the request before any rule ran: no bearer token, or one it does
    not know (HTTP 401). Nothing was changed. A `Forbidden`, so code that refuses on any
    missing right catches both."""

    code = "unauthenticated"
    exit_code = 15


class AdmissionRefused(ExecKitError):
    """A run was not admitted. Catch this for any refusal, or one subclass for one reason."""


class AttemptLimitReached(AdmissionRefused):
    """The task's explicit attempt limit is used up; an operator can raise it (ADR 0033)."""

    code = "attempt_limit"
    exit_code = 7


class TaskBlocked(AdmissionRefused):
    """The budgets say stop (environment, upstream ceiling, work budget, dispatch cap), or
    another run of the task is still running."""

    code = "blocked"
    exit_code = 8


class TaskFinished(AdmissionRefused):
    """The task is done or cancelled; it admits no more runs and its policy is frozen."""

    code = "finished"
    exit_code = 9


class TaskBackingOff(AdmissionRefused):
    """The task is backing off after a failure (or waiting for the vendor's reset time):
    no run is admitted before `ready_at` unless the caller overrides it, which is audited."""

    code = "backoff"
    exit_code = 14

    def __init__(self, message: str, *, ready_at: float) -> None:
        super().__init__(message)
        self.ready_at = ready_at

    def details(self) -> dict[str, Any]:
        return {"ready_at": self.ready_at}


class LaneWaiting(AdmissionRefused):
    """The task's vendor lane is parked (until a reset the vendor stated), cooling (its
    breaker tripped) or half-open with its probe attempt in flight: no run is admitted and
    nothing is charged. `lane` names it; `opens_at` is when it opens, None when the probe's
    result decides."""

    code = "lane_waiting"
    exit_code = 16

    def __init__(self, message: str, *, lane: str = "", opens_at: float | None = None) -> None:
        super().__init__(message)
        self.lane = lane
        self.opens_at = opens_at

    def details(self) -> dict[str, Any]:
        return {"lane": self.lane, "opens_at": self.opens_at}


class LaneStopped(AdmissionRefused):
    """The task's vendor lane is stopped on environment that belongs to it (credentials,
    billing, the binary missing on this host): no run is admitted and nothing is charged
    until an operator fixes it and resumes the lane. `fix` names what to do."""

    code = "lane_stopped"
    exit_code = 17

    def __init__(self, message: str, *, lane: str = "", fix: str | None = None) -> None:
        super().__init__(message)
        self.lane = lane
        self.fix = fix

    def details(self) -> dict[str, Any]:
        return {"lane": self.lane, "fix": self.fix}


class SpendCapReached(AdmissionRefused):
    """A spend cap on a window (the day's, the week's, a rolling 5 hours'; ledger-wide or
    a lane's) has no room for the run's reservation: no run is admitted and nothing is
    charged. `cap` names it; `reopens_at` is when its window reopens (issue #45)."""

    code = "spend_cap"
    exit_code = 18

    def __init__(self, message: str, *, cap: str = "", reopens_at: float | None = None) -> None:
        super().__init__(message)
        self.cap = cap
        self.reopens_at = reopens_at

    def details(self) -> dict[str, Any]:
        return {"cap": self.cap, "reopens_at": self.reopens_at}


class StorageError(ExecKitError):
    """The ledger (or a board file) could not be read or written: I/O, a lock held past its
    timeout, a file that is not a ledger. Nothing half-written is left behind."""

    code = "storage"
    exit_code = 13


class SchemaTooNew(StorageError):
    """The database was written by a newer execkit; nothing was written to it."""

    code = "schema_too_new"
    exit_code = 10


class UnsupportedMove(ExecKitError):
    """The board has no such state or refuses the transition."""

    code = "unsupported_move"
    exit_code = 12


def error_types() -> tuple[type[ExecKitError], ...]:
    """Every error type, base first: the table the CLI's exit codes and the HTTP API's error
    codes are built from. It walks the subclasses defined so far; `AgentFailed` lives in
    `_proof` (it carries a proof), so a table that must name it imports that room first."""
    found: list[type[ExecKitError]] = []
    pending: list[type[ExecKitError]] = [ExecKitError]
    while pending:
        kind = pending.pop(0)
        found.append(kind)
        pending.extend(kind.__subclasses__())
    return tuple(found)
