"""What one attempt cost: tokens by kind, USD, and where the USD came from.

A vendor CLI reports its usage in its own structure (claude's `total_cost_usd` and
`usage`, codex's `turn.completed` usage, gemini's `stats`, opencode's `step_finish`); an
adapter reads it into a `Usage`, as it reads the class, from structure only. USD has a
source (`UsdSource`): `reported` by the vendor, `priced` by execkit from a price table
and the tokens, or `unknown`. Unknown is never zero: a caller that must bound spend
treats an unknown cost as at least its reservation, never as free.

`Usage` values add: the usage of one attempt is the sum of what its CLI reported as it
ran (each vendor message counted once), and the spend of a task is the sum of its runs.
A sum with any unknown USD has unknown USD (a known part is kept as `usd`, but the source
says it is incomplete).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs
from attrs.validators import ge, instance_of, optional

from execkit._errors import InvalidInput
from execkit._json import to_json
from execkit._validate import checked, finite, integer, is_integer, is_number, opt_checked

__all__ = ["NO_USAGE", "Usage", "UsdSource", "checked_usage", "load_usage"]


class UsdSource(enum.StrEnum):
    """Where a run's USD came from. Ordered from most to least certain."""

    REPORTED = "reported"  # the vendor CLI printed it (claude's total_cost_usd)
    PRICED = "priced"  # execkit priced the reported tokens from its price table
    UNKNOWN = "unknown"  # neither: the tokens (if any) are known, the money is not


def _source(value: object) -> UsdSource:
    try:
        return UsdSource(value if isinstance(value, str) else repr(value))
    except ValueError:
        allowed = ", ".join(source.value for source in UsdSource)
        raise InvalidInput(
            f"usd_source must be one of {allowed}, got {value!r}", field="usd_source"
        ) from None


_TOKENS = checked("an integer >= 0", integer, ge(0))


@attrs.frozen
class Usage:
    """Tokens by kind and USD for one attempt (or a sum of attempts).

    `usd` is None exactly when nothing priced or reported any money; `usd_source` says
    how far to trust it (a sum of a reported and an unknown part is `unknown`, with the
    known part kept in `usd`). `model` is the vendor's model name when it said one
    (None for a sum over several models). Fields refuse negative or non-integer counts
    and a non-finite or negative USD with `InvalidInput` naming the field.
    """

    input_tokens: int = attrs.field(default=0, validator=_TOKENS)
    output_tokens: int = attrs.field(default=0, validator=_TOKENS)
    cache_read_tokens: int = attrs.field(default=0, validator=_TOKENS)
    cache_write_tokens: int = attrs.field(default=0, validator=_TOKENS)
    usd: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number >= 0", finite, ge(0))
    )
    usd_source: UsdSource = attrs.field(default=UsdSource.UNKNOWN, converter=_source)
    model: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    # GitHub Copilot bills a plan's "premium requests", not tokens or USD: its `result`
    # event's `usage.premiumRequests`, kept as the figure it is (never turned into money);
    # fractional, as a model's multiplier makes one request count 0.33 of one.
    premium_requests: float = attrs.field(
        default=0.0, validator=checked("a finite number >= 0", finite, ge(0))
    )

    @usd_source.validator
    def _money_has_a_source(self, _attribute: attrs.Attribute[UsdSource], value: UsdSource) -> None:
        if self.usd is None and value is not UsdSource.UNKNOWN:
            raise InvalidInput(
                f"usd_source: {value.value!r} needs a usd figure; with usd None it is 'unknown'",
                field="usd_source",
            )

    @property
    def tokens(self) -> int:
        """Every token of every kind: what a token cap counts."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    @property
    def known(self) -> bool:
        """Whether anything was reported at all (a token or a USD figure)."""
        return self.tokens > 0 or self.usd is not None or self.premium_requests > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe mapping (`usd_source` as its string); `load_usage` reads it back."""
        return to_json(self)

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        if self.usd is None and other.usd is None:
            usd = None
        else:
            usd = (self.usd or 0.0) + (other.usd or 0.0)
        if not self.known:
            source = other.usd_source
        elif not other.known:
            source = self.usd_source
        else:  # the less certain of the two: a part whose money is missing is `unknown`
            source = max(self.usd_source, other.usd_source, key=_UNCERTAINTY.index)
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            usd=usd,
            usd_source=source,
            model=_same(self.model, other.model, self.known, other.known),
            premium_requests=self.premium_requests + other.premium_requests,
        )


def _same(mine: str | None, theirs: str | None, mine_known: bool, theirs_known: bool) -> str | None:
    """The model of a sum: the one both parts name, a part's own when the other reported
    nothing, else None (a sum over several models has none)."""
    if not theirs_known:
        return mine
    if not mine_known:
        return theirs
    return mine if mine == theirs else None


_UNCERTAINTY = list(UsdSource)
NO_USAGE = Usage()


_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)


def load_usage(data: object) -> Usage | None:
    """A `Usage` from `Usage.to_dict` output (a proof's `"usage"`); None for None.

    A missing count is 0, a missing `usd` is None (source `unknown`), unknown keys are
    ignored. Raises InvalidInput naming the field for a wrong type or a value out of range
    (a negative or fractional count, a negative USD, a source that is not one of ours).
    """
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidInput(
            f"usage must be an object or null; got {type(data).__name__}", field="usage"
        )
    counts: dict[str, int] = {}
    for key in _COUNTS:
        value = data.get(key, 0)
        if not is_integer(value):
            raise InvalidInput(f"usage.{key} must be an integer >= 0, got {value!r}", field=key)
        counts[key] = value
    premium = data.get("premium_requests", 0)
    if not is_number(premium) or premium < 0:
        raise InvalidInput(
            f"usage.premium_requests must be a number >= 0, got {premium!r}",
            field="premium_requests",
        )
    usd = data.get("usd")
    if usd is not None and not is_number(usd):
        raise InvalidInput(f"usage.usd must be a number >= 0 or null, got {usd!r}", field="usd")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput(f"usage.model must be a string or null, got {model!r}", field="model")
    source = data.get("usd_source", UsdSource.UNKNOWN.value if usd is None else None)
    return Usage(
        usd=None if usd is None else float(usd),
        usd_source=_source(source),
        model=model,
        premium_requests=float(premium),
        **counts,
    )


def checked_usage(
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_write_tokens: int,
    usd: float | None,
    usd_source: UsdSource,
    model: str | None,
    premium_requests: float = 0.0,
) -> Usage:
    """A `Usage` of values the caller has already checked (counts that are ints >= 0, a
    finite USD >= 0 or None with its source, a str or None model), built without running
    the validators again: what a meter does once per usage event, where the validators
    were most of the cost of reading a line (benchmarks/bench_usage.py). Anything read
    from outside (a stored proof, a file) goes through `Usage(...)` or `load_usage`."""
    usage = object.__new__(Usage)
    put = object.__setattr__
    put(usage, "input_tokens", input_tokens)
    put(usage, "output_tokens", output_tokens)
    put(usage, "cache_read_tokens", cache_read_tokens)
    put(usage, "cache_write_tokens", cache_write_tokens)
    put(usage, "usd", usd)
    put(usage, "usd_source", usd_source)
    put(usage, "model", model)
    put(usage, "premium_requests", premium_requests)
    return usage
