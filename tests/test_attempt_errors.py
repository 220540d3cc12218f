"""Errors by class, the tenacity and stamina helpers (real retries, a fake sleep), and
`run_agent_async` (issue #32)."""

from __future__ import annotations

import asyncio
import pickle
import sys
import types
from pathlib import Path

import pytest
import stamina
import tenacity
from _support import wait_gone

from adapters import GenericAdapter
from execkit import (
    AgentFailed,
    AgentProof,
    AgentRequest,
    AgentStatus,
    EnvironmentFailure,
    RunRecorder,
    UpstreamFailure,
    WorkFailure,
    agent_failure,
    get_adapter,
    retry_upstream,
    run_agent,
    run_agent_async,
    stamina_upstream_hook,
    wait_for_reset,
)
from execkit._classify import FailureClass
from execkit.testing import FakeVendor

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "claude"
PY = [sys.executable, "-I", "-S"]
NOW = 1_000_000.0


def claude_says(fake_vendor: FakeVendor, *answers: str) -> None:
    """Starts of `claude`, one per answer, in order: a fixture name, or "missing"."""
    for answer in answers:
        if answer == "missing":
            fake_vendor.register("claude", missing=True, occurrences=1)
        else:
            code = 0 if answer == "success.json" else 1
            fake_vendor.register("claude", stdout=FIXTURES / answer, exit_code=code, occurrences=1)


def agent(fake_vendor: FakeVendor) -> AgentProof:
    return run_agent(
        get_adapter("claude"),
        AgentRequest(prompt="p"),
        max_attempts=1,
        start=fake_vendor.start,
        clock=lambda: NOW,
    )


@pytest.mark.parametrize(
    ("answer", "kind", "failure_class"),
    [
        ("max_turns.json", WorkFailure, FailureClass.WORK),
        ("auth_failure.json", EnvironmentFailure, FailureClass.ENVIRONMENT),
        ("missing", EnvironmentFailure, FailureClass.ENVIRONMENT),
        ("overloaded.json", UpstreamFailure, FailureClass.UPSTREAM),
        ("rate_limit.json", UpstreamFailure, FailureClass.UPSTREAM),
    ],
)
def test_run_agent_raises_the_subclass_of_the_class(
    fake_vendor: FakeVendor, answer: str, kind: type[AgentFailed], failure_class: FailureClass
) -> None:
    claude_says(fake_vendor, answer)
    with RunRecorder() as recorder, pytest.raises(AgentFailed) as failed:
        agent(fake_vendor)
    error = failed.value
    assert type(error) is kind
    assert error.failure_class is failure_class is error.proof.failure_class
    assert error.charged is (failure_class is FailureClass.WORK)
    assert recorder.agents == (error.proof,)  # recorded before the raise, as before
    if isinstance(error, EnvironmentFailure):
        assert error.precondition and error.precondition == error.proof.precondition
    if isinstance(error, UpstreamFailure):
        wait = error.proof.retry_after_s
        assert error.retry_after_s == wait
        assert error.reset_at == (None if wait is None else NOW + wait)
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.proof, str(again)) == (kind, error.proof, str(error))
    assert getattr(again, "reset_at", None) == getattr(error, "reset_at", None)


def test_agent_failure_builds_the_error_of_a_proof() -> None:
    unclassed = AgentProof(id="a", harness="h", status=AgentStatus.FAILED)
    assert type(agent_failure(unclassed)) is WorkFailure  # an unclassed failure is work
    upstream = AgentProof(
        id="a",
        harness="h",
        status=AgentStatus.FAILED,
        failure_class=FailureClass.UPSTREAM,
        retry_after_s=30.0,
    )
    error = agent_failure(upstream, now=100.0)
    assert isinstance(error, UpstreamFailure) and error.reset_at == 130.0
    undated = agent_failure(upstream)
    assert isinstance(undated, UpstreamFailure) and undated.reset_at is None
    with pytest.raises(ValueError, match="did not fail"):
        agent_failure(AgentProof(id="a", harness="h", status=AgentStatus.SUCCEEDED))


def test_tenacity_retries_only_upstream_and_waits_for_the_reset(fake_vendor: FakeVendor) -> None:
    # 429 with a stated reset in 37 s, then a 529 with none, then the answer.
    claude_says(fake_vendor, "rate_limit.json", "overloaded.json", "success.json")
    slept: list[float] = []
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(retry_upstream),
        wait=wait_for_reset(clock=lambda: NOW + 1.0, rng=lambda: 0.5),
        stop=tenacity.stop_after_attempt(5),
        sleep=slept.append,
        reraise=True,
    )
    proof = retrying(agent, fake_vendor)
    assert proof.status is AgentStatus.SUCCEEDED
    # The reset, less the second gone since; then the in-agent backoff's 2nd delay (4 s).
    assert slept == [36.0, 4.0]
    assert fake_vendor.call_count("claude") == 3


@pytest.mark.parametrize("answer", ["max_turns.json", "auth_failure.json", "missing"])
def test_tenacity_does_not_retry_a_charged_or_environment_failure(
    fake_vendor: FakeVendor, answer: str
) -> None:
    claude_says(fake_vendor, answer)
    slept: list[float] = []
    by_predicate = tenacity.Retrying(
        retry=tenacity.retry_if_exception(retry_upstream), sleep=slept.append, reraise=True
    )
    with pytest.raises(AgentFailed):
        by_predicate(agent, fake_vendor)
    # Selecting by type works the same way, with no predicate at all.
    by_type = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(UpstreamFailure), sleep=slept.append, reraise=True
    )
    claude_says(fake_vendor, answer)
    with pytest.raises(AgentFailed):
        by_type(agent, fake_vendor)
    assert slept == []
    assert fake_vendor.call_count("claude") == 2


def test_stamina_retries_upstream_waiting_for_the_reset(
    fake_vendor: FakeVendor, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    # stamina sleeps through tenacity's `nap`: only that module's clock is faked.
    monkeypatch.setattr(tenacity.nap, "time", types.SimpleNamespace(sleep=slept.append))
    claude_says(fake_vendor, "rate_limit.json", "overloaded.json", "success.json")

    @stamina.retry(on=stamina_upstream_hook(clock=lambda: NOW), attempts=5, timeout=None)
    def work() -> AgentProof:
        return agent(fake_vendor)

    assert work().status is AgentStatus.SUCCEEDED
    assert len(slept) == 2 and slept[0] == 37.0  # the reset; then stamina's own backoff
    assert fake_vendor.call_count("claude") == 3

    claude_says(fake_vendor, "auth_failure.json")
    with pytest.raises(EnvironmentFailure):
        work()
    assert len(slept) == 2 and fake_vendor.call_count("claude") == 4

    @stamina.retry(on=UpstreamFailure, attempts=2, timeout=None)
    def by_type() -> AgentProof:
        return agent(fake_vendor)

    claude_says(fake_vendor, "max_turns.json")
    with pytest.raises(WorkFailure):
        by_type()
    assert fake_vendor.call_count("claude") == 5


def test_run_agent_async_gives_the_proof_and_raises_by_class(fake_vendor: FakeVendor) -> None:
    claude_says(fake_vendor, "success.json", "auth_failure.json")

    async def main() -> None:
        with RunRecorder() as recorder:
            proof = await run_agent_async(
                get_adapter("claude"), AgentRequest(prompt="p"), start=fake_vendor.start
            )
            assert proof.status is AgentStatus.SUCCEEDED
            with pytest.raises(EnvironmentFailure):
                await run_agent_async(
                    get_adapter("claude"), AgentRequest(prompt="p"), start=fake_vendor.start
                )
        # The caller's recorder recorded both, from the agent's own thread.
        assert [a.status for a in recorder.agents] == ["succeeded", "failed"]

    asyncio.run(main())


def test_a_cancelled_run_agent_async_kills_the_whole_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = (
        "import os, signal, subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{kid.pid}}')\n"
        "time.sleep(600)\n"
    )
    request = AgentRequest(prompt="", extra_args=[*PY, "-c", script], timeout_s=300)

    async def main() -> None:
        with RunRecorder() as recorder:
            task = asyncio.ensure_future(run_agent_async(GenericAdapter(), request))
            for _ in range(6000):  # bounded: the child is up within seconds
                if pids.exists() and pids.read_text():
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert recorder.agents == ()  # a stopped agent records nothing, as run_agent

    asyncio.run(main())
    child, grandchild = map(int, pids.read_text().split())
    assert wait_gone(child) and wait_gone(grandchild)
