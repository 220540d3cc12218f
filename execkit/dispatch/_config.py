"""The dispatcher's knobs (ADR 015): the dispatch cap, where a given-up issue goes, backoff."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from attrs.validators import ge, gt, in_, le, max_len, not_, optional

from execkit._budget import Backoff, DispatchCap
from execkit._errors import InvalidInput
from execkit._json import to_json
from execkit._validate import checked, finite, integer, non_blank
from execkit.dispatch._board import BoardIssue, adapter_order
from execkit.ledger import Task, TaskValues

__all__ = ["DispatchConfig"]

_MAX_STATE = 200

# 0 is refused, not read as "no cap": a config that forgot the value must not silently
# retry forever. Negative is the explicit opt-in (ADR 015).
_CAP = checked("an integer >= 1, or negative for no cap", integer, not_(in_((0,))))
_STATE = checked(
    f"a non-empty state name of at most {_MAX_STATE} characters", non_blank, max_len(_MAX_STATE)
)
_FAILED_STATE = checked(
    'a non-empty state name, or None ("none" in a config file)',
    optional([non_blank, max_len(_MAX_STATE)]),
)
_SECONDS = checked("a finite number of seconds > 0", finite, gt(0))
MAX_CONCURRENT_AGENTS = 256
_CONCURRENCY = checked(
    f"an integer from 1 to {MAX_CONCURRENT_AGENTS}", integer, ge(1), le(MAX_CONCURRENT_AGENTS)
)
_ADAPTER = checked(
    f"a non-empty adapter name of at most {_MAX_STATE} characters", non_blank, max_len(_MAX_STATE)
)


def _per_adapter(value: object) -> tuple[tuple[str, int], ...]:
    """A mapping of adapter name to its cap, kept as sorted pairs (hashable, one order);
    each name and cap checked, naming the entry."""
    if isinstance(value, tuple) and all(isinstance(p, tuple) for p in value):
        value = dict(value)
    if not isinstance(value, Mapping):
        raise InvalidInput(
            "max_concurrent_per_adapter must be a mapping of adapter name to an integer "
            f"from 1 to {MAX_CONCURRENT_AGENTS}, got {value!r}",
            field="max_concurrent_per_adapter",
        )
    pairs = []
    for name, cap in value.items():
        field = f"max_concurrent_per_adapter.{name}"
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput(
                f"max_concurrent_per_adapter: {name!r} is not an adapter name", field=field
            )
        if (
            isinstance(cap, bool)
            or not isinstance(cap, int)
            or not 1 <= cap <= MAX_CONCURRENT_AGENTS
        ):
            raise InvalidInput(
                f"{field}: must be an integer from 1 to {MAX_CONCURRENT_AGENTS}, got {cap!r}",
                field=field,
            )
        pairs.append((name, cap))
    return tuple(sorted(pairs))


@attrs.frozen
class DispatchConfig:
    """The dispatcher's knobs (ADR 015).

    `max_attempts` caps the dispatches of one issue (initial run + retries); 0 is refused.
    Negative is ADR 015's "retry forever": no cap, and the charged work budget does not stop
    the issue either (the environment stop and the uncharged ceiling still do: ADR 0046).
    `failed_state` is where a given-up issue goes (None opts out of the move, and then the
    issue is retried past its bounds, loudly: ADR 015's legacy retry); `done_state` where a
    succeeded one goes. The retry backoff is exponential
    from `base_backoff_s`, capped at `max_retry_backoff_s`. InvalidInput names a bad field.

    Concurrency: at most `max_concurrent_agents` (1..256) agents run at once, each in its
    own slot (its own process tree and lease), and at most `max_concurrent_per_adapter[name]`
    of them on one adapter (a vendor's own rate limit, a licence's seat count). An issue
    runs on its own `adapter`, else on `default_adapter`. `adapters` (issue #46) is the
    board's default order for an issue that names no adapter of its own: the first is
    tried first, and the next open one runs the issue while the first's vendor lane is
    parked, cooling or stopped (an issue's own `adapters` order does the same for it).
    """

    max_attempts: int = attrs.field(default=10, validator=_CAP)
    failed_state: str | None = attrs.field(default="blocked", validator=_FAILED_STATE)
    base_backoff_s: float = attrs.field(default=10.0, validator=_SECONDS)
    max_retry_backoff_s: float = attrs.field(default=300.0, validator=_SECONDS)
    done_state: str = attrs.field(default="done", validator=_STATE)
    max_concurrent_agents: int = attrs.field(default=4, validator=_CONCURRENCY)
    max_concurrent_per_adapter: tuple[tuple[str, int], ...] = attrs.field(
        default=(), converter=_per_adapter
    )
    default_adapter: str = attrs.field(default="generic", validator=_ADAPTER)
    adapters: tuple[str, ...] = attrs.field(default=(), converter=adapter_order)

    def __attrs_post_init__(self) -> None:
        if self.max_retry_backoff_s < self.base_backoff_s:
            raise InvalidInput(
                f"max_retry_backoff_s: must be >= base_backoff_s ({self.base_backoff_s!r}); "
                f"got {self.max_retry_backoff_s!r}",
                field="max_retry_backoff_s",
            )
        if self.failed_state == self.done_state:
            raise InvalidInput(
                f"failed_state and done_state must differ; both are {self.done_state!r}",
                field="failed_state",
            )

    def adapter_of(self, issue: BoardIssue) -> str:
        """The adapter an issue runs on first: its own (the first of its order), else the
        first of the board's order, else the default."""
        return self.adapters_of(issue)[0]

    def adapters_of(self, issue: BoardIssue) -> tuple[str, ...]:
        """The adapters an issue may run on, in order (issue #46): its own `adapters`, else
        its own `adapter` alone, else the board's `adapters`, else the default alone."""
        if issue.adapters:
            return issue.adapters
        if issue.adapter:
            return (issue.adapter,)
        return self.adapters or (self.default_adapter,)

    def adapter_cap(self, adapter: str) -> int:
        """How many agents may run at once on `adapter`."""
        return dict(self.max_concurrent_per_adapter).get(adapter, self.max_concurrent_agents)

    @property
    def cap(self) -> DispatchCap:
        """The ledger's view of the cap; negative keeps its meaning there: no cap, and work
        failures retried without end (ADR 015's explicit escape hatch)."""
        return DispatchCap(self.max_attempts)

    @property
    def backoff(self) -> Backoff:
        """The retry backoff the ledger computes `next_attempt_at` with."""
        return Backoff(base_s=float(self.base_backoff_s), max_s=float(self.max_retry_backoff_s))

    def bound_for(self, task: Task | TaskValues | None) -> int | None:
        """The binding bound on a task's attempts: the dispatch cap or its explicit limit,
        whichever is lower; None when neither bounds it."""
        bounds = [self.max_attempts] if self.max_attempts > 0 else []
        if task is not None and task.max_attempts:
            bounds.append(task.max_attempts)
        return min(bounds) if bounds else None

    def to_dict(self) -> dict[str, Any]:
        doc = to_json(self)
        doc["max_concurrent_per_adapter"] = dict(self.max_concurrent_per_adapter)
        if not self.adapters:
            del doc["adapters"]  # the shape from before issue #46's order, when unused
        return doc

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> DispatchConfig:
        """Build from a config file's mapping; `failed_state: "none"` (or null) means None.

        Unknown keys and bad values raise InvalidInput naming the key and what is allowed.
        """
        if not isinstance(data, Mapping):
            raise InvalidInput(
                f"dispatch config must be a mapping, got {type(data).__name__}", field="dispatch"
            )
        allowed = [f.name for f in attrs.fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise InvalidInput(
                f"dispatch config: unknown keys {unknown}; allowed: {', '.join(allowed)}",
                field=unknown[0],
            )
        values = dict(data)
        failed = values.get("failed_state", "blocked")
        if failed is None or (isinstance(failed, str) and failed.strip().lower() == "none"):
            values["failed_state"] = None
        return cls(**values)
