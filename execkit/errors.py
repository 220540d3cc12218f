"""The exception hierarchy: everything execkit raises on purpose is an `ExecKitError`.

Each error carries a stable machine-readable `code`; the CLI maps codes to exit codes
and to `{"error": {"code": ..., "message": ...}}` with `--json`.
"""

from __future__ import annotations

__all__ = [
    "AdmissionRefused",
    "Conflict",
    "ExecKitError",
    "Forbidden",
    "HistoryError",
    "InvalidInput",
    "NotFound",
    "SchemaTooNew",
    "UnknownAdapter",
    "UnsupportedMove",
]


class ExecKitError(Exception):
    """Base of every error execkit raises on purpose."""

    code: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ExecKitError, ValueError):
    """A value is outside its allowed range or of the wrong shape; nothing was changed."""

    code = "invalid"


class HistoryError(InvalidInput):
    """An attempt history breaks an invariant (gapless 1..N, one running, nothing after success)."""

    code = "invalid_history"


class NotFound(ExecKitError, LookupError):
    """The named task, run, adapter or file does not exist."""

    code = "not_found"


class UnknownAdapter(NotFound):
    """No built-in or registered adapter has this name."""


class Conflict(ExecKitError):
    """An idempotency key was replayed with a different request, or a compare-and-set lost."""

    code = "conflict"


class Forbidden(ExecKitError):
    """The actor lacks the role the operation needs."""

    code = "forbidden"


class AdmissionRefused(ExecKitError):
    """A run was not admitted; `code` names why: attempt_limit, blocked or finished."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SchemaTooNew(ExecKitError):
    """The database was written by a newer execkit; nothing was written to it."""

    code = "schema_too_new"


class UnsupportedMove(ExecKitError):
    """The board has no such state or refuses the transition."""

    code = "unsupported_move"
