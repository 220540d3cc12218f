"""What a verdict is: the three failure classes, the fixed reasons, `Classification`.

`FailureClass` says whether a failed attempt produced information about the work (`work`,
charged) or not (`environment`: stop; `upstream`: bounded retry). `Reason` holds the reasons
code compares; every other reason is formatted where it is decided (`http 503`, `spawn errno
EIO`). `Classification` is the frozen value every rule returns: it refuses a value outside
its shapes (`InvalidInput`) and masks credentials in its evidence, so what is printed or
stored never carries one. Nothing here reads a result or a text.
"""

from __future__ import annotations

import enum
import math

import attrs
from attrs.validators import ge, instance_of, max_len

from execkit._json import json_key, to_json
from execkit._validate import checked, finite, non_blank, opt_checked

EVIDENCE_CHARS = 200
"""The longest evidence snippet a `Classification` carries."""

_MAX_REASON_CHARS = 64


class FailureClass(enum.StrEnum):
    """Did a failed attempt produce information about the work?"""

    WORK = "work"
    ENVIRONMENT = "environment"
    UPSTREAM = "upstream"

    @property
    def charged(self) -> bool:
        """Only work failures spend the charged budget."""
        return self is FailureClass.WORK


_STALLED = "stalled: no output for "


def stall_reason(seconds: float) -> str:
    """The reason of a run its stall watchdog stopped: "stalled: no output for S s"."""
    return f"{_STALLED}{seconds:g} s"


def stalled_for(reason: str | None) -> float | None:
    """The seconds of silence after which a stall watchdog stopped a run, read back from
    the reason `stall_reason` wrote (what the ledger stores, whichever client finished the
    run); None for any other reason. The words are this module's, so the one place that
    writes them is the one that reads them."""
    if reason is None or not reason.startswith(_STALLED):
        return None
    figure, unit, _rest = reason[len(_STALLED) :].partition(" s")
    if not unit:
        return None
    try:
        seconds = float(figure)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


class Reason(enum.StrEnum):
    """The fixed reasons code compares; others are formatted (`http 503`, `spawn errno EIO`)."""

    DEFAULT = "default"  # work: nothing identified the failure
    TIMEOUT = "timeout"  # work: the run was timed out with nothing upstream to show
    MISSING_BINARY = "spawn errno ENOENT"  # environment: the program is not there
    MISSING_INTERPRETER = "missing interpreter"  # environment: its #! interpreter is not there
    MISSING_CWD = "missing working directory"  # environment: the cwd is not there
    UNUSABLE_CWD = "unusable working directory"  # environment: the cwd is a file or locked
    CIRCUIT_OPEN = "circuit open"
    OVERLOADED = "overloaded"
    SERVICE_UNAVAILABLE = "service unavailable"
    RATE_LIMITED = "rate limited"
    UNREACHABLE = "vendor unreachable"  # upstream: the CLI could not connect to its API
    SERVER_ERROR = "server error"  # upstream: the vendor's own error type said so
    STREAM_FAILED = "stream failed"  # upstream: the vendor's stream broke off mid-answer
    STILL_RETRYING = "still retrying"  # upstream: it ended while retrying a vendor failure
    CREDENTIALS = "credentials"  # environment: the vendor refused the credentials
    INSUFFICIENT_QUOTA = "insufficient quota"  # an account limit: work, never upstream
    BILLING = "billing"
    USAGE_LIMIT = "usage limit"
    UNTRUSTED = "untrusted workspace"  # environment: the CLI refuses the directory


_NOT_STARTED_REASONS = frozenset(
    {Reason.MISSING_INTERPRETER, Reason.MISSING_CWD, Reason.UNUSABLE_CWD}
)


def never_started(reason: str | None) -> bool:
    """Whether a classification's `reason` says the program never started (any spawn
    errno, a missing interpreter or working directory), as opposed to a run that started
    and failed, a refused credential included."""
    return reason is not None and (
        reason.startswith("spawn errno ") or reason in _NOT_STARTED_REASONS
    )


ACCOUNT_LIMIT_REASONS = frozenset({Reason.INSUFFICIENT_QUOTA, Reason.BILLING, Reason.USAGE_LIMIT})
"""Reasons that name an account limit: no backoff cures them, so they veto upstream."""


def _redacted_evidence(value: str | None) -> str | None:
    # Evidence is printed and stored: its credentials are masked here, and masking never
    # pushes an evidence that fit past EVIDENCE_CHARS.
    if not isinstance(value, str):
        return value
    # Imported here: a reader that only loads the types (a ledger listing) never needs
    # the redactor.
    from execkit._redact import redact

    masked = redact(value)
    return masked[:EVIDENCE_CHARS] if len(value) <= EVIDENCE_CHARS else masked


@attrs.frozen
class Classification:
    """Why one failed attempt failed.

    `reason` is short and stable (`http 503`, `spawn errno ENOENT`, `default`); `evidence`
    is the text that decided it (at most `EVIDENCE_CHARS`, credentials masked), or None
    when nothing matched; `retry_after_s` is the wait until a reset the vendor stated
    (upstream only), or None.
    Construction raises `InvalidInput` for a value outside those shapes.
    """

    failure_class: FailureClass = attrs.field(
        validator=checked(f"a FailureClass ({', '.join(FailureClass)})", instance_of(FailureClass)),
        metadata=json_key("class"),
    )
    reason: str = attrs.field(
        validator=checked(
            f"a non-empty string of at most {_MAX_REASON_CHARS} characters",
            non_blank,
            max_len(_MAX_REASON_CHARS),
        )
    )
    evidence: str | None = attrs.field(
        default=None,
        converter=_redacted_evidence,
        validator=opt_checked(
            f"a string of at most {EVIDENCE_CHARS} characters",
            instance_of(str),
            max_len(EVIDENCE_CHARS),
        ),
    )
    retry_after_s: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number of seconds >= 0", finite, ge(0))
    )

    @property
    def charged(self) -> bool:
        """True when the attempt spends the charged budget (class work)."""
        return self.failure_class.charged

    def to_dict(self) -> dict[str, str | float | None]:
        """`{"class", "reason", "evidence", "retry_after_s"}`, JSON-safe."""
        return to_json(self)
