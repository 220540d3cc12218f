"""Runners: what one dispatch of a board issue does (`Runner`), what it is handed (`Slot`),
and how it ended (`RunOutcome`, the same value `run_attempt` records: one path from an
agent's proof to the ledger, `execkit._attempt`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from execkit._adapter import Adapter, AgentRequest, resumes_sessions
from execkit._attempt import (
    AttemptOptions,
    RunOutcome,
    attempt_agent,
    attempt_resuming,
    options_with,
    outcome_of,
)
from execkit._classify import FailureClass
from execkit._errors import ExecKitError, UnknownAdapter
from execkit._exec import Cancellation
from execkit._meter import UsageLimit
from execkit._proof import AgentProof, RunStatus
from execkit._registry import adapter_names, get_adapter
from execkit.dispatch._board import BoardIssue

__all__ = ["AdapterRunner", "RunOutcome", "Runner", "Slot"]


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
    `resume_session` is the vendor session the attempt continues (issue #46: the previous
    attempt ended on an upstream refusal in it), None to start fresh. `usage_limit` holds
    the run to its spend caps while it runs (issue #45; None: no cap applies): pass it to
    `run_agent(usage_limit=...)`, which stops the whole tree within one usage event of
    crossing them.
    """

    run_id: str
    attempt: int
    adapter: str
    heartbeat: Callable[[], object]
    heartbeat_s: float
    cancel: Cancellation
    cwd: str | None = None
    resume_session: str | None = None
    usage_limit: UsageLimit | None = None


class Runner(Protocol):
    """Runs one dispatch of an issue, in a slot of its own (a thread of the dispatcher,
    beside the other slots). Failures are outcomes; raising is a dispatcher bug path (the
    attempt is then recorded as a charged work failure), except `SpawnCancelled` after
    `slot.cancel`, which records the run as stopped by its dispatcher (uncharged)."""

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome: ...


class AdapterRunner:
    """A `Runner` over `run_agent`, each issue on the adapter its slot names.

    The adapter is looked up by name: `adapter` (when given) answers to its own name, any
    other name goes to `find` (the registry, `get_adapter`, by default). A name nobody
    knows, or a vendor's own CLI run through the `generic` adapter (which cannot read its
    structured output), stops that issue alone on `environment`, the fix named, with
    nothing spawned.

    The issue's prompt is the request's prompt, its `model` the request's model and its
    `argv` the request's `extra_args` (for the `generic` adapter: the program and its
    flags). `options` is the agent's part of `AttemptOptions`, the value `run_attempt`
    takes: `agent_attempts` (default 1: the dispatcher owns retries across dispatches, so
    the in-agent loop must not also re-spawn and sleep inside one dispatch), `kill_grace`,
    `stall_timeout_s`, `start` (how each agent process is started, `spawn`'s seam; a test
    passes `fake_vendor.start`), `sleep` and `clock`. An upstream failure whose vendor
    stated a reset sets `RunOutcome.not_before` to `clock() + retry_after_s` (`clock`:
    epoch seconds), so the next dispatch is no earlier. The admission fields (lease, cap,
    actor, lane) are the dispatcher's own. `agent_attempts=`, `sleep=`, `start=` and
    `clock=` as keywords still work for one release, with a `DeprecationWarning`.

    A slot's `resume_session` (issue #46) is passed to an adapter that can resume
    (`resumes_sessions`) as `AgentRequest.resume_session`; when the vendor refuses the
    session (the adapter's `resume_refused` reads its words) the same attempt starts
    fresh, and only that fresh start is the attempt's outcome (`resume_refused=True`).
    `RunOutcome.session_id` is set only for an adapter that can resume: it is kept on the
    run (`Run.session_id`), and the task's next attempt resumes it after an upstream
    refusal, whichever dispatcher admits it (`execkit._attempt.resumable_session`).
    """

    def __init__(
        self,
        adapter: Adapter | None = None,
        options: AttemptOptions | None = None,
        *,
        find: Callable[[str], Adapter] = get_adapter,
        known: Callable[[], list[str]] = adapter_names,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        **deprecated: Any,
    ) -> None:
        self.options = options_with(options, deprecated, "AdapterRunner")
        self.adapter = adapter
        self._find = find
        self._known = known
        self._binaries: dict[str, str] | None = None
        # Adapters are values (their parse and argv hold no state): one instance a name.
        self._adapters: dict[str, Adapter] = {}
        self._timeout_s = timeout_s
        self._cwd = cwd
        self._env = dict(env) if env is not None else None

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
        if slot.cwd is not None:
            request = attrs.evolve(request, cwd=slot.cwd)
        proof, resume, unknown = attempt_resuming(
            found, request, slot.resume_session, lambda asked: self._attempt(found, asked, slot)
        )
        outcome = outcome_of(found, proof, self.options.clock)
        # A session only an adapter that can resume it hands on (the dispatcher resumes it).
        session = outcome.session_id if resumes_sessions(found) else None
        return attrs.evolve(
            outcome, session_id=session, resumed_session=resume, resume_refused=unknown
        )

    def _attempt(self, adapter: Adapter, request: AgentRequest, slot: Slot) -> AgentProof:
        return attempt_agent(
            adapter,
            request,
            self.options,
            heartbeat=slot.heartbeat,
            heartbeat_s=slot.heartbeat_s,
            cancel=slot.cancel,
            usage_limit=slot.usage_limit,
        )


def _misconfigured(issue: BoardIssue, reason: str, fix: str) -> RunOutcome:
    """An issue whose configuration names no usable adapter: it never ran (environment,
    uncharged), and the fix names the field to change."""
    return RunOutcome(
        RunStatus.FAILED, failure_class=FailureClass.ENVIRONMENT, reason=reason, precondition=fix
    )
