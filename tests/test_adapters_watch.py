"""Adapters read their CLI's retry announcements as they are printed (issue 52, item 3).

A CLI that announces it will sleep out a limit longer than `LONG_WAIT_S` inside the
attempt (gemini's quota retry, qwen's rate-limit loop and its unattended heartbeat, pi's
`auto_retry_start`) is stopped there: the attempt is `upstream` with the announced reset,
from structure, so the slot is freed and the vendor lane parks. A shorter one is left to
the CLI; a run killed on timeout in its middle is read from the same announcement, never
from prose. The fake vendors print their announcement and then hang, as the real CLIs
sleep: only the watch ends them long before their timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import GenericAdapter
from execkit import AgentRequest, get_adapter, run_attempt, run_command
from execkit._adapter import LONG_WAIT_S, Envelope, adapter_watch
from execkit._attempt import AttemptOptions
from execkit._classify import FailureClass
from execkit.ledger import open_ledger
from execkit.testing import FakeVendor

# gemini-cli 0.61.0 with general.maxAttempts 2 against a usage limit lifting in 298 s:
# the quota retry it announces before sleeping 310 s (recorded in
# fixtures/recorded/gemini/limit_longer_than_timeout), then a start-up diagnostic.
GEMINI_298 = """\
Ripgrep is not available. Falling back to GrepTool.
[STARTUP] Phase 'cleanup_ops' was started but never ended. Skipping metrics.
Attempt 1 failed: You exceeded your current quota, please check your plan and billing details.
* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_requests
Please retry in 298.0s.
Suggested retry after 298s.. Retrying after 310328ms...
[STARTUP] Cannot measure phase 'cleanup_ops': start mark 'startup:cleanup_ops:start' not found.
"""
GEMINI_17 = GEMINI_298.replace("298", "17").replace("310328", "17268")
# Long enough that a test that waited for it would be seen to: only the watch ends the
# fakes in time; a slot held until it fires is what the watch prevents.
TIMEOUT_S = 120.0


def _gemini(fake_vendor: FakeVendor, stderr: str) -> None:
    fake_vendor.register("gemini", stderr=stderr, hang=True)


def _argv(name: str) -> list[str]:
    return get_adapter(name).build_argv(AgentRequest(prompt="fix the test"))


def test_gemini_announcing_a_298_s_quota_sleep_is_stopped_upstream_with_that_reset(
    fake_vendor: FakeVendor,
) -> None:
    _gemini(fake_vendor, GEMINI_298)
    proof = run_command(
        get_adapter("gemini"), _argv("gemini"), timeout_s=TIMEOUT_S, start=fake_vendor.start
    )
    assert proof.failure_class is FailureClass.UPSTREAM
    assert proof.reason == "rate limited"
    assert proof.retry_after_s == 298.0
    # The vendor's delay as the CLI's fixed announcement quotes it: structure, so it parks.
    assert proof.reset_from_structure
    assert proof.evidence == "Suggested retry after 298s.. Retrying after 310328ms..."


def test_a_killed_attempt_in_a_short_announced_sleep_is_read_from_the_announcement(
    fake_vendor: FakeVendor,
) -> None:
    # 17 s is a retry worth the CLI's own wait: no stop. The attempt's timeout ends it in
    # the middle; its reset is the announced one, from structure, not from the prose, and
    # its reason's line is the announcement, not the diagnostic printed after it.
    _gemini(fake_vendor, GEMINI_17)
    proof = run_command(
        get_adapter("gemini"), _argv("gemini"), timeout_s=1.0, start=fake_vendor.start
    )
    assert proof.failure_class is FailureClass.UPSTREAM
    assert (proof.reason, proof.retry_after_s, proof.reset_from_structure) == (
        "rate limited",
        17.0,
        True,
    )
    assert proof.evidence == "Suggested retry after 17s.. Retrying after 17268ms..."


def test_the_lane_parks_until_the_announced_reset_and_the_run_says_why(
    fake_vendor: FakeVendor, tmp_path: Path
) -> None:
    ledger = open_ledger(str(tmp_path / "ledger.db"))
    task = ledger.create_task("t", actor="runner")
    now = 2_000_000.0
    _gemini(fake_vendor, GEMINI_298)
    outcome = run_attempt(
        ledger,
        task.id,
        get_adapter("gemini"),
        AgentRequest(prompt="p", timeout_s=TIMEOUT_S),
        AttemptOptions(clock=lambda: now, start=fake_vendor.start),
    )
    assert (outcome.failure_class, outcome.charged) == (FailureClass.UPSTREAM, False)
    assert outcome.not_before == now + 298.0
    (lane,) = ledger.list_lanes(now=now)
    # Parked until the announced reset, plus the probe's margin past it (2 s and up to 2 s).
    assert lane.state == "parked" and lane.opens_at is not None
    assert now + 298.0 + 2 <= lane.opens_at < now + 298.0 + 4
    # The reason as stored on the run: the class and the line it was read from.
    assert outcome.reason == "rate limited: Suggested retry after 298s.. Retrying after 310328ms..."


def test_qwen_announcing_its_rate_limit_sleep_is_stopped(fake_vendor: FakeVendor) -> None:
    fake_vendor.register(
        "qwen",
        stderr="Retrying in 298s (attempt 1/1): [API Error: 429 Rate limit reached for gpt-fake "
        "on requests per hour (RPH). Please try again in 4m58s.]\n",
        hang=True,
    )
    proof = run_command(
        get_adapter("qwen"), _argv("qwen"), timeout_s=TIMEOUT_S, start=fake_vendor.start
    )
    assert (proof.failure_class, proof.reason) == (FailureClass.UPSTREAM, "http 429")
    assert (proof.retry_after_s, proof.reset_from_structure) == (298.0, True)


def test_qwen_unattended_capacity_wait_is_stopped(fake_vendor: FakeVendor) -> None:
    fake_vendor.register(
        "qwen",
        stderr="[qwen-code] Waiting for API capacity... attempt 1, retry in 268s\n",
        hang=True,
    )
    proof = run_command(
        get_adapter("qwen"), _argv("qwen"), timeout_s=TIMEOUT_S, start=fake_vendor.start
    )
    assert (proof.failure_class, proof.reason) == (FailureClass.UPSTREAM, "rate limited")
    assert (proof.retry_after_s, proof.reset_from_structure) == (268.0, True)


def test_pi_announcing_a_long_auto_retry_is_stopped(fake_vendor: FakeVendor) -> None:
    event = (
        '{"type":"auto_retry_start","attempt":3,"maxAttempts":5,"delayMs":120000,'
        '"errorMessage":"503 The server is overloaded or not ready yet."}\n'
    )
    fake_vendor.register("pi", stdout='{"type":"session","id":"s-1"}\n' + event, hang=True)
    proof = run_command(
        get_adapter("pi"), _argv("pi"), timeout_s=TIMEOUT_S, start=fake_vendor.start
    )
    assert (proof.failure_class, proof.reason) == (FailureClass.UPSTREAM, "http 503")
    assert (proof.retry_after_s, proof.reset_from_structure) == (120.0, True)


@pytest.mark.parametrize(
    ("name", "stream", "line"),
    [
        ("gemini", "stderr", "Suggested retry after 60s.. Retrying after 59000ms..."),
        ("qwen", "stderr", "Retrying in 60s (attempt 1/10): [API Error: 429 Too many]"),
        ("qwen", "stderr", "[qwen-code] Waiting for API capacity... attempt 2, retry in 30s"),
        ("pi", "stdout", '{"type":"auto_retry_start","attempt":1,"delayMs":2000}'),
    ],
)
def test_a_wait_within_the_bound_is_left_to_the_cli(name: str, stream: str, line: str) -> None:
    from execkit import Line

    watch = adapter_watch(get_adapter(name))
    assert watch is not None
    assert watch.on_line(Line(stream, line)) is None  # type: ignore[arg-type]
    assert LONG_WAIT_S == 60.0


def test_an_adapter_without_a_watch_takes_no_line_hook() -> None:
    assert adapter_watch(GenericAdapter()) is None
    assert adapter_watch(get_adapter("claude")) is None


def test_a_watch_answering_something_else_is_a_type_error_and_the_tree_is_killed(
    fake_vendor: FakeVendor,
) -> None:
    class Broken(GenericAdapter):
        def watch(self, line: object) -> Envelope:
            return Envelope(error_message="not an error")  # is_error unset

    fake_vendor.register("agent", stdout="hello\n", hang=True)
    with pytest.raises(TypeError, match="is_error"):
        run_command(Broken(), ["agent"], timeout_s=TIMEOUT_S, start=fake_vendor.start)


def test_a_watched_stop_keeps_what_the_cli_spent_before_it(fake_vendor: FakeVendor) -> None:
    # pi answered one message (its usage printed), then announced a long retry (#45).
    spent = (
        '{"type":"message_end","message":{"role":"assistant","content":[],"model":"gpt-fake",'
        '"usage":{"input":12,"output":7,"cacheRead":0,"cacheWrite":0,"cost":{"total":0}},'
        '"stopReason":"toolUse"}}\n'
    )
    event = (
        '{"type":"auto_retry_start","attempt":3,"maxAttempts":5,"delayMs":120000,'
        '"errorMessage":"503 The server is overloaded or not ready yet."}\n'
    )
    fake_vendor.register("pi", stdout=spent + event, hang=True)
    proof = run_command(
        get_adapter("pi"), _argv("pi"), timeout_s=TIMEOUT_S, start=fake_vendor.start
    )
    assert proof.failure_class is FailureClass.UPSTREAM
    assert proof.usage is not None
    assert (proof.usage.input_tokens, proof.usage.output_tokens) == (12, 7)
    assert proof.usage.model == "gpt-fake"
