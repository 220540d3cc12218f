"""Agent and run proofs, and the rollup that derives `run.class` from the agents (ADR 0046).

The class is born on a spawn, recorded on the agent's proof before any failure is raised,
and promoted to the run by `rollup_class`: derived from the agents, never stored by hand,
so a caller that swallows an agent's failure cannot erase its class.

Loading is lenient on purpose: proofs written before classes existed (no `"class"` key)
load with no class and behave as charged work failures, exactly as they did before.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from attrs.validators import ge, instance_of, optional

from execkit._classify import FailureClass
from execkit._errors import ExecKitError, InvalidInput
from execkit._json import json_key, to_json
from execkit._redact import redact
from execkit._usage import Usage, load_usage
from execkit._validate import checked, finite, integer, is_number

__all__ = [
    "SCHEMA_VERSION",
    "AgentFailed",
    "AgentProof",
    "AgentStatus",
    "EnvironmentFailure",
    "RunProof",
    "RunStatus",
    "UpstreamFailure",
    "WorkFailure",
    "agent_failure",
    "load_agent_proof",
    "load_run_proof",
    "rollup_class",
]

# Version 1 introduced `"class"`; a proof with no `schema_version` is version 0.
SCHEMA_VERSION = 1


class AgentStatus(enum.StrEnum):
    """How one agent ended. `cached` means a prior result was reused: productive work."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CACHED = "cached"


class RunStatus(enum.StrEnum):
    """How one run of a script ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"


def _redacted(value: str | None) -> str | None:
    return None if value is None else redact(value)


# Non-finite values are refused too: JSON has no NaN or Infinity to store them as.
_SECONDS = checked("a finite number >= 0", finite, ge(0))


def _agent_class_matches_status(
    inst: AgentProof, _attr: attrs.Attribute[Any], value: FailureClass | None
) -> None:
    if value is not None and inst.status is not AgentStatus.FAILED:
        raise InvalidInput(
            f"failure_class must be None for a {inst.status.value} agent, got {value.value!r}",
            field="failure_class",
        )


@attrs.frozen
class AgentProof:
    """What one agent did: its status, how many spawns it took, and why it failed.

    `failure_class` is None for a succeeded or cached agent (a success is never classed);
    a failed agent with no class is a charged work failure (`effective_class`).
    `error` and `output` are redacted on construction, so no secret reaches a stored proof
    (a proof loaded from an older writer included).
    `precondition` names what is missing and how to fix it (environment only).
    `retry_after_s` is the wait until a reset the vendor stated (upstream only): the
    scheduler retries no earlier. `evidence` is the line the class was read from (the
    adapter's `MappedResult.evidence`; masked like `error`), None when no line decided.
    `usage` is what every spawn of the agent cost, summed (`Usage`: tokens by kind, USD and
    where it came from), failed, timed-out and killed spawns included; None when no spawn
    reported any. `cost_usd` is its USD when known.
    """

    id: str
    harness: str
    status: AgentStatus
    label: str | None = None
    model: str | None = None
    attempts: int = attrs.field(default=1, validator=checked("an integer >= 0", integer, ge(0)))
    duration_s: float = attrs.field(default=0.0, validator=_SECONDS)
    cost_usd: float | None = attrs.field(default=None, validator=optional(_SECONDS))
    session_id: str | None = None
    error: str | None = attrs.field(default=None, converter=_redacted)
    failure_class: FailureClass | None = attrs.field(
        default=None,
        validator=[
            checked("a FailureClass or None", optional(instance_of(FailureClass))),
            _agent_class_matches_status,
        ],
        metadata=json_key("class"),
    )
    reason: str | None = None
    precondition: str | None = None
    output: str | None = attrs.field(default=None, converter=_redacted)
    retry_after_s: float | None = attrs.field(default=None, validator=optional(_SECONDS))
    # The reset came from the vendor's own structured field, not its message (issue #28:
    # only such a reset parks a vendor lane).
    reset_from_structure: bool = False
    evidence: str | None = attrs.field(default=None, converter=_redacted)
    usage: Usage | None = attrs.field(
        default=None, validator=checked("a Usage or None", optional(instance_of(Usage)))
    )

    @property
    def productive(self) -> bool:
        """A succeeded or cached agent did real work: its run is charged."""
        return self.status is not AgentStatus.FAILED

    @property
    def effective_class(self) -> FailureClass | None:
        """The class budgets act on: None when productive, WORK for an unclassed failure."""
        if self.productive:
            return None
        return self.failure_class or FailureClass.WORK

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe mapping; the class is under `"class"` (None when not classed)."""
        return {"schema_version": SCHEMA_VERSION, **to_json(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentProof:
        """Load a proof of any schema version; see `load_agent_proof`."""
        return load_agent_proof(data)


def rollup_class(status: RunStatus, agents: Iterable[AgentProof]) -> FailureClass | None:
    """Derive `run.class` from the agents (ADR 0046 "Threading the class").

    A succeeded run is never classed. Any productive agent (succeeded or cached) or any
    work failure (an unclassed failure counts as work) makes the run work: the attempt
    told us something about the work. Otherwise environment beats upstream, because
    nothing can succeed until the environment is fixed. A failed run with no agents is
    work: nothing positively identified it as uncharged.
    """
    if status is RunStatus.SUCCEEDED:
        return None
    seen: set[FailureClass] = set()
    for agent in agents:
        effective = agent.effective_class
        if effective is None or effective is FailureClass.WORK:
            return FailureClass.WORK
        seen.add(effective)
    for uncharged in (FailureClass.ENVIRONMENT, FailureClass.UPSTREAM):
        if uncharged in seen:
            return uncharged
    return FailureClass.WORK


def _agents_tuple(agents: Iterable[AgentProof]) -> tuple[AgentProof, ...]:
    return tuple(agents)


class AgentFailed(ExecKitError):
    """An agent failed; `proof` (already recorded) says why, with its class.

    It lives beside `AgentProof` rather than with the other errors in `_errors` because it
    carries one: the error rooms stay free of the proof's imports. What `run_agent` raises
    is always one of its three subclasses, one per class, so a retry library that selects
    by type (tenacity's `retry_if_exception_type`, stamina's `on=`) tells them apart::

        AgentFailed                 `.proof`, `.failure_class`, `.charged`
        ├── WorkFailure             charged: the agent ran and its result failed
        ├── EnvironmentFailure      uncharged, stop: `.precondition` names the fix
        └── UpstreamFailure         uncharged, bounded retry: `.retry_after_s`, `.reset_at`

    `agent_failure(proof)` builds the one that fits a proof. `AgentFailed(proof)` itself
    still constructs (and is caught by `except AgentFailed` as before).
    """

    code = "agent_failed"

    def __init__(self, proof: AgentProof) -> None:
        detail = proof.precondition or proof.error or "no output"
        cls = proof.failure_class.value if proof.failure_class else "work"
        super().__init__(f"{proof.harness} agent failed ({cls}: {proof.reason}): {detail}")
        self.proof = proof

    @property
    def failure_class(self) -> FailureClass:
        """The class budgets act on (an unclassed failure is work)."""
        return self.proof.effective_class or FailureClass.WORK

    @property
    def charged(self) -> bool:
        """True unless the failure is positively classed as uncharged (ADR 0046)."""
        return self.failure_class.charged

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from the proof alone (a process pool sends errors back pickled).
        return (type(self), (self.proof,), self.__dict__)


class WorkFailure(AgentFailed):
    """The agent ran and its result failed (or nothing identified it as uncharged):
    charged against the work budget."""


class EnvironmentFailure(AgentFailed):
    """The agent could not run here (a missing binary, a bad key): uncharged, and nothing
    will succeed until a human fixes what `precondition` names. Do not retry it."""

    @property
    def precondition(self) -> str | None:
        """What is missing and how to fix it."""
        return self.proof.precondition


class UpstreamFailure(AgentFailed):
    """The vendor refused or failed the request (a 529, a usage limit): uncharged, worth a
    bounded retry, no earlier than `reset_at` when the vendor stated a reset.

    `retry_after_s` is the vendor's stated wait (None when it stated none); `reset_at` is
    that wait as POSIX seconds, counted from when the agent settled (`agent_failure`'s
    `now`), or None.
    """

    def __init__(self, proof: AgentProof, reset_at: float | None = None) -> None:
        super().__init__(proof)
        self.reset_at = reset_at

    @property
    def retry_after_s(self) -> float | None:
        return self.proof.retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.proof, self.reset_at), self.__dict__)


def agent_failure(proof: AgentProof, *, now: float | None = None) -> AgentFailed:
    """The error for a failed agent's proof: the subclass of its class (an unclassed
    failure is a `WorkFailure`). For an upstream proof with a stated wait, `reset_at` is
    `now + retry_after_s` (`now`: POSIX seconds; None leaves `reset_at` None). InvalidInput
    for a productive proof: a success is never an error."""
    effective = proof.effective_class
    if effective is None:
        raise InvalidInput(
            f"a {proof.status.value} agent did not fail; it has no failure to raise",
            field="proof",
        )
    if effective is FailureClass.ENVIRONMENT:
        return EnvironmentFailure(proof)
    if effective is FailureClass.UPSTREAM:
        wait = proof.retry_after_s
        return UpstreamFailure(proof, None if now is None or wait is None else now + wait)
    return WorkFailure(proof)


@attrs.frozen
class RunProof:
    """One run of a script: its agents and, derived from them, its class and its usage."""

    id: str
    status: RunStatus
    agents: tuple[AgentProof, ...] = attrs.field(default=(), converter=_agents_tuple)
    error: str | None = attrs.field(default=None, converter=_redacted)

    @property
    def run_class(self) -> FailureClass | None:
        """Derived on every read from the agents; see `rollup_class`."""
        return rollup_class(self.status, self.agents)

    @property
    def reason(self) -> str | None:
        """The reason of the agent whose class the run took, if one did."""
        run_class = self.run_class
        if run_class is None or run_class is FailureClass.WORK:
            return None
        for agent in self.agents:
            if agent.failure_class is run_class:
                return agent.reason
        return None  # pragma: no cover - rollup only returns a class some agent carries

    @property
    def precondition(self) -> str | None:
        """The first environment precondition among the agents (what to fix)."""
        for agent in self.agents:
            if agent.failure_class is FailureClass.ENVIRONMENT and agent.precondition:
                return agent.precondition
        return None

    @property
    def usage(self) -> Usage | None:
        """What the run's agents cost, summed (derived like the class; never stored by
        hand); None when no agent reported any usage."""
        reported = [agent.usage for agent in self.agents if agent.usage is not None]
        if not reported:
            return None
        total = reported[0]
        for usage in reported[1:]:
            total = total + usage
        return total

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe mapping with the derived `"class"` (written for readers, never read)."""
        run_class = self.run_class
        return {
            "schema_version": SCHEMA_VERSION,
            **to_json(self),
            "class": run_class.value if run_class else None,
            "reason": self.reason,
            "precondition": self.precondition,
            "usage": None if (usage := self.usage) is None else usage.to_dict(),
            "agents": [agent.to_dict() for agent in self.agents],
        }


def _enum(kind: type[enum.Enum], field: str, value: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise InvalidInput(
            f"{field} must be one of {allowed}; got {value!r}", field=field
        ) from None


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{key} must be a string or null; got {type(value).__name__}", field=key)
    return value


def _opt_number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if not is_number(value):
        raise InvalidInput(f"{key} must be a number or null; got {value!r}", field=key)
    return float(value)


def _load_class(value: Any) -> FailureClass | None:
    if value is None:
        return None
    try:
        return FailureClass(value)
    except ValueError:
        # A class this reader does not know (a newer writer) is not positively
        # identified as uncharged: it charges, like no class at all.
        return FailureClass.WORK


def load_agent_proof(data: Mapping[str, Any]) -> AgentProof:
    """Build an AgentProof from `to_dict` output of any schema version.

    Missing `"class"` (schema 0) loads as no class, which behaves as a charged work
    failure. An unknown class string loads as work. A class on a succeeded or cached
    agent is dropped: a success is never classed. No `"usage"` (an older writer) loads as
    None: the cost is unknown, never zero. Unknown keys are ignored.
    Raises InvalidInput naming the field when a required field is missing or malformed.
    """
    if not isinstance(data, Mapping):
        raise InvalidInput(f"an agent proof must be an object; got {type(data).__name__}")
    for key in ("id", "harness", "status"):
        if not isinstance(data.get(key), str):
            raise InvalidInput(
                f"agent proof field {key!r} is required and must be a string", field=key
            )
    status = _enum(AgentStatus, "status", data["status"])
    failure_class = _load_class(data.get("class", data.get("failure_class")))
    if status is not AgentStatus.FAILED:
        failure_class = None
    return AgentProof(
        id=data["id"],
        harness=data["harness"],
        status=status,
        label=_opt_str(data, "label"),
        model=_opt_str(data, "model"),
        attempts=data.get("attempts", 1),
        duration_s=_opt_number(data, "duration_s") or 0.0,
        cost_usd=_opt_number(data, "cost_usd"),
        session_id=_opt_str(data, "session_id"),
        error=_opt_str(data, "error"),
        failure_class=failure_class,
        reason=_opt_str(data, "reason"),
        precondition=_opt_str(data, "precondition"),
        output=_opt_str(data, "output"),
        retry_after_s=_opt_number(data, "retry_after_s") if failure_class else None,
        reset_from_structure=bool(data.get("reset_from_structure")) if failure_class else False,
        evidence=_opt_str(data, "evidence") if failure_class else None,
        usage=load_usage(data.get("usage")),
    )


def load_run_proof(data: Mapping[str, Any]) -> RunProof:
    """Build a RunProof from `to_dict` output of any schema version.

    A stored `"class"` is ignored: `run_class` is always re-derived from the agents,
    so an old or hand-edited value can never override the rollup.
    Raises InvalidInput naming the field when the shape is wrong.
    """
    if not isinstance(data, Mapping):
        raise InvalidInput(f"a run proof must be an object; got {type(data).__name__}")
    if not isinstance(data.get("id"), str):
        raise InvalidInput("run proof field 'id' is required and must be a string", field="id")
    status = _enum(RunStatus, "status", data.get("status"))
    agents = data.get("agents", [])
    if not isinstance(agents, list):
        raise InvalidInput(f"agents must be a list; got {type(agents).__name__}", field="agents")
    return RunProof(
        id=data["id"],
        status=status,
        agents=tuple(load_agent_proof(agent) for agent in agents),
        error=_opt_str(data, "error"),
    )
