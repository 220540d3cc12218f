"""Issue #45 part A: what each attempt cost, carried by the adapter contract and the proofs."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from _support import spawn_result

from execkit import AgentRequest, Envelope, get_adapter, map_result, run_agent
from execkit._adapter import ErrorKind
from execkit._proof import AgentStatus
from execkit._usage import Usage, UsdSource
from execkit.testing import FakeVendor

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded"
CLAUDE = get_adapter("claude")
REPORTED = Usage(input_tokens=12, output_tokens=7, usd=0.000188, usd_source="reported")


# --- 1. the contract carries usage ------------------------------------------------------------


def test_a_success_carries_the_envelopes_usage_and_its_usd_as_cost() -> None:
    mapped = map_result(CLAUDE, spawn_result(), Envelope(found=True, text="ok", usage=REPORTED))
    assert mapped.ok
    assert mapped.usage == REPORTED
    assert mapped.cost_usd == pytest.approx(0.000188)
    assert mapped.to_dict()["usage"]["usd_source"] == "reported"


@pytest.mark.parametrize(
    "result",
    [
        spawn_result(exit_code=1, stdout="boom"),
        spawn_result(exit_code=None, timed_out=True, signal=9),
        spawn_result(exit_code=None, signal=15),
    ],
    ids=["failed", "timed-out", "killed"],
)
def test_a_failed_timed_out_or_killed_spawn_keeps_what_its_cli_printed(result: object) -> None:
    envelope = Envelope(
        found=True,
        is_error=True,
        error_message="overloaded",
        error_kind=ErrorKind.OVERLOADED,
        usage=REPORTED,
    )
    mapped = map_result(CLAUDE, result, envelope)  # type: ignore[arg-type]
    assert not mapped.ok
    assert mapped.usage == REPORTED
    assert mapped.cost_usd == pytest.approx(0.000188)


def test_an_adapter_that_sets_only_cost_usd_reports_that_usd() -> None:
    mapped = map_result(CLAUDE, spawn_result(), Envelope(found=True, text="ok", cost_usd=0.25))
    assert mapped.usage == Usage(usd=0.25, usd_source=UsdSource.REPORTED)
    assert mapped.cost_usd == 0.25


def test_an_envelope_with_no_usage_maps_to_none_never_zero() -> None:
    mapped = map_result(CLAUDE, spawn_result(), Envelope(found=True, text="ok"))
    assert mapped.usage is None
    assert mapped.cost_usd is None


def test_the_agent_proof_sums_every_try_a_failed_one_included(fake_vendor: FakeVendor) -> None:
    success = (RECORDED / "claude" / "success" / "stdout").read_text()
    refused = (RECORDED / "claude" / "overloaded_529" / "stdout").read_text()
    fake_vendor.register("claude", stdout=refused, exit_code=1)
    fake_vendor.register("claude", stdout=success)
    proof = run_agent(
        CLAUDE,
        AgentRequest(prompt="hi"),
        max_attempts=2,
        sleep=lambda _s: None,
        start=fake_vendor.start,
    )
    assert proof.status is AgentStatus.SUCCEEDED
    assert proof.attempts == 2
    assert proof.usage is not None
    failed_try = CLAUDE.parse(spawn_result(stdout=refused, exit_code=1)).usage
    assert failed_try is not None
    assert proof.usage == failed_try + attrs.evolve(REPORTED, model="claude-opus-5-5")
    assert proof.cost_usd == pytest.approx(proof.usage.usd)
