"""Vendor lanes in the ledger (issue #28): admission consults the lane in the transaction
that admits the run, a run's result feeds it, operators read, park and resume lanes, and
`db check` compares every stored lane with the fold of its history.

A run admitted with `start_run(lane=...)` is bound to that lane (`run_lanes`). Admission
reads the lane and the same lane on the host of the run's owner (where a missing binary is
a fact: the dispatcher's host, sent with its admission, also through a server), both
locked in name order after the task row: a lane that does not admit refuses with
`LaneWaiting` (parked, cooling, or half-open with its probe in flight) or `LaneStopped`
(with the fix), before the run is inserted, so a refusal writes nothing (no run, no
charge, no counter, no event). A lane whose wait has passed admits one run, the probe, and
records it. `finish_run` turns the run's result (with `lane_cause`, what the adapter read
from the vendor's structure) into one lane event and stores the new state; an abandoned
run frees the probe slot. Every change is an event appended and the state it folds to
written, in the transaction of the operation that caused it.

The states and the fold are `execkit._lanes`; this module only stores them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs

from execkit._budget import AttemptStatus
from execkit._classify import FailureClass
from execkit._errors import Conflict, Forbidden, InvalidInput, LaneStopped, LaneWaiting, NotFound
from execkit._lanes import (
    LANE_CONFIG_FIELDS,
    STOPPING_CAUSES,
    LaneCause,
    LaneConfig,
    LaneConfigHistory,
    LaneEvent,
    LaneEventKind,
    LaneKey,
    LaneState,
    LaneSummary,
    LaneView,
    admission,
    host_lane,
    open_lane,
    step,
    view,
)
from execkit.ledger._core.base import when
from execkit.ledger._core.inputs import (
    as_actor,
    check_task_ids,
    clean_reason,
    moment,
    optional_time,
)
from execkit.ledger._core.store import LANE_CONFIG_META_KEY, Tx
from execkit.ledger._core.wake import WakeOps
from execkit.ledger._model import (
    OPERATE_ROLE,
    Actor,
    AuditAction,
    AuditEntry,
    NotifyKind,
    Run,
)
from execkit.ledger._owner import process_owner

__all__ = ["LaneOps", "check_lane", "check_lane_cause"]


def check_lane(value: object) -> str | None:
    """A lane given to `start_run`: None, or `ADAPTER/CREDENTIAL` (the host part is the
    ledger's to add). InvalidInput (field `lane`) otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        return _checked_lane(value)
    return _lane_without_host(value)


def _lane_without_host(value: object) -> str:
    key = LaneKey.parse(value)
    if key.host is not None:
        raise InvalidInput(
            f"lane {value!r}: give the lane without a host; the ledger adds the host where a "
            "fact is local to it",
            field="lane",
        )
    return str(key)


# A dispatcher admits every run of an adapter on the same few lanes: each name is parsed
# once (a bad one raises, which is not cached, so it is refused every time).
_checked_lane = functools.lru_cache(maxsize=256)(_lane_without_host)


def check_lane_cause(value: object) -> LaneCause | None:
    if value is None:
        return None
    try:
        return LaneCause(value)  # type: ignore[arg-type]
    except ValueError:
        allowed = ", ".join(LaneCause)
        raise InvalidInput(
            f"lane_cause must be one of {allowed} or None, got {value!r}", field="lane_cause"
        ) from None


def _refusal(shown: LaneView, task_id: str) -> LaneWaiting | LaneStopped:
    why = shown.reason or str(shown.state)
    if shown.state is LaneState.STOPPED:
        return LaneStopped(
            f"task {task_id} waits on lane {shown.lane}, stopped: {why}; fix it, then "
            f"`execkit lane resume {shown.lane}`",
            lane=shown.lane,
            fix=shown.reason,
        )
    until = (
        f"until {when(shown.opens_at)}"
        if shown.opens_at is not None
        else "until its probe attempt's result"
    )
    capped = " (the vendor's reset was further away and was capped)" if shown.capped else ""
    return LaneWaiting(
        f"task {task_id} waits on lane {shown.lane} {until} ({why}){capped}; nothing was charged",
        lane=shown.lane,
        opens_at=shown.opens_at,
    )


class LaneOps(WakeOps):
    """Lanes at admission and on a run's result, and the operators' lane operations."""

    # -- inside other operations' transactions -------------------------------------------

    def _lane_gate(self, tx: Tx, lane: str, task_id: str, at: float, host: str) -> list[str]:
        """Before a run is admitted on `lane`: raise the refusal when the lane (or the same
        lane on `host`, the host of the run's owner: a dispatcher's own, sent with its
        admission, never this process's when the ledger is a server's) does not admit;
        else the lanes whose next run is their probe."""
        probes: list[str] = []
        # Both rows in one statement (locked, in name order), and of each only what
        # admission reads: the whole row (its failures' JSON, its reason) only to word a
        # refusal. Admission's one lane read.
        for gate in tx.lane_gates(self._gate_names(lane, host), lock=True):
            _state, admits, probe, _opens = admission(
                LaneState(gate.state), gate.until, gate.probe_run, at
            )
            if not admits:
                stored = tx.lane(gate.lane)
                assert stored is not None  # read, and locked, in this transaction
                raise _refusal(view(stored, at), task_id)
            if probe:
                probes.append(gate.lane)
        return probes

    def _gate_names(self, lane: str, host: str) -> tuple[str, str]:
        """The lanes whose gates an admission on `lane` reads: it, and it on `host` (the
        host of the run's owner)."""
        return (lane, host_lane(lane, host))

    def _lane_admitted(self, tx: Tx, lane: str, probes: list[str], run: Run, at: float) -> None:
        tx.set_run_lane(run.id, lane)
        for name in probes:
            self._lane_event(
                tx,
                LaneEvent(
                    lane=name,
                    kind=LaneEventKind.PROBE,
                    at=at,
                    actor=run.actor,
                    run_id=run.id,
                    task_id=run.task_id,
                ),
            )

    def _lane_event(self, tx: Tx, event: LaneEvent) -> LaneSummary:
        return self._lane_step(tx, event)[1]

    def _lane_step(self, tx: Tx, event: LaneEvent) -> tuple[LaneSummary, LaneSummary]:
        """Append `event` and store the state it folds to: (the lane before, after)."""
        stored = tx.lane(event.lane, lock=True, create=True) or open_lane(event.lane)
        # The event first, then the configuration it folds with: on PostgreSQL the INSERT
        # waits out a configuration change in flight (`lane_event_barrier`), so the
        # configuration read after it is the one in force for the event's number (a run's
        # result reads it ahead, under a lock the change waits for: `expect_result`).
        tx.add_lane_event(event)
        after = step(stored, event, self._lane_configs(tx).current)
        tx.write_lane(after)
        self._lane_told(tx, stored, after, event)
        return stored, after

    def _lane_told(self, tx: Tx, before: LaneSummary, after: LaneSummary, event: LaneEvent) -> None:
        """Issue #49: a lane that stopped, was parked, or was resumed by an operator is an
        event a person is told of, written in the transaction of the change."""
        if after.state == before.state and event.kind is not LaneEventKind.RESUME:
            return
        kind: NotifyKind | None = None
        if after.state is LaneState.STOPPED:
            kind = NotifyKind.LANE_STOPPED
        elif after.state is LaneState.PARKED:
            kind = NotifyKind.LANE_PARKED
        elif event.kind is LaneEventKind.RESUME:
            kind = NotifyKind.LANE_RESUMED
        if kind is None:
            return
        payload = {
            "lane": after.lane,
            "state": str(after.state),
            "was": str(before.state),
            "reason": after.reason or event.reason,
            "until": after.until,
            "task_id": event.task_id or after.stopped_task,
            "run_id": event.run_id,
            "actor": event.actor,
        }
        self._notify(tx, kind, after.lane, payload, event.at)

    def _lane_configs(self, tx: Tx) -> LaneConfigHistory:
        raw = tx.meta(LANE_CONFIG_META_KEY)
        cached_raw, cached = self._lane_settings
        if raw is not None and raw == cached_raw:
            return cached
        found = LaneConfigHistory.from_stored(raw)
        self._lane_settings = (raw, found)
        return found

    def _lane_result(
        self,
        tx: Tx,
        ended: Run,
        cause: LaneCause | None,
        at: float,
        stated: float | None = None,
    ) -> LaneSummary | None:
        """Feed `ended` (a run that just finished or was abandoned) to its lane, if any;
        `stated` is the reset as the vendor stated it, before the run's own bound. The
        lane's state before it (what the result met); None when the run used no lane."""
        lane = tx.run_lane(ended.id)
        if lane is None:
            return None
        name, kind, until = lane, LaneEventKind.SUCCESS, None
        if ended.status is AttemptStatus.ABANDONED:
            kind = LaneEventKind.ABANDON
        elif ended.status is AttemptStatus.FAILED:
            if ended.failure_class is FailureClass.UPSTREAM:
                kind = LaneEventKind.UPSTREAM
                if cause is LaneCause.RESET and ended.not_before is not None:
                    kind, until = LaneEventKind.RESET, stated or ended.not_before
            elif ended.failure_class is FailureClass.ENVIRONMENT and cause in STOPPING_CAUSES:
                kind = LaneEventKind.STOP
                if cause is LaneCause.BINARY_MISSING and ended.owner_host:
                    name = host_lane(lane, ended.owner_host)
        return self._lane_step(
            tx,
            LaneEvent(
                lane=name,
                kind=kind,
                at=at,
                actor=ended.actor,
                run_id=ended.id,
                task_id=ended.task_id,
                until=until,
                reason=ended.reason,
            ),
        )[0]

    # -- operators -----------------------------------------------------------------------

    def list_lanes(self, *, now: float | None = None) -> list[LaneView]:
        """Every lane the ledger has seen, as it stands now, by name."""
        at = moment(now)
        with self._store.read() as tx:
            return [view(stored, at) for stored in tx.lanes()]

    def get_lane(self, lane: str, *, now: float | None = None) -> LaneView:
        """One lane as it stands now; NotFound for a lane the ledger has never seen."""
        name = str(LaneKey.parse(lane))
        at = moment(now)
        with self._store.read() as tx:
            return view(self._known_lane(tx, name), at)

    def lane_history(self, lane: str) -> list[LaneEvent]:
        """A lane's events in order; NotFound for a lane the ledger has never seen."""
        name = str(LaneKey.parse(lane))
        with self._store.read() as tx:
            self._known_lane(tx, name)
            return tx.lane_events(name)

    def task_lane(self, task_id: str, *, now: float | None = None) -> LaneView | None:
        """The lane of the task's last run, as it stands now (or that lane on the host of
        the run's owner, when only there it does not admit); None when it used none."""
        at = moment(now)
        with self._store.read() as tx:
            self._task(tx, task_id)
            name = tx.task_lane(task_id)
            if name is None:
                return None
            runs = tx.runs(task_id)
            host = runs[-1].owner_host if runs else process_owner().host
            return _held_by(tx, name, host, at, {})

    def task_lanes(
        self, task_ids: Sequence[str], *, now: float | None = None
    ) -> dict[str, LaneView]:
        """`task_lane` of each of `task_ids` (at most `LIST_PAGE`; InvalidInput beyond, or
        for an id that is not text), read together: each task's lane by its id, a task
        that used no lane, or that is not there, left out. One read, whatever the count
        (the operator's dashboard asks it for a page of open tasks while a lane is closed,
        where a read a task made it slower by an order of magnitude)."""
        ids = check_task_ids(task_ids)
        at = moment(now)
        with self._store.read() as tx:
            seen: dict[str, LaneView] = {}
            return {
                task_id: _held_by(tx, name, host, at, seen)
                for task_id, (name, host) in tx.task_lanes(ids).items()
            }

    def _known_lane(self, tx: Tx, name: str) -> LaneSummary:
        stored = tx.lane(name)
        if stored is None:
            raise NotFound(f"no lane {name!r}; `execkit lane list` shows the lanes")
        return stored

    def _operator(self, tx: Tx, who: Actor, what: str) -> None:
        if OPERATE_ROLE not in self._roles(tx, who):
            raise Forbidden(f"{what} needs the role {OPERATE_ROLE}")

    def resume_lane(
        self,
        lane: str,
        *,
        actor: Actor | str,
        reason: str | None = None,
        now: float | None = None,
    ) -> LaneView:
        """Re-open a lane (role `agent.operate`, audited): its held tasks run again, and every
        task its stop blocked gets one forced retry: the task whose run stopped it and each
        whose run met the stop after (runs admitted before the lane stopped, on any host),
        while it stands open, not running, with that environment failure its last outcome.
        On an open lane it is a no-op that writes nothing. NotFound for a lane never seen."""
        name = str(LaneKey.parse(lane))
        who = as_actor(actor)
        note = clean_reason(reason)
        at = moment(now)
        with self._store.write() as tx:
            seen = self._known_lane(tx, name)
            self._operator(tx, who, f"resuming lane {name}")
            blocked: list[str] = []
            if seen.state is LaneState.STOPPED:
                blocked = list(dict.fromkeys(task for task, _run in tx.lane_stops(name)))
                if seen.stopped_task is not None and seen.stopped_task not in blocked:
                    blocked.insert(0, seen.stopped_task)  # a stop recorded before its run's id
            # Lock order: the tasks to retry (by id) before the lane (see the backends' Tx).
            tasks = [tx.task(task_id, lock=True) for task_id in sorted(blocked)]
            stored = self._known_lane(tx, name) if not blocked else tx.lane(name, lock=True)
            assert stored is not None
            if stored.state is LaneState.OPEN:
                return view(stored, at)
            after = self._lane_event(
                tx,
                LaneEvent(lane=name, kind=LaneEventKind.RESUME, at=at, actor=str(who), reason=note),
            )
            detail: dict[str, object] = {"lane": name, "from": str(stored.state)}
            if note is not None:
                detail["reason"] = note
            retried = [
                task.id
                for task in tasks
                if task is not None
                and task.status == "open"
                and task.running is None
                and task.last_class == FailureClass.ENVIRONMENT
            ]
            for task_id in retried:
                tx.set_retry(task_id, str(who), at)
            self._wake(tx)
            if retried:
                detail["retried_tasks"] = retried
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.LANE_RESUME,
                    task_id=retried[0] if len(retried) == 1 else None,
                    detail=detail,
                )
            )
            return view(after, at)

    def park_lane(
        self,
        lane: str,
        *,
        until: float,
        actor: Actor | str,
        reason: str | None = None,
        now: float | None = None,
    ) -> LaneView:
        """Park a lane until `until` (role `agent.operate`, audited): its tasks wait, and
        one probe goes first when it opens. `until` must be in the future and within the
        lanes' `max_park_s` (InvalidInput); a stopped lane is resumed, not parked
        (Conflict); a lane never seen may be parked (it is made)."""
        name = str(LaneKey.parse(lane))
        if LaneKey.parse(lane).host is not None:
            raise InvalidInput(
                f"lane {name!r}: only a lane without a host can be parked", field="lane"
            )
        who = as_actor(actor)
        note = clean_reason(reason)
        at = moment(now)
        if not isinstance(until, int | float) or isinstance(until, bool) or until != until:
            raise InvalidInput(f"until must be a POSIX time, got {until!r}", field="until")
        if until <= at:
            raise InvalidInput(
                f"until must be in the future, got {when(until) if until > -1e11 else until}",
                field="until",
            )
        with self._store.write() as tx:
            max_park_s = self._lane_configs(tx).current.max_park_s
            if until - at > max_park_s:
                raise InvalidInput(
                    f"until must be within {max_park_s:g}s of now "
                    f"(at most {when(at + max_park_s)}), got {until!r}",
                    field="until",
                )
            self._operator(tx, who, f"parking lane {name}")
            stored = tx.lane(name, lock=True, create=True) or open_lane(name)
            if stored.state is LaneState.STOPPED:
                raise Conflict(f"lane {name} is stopped ({stored.reason}); resume it instead")
            after = self._lane_event(
                tx,
                LaneEvent(
                    lane=name,
                    kind=LaneEventKind.PARK,
                    at=at,
                    actor=str(who),
                    until=float(until),
                    reason=note or "parked by an operator",
                ),
            )
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.LANE_PARK,
                    detail={"lane": name, "until": float(until), "reason": note},
                )
            )
            return view(after, at)

    # -- a tracker's own lane (issue #47) ------------------------------------------------

    def record_lane_call(
        self,
        lane: str,
        outcome: str,
        *,
        until: float | None = None,
        reason: str | None = None,
        actor: Actor | str = "execkit",
        now: float | None = None,
    ) -> LaneView:
        """What a call to an outside service that is not a run met on its lane (a tracker's
        API on `github/<fingerprint>`): `success`, `upstream` (5xx, a dropped connection),
        `reset` (a limit with the reset it stated, `until`) or `stop` (a refused credential;
        `reason` names the fix). The same fold as a run's result: a stated reset parks the
        lane, a storm of upstream calls trips its breaker, a stop holds it until an
        operator's `resume_lane`. A call made when the lane's wait has passed is its probe
        (recorded as one, so a probe that fails again waits longer, and the closings in a
        row are bounded). A success on an open lane with nothing counted writes nothing;
        a call that opens a closed lane wakes every waiting dispatcher. The lane as it
        stands after. InvalidInput for an unknown outcome or a lane with a host."""
        name = _lane_without_host(lane)
        kinds = {
            "success": LaneEventKind.SUCCESS,
            "upstream": LaneEventKind.UPSTREAM,
            "reset": LaneEventKind.RESET,
            "stop": LaneEventKind.STOP,
        }
        kind = kinds.get(outcome) if isinstance(outcome, str) else None
        if kind is None:
            raise InvalidInput(
                f"outcome must be one of {', '.join(kinds)}, got {outcome!r}", field="outcome"
            )
        stated = optional_time("until", until)
        who = as_actor(actor)
        note = clean_reason(reason)
        at = moment(now)
        with self._store.write() as tx:
            stored = tx.lane(name, lock=True)
            if kind is LaneEventKind.SUCCESS and (
                stored is None or (stored.state is LaneState.OPEN and not stored.failures)
            ):
                return view(stored or open_lane(name), at)
            if stored is None:
                stored = tx.lane(name, lock=True, create=True) or open_lane(name)
            _state, _admits, probe, _opens = admission(
                stored.state, stored.until, stored.probe_run, at
            )
            call = None
            if probe:
                import secrets

                call = f"call-{secrets.token_hex(8)}"
                self._lane_event(
                    tx, LaneEvent(lane=name, kind=LaneEventKind.PROBE, at=at, actor=str(who),
                                  run_id=call),
                )  # fmt: skip
            after = self._lane_event(
                tx,
                LaneEvent(
                    lane=name,
                    kind=kind,
                    at=at,
                    actor=str(who),
                    run_id=call,
                    until=stated if kind is LaneEventKind.RESET else None,
                    reason=note,
                ),
            )
            if after.state is LaneState.OPEN and stored.state is not LaneState.OPEN:
                self._wake(tx)
            return view(after, at)

    # -- configuration -------------------------------------------------------------------

    def lane_config(self) -> LaneConfig:
        """The lanes' configuration in force (the breaker and the bounds of every wait),
        the same for every host of this ledger; `LaneConfig()` until an operator sets one."""
        with self._store.read() as tx:
            return self._lane_configs(tx).current

    def set_lane_config(
        self,
        *,
        actor: Actor | str,
        breaker_k: int | None = None,
        breaker_window_s: float | None = None,
        cool_base_s: float | None = None,
        cool_max_s: float | None = None,
        max_park_s: float | None = None,
        reset_margin_s: float | None = None,
        recheck_s: float | None = None,
        max_trips: int | None = None,
        now: float | None = None,
    ) -> LaneConfig:
        """Change some of the lanes' configuration (role `agent.operate`, audited): each
        field given replaces the one in force, the others stay. It applies to every lane
        event from now on, on every host; events before keep the configuration they were
        folded with (`db check` folds each with its own). InvalidInput naming the field and
        its range for a value out of range (nothing stored); the same values as now are a
        no-op that writes nothing. Returns the configuration in force afterwards."""
        who = as_actor(actor)
        at = moment(now)
        given: dict[str, Any] = {
            name: value
            for name, value in (
                ("breaker_k", breaker_k),
                ("breaker_window_s", breaker_window_s),
                ("cool_base_s", cool_base_s),
                ("cool_max_s", cool_max_s),
                ("max_park_s", max_park_s),
                ("reset_margin_s", reset_margin_s),
                ("recheck_s", recheck_s),
                ("max_trips", max_trips),
            )
            if value is not None
        }
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInput(f"{name} must be a number, got {value!r}", field=name)
        with self._store.write() as tx:
            self._operator(tx, who, "changing the lanes' configuration")
            history = self._lane_configs(tx)
            before = history.current
            after = attrs.evolve(before, **given)  # InvalidInput: the field and its range
            if after == before:
                return before
            from_seq = tx.lane_event_barrier() + 1
            tx.set_meta(LANE_CONFIG_META_KEY, history.changed(after, from_seq).to_stored())
            self._wake(tx)  # a shorter wait may open a lane now
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.LANE_CONFIG,
                    detail={
                        "from": {name: getattr(before, name) for name in LANE_CONFIG_FIELDS},
                        "to": {name: getattr(after, name) for name in LANE_CONFIG_FIELDS},
                        "from_event": from_seq,
                    },
                )
            )
            return after

    # -- db check ------------------------------------------------------------------------

    def _lane_folds(self, tx: Tx) -> tuple[dict[str, LaneSummary], dict[str, LaneSummary]]:
        """Every stored lane, and the fold of every lane's history, each event with the
        configuration in force for its number."""
        configs = self._lane_configs(tx)
        stored = {lane.lane: lane for lane in tx.lanes()}
        expected: dict[str, LaneSummary] = {}
        for seq, event in tx.numbered_lane_events():
            before = expected.get(event.lane) or open_lane(event.lane)
            expected[event.lane] = step(before, event, configs.at(seq))
        for name in stored:
            expected.setdefault(name, open_lane(name))
        return stored, expected

    def _lane_problems(self) -> list[str]:
        """Every stored lane against the fold of its history (and history with no lane)."""
        with self._store.read() as tx:
            stored, folded = self._lane_folds(tx)
        problems = []
        for name in sorted(folded):
            expected = folded[name]
            found = stored.get(name)
            if found is None:
                problems.append(f"lane {name}: it has a history but no stored state")
            elif found != expected:
                problems.append(
                    f"lane {name}: its stored state differs from its history (stored "
                    f"{found.state} after {found.events} events; history {expected.state} "
                    f"after {expected.events}); `execkit db check --repair` rebuilds it"
                )
        return problems

    def _repair_lanes(self, tx: Tx) -> list[str]:
        done = []
        stored, folded = self._lane_folds(tx)
        for name in sorted(folded):
            if stored.get(name) != folded[name]:
                tx.write_lane(folded[name])
                done.append(f"lane {name}: rebuilt its state from its history")
        return done


def _held_by(tx: Tx, name: str, host: str, at: float, seen: dict[str, LaneView]) -> LaneView:
    """A task's lane `name` as it stands at `at`, or that lane on the `host` of its last
    run's owner when only there it does not admit (`seen`: the views read so far in this
    transaction, by lane)."""
    found = []
    for candidate in (name, host_lane(name, host)):
        shown = seen.get(candidate)
        if shown is None:
            shown = seen[candidate] = view(tx.lane(candidate) or open_lane(candidate), at)
        found.append(shown)
    closed = [shown for shown in found if not shown.admits]
    return closed[0] if closed else found[0]
