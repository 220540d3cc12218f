"""The structural rules: a spawn errno that means the run never started.

Structure is the durable signal (ADR 0046), so `classify` asks it before any text. A run
that never started is **environment** when its errno means a missing precondition, each with
its own reason (the adapter layer turns each into its own precondition):

| spawn fact | reason |
|---|---|
| ENOENT, the program is not there | `spawn errno ENOENT` |
| ENOENT, its `#!` interpreter is not there | `missing interpreter` |
| the working directory does not exist | `missing working directory` |
| the working directory is a file or cannot be entered | `unusable working directory` |
| EACCES (not executable), ENOEXEC (not a program) | `spawn errno <NAME>` |
| ENOTDIR (its path runs through a file) | `spawn errno ENOTDIR` |

Any other spawn errno (E2BIG, EMFILE, ENOMEM...) is **work**, reason `spawn errno <NAME>`:
it is not positively identified, so it charges. A bare exit 127 with no errno is work (a
shell exits 127 legitimately), and nothing is environment because of what the text says:
this file reads `spawn_errno` and `spawn_failure` only, never an exit code or a text.
"""

from __future__ import annotations

import errno

from execkit._classify.verdict import EVIDENCE_CHARS, Classification, FailureClass, Reason
from execkit._exec import SpawnFailure, SpawnResult

ENVIRONMENT_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR})
"""Spawn errnos that mean the program never started: a precondition is missing."""


def _errno_name(number: int) -> str:
    return errno.errorcode.get(number, str(number))


def _spawn_evidence(result: SpawnResult) -> str | None:
    if not result.spawn_error:
        return None
    return result.spawn_error.strip()[:EVIDENCE_CHARS] or None


_CWD_REASONS = {
    SpawnFailure.CWD_NOT_FOUND: Reason.MISSING_CWD,
    SpawnFailure.CWD_NOT_DIRECTORY: Reason.UNUSABLE_CWD,
    SpawnFailure.CWD_UNUSABLE: Reason.UNUSABLE_CWD,
}


def spawn_verdict(result: SpawnResult, number: int) -> Classification:
    """A run that never started: environment when its errno means a missing precondition."""
    evidence = _spawn_evidence(result)
    failure = result.spawn_failure
    if failure in _CWD_REASONS:
        return Classification(FailureClass.ENVIRONMENT, _CWD_REASONS[failure], evidence)
    if number in ENVIRONMENT_ERRNOS:
        if failure is SpawnFailure.INTERPRETER_NOT_FOUND:
            reason: str = Reason.MISSING_INTERPRETER
        elif number == errno.ENOENT:
            reason = Reason.MISSING_BINARY
        else:
            reason = f"spawn errno {_errno_name(number)}"
        return Classification(FailureClass.ENVIRONMENT, reason, evidence)
    # Never started, so no vendor spoke: nothing upstream to find in the text.
    return Classification(FailureClass.WORK, f"spawn errno {_errno_name(number)}", evidence)
