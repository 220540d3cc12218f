"""AgentProof / RunProof: JSON shape, back-compat loading, redaction, and the run.class rollup."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit._proof import (
    SCHEMA_VERSION,
    AgentProof,
    AgentStatus,
    RunProof,
    RunStatus,
    load_agent_proof,
    load_run_proof,
    rollup_class,
)
from execkit._usage import Usage, UsdSource

ENV, UP, WORK = FailureClass.ENVIRONMENT, FailureClass.UPSTREAM, FailureClass.WORK


def agent(
    status: AgentStatus = AgentStatus.FAILED, cls: FailureClass | None = None, **kw: Any
) -> AgentProof:
    return AgentProof(
        id=kw.pop("id", "a1"), harness="codex", status=status, failure_class=cls, **kw
    )


def failed_run(*agents: AgentProof) -> RunProof:
    return RunProof(id="r1", status=RunStatus.FAILED, agents=agents)


# --- the rollup rules, one example each -----------------------------------------------------


def test_succeeded_run_is_never_classed() -> None:
    run = RunProof(id="r", status=RunStatus.SUCCEEDED, agents=(agent(cls=ENV),))
    assert run.run_class is None
    assert run.to_dict()["class"] is None


@pytest.mark.parametrize("productive", [AgentStatus.SUCCEEDED, AgentStatus.CACHED])
def test_any_productive_agent_charges_the_run(productive: AgentStatus) -> None:
    run = failed_run(agent(productive), agent(cls=ENV, id="a2"), agent(cls=UP, id="a3"))
    assert run.run_class is WORK


def test_environment_beats_upstream() -> None:
    assert failed_run(agent(cls=UP), agent(cls=ENV, id="a2")).run_class is ENV
    assert failed_run(agent(cls=ENV), agent(cls=UP, id="a2")).run_class is ENV
    assert failed_run(agent(cls=UP)).run_class is UP


def test_a_failed_agent_with_no_class_makes_the_run_work() -> None:
    assert failed_run(agent(cls=ENV), agent(cls=None, id="a2")).run_class is WORK
    assert failed_run(agent(cls=None)).run_class is WORK


def test_a_failed_run_with_no_agents_is_work() -> None:
    assert failed_run().run_class is WORK


def test_run_reason_and_precondition_come_from_the_deciding_agent() -> None:
    run = failed_run(
        agent(cls=UP, reason="http 503"),
        agent(cls=ENV, id="a2", reason="spawn errno ENOENT", precondition="codex CLI not found"),
    )
    data = run.to_dict()
    assert (data["class"], data["reason"], data["precondition"]) == (
        "environment",
        "spawn errno ENOENT",
        "codex CLI not found",
    )


# --- JSON ------------------------------------------------------------------------------


def test_agent_to_dict_uses_class_key_and_schema_version() -> None:
    data = agent(cls=UP, reason="http 529", error="API Error: 529").to_dict()
    assert data["class"] == "upstream"
    assert "failure_class" not in data
    assert data["schema_version"] == SCHEMA_VERSION
    assert load_agent_proof(data) == agent(cls=UP, reason="http 529", error="API Error: 529")
    assert AgentProof.from_dict(data) == load_agent_proof(data)


def test_old_proof_without_class_loads_and_charges() -> None:
    old = {"id": "x", "harness": "codex", "status": "failed", "attempts": 2, "error": "boom"}
    proof = load_agent_proof(old)
    assert proof.failure_class is None
    assert proof.effective_class is WORK
    run = load_run_proof({"id": "r", "status": "failed", "agents": [old]})
    assert run.run_class is WORK


def test_unknown_class_from_a_newer_writer_charges() -> None:
    proof = load_agent_proof({"id": "x", "harness": "h", "status": "failed", "class": "quota"})
    assert proof.failure_class is WORK


def test_a_class_on_a_success_is_dropped_on_load_and_refused_on_construction() -> None:
    loaded = load_agent_proof(
        {"id": "x", "harness": "h", "status": "succeeded", "class": "environment"}
    )
    assert loaded.failure_class is None
    with pytest.raises(InvalidInput, match="failure_class"):
        agent(AgentStatus.SUCCEEDED, ENV)


def test_a_stored_run_class_is_ignored_on_load() -> None:
    data = failed_run(agent(cls=None)).to_dict()
    data["class"] = "environment"  # hand-edited: the rollup is re-derived anyway
    assert load_run_proof(data).run_class is WORK


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"harness": "h", "status": "failed"}, "id"),
        ({"id": "x", "status": "failed"}, "harness"),
        ({"id": "x", "harness": "h", "status": "exploded"}, "status"),
        ({"id": "x", "harness": "h", "status": "failed", "attempts": "2"}, "attempts"),
        ({"id": "x", "harness": "h", "status": "failed", "cost_usd": "1"}, "cost_usd"),
        ({"id": "x", "harness": "h", "status": "failed", "attempts": -1}, "attempts"),
    ],
)
def test_malformed_agent_proof_names_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        load_agent_proof(data)


def test_malformed_run_proof_names_the_field() -> None:
    with pytest.raises(InvalidInput, match="status"):
        load_run_proof({"id": "r", "status": "nope"})
    with pytest.raises(InvalidInput, match="agents"):
        load_run_proof({"id": "r", "status": "failed", "agents": {}})
    with pytest.raises(InvalidInput, match="object"):
        load_run_proof([])  # type: ignore[arg-type]


def test_secrets_never_reach_a_proof_error() -> None:
    key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234"
    proof = agent(cls=WORK, error=f"401 Incorrect API key provided: {key}")
    assert key not in (proof.error or "")
    assert key not in str(proof.to_dict())
    run = RunProof(id="r", status=RunStatus.FAILED, error=f"Authorization: Bearer {key}")
    assert key not in (run.error or "")
    assert key not in str(load_agent_proof({**proof.to_dict(), "error": key}).error)
    reply = agent(AgentStatus.SUCCEEDED, output=f"done; export OPENAI_API_KEY={key}")
    assert key not in (reply.output or "")
    assert key not in str(load_agent_proof({**reply.to_dict(), "output": key}).output)


# --- properties --------------------------------------------------------------------------

classes = st.sampled_from([None, ENV, UP, WORK])


@st.composite
def agents(draw: st.DrawFn) -> AgentProof:
    status = draw(st.sampled_from(list(AgentStatus)))
    cls = draw(classes) if status is AgentStatus.FAILED else None
    return AgentProof(
        id=draw(st.text(min_size=1, max_size=6)),
        harness=draw(st.sampled_from(["codex", "claude", "gemini"])),
        status=status,
        attempts=draw(st.integers(0, 5)),
        duration_s=draw(st.floats(0, 100)),
        cost_usd=draw(st.none() | st.floats(0, 10)),
        failure_class=cls,
        reason=draw(st.none() | st.sampled_from(["http 503", "spawn errno ENOENT", "default"])),
        usage=draw(st.none() | usages()),
    )


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    tokens = draw(st.lists(st.integers(0, 10**9), min_size=4, max_size=4))
    usd = draw(st.none() | st.floats(0, 1000))
    source = UsdSource.UNKNOWN if usd is None else draw(st.sampled_from(list(UsdSource)))
    names = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    counts: dict[str, Any] = dict(zip(names, tokens, strict=True))
    return Usage(**counts, usd=usd, usd_source=source, model="gpt-fake", premium_requests=1)


agent_lists = st.lists(agents(), max_size=6)


@settings(max_examples=100)
@given(agent_lists)
def test_prop_succeeded_runs_are_never_classed(items: list[AgentProof]) -> None:
    assert rollup_class(RunStatus.SUCCEEDED, items) is None


@settings(max_examples=100)
@given(agent_lists)
def test_prop_failed_run_class_is_work_or_an_agents_class(items: list[AgentProof]) -> None:
    run_class = rollup_class(RunStatus.FAILED, items)
    assert run_class is WORK or run_class in {a.failure_class for a in items}


@settings(max_examples=100)
@given(agent_lists, agents())
def test_prop_a_productive_or_work_agent_always_charges(
    items: list[AgentProof], extra: AgentProof
) -> None:
    if extra.effective_class in (None, WORK):
        assert rollup_class(RunStatus.FAILED, [*items, extra]) is WORK
        assert rollup_class(RunStatus.FAILED, [extra, *items]) is WORK


@settings(max_examples=100)
@given(agent_lists, agents())
def test_prop_adding_an_agent_never_uncharges_a_charged_run(
    items: list[AgentProof], extra: AgentProof
) -> None:
    # A failed run with no agents is work only because nothing identified it yet.
    if items and rollup_class(RunStatus.FAILED, items) is WORK:
        assert rollup_class(RunStatus.FAILED, [*items, extra]) is WORK


@settings(max_examples=100)
@given(agent_lists, st.randoms(use_true_random=False))
def test_prop_rollup_ignores_agent_order(items: list[AgentProof], rnd: random.Random) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert rollup_class(RunStatus.FAILED, shuffled) is rollup_class(RunStatus.FAILED, items)


@settings(max_examples=100)
@given(agent_lists)
def test_prop_environment_wins_when_nothing_charged(items: list[AgentProof]) -> None:
    run_class = rollup_class(RunStatus.FAILED, items)
    effective = {a.effective_class for a in items}
    if items and effective <= {ENV, UP}:
        assert run_class is (ENV if ENV in effective else UP)
    else:
        assert run_class is WORK


@settings(max_examples=100)
@given(agent_lists, st.sampled_from(list(RunStatus)))
def test_prop_round_trip_keeps_everything(items: list[AgentProof], status: RunStatus) -> None:
    run = RunProof(id="r", status=status, agents=items, error=None)
    loaded = load_run_proof(run.to_dict())
    assert loaded == run
    assert loaded.run_class is run.run_class


@settings(max_examples=100)
@given(agent_lists)
def test_prop_proofs_without_class_behave_as_work(items: list[AgentProof]) -> None:
    dicts = [
        {k: v for k, v in a.to_dict().items() if k not in ("class", "schema_version")}
        for a in items
    ]
    run = load_run_proof({"id": "r", "status": "failed", "agents": dicts})
    assert run.run_class is WORK


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"duration_s": float("nan")}, "duration_s"),
        ({"duration_s": float("inf")}, "duration_s"),
        ({"cost_usd": float("nan")}, "cost_usd"),
        ({"cost_usd": -0.01}, "cost_usd"),
        ({"attempts": 1.5}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"retry_after_s": float("nan")}, "retry_after_s"),
        ({"retry_after_s": -1.0}, "retry_after_s"),
    ],
)
def test_values_json_cannot_store_are_refused_naming_the_field(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput, match=field):
        agent(cls=WORK, **kwargs)


def test_a_stored_nan_is_refused_on_load() -> None:
    data = {**agent(cls=WORK).to_dict(), "cost_usd": float("nan")}
    with pytest.raises(InvalidInput, match="cost_usd"):
        load_agent_proof(data)


def test_run_precondition_comes_only_from_an_environment_agent() -> None:
    stale = agent(cls=WORK, precondition="codex CLI not found on PATH")
    assert failed_run(stale).precondition is None
    env = agent(cls=ENV, id="a2", precondition="claude CLI not found on PATH")
    assert failed_run(stale, env).precondition == "claude CLI not found on PATH"


def test_the_vendors_reset_travels_on_the_proof_and_round_trips() -> None:
    limited = agent(cls=UP, reason="http 429", retry_after_s=4123.0)
    data = limited.to_dict()
    assert data["retry_after_s"] == 4123.0
    assert load_agent_proof(data) == limited
    # Written before the field existed: no reset, which is what it meant.
    older = {k: v for k, v in data.items() if k != "retry_after_s"}
    assert load_agent_proof(older).retry_after_s is None
    # A success has nothing to wait for, whatever an older writer stored.
    ok = {**agent(AgentStatus.SUCCEEDED).to_dict(), "retry_after_s": 30.0}
    assert load_agent_proof(ok).retry_after_s is None
    assert agent(AgentStatus.SUCCEEDED).to_dict()["retry_after_s"] is None


# --- usage (issue #45): what the agents cost travels on the proof ---------------------------


def test_usage_round_trips_through_json_and_the_run_sums_its_agents() -> None:
    import json

    first = Usage(input_tokens=12, output_tokens=7, usd=0.000188, usd_source="reported")
    second = Usage(input_tokens=5, cache_read_tokens=3)  # tokens only: the USD is unknown
    run = failed_run(agent(cls=UP, usage=first), agent(cls=WORK, id="a2", usage=second))
    data = json.loads(json.dumps(run.to_dict()))
    assert data["agents"][0]["usage"]["usd_source"] == "reported"
    assert data["usage"]["input_tokens"] == 17
    # A known and an unknown part: the known USD is kept, the source says it is incomplete.
    assert data["usage"]["usd"] == pytest.approx(0.000188)
    assert data["usage"]["usd_source"] == "unknown"
    loaded = load_run_proof(data)
    assert loaded == run
    assert loaded.usage == first + second


def test_a_proof_written_before_usage_loads_with_unknown_cost() -> None:
    data = {"id": "a", "harness": "claude", "status": "failed", "class": "work", "cost_usd": 0.1}
    proof = load_agent_proof(data)
    assert proof.usage is None
    assert failed_run(proof).usage is None
    assert failed_run(proof).to_dict()["usage"] is None


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ("12 tokens", "usage"),
        ({"input_tokens": -1}, "input_tokens"),
        ({"output_tokens": 1.5}, "output_tokens"),
        ({"usd": -0.5, "usd_source": "reported"}, "usd"),
        ({"usd": 0.5, "usd_source": "guessed"}, "usd_source"),
        ({"usd": 0.5}, "usd_source"),
        ({"usd_source": "priced"}, "usd_source"),
    ],
)
def test_a_malformed_stored_usage_is_refused_naming_the_field(usage: object, field: str) -> None:
    data = {"id": "a", "harness": "claude", "status": "failed", "usage": usage}
    with pytest.raises(InvalidInput) as caught:
        load_agent_proof(data)
    assert caught.value.field == field
