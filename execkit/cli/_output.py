"""Shared CLI output: JSON printing and the error-code ➜ exit-code table."""

from __future__ import annotations

import json
import sys
from typing import Any

from execkit.errors import ExecKitError

# One distinct, documented exit code per error code (README "Exit codes").
EXIT_CODES: dict[str, int] = {
    "error": 1,
    "invalid": 3,
    "not_found": 4,
    "conflict": 5,
    "forbidden": 6,
    "attempt_limit": 7,
    "blocked": 8,
    "finished": 9,
    "schema_too_new": 10,
    "invalid_history": 11,
    "unsupported_move": 12,
}
INTERNAL_ERROR_EXIT = 70


def print_json(obj: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def report_error(exc: ExecKitError, *, as_json: bool) -> int:
    """Write the error (JSON on stderr with --json) and return its exit code."""
    if as_json:
        payload = {"error": {"code": exc.code, "message": exc.message}}
        sys.stderr.write(json.dumps(payload, sort_keys=True) + "\n")
    else:
        sys.stderr.write(f"execkit: {exc.code}: {exc.message}\n")
    return EXIT_CODES.get(exc.code, 1)
