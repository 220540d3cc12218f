"""Runners: what one dispatch of a board issue does, and how it ended (`RunOutcome`)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import attrs

from execkit._adapter import Adapter, AgentRequest
from execkit._agent import run_agent
from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit._exec import ProcessStarter
from execkit._proof import AgentFailed, AgentProof, RunStatus
from execkit._redact import redact
from execkit._validate import integer_arg
from execkit.dispatch._board import BoardIssue

__all__ = ["AdapterRunner", "RunOutcome", "Runner", "last_line"]

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
    """

    status: RunStatus = attrs.field(converter=_to_status)
    failure_class: FailureClass | None = None
    # Redacted here: a custom runner's text reaches events and logs, not only the ledger.
    reason: str | None = attrs.field(default=None, converter=_redact_text)
    precondition: str | None = attrs.field(default=None, converter=_redact_text)
    detail: str | None = attrs.field(default=None, converter=_redact_text)
    not_before: float | None = None

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


class Runner(Protocol):
    """Runs one dispatch of an issue. Failures are outcomes; raising is a dispatcher bug
    path (the attempt is then recorded as a charged work failure)."""

    def run(self, issue: BoardIssue, attempt: int) -> RunOutcome: ...


def last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    return line if len(line) <= _MAX_DETAIL else line[: _MAX_DETAIL - 1] + "…"


class AdapterRunner:
    """A `Runner` over `run_agent` and one adapter.

    The issue's prompt is the request's prompt and its `argv` the request's `extra_args`
    (for the `generic` adapter: the program and its flags). `agent_attempts` defaults to 1:
    the dispatcher owns retries across dispatches, so the in-agent loop must not also
    re-spawn (and sleep) inside one dispatch. `start` is how each agent process is started
    (`spawn`'s seam; a test passes `fake_vendor.start`). An upstream failure whose vendor
    stated a reset sets `RunOutcome.not_before` to `clock() + retry_after_s` (`clock`:
    epoch seconds, `time.time` by default), so the next dispatch is no earlier.
    """

    def __init__(
        self,
        adapter: Adapter,
        *,
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
            cwd=self._cwd,
            timeout_s=self._timeout_s,
            extra_args=issue.argv,
            env=self._env,
        )

    def run(self, issue: BoardIssue, attempt: int) -> RunOutcome:
        request = self.request_for(issue)
        proof: AgentProof
        try:
            proof = run_agent(
                self.adapter,
                request,
                max_attempts=self._agent_attempts,
                sleep=self._sleep,
                start=self._start,
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
        )
