"""Spend (issue #45): what a run cost, recorded with its result.

A run's cost is a `Usage` (`execkit._usage`) its adapter read from the CLI's structure;
`finish_run(usage=...)` stores it on the run, and a run ended without one keeps an
unknown cost (never zero).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from execkit._errors import InvalidInput
from execkit._json import to_json
from execkit._mask import mask_text
from execkit._usage import NO_USAGE, Usage, UsdSource
from execkit.ledger._model import Run

__all__ = ["Spend", "check_usage", "spend_of", "with_usage"]


@attrs.frozen
class Spend:
    """What some runs cost together (a task's, a lane's, a day's): their summed `usage`,
    how many `runs`, and how many of them have no USD figure (`unknown_usd`: a run still
    running, ended without a report, or reporting tokens only). A sum with any unknown
    part says so in `usage.usd_source`; the known part is kept in `usage.usd`."""

    usage: Usage = NO_USAGE
    runs: int = 0
    unknown_usd: int = 0

    def __add__(self, other: Spend) -> Spend:
        if not isinstance(other, Spend):
            return NotImplemented
        return Spend(
            self.usage + other.usage, self.runs + other.runs, self.unknown_usd + other.unknown_usd
        )

    def to_dict(self) -> dict[str, Any]:
        return {**to_json(self), "tokens": self.usage.tokens}

    def phrase(self) -> str:
        """`$0.42, 6,000 tokens over 2 runs (1 with unknown USD)`: how a surface words it."""
        usd = "$?" if self.usage.usd is None else f"${self.usage.usd:,.2f}"
        if self.unknown_usd and self.usage.usd is not None:
            usd += "+?"
        runs = f"{self.runs} run" + ("" if self.runs == 1 else "s")
        unknown = f" ({self.unknown_usd} with unknown USD)" if self.unknown_usd else ""
        return f"{usd}, {self.usage.tokens:,} tokens over {runs}{unknown}"


def spend_of(runs: Iterable[Run]) -> Spend:
    """What `runs` cost together, each run counted once (`Spend`). A run with no USD
    figure makes the sum's source `unknown`: unknown is never zero."""
    total = Spend()
    for run in runs:
        usage = run.usage
        unknown = usage.usd is None
        if unknown and usage.usd_source is UsdSource.UNKNOWN and not usage.known:
            # A run that reported nothing still makes the sum's money unknown.
            usage = Usage(usd_source=UsdSource.UNKNOWN)
        total = Spend(
            _summed(total.usage, usage, total.runs == 0),
            total.runs + 1,
            total.unknown_usd + int(unknown),
        )
    return total


def _summed(total: Usage, usage: Usage, first: bool) -> Usage:
    """`total + usage`, where a part with unknown USD makes the sum's source unknown."""
    summed = usage if first else total + usage
    if usage.usd is None and summed.usd_source is not UsdSource.UNKNOWN:
        summed = attrs.evolve(summed, usd_source=UsdSource.UNKNOWN)
    return summed


def check_usage(usage: object) -> Usage | None:
    """`usage` as a run's cost to store (its model name masked, as every vendor word the
    ledger stores), None for none; anything but a `Usage` is InvalidInput naming it."""
    if usage is None:
        return None
    if not isinstance(usage, Usage):
        raise InvalidInput(
            f"usage: must be a Usage (tokens by kind, usd, usd_source, model), "
            f"got {type(usage).__name__}",
            field="usage",
        )
    if usage.model is not None:
        return attrs.evolve(usage, model=mask_text(usage.model))
    return usage


def with_usage(run: Run, usage: Usage) -> Run:
    """`run` with `usage` as its cost."""
    return attrs.evolve(
        run,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        usd=usage.usd,
        usd_source=usage.usd_source,
        model=usage.model,
    )
