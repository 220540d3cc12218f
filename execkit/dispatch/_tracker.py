"""The tracker contract (issue #48): what every tracker board (GitHub Issues, a GitHub
Project, Linear, ...) shares, so that a further tracker is one file behind it.

A tracker board is a `Board` and a `ReportingBoard` (execkit/dispatch/_board.py) whose
subclass of `TrackerBoard` supplies three things:

- `_refresh()`: bring its copy of the tracker's issues up to date, as cheaply as the API
  allows (a conditional request, or only what changed since the last poll), each request
  through `_answered` so the tracker's lane hears that the tracker answers again; a refusal
  raised as `_Refusal` (`_refreshing` turns it into the lane's word);
- `list_issues()` / `states`: the issues as `BoardIssue`s in the board's states (each
  state eligible, terminal, or neither);
- `_send(item, payload, ref, sends)`: make the tracker show one outbox entry (a move, the
  status comment), idempotently; the status comment's id.

What this class keeps the same for every tracker:

- claims: the ledger lease decides them (the dispatcher admits a run first); a tracker only
  shows the claim;
- write-back: `move` and `report` record in the ledger's outbox (`Ledger.outbox_put`) and
  return; `catch_up` claims due entries, sends each (`_send`), settles it with its result,
  stops at the first refusal that closes the lane; nothing is lost or doubled by an outage;
- one status comment per issue (`render_status`, first line `STATUS_MARKER`, edited in
  place by its id, found again by the marker when a create's answer was lost);
- the tracker's lane (`<kind>/<keyed fingerprint of the token>`): a rate limit parks it
  (`reset`, until the stated time), 5xx and dropped connections count to its breaker
  (`upstream`), a refused credential stops it (`stop`, the fix named); while it does not
  admit, reads and writes raise `LaneWaiting` / `LaneStopped` and agents running go on.

`open_tracker` opens a board from its command-line spec (`KIND:WHERE`) through `TRACKERS`,
the one table that names the trackers: no surface and no scheduler names one.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypedDict

import attrs

from execkit._errors import ExecKitError, InvalidInput, LaneStopped, LaneWaiting, NotFound
from execkit.dispatch._board import BoardIssue, BoardReport, BoardState

if TYPE_CHECKING:
    from execkit.dispatch._board import Board
    from execkit.ledger import Ledger

__all__ = [
    "STATUS_MARKER",
    "TRACKERS",
    "TrackerBoard",
    "TrackerOptions",
    "open_tracker",
    "render_status",
    "tracker_kind",
    "tracker_lane",
]

STATUS_MARKER = "<!-- execkit:status -->"
"""The hidden first line of the one status comment execkit keeps on an issue."""

_FENCE = re.compile(r"```execkit[ \t]*\n(.*?)```", re.DOTALL)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,199}\Z")

TRACKERS: dict[str, str] = {
    "github": "execkit.dispatch._github:GitHubBoard",
    "github-project": "execkit.dispatch._github_project:GitHubProjectBoard",
    "linear": "execkit.dispatch._linear:LinearBoard",
    "gitlab": "execkit.dispatch._gitlab:GitLabBoard",
    "jira": "execkit.dispatch._jira:JiraBoard",
}
"""Each tracker board's spec prefix and its class (`module:Class`, loaded only when one is
opened); the class has `from_env(spec, ledger, env, settings, read_only=...)` and, when its
configuration implies dispatch settings, `implied_dispatch(spec, settings, env)`."""

CONFIG_KEYS = {
    "github": "github",
    "github-project": "github_project",
    "linear": "linear",
    "gitlab": "gitlab",
    "jira": "jira",
}
"""The key of each kind's object in a board configuration file."""


def tracker_kind(spec: str) -> str | None:
    """The tracker a `--board` spec names (`github:acme/app` -> `github`), else None (a
    board file's path)."""
    kind, colon, _ = spec.partition(":")
    return kind if colon and kind in TRACKERS else None


def _tracker_class(kind: str) -> Any:
    module, _, name = TRACKERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def tracker_settings(kind: str, settings: Mapping[str, Any]) -> Any:
    """The object of a board configuration file that belongs to tracker `kind`."""
    return settings.get(CONFIG_KEYS[kind])


def tracker_dispatch_states(
    spec: str, settings: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    """The dispatch settings (`done_state`, `failed_state`) a tracker's configuration
    implies ({} when its states are fixed); InvalidInput naming a bad key."""
    kind = tracker_kind(spec)
    assert kind is not None
    implied = getattr(_tracker_class(kind), "implied_dispatch", None)
    if implied is None:
        return {}
    result: dict[str, Any] = implied(
        spec.partition(":")[2], tracker_settings(kind, settings) or {}, env
    )
    return result


def open_tracker(
    spec: str,
    ledger: Ledger,
    env: Mapping[str, str],
    settings: Mapping[str, Any],
    *,
    read_only: bool = False,
) -> Board:
    """The tracker board `spec` names (`KIND:WHERE`), its credentials from `env`, the rest
    from `settings` (a board configuration file). InvalidInput naming what is missing or
    wrong, before anything is sent."""
    kind = tracker_kind(spec)
    if kind is None:
        raise InvalidInput(
            f"{spec!r} is not a tracker board; known: {', '.join(f'{k}:' for k in TRACKERS)}",
            field="board",
        )
    board: Board = _tracker_class(kind).from_env(
        spec.partition(":")[2],
        ledger,
        env,
        tracker_settings(kind, settings),
        read_only=read_only,
    )
    return board


def tracker_lane(kind: str, variable: str, token: str, ledger_id: str) -> str:
    """The lane of a tracker's credential on the ledger `ledger_id`: `<kind>/<fingerprint>`,
    the fingerprint an HMAC keyed by the ledger's identity (the token never leaves it)."""
    from execkit._lanes import credential_fingerprint

    return f"{kind}/{credential_fingerprint([(f'env:{variable}', token.encode())], ledger_id)}"


# -- what a tracker call comes back with --------------------------------------------------


@attrs.frozen
class _Answer:
    status: int
    headers: Mapping[str, str]
    data: Any


@attrs.frozen
class _Refusal(Exception):
    """A call the tracker refused or never answered, and what it means for the lane:
    `outcome` is `upstream`, `reset` (with `until`), `stop` (with the fix in `reason`),
    or `item` (this issue only: 404, 410, 422)."""

    outcome: str
    reason: str
    status: int | None = None
    until: float | None = None


def _header_time(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(moment: float | None) -> str:
    if moment is None:
        return ""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _settings(body: str, labels: Iterable[str], prefix: str) -> dict[str, str]:
    """The adapter and model an issue names: a label `execkit:adapter=codex`, or a fenced
    ```execkit block of `key: value` lines in its body (the body wins)."""
    found: dict[str, str] = {}
    for label in labels:
        key, eq, value = label.removeprefix(prefix + ":").partition("=")
        if label.startswith(prefix + ":") and eq and key in ("adapter", "model"):
            found[key] = value.strip()
    fence = _FENCE.search(body)
    if fence is not None:
        for line in fence.group(1).splitlines():
            key, colon, value = line.partition(":")
            if colon and key.strip() in ("adapter", "model"):
                found[key.strip()] = value.strip()
    return {key: value for key, value in found.items() if _NAME.match(value)}


class _LabelColumns(Protocol):
    """A label board's configuration (GitHub's, GitLab's): a label per column."""

    @property
    def label(self) -> str: ...
    @property
    def running_label(self) -> str: ...
    @property
    def done_label(self) -> str: ...
    @property
    def blocked_label(self) -> str: ...
    @property
    def ours(self) -> frozenset[str]: ...


def wanted_labels(
    config: _LabelColumns, labels: frozenset[str], open_: bool, payload: Mapping[str, Any]
) -> frozenset[str]:
    """The labels an issue of a label board must carry to show `payload`: the labels of
    other people's kept, the column's label, and the running label while a run holds the
    claim. A closed issue is left alone (a person closed it, or `close_on_done` did after
    its labels moved): only the running label, the claim, comes off. With no move to show,
    an open issue carrying the eligible label is eligible (`_state`): a done or blocked
    label beside it is what a person put it back from, and comes off."""
    state = payload.get("state") if open_ else None
    if state is None:
        columns = {config.label, config.done_label, config.blocked_label}
        keep = labels & ({config.label} if open_ and config.label in labels else columns)
    else:
        keep = frozenset(
            {"todo": {config.label}, "done": {config.done_label}}.get(
                state, {config.blocked_label} if state == "blocked" else set()
            )
        )
    running = payload.get("running") and open_ and state in (None, "todo")
    return (labels - config.ours) | keep | ({config.running_label} if running else set())


def render_status(payload: Mapping[str, Any]) -> str:
    """The status comment's text (Markdown) for an outbox payload (`BoardReport` fields)."""
    attempt = payload.get("attempt")
    bound = payload.get("max_attempts")
    head = f"**execkit** · attempt {attempt}" + (f" of {bound}" if bound else "")
    lines = [STATUS_MARKER]
    if payload.get("running"):
        host = payload.get("host") or "a dispatcher"
        lines.append(f"{head} · running on `{host}`")
    else:
        state = payload.get("moved_to") or payload.get("state")
        outcome = payload.get("status") or "ended"
        lines.append(f"{head} · {outcome}" + (f" · moved to `{state}`" if state else ""))
    if payload.get("failure_class"):
        lines.append(f"- last failure: `{payload['failure_class']}`: {payload.get('reason') or ''}")
    if payload.get("fix"):
        lines.append(f"- to fix: {payload['fix']}")
    if payload.get("next_attempt_at") and not payload.get("running"):
        lines.append(f"- next attempt: {_when(payload['next_attempt_at'])}")
    for line in str(payload.get("lines") or "").splitlines():
        lines.append(f"- {line}")
    if payload.get("spend"):
        lines.append(f"- spend: {payload['spend']}")
    return "\n".join(lines) + "\n"


# -- the shared board ----------------------------------------------------------------------


class TrackerOptions(TypedDict, total=False):
    """What every tracker board takes beside its own configuration, passed on whole to
    `TrackerBoard` (see its docstring): `owner`, `clock`, `outbox_lease_s`,
    `retry_base_s`, `read_only`."""

    owner: str | None
    clock: Callable[[], float]
    outbox_lease_s: float
    retry_base_s: float
    read_only: bool


class TrackerBoard:
    """The part of a tracker board every tracker shares (see the module docstring).

    `what` names the board in messages; `lane` is the tracker credential's lane; `ledger`
    holds the outbox and the lane; `owner` names this process's claims on outbox entries;
    `clock` gives POSIX seconds; a write that failed for its issue alone is retried after
    `retry_base_s`, doubling per failure in a row up to ten minutes. `read_only` (what
    `execkit status` opens): the board reads the tracker and the lane and writes nothing,
    to the tracker or to the ledger (`move` and `report` refuse)."""

    def __init__(
        self,
        *,
        what: str,
        lane: str,
        ledger: Ledger,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
        outbox_lease_s: float = 120.0,
        retry_base_s: float = 10.0,
        read_only: bool = False,
    ) -> None:
        self._what = what
        self.lane = lane
        self.ledger = ledger
        self.clock = clock
        self.read_only = read_only
        self._owner = owner or f"{os.uname().nodename}:{os.getpid()}:{id(self):x}"
        self._lease_s = outbox_lease_s
        self._retry_base_s = retry_base_s
        self._moved: dict[str, str] = {}  # moves recorded and not shown yet, by issue id
        self._comments: dict[str, str] = {}  # the last status text sent, by issue id
        self._suspect = True  # the lane may need telling that the tracker answers again
        self._lock = threading.RLock()

    # -- what a subclass supplies -----------------------------------------------------------

    @property
    def name(self) -> str:  # pragma: no cover - every tracker names itself
        raise NotImplementedError

    @property
    def states(self) -> tuple[BoardState, ...]:  # pragma: no cover - every tracker's own
        raise NotImplementedError

    def list_candidates(self) -> list[BoardIssue]:  # pragma: no cover - every tracker's own
        raise NotImplementedError

    def list_issues(self) -> list[BoardIssue]:  # pragma: no cover - every tracker's own
        raise NotImplementedError

    def move(self, issue_id: str, state: str) -> bool:  # pragma: no cover - every tracker's own
        raise NotImplementedError

    def _refresh(self) -> None:  # pragma: no cover - every tracker reads its own way
        raise NotImplementedError

    def _send(self, item: str, payload: dict[str, Any], ref: str | None, sends: int) -> str | None:
        raise NotImplementedError  # pragma: no cover - every tracker writes its own way

    # -- the board protocol, shared ---------------------------------------------------------

    def _record_move(self, issue_id: str, state: str, *, open_: bool) -> bool:
        """Record a move of a listed issue in the outbox (True); a closed issue is left
        alone (True, nothing recorded: a person closed it while its run was in flight)."""
        if not open_:
            self._moved.pop(issue_id, None)
            return True
        self.ledger.outbox_put(self.name, issue_id, {"state": state}, now=self.clock())
        self._moved[issue_id] = state
        return True

    def give_up(self, issue_id: str, state: str) -> bool:
        """A give-up is a move (`BoardIssue.given_up_from` says where it came from)."""
        return self.move(issue_id, state)

    def report(self, issue_id: str, report: BoardReport) -> None:
        """Record what the issue's status comment (and claim) must show. A claim (a
        running report) clears the entry's move: a move still there is an earlier run's,
        one a person undid by putting the issue back, and shown again it would take the
        card out of the column it is worked from (and, once the run ends with no move of
        its own, keep it there)."""
        if self.read_only:
            raise InvalidInput(f"{self._what} was opened read-only", field="board")
        fields: dict[str, Any] = {
            "attempt": report.attempt,
            "running": report.running,
            "host": report.host,
            "max_attempts": report.max_attempts,
            "status": report.status,
            "failure_class": report.failure_class,
            "reason": (report.reason or "")[:500] or None,
            "fix": (report.fix or "")[:500] or None,
            "moved_to": report.moved_to,
            "next_attempt_at": report.next_attempt_at,
            "lines": "\n".join(report.lines)[:1000] or None,
            "spend": report.spend,
        }
        if report.running:
            fields["state"] = None
        self.ledger.outbox_put(self.name, issue_id, fields, now=self.clock())

    def catch_up(self) -> None:
        """Send what the outbox holds for this board and is due, each entry settled with
        what came of it. Stops at the first refusal that closes the tracker's lane (the
        rest wait for it to open); LaneWaiting or LaneStopped when it is closed already."""
        if self.read_only:
            return
        with self._lock:
            self._gate()
            claimed = self.ledger.outbox_claim(
                self.name, owner=self._owner, lease_s=self._lease_s, now=self.clock()
            )
            for entry in claimed:
                try:
                    ref = self._send(entry.item, dict(entry.payload), entry.ref, entry.sends)
                except _Refusal as refused:
                    retry = self.clock() + min(600.0, self._retry_base_s * 2**entry.tries)
                    self.ledger.outbox_settle(
                        self.name,
                        entry.item,
                        entry.seq,
                        owner=self._owner,
                        error=refused.reason,
                        retry_at=refused.until or retry,
                        now=self.clock(),
                    )
                    if refused.outcome != "item":
                        self._lane_call(refused)
                        return
                    continue
                self.ledger.outbox_settle(
                    self.name, entry.item, entry.seq, owner=self._owner, ref=ref, now=self.clock()
                )
                moved = self._moved.get(entry.item)
                if moved is not None and moved == entry.payload.get("state"):
                    del self._moved[entry.item]

    # -- the lane ---------------------------------------------------------------------------

    def _gate(self) -> None:
        """Raise the lane's refusal when the tracker's lane does not admit a call now."""
        from execkit._lanes import LaneState

        try:
            shown = self.ledger.get_lane(self.lane, now=self.clock())
        except NotFound:
            return
        if shown.admits:
            if shown.state is not LaneState.OPEN:
                self._suspect = True
            return
        self._suspect = True
        why = shown.reason or str(shown.state)
        if shown.state is LaneState.STOPPED:
            raise LaneStopped(
                f"{self._what} waits on lane {self.lane}, stopped: {why}",
                lane=self.lane,
                fix=shown.reason,
            )
        raise LaneWaiting(
            f"{self._what} waits on lane {self.lane} until "
            f"{_when(shown.opens_at) or 'its probe answers'} ({why}); agents running go on",
            lane=self.lane,
            opens_at=shown.opens_at,
        )

    def _lane_call(self, refused: _Refusal) -> None:
        self._suspect = True
        if self.read_only:
            return
        self.ledger.record_lane_call(
            self.lane, refused.outcome, until=refused.until, reason=refused.reason,
            now=self.clock(),
        )  # fmt: skip

    def _answered(self) -> None:
        """The tracker answered: a lane that was not open hears it once."""
        if self._suspect and not self.read_only:
            self._suspect = False
            self.ledger.record_lane_call(self.lane, "success", now=self.clock())

    def _refreshing(self) -> None:
        """`_refresh` behind the lane's gate, a refusal told to the lane and raised."""
        self._gate()
        try:
            self._refresh()
        except _Refusal as refused:
            self._refused(refused)

    def _refused(self, refused: _Refusal) -> NoReturn:
        """A read the tracker refused: told to the lane (unless it was the issue's alone),
        then raised as the lane's refusal or an ExecKitError naming it."""
        if refused.outcome == "item":
            raise ExecKitError(f"{self._what}: {refused.reason}") from None
        self._lane_call(refused)
        self._gate()
        raise ExecKitError(f"{self._what}: {refused.reason}") from None
