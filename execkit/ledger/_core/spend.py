"""Spend (issue #45): what a run cost, recorded with its result, and the caps admission
holds it to.

A run's cost is a `Usage` (`execkit._usage`) its adapter read from the CLI's structure;
`finish_run(usage=...)` stores it on the run, and a run ended without one keeps an
unknown cost (never zero).

Caps are enforced at admission, in the transaction that starts the run (`_spend_gate`,
after every other check of `start_run`): with no spend configuration stored, admission
reads its key and nothing else. Otherwise the run's reservation is the larger of the
operator's floor and the 90th percentile of its lane's recent costs; the task's own budget
and every window cap that applies (ledger-wide and the run's lane's) must have room for it
beside what their window already holds (each run's actual cost once it ended with one,
its reservation while it runs or when its cost is unknown). The window sums are read
after a lock every capped admission takes (SQLite: the write lock; PostgreSQL: an advisory
lock taken after the admission's row locks), so racing admissions never together reserve
past a cap. The reservation is stored with the run and replaced by its cost at its result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs

from execkit._budget import AttemptStatus, BlockedOn, Decision, NextAction
from execkit._errors import (
    AdmissionRefused,
    Conflict,
    Forbidden,
    InvalidInput,
    SpendCapReached,
    StorageError,
    TaskBlocked,
    TaskFinished,
)
from execkit._json import to_json
from execkit._mask import mask_text
from execkit._usage import NO_USAGE, Usage, UsdSource
from execkit.ledger._core.base import FINISHED_STATUSES, when
from execkit.ledger._core.inputs import as_actor, check_task_ids, moment
from execkit.ledger._core.store import SpendPlan, SpendReads, TaskRecord, Tx
from execkit.ledger._core.wake import WakeOps
from execkit.ledger._model import (
    OPERATE_ROLE,
    Actor,
    AuditAction,
    AuditEntry,
    Ledger,
    NotifyKind,
    Run,
    Task,
    TaskState,
    TaskStatus,
    TaskValues,
)
from execkit.ledger._spend import (
    SPEND_META_KEY,
    SpendCap,
    SpendConfig,
    SpendRoom,
    SpendRow,
    SpendWindow,
    TaskBudget,
    TaskCost,
    WindowUse,
    check_lane_name,
    task_costs_of,
    window_bounds,
)

_N = TypeVar("_N", int, float)

__all__ = [
    "Reservation",
    "Spend",
    "SpendOps",
    "check_usage",
    "percentiles",
    "spend_of",
    "with_usage",
]


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


TaskCostReader = Callable[[Sequence[str]], dict[str, TaskCost]]
"""Reads what the runs of a page of tasks (at most `LIST_PAGE`) reported together, by task
id (`task_cost_reader`)."""


def task_cost_reader(ledger: Ledger) -> TaskCostReader | None:
    """How to read what tasks' runs reported (`TaskCost`), a page of tasks at a time, or
    None when no run of the ledger reported a cost (a USD figure or tokens). From a ledger
    of this process, `task_costs`: a read a page, memory flat whatever the ledger's size;
    from any other (a server), every run's spend row read once (`spend_rows`) and summed
    here."""
    if isinstance(ledger, SpendOps):
        return ledger.task_costs if ledger.costs_reported() else None
    rows = ledger.spend_rows()
    if not any(row.usd is not None or row.tokens > 0 for row in rows):
        return None
    costs = task_costs_of(rows)
    return lambda task_ids: {task: costs[task] for task in task_ids if task in costs}


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


_RUNNABLE = frozenset({TaskState.READY, TaskState.BACKOFF})


def _held_fields(reason: str) -> dict[str, Any]:
    """What a task its own budget holds shows instead of its policies' answer, in the
    fields a `Task` (and `TaskValues`) and a `Decision` share; each adds its own (`ready`,
    `next_action`)."""
    return {
        "state": TaskState.BLOCKED,
        "blocked_on": BlockedOn.SPEND,
        "reason": reason,
        "next_attempt_at": None,
    }


# How many of a lane's latest runs that reported a cost its reservation estimate reads
# (`percentiles`: the 90th), and for how long (in the ledger's clock) an estimate read is
# used again: a run's reservation is an estimate, what the caps hold is exact (each run's
# reservation as stored, summed under the spend lock), so a minute-old estimate costs no
# cap anything, while the read (50 rows, under the spend lock every capped admission of
# the fleet queues on) leaves every admission of a lane but one a minute. A lane with no
# reported cost yet has no estimate to keep: it is read again at each admission.
RECENT_RUNS = 50
ESTIMATE_TTL_S = 60.0
# A window's spend at this share of a cap is an audited `spend.warning`, once a window.
WARN_SHARE = 0.8


@attrs.frozen
class Reservation:
    """What an admission holds for its run while it runs (replaced by the actual cost
    when it ends), and the caps it counted against (each with its window's start and
    the share of it used with the reservation: the 80% warnings read it)."""

    usd: float
    tokens: int
    counted: tuple[tuple[SpendCap, float, float], ...] = ()


def percentiles(recent: Sequence[tuple[float | None, int]]) -> tuple[float | None, int | None]:
    """The 90th percentile (nearest rank) of the USD, and of the tokens, of `recent` runs'
    costs (None: no run reported one): what a lane's reservation estimate is."""
    usd_seen = sorted(usd for usd, _tokens in recent if usd is not None)
    tokens_seen = sorted(tokens for _usd, tokens in recent if tokens > 0)
    return _nearest_rank(usd_seen), _nearest_rank(tokens_seen)


def _nearest_rank(values: Sequence[_N]) -> _N | None:
    if not values:
        return None
    return values[(9 * len(values) + 9) // 10 - 1]  # the ceil(0.9 n)-th smallest


def reservation_of(
    config: SpendConfig, seen_usd: float | None, seen_tokens: int | None
) -> tuple[float, int]:
    """A run's reservation: the larger of the operator's floor and its lane's estimate
    (`percentiles`; None: no recent run reported that kind). Unknown is never zero."""
    return (
        max(config.floor_usd, 0.0 if seen_usd is None else seen_usd),
        max(config.floor_tokens, 0 if seen_tokens is None else seen_tokens),
    )


def _windows(
    caps: Sequence[SpendCap], bounds: Sequence[tuple[float, float]], subscriptions: Sequence[str]
) -> tuple[tuple[float, str | None], ...]:
    """The windows (start, lane) an admission's spend reads sum for `caps` (their
    `window_bounds`), then, for each ledger-wide cap in turn, its window on each of the
    `subscriptions` lanes (their USD is left out of it: `_less_subscriptions`): one place,
    so the reads a store sends ahead are the ones the gate asks for (`_spend_plan`,
    `_spend_gate`)."""
    starts = [start for start, _end in bounds]
    return (
        *((start, cap.lane) for cap, start in zip(caps, starts, strict=True)),
        *(
            (start, lane)
            for cap, start in zip(caps, starts, strict=True)
            if cap.lane is None
            for lane in subscriptions
        ),
    )


def _money(usd: float) -> str:
    return f"${usd:,.2f}"


class SpendOps(WakeOps):
    """Spend caps (issue #45): the ledger's windows and floor, a task's own budget, and
    admission against them (`_spend_gate` in `start_run`'s transaction)."""

    def _spend_config(self, tx: Tx) -> SpendConfig | None:
        raw = tx.meta(SPEND_META_KEY)
        return None if raw is None else self._parsed_config(raw)

    def _parsed_config(self, stored: str) -> SpendConfig:
        """The spend configuration `stored` holds (StorageError for one that is not),
        noting whether some task has its own cap (`_task_budgets_seen`)."""
        config = SpendConfig.from_stored(stored)
        if config.task_budgets:
            self._task_budgets_seen = True
        return config

    def spend_config(self) -> SpendConfig:
        """The ledger's spend caps and reservation floor (the defaults: no cap)."""
        with self._store.read() as tx:
            return self._spend_config(tx) or SpendConfig()

    def _store_config(
        self, tx: Tx, before: SpendConfig, after: SpendConfig, who: Actor, at: float
    ) -> SpendConfig:
        """Store `after` in place of `before`, audited `spend.caps` (nothing when they are
        the same and one is stored), and wake the dispatchers: a raised cap or a lane
        held to tokens only may let a held issue run now. Returns what is in force."""
        if after == before and tx.meta(SPEND_META_KEY) is not None:
            return before
        tx.set_meta(SPEND_META_KEY, after.to_stored())
        self._wake(tx)
        tx.audit(
            AuditEntry(
                at=at,
                actor=str(who),
                action=AuditAction.SPEND_CAPS,
                detail={"from": before.to_dict(), "to": after.to_dict()},
            )
        )
        return after

    def set_spend_cap(
        self,
        cap: SpendCap | None = None,
        *,
        actor: Actor | str,
        floor_usd: float | None = None,
        floor_tokens: int | None = None,
        now: float | None = None,
    ) -> SpendConfig:
        """Set one of the ledger's spend caps and/or the reservation's floor (role
        `agent.operate`, audited `spend.caps`): `cap` replaces the cap of its lane and
        window (one with neither usd nor tokens removes it), and `floor_usd`/`floor_tokens`
        replace the floor when given. Stored in the ledger, so every host admits against
        the same caps. InvalidInput naming the field for a bad value (nothing stored); the
        same values as now write nothing. Returns the configuration in force afterwards."""
        who = as_actor(actor)
        at = moment(now)
        if cap is not None and not isinstance(cap, SpendCap):
            raise InvalidInput(f"cap must be a SpendCap, got {type(cap).__name__}", field="cap")
        changes: dict[str, Any] = {}
        if floor_usd is not None:
            changes["floor_usd"] = floor_usd
        if floor_tokens is not None:
            changes["floor_tokens"] = floor_tokens
        with self._store.write() as tx:
            if OPERATE_ROLE not in self._roles(tx, who):
                raise Forbidden(f"changing the spend caps needs the role {OPERATE_ROLE}")
            before = self._spend_config(tx) or SpendConfig()
            after = attrs.evolve(before.with_caps([] if cap is None else [cap]), **changes)
            return self._store_config(tx, before, after, who, at)

    def override_spend_cap(
        self,
        window: SpendWindow | str,
        *,
        lane: str | None = None,
        actor: Actor | str,
        now: float | None = None,
    ) -> SpendConfig:
        """Lift the cap of `window` (ledger-wide, or `lane`'s) for the window that holds
        `now`: no admission and no running run is held to it until that window ends (a
        rolling 5 h window: for the next five hours). Role `agent.operate`, audited
        `spend.override` with the cap and until when; every host sees it. Overrides whose
        window ended are dropped. InvalidInput naming `window` for a window with no such
        cap; the same override again writes nothing. Returns the configuration after."""
        who = as_actor(actor)
        at = moment(now)
        probe = SpendCap(window, lane=lane, usd=1.0)  # InvalidInput: the window, the lane
        with self._store.write() as tx:
            if OPERATE_ROLE not in self._roles(tx, who):
                raise Forbidden(f"overriding a spend cap needs the role {OPERATE_ROLE}")
            before = self._spend_config(tx) or SpendConfig()
            cap = next((c for c in before.caps if c.key == probe.key), None)
            if cap is None:
                raise InvalidInput(
                    f"there is no {probe.name.removeprefix('the ')} to override "
                    "(execkit budget show lists the caps)",
                    field="window",
                )
            until = window_bounds(cap, at)[1]
            if before.overridden_until(cap, at) == until:
                return before
            kept = [(key, end) for key, end in before.overrides if end > at and key != cap.key]
            after = attrs.evolve(before, overrides=(*kept, (cap.key, until)))
            tx.set_meta(SPEND_META_KEY, after.to_stored())
            self._wake(tx)  # a held issue may run now
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.SPEND_OVERRIDE,
                    detail={"cap": cap.name, "until": until, **cap.to_dict()},
                )
            )
            return after

    def set_subscription_lane(
        self, lane: str, subscription: bool, *, actor: Actor | str, now: float | None = None
    ) -> SpendConfig:
        """Mark vendor lane `lane` as a subscription (or not): its runs' USD is recorded
        (claude prices even a subscription's session) but held to no window's USD cap,
        only to tokens. Role `agent.operate`, audited `spend.caps`; every host sees it.
        InvalidInput naming `lane` for a name that is not ADAPTER/CREDENTIAL, or
        `subscription` for a value that is not a bool. Returns the configuration after."""
        check_lane_name(lane)
        if not isinstance(subscription, bool):
            raise InvalidInput(
                f"subscription must be true or false, got {subscription!r}", field="subscription"
            )
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            if OPERATE_ROLE not in self._roles(tx, who):
                raise Forbidden(f"marking a subscription lane needs the role {OPERATE_ROLE}")
            before = self._spend_config(tx) or SpendConfig()
            lanes = set(before.subscription_lanes)
            lanes = lanes | {lane} if subscription else lanes - {lane}
            after = attrs.evolve(before, subscription_lanes=tuple(lanes))
            return self._store_config(tx, before, after, who, at)

    def spend_windows(self, *, now: float | None = None) -> list[WindowUse]:
        """What each cap's window holds now (`WindowUse`), in the caps' order; none
        without a cap. `full` when the window has no room for the floor's reservation
        (never while an operator's override lifts the cap: `overridden_until`)."""
        at = moment(now)
        with self._store.read() as tx:
            config = self._spend_config(tx)
            if config is None:
                return []
            found = []
            for cap in config.caps:
                start, reopens = window_bounds(cap, at)
                usd, tokens, first = tx.window_spend(start, cap.lane)
                usd = _usd_held(tx, config, cap, start, usd)
                if cap.window is SpendWindow.ROLLING_5H and first is not None:
                    reopens = first + (at - start)
                lifted = config.overridden_until(cap, at)
                full = lifted is None and (
                    (cap.usd is not None and usd + config.floor_usd > cap.usd + 1e-9)
                    or (cap.tokens is not None and tokens + config.floor_tokens > cap.tokens)
                )
                found.append(
                    WindowUse(
                        cap.name, cap.window, cap.lane, cap.usd, cap.tokens, cap.tz, start,
                        reopens, usd, tokens, full, lifted,
                    )
                )  # fmt: skip
            return found

    def _spend_block(self, tx: Tx, task: Task) -> Task:
        """`task` as `get_task` shows it (issue #45): an open task that would run, whose
        own budget has no room left for the least reservation (the floor), is blocked on
        `spend`, its reason naming the cap and the command that raises it (`_spend_held`)."""
        if task.status is not TaskStatus.OPEN or task.state not in _RUNNABLE:
            return task
        reason = self._spend_held(tx, (task.id,)).get(task.id)
        if reason is None:
            return task
        return attrs.evolve(task, **_held_fields(reason), ready=False)

    def _spend_decision(self, tx: Tx, task_id: str, decision: Decision) -> Decision:
        """`decision`, the policies' answer for open task `task_id`, as `get_task` shows
        it (`_spend_block`): blocked on `spend` when its own budget holds it, so what a
        person is told of a block (the audit, `issue.blocked`) names the cap."""
        if decision.state not in _RUNNABLE:
            return decision
        reason = self._spend_held(tx, (task_id,)).get(task_id)
        if reason is None:
            return decision
        return attrs.evolve(decision, **_held_fields(reason), next_action=NextAction.NONE)

    def _spend_held(self, tx: Tx, task_ids: Iterable[str]) -> dict[str, str]:
        """Which of `task_ids` their own budget holds (no room left for the floor), each
        with the reason a task so blocked shows; read only when some task has a budget
        (one `ledger_meta` row otherwise, `task_ids` not iterated), in one statement for
        all of them."""
        config = self._spend_config(tx)
        if config is None or not config.task_budgets:
            return {}
        wanted = list(task_ids)
        if not wanted:
            return {}
        held: dict[str, str] = {}
        for budget, spent_usd, spent_tokens in tx.task_budgets_of(wanted):
            task_id = budget.task_id
            refusal = _task_refusal(
                task_id, budget, spent_usd, spent_tokens, config.floor_usd, config.floor_tokens
            )
            if refusal is not None:
                held[task_id] = refusal.message.removeprefix(f"task {task_id} is ")
        return held

    def _spend_held_values(
        self, values: Iterable[TaskValues], held: dict[str, str]
    ) -> Iterable[TaskValues]:
        """A listing's page of `values` as `get_task` shows each (`_spend_block`): those
        `held` (`_spend_held`) that would run, blocked on `spend`."""
        if not held:
            return values
        return [
            task._replace(**_held_fields(held[task.id]), ready=False)
            if task.id in held and task.status is TaskStatus.OPEN and task.state in _RUNNABLE
            else task
            for task in values
        ]

    def task_costs(self, task_ids: Sequence[str]) -> dict[str, TaskCost]:
        """What the runs of each of `task_ids` (at most `LIST_PAGE`; InvalidInput beyond,
        or for an id that is not text) reported together (`TaskCost`), by task id; a task
        with no run, or that is not there, left out. Summed by the database in one read: the
        SPEND column of `execkit status`, a page of tasks at a time (a row a run, for every
        run, made status of 100,000 tasks hold 68 MiB more)."""
        ids = check_task_ids(task_ids)
        if not ids:
            return {}
        with self._store.read() as tx:
            return {row[0]: TaskCost(*row[1:]) for row in tx.task_costs(ids)}

    def costs_reported(self) -> bool:
        """Whether any run of the ledger reported a cost (a USD figure or tokens): what
        decides whether `execkit status` shows a SPEND column."""
        with self._store.read() as tx:
            return tx.costs_reported()

    def spend_rows(self, *, since: float = 0.0) -> list[SpendRow]:
        """Every run started at or after `since` (POSIX seconds), in creation order, with
        its task, lane and cost: what a spend report groups (`spend_report`)."""
        if (
            isinstance(since, bool)
            or not isinstance(since, int | float)
            or not math.isfinite(since)
        ):
            raise InvalidInput(
                f"since must be a time in POSIX seconds, got {since!r}", field="since"
            )
        with self._store.read() as tx:
            return tx.spend_rows(float(since))

    def task_budget(self, task_id: str) -> TaskBudget:
        """The task's own spend cap (usd and tokens None: none); NotFound if no such task."""
        with self._store.read() as tx:
            self._task(tx, task_id)
            return tx.task_budget(task_id) or TaskBudget(task_id)

    def set_task_budget(
        self,
        task_id: str,
        *,
        usd: float | None,
        tokens: int | None,
        expected_usd: float | None,
        expected_tokens: int | None,
        actor: Actor | str,
        now: float | None = None,
    ) -> TaskBudget:
        """Compare-and-set the task's own spend cap, as the explicit attempt limit is:
        `expected_usd`/`expected_tokens` must be the current ones (None: none set), else
        Conflict naming them. The creator may set it before the first run; afterwards it
        needs the role `agent.operate` (Forbidden). A done or cancelled task refuses
        (`TaskFinished`). Audited (`task.set_budget`). A raise that lets a task blocked on
        its spend run again also asks for one forced retry of it (`retry_pending`), as
        resuming a lane does: a dispatcher that gave its issue up brings the card back."""
        wanted = TaskBudget(task_id, usd, tokens)  # InvalidInput: the field and its range
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            task = self._task(tx, task_id, lock=True)
            if task.status in FINISHED_STATUSES:
                raise TaskFinished(
                    f"task {task_id} is {task.status}; its budget can no longer change"
                )
            roles = self._roles(tx, who)
            started = task.summary.attempts_used
            if not (started == 0 and who.name == task.created_by) and OPERATE_ROLE not in roles:
                whom = "after its first run" if started else "by anyone but its creator"
                raise Forbidden(
                    f"changing the budget of task {task_id} {whom} needs the role "
                    f"{OPERATE_ROLE} (execkit role grant {who.name} {OPERATE_ROLE})"
                )
            current = tx.task_budget(task_id) or TaskBudget(task_id)
            if (current.usd, current.tokens) != (expected_usd, expected_tokens):
                raise Conflict(
                    f"the expected budget (usd {expected_usd}, tokens {expected_tokens}) does "
                    f"not match task {task_id}'s: usd {current.usd}, tokens {current.tokens}"
                )
            if wanted == current:
                return current
            tx.put_task_budget(wanted, str(who), at)
            config = self._spend_config(tx) or SpendConfig()
            if not config.task_budgets:
                tx.set_meta(SPEND_META_KEY, attrs.evolve(config, task_budgets=True).to_stored())
            self._task_budgets_seen = True
            # A raise that lets a task its spend blocked run again is an operator's retry,
            # as a lane's resume is: its card comes back, and its next run goes (once).
            retried = task.retry_requested_by is None
            if retried:
                spent_usd, spent_tokens = tx.task_spend(task_id)
                floor = (spent_usd, spent_tokens, config.floor_usd, config.floor_tokens)
                retried = (
                    _task_refusal(task_id, current, *floor) is not None
                    and _task_refusal(task_id, wanted, *floor) is None
                )
            if retried:
                tx.set_retry(task_id, str(who), at)
            self._wake(tx)
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.TASK_SET_BUDGET,
                    task_id=task_id,
                    detail={"from": current.to_dict(), "to": wanted.to_dict(),
                            "roles": sorted(roles), **({"retry": True} if retried else {})},
                )
            )  # fmt: skip
            return wanted

    def _estimate(self, lane: str | None, at: float) -> tuple[float | None, int | None] | None:
        """`lane`'s reservation estimate as last read, when it is younger than
        ESTIMATE_TTL_S at `at` (None: read it again)."""
        known = self._estimates.get(lane)
        if known is None or not 0.0 <= at - known[0] < ESTIMATE_TTL_S:
            return None
        return known[1], known[2]

    def _spend_plan(self, lane: str | None, at: float) -> SpendPlan:
        """What an admission on `lane` at `at` will ask `Tx.spend_reads`, given the spend
        configuration's stored text (None: no cap applies, no spend read is made; a text
        that is not a configuration: None too, the gate itself then says so): the hint a
        store sends the spend lock and reads with (`Tx.expect_admission`)."""
        limit = 0 if self._estimate(lane, at) else RECENT_RUNS

        def plan(stored: str) -> SpendReads | None:
            try:
                caps, _bounds, windows = self._applying(self._parsed_config(stored), lane, at)
            except StorageError:
                return None
            if not caps:
                return None
            return lane, limit, windows

        return plan

    def _applying(
        self, config: SpendConfig, lane: str | None, at: float
    ) -> tuple[list[SpendCap], list[tuple[float, float]], tuple[tuple[float, str | None], ...]]:
        """The caps a run on `lane` at `at` counts against under `config`, their windows'
        bounds, and the windows (start, lane) their reads sum (`_windows`). The last answer
        is kept: an admission's plan and its gate ask the same (a configuration is parsed
        once per stored text, so the same one is the same object)."""
        last = self._last_applying
        if last and last[0] is config and last[1] == lane and last[2] == at:
            return last[3]  # type: ignore[no-any-return]
        caps = config.applying(lane, at)
        bounds = [window_bounds(cap, at) for cap in caps]
        answer = caps, bounds, _windows(caps, bounds, config.subscription_lanes)
        self._last_applying = (config, lane, at, answer)
        return answer

    def _spend_gate(
        self, tx: Tx, task: TaskRecord, lane: str | None, at: float
    ) -> Reservation | AdmissionRefused | None:
        """Admission's spend check, in its transaction, after every other one (issue #45):
        None when the ledger has no spend configuration (nothing read but its key), else
        the run's reservation when every cap that applies has room for it, else the
        refusal: `TaskBlocked` (on spend) for the task's own budget, `SpendCapReached`
        naming a window's cap and when it reopens."""
        config = self._spend_config(tx)
        if config is None:
            return None
        caps, bounds, windows = self._applying(config, lane, at)
        # With caps, the spend lock, then every read the check needs, in one round trip
        # where the store can (with the admission's first reads: `_spend_plan`): each
        # window's sum read after the lock. The lane's recent costs only when its estimate
        # is older than ESTIMATE_TTL_S.
        known = self._estimate(lane, at)
        recent, sums = tx.spend_reads(lane, 0 if known else RECENT_RUNS, windows)
        if known is None:
            known = percentiles(recent)
            if known != (None, None):
                # Kept once there is one: a lane none of whose runs reported a cost yet
                # (a fleet's first minute) is read again, so its first costs count at once.
                self._estimates[lane] = (at, *known)
        usd, tokens = reservation_of(config, *known)
        if config.task_budgets:
            budget = tx.task_budget(task.id)
            if budget is not None and (budget.usd is not None or budget.tokens is not None):
                spent_usd, spent_tokens = tx.task_spend(task.id)
                # The task's own budget needs room for the floor, as `get_task` shows it:
                # one task runs one run at a time, so nothing races for it, and the run is
                # held to what the budget leaves while it goes (`spend_room`).
                refusal = _task_refusal(
                    task.id, budget, spent_usd, spent_tokens, config.floor_usd, config.floor_tokens
                )
                if refusal is not None:
                    return refusal
        if not caps:
            return Reservation(usd, tokens)
        # A subscription lane's run adds no USD to any window: it is held to tokens only.
        subscriptions = config.subscription_lanes
        run_usd = 0.0 if lane in subscriptions else usd
        counted: list[tuple[SpendCap, float, float]] = []
        on_subscriptions = iter(sums[len(caps) :])  # `_windows`: each ledger-wide cap's
        for cap, (start, reopens), (used_usd, used_tokens) in zip(
            caps, bounds, sums[: len(caps)], strict=True
        ):
            left_out = (
                [next(on_subscriptions)[0] for _ in subscriptions] if cap.lane is None else []
            )
            used_usd = _less_subscriptions(config, cap, used_usd, left_out)
            over = (cap.usd is not None and used_usd + run_usd > cap.usd + 1e-9) or (
                cap.tokens is not None and used_tokens + tokens > cap.tokens
            )
            if over:
                first = tx.window_spend(start, cap.lane)[2]
                if cap.window is SpendWindow.ROLLING_5H and first is not None:
                    reopens = first + (at - start)  # when its oldest spend leaves the window
                return SpendCapReached(
                    f"waiting on {cap.name} until {when(reopens)}: it has no room for this "
                    "run (used " + _used(cap, used_usd, used_tokens) + f"; the run reserves "
                    f"{_money(run_usd)} / {tokens:,} tokens); nothing was charged. An operator "
                    "can raise it: execkit budget set",
                    cap=cap.name,
                    reopens_at=reopens,
                )
            share = max(
                (used_usd + run_usd) / cap.usd if cap.usd else 0.0,
                (used_tokens + tokens) / cap.tokens if cap.tokens else 0.0,
            )
            counted.append((cap, start, share))
        return Reservation(usd, tokens, tuple(counted))

    def _spend_admitted(self, tx: Tx, run: Run, reservation: Reservation, at: float) -> None:
        """Each cap the admitted run (its reservation written with it: `Tx.insert_run`)
        brought to 80% of its window warned of (audited `spend.warning`, once a window)."""
        for cap, start, share in reservation.counted:
            self._spend_warned(tx, run, cap, start, share, at)

    def _spend_warned(
        self, tx: Tx, run: Run, cap: SpendCap, start: float, share: float, at: float
    ) -> None:
        """`cap`'s window (begun at `start`) at `share` of it with `run`'s reservation: at
        80% or more, an audited `spend.warning`, once a window."""
        if share >= WARN_SHARE and tx.note_spend_warning(cap.key, _window_key(tx, cap, start), at):
            self._notify(tx, NotifyKind.SPEND_WARNING, cap.key, {
                "cap": cap.name, **cap.to_dict(), "window_start": start,
                "share": round(share, 4), "task_id": run.task_id, "run_id": run.id,
            }, at)  # fmt: skip
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=run.actor,
                    action=AuditAction.SPEND_WARNING,
                    task_id=run.task_id,
                    run_id=run.id,
                    detail={"cap": cap.name, "window_start": start,
                            "share": round(share, 4), **cap.to_dict()},
                )
            )  # fmt: skip

    def spend_room(
        self, run_id: str, *, spent: Usage | None = None, now: float | None = None
    ) -> SpendRoom:
        """What running run `run_id` may spend before it asks again, given it has `spent`
        so far (its CLI's reports, priced; None: nothing yet) (issue #45).

        While `spent` is within the run's reservation this reads and writes nothing but
        the answer. Past it, in one transaction after the lock admission takes: if the
        task's own budget and every window cap that applies to the run's lane still have
        room for `spent` (beside what the task's other runs and the windows' other runs
        hold), the reservation grows to `spent` plus the floor, no further than the
        tightest cap, and is returned; otherwise the reservation becomes `spent` (the
        windows count it) and the answer is the stop (`SpendRoom.stop`: the task's budget
        first, then the caps in order). So runs that spend concurrently never together
        pass a cap by more than each one's last usage event. A cap of USD cannot check a
        spend whose USD is unknown (a CLI reporting tokens with no price): tokens still
        can. No spend configuration, or no cap for the run: `SpendRoom()` (unlimited).

        Raises NotFound for no such run, Conflict for a run that is not running, and
        InvalidInput naming `spent` for a value that is not a `Usage`."""
        used = check_usage(spent) or NO_USAGE
        at = moment(now)
        with self._store.read() as tx:
            held = self._room_held(tx, run_id, at)
        if isinstance(held, SpendRoom):
            return held
        if held[0].allows(used.usd, used.tokens):
            return held[0]
        with self._store.write() as tx:
            tx.lock_spend()
            found = self._room_held(tx, run_id, at)
            if isinstance(found, SpendRoom):
                return found  # the caps went meanwhile
            return self._grow(tx, *found, used, at)

    def _room_held(
        self, tx: Tx, run_id: str, at: float
    ) -> SpendRoom | tuple[SpendRoom, Run, str | None, SpendConfig, TaskBudget | None]:
        """The unlimited room when no cap applies to the run, else what it holds now
        (its reservation, each kind only when some cap counts it) with what `_grow`
        reads."""
        config = self._spend_config(tx)
        if config is None:
            return SpendRoom()
        run = self._run(tx, run_id)
        if run.status is not AttemptStatus.RUNNING:
            raise Conflict(f"run {run_id} is {run.status}; only a running run has room to spend")
        lane = tx.run_lane(run_id)
        budget = tx.task_budget(run.task_id) if config.task_budgets else None
        if budget is not None and budget.usd is None and budget.tokens is None:
            budget = None
        caps = config.applying(lane, at)
        if budget is None and not caps:
            return SpendRoom()
        subscribed = lane in config.subscription_lanes  # held to tokens only by windows
        counted: list[tuple[float | None, int | None]] = [
            (None if subscribed else c.usd, c.tokens) for c in caps
        ]
        if budget is not None:
            counted.append((budget.usd, budget.tokens))
        r_usd, r_tokens = tx.reservation(run_id)
        room_usd, room_tokens = r_usd, r_tokens
        if budget is not None:
            # Admitted with room for the floor, the run may reserve more than its task's
            # budget leaves: its room is no more than that.
            t_usd, t_tokens = tx.task_spend(run.task_id)
            if budget.usd is not None:
                room_usd = max(0.0, min(room_usd, budget.usd - (t_usd - r_usd)))
            if budget.tokens is not None:
                room_tokens = max(0, min(room_tokens, budget.tokens - (t_tokens - r_tokens)))
        held = SpendRoom(
            room_usd if any(usd is not None for usd, _tokens in counted) else None,
            room_tokens if any(tokens is not None for _usd, tokens in counted) else None,
        )
        return held, run, lane, config, budget

    def _grow(
        self, tx: Tx, held: SpendRoom, run: Run, lane: str | None, config: SpendConfig,
        budget: TaskBudget | None, used: Usage, at: float,
    ) -> SpendRoom:  # fmt: skip
        """`spend_room` past the reservation, in its write transaction: the grown room,
        or the stop."""
        r_usd, r_tokens = tx.reservation(run.id)
        usd, tokens = used.usd, used.tokens
        # Each limit: (USD ceiling or None, tokens ceiling or None) for this run's own
        # spend, what its stop says, and its window.
        limits: list[tuple[float | None, int | None, SpendCap | None, float, float | None]] = []
        if budget is not None:
            t_usd, t_tokens = tx.task_spend(run.task_id)
            limits.append((
                None if budget.usd is None else budget.usd - (t_usd - r_usd),
                None if budget.tokens is None else budget.tokens - (t_tokens - r_tokens),
                None, 0.0, None,
            ))  # fmt: skip
        # A subscription lane's run is held to tokens only; its USD is not the windows'.
        subscribed = lane in config.subscription_lanes
        for window_cap in config.applying(lane, at):
            cap = window_cap
            start, reopens_at = window_bounds(cap, at)
            w_usd, w_tokens, first = tx.window_spend(start, cap.lane)
            w_usd = _usd_held(tx, config, cap, start, w_usd)
            if cap.window is SpendWindow.ROLLING_5H and first is not None:
                reopens_at = first + (at - start)
            mine = run.started_at >= start  # the window counts this run's reservation
            mine_usd = r_usd if mine and not subscribed else 0.0
            limits.append((
                None if cap.usd is None or subscribed else cap.usd - (w_usd - mine_usd),
                None if cap.tokens is None else cap.tokens - (w_tokens - (r_tokens if mine else 0)),
                cap, start, reopens_at,
            ))  # fmt: skip
        for ceiling_usd, ceiling_tokens, limit_cap, window_start, reopens in limits:
            over_usd = ceiling_usd is not None and usd is not None and usd > ceiling_usd + 1e-9
            over_tokens = ceiling_tokens is not None and tokens > ceiling_tokens
            if over_usd or over_tokens:
                # The windows count what it spent from now on, not its older reservation.
                tx.set_reservation(
                    run.id, r_usd if usd is None else max(r_usd, usd), max(r_tokens, tokens)
                )
                stop = _stopped(run, limit_cap, budget, used, over_usd, reopens)
                capped = limit_cap if limit_cap is not None else budget
                assert capped is not None
                self._note_capped(
                    tx, capped, window_start, at, run.task_id, run.id, reason=stop.stop
                )
                return stop
        usd_room = [c for c, _t, _c, _s, _r in limits if c is not None]
        tokens_room = [t for _c, t, _cap, _s, _r in limits if t is not None]
        new_usd = r_usd
        if usd is not None and usd_room:
            new_usd = max(usd, min(usd + config.floor_usd, *usd_room))
        new_tokens = r_tokens
        if tokens_room:
            new_tokens = max(tokens, min(tokens + max(config.floor_tokens, 1), *tokens_room))
        tx.set_reservation(run.id, new_usd, new_tokens)
        for ceiling_usd, ceiling_tokens, counted_cap, start, _reopens in limits:
            if counted_cap is None:
                continue
            cap = counted_cap
            share = max(
                (cap.usd - ceiling_usd + new_usd) / cap.usd
                if cap.usd and ceiling_usd is not None else 0.0,
                (cap.tokens - ceiling_tokens + new_tokens) / cap.tokens
                if cap.tokens and ceiling_tokens is not None else 0.0,
            )  # fmt: skip
            self._spend_warned(tx, run, cap, start, share, at)
        return SpendRoom(
            new_usd if held.usd is not None else None,
            new_tokens if held.tokens is not None else None,
        )

    def _note_capped(
        self, tx: Tx, cap: SpendCap | TaskBudget, window_start: float, at: float,
        task_id: str | None, run_id: str | None, *, reason: str | None = None,
    ) -> str | None:  # fmt: skip
        """Issue #49: `spend.capped` for `cap` (a window's cap, or a task's own budget),
        once a window (a task's budget: once a value of it), in `tx`; its id, None when
        this window was told already. The once is a row of the spend-warning table under
        a key of its own (`<cap>|capped`). A refused admission's own transaction rolls
        back: its caller writes this in a small transaction of its own."""
        if isinstance(cap, TaskBudget):
            key = f"task:{cap.task_id}|{cap.usd}|{cap.tokens}|capped"
            data: dict[str, Any] = {"cap": f"the budget of task {cap.task_id}", **cap.to_dict()}
        else:
            key = cap.key + "|capped"
            data = {"cap": cap.name, **cap.to_dict()}
            window_start = _window_key(tx, cap, window_start)
        if not tx.note_spend_warning(key, window_start, at):
            return None
        data.update(window_start=window_start, task_id=task_id, run_id=run_id, reason=reason)
        return self._notify(tx, NotifyKind.SPEND_CAPPED, task_id or key, data, at)


def _window_key(tx: Tx, cap: SpendCap, start: float) -> float:
    """What names a cap's window once (the warnings' and caps' once-a-window rows): its
    start, and for a rolling window (whose start moves with every moment) the moment of
    its oldest spend, which stands until that spend leaves it."""
    if cap.window is not SpendWindow.ROLLING_5H:
        return start
    first = tx.window_spend(start, cap.lane)[2]
    return start if first is None else first


def _stopped(
    run: Run, cap: SpendCap | None, budget: TaskBudget | None, used: Usage, over_usd: bool,
    reopens: float | None,
) -> SpendRoom:  # fmt: skip
    """The stop of a run whose spend crossed `cap` (None: its task's own `budget`)."""
    spent = (
        f"{_money(used.usd)}" if over_usd and used.usd is not None else f"{used.tokens:,} tokens"
    )
    if cap is None:
        assert budget is not None
        limit = _money(budget.usd or 0) if over_usd else f"{budget.tokens or 0:,} tokens"
        return SpendRoom(
            stop=f"the task's budget of {limit} is spent (this run reached {spent}); "
            f"an operator can raise it: execkit task set-budget {run.task_id} --usd N --tokens N",
            cap="the task's budget",
            by_task=True,
        )
    limit = _money(cap.usd or 0) if over_usd else f"{cap.tokens or 0:,} tokens"
    return SpendRoom(
        stop=f"{cap.name} of {limit} is spent (this run reached {spent}); it reopens at "
        f"{when(reopens or 0.0)}; nothing was charged",
        cap=cap.name,
        by_task=False,
        reopens_at=reopens,
    )


def _usd_held(tx: Tx, config: SpendConfig, cap: SpendCap, start: float, usd: float) -> float:
    """What `cap`'s window holds in USD, given `usd` summed over every lane it counts: the
    subscription lanes' USD left out (recorded, held to no USD cap), each read here."""
    return _less_subscriptions(
        config,
        cap,
        usd,
        (tx.window_spend(start, lane)[0] for lane in config.subscription_lanes),
    )


def _less_subscriptions(
    config: SpendConfig, cap: SpendCap, usd: float, on_subscriptions: Iterable[float]
) -> float:
    """`cap`'s window's `usd` (summed over every lane it counts) less the subscription
    lanes' (`on_subscriptions`: each one's USD in that window, read only for a ledger-wide
    cap): a subscription lane's USD is recorded but held to no USD cap."""
    subs = config.subscription_lanes
    if not subs:
        return usd
    if cap.lane is not None:
        return 0.0 if cap.lane in subs else usd
    return max(0.0, usd - sum(on_subscriptions))


def _used(cap: SpendCap, usd: float, tokens: int) -> str:
    parts = []
    if cap.usd is not None:
        parts.append(f"{_money(usd)} of {_money(cap.usd)}")
    if cap.tokens is not None:
        parts.append(f"{tokens:,} of {cap.tokens:,} tokens")
    return " and ".join(parts)


def _task_refusal(
    task_id: str, budget: TaskBudget, spent_usd: float, spent_tokens: int, usd: float,
    tokens: int,
) -> TaskBlocked | None:  # fmt: skip
    """The refusal of a task whose own budget has no room for the run's reservation."""
    over_usd = budget.usd is not None and spent_usd + usd > budget.usd + 1e-9
    over_tokens = budget.tokens is not None and spent_tokens + tokens > budget.tokens
    if not (over_usd or over_tokens):
        return None
    cap = (
        f"its budget of {_money(budget.usd or 0)} (spent {_money(spent_usd)})"
        if over_usd
        else f"its budget of {budget.tokens or 0:,} tokens (spent {spent_tokens:,})"
    )
    return TaskBlocked(
        f"task {task_id} is blocked on spend: {cap} has no room for a run reserving "
        f"{_money(usd)} / {tokens:,} tokens; an operator can raise it "
        f"(execkit task set-budget {task_id} --usd N --tokens N)"
    )
