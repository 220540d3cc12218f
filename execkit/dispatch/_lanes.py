"""The dispatcher's side of vendor lanes (issue #28): which lane an issue's run uses, and
which lanes to leave alone until they open.

The ledger decides (`start_run(lane=...)` refuses a run on a lane that does not admit, in
the admission's own transaction, before a slot is taken); this module only saves the
dispatcher from asking again and again. After a refusal the lane is held: its other issues
are not sent to the ledger until the opening time the refusal named (or, for a lane that
waits on its probe or an operator, until the next pass), they are reported as waiting on
the lane and their cards stay where they are (the wait is not the task's fault), other
lanes' issues take the free slots, and `next_due` wakes the dispatcher at the opening.

A lane is `adapter/fingerprint`: the adapter's name and the keyed fingerprint of the
credentials it would read (`execkit._lanes.lane_for`, keyed by the ledger's identity), its
environment variables taken from the runner's environment. Lanes are on only when the
ledger advertises `vendor.lanes` (an older server is sent none) and `enabled` is set.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping

from execkit._adapter import Adapter
from execkit._attempt import adapter_lane
from execkit._errors import ExecKitError, LaneStopped, LaneWaiting, SpendCapReached
from execkit._lanes import LANE_WAIT, LaneCause, LaneView, host_lane
from execkit._registry import get_adapter
from execkit._stamp import utc_stamp
from execkit.ledger import LANES_CAPABILITY, Ledger

__all__ = ["DispatchLanes", "waiting_reason"]


def waiting_reason(lane: LaneView) -> str:
    """ "waiting on lane claude/default until 2026-12-05T15:00:00+00:00 (usage limit)"."""
    if lane.opens_at is not None:
        until = f"until {utc_stamp(lane.opens_at)}"
    elif lane.state == "stopped":
        until = "until an operator resumes it"
    else:
        until = "until its probe attempt's result"
    return f"{LANE_WAIT}{lane.lane} {until}" + (f" ({lane.reason})" if lane.reason else "")


class DispatchLanes:
    """Lanes for one dispatcher: the lane of each adapter (read once), the lanes held
    after a refusal, and when each opens. Used from the dispatcher's own thread only."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        enabled: bool = True,
        env: Mapping[str, str] | None = None,
        find: Callable[[str], Adapter] = get_adapter,
        host: str | None = None,
    ) -> None:
        self._ledger = ledger
        # The host whose host-local lanes (a missing binary) this dispatcher meets: the
        # one its runs' owner names (`RunOwner.host`), the ledger's key for them.
        self._host = socket.gethostname() if host is None else host
        self._enabled = enabled
        self._env = os.environ if env is None else env
        self._find = find
        self._key: str | None = None
        self._lanes: dict[str, str | None] = {}
        # lane -> (the refusal, when it opens: None = at the next pass)
        self._held: dict[str, tuple[ExecKitError, float | None]] = {}
        # lane -> the wait last said (its kind and opening, or its fix): said again only
        # when it changes, and forgotten when the lane admits a run
        self._said: dict[str, tuple[str, float | str | None]] = {}

    def bind(self, ledger_id: str) -> None:
        """Once the ledger is known: lanes need its identity, and its capability."""
        if self._enabled and LANES_CAPABILITY not in self._ledger.capabilities():
            self._enabled = False
        self._key = ledger_id

    def lane_of(self, adapter: str) -> str | None:
        """The lane a run on `adapter` uses; None when lanes are off (or the adapter is
        unknown: its issue stops on its own, as before)."""
        if not self._enabled or self._key is None:
            return None
        if adapter not in self._lanes:
            try:
                found = self._find(adapter)
            except ExecKitError:
                self._lanes[adapter] = None
            else:
                self._lanes[adapter] = adapter_lane(found, ledger_id=self._key, env=self._env)
        return self._lanes[adapter]

    def release(self) -> None:
        """Hold no lane any longer: each is asked again at its next admission (an operator
        may have resumed or re-opened it before the time its refusal named)."""
        self._held.clear()

    def new_pass(self) -> None:
        """A new pass: lanes held until "the next pass" are asked again."""
        self._held = {lane: held for lane, held in self._held.items() if held[1] is not None}

    def holding(self, lane: str | None, now: float) -> ExecKitError | None:
        """The refusal that holds `lane` now, if any (the issue then waits, unasked); the
        runs on no lane are held by a spend window's refusal as one lane (`""`)."""
        key = "" if lane is None else lane
        if key not in self._held:
            return None
        refusal, opens_at = self._held[key]
        if opens_at is not None and opens_at <= now:
            del self._held[key]
            return None
        return refusal

    def refused(
        self, lane: str | None, refusal: LaneWaiting | LaneStopped | SpendCapReached
    ) -> bool:
        """Hold `lane` after the ledger refused a run on it; True when this wait is news
        (the lane's first refusal since it last admitted a run, or a wait that differs from
        the one last said: another opening time, a stop), False for the same wait again.
        A spend window's refusal (issue #45) holds the lane until the window reopens, as a
        parked lane is held: the runs on no lane together, as one."""
        if lane is None and not isinstance(refusal, SpendCapReached):
            return True
        key = "" if lane is None else lane
        wait: tuple[str, float | str | None]
        if isinstance(refusal, SpendCapReached):
            opens_at = refusal.reopens_at
            wait = ("spend", opens_at)
        elif isinstance(refusal, LaneWaiting):
            opens_at = refusal.opens_at
            wait = ("waiting", opens_at)
        else:
            opens_at = None
            wait = ("stopped", refusal.fix)
        self._held[key] = (refusal, opens_at)
        news = self._said.get(key) != wait
        self._said[key] = wait
        return news

    def admitted(self, lane: str | None) -> None:
        """A run was admitted on `lane`: its next closing is news again."""
        self._said.pop("" if lane is None else lane, None)

    def stopped_by(self, adapter: str, cause: str) -> str | None:
        """The lane a run on `adapter` stopped with `cause` (a stopping `LaneCause`): its
        lane, or that lane on this dispatcher's host for a missing binary (as the ledger
        names it); None when lanes are off."""
        lane = self.lane_of(adapter)
        if lane is None or cause != LaneCause.BINARY_MISSING:
            return lane
        return host_lane(lane, self._host)

    def closed(self, adapter: str, views: Mapping[str, LaneView]) -> LaneView | None:
        """Of `views` (lanes that do not admit, by name), the one a run on `adapter` would
        meet here: its lane, or the same lane on this dispatcher's host."""
        lane = self.lane_of(adapter)
        if lane is None:
            return None
        return views.get(lane) or views.get(host_lane(lane, self._host))

    def wake_times(self) -> list[float]:
        """When the held lanes open (for `Dispatcher.next_due`)."""
        return [opens for _refusal, opens in self._held.values() if opens is not None]
