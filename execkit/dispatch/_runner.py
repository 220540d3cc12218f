"""Runners: what one dispatch of a board issue does (`Runner`), what it is handed (`Slot`),
and how it ended (`RunOutcome`)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import attrs

from execkit._adapter import Adapter, AgentRequest
from execkit._agent import run_agent
from execkit._classify import FailureClass, Reason
from execkit._errors import ExecKitError, InvalidInput, UnknownAdapter
from execkit._exec import Cancellation, ProcessStarter
from execkit._proof import AgentFailed, AgentProof, RunStatus
from execkit._redact import redact
from execkit._registry import adapter_names, get_adapter
from execkit._validate import integer_arg
from execkit.dispatch._board import BoardIssue

__all__ = ["AdapterRunner", "RunOutcome", "Runner", "Slot", "last_line"]

_MAX_DETAIL = 160


def _to_status(value: object) -> RunStatus:
    if isinstance(value, str) and value in RunStatus.__members__.values():
        return RunStatus(value)
    raise InvalidInput(f"status must be 'succeeded' or 'failed', got {value!r}", field="status")


def _redact_text(value: str | None) -> str | None:
    return redact(value) if isinstance(value, str) else value


@attrs.frozen
class RunOutcome:
    """How one dispatch of an issue ended.

    `failure_class` is None for a success; a failure with no class is a charged work
    failure. `precondition` names what is missing (environment: binary and install hint).
    `detail` is a short line of the failure text, kept for the operator. `not_before` is the
    vendor's reset time, when it named one: the next dispatch is not before it.
    `lane_cause` is what the vendor's structure said of the run's vendor lane (the ledger
    parks or stops the lane on it); never set from free text.
    """

    status: RunStatus = attrs.field(converter=_to_status)
    failure_class: FailureClass | None = None
    # Redacted here: a custom runner's text reaches events and logs, not only the ledger.
    reason: str | None = attrs.field(default=None, converter=_redact_text)
    precondition: str | None = attrs.field(default=None, converter=_redact_text)
    detail: str | None = attrs.field(default=None, converter=_redact_text)
    not_before: float | None = None
    # What the vendor's structure said of the run's lane (issue #28): `reset` (with
    # `not_before`), `credentials`, `billing`, `binary_missing`; None for nothing.
    lane_cause: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.status is RunStatus.SUCCEEDED and self.failure_class is not None:
            raise InvalidInput(
                "failure_class must be None for a succeeded outcome", field="failure_class"
            )

    @property
    def charged(self) -> bool:
        """True unless the failure is positively classed as uncharged (ADR 0046)."""
        return self.failure_class is None or self.failure_class.charged

    def ledger_reason(self) -> str | None:
        """The reason stored on the run: the precondition for environment (what to fix),
        else the class reason with the detail line."""
        if self.status is RunStatus.SUCCEEDED:
            return None
        if self.precondition:
            return self.precondition
        parts = [p for p in (self.reason, self.detail) if p]
        return ": ".join(parts) or None


@attrs.frozen
class Slot:
    """What one dispatch of an issue is handed besides the issue: its place in the ledger
    and the dispatcher's two lines to it.

    `adapter` is the adapter the issue runs on (its own, else the dispatcher's default).
    `heartbeat()` renews the run's lease; call it at least every `heartbeat_s` seconds
    while the work goes on (`run_agent(heartbeat=..., heartbeat_s=...)` does, through
    `spawn`). It raises when the run is no longer this dispatcher's (its lease lapsed and
    another host abandoned it): stop then, nothing you produce can be recorded. `cancel` is
    set when the dispatcher stops and its drain time is up: pass it to `run_agent` or
    `spawn` (`cancel=`), which end the agent's whole tree and raise `SpawnCancelled`.
    """

    run_id: str
    attempt: int
    adapter: str
    heartbeat: Callable[[], object]
    heartbeat_s: float
    cancel: Cancellation


class Runner(Protocol):
    """Runs one dispatch of an issue, in a slot of its own (a thread of the dispatcher,
    beside the other slots). Failures are outcomes; raising is a dispatcher bug path (the
    attempt is then recorded as a charged work failure), except `SpawnCancelled` after
    `slot.cancel`, which records the run as stopped by its dispatcher (uncharged)."""

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome: ...


def last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    return line if len(line) <= _MAX_DETAIL else line[: _MAX_DETAIL - 1] + "…"


class AdapterRunner:
    """A `Runner` over `run_agent`, each issue on the adapter its slot names.

    The adapter is looked up by name: `adapter` (when given) answers to its own name, any
    other name goes to `find` (the registry, `get_adapter`, by default). A name nobody
    knows, or a vendor's own CLI run through the `generic` adapter (which cannot read its
    structured output), stops that issue alone on `environment`, the fix named, with
    nothing spawned.

    The issue's prompt is the request's prompt, its `model` the request's model and its
    `argv` the request's `extra_args` (for the `generic` adapter: the program and its
    flags). `agent_attempts` defaults to 1: the dispatcher owns retries across dispatches,
    so the in-agent loop must not also re-spawn (and sleep) inside one dispatch. `start`
    is how each agent process is started (`spawn`'s seam; a test passes
    `fake_vendor.start`). An upstream failure whose vendor stated a reset sets
    `RunOutcome.not_before` to `clock() + retry_after_s` (`clock`: epoch seconds,
    `time.time` by default), so the next dispatch is no earlier.
    """

    def __init__(
        self,
        adapter: Adapter | None = None,
        *,
        find: Callable[[str], Adapter] = get_adapter,
        known: Callable[[], list[str]] = adapter_names,
        agent_attempts: int = 1,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        start: ProcessStarter = subprocess.Popen,
        clock: Callable[[], float] = time.time,
    ) -> None:
        integer_arg("agent_attempts", agent_attempts, 1)
        self.adapter = adapter
        self._find = find
        self._known = known
        self._binaries: dict[str, str] | None = None
        # Adapters are values (their parse and argv hold no state): one instance a name.
        self._adapters: dict[str, Adapter] = {}
        self._agent_attempts = agent_attempts
        self._timeout_s = timeout_s
        self._cwd = cwd
        self._env = dict(env) if env is not None else None
        self._sleep = sleep
        self._start = start
        self._clock = clock

    def request_for(self, issue: BoardIssue) -> AgentRequest:
        return AgentRequest(
            prompt=issue.prompt,
            model=issue.model,
            cwd=self._cwd,
            timeout_s=self._timeout_s,
            extra_args=issue.argv,
            env=self._env,
        )

    def adapter_for(self, issue: BoardIssue, name: str) -> Adapter | RunOutcome:
        """The adapter named `name` for `issue`, or the outcome that stops the issue."""
        if self.adapter is not None and self.adapter.name == name:
            return self.adapter
        found = self._adapters.get(name)
        if found is not None:
            return found
        try:
            found = self._adapters[name] = self._find(name)
            return found
        except UnknownAdapter:
            known = ", ".join(self._known())
            return _misconfigured(
                issue,
                "unknown adapter",
                f"issues[{issue.id}].adapter: no adapter is named {name!r}; the known "
                f"adapters are {known}",
            )

    def _vendor_through_generic(self, issue: BoardIssue, adapter: Adapter) -> RunOutcome | None:
        """The generic adapter given a vendor's own CLI as argv[0]: refused, naming the
        adapter that reads that CLI's output (the generic one cannot)."""
        if adapter.name != "generic" or not issue.argv:
            return None
        program = os.path.basename(issue.argv[0])
        name = self._vendor_binaries().get(program)
        if name is not None:
            return _misconfigured(
                issue,
                "vendor CLI without its adapter",
                f"issues[{issue.id}].adapter: argv runs the {name} CLI ({program}) through "
                f'the generic adapter, which cannot read its structured output; set "adapter"'
                f': "{name}" on the issue and keep only extra arguments in its argv',
            )
        return None

    def _vendor_binaries(self) -> dict[str, str]:
        """Each vendor adapter's binary name -> the adapter's name, read once (loading
        every adapter costs more than a dispatch)."""
        if self._binaries is None:
            binaries: dict[str, str] = {}
            for name in self._known():
                try:
                    vendor = self._find(name)
                except ExecKitError:
                    continue  # a broken plugin names no binary
                if name != "generic" and vendor.binary:
                    binaries.setdefault(vendor.binary, name)
            self._binaries = binaries
        return self._binaries

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        found = self.adapter_for(issue, slot.adapter)
        if isinstance(found, RunOutcome):
            return found
        refused = self._vendor_through_generic(issue, found)
        if refused is not None:
            return refused
        request = self.request_for(issue)
        proof: AgentProof
        try:
            proof = run_agent(
                found,
                request,
                max_attempts=self._agent_attempts,
                sleep=self._sleep,
                start=self._start,
                heartbeat=slot.heartbeat,
                heartbeat_s=slot.heartbeat_s,
                cancel=slot.cancel,
            )
        except AgentFailed as failed:
            proof = failed.proof
        if proof.productive:
            return RunOutcome(RunStatus.SUCCEEDED)
        failure_class = proof.effective_class
        wait = proof.retry_after_s
        not_before = None
        if failure_class is FailureClass.UPSTREAM and wait is not None:
            not_before = self._clock() + wait
        return RunOutcome(
            RunStatus.FAILED,
            failure_class=failure_class,
            reason=proof.reason,
            precondition=proof.precondition,
            detail=last_line(proof.error),
            not_before=not_before,
            lane_cause=lane_cause(found, proof, not_before),
        )


# Environment reasons that belong to the vendor lane (the account or the host), not the task.
_LANE_STOPS = {
    Reason.CREDENTIALS: "credentials",
    "http 401": "credentials",
    "http 403": "credentials",
    Reason.BILLING: "billing",
    "http 402": "billing",
    Reason.MISSING_BINARY: "binary_missing",
}


def lane_cause(adapter: Adapter, proof: AgentProof, not_before: float | None) -> str | None:
    """What a failed agent's proof says of its vendor lane, from structure only: a reset
    from the vendor's own field parks it; refused credentials, billing, or the vendor's
    CLI missing on this host stop it. The generic adapter runs any program, so a missing
    one is that issue's alone."""
    klass = proof.effective_class
    if klass is FailureClass.UPSTREAM:
        return "reset" if not_before is not None and proof.reset_from_structure else None
    if klass is not FailureClass.ENVIRONMENT or proof.reason is None:
        return None
    cause = _LANE_STOPS.get(proof.reason)
    if cause == "binary_missing" and adapter.name == "generic":
        return None
    return cause


def _misconfigured(issue: BoardIssue, reason: str, fix: str) -> RunOutcome:
    """An issue whose configuration names no usable adapter: it never ran (environment,
    uncharged), and the fix names the field to change."""
    return RunOutcome(
        RunStatus.FAILED, failure_class=FailureClass.ENVIRONMENT, reason=reason, precondition=fix
    )
