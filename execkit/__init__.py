"""execkit: run vendor CLIs for agent runners; charge retries only for informative attempts.

Public API is re-exported here; everything else is private.
"""

from __future__ import annotations

from execkit.classify import FailureClass
from execkit.errors import (
    AdmissionRefused,
    Conflict,
    ExecKitError,
    Forbidden,
    HistoryError,
    InvalidInput,
    NotFound,
    SchemaTooNew,
    UnknownAdapter,
    UnsupportedMove,
)
from execkit.exec import SpawnResult

__version__ = "0.1.0"

__all__ = [
    "AdmissionRefused",
    "Conflict",
    "ExecKitError",
    "FailureClass",
    "Forbidden",
    "HistoryError",
    "InvalidInput",
    "NotFound",
    "SchemaTooNew",
    "SpawnResult",
    "UnknownAdapter",
    "UnsupportedMove",
    "__version__",
]
