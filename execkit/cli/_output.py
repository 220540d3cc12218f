"""Shared CLI output: JSON printing and the error-code ➜ exit-code table."""

from __future__ import annotations

import json
import sys
from typing import Any

from execkit._errors import INTERNAL_ERROR_EXIT, ExecKitError, error_types

__all__ = ["EXIT_CODES", "INTERNAL_ERROR_EXIT", "print_json", "report_error"]

# One distinct, documented exit code per error code (README "Exit codes"), read off the
# error types themselves so the table cannot drift from them.
EXIT_CODES: dict[str, int] = {kind.code: kind.exit_code for kind in error_types()}


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
    return exc.exit_code
