"""The entry points: `classify` for a spawn, `classify_text` for a text.

`classify(result)` asks in order of durability: a succeeded run is never classed (None);
then structure (structure.py: a spawn errno); then `classify_text` over the last
`TAIL_CHARS` of `result.failure_text()`; otherwise work, `timeout` for a timed-out run,
else `default`. `classify_text` reads only the last `tail_chars` (8 KiB by default), so a
text of any length costs what its tail costs; it is upstream or work, never environment
(scan.py decides, with the rows of rules.py). `classification_fields` is the shape
`execkit run --json` merges.
"""

from __future__ import annotations

from execkit._classify.scan import Scan, decide_scan, evidence
from execkit._classify.structure import spawn_verdict
from execkit._classify.verdict import Classification, FailureClass, Reason, stall_reason
from execkit._errors import InvalidInput
from execkit._exec import SpawnResult
from execkit._validate import integer_arg

TAIL_CHARS = 8192
"""How much of the failure text the text rules read: its last 8 KiB (characters)."""

_NO_CLASSIFICATION: dict[str, str | float | None] = {
    "class": None,
    "reason": None,
    "evidence": None,
    "retry_after_s": None,
}


def _check_tail_chars(tail_chars: int) -> None:
    integer_arg("tail_chars", tail_chars, 1)


def classify_text(
    text: str, *, tail_chars: int = TAIL_CHARS, now: float | None = None
) -> Classification:
    """Upstream when the last `tail_chars` of `text` match the documented list, else work.

    Never environment: that class comes only from structure (`classify`). Work carries
    reason `default`, or the account-limit row that vetoed upstream; upstream carries
    `retry_after_s` when the text states a reset (`now`: the clock for absolute resets,
    default `time.time()`). Raises `InvalidInput` for a `tail_chars` below 1 or a `text`
    that is not a str.
    """
    _check_tail_chars(tail_chars)
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a str, got {type(text).__name__}", field="text")
    tail = text[-tail_chars:]
    decided, wait = decide_scan(Scan(tail), now)
    if decided is None:
        return Classification(FailureClass.WORK, Reason.DEFAULT)
    failure_class, hit = decided
    return Classification(failure_class, hit.reason, evidence(tail, hit.start, hit.end), wait)


def classify(
    result: SpawnResult, *, tail_chars: int = TAIL_CHARS, now: float | None = None
) -> Classification | None:
    """Class one spawn's failure; None when it succeeded (`result.ok`).

    Structural rules first (spawn errno), then `classify_text` over the last `tail_chars`
    of `result.failure_text()` (`now` as there), then work (`timeout` or `default`). A
    run its stall watchdog stopped is work, "stalled: no output for S s".
    Raises `InvalidInput` for a `tail_chars` below 1.
    """
    _check_tail_chars(tail_chars)
    if result.ok:
        return None
    if result.spawn_errno is not None:
        return spawn_verdict(result, result.spawn_errno)
    if result.stalled_after_s is not None:
        # Stopped for its silence: the text before the silence does not say why it fell
        # silent, so nothing here is positively upstream (an adapter may read more).
        return Classification(FailureClass.WORK, stall_reason(result.stalled_after_s))
    verdict = classify_text(result.failure_text(tail_chars), tail_chars=tail_chars, now=now)
    if verdict.failure_class is FailureClass.UPSTREAM or not result.timed_out:
        return verdict
    return Classification(FailureClass.WORK, Reason.TIMEOUT)


def classification_fields(result: SpawnResult) -> dict[str, str | float | None]:
    """`classify(result).to_dict()`, or all four keys None for a run that succeeded.

    The shape `execkit run --json` merges into its output.
    """
    verdict = classify(result)
    return dict(_NO_CLASSIFICATION) if verdict is None else verdict.to_dict()
