"""The in-agent loop: environment stops, upstream backs off, schema gate re-asks, context."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adapters
from execkit import Adapter, AgentRequest, MappedResult, get_adapter
from execkit._agent import (
    AttemptContext,
    PriorOutcome,
    RunRecorder,
    context_after,
    current_recorder,
    run_agent,
    run_command,
)
from execkit._budget import Backoff
from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit._proof import AgentFailed, AgentStatus, RunStatus
from execkit.testing import FakeVendor

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ENV, UP, WORK = FailureClass.ENVIRONMENT, FailureClass.UPSTREAM, FailureClass.WORK
REQUEST = AgentRequest(prompt="fix the test")


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def fx(vendor: str, name: str) -> Path:
    return FIXTURES / vendor / name


def mid() -> float:
    return 0.5  # rng at the middle: jitter multiplies by exactly 1


# --- environment ----------------------------------------------------------------------------


def test_missing_binary_stops_at_once_and_is_never_respawned(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", missing=True, occurrences=5)
    sleeps = Sleeps()
    recorder = RunRecorder()
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("codex"),
            REQUEST,
            max_attempts=5,
            sleep=sleeps,
            recorder=recorder,
            start=fake_vendor.start,
        )
    proof = failed.value.proof
    assert fake_vendor.call_count("codex") == 1
    assert sleeps == []
    assert proof.failure_class is ENV
    assert proof.attempts == 1
    assert proof.reason == "spawn errno ENOENT"
    assert proof.precondition is not None
    assert proof.precondition.startswith(
        "codex CLI not found on PATH; install: npm install -g @openai/codex"
    )
    assert "codex CLI not found on PATH" in failed.value.message
    assert recorder.agents == (proof,)


# --- upstream -------------------------------------------------------------------------------


def test_upstream_retries_with_backoff_then_succeeds(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("claude", stdout=fx("claude", "overloaded.json"), exit_code=1)
    fake_vendor.register("claude", stdout=fx("claude", "server_error_text_only.json"), exit_code=1)
    fake_vendor.register("claude", stdout=fx("claude", "success.json"))
    sleeps = Sleeps()
    proof = run_agent(
        get_adapter("claude"),
        REQUEST,
        max_attempts=3,
        backoff=Backoff(base_s=2.0, factor=3.0, max_s=100.0, jitter=0.5),
        sleep=sleeps,
        rng=mid,
        start=fake_vendor.start,
    )
    assert proof.status is AgentStatus.SUCCEEDED
    assert proof.failure_class is None
    assert proof.attempts == 3
    assert sleeps == [2.0, 6.0]
    assert proof.output == "Renamed `fetch_rows` to `load_rows` and updated its 3 callers."
    assert proof.session_id == "5d9a2c61-3f0e-4d6b-9a51-0c7b8e2f4a13"
    assert proof.cost_usd == pytest.approx(0.0421)


def test_persistent_upstream_is_bounded_and_uncharged(fake_vendor: FakeVendor) -> None:
    fake_vendor.register(
        "gemini", stdout=fx("gemini", "overloaded.json"), exit_code=1, occurrences=3
    )
    sleeps = Sleeps()
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("gemini"),
            REQUEST,
            max_attempts=3,
            backoff=Backoff(base_s=10.0, factor=2.0, max_s=15.0, jitter=0.0),
            sleep=sleeps,
            start=fake_vendor.start,
        )
    assert fake_vendor.call_count("gemini") == 3
    assert sleeps == [10.0, 15.0]  # capped
    proof = failed.value.proof
    assert (proof.failure_class, proof.reason, proof.attempts) == (UP, "http 503", 3)


def test_a_vendor_wait_within_max_s_is_waited_in_the_loop(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout=fx("codex", "rate_limit.jsonl"), exit_code=1)
    fake_vendor.register("codex", stdout=fx("codex", "success.jsonl"))
    sleeps = Sleeps()
    backoff = Backoff(base_s=1.0, max_s=30.0, jitter=0.0)
    proof = run_agent(
        get_adapter("codex"), REQUEST, backoff=backoff, sleep=sleeps, start=fake_vendor.start
    )  # asks for 14 s
    assert sleeps == [14.0]
    assert proof.status is AgentStatus.SUCCEEDED and proof.attempts == 2
    assert proof.retry_after_s is None


def test_a_vendor_wait_beyond_max_s_stops_the_loop_for_the_scheduler(
    fake_vendor: FakeVendor,
) -> None:
    fake_vendor.register("claude", stdout=fx("claude", "rate_limit.json"), exit_code=1)
    fake_vendor.register("claude", stdout=fx("claude", "success.json"))
    sleeps = Sleeps()
    backoff = Backoff(base_s=1.0, max_s=30.0, jitter=0.0)
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("claude"),
            REQUEST,
            max_attempts=3,
            backoff=backoff,
            sleep=sleeps,
            start=fake_vendor.start,
        )  # asks for 37 s: more than this loop waits
    proof = failed.value.proof
    assert sleeps == []  # neither slept (capped) nor re-spawned early
    assert fake_vendor.call_count("claude") == 1
    assert (proof.failure_class, proof.reason, proof.retry_after_s) == (UP, "http 429", 37.0)
    assert proof.to_dict()["retry_after_s"] == 37.0


# --- work -----------------------------------------------------------------------------------


def test_work_failure_retries_without_sleeping_and_charges(fake_vendor: FakeVendor) -> None:
    fake_vendor.register(
        "opencode", stdout=fx("opencode", "bad_request.jsonl"), exit_code=1, occurrences=2
    )
    sleeps = Sleeps()
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("opencode"), REQUEST, max_attempts=2, sleep=sleeps, start=fake_vendor.start
        )
    assert sleeps == []
    assert failed.value.proof.failure_class is WORK
    assert failed.value.proof.attempts == 2


def test_a_work_try_charges_the_agent_even_if_a_later_try_was_upstream(
    fake_vendor: FakeVendor,
) -> None:
    fake_vendor.register("codex", stdout=fx("codex", "bad_request.jsonl"), exit_code=1)
    fake_vendor.register("codex", stdout=fx("codex", "overloaded.jsonl"), exit_code=1)
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("codex"), REQUEST, max_attempts=2, sleep=Sleeps(), start=fake_vendor.start
        )
    assert failed.value.proof.failure_class is WORK
    assert failed.value.proof.reason == "http 400"


def test_a_refused_credential_stops_at_once_naming_the_fix(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("opencode", stdout=fx("opencode", "auth_failure.jsonl"), exit_code=1)
    sleeps = Sleeps()
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("opencode"), REQUEST, max_attempts=3, sleep=sleeps, start=fake_vendor.start
        )
    proof = failed.value.proof
    assert sleeps == [] and fake_vendor.call_count("opencode") == 1
    assert (proof.failure_class, proof.reason) == (ENV, "credentials")
    assert proof.precondition and "opencode auth login" in proof.precondition
    assert proof.retry_after_s is None


def test_upstream_then_missing_binary_stops_as_environment(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout=fx("codex", "overloaded.jsonl"), exit_code=1)
    fake_vendor.register("codex", missing=True, occurrences=3)
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("codex"), REQUEST, max_attempts=5, sleep=Sleeps(), start=fake_vendor.start
        )
    assert fake_vendor.call_count("codex") == 2
    assert failed.value.proof.failure_class is ENV
    assert failed.value.proof.precondition


def test_a_hung_vendor_is_killed_and_charged_as_a_timeout(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("claude", hang=True, stdout="thinking...\n")
    # The fake is a real process, so its timeout really elapses: keep it short.
    request = AgentRequest(prompt="x", timeout_s=0.5)
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("claude"), request, max_attempts=1, kill_grace=0.1, start=fake_vendor.start
        )
    assert (failed.value.proof.failure_class, failed.value.proof.reason) == (WORK, "timeout")


# --- schema gate ----------------------------------------------------------------------------


def test_schema_gate_retries_with_the_validation_error_appended(fake_vendor: FakeVendor) -> None:
    def envelope(result: str) -> str:
        return json.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": result,
                "session_id": "s",
            }
        )

    fake_vendor.register("claude", stdout=envelope("sure! here it is"))
    fake_vendor.register("claude", stdout=envelope('{"files": ["a.py"]}'))

    def validate(reply: str) -> str | None:
        try:
            json.loads(reply)
        except ValueError as exc:
            return f"reply is not JSON: {exc}"
        return None

    contexts: list[AttemptContext] = []

    def prepare(request: AgentRequest, context: AttemptContext) -> AgentRequest:
        contexts.append(context)
        return request

    proof = run_agent(
        get_adapter("claude"),
        REQUEST,
        max_attempts=2,
        validate=validate,
        prepare=prepare,
        start=fake_vendor.start,
    )
    assert proof.status is AgentStatus.SUCCEEDED
    assert proof.output == '{"files": ["a.py"]}'
    first, second = (argv[-1] for argv in fake_vendor.calls("claude"))
    assert first == "fix the test"
    assert second.startswith("fix the test\n\n")
    assert "reply is not JSON" in second
    assert contexts[1].prior_outcome is PriorOutcome.WORKFLOW_ERROR
    assert "reply is not JSON" in (contexts[1].prior_cause or "")


def test_schema_gate_failure_on_the_last_try_is_work(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout=fx("codex", "success.jsonl"))
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("codex"),
            REQUEST,
            max_attempts=1,
            validate=lambda _: "bad",
            start=fake_vendor.start,
        )
    assert (failed.value.proof.failure_class, failed.value.proof.reason) == (WORK, "schema")


# --- the context handed to the next try -----------------------------------------------------


def test_uncharged_prior_is_lost_with_no_cause(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout=fx("codex", "overloaded.jsonl"), exit_code=1)
    fake_vendor.register("codex", stdout=fx("codex", "bad_request.jsonl"), exit_code=1)
    fake_vendor.register("codex", stdout=fx("codex", "success.jsonl"))
    contexts: list[AttemptContext] = []

    def prepare(request: AgentRequest, context: AttemptContext) -> AgentRequest:
        contexts.append(context)
        return request

    run_agent(
        get_adapter("codex"),
        REQUEST,
        max_attempts=3,
        prepare=prepare,
        sleep=Sleeps(),
        start=fake_vendor.start,
    )
    assert [c.attempt for c in contexts] == [1, 2, 3]
    assert contexts[0].prior_outcome is None
    assert contexts[1] == AttemptContext(2, 3, PriorOutcome.LOST, None)
    assert contexts[2].prior_outcome is PriorOutcome.WORKFLOW_ERROR
    assert "400 Bad Request" in (contexts[2].prior_cause or "")


def test_the_spawned_agent_sees_its_context_in_its_environment(tmp_path: Path) -> None:
    # A real process: first try fails upstream, second try reports what it was told.
    counter = tmp_path / "count"
    script = textwrap.dedent(
        f"""
        import os, pathlib, sys
        counter = pathlib.Path({str(counter)!r})
        n = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(n))
        if n == 1:
            print("HTTP 503 Service Unavailable", file=sys.stderr)
            sys.exit(1)
        print(os.environ["EXECKIT_ATTEMPT"], os.environ["EXECKIT_PRIOR_OUTCOME"],
              os.environ.get("EXECKIT_PRIOR_CAUSE", "<none>"))
        """
    )
    generic = adapters.GenericAdapter(command=(sys.executable, "-c", script))
    proof = run_agent(generic, AgentRequest(prompt=""), max_attempts=2, sleep=Sleeps())
    assert proof.output == "2 lost <none>"


@settings(max_examples=50)
@given(
    st.sampled_from([ENV, UP, WORK, None]),
    st.none() | st.text(max_size=50),
    st.integers(2, 10),
)
def test_prop_uncharged_prior_is_lost_and_carries_no_cause(
    cls: FailureClass | None, cause: str | None, attempt: int
) -> None:
    context = context_after(cls, cause, attempt=attempt, max_attempts=10)
    if cls is not None and not cls.charged:
        assert context.prior_outcome is PriorOutcome.LOST
        assert context.prior_cause is None
        assert "EXECKIT_PRIOR_CAUSE" not in context.to_env()
    elif cls is None and cause is None:
        assert context.prior_outcome is None
    else:
        assert context.prior_outcome is PriorOutcome.WORKFLOW_ERROR
    assert context.prior_outcome is not PriorOutcome.WORKFLOW_ERROR or cls in (WORK, None)


def test_a_lost_context_with_a_cause_is_refused() -> None:
    with pytest.raises(InvalidInput, match="prior_cause"):
        AttemptContext(2, 3, PriorOutcome.LOST, "HTTP 503")


# --- backoff --------------------------------------------------------------------------------


@settings(max_examples=100)
@given(
    st.floats(0.001, 100),
    st.floats(1, 10),
    st.floats(1, 1000),
    st.floats(0, 1, exclude_max=True),
    st.integers(1, 2000),
    st.floats(0, 1),
    st.none() | st.floats(-10, 1e9),
)
def test_prop_backoff_is_always_within_zero_and_the_cap(
    base: float,
    factor: float,
    cap_factor: float,
    jitter: float,
    retry: int,
    u: float,
    retry_after: float | None,
) -> None:
    # One backoff policy for the whole library: its cap is never below its base.
    cap = base * cap_factor
    backoff = Backoff(base_s=base, factor=factor, max_s=cap, jitter=jitter)
    delay = backoff.delay(retry, retry_after_s=retry_after, rng=lambda: u)
    assert 0 <= delay <= cap


@settings(max_examples=100)
@given(st.floats(0.1, 10), st.floats(1, 4), st.integers(1, 50))
def test_prop_backoff_without_jitter_never_shrinks(base: float, factor: float, retry: int) -> None:
    backoff = Backoff(base_s=base, factor=factor, max_s=600, jitter=0)
    assert backoff.delay(retry + 1) >= backoff.delay(retry)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base_s": -1}, "base_s"),
        ({"factor": 0.5}, "factor"),
        ({"factor": 101}, "factor"),
        ({"max_s": float("nan")}, "max_s"),
        ({"jitter": 2}, "jitter"),
    ],
)
def test_backoff_rejects_bad_values_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        Backoff(**kwargs)


@pytest.mark.parametrize("bad", [0, 101, True, 2.0])
def test_max_attempts_out_of_range_changes_nothing(fake_vendor: FakeVendor, bad: Any) -> None:
    with pytest.raises(InvalidInput, match="max_attempts"):
        run_agent(get_adapter("codex"), REQUEST, max_attempts=bad, start=fake_vendor.start)
    assert fake_vendor.call_count("codex") == 0


# --- the class survives a parallel() that swallows failures ---------------------------------


def parallel(thunks: list[Callable[[], Any]]) -> list[Any]:
    """A script helper that swallows rejections: None for each failed thunk."""
    results = []
    for thunk in thunks:
        try:
            results.append(thunk())
        except Exception:
            results.append(None)
    return results


def test_swallowed_failures_still_class_the_run(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", missing=True)
    fake_vendor.register("gemini", stdout=fx("gemini", "overloaded.json"), exit_code=1)
    with RunRecorder() as recorder:
        assert current_recorder() is recorder
        results = parallel(
            [
                lambda: run_agent(
                    get_adapter("codex"), REQUEST, max_attempts=1, start=fake_vendor.start
                ),
                lambda: run_agent(
                    get_adapter("gemini"), REQUEST, max_attempts=1, start=fake_vendor.start
                ),
            ]
        )
        assert results == [None, None]
        error = RuntimeError("no agent produced a plan")
    assert current_recorder() is None
    run = recorder.finish(error)
    assert run.status is RunStatus.FAILED
    assert run.run_class is ENV
    assert run.to_dict()["class"] == "environment"
    assert run.precondition and run.precondition.startswith("codex CLI not found on PATH")


def test_a_productive_agent_charges_the_run_despite_a_swallowed_environment_failure(
    fake_vendor: FakeVendor,
) -> None:
    fake_vendor.register("claude", stdout=fx("claude", "success.json"))
    fake_vendor.register("codex", missing=True)
    recorder = RunRecorder()
    parallel(
        [
            lambda: run_agent(
                get_adapter("claude"), REQUEST, recorder=recorder, start=fake_vendor.start
            ),
            lambda: run_agent(
                get_adapter("codex"), REQUEST, recorder=recorder, start=fake_vendor.start
            ),
        ]
    )
    assert recorder.finish("later step failed").run_class is WORK
    assert recorder.finish().run_class is None


# --- secrets --------------------------------------------------------------------------------


def test_secrets_from_the_environment_never_reach_the_proof(fake_vendor: FakeVendor) -> None:
    secret = "hunter2-very-private-value"
    fake_vendor.register("codex", stderr=f"auth failed using {secret}\n", exit_code=1)
    request = AgentRequest(prompt="x", env={"VENDOR_API_TOKEN": secret})
    with pytest.raises(AgentFailed) as failed:
        run_agent(get_adapter("codex"), request, max_attempts=1, start=fake_vendor.start)
    assert secret not in json.dumps(failed.value.proof.to_dict())
    assert secret not in failed.value.message


# --- run_command (the CLI path) ---------------------------------------------------------------


def test_run_command_returns_the_proof_instead_of_raising(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", missing=True)
    proof = run_command(
        get_adapter("codex"), ["codex", "exec", "fix the test"], start=fake_vendor.start
    )
    assert proof.status is AgentStatus.FAILED
    assert proof.failure_class is ENV
    with pytest.raises(InvalidInput, match="argv"):
        run_command(get_adapter("codex"), [], start=fake_vendor.start)


# --- review: context isolation, crashes recorded, preconditions, the loop's bounds ----------


def test_an_inherited_context_never_reaches_a_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # execkit running inside an agent that execkit spawned inherits that agent's context.
    monkeypatch.setenv("EXECKIT_PRIOR_OUTCOME", "workflow_error")
    monkeypatch.setenv("EXECKIT_PRIOR_CAUSE", "stale cause from the parent run")
    monkeypatch.setenv("EXECKIT_ATTEMPT", "7")
    log = tmp_path / "seen.jsonl"
    script = textwrap.dedent(
        f"""
        import json, os, pathlib, sys
        log = pathlib.Path({str(log)!r})
        seen = {{k: v for k, v in os.environ.items() if k.startswith("EXECKIT_")}}
        with log.open("a") as out:
            out.write(json.dumps(seen) + "\\n")
        if len(log.read_text().splitlines()) == 1:
            print("HTTP/1.1 503 Service Unavailable", file=sys.stderr)
            sys.exit(1)
        """
    )
    generic = adapters.GenericAdapter(command=(sys.executable, "-c", script))
    run_agent(generic, AgentRequest(prompt=""), max_attempts=2, sleep=Sleeps())
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first == {"EXECKIT_ATTEMPT": "1", "EXECKIT_MAX_ATTEMPTS": "2"}
    assert second == {
        "EXECKIT_ATTEMPT": "2",
        "EXECKIT_MAX_ATTEMPTS": "2",
        "EXECKIT_PRIOR_OUTCOME": "lost",
    }


def test_a_crash_inside_the_loop_is_recorded_as_work_before_it_propagates(
    fake_vendor: FakeVendor,
) -> None:
    # The crashed agent ran (its reply reached the gate): it must charge the run, even
    # when parallel() swallows the error and the only other agent was uncharged.
    fake_vendor.register("codex", missing=True)
    fake_vendor.register("claude", stdout=fx("claude", "success.json"))

    def broken_gate(reply: str) -> str | None:
        raise ZeroDivisionError("the gate divided by zero")

    with RunRecorder() as recorder:
        parallel(
            [
                lambda: run_agent(
                    get_adapter("codex"), REQUEST, max_attempts=1, start=fake_vendor.start
                ),
                lambda: run_agent(
                    get_adapter("claude"), REQUEST, validate=broken_gate, start=fake_vendor.start
                ),
            ]
        )
    crashed = recorder.agents[1]
    assert (crashed.harness, crashed.failure_class, crashed.reason) == ("claude", WORK, "error")
    assert crashed.error == "ZeroDivisionError: the gate divided by zero"
    assert crashed.precondition is None
    assert recorder.finish("no agent produced a plan").run_class is WORK

    # The caller still sees its own error, not a wrapped one.
    def dividing_prepare(request: AgentRequest, context: AttemptContext) -> AgentRequest:
        raise ZeroDivisionError("division by zero")

    with pytest.raises(ZeroDivisionError):
        run_agent(
            get_adapter("generic"),
            AgentRequest(prompt="", extra_args=("x",)),
            prepare=dividing_prepare,
        )


def test_a_charged_agent_carries_no_precondition(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout=fx("codex", "bad_request.jsonl"), exit_code=1)
    fake_vendor.register("codex", missing=True)
    recorder = RunRecorder()
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("codex"),
            REQUEST,
            max_attempts=2,
            recorder=recorder,
            start=fake_vendor.start,
        )
    assert failed.value.proof.failure_class is WORK
    assert failed.value.proof.precondition is None
    assert recorder.finish("failed").precondition is None


class ScriptedAdapter:
    """Spawns `true` (a real process) and reports the next scripted outcome."""

    name = "scripted"
    binary = "true"
    install_hint = "-"
    login_hint = None

    def __init__(self, outcomes: list[tuple[FailureClass | None, float | None]]) -> None:
        self.outcomes = list(outcomes)
        self.spawns = 0

    def build_argv(self, request: AgentRequest) -> list[str]:
        return ["true"]

    def parse(self, result: Any) -> MappedResult:
        cls, retry_after = self.outcomes[self.spawns]
        self.spawns += 1
        if cls is None:
            return MappedResult(ok=True, text="done")
        return MappedResult(
            ok=False,
            error=f"{cls.value} failure",
            failure_class=cls,
            reason=cls.value,
            precondition="true CLI not found" if cls is ENV else None,
            retry_after_s=retry_after,
        )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([ENV, UP, WORK, None]), st.none() | st.floats(0, 10_000)),
        min_size=6,
        max_size=6,
    ),
    st.integers(1, 6),
)
def test_prop_the_loop_is_bounded_and_tells_each_try_the_truth(
    outcomes: list[tuple[FailureClass | None, float | None]], max_attempts: int
) -> None:
    adapter = ScriptedAdapter(outcomes)
    backoff = Backoff(base_s=1.0, factor=2.0, max_s=50.0, jitter=0.0)
    sleeps = Sleeps()
    contexts: list[AttemptContext] = []

    def prepare(request: AgentRequest, context: AttemptContext) -> AgentRequest:
        contexts.append(context)
        return request

    recorder = RunRecorder()
    try:
        proof = run_agent(
            adapter,
            REQUEST,
            max_attempts=max_attempts,
            backoff=backoff,
            sleep=sleeps,
            prepare=prepare,
            recorder=recorder,
        )
    except AgentFailed as failed:
        proof = failed.proof
    classes = [cls for cls, _ in outcomes]
    # Stops at the first success or environment failure, or at an upstream failure whose
    # vendor asked for more than max_s (the scheduler waits for that), else at
    # max_attempts: never more.
    settle = next(
        (
            i + 1
            for i, (cls, asked) in enumerate(outcomes)
            if cls in (None, ENV) or (cls is UP and asked is not None and asked > backoff.max_s)
        ),
        99,
    )
    assert adapter.spawns == proof.attempts == min(settle, max_attempts)
    assert recorder.agents == (proof,)
    # Only an upstream try followed by another try waits: the vendor's wait when it asked
    # for one (never more than max_s), else the backoff.
    waited = [outcomes[i] for i in range(adapter.spawns - 1) if classes[i] is UP]
    assert len(sleeps) == len(waited)
    for slept, (_, asked) in zip(sleeps, waited, strict=True):
        assert 0 <= slept <= backoff.max_s
        if asked is not None:
            assert slept == asked
    # Each try after an uncharged one is told `lost`, with no cause.
    for index, context in enumerate(contexts[1:]):
        prior = classes[index]
        if prior in (ENV, UP):
            assert (context.prior_outcome, context.prior_cause) == (PriorOutcome.LOST, None)
        else:
            assert context.prior_outcome is PriorOutcome.WORKFLOW_ERROR
    # The agent's class: work if any try touched the work, else the last try's class.
    tried = classes[: adapter.spawns]
    if tried[-1] is None:
        assert proof.status is AgentStatus.SUCCEEDED
    else:
        assert proof.failure_class is (WORK if WORK in tried else tried[-1])
        assert (proof.precondition is not None) is (proof.failure_class is ENV)
        # The reset travels on the proof for upstream only: what the scheduler waits for.
        if proof.failure_class is UP:
            assert proof.retry_after_s == outcomes[adapter.spawns - 1][1]
        else:
            assert proof.retry_after_s is None


def test_threaded_parallel_that_swallows_failures_keeps_every_class(tmp_path: Path) -> None:
    # Real threads and real processes: a thread pool does not inherit the `with` recorder,
    # so the script passes it explicitly; the recorder must keep every proof.
    missing = adapters.GenericAdapter(command=(str(tmp_path / "absent-vendor-cli"),))
    refused = adapters.GenericAdapter(
        command=("sh", "-c", "echo 'HTTP/1.1 503 Service Unavailable' >&2; exit 1")
    )
    recorder = RunRecorder()

    def agent(adapter: Adapter) -> Callable[[], Any]:
        return lambda: run_agent(
            adapter, AgentRequest(prompt=""), max_attempts=2, sleep=Sleeps(), recorder=recorder
        )

    thunks = [agent(missing if i % 2 else refused) for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(thunk) for thunk in thunks]
    assert all(isinstance(f.exception(timeout=60), AgentFailed) for f in futures)
    classes = sorted(a.failure_class.value for a in recorder.agents if a.failure_class)
    assert classes == ["environment"] * 4 + ["upstream"] * 4
    run = recorder.finish("every agent failed")
    assert run.run_class is ENV
    assert run.precondition and "absent-vendor-cli CLI not found on PATH" in run.precondition


def test_a_heartbeat_keeps_the_runs_lease_while_the_agent_runs_and_waits(
    tmp_path: Path,
) -> None:
    from execkit.ledger import open_ledger

    script = tmp_path / "slow-agent"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(0.8)\nprint('done')\n")
    script.chmod(0o755)
    with open_ledger(tmp_path / "ledger.db") as ledger:
        task = ledger.create_task("t", actor="alice")
        run = ledger.start_run(task.id, request_key="k", actor="alice", lease_s=0.3)
        renewals: list[float] = []

        def renew() -> None:
            renewals.append(ledger.heartbeat(run.id, lease_s=0.3).lease_expires_at or 0.0)

        proof = run_agent(
            get_adapter("generic"),
            AgentRequest(prompt="", extra_args=(str(script),)),
            max_attempts=1,
            heartbeat=renew,
            heartbeat_s=0.1,
        )
        assert proof.output == "done"
        # The lease (0.3 s) was renewed while the 0.8 s agent ran, so it still holds.
        assert len(renewals) >= 2
        assert renewals[-1] > (run.lease_expires_at or 0.0) + 0.3
        finished = ledger.finish_run(run.id, "succeeded")
        assert finished.status == "succeeded"


def test_a_heartbeat_renews_through_a_long_backoff_wait(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("claude", stdout=fx("claude", "overloaded.json"), exit_code=1)
    fake_vendor.register("claude", stdout=fx("claude", "success.json"))
    events: list[str] = []
    proof = run_agent(
        get_adapter("claude"),
        REQUEST,
        backoff=Backoff(base_s=25.0, max_s=25.0, jitter=0.0),
        sleep=lambda s: events.append(f"sleep {s:g}"),
        heartbeat=lambda: events.append("renew"),
        heartbeat_s=10.0,
        start=fake_vendor.start,
    )
    assert proof.status is AgentStatus.SUCCEEDED
    # 25 s of backoff in slices no longer than the heartbeat, renewed before each.
    assert events == ["renew", "sleep 10", "renew", "sleep 10", "renew", "sleep 5", "renew"]


def test_a_failing_heartbeat_stops_the_agent_and_propagates(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("claude", hang=True)

    def lost() -> None:
        raise RuntimeError("run r-1 is abandoned, not running")

    with pytest.raises(RuntimeError, match="abandoned"):
        run_agent(
            get_adapter("claude"),
            REQUEST,
            heartbeat=lost,
            heartbeat_s=0.05,
            start=fake_vendor.start,
        )
    assert fake_vendor.call_count("claude") == 1


@pytest.mark.parametrize(("heartbeat", "every"), [(print, 0), (print, -1.0), ("renew", 1.0)])
def test_bad_heartbeat_arguments_are_refused_before_anything_runs(
    fake_vendor: FakeVendor, heartbeat: Any, every: float
) -> None:
    fake_vendor.register("claude", stdout=fx("claude", "success.json"))
    with pytest.raises((InvalidInput, TypeError), match="heartbeat"):
        run_agent(
            get_adapter("claude"),
            REQUEST,
            heartbeat=heartbeat,
            heartbeat_s=every,
            start=fake_vendor.start,
        )
    assert fake_vendor.call_count("claude") == 0
