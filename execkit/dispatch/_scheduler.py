"""The dispatcher (ADR 015, ADR 0033's orchestrator part): bounded retries over a board.

A board (`Tracker`) lists eligible issues and moves them between states. Each issue maps to
one ledger task (`idempotency_key=f"board:{issue_id}"`), and each dispatch is one ledger run:
`start_run` (the single place that refuses), the `Runner`, then `finish_run`. The
dispatcher keeps no retry counters of its own: attempt numbers, charged counts, the uncharged
streak, the backoff and where it gave up are all read back from the ledger, so a restarted
dispatcher (or another one over the same ledger, on another host) sees exactly what the
first one saw.

Agents run side by side: each admitted run gets a slot (`_slots.py`: a thread of its own,
its own process tree and lease), at most `DispatchConfig.max_concurrent_agents` at once and
`adapter_cap(name)` on one adapter; a slot that finishes is refilled at once. The slot
renews its run's lease through the agent's own spawn loop (`Slot.heartbeat`, the one
renewer: a storage hiccup is logged and retried at the next beat, a run that is no longer
this dispatcher's stops the agent) and writes its result; this thread admits, moves cards
and reports. Every run it admits carries its identity (`owner`, a `RunOwner` read from the
OS: host, boot, pid and start time, a random instance id), locally, on PostgreSQL and
through the HTTP remote, so a run is recognised as its own by that identity and never by
the process that wrote the row. A dispatcher that dies stops renewing, and the next
admission on that task, from anywhere, abandons the run (it counts) and the work goes on;
a dispatcher that starts on the same host abandons at once the runs whose owner process is
gone (a crash, a kill, a reboot), without waiting out their leases. One that is stopped
(`shutdown`) takes no new work, lets its agents finish within the drain time, then stops
their trees and records their runs as stopped by their dispatcher: uncharged, since the
attempt said nothing about the work, and its card stays where it was.

After a failure the ledger's decision says what happens next:

- backoff: the issue is skipped until `next_attempt_at`.
- blocked on environment, upstream, work or the dispatch cap: the dispatcher gives up: it
  moves the issue to `DispatchConfig.failed_state`, so it leaves the eligible set and shows
  on the board, and records the give-up in the ledger with the attempt count. An issue that
  later stands in an eligible state again at that same count was moved back by an operator:
  that is a forced retry (ADR 015 "the operator re-opens them once the host recovers";
  ADR 0046 "a human who fixes the environment can still force a retry"), run once with the
  budget intact, and the bounds apply again to what it returns.
- when the give-up move is unavailable (no failed state configured, the board has no such
  state, or it refuses), ADR 015's "never strand" holds: a WARNING naming the issue and the
  state is logged at every exhaustion (once per attempt count) and the legacy behaviour is
  kept: the issue stays eligible and is retried past the bound, with backoff.
- blocked on `attempt_limit` (an explicit task limit, ADR 0033): the issue is NOT moved; it
  stays in progress and is reported as `attempt_limit` until an operator raises the limit,
  when scheduling resumes with the same task and history.

A success moves the issue to `DispatchConfig.done_state`.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

import attrs

from execkit._attempt import (
    SpendGuard,
    record_outcome,
    record_stopped,
    resumable_session,
    resume_line,
    resumed_after,
    runner_error,
    spend_guard,
    with_spend_stop,
)
from execkit._budget import AttemptStatus, BlockedOn
from execkit._classify import FailureClass
from execkit._errors import (
    AdmissionRefused,
    AttemptLimitReached,
    Conflict,
    ExecKitError,
    InvalidInput,
    LaneStopped,
    LaneWaiting,
    NotFound,
    SpendCapReached,
    StorageError,
    TaskBackingOff,
    UnsupportedMove,
)
from execkit._exec import Cancellation, SpawnCancelled
from execkit._json import to_json
from execkit._lanes import STOPPING_CAUSES, LaneKey, host_lane
from execkit._proof import RunStatus
from execkit._redact import redact
from execkit._stamp import utc_stamp
from execkit._usage import Usage
from execkit._validate import is_number
from execkit.dispatch._board import (
    BindableBoard,
    Board,
    BoardIssue,
    BoardReport,
    GiveUpBoard,
    JsonFileBoard,
    ReportingBoard,
    Tracker,
    task_key,
)
from execkit.dispatch._config import DispatchConfig
from execkit.dispatch._lanes import DispatchLanes
from execkit.dispatch._runner import Runner, RunOutcome, Slot
from execkit.dispatch._slots import SlotExecutor, ThreadPerSlot
from execkit.dispatch._workspaces import Workspaces
from execkit.ledger import (
    DEFAULT_LEASE_S,
    WAKE_CAPABILITY,
    Actor,
    Ledger,
    Run,
    RunOwner,
    Task,
    TaskBudget,
    TaskState,
    TaskStatus,
    current_owner,
    owner_lost,
)

__all__ = ["DISPATCH_ACTOR", "DispatchEvent", "Dispatcher", "EventKind"]

_log = logging.getLogger("execkit.dispatch")

# The longest the dispatcher's thread blocks in one wait. The kernel gives a process's
# SIGTERM or SIGINT to any of its threads (a slot's, a lease renewer's) and Python runs the
# handler (`request_stop`, which sets the flags each step of a wait reads, and wakes no
# wait from the main thread) only when the main thread next runs: a wait without a bound
# could sleep through a stop until its agent ended.
_SIGNAL_CHECK_S = 0.2

DISPATCH_ACTOR = "dispatcher"
"""The actor the dispatcher records on the tasks it creates and the runs it starts."""

STOPPED_REASON = "dispatcher stopped"
"""The reason recorded on a run whose dispatcher stopped its agent (`Dispatcher.shutdown`)."""

# How long a cancelled slot may take to end after its tree was killed: a backstop only.
_STOP_BACKSTOP_S = 60.0

# The lane causes that stop a lane (`execkit._lanes.STOPPING_CAUSES`, by value): only an
# operator's `lane resume` opens it again.
_STOPPING_CAUSES = frozenset(str(cause) for cause in STOPPING_CAUSES)

# What a slot stopped by its own dispatcher returns: recorded already, nothing to report.
_STOPPED = RunOutcome(RunStatus.FAILED, failure_class=FailureClass.WORK, reason=STOPPED_REASON)


class EventKind(enum.StrEnum):
    """What a `DispatchEvent` reports (see its docstring)."""

    DISPATCHED = "dispatched"
    GAVE_UP = "gave_up"
    BLOCKED = "blocked"
    ATTEMPT_LIMIT = "attempt_limit"
    DONE = "done"
    REFUSED = "refused"
    WAITING = "waiting"
    ERROR = "error"


@attrs.frozen
class DispatchEvent:
    """One thing the dispatcher did or reported for one issue.

    `kind`:
    - `dispatched`: a run was started and finished (`attempt`, `status`, `failure_class`,
      `charged`, `reason` of this run); `moved_to` is set when it then moved the issue
      (done, or given up into the failed state); `blocked_on` and `decision` when the
      history now blocks it; `next_attempt_at` when a retry is scheduled.
    - `gave_up`: moved to the failed state without a dispatch (found blocked or at the cap).
    - `blocked`: blocked but the failed-state move is unavailable; it stays eligible.
    - `attempt_limit`: the explicit task limit is used up; it stays in progress.
    - `done`: the task had already succeeded; the issue was moved to the done state.
    - `refused`: the ledger refused the admission (e.g. another dispatcher is running it).
    - `waiting`: the issue's vendor lane does not admit (parked, cooling, waiting on its
      probe, or stopped); `reason` is the ledger's refusal for this issue's own task. Said
      once when a lane's wait begins and once each time it changes, for the issue that met
      it: the other issues the lane holds wait without an event (`execkit status` lists
      each), and their cards stay where they are.
    - `error`: a ledger or board error for this issue; the other issues went on.
    """

    kind: EventKind
    issue_id: str
    at: float
    task_id: str | None = None
    attempt: int | None = None
    max_attempts: int | None = None  # the binding bound: dispatch cap or task limit; None = none
    status: RunStatus | None = None
    failure_class: FailureClass | None = None
    charged: bool | None = None
    # Event text reaches logs and `execkit dispatch --json`: redacted on construction.
    reason: str | None = attrs.field(default=None, converter=attrs.converters.optional(redact))
    precondition: str | None = attrs.field(
        default=None, converter=attrs.converters.optional(redact)
    )
    blocked_on: BlockedOn | None = None
    # The ledger's reason when the history blocks the issue.
    decision: str | None = attrs.field(default=None, converter=attrs.converters.optional(redact))
    moved_to: str | None = None
    next_attempt_at: float | None = None
    # The vendor lane this run stopped (refused credentials, no billing, a missing binary):
    # the fix is that lane's `execkit lane resume`, which brings this card back too.
    lane_stopped: str | None = None
    # The issue's workspace (`Dispatcher(workspaces=...)`): where its agent ran, and
    # whether it was removed after the issue was done.
    workspace: str | None = None
    workspace_removed: bool | None = None
    # Issue #46: the vendor session this run continued, the refusal it continued after (the
    # previous attempt's reason: "usage limit"), and whether the vendor refused the session
    # (unknown or expired) so that the attempt started fresh instead.
    resumed_session: str | None = None
    resumed_after: str | None = attrs.field(
        default=None, converter=attrs.converters.optional(redact)
    )
    resume_refused: bool | None = None
    # Issue #46's announced fallback: "fell back from claude/x (parked until ...) to
    # codex/y", when the run went to a later adapter of the issue's order.
    fell_back: str | None = attrs.field(default=None, converter=attrs.converters.optional(redact))
    # Issue #46: this run found its own lane stopped or parked and a later adapter of the
    # issue's order open: the issue is neither given up nor left waiting, and its next
    # admission falls back (announced then, on its run).
    falls_back: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class _Waker:
    """A thread that waits on the ledger's wake-up (`Ledger.wait_for_wake`) while the
    dispatcher runs and calls `woken` each time the wake number moves. A ledger without
    the capability gets no thread. A failed wait (a server restarting) is retried a second
    later; a wait answered at once with nothing new (a server whose waits are all taken)
    is asked again a second later, so the thread never spins."""

    _WAIT_S = 20.0  # each wait: a long poll through a server, inside its request timeout
    _PAUSE_S = 1.0

    def __init__(self, ledger: Ledger, woken: Callable[[], None]) -> None:
        self._ledger = ledger
        self._woken = woken
        self._stopped = threading.Event()
        try:
            active = WAKE_CAPABILITY in ledger.capabilities()
            seen = ledger.wake_seq() if active else 0
        except ExecKitError as exc:
            _log.warning("no wake-ups from the ledger (passes keep their interval): %s", exc)
            active, seen = False, 0
        if active:
            threading.Thread(
                target=self._run, args=(seen,), name="execkit-dispatch-waker", daemon=True
            ).start()

    def _run(self, seen: int) -> None:
        while not self._stopped.is_set():
            asked = time.monotonic()
            try:
                current = self._ledger.wait_for_wake(seen, self._WAIT_S)
            except ExecKitError:
                self._stopped.wait(self._PAUSE_S)
                continue
            if self._stopped.is_set():
                return
            if current != seen:
                seen = current
                self._woken()
            elif time.monotonic() - asked < self._PAUSE_S:
                self._stopped.wait(self._PAUSE_S)

    def stop(self) -> None:
        """No more wake-ups; the thread ends after its wait in progress (it is a daemon)."""
        self._stopped.set()


def _spend_words(usage: Usage | None) -> str | None:
    """What the run cost, as a card's status says it (issue #45: `$0.0421 (reported),
    1,530 tokens`; `USD unknown, 1,530 tokens` when only tokens were reported); None when
    the CLI reported nothing."""
    if usage is None or not usage.known:
        return None
    usd = "USD unknown" if usage.usd is None else f"${usage.usd:,.4f} ({usage.usd_source})"
    return f"{usd}, {usage.tokens:,} tokens"


def _met_upstream(outcome: RunOutcome | _NotRecorded) -> bool:
    """Whether a slot's outcome was an upstream failure (recorded or not)."""
    if isinstance(outcome, _NotRecorded):
        outcome = outcome.outcome
    return outcome.status is RunStatus.FAILED and outcome.failure_class is FailureClass.UPSTREAM


def _card_lines(*said: str | None) -> tuple[str, ...]:
    """The further lines a board card shows for a run (issue #46: its fallback, its
    resumed session), those that were said."""
    return tuple(line for line in said if line)


def _closed_words(lane: str | None, refusal: LaneWaiting | LaneStopped) -> str:
    """ "claude/x (parked until 2026-12-07T16:00:00+00:00)": a lane a fallback passed over."""
    if isinstance(refusal, LaneStopped):
        said = "stopped until an operator resumes it"
    elif refusal.opens_at is not None:
        said = f"parked until {utc_stamp(refusal.opens_at)}"
    else:
        said = "cooling until its probe attempt's result"
    return f"{lane or refusal.lane} ({said})"


@attrs.frozen
class _Unrecorded:
    run_id: str
    outcome: RunOutcome
    ended_at: float


@attrs.frozen
class _NotRecorded:
    """A slot's outcome the ledger did not take (kept for the next pass), and why."""

    outcome: RunOutcome
    error: ExecKitError


@attrs.define
class _Running:
    """One slot in flight: the issue, its run, the adapter it counts against, its result
    to come and the signal that stops it."""

    issue: BoardIssue
    run: Run
    adapter: str
    lane: str | None
    cancel: Cancellation
    future: Future[RunOutcome | _NotRecorded]


class Dispatcher:
    """The scheduling loop over one board and one ledger (see the module docstring).

    The dispatcher owns the ledger's retry backoff: it sets `ledger.backoff` to
    `config.backoff`, so every projection of the history (here, in `execkit status`, in
    another dispatcher built with the same config) computes the same `next_attempt_at`.
    `clock` gives POSIX seconds (inject a virtual clock in tests and the demo);
    `on_event` is called with each event as it happens, in this thread. Each run holds a
    lease of `lease_s` seconds, renewed every `lease_s / 3` by its slot while its agent
    runs: the ledger must accept calls from several threads (every ledger here does).
    `executor` runs the slots (`ThreadPerSlot` by default; `InlineExecutor` runs each at
    once, which makes a pass deterministic for tests). `workspaces` (issue #46) gives each
    issue a workspace of its own, made in the issue's slot under its run's lease before
    its first attempt, kept across its attempts, the agent's working directory (`Slot.cwd`)
    and removed once the issue is done (`Workspaces`); without it agents run where the
    runner says (the dispatcher's own directory by default).
    """

    def __init__(
        self,
        tracker: Tracker,
        runner: Runner,
        ledger: Ledger,
        config: DispatchConfig | None = None,
        clock: Callable[[], float] = time.time,
        *,
        on_event: Callable[[DispatchEvent], None] | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        executor: SlotExecutor | None = None,
        owner: RunOwner | None = None,
        lanes: bool = True,
        workspaces: Workspaces | None = None,
    ) -> None:
        if not is_number(lease_s) or lease_s <= 0:
            raise InvalidInput(
                f"lease_s must be a number of seconds > 0, got {lease_s!r}", field="lease_s"
            )
        self.tracker = tracker
        self.runner = runner
        self.workspaces = workspaces
        self.ledger = ledger
        self.config = DispatchConfig() if config is None else config
        self.clock = clock
        self._on_event = on_event
        self._cap = self.config.cap
        self._lease_s = float(lease_s)
        self._executor: SlotExecutor = ThreadPerSlot() if executor is None else executor
        # Who this dispatcher is: read from the OS once, with an instance id of its own.
        self.owner = current_owner() if owner is None else owner
        ledger.backoff = self.config.backoff
        # A cache of a stable mapping (the ledger replays the same task for the key), not
        # retry state: dropping it changes nothing.
        self._task_ids: dict[str, str] = {}
        # Results the ledger failed to take (busy past its timeout, disk full): retried at
        # the start of each pass, so the run does not stay `running` (and its issue stuck)
        # for as long as this process lives. Lost on exit, when the lease runs out instead.
        # Written by the slots, read here: under its lock.
        self._unrecorded: dict[str, _Unrecorded] = {}
        self._unrecorded_lock = threading.Lock()
        # Per issue, the (attempts, state) of the last "not moved" warning: one warning per
        # exhaustion, not one per pass that finds the same history again.
        self._warned: dict[str, tuple[int, str | None]] = {}
        # Per issue given up, the column it was taken from: where an operator's retry in
        # the ledger brings it back (`_restore_retried`). Kept on the board too when it can
        # (`GiveUpBoard`), and read back from there at the first pass, so a restart keeps it.
        self._gave_up_from: dict[str, str] = {}
        self._recalled = False  # the board's kept give-ups read (`_recall_given_up`)
        self._bound = False
        self._ledger_id = ""  # read when the first pass binds
        self._running: dict[str, _Running] = {}  # by run id, in the order started
        self._slot_done = threading.Event()  # set by a slot as it ends (and by a stop)
        self._stopping = False  # no new work
        self._hurry = False  # no more waiting for the running agents either
        self._lanes = DispatchLanes(ledger, enabled=lanes, host=self.owner.host)  # issue #28
        # Lanes an upstream failure was met on while other attempts on them were in flight:
        # no new run goes out on such a lane until those have reported (`_in_doubt`).
        self._doubted: set[str] = set()
        self._wake_pending = False  # set by the waker thread (`_woken`), read by the loop
        self._catch_up_said: str | None = None  # the last write-back wait logged
        # Issue #46: the vendor session an issue's next attempt resumes is read from the
        # ledger at its admission (`resumable_session`), never kept here: a restarted
        # dispatcher, or another one on another host, resumes it alike.

    # -- public --------------------------------------------------------------------------

    @property
    def running(self) -> tuple[tuple[str, str], ...]:
        """(issue id, run id) of each agent running now, in the order they started."""
        return tuple((r.issue.id, r.run.id) for r in self._running.values())

    def tick(self) -> list[DispatchEvent]:
        """Dispatch every eligible issue whose backoff has elapsed once, up to the
        concurrency caps at a time (a slot that ends is refilled at once), and wait for the
        agents started; return the events, in the board's order of the issues.

        Runs whose lease expired are abandoned first (a crashed dispatcher's run does not
        hold its task forever), and results an earlier pass could not write are written. A
        ledger or board error on one issue becomes an `error` event and the other issues go
        on. The first pass binds the board to this ledger (`BindableBoard`), or refuses when
        the board belongs to another one, and refuses a board file others can write
        (`Forbidden`: its commands would run as this process).
        """
        self._prepare()
        candidates = list(self.tracker.list_candidates())
        order = {issue.id: n for n, issue in enumerate(candidates)}
        busy = {r.issue.id for r in self._running.values()}
        waiting = [issue for issue in candidates if issue.id not in busy]
        events: list[DispatchEvent] = []
        while True:
            events.extend(self._reap())
            waiting = self._fill(waiting, events)
            self._catch_up()  # the claims just made, the results just reaped
            if not self._running or self._stopping:
                break  # a stop leaves the running agents to `shutdown`
            self._wait_for_a_slot(None)
        events.sort(key=lambda event: order.get(event.issue_id, len(order)))
        return events

    def pass_once(self) -> list[DispatchEvent]:
        """One pass that does not wait: the results of the slots that ended, then every
        due issue that fits a free slot started. The loop of `run_forever`."""
        self._prepare()
        events = self._reap()
        busy = {r.issue.id for r in self._running.values()}
        self._fill([i for i in self.tracker.list_candidates() if i.id not in busy], events)
        self._catch_up()
        return events

    def next_due(self) -> float | None:
        """The earliest `next_attempt_at` among the eligible issues this dispatcher has
        ticked that wait in backoff, or None."""
        now = self.clock()
        due: list[float] = []
        busy = {r.issue.id for r in self._running.values()}
        for issue in self.tracker.list_candidates():
            task_id = self._task_ids.get(issue.id)
            if task_id is None or issue.id in busy:
                continue
            task = self.ledger.get_task(task_id, now=now, cap=self._cap)
            if task.state is TaskState.BLOCKED and self._legacy(issue, task):
                task = self.ledger.get_task(task_id, now=now, cap=self._cap, force=True)
            if task.state is TaskState.BACKOFF and task.next_attempt_at is not None:
                due.append(task.next_attempt_at)
        return min(due + self._lanes.wake_times(), default=None)

    def run_forever(
        self,
        interval_s: float,
        *,
        stop: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        """Pass, then wait, until `stop()` is true (checked before each pass); the agents
        still running then are left to `shutdown`.

        The wait ends early when a slot ends (its place is refilled at once), when a backoff
        ends or a held lane opens sooner than `interval_s`, and when an operator lets work
        run again (a lane resume, a task retry, a raised limit: the ledger's wake-up,
        `Ledger.wait_for_wake`, waited on in a thread of this dispatcher's while it runs;
        a ledger without the `ledger.wake` capability keeps to the interval). An injected
        `sleep` (tests and the demo, on a virtual clock) is the wait with no agent running,
        and then no wake-up is waited on. An ExecKitError from a pass (a board file caught
        mid-edit, a busy ledger) is logged as a WARNING and the loop goes on. InvalidInput
        for an interval that is not a positive number.
        """
        if not is_number(interval_s) or interval_s <= 0:
            raise InvalidInput(
                f"interval_s: must be a number of seconds > 0, got {interval_s!r}",
                field="interval_s",
            )
        waker = _Waker(self.ledger, self._woken) if sleep is None else None
        try:
            while not stop() and not self._stopping:
                wait = interval_s
                if self._wake_pending:
                    # An operator let work run: a lane held until a later opening is asked
                    # again now (it may have been resumed).
                    self._wake_pending = False
                    self._lanes.release()
                try:
                    self.pass_once()
                    if stop():
                        return
                    due = self.next_due()
                    if due is not None:
                        wait = min(wait, max(due - self.clock(), 0.0))
                except ExecKitError as exc:
                    _log.warning("dispatch pass failed, retrying in %gs: %s", wait, exc.message)
                if self._running or sleep is None:
                    self._wait_for_a_slot(max(wait, 0.01))
                else:
                    sleep(max(wait, 0.01))
        finally:
            if waker is not None:
                waker.stop()

    def _woken(self) -> None:
        """The waker's call (its own thread): the ledger says an operator let work run."""
        self._wake_pending = True
        self._slot_done.set()

    def request_stop(self, *, hurry: bool = False) -> None:
        """Ask the loop to stop taking new work (`tick` and `run_forever` return, leaving
        the running agents to `shutdown`); with `hurry`, `shutdown` also stops waiting for
        them. Safe from a signal handler or another thread: it sets flags, and from
        another thread wakes the waits at once.

        In the main thread, where Python runs signal handlers, it takes no lock: a handler
        runs between any two steps of that thread, inside `Event.set` or `clear` too, and
        waking the waits there would wait for a lock the thread itself holds, forever (a
        second Ctrl-C did hang `execkit dispatch` so). The main thread is not waiting while
        it runs this; a wait in another thread sees the flags within `_SIGNAL_CHECK_S`."""
        if hurry:
            self._hurry = True
        self._stopping = True
        if threading.current_thread() is not threading.main_thread():
            self._slot_done.set()

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for (`request_stop`, `shutdown`)."""
        return self._stopping

    def idle(self) -> bool:
        """True when no agent runs and no eligible issue is ready or waiting in backoff, but
        those a stopped vendor lane holds (only a person opens it: `waiting_on_people` says
        which): what `execkit dispatch --until-idle` waits for."""
        if self._running:
            return False
        # Bound first (once): binding abandons the runs a dead dispatcher on this host left
        # running, whose tasks are then due again; asked before the first pass (as
        # `--until-idle` does), they read as running and nothing as due.
        self._bind()
        self._recall_given_up()
        now = self.clock()
        for issue in self.tracker.list_candidates():
            task_id = self._task_id(issue)
            task = self.ledger.get_task(task_id, now=now, cap=self._cap)
            if task.state is TaskState.BLOCKED and self._legacy(issue, task):
                task = self.ledger.get_task(task_id, now=now, cap=self._cap, force=True)
            if task.state in (TaskState.READY, TaskState.BACKOFF):
                if self._stopped_lane(issue, now) is not None:
                    continue  # nothing runs it until an operator resumes its lane
                return False
            if task.state is TaskState.BLOCKED and task.gave_up_at_attempt == task.attempts_started:
                return False  # moved back by an operator: a forced retry is due
        # Retried by an operator in the ledger: the next pass brings its card back.
        return not self._retried_given_up()

    def waiting_on_people(self) -> list[LaneStopped]:
        """The stopped vendor lanes that hold eligible issues now, each once (its refusal
        names the lane and the fix): what `--until-idle` names when it ends with work left
        that only a person can let run (`execkit lane resume LANE` after the fix)."""
        now = self.clock()
        found: dict[str, LaneStopped] = {}
        for issue in self.tracker.list_candidates():
            stopped = self._stopped_lane(issue, now)
            if stopped is not None and stopped.lane is not None:
                found.setdefault(stopped.lane, stopped)
        return list(found.values())

    def _stopped_lane(self, issue: BoardIssue, now: float) -> LaneStopped | None:
        """The stopped lane's refusal that holds `issue`, if any (as this dispatcher's last
        admission on that lane met it): with an order of adapters (issue #46), only when
        every one of its lanes is stopped (the first's refusal), else it can still run."""
        first: LaneStopped | None = None
        for adapter in self.config.adapters_of(issue):
            held = self._lanes.holding(self._lanes.lane_of(adapter), now)
            if not isinstance(held, LaneStopped):
                return None
            first = first or held
        return first

    def shutdown(
        self, drain_timeout_s: float, *, wait: Callable[[float], object] | None = None
    ) -> list[DispatchEvent]:
        """Stop: take no new work, let the running agents finish within `drain_timeout_s`,
        then stop their process trees and record their runs as stopped by their dispatcher
        (uncharged: the attempt said nothing about the work; it still counts against an
        explicit task limit, as every admitted run does). Their cards stay where they are.
        Returns the events of the slots that ended. `wait(s)` waits for a slot to end (the
        default, a real wait on the slots)."""
        if not is_number(drain_timeout_s) or drain_timeout_s < 0:
            raise InvalidInput(
                f"drain_timeout_s: must be a number of seconds >= 0, got {drain_timeout_s!r}",
                field="drain_timeout_s",
            )
        self._stopping = True
        events = self._reap()
        deadline = time.monotonic() + drain_timeout_s
        while self._running and not self._hurry and time.monotonic() < deadline:
            left = max(0.0, deadline - time.monotonic())
            if wait is None:
                self._wait_for_a_slot(left, draining=True)
            else:
                wait(left)
            events.extend(self._reap())
        for running in self._running.values():
            running.cancel.cancel()
        # A cancelled agent's tree is killed at once; the bound is only a backstop.
        for running in list(self._running.values()):
            with suppress(Exception):
                running.future.exception(timeout=_STOP_BACKSTOP_S)
        events.extend(self._reap())
        return events

    # -- slots ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        self._bind()
        self._recall_given_up()
        self._lanes.new_pass()
        self.ledger.abandon_expired_runs(now=self.clock())
        self._record_pending()
        self._restore_retried()

    def _restore_retried(self) -> None:
        """Bring back to the column it was taken from each issue this dispatcher gave up
        (it still stands in `failed_state` at the attempt count it was given up at) whose
        task an operator let run again in the ledger: `execkit task retry`, the dashboard's
        "retry once", or `execkit lane resume` on the lane its run stopped (each a pending
        forced retry). The pending retry is then what the next admission does: the same
        path as a card an operator moves back by hand, from the other end. Only the issues
        dispatcher gave up are looked at (nothing when there are none: no read, and no
        task is ever made for a card that has none): those this process gave up, and,
        on a board that keeps where each came from (`GiveUpBoard`), those any dispatcher
        gave up before this one started. A card given up on a board that keeps nothing,
        by a dispatcher that has since exited, is moved back by hand. A board that cannot
        list its issues is left as it is."""
        for issue, task in self._retried_given_up():
            back = self._gave_up_from[issue.id]
            why = f"an operator's retry is pending ({task.reason or 'retry'})"
            if self._move(issue, task, back, why=why) is not None:
                self._gave_up_from.pop(issue.id, None)
                _log.info("issue %s: moved back to %r: %s", issue.id, back, why)

    def _retried_given_up(self) -> list[tuple[BoardIssue, Task]]:
        """The issues this dispatcher gave up that stand in `failed_state` at the count
        they were given up at and whose task has an operator's retry pending."""
        failed = self.config.failed_state
        if not self._gave_up_from or failed is None or not isinstance(self.tracker, Board):
            return []
        found = []
        for issue in self.tracker.list_issues():
            if issue.id not in self._gave_up_from:
                continue
            if issue.state != failed:
                # Moved on by hand (back to work, or elsewhere): nothing left to restore.
                del self._gave_up_from[issue.id]
                continue
            # Its task exists (it was given up): after a restart, found by its key.
            task_id = self._task_id(issue)
            task = self.ledger.get_task(task_id, now=self.clock(), cap=self._cap)
            # Given up at this count, or its record missing: a give-up moves the card first
            # and records second, so a dispatcher killed in between left the board's
            # `given_up_from` as the only trace (the card has not moved since).
            if (
                task.retry_pending
                and task.status is TaskStatus.OPEN
                and task.gave_up_at_attempt in (None, task.attempts_started)
            ):
                found.append((issue, task))
        return found

    def _wait_for_a_slot(self, timeout_s: float | None, *, draining: bool = False) -> None:
        """Until a slot ends, a stop is asked for (with `draining`, in `shutdown`: a hurried
        one), or `timeout_s`. A slot that ended before the wait began is seen at once: the
        flag is cleared only here, after a reap found it. The wait never blocks longer than
        `_SIGNAL_CHECK_S` at once (below), and ends at the next such step once the stop is
        asked for, asked before the wait began included."""

        def stopped() -> bool:
            # A stop asked in the main thread wakes no wait (`request_stop`): read here.
            return self._hurry or (self._stopping and not draining)

        if stopped() or any(r.future.done() for r in self._running.values()):
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not stopped():
            left = _SIGNAL_CHECK_S
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
            if left <= 0 or self._slot_done.wait(left):
                break
        self._slot_done.clear()

    def _room_for(self, adapter: str) -> bool:
        if self._stopping or len(self._running) >= self.config.max_concurrent_agents:
            return False
        on_adapter = sum(1 for r in self._running.values() if r.adapter == adapter)
        return on_adapter < self.config.adapter_cap(adapter)

    def _fill(self, waiting: list[BoardIssue], events: list[DispatchEvent]) -> list[BoardIssue]:
        """Start what fits from `waiting` (each issue at most once); the rest, in order."""
        left: list[BoardIssue] = []
        for issue in waiting:
            if self._stopping or len(self._running) >= self.config.max_concurrent_agents:
                left.append(issue)
                continue
            if not self._room_for(self.config.adapter_of(issue)):
                left.append(issue)
                continue
            try:
                events.extend(self._tick_issue(issue))
            except ExecKitError as exc:
                _log.warning("issue %s: %s", issue.id, exc.message)
                events.append(
                    self._event(EventKind.ERROR, issue, None, reason=f"{exc.code}: {exc.message}")
                )
        return left

    def _reap(self) -> list[DispatchEvent]:
        """The events of the slots that ended, in the order they were started."""
        events: list[DispatchEvent] = []
        for run_id, running in list(self._running.items()):
            if not running.future.done():
                continue
            del self._running[run_id]
            running.cancel.close()
            outcome = running.future.result()  # the slot's work never raises
            if outcome is _STOPPED:
                continue  # stopped by this dispatcher: nothing to move, nothing to say
            if running.lane is not None and _met_upstream(outcome):
                self._doubted.add(running.lane)
            if isinstance(outcome, _NotRecorded):
                exc = outcome.error
                _log.warning("issue %s: %s", running.issue.id, exc.message)
                events.append(
                    self._event(
                        EventKind.ERROR, running.issue, None, reason=f"{exc.code}: {exc.message}"
                    )
                )
                continue
            try:
                events.append(self._after_run(running.issue, running.run, outcome, running.adapter))
            except ExecKitError as exc:
                _log.warning("issue %s: %s", running.issue.id, exc.message)
                events.append(
                    self._event(
                        EventKind.ERROR, running.issue, None, reason=f"{exc.code}: {exc.message}"
                    )
                )
        return events

    def _bind(self) -> None:
        if self._bound:
            return
        if isinstance(self.tracker, JsonFileBoard):
            self.tracker.ensure_private()  # its commands run as us
        self._ledger_id = self.ledger.ledger_id()
        self._lanes.bind(self._ledger_id)
        if isinstance(self.tracker, BindableBoard):
            self.tracker.bind_ledger(self._ledger_id, self.ledger.location())
        self._abandon_lost_runs()
        self._bound = True

    def _recall_given_up(self) -> None:
        """At start: the cards a dispatcher (this one before a restart, or another) gave
        up and the board still holds in `failed_state`, with the column each came from,
        as the board kept it (`BoardIssue.given_up_from`); `_restore_retried` then brings
        one back when an operator lets its task run again. One read of the board, none
        of the ledger, before the first pass or the first `idle` (`--until-idle` asks it
        before any pass)."""
        if self._recalled:
            return
        self._recalled = True
        failed = self.config.failed_state
        if failed is None or not isinstance(self.tracker, Board):
            return
        for issue in self.tracker.list_issues():
            if issue.state == failed and issue.given_up_from is not None:
                self._gave_up_from.setdefault(issue.id, issue.given_up_from)

    def _abandon_lost_runs(self) -> None:
        """At start: abandon at once the runs owned on this host whose process is gone
        (`owner_lost`), audited with the reason, instead of waiting out their leases. They
        count and charge as every abandoned run does: nothing says what their agent did."""
        for run in self.ledger.running_runs():
            why = owner_lost(run, self.owner)
            if why is None:
                continue
            try:
                self.ledger.abandon_run(run.id, reason=why, actor=DISPATCH_ACTOR, now=self.clock())
            except (Conflict, NotFound):
                continue  # it ended meanwhile: the history says how
            _log.warning("run %s of task %s: abandoned, %s", run.id, run.task_id, why)

    def _emit(self, event: DispatchEvent) -> DispatchEvent:
        if self._on_event is not None:
            self._on_event(event)
        return event

    def _event(
        self, kind: EventKind, issue: BoardIssue, task: Task | None, **fields: Any
    ) -> DispatchEvent:
        return self._emit(
            DispatchEvent(
                kind=kind,
                issue_id=issue.id,
                at=self.clock(),
                task_id=task.id if task else None,
                max_attempts=self.config.bound_for(task),
                **fields,
            )
        )

    def _task_id(self, issue: BoardIssue) -> str:
        task_id = self._task_ids.get(issue.id)
        if task_id is None:
            key = task_key(issue.id)
            task = self.ledger.create_task(key, idempotency_key=key, actor=DISPATCH_ACTOR)
            if issue.budget_usd is not None or issue.budget_tokens is not None:
                self._board_budget(issue, task.id)
            task_id = self._task_ids[issue.id] = task.id
        return task_id

    def _board_budget(self, issue: BoardIssue, task_id: str) -> None:
        """The issue's `budget_usd`/`budget_tokens` (issue #45) as its task's own spend cap,
        when the task has none yet (an operator's, or one set before, is kept): compare-
        and-set on none, so two dispatchers set it once."""
        if self.ledger.task_budget(task_id) != TaskBudget(task_id):
            return
        with suppress(Conflict):  # another dispatcher set it first: theirs stands
            self.ledger.set_task_budget(
                task_id,
                usd=issue.budget_usd,
                tokens=issue.budget_tokens,
                expected_usd=None,
                expected_tokens=None,
                actor=DISPATCH_ACTOR,
            )

    def _tick_issue(self, issue: BoardIssue) -> list[DispatchEvent]:
        task_id = self._task_id(issue)
        now = self.clock()
        task = self.ledger.get_task(task_id, now=now, cap=self._cap)
        if task.status is TaskStatus.DONE:
            moved = self._move(issue, task, self.config.done_state, why="it succeeded")
            # Done before a restart that left its workspace: removed now.
            removed = self._remove_workspace(issue)
            return [
                self._event(
                    EventKind.DONE,
                    issue,
                    task,
                    moved_to=moved,
                    reason=task.reason,
                    **self._workspace_fields(issue, removed),
                )
            ]
        if task.status is TaskStatus.CANCELLED:
            reason = "task cancelled in the ledger"
            return [self._event(EventKind.REFUSED, issue, task, reason=reason)]
        if task.state is TaskState.BACKOFF and self._falls_back(issue, task, now):
            # Its own run parked its lane (a stated reset): a later adapter of its order
            # runs it now instead of waiting for the reset (issue #46), announced.
            return self._dispatch(issue, task, forced=False, ignore_backoff=True)
        if task.state in (TaskState.RUNNING, TaskState.BACKOFF):
            return []  # another dispatcher runs it, or its retry is not due yet
        if task.state is not TaskState.BLOCKED:
            return self._dispatch(issue, task, forced=False)
        if task.blocked_on is BlockedOn.ATTEMPT_LIMIT:
            return [self._attempt_limit_event(issue, task)]
        if task.gave_up_at_attempt == task.attempts_started:
            # We moved it to the failed state at this very count, and it is eligible again:
            # an operator moved the card back. That is the forced retry they asked for.
            # Unless `issue` is stale: another dispatcher may have given it up since this
            # pass listed the candidates. A give-up is recorded after its move, so a fresh
            # read of the board tells the two apart.
            if not any(c.id == issue.id for c in self.tracker.list_candidates()):
                return []
            reopened = self.ledger.retry_task(
                task_id,
                actor=Actor(DISPATCH_ACTOR, on_behalf_of="the board's operator"),
                reason=f"issue {issue.id} moved back to {issue.state!r} on the board",
                force=True,
                now=now,
            )
            return self._dispatch(issue, reopened, forced=False)
        if self._falls_back(issue, task, now):
            # Blocked by its own run's lane stop (credentials, billing), not by the work:
            # uncharged, not given up; a later adapter of its order runs it (issue #46).
            # Forced past the block, which was the lane's: the stopped lane itself still
            # refuses the run (the ledger's gate), so only an open one takes it.
            reopened = self.ledger.get_task(task_id, now=now, cap=self._cap, force=True)
            if reopened.state in (TaskState.READY, TaskState.BACKOFF):
                return self._dispatch(issue, reopened, forced=True, ignore_backoff=True)
        moved = self._give_up(issue, task)
        if moved is not None:
            return [self._gave_up(issue, task, moved)]
        # Never strand (ADR 015): without a terminal state to move to, retry past the bound
        # (loudly: `_move` warned), waiting out the backoff as the legacy dispatcher did.
        forced = self.ledger.get_task(task_id, now=now, cap=self._cap, force=True)
        if forced.state is TaskState.READY:
            return self._dispatch(issue, forced, forced=True)
        return [self._stopped_event(EventKind.BLOCKED, issue, task, task.blocked_on)]

    def _legacy(self, issue: BoardIssue, task: Task) -> bool:
        """Whether a blocked, still eligible issue is retried past its bound (no give-up)."""
        return task.blocked_on is not BlockedOn.ATTEMPT_LIMIT and (
            self.config.failed_state is None or task.gave_up_at_attempt != task.attempts_started
        )

    def _stopped_event(
        self,
        kind: EventKind,
        issue: BoardIssue,
        task: Task,
        blocked_on: BlockedOn | None,
        **fields: Any,
    ) -> DispatchEvent:
        """An event for a task a bound stopped: its attempts so far and the ledger's why."""
        return self._event(
            kind,
            issue,
            task,
            attempt=task.attempts_started,
            blocked_on=blocked_on,
            decision=task.reason,
            **fields,
        )

    def _attempt_limit_event(self, issue: BoardIssue, task: Task) -> DispatchEvent:
        return self._stopped_event(EventKind.ATTEMPT_LIMIT, issue, task, BlockedOn.ATTEMPT_LIMIT)

    def _gave_up(self, issue: BoardIssue, task: Task, moved: str) -> DispatchEvent:
        return self._stopped_event(EventKind.GAVE_UP, issue, task, task.blocked_on, moved_to=moved)

    def _give_up(self, issue: BoardIssue, task: Task) -> str | None:
        """Move a given-up issue to the failed state and remember it in the ledger; the
        state moved to, or None when the move is unavailable."""
        why = task.reason or f"blocked on {task.blocked_on}"
        moved = self._move(issue, task, self.config.failed_state, why=why, give_up=True)
        if moved is not None:
            self._gave_up_from[issue.id] = issue.state
            # Moved first, recorded second: a record without the move would later read as
            # an operator's re-open of an issue that never left its column.
            try:
                self.ledger.record_give_up(
                    task.id, state=moved, actor=DISPATCH_ACTOR, now=self.clock()
                )
            except ExecKitError as exc:
                _log.warning(
                    "issue %s: moved to %r but the give-up is not recorded: %s",
                    issue.id,
                    moved,
                    exc.message,
                )
        return moved

    def _move(
        self, issue: BoardIssue, task: Task, state: str | None, *, why: str, give_up: bool = False
    ) -> str | None:
        """Move the issue; when that is unavailable, log a WARNING naming issue and state.
        A `give_up` on a `GiveUpBoard` also keeps the column it came from on the board.

        Logged once for each attempt count at which the move fails, so every exhaustion of
        a bound is heard (a board that cannot take the move keeps retrying, ADR 015)
        without repeating it on each pass that re-reads the same history.
        """
        if state is None:
            problem = "no failed_state is configured (failed_state: none)"
        else:
            try:
                if give_up and isinstance(self.tracker, GiveUpBoard):
                    moved = self.tracker.give_up(issue.id, state)
                else:
                    moved = self.tracker.move(issue.id, state)
                if moved:
                    self._warned.pop(issue.id, None)
                    return state
                problem = f"the board has no state {state!r} or refused the move"
            except UnsupportedMove as exc:
                problem = f"moving it to {state!r} is unsupported: {exc.message}"
        seen = (task.attempts_started, state)
        if self._warned.get(issue.id) != seen:
            self._warned[issue.id] = seen
            _log.warning(
                "issue %s was not moved (%s): %s; it stays in %r and remains eligible",
                issue.id,
                why,
                problem,
                issue.state,
            )
        return None

    def _falls_back(self, issue: BoardIssue, task: Task, now: float) -> bool:
        """Whether `issue`, blocked or waiting because its own last run found its vendor
        lane closed, runs now on another adapter of its order instead (issue #46): its last
        run failed `environment` (a lane stop: the task is blocked on environment) or
        `upstream` (a reset that parked the lane: the task backs off until it), never
        `work`; the lane that run used does not admit now; and another adapter of the
        order has a lane that does (on this host too). Then the issue is neither given up
        nor left waiting: its next admission falls back, announced as every fallback is."""
        adapters = self.config.adapters_of(issue)
        if len(adapters) < 2 or self._lanes.lane_of(adapters[0]) is None:
            return False  # one adapter, or lanes off: nothing to fall back to
        if task.state is TaskState.BLOCKED:
            if task.blocked_on is not BlockedOn.ENVIRONMENT:
                return False
        elif task.state is not TaskState.BACKOFF:
            return False
        runs = self.ledger.runs(task.id)
        last = runs[-1] if runs else None
        if (
            last is None
            or last.stopped
            or last.failure_class not in (FailureClass.ENVIRONMENT, FailureClass.UPSTREAM)
        ):
            return False
        closed = self.ledger.task_lane(task.id, now=now)
        if closed is None or closed.admits:
            return False  # its lane is open: the block or the wait is the task's own
        met = str(LaneKey.parse(closed.lane).without_host())
        return any(
            lane is not None and lane != met and self._lane_open(lane, now)
            for lane in (self._lanes.lane_of(adapter) for adapter in adapters)
        )

    def _lane_open(self, lane: str, now: float) -> bool:
        """Whether `lane` admits a run of this dispatcher's now: not held after a refusal
        here, and open in the ledger, on this host as well (a lane never seen is open)."""
        if self._lanes.holding(lane, now) is not None:
            return False
        for name in (lane, host_lane(lane, self.owner.host)):
            try:
                if not self.ledger.get_lane(name, now=now).admits:
                    return False
            except NotFound:
                continue
        return True

    def _dispatch(
        self, issue: BoardIssue, task: Task, *, forced: bool, ignore_backoff: bool = False
    ) -> list[DispatchEvent]:
        """Admit the issue's next attempt on the first of its adapters whose vendor lane is
        open (issue #46: an issue, or its board, may name several in order); a fallback past
        a closed lane is announced on the run, the event, the board and the log."""
        candidates = self.config.adapters_of(issue)
        closed: list[str] = []  # "claude/x (parked until ...)": the lanes passed over
        events: list[DispatchEvent] = []
        for index, adapter in enumerate(candidates):
            more = index + 1 < len(candidates)
            lane = self._lanes.lane_of(adapter)
            held = self._lanes.holding(lane, self.clock())
            if held is not None:
                # A lane that does not admit: no ledger call, no slot, and no event (its
                # wait was said when it began; the status lists the issues it holds).
                if more and isinstance(held, LaneWaiting | LaneStopped):
                    closed.append(_closed_words(lane, held))
                    continue
                return events
            if closed and not self._room_for(adapter):
                return events  # the fallback's own cap is full: the issue waits for a slot
            if self._in_doubt(lane):
                return events  # the lane's attempts in flight report first
            admitted = self._admit(
                issue, task, adapter, lane, forced=forced, closed=closed,
                ignore_backoff=ignore_backoff,
            )  # fmt: skip
            if isinstance(admitted, LaneWaiting | LaneStopped):
                if self._lanes.refused(lane, admitted):
                    events.append(
                        self._event(EventKind.WAITING, issue, task, reason=admitted.message)
                    )
                if more:
                    closed.append(_closed_words(lane, admitted))
                    continue
                return events
            return events + admitted
        return events

    def _admit(
        self,
        issue: BoardIssue,
        task: Task,
        adapter: str,
        lane: str | None,
        *,
        forced: bool,
        closed: list[str],
        ignore_backoff: bool = False,
    ) -> list[DispatchEvent] | LaneWaiting | LaneStopped:
        """Admit the attempt on `adapter`'s `lane` and start its slot; the events to say,
        or the lane's refusal (the caller tries the issue's next adapter)."""
        expected = task.attempts_started + 1
        # Deterministic per attempt: a second dispatcher that read the same history gets
        # this run back as a replay (not a new run) and sees it is not its own.
        request_key = f"dispatch:{task_key(issue.id)}:{expected}"
        # From the ledger (issue #46): the session the task's last run was refused in
        # upstream, on the adapter it was made on only (never carried to another vendor).
        resume = (
            resumable_session(self.ledger, task.id, adapter, now=self.clock())
            if task.attempts_started
            else None
        )
        fell_back = f"fell back from {'; '.join(closed)} to {lane or adapter}" if closed else None
        try:
            run = self.ledger.start_run(
                task.id,
                request_key=request_key,
                actor=DISPATCH_ACTOR,
                forced=forced,
                ignore_backoff=ignore_backoff,
                lease_s=self._lease_s,
                now=self.clock(),
                cap=self._cap,
                owner=self.owner,
                lane=lane,
                workspace=self._workspace_of(issue),
                resumed_session=resume,
                fell_back=fell_back,
            )
        except (LaneWaiting, LaneStopped) as waiting:
            return waiting
        except SpendCapReached as waiting:
            # A spend window's refusal is uncharged and holds the issue until the window
            # reopens, as a parked lane does (issue #45); no other adapter runs it instead
            # (the window is the ledger's or the lane's budget, not a lane closed).
            if not self._lanes.refused(lane, waiting):
                return []  # the same wait, said already
            return [self._event(EventKind.WAITING, issue, task, reason=waiting.message)]
        except AttemptLimitReached:
            now_task = self.ledger.get_task(task.id, now=self.clock())
            return [self._attempt_limit_event(issue, now_task)]
        except TaskBackingOff:
            return []  # not due after all (another dispatcher's failure just landed)
        except AdmissionRefused as refused:
            return [
                self._event(
                    EventKind.REFUSED, issue, task, attempt=expected, reason=refused.message
                )
            ]
        except Conflict as conflict:
            # The same key with another request: another dispatcher ran this attempt as a
            # forced retry (or not); it is theirs.
            return [
                self._event(
                    EventKind.REFUSED, issue, task, attempt=expected, reason=conflict.message
                )
            ]
        # Ours when this dispatcher's identity admitted it and no slot of ours runs it yet
        # (a replayed admission of a run we already run is not a second one).
        mine = (
            run.status is AttemptStatus.RUNNING
            and run.owner_instance == self.owner.instance
            and run.id not in self._running
        )
        self._lanes.admitted(lane)
        if not mine:
            return [
                self._event(
                    EventKind.REFUSED,
                    issue,
                    task,
                    attempt=run.attempt,
                    reason=f"attempt {run.attempt} was dispatched by another dispatcher",
                )
            ]
        if run.fell_back is not None:
            # Never silently: the log says it now, the run, the event and the card too.
            _log.warning("issue %s: attempt %d %s", issue.id, run.attempt, run.fell_back)
        try:
            guard = spend_guard(self.ledger, run.id, self.clock)
        except StorageError as exc:
            # Its room unknown, the agent does not start unguarded: stopped by its
            # dispatcher (uncharged; left to its lease when that write fails too), and the
            # issue's `error` event says why. Here, before any slot: a slot that ends is
            # refilled at once, so `run_forever` would admit and stop runs as fast as the
            # ledger took them, until the dispatch cap gave the issue up, no agent run.
            _log.warning("run %s: its spend room is unknown: %s", run.id, exc.message)
            record_stopped(self.ledger, run.id, STOPPED_REASON, now=self.clock())
            raise
        self._start_slot(issue, run, adapter, guard)
        return []

    def _start_slot(
        self, issue: BoardIssue, run: Run, adapter: str, guard: SpendGuard | None
    ) -> None:
        """Hand the admitted run to a slot of its own, on `adapter` (with the vendor
        session it resumes, recorded on the run at its admission), held to its spend caps
        by `guard` (None: none applies)."""
        slot = Slot(
            run_id=run.id,
            attempt=run.attempt,
            adapter=adapter,
            heartbeat=functools.partial(self._renew, run.id),
            heartbeat_s=self._lease_s / 3,
            cancel=Cancellation(),
            resume_session=run.resumed_session,
        )
        # The claim is the ledger's (admitted above, under the task's lease); a board that
        # shows work shows it now, before the agent starts.
        self._report(
            issue,
            BoardReport(
                attempt=run.attempt,
                running=True,
                host=self.owner.host,
                max_attempts=self.config.bound_for(None),
                lines=_card_lines(run.fell_back, None),
            ),
        )
        future = self._executor.submit(functools.partial(self._work, issue, run, slot, guard))
        lane = self._lanes.lane_of(slot.adapter)
        self._running[run.id] = _Running(issue, run, slot.adapter, lane, slot.cancel, future)
        future.add_done_callback(lambda _done: self._slot_done.set())

    def _in_doubt(self, lane: str | None) -> bool:
        """Whether `lane` met an upstream failure while attempts on it are still in flight:
        then no new run goes out on it until they have all reported (the ledger's breaker
        or a stated reset may be about to close it). A slot of the lane that ended upstream
        and is not reaped yet counts too. So the vendor calls made before a lane closes are
        at most the attempts in flight when its first refusal came."""
        if lane is None:
            return False
        mine = [r for r in self._running.values() if r.lane == lane]
        if lane not in self._doubted and not any(
            r.future.done() and _met_upstream(r.future.result()) for r in mine
        ):
            return False
        if any(not r.future.done() for r in mine):
            self._doubted.add(lane)
            return True
        self._doubted.discard(lane)  # all reported: the ledger decides from here
        return False

    def _renew(self, run_id: str) -> None:
        """The one lease renewer, called by the slot's spawn loop. A storage hiccup is
        logged and left to the next beat (the lease outlasts two missed beats); anything
        else (the run was abandoned meanwhile: `Conflict`) propagates, and the agent stops:
        nothing it produces could be recorded."""
        try:
            self.ledger.heartbeat(run_id, lease_s=self._lease_s, now=self.clock())
        except StorageError as exc:
            _log.warning("run %s: its lease was not renewed: %s", run_id, exc.message)

    def _work(
        self, issue: BoardIssue, run: Run, slot: Slot, guard: SpendGuard | None
    ) -> RunOutcome | _NotRecorded:
        """A slot's whole dispatch, in its own thread: the issue's workspace (made or
        reused under the run's lease), the runner in it, held to its spend caps by `guard`,
        the workspace's `after_done` hook after a success, then the result's write. Never
        raises: whatever happens is an outcome."""
        try:
            if guard is not None:
                slot = attrs.evolve(slot, usage_limit=guard.crossed)
            outcome = with_spend_stop(self._in_workspace(issue, slot), guard)
        except SpawnCancelled:
            record_stopped(self.ledger, run.id, STOPPED_REASON, now=self.clock())
            return _STOPPED
        except Exception as exc:
            _log.exception("issue %s: the runner raised on attempt %d", issue.id, run.attempt)
            outcome = runner_error(exc)
        except BaseException:
            # Interrupted mid-run (Ctrl-C in an inline slot): no proof of what happened.
            record_stopped(self.ledger, run.id, STOPPED_REASON, now=self.clock())
            raise
        with self._unrecorded_lock:
            self._unrecorded[run.id] = _Unrecorded(run.id, outcome, self.clock())
        try:
            self._record(run.id)
        except ExecKitError as exc:
            # Kept in `_unrecorded`: the next pass writes it. Reported by the reap.
            return _NotRecorded(outcome, exc)
        return outcome

    def _in_workspace(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        """The runner's outcome, in the issue's workspace when this dispatcher has them;
        a workspace that cannot be made, or a hook that fails, is the outcome instead."""
        if self.workspaces is None:
            return self.runner.run(issue, slot)
        prepared = self.workspaces.prepare(issue.id)
        if isinstance(prepared, RunOutcome):
            return prepared
        outcome = self.runner.run(issue, attrs.evolve(slot, cwd=str(prepared)))
        if outcome.status is RunStatus.SUCCEEDED:
            failed = self.workspaces.after_done(issue.id)
            if failed is not None:
                return failed
        return outcome

    def _remove_workspace(self, issue: BoardIssue) -> bool | None:
        """Remove a done issue's workspace (unless kept); None without workspaces. A
        failure to remove is logged: the issue is done either way."""
        if self.workspaces is None:
            return None
        try:
            return self.workspaces.remove(issue.id)
        except OSError as exc:
            _log.warning("issue %s: its workspace was not removed: %s", issue.id, exc)
            return False

    def _workspace_of(self, issue: BoardIssue) -> str | None:
        """Where `issue`'s agent works: its workspace, recorded on its run."""
        return None if self.workspaces is None else str(self.workspaces.path_for(issue.id))

    def _workspace_fields(self, issue: BoardIssue, removed: bool | None = None) -> dict[str, Any]:
        if self.workspaces is None:
            return {}
        return {
            "workspace": str(self.workspaces.path_for(issue.id)),
            "workspace_removed": removed,
        }

    def _record(self, run_id: str) -> None:
        with self._unrecorded_lock:
            pending = self._unrecorded[run_id]
        record_outcome(self.ledger, run_id, pending.outcome, now=pending.ended_at)
        with self._unrecorded_lock:
            self._unrecorded.pop(run_id, None)

    def _record_pending(self) -> None:
        with self._unrecorded_lock:
            # A slot still running writes its own result; only the ended ones are retried.
            pending = [run_id for run_id in self._unrecorded if run_id not in self._running]
        for run_id in pending:
            try:
                self._record(run_id)
            except Conflict:
                # Finished meanwhile as something else (abandoned after its lease ran out):
                # the history already says how it ended.
                with self._unrecorded_lock:
                    self._unrecorded.pop(run_id, None)
            except ExecKitError as exc:
                _log.warning("run %s: its result is still not recorded: %s", run_id, exc.message)

    def _after_run(
        self, issue: BoardIssue, run: Run, outcome: RunOutcome, adapter: str
    ) -> DispatchEvent:
        failed = outcome.status is RunStatus.FAILED
        after = self.ledger.get_task(run.task_id, now=self.clock(), cap=self._cap)
        fields: dict[str, Any] = {
            "attempt": run.attempt,
            "status": outcome.status,
            # A run a spend window stopped has no class: it says nothing of the work.
            "failure_class": (outcome.failure_class or FailureClass.WORK)
            if failed and outcome.window_stop is None
            else None,
            "charged": outcome.charged,
            "reason": outcome.ledger_reason(),
            "precondition": outcome.precondition,
        }
        if run.fell_back is not None:
            fields["fell_back"] = run.fell_back
        if outcome.resumed_session is not None:
            fields["resumed_session"] = outcome.resumed_session
            fields["resumed_after"] = resumed_after(self.ledger.runs(run.task_id), run)
            fields["resume_refused"] = outcome.resume_refused
            if outcome.resume_refused:
                _log.warning(
                    "issue %s: the vendor refused to resume session %s; attempt %d started "
                    "fresh (uncharged)",
                    issue.id,
                    outcome.resumed_session,
                    run.attempt,
                )
        if failed and outcome.lane_cause in _STOPPING_CAUSES:
            fields["lane_stopped"] = self._lanes.stopped_by(adapter, str(outcome.lane_cause))
        if not failed:
            fields["moved_to"] = self._move(
                issue, after, self.config.done_state, why="it succeeded"
            )
        elif after.state is TaskState.BLOCKED and self._falls_back(issue, after, self.clock()):
            # Its own run stopped its lane, and another adapter of its order is open: not
            # given up; the next admission falls back (issue #46).
            fields["falls_back"] = True
            _log.warning(
                "issue %s: attempt %d stopped its lane (%s); the next attempt falls back to "
                "the next open adapter of its order",
                issue.id,
                run.attempt,
                outcome.ledger_reason() or outcome.failure_class,
            )
        elif after.state is TaskState.BLOCKED:
            fields["blocked_on"] = after.blocked_on
            fields["decision"] = after.reason
            if after.blocked_on is not BlockedOn.ATTEMPT_LIMIT:
                fields["moved_to"] = self._give_up(issue, after)
                if fields["moved_to"] is None:
                    # Legacy retry past the bound: when it is due comes from the forced view.
                    forced = self.ledger.get_task(
                        run.task_id, now=self.clock(), cap=self._cap, force=True
                    )
                    fields["next_attempt_at"] = forced.next_attempt_at
        else:
            fields["next_attempt_at"] = after.next_attempt_at
            if failed and self._falls_back(issue, after, self.clock()):
                fields["falls_back"] = True  # not after its lane's reset: now, elsewhere
        # Done: its workspace goes (unless kept); blocked or retried: it stays.
        removed = self._remove_workspace(issue) if not failed else None
        fields.update(self._workspace_fields(issue, removed))
        self._report(
            issue,
            BoardReport(
                attempt=run.attempt,
                max_attempts=self.config.bound_for(after),
                status=str(outcome.status),
                failure_class=None
                if fields["failure_class"] is None
                else str(fields["failure_class"]),
                reason=fields["reason"] if failed else None,
                fix=outcome.precondition,
                moved_to=fields.get("moved_to"),
                next_attempt_at=fields.get("next_attempt_at"),
                lines=_card_lines(
                    run.fell_back,
                    "its lane is closed: the next attempt falls back to the next open adapter"
                    if fields.get("falls_back")
                    else None,
                    None
                    if outcome.resumed_session is None
                    else resume_line(
                        outcome.resumed_session,
                        fields.get("resumed_after"),
                        refused=outcome.resume_refused,
                    ),
                ),
                spend=_spend_words(outcome.usage),
            ),
        )
        return self._event(EventKind.DISPATCHED, issue, after, **fields)

    def _report(self, issue: BoardIssue, report: BoardReport) -> None:
        """Tell a board that shows work (`ReportingBoard`) what this issue must show. A
        board that cannot record it is logged: the ledger holds the run either way."""
        if not isinstance(self.tracker, ReportingBoard):
            return
        try:
            self.tracker.report(issue.id, report)
        except ExecKitError as exc:
            _log.warning("issue %s: the board did not record its status: %s", issue.id, exc.message)

    def _catch_up(self) -> None:
        """Let a board that shows work send what it recorded (its outbox). A tracker that
        waits (its lane parked, cooling or stopped) or fails is logged once per message and
        left to a later pass: the agents go on, and nothing recorded is lost."""
        if not isinstance(self.tracker, ReportingBoard):
            return
        try:
            self.tracker.catch_up()
        except ExecKitError as exc:
            if self._catch_up_said != exc.message:
                self._catch_up_said = exc.message
                _log.warning("the board's write-back waits: %s", exc.message)
        else:
            self._catch_up_said = None
