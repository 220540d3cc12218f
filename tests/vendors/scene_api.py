"""The scene vendor: the loopback `FakeAPI` driven by a timeline instead of a list of steps.

A scene (tests/vendors/scenes.py) is a vendor that goes through phases by itself: a usage
limit until its reset, some seconds of overload, refused credentials until an operator
fixes them, then ok. `SceneVendor` answers every model call by the phase it arrives in
(through fake_api's `SceneHook`, with fake_api's own vendor replies), and logs each
request with its time and phase:

    timeline = Timeline((Phase("limit", "usage_limit", until_s=4.0), Phase("ok", "success")))
    with SceneVendor("anthropic", timeline) as vendor:
        ...                     # point a CLI (or a replay stand-in) at vendor.url
        vendor.calls()          # every model call: t, phase, status, the issue it named

The scene starts at its first model call (a slow start of the dispatcher does not eat a
phase), or at a time given in advance (a call before it is held until then). Times are
epoch seconds (`time.time`, the clock a dispatcher's ledger writes) and, in the log, `t`
seconds since the scene started. A phase ends at its `until_s` (seconds after the
start), or, for an `operator` phase, when `fix()` is called (an operator renewed the
credentials); the last phase lasts for ever.

Resets. A limit phase lifts at its end, `lifts_at`, which is a whole second (vendors state
resets in whole seconds or coarser). Each vendor states it in its own structure, never
earlier than it lifts: Anthropic's `anthropic-ratelimit-unified-reset` headers (epoch
seconds), OpenAI's `resets_at` / `resets_in_seconds` (codex prints that as a local clock
time rounded down to the minute: its rounding, not the vendor's), Google's per-minute
quota with `RetryInfo.retryDelay` (whole seconds, rounded up) and "Please retry in Ns".

The replay stand-ins (scene_standin.py) ask the vendor which phase they are in with
`GET /scene/call?issue=ID`: that request is their model call (logged like one) and the
answer is the phase, its step and the reset it states (JSON). `GET /scene/phase` only
looks (not a call, not logged): a stand-in picks the recorded call it replays by it.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fake_api import FakeAPI, Reply, Scenario, Vendor, error_reply

__all__ = ["ISSUE_MARK", "Phase", "SceneVendor", "Timeline", "issue_of"]

# Each board issue's prompt names it ("... (scene issue S-7)"), so a model call is tied to
# the issue (and through the ledger, the run) it came from, in recordings and replays.
ISSUE_MARK = "scene issue "
_ISSUE = re.compile(rb"scene issue (S-\d{1,3})\b")
# The longest a stand-in is held waiting for results it ends after (`/scene/done`).
DONE_WAIT_S = 5.0
# The trouble steps a phase may have (fake_api error kinds) besides `success`.
TROUBLE_STEPS = ("usage_limit", "overloaded_529", "auth_401", "rate_limit_429")


def issue_of(data: bytes) -> str | None:
    """The board issue a request body (or argv) names, if any."""
    found = _ISSUE.search(data)
    return found.group(1).decode() if found else None


@dataclass(frozen=True)
class Phase:
    """One stretch of the vendor's life: `name` (what the tables say), `step` (a fake_api
    step: `success` or an error kind), `until_s` (its end, seconds after the scene start;
    None: the last phase, or an `operator` phase that ends when the operator fixes it)."""

    name: str
    step: str
    until_s: float | None = None
    operator: bool = False

    def __post_init__(self) -> None:
        if self.step != "success" and self.step not in TROUBLE_STEPS:
            raise ValueError(f"phase {self.name}: unknown step {self.step!r}")
        if self.operator and self.until_s is not None:
            raise ValueError(f"phase {self.name}: an operator phase has no until_s")


@dataclass(frozen=True)
class Timeline:
    """The phases in order; each begins where the one before ended."""

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a timeline needs a phase")
        ends = [p.until_s for p in self.phases[:-1] if p.until_s is not None]
        if ends != sorted(ends):
            raise ValueError("phase ends must grow")
        for phase in self.phases[:-1]:
            if phase.until_s is None and not phase.operator:
                raise ValueError(f"phase {phase.name} never ends but is not the last")

    def to_dict(self) -> list[dict[str, Any]]:
        return [
            {"name": p.name, "step": p.step, "until_s": p.until_s, "operator": p.operator}
            for p in self.phases
        ]

    @classmethod
    def from_dict(cls, value: list[dict[str, Any]]) -> Timeline:
        return cls(
            tuple(
                Phase(
                    str(p["name"]),
                    str(p["step"]),
                    None if p.get("until_s") is None else float(p["until_s"]),
                    bool(p.get("operator")),
                )
                for p in value
            )
        )


@dataclass
class _Clock:
    """When the scene started (None: at its first model call) and when an operator
    ended each operator phase."""

    start: float | None
    fixed: dict[int, float] = field(default_factory=dict)


class SceneVendor:
    """A `FakeAPI` for `vendor` whose answers follow `timeline` (a context manager). The
    scene starts at `start`, or with None at its first model call; a call that comes
    before a `start` set in advance is held until then. `clock` and `sleep` are the
    seams a test replaces. Thread-safe: the CLIs call it from many connections at once."""

    def __init__(
        self,
        vendor: Vendor,
        timeline: Timeline,
        *,
        start: float | None = None,
        lifetime_s: float = 1800.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.vendor = vendor
        self.timeline = timeline
        self._time = clock
        self._sleep = sleep
        # Whether the latest runs of some issues have their results in the ledger (set by
        # a replay, which reads its dispatcher's ledger).
        self.results_recorded: Callable[[list[str]], bool] | None = None
        self._clock = _Clock(start)
        self._lock = threading.Lock()
        scenario = Scenario("scene", "a vendor that goes through phases by itself", ("success",))
        self.api = FakeAPI(
            vendor, scenario, lifetime_s=lifetime_s, max_requests=100_000, scene=self
        )

    # -- the timeline

    @property
    def start(self) -> float | None:
        """When the scene started (None: no model call yet, and no start was given)."""
        return self._clock.start

    def restart(self, start: float | None) -> None:
        """Start the scene's clock again (before any call): at `start`, or, with None, at
        its first model call (so a slow start of the dispatcher does not eat a phase)."""
        with self._lock:
            self._clock = _Clock(start)

    def _started(self, now: float) -> float:
        with self._lock:
            if self._clock.start is None:
                self._clock.start = now
            return self._clock.start

    def _arrive(self) -> float:
        """A model call arrives: the scene starts now if it has not; a call before a start
        set in advance is held until it (as a slow first answer), so a dispatcher that
        starts early meets the timeline from its beginning. Returns the call's time."""
        now = self._time()
        start = self._clock.start
        if start is not None and now < start:
            self._sleep(start - now)
            now = self._time()
        self._started(now)
        return now

    def phase_ends(self) -> list[float | None]:
        """Each phase's end (epoch seconds; None: not ended, or the last one, or the
        scene has not started)."""
        ends: list[float | None] = []
        start = self._clock.start
        for index, phase in enumerate(self.timeline.phases):
            if phase.operator:
                ends.append(self._clock.fixed.get(index))
            elif phase.until_s is not None and start is not None:
                end = start + phase.until_s
                # A limit lifts on a whole second, the one it states.
                ends.append(math.ceil(end) if phase.step == "usage_limit" else end)
            else:
                ends.append(None)
        return ends

    def phase_at(self, at: float) -> tuple[int, Phase]:
        """The phase the vendor is in at `at` (epoch seconds)."""
        ends = self.phase_ends()
        for index, phase in enumerate(self.timeline.phases):
            end = ends[index]
            if end is None or at < end:  # not ended (or not started): the vendor is in it
                return index, phase
        return len(ends) - 1, self.timeline.phases[-1]

    def lifts_at(self, index: int) -> float | None:
        """When phase `index` ends (for a limit: its reset), None when not known yet."""
        return self.phase_ends()[index]

    def recovered_at(self) -> float | None:
        """When the last trouble phase ended (the vendor's recovery), if it has."""
        ends = self.phase_ends()
        last = None
        for index, phase in enumerate(self.timeline.phases):
            if phase.step != "success":
                last = ends[index]
                if last is None:
                    return None
        return last

    def fix(self, at: float | None = None) -> None:
        """The operator renewed the credentials: the current operator phase ends now."""
        now = self._time() if at is None else at
        with self._lock:
            index, phase = self.phase_at(now)
            if phase.operator:
                self._clock.fixed[index] = now

    # -- the hook fake_api calls

    def _fields(self, now: float, index: int, phase: Phase) -> dict[str, object]:
        return {"phase": phase.name, "t": round(now - self._started(now), 3), "at": now}

    def step(self, body: bytes, helper: bool) -> tuple[str, dict[str, object]]:
        now = self._arrive()
        index, phase = self.phase_at(now)
        fields = self._fields(now, index, phase)
        issue = issue_of(body)
        if issue:
            fields["issue"] = issue
        return phase.step, fields

    def stated_reset(self, index: int) -> int | None:
        """The reset a limit phase states: its end, a whole second (never earlier)."""
        lifts = self.lifts_at(index)
        return None if lifts is None else math.ceil(lifts)

    def reply(self, vendor: Vendor, step: str) -> Reply:
        now = self._time()
        index, _ = self.phase_at(now)
        reset = self.stated_reset(index) if step == "usage_limit" else None
        if reset is None:
            return error_reply(vendor, step)
        return limit_reply(vendor, reset, now)

    def _results_recorded(self, issues: list[str]) -> bool:
        """Wait (at most `DONE_WAIT_S`) until `results_recorded(issues)` says the runs of
        `issues` have their results in the ledger; whether they had."""
        check = self.results_recorded
        if check is None or not issues:
            return True
        deadline = self._time() + DONE_WAIT_S
        while not check(issues):
            if self._time() > deadline:
                return False
            self._sleep(0.05)
        return True

    def aux(self, method: str, path: str) -> tuple[Reply, dict[str, object] | None] | None:
        """`/scene/call?issue=ID`: a stand-in's model call (logged); `/scene/phase`: which
        phase the vendor is in, a look that is no call; `/scene/done?wait=ID,ID`: answered
        once those issues' runs have their results in the ledger (`results_recorded`), so
        a stand-in ends no sooner than the recorded CLI did, counted in results the
        dispatcher had recorded meanwhile (neither is logged)."""
        parts = urlsplit(path)
        if parts.path == "/scene/done":
            issues = [i for i in (parse_qs(parts.query).get("wait") or [""])[0].split(",") if i]
            recorded = self._results_recorded(issues)
            return Reply(200, json.dumps({"recorded": recorded}).encode()), None
        if parts.path == "/scene/phase":
            now = self._time()
            _, phase = self.phase_at(now)
            return Reply(200, json.dumps({"phase": phase.name}).encode()), None
        if parts.path != "/scene/call":
            return None
        query = parse_qs(parts.query)
        now = self._arrive()
        index, phase = self.phase_at(now)
        fields = self._fields(now, index, phase)
        fields["step"] = phase.step
        fields["stand_in"] = True
        issue = (query.get("issue") or [""])[0]
        if issue:
            fields["issue"] = issue
        answer = {
            "phase": phase.name,
            "step": phase.step,
            "now": now,
            "reset": self.stated_reset(index) if phase.step == "usage_limit" else None,
        }
        return Reply(200, json.dumps(answer).encode()), fields

    # -- what happened

    def calls(self) -> list[dict[str, Any]]:
        """Every model call the timeline answered, in arrival order: `at` (epoch), `t`
        (since the start), `phase`, `step`, `status`, `issue`; a CLI's helper call (gemini's
        router) has `helper`, a replay stand-in's `stand_in`."""
        return [entry for entry in self.api.requests() if entry["role"] == "model"]

    def requests(self) -> list[dict[str, Any]]:
        """fake_api's own log: every request with its status (model calls with phase)."""
        return self.api.requests()

    @property
    def url(self) -> str:
        return self.api.url

    @property
    def port(self) -> int:
        return self.api.port

    def __enter__(self) -> SceneVendor:
        self.api.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.close()


# --------------------------------------------------------------------------- limit replies


def limit_reply(vendor: Vendor, reset: int, now: float) -> Reply:
    """fake_api's usage-limit reply for `vendor`, stating `reset` (epoch seconds).

    Google: a per-minute quota (the kind gemini-cli retries by itself when the delay is
    at most 300 s) whose `RetryInfo.retryDelay` is the whole seconds to the reset.
    """
    wait = max(0, reset - math.floor(now))
    if vendor == "anthropic":
        base = error_reply(vendor, "usage_limit")
        headers = tuple(
            (name, str(reset) if name.endswith("-reset") else value) for name, value in base.headers
        )
        return Reply(base.status, base.body, base.content_type, headers)
    if vendor == "openai":
        base = error_reply(vendor, "usage_limit")
        document = json.loads(base.body)
        document["error"]["resets_at"] = reset
        document["error"]["resets_in_seconds"] = wait
        body = json.dumps(document, separators=(",", ":")).encode()
        return Reply(base.status, body, base.content_type, base.headers)
    base = error_reply(vendor, "rate_limit_429")
    document = json.loads(base.body)
    error = document["error"]
    error["message"] = re.sub(
        r"Please retry in [0-9.]+s", f"Please retry in {wait}.0s", error["message"]
    )
    for detail in error.get("details", []):
        if detail.get("@type", "").endswith("RetryInfo"):
            detail["retryDelay"] = f"{wait}s"
    body = json.dumps(document, separators=(",", ":")).encode()
    return Reply(base.status, body, base.content_type, base.headers)
