"""Helpers for the retry libraries runners already use: tenacity and stamina (issue #32).

Both libraries select what to retry by exception type or by a predicate, and `run_agent`
raises one `AgentFailed` subclass per class (`WorkFailure`, `EnvironmentFailure`,
`UpstreamFailure`), so selecting by type already works. These helpers add the two things a
type alone does not say:

- `retry_upstream(exc)`: True only for an uncharged upstream failure. Work is charged (a
  retry spends the work budget: the ledger's business, not a retry loop's) and environment
  needs a human. tenacity: `retry=retry_if_exception(retry_upstream)`; stamina:
  `on=retry_upstream`.
- the vendor's reset: a usage limit that resets in an hour must not be retried in a second.
  tenacity: `wait=wait_for_reset()` waits until `UpstreamFailure.reset_at` when the vendor
  stated one, else `fallback` (the in-agent backoff by default). stamina:
  `on=stamina_upstream_hook()` returns the seconds until the reset (stamina then waits
  exactly that) or True (stamina's own backoff), and False for anything but upstream.

Neither library is imported here: both take plain callables, so the extras
(`execkit-runner[tenacity]`, `execkit-runner[stamina]`) are needed only by the caller.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from execkit._backoff import AGENT_BACKOFF, Backoff
from execkit._proof import UpstreamFailure

__all__ = ["retry_upstream", "stamina_upstream_hook", "wait_for_reset"]


def retry_upstream(exc: BaseException) -> bool:
    """True for an `UpstreamFailure` (uncharged, worth a bounded retry), False for anything
    else: a work failure, an environment failure, any other error."""
    return isinstance(exc, UpstreamFailure)


def _until_reset(exc: UpstreamFailure, clock: Callable[[], float]) -> float | None:
    """Seconds left until the vendor's reset (>= 0), or None when it stated none."""
    if exc.reset_at is not None:
        return max(0.0, exc.reset_at - clock())
    if exc.retry_after_s is not None:
        return max(0.0, exc.retry_after_s)
    return None


def wait_for_reset(
    fallback: Callable[[Any], float] | None = None,
    *,
    backoff: Backoff = AGENT_BACKOFF,
    clock: Callable[[], float] = time.time,
    rng: Callable[[], float] = random.random,
    max_s: float | None = None,
) -> Callable[[Any], float]:
    """A tenacity `wait=`: after an `UpstreamFailure` whose vendor stated a reset, the
    seconds left until it (`reset_at - clock()`, or the stated wait when no `reset_at` was
    dated); after anything else, `fallback(retry_state)`, by default `backoff`'s capped
    exponential delay for the attempt number (jitter from `rng`). `max_s` caps the reset
    wait (None: the vendor's word is kept, however long).
    """

    def wait(retry_state: Any) -> float:
        outcome: Any = getattr(retry_state, "outcome", None)
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        if isinstance(exc, UpstreamFailure):
            left = _until_reset(exc, clock)
            if left is not None:
                return left if max_s is None else min(left, max_s)
        if fallback is not None:
            return fallback(retry_state)
        return backoff.delay(max(1, int(retry_state.attempt_number)), rng=rng)

    return wait


def stamina_upstream_hook(
    *, clock: Callable[[], float] = time.time, max_s: float | None = None
) -> Callable[[BaseException], bool | float]:
    """A stamina backoff hook (`stamina.retry(on=...)`): False for anything but an
    `UpstreamFailure` (not retried); for one, the seconds left until the vendor's reset
    when it stated one (capped at `max_s` when given), else True (stamina's own backoff).
    It takes any `BaseException`, as stamina 26.2 types the hook it calls."""

    def hook(exc: BaseException) -> bool | float:
        if not isinstance(exc, UpstreamFailure):
            return False
        left = _until_reset(exc, clock)
        if left is None:
            return True
        return left if max_s is None else min(left, max_s)

    return hook
