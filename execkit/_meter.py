"""Usage while a run goes: an adapter's per-line usage reader summed by a `UsageMeter`.

An adapter may read usage from each line its CLI prints (`usage_of(line)`, optional: from
structure only, like `parse`). It answers None for a line that says nothing of usage, a
`Usage` to add, or a `UsageEvent` when the line needs more than adding:

- `message`: the vendor's message id, for a CLI that repeats one message's usage (claude's
  stream-json prints an `assistant` event per content block, each with the whole message's
  usage so far): a later event of the same message replaces the earlier one's usage, so
  each message counts once, at its latest figure;
- `final`: the CLI's own total for the run (claude's `result` event, gemini's stream-json
  `result` stats): it replaces everything summed before it.

`UsageMeter` keeps that sum for one spawn in constant work per event (running counts,
never a re-sum of the messages seen) and is the spawn's line hook (`spawn(on_line=...)`,
or composed with an adapter's `watch`): with a `limit(total) -> bool` it answers the first
event after which the limit says so with `StopTree`, so the tree is stopped within one
usage event of crossing it (part B's caps are such a limit). `read_usage(text, usage_of)`
runs the same reader over a finished spawn's output, so an adapter's `parse` and the live
meter agree on the figure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from execkit._exec import Line, StopTree
from execkit._usage import NO_USAGE, Usage, UsdSource, checked_usage

__all__ = [
    "SPEND_LIMIT_REASON",
    "STOPPED_BY_METER",
    "UsageEvent",
    "UsageLimit",
    "UsageMeter",
    "UsageReader",
    "read_usage",
    "usage_reader",
]


SPEND_LIMIT_REASON = "spend limit"
"""The reason of a try a `usage_limit` stopped (`MappedResult.reason`, `AgentProof.reason`)."""


STOPPED_BY_METER = "usage limit crossed"
"""How `SpawnResult.stopped_by` starts for a spawn a `UsageMeter`'s limit stopped."""


@attrs.frozen
class UsageEvent:
    """One line's usage with how it combines (see the module docstring): `message` is the
    vendor's message id whose earlier figure this replaces; `final` marks the CLI's own
    total for the run, which replaces the whole sum."""

    usage: Usage = attrs.field(validator=attrs.validators.instance_of(Usage))
    message: str | None = None
    final: bool = False


UsageReader = Callable[[Line], "Usage | UsageEvent | None"]
"""An adapter's `usage_of`: one line in, None, a `Usage` or a `UsageEvent` out."""

UsageLimit = Callable[[Usage], bool]
"""Says whether a run's usage so far has crossed what it may spend (True: stop it)."""


_LEAST_CERTAIN_FIRST = tuple(reversed(UsdSource))


class _Sum:
    """Running totals of a multiset of `Usage` values that supports removing one, so a
    replaced message costs O(1), never a re-sum."""

    __slots__ = ("counts", "models", "parts", "premium", "sources", "usd", "usd_parts")

    def __init__(self) -> None:
        self.counts = [0, 0, 0, 0]
        self.premium = 0.0
        self.usd = 0.0
        self.usd_parts = 0  # parts with a USD figure
        self.parts = 0  # parts that reported anything (`Usage.known`)
        self.sources: Counter[UsdSource] = Counter()
        self.models: Counter[str | None] = Counter()

    def add(self, usage: Usage, sign: int = 1) -> None:
        if not usage.known:
            return
        counts = self.counts
        counts[0] += sign * usage.input_tokens
        counts[1] += sign * usage.output_tokens
        counts[2] += sign * usage.cache_read_tokens
        counts[3] += sign * usage.cache_write_tokens
        self.premium += sign * usage.premium_requests
        if usage.usd is not None:
            self.usd += sign * usage.usd
            self.usd_parts += sign
        self.parts += sign
        self.sources[usage.usd_source] += sign
        self.models[usage.model] += sign

    def total(self) -> Usage:
        if self.parts <= 0:
            return NO_USAGE
        # The less certain source present wins, as `Usage.__add__` sums it.
        sources = self.sources
        source = next(kind for kind in _LEAST_CERTAIN_FIRST if sources[kind] > 0)
        models = [model for model, n in self.models.items() if n > 0]
        counts = self.counts
        # Sums of checked values: built without running the validators again.
        return checked_usage(
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            max(0.0, self.usd) if self.usd_parts > 0 else None,
            source if self.usd_parts > 0 else UsdSource.UNKNOWN,
            models[0] if len(models) == 1 else None,
            max(0.0, self.premium),
        )


class UsageMeter:
    """One spawn's usage as its CLI prints it, summed; optionally a limit that stops it.

    `on_line` is a line hook: each line goes to `read` (an adapter's `usage_of`); what it
    returns is counted (a message's repeats once, a final total replacing the rest). With a
    `limit`, the first event after which `limit(total)` is True answers `StopTree` (once):
    the tree stops within that one event. `events` counts the usage events read; `total`
    is the sum so far (`NO_USAGE` before any); `crossed` is the total the limit stopped at.
    A reader or limit that raises is the spawn's exception (the tree is killed first). A
    reader that returns something else raises TypeError naming it.
    """

    __slots__ = ("_final", "_limit", "_messages", "_read", "_sum", "crossed", "events")

    def __init__(self, read: UsageReader, limit: UsageLimit | None = None) -> None:
        self._read = read
        self._limit = limit
        self._sum = _Sum()
        self._messages: dict[str, Usage] = {}
        self._final: Usage | None = None
        self.events = 0
        self.crossed: Usage | None = None

    @property
    def total(self) -> Usage:
        """What the CLI reported so far: its final total once it printed one, else the sum
        of its messages (each at its latest figure) and its loose usage events."""
        if self._final is not None:
            return self._final
        return self._sum.total()

    def add(self, got: Usage | UsageEvent) -> bool:
        """Count one usage event (what `on_line` does with a line's reading); whether it
        changed the total (a message repeated at the same figure does not)."""
        if isinstance(got, UsageEvent):
            event = got
        elif isinstance(got, Usage):
            event = UsageEvent(got)
        else:
            raise TypeError(f"usage_of must return None, a Usage or a UsageEvent, got {got!r}")
        self.events += 1
        if event.final:
            self._final = event.usage
            return True
        if event.message is not None:
            before = self._messages.get(event.message)
            if before is event.usage or before == event.usage:
                return False
            if before is not None:
                self._sum.add(before, -1)
            self._messages[event.message] = event.usage
        self._sum.add(event.usage)
        return True

    def on_line(self, line: Line) -> StopTree | None:
        """The line hook: read the line's usage, count it, stop the tree past the limit.
        An event that changed nothing (a message repeated at the same figure) asks the
        limit nothing: its answer would be the one it gave before."""
        got = self._read(line)
        if got is None:
            return None
        changed = self.add(got)
        if not changed or self._limit is None or self.crossed is not None:
            return None
        total = self.total
        if not self._limit(total):
            return None
        self.crossed = total
        return StopTree(f"{STOPPED_BY_METER} at {_said(total)}")


def _said(usage: Usage) -> str:
    usd = "" if usage.usd is None else f"${usage.usd:.4f} ({usage.usd_source.value}), "
    return f"{usd}{usage.tokens} tokens"


def usage_reader(adapter: object) -> UsageReader | None:
    """The adapter's optional `usage_of`, or None when it has none."""
    read: Any = getattr(adapter, "usage_of", None)
    return read if callable(read) else None


def read_usage(text: str | Iterable[str], read: UsageReader) -> Usage | None:
    """The usage `read` finds in a finished spawn's output (its stdout, or its lines), as
    the live meter would have summed it; None when no line reported any."""
    meter = UsageMeter(read)
    lines = text.splitlines() if isinstance(text, str) else text
    for text_line in lines:
        if text_line.strip():
            got = read(Line("stdout", text_line))
            if got is not None:
                meter.add(got)
    return meter.total if meter.events else None
