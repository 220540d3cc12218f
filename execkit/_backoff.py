"""The one backoff policy of execkit: capped exponential, with jitter, as an immutable value.

The durable scheduler (`decide`, the dispatcher) and the in-agent loop share it; they differ
only in where the jitter comes from (a seed derived from the history, so a restarted
scheduler computes the same retry time, or a random number) and in their defaults.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import attrs
from attrs.validators import ge, le, lt

from execkit._errors import InvalidInput
from execkit._validate import checked, finite, integer_arg

__all__ = ["AGENT_BACKOFF", "SCHEDULER_BACKOFF", "Backoff"]


def _max_at_least_base(inst: Backoff, _attribute: attrs.Attribute[Any], value: float) -> None:
    if value < inst.base_s:
        raise InvalidInput(
            f"max_s must be >= base_s ({inst.base_s!r}), got {value!r}", field="max_s"
        )


@attrs.frozen
class Backoff:
    """Capped exponential backoff with jitter: the one backoff policy of execkit.

    The wait after `n` consecutive failures (n >= 1) is `min(max_s, base_s * factor**(n-1))`
    scaled by `1 + jitter * u` with `u` in [-1, 1], then capped at `max_s` again, so it is
    always in (0, max_s]. `u` comes from `seed` when one is given (the durable scheduler:
    the same history gives the same time after a restart), else from `rng` (the in-agent
    loop), else 0. A wait the vendor asked for (`retry_after_s`) replaces the computed one,
    clamped to [0, max_s], so no vendor can park a caller past its own ceiling.

    Requires 0 < base_s <= max_s (finite), 1 <= factor <= 100, 0 <= jitter < 1;
    `InvalidInput` naming the field otherwise. The defaults are the scheduler's; the
    in-agent loop uses `AGENT_BACKOFF`.
    """

    base_s: float = attrs.field(
        default=10.0,
        validator=checked("a finite number of seconds > 0", finite, attrs.validators.gt(0)),
    )
    factor: float = attrs.field(
        default=2.0, validator=checked("a number in 1..100", finite, ge(1), le(100))
    )
    max_s: float = attrs.field(
        default=300.0,
        validator=[checked("a finite number of seconds", finite), _max_at_least_base],
    )
    jitter: float = attrs.field(
        default=0.1, validator=checked("a number in [0, 1)", finite, ge(0), lt(1))
    )

    def delay(
        self,
        failures: int,
        seed: str | None = None,
        *,
        rng: Callable[[], float] | None = None,
        retry_after_s: float | None = None,
    ) -> float:
        """Seconds to wait after `failures` (>= 1) consecutive failures (see the class)."""
        if failures.__class__ is not int or failures < 1:  # a plain int passes in one test
            integer_arg("failures", failures, 1)
        if retry_after_s is not None and math.isfinite(retry_after_s):
            return min(max(retry_after_s, 0.0), self.max_s)
        exponent = failures - 1
        # Compare in log space so a history of thousands of failures cannot overflow.
        if self.factor == 1 or exponent * math.log(self.factor) < math.log(
            self.max_s / self.base_s
        ):
            raw = min(self.max_s, self.base_s * self.factor**exponent)
        else:
            raw = self.max_s
        if seed is not None:
            unit = _unit_jitter(seed)
        elif rng is not None:
            unit = 2.0 * rng() - 1.0
        else:
            unit = 0.0
        return max(0.0, min(self.max_s, raw * (1.0 + self.jitter * unit)))


def _unit_jitter(seed: str) -> float:
    """A value in [-1, 1] that depends only on `seed` (not on PYTHONHASHSEED)."""
    digest = _blake2b()(seed.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SPAN * 2.0 - 1.0


_SPAN = float(2**64 - 1)


@functools.cache
def _blake2b() -> Callable[..., Any]:
    """`hashlib.blake2b`, imported at the first use: `hashlib` loads OpenSSL (2 ms), which
    a ledger listing that waits on no backoff never needs; once (a listing of open tasks
    hashes one seed a task)."""
    import hashlib

    return hashlib.blake2b


SCHEDULER_BACKOFF = Backoff()
"""The durable scheduler's default: 10 s doubling to 5 min, 10% jitter (the class defaults)."""

AGENT_BACKOFF = Backoff(base_s=2.0, factor=2.0, max_s=60.0, jitter=0.1)
"""The in-agent loop's default: retries within one run wait seconds, not minutes."""
