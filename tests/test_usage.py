"""Issue #45 part A: what each attempt cost, carried by the adapter contract and the proofs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from _support import spawn_result

from execkit import AgentRequest, Envelope, MappedResult, get_adapter, map_result, run_agent
from execkit._adapter import ErrorKind
from execkit._exec import Line
from execkit._meter import UsageEvent, read_usage
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


# --- 2. each adapter reads its CLI's usage from structure -------------------------------------

VENDORS_DIR = Path(__file__).resolve().parent / "vendors"
if str(VENDORS_DIR) not in sys.path:
    sys.path.insert(0, str(VENDORS_DIR))

import fake_api  # noqa: E402


def _fake_call_tokens() -> tuple[int, int]:
    """What the loopback fake API bills one successful model call, read from the fake
    itself (every protocol it speaks returns the same figures)."""
    anthropic = json.loads(fake_api._message_json("m"))["usage"]
    openai = json.loads(fake_api._chat_json("m"))["usage"]
    responses = fake_api._response_object("m", "r", "completed", [])["usage"]
    google: Any = fake_api._google_chunk("m", "x", "STOP")["usageMetadata"]
    figures = {
        (anthropic["input_tokens"], anthropic["output_tokens"]),
        (openai["prompt_tokens"], openai["completion_tokens"]),
        (responses["input_tokens"], responses["output_tokens"]),
        (google["promptTokenCount"], google["candidatesTokenCount"]),
    }
    assert len(figures) == 1, figures
    return figures.pop()


IN, OUT = _fake_call_tokens()

# cell -> (model calls whose usage the CLI reports, USD it reported, model it named).
# opencode reports one step for its two model calls (the other, outside the run's steps,
# is presumably its session-title call: its events never count it); qwen's
# `result` totals its two calls; gemini's stats name its router and main models.
CALLS: dict[str, tuple[int, float | None, str | None]] = {
    "claude/success": (1, 0.000188, "claude-opus-5-5"),
    "claude/flaky_503_then_success": (1, 0.000188, "claude-opus-5-5"),
    "codex/success": (1, None, None),
    "codex/flaky_503_then_success": (1, None, None),
    "gemini/success": (2, None, None),
    "opencode/success": (1, None, None),
    "kilo/success": (1, None, None),
    "pi/success": (1, None, "gpt-fake"),
    "qwen/success": (2, None, None),
    "droid/success": (1, None, None),
}


def _parse(key: str) -> MappedResult:
    cell = RECORDED / key
    adapter = get_adapter(key.split("/")[0])
    argv = tuple(json.loads((cell / "argv.json").read_text()))
    meta = json.loads((cell / "meta.json").read_text())
    result = spawn_result(
        argv,
        stdout=(cell / "stdout").read_text(),
        stderr=(cell / "stderr").read_text(),
        exit_code=meta["exit_code"],
    )
    return adapter.parse(result)


@pytest.mark.parametrize("key", sorted(CALLS))
def test_each_adapter_reads_the_tokens_the_fake_api_billed(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EXECKIT_PRICES", raising=False)
    calls, usd, model = CALLS[key]
    usage = _parse(key).usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (calls * IN, calls * OUT)
    assert usage.cache_read_tokens == usage.cache_write_tokens == 0
    assert usage.model == model
    if usd is None:  # tokens only (or a CLI's 0 for a model it cannot price): never zero
        assert usage.usd is None
        assert usage.usd_source is UsdSource.UNKNOWN
    else:
        assert usage.usd == pytest.approx(usd)
        assert usage.usd_source is UsdSource.REPORTED


def test_gemini_reads_each_models_tokens_and_prices_each_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "models": {
                    "gemini-3.5-flash-lite": {"input": 1.0, "output": 2.0},
                    "gemini-3.8-flash": {"input": 10.0, "output": 20.0},
                }
            }
        )
    )
    monkeypatch.setenv("EXECKIT_PRICES", str(prices))
    usage = _parse("gemini/success").usage
    assert usage is not None
    assert usage.usd_source is UsdSource.PRICED
    assert usage.usd == pytest.approx((IN * 1 + OUT * 2 + IN * 10 + OUT * 20) / 1e6)


def test_copilot_records_its_premium_requests_and_no_money() -> None:
    usage = _parse("copilot/success").usage
    assert usage is not None
    assert usage.premium_requests == 0  # bring-your-own-key mode spends none
    assert usage.model == "gpt-fake"
    assert usage.tokens == 0
    assert usage.usd is None


@pytest.mark.parametrize("key", ["aider/success", "cn/usage_limit", "llm/usage_limit"])
def test_a_cli_that_prints_no_usage_structure_reports_none(key: str) -> None:
    assert _parse(key).usage is None


def test_claude_counts_a_killed_streams_messages_once_each() -> None:
    # Two messages, the first printed on three content blocks (its usage repeated, the
    # last one grown), then killed before the `result`.
    def event(message: str, block: int, output: int) -> str:
        body = {
            "type": "assistant",
            "message": {
                "id": message,
                "model": "claude-opus-5-5",
                "content": [{"type": "text", "text": f"block {block}"}],
                "usage": {
                    "input_tokens": 100,
                    "output_tokens": output,
                    "cache_read_input_tokens": 50,
                    "cache_creation_input_tokens": 5,
                },
            },
        }
        return json.dumps(body, separators=(",", ":"))

    stdout = "\n".join(
        [event("msg_1", 1, 3), event("msg_1", 2, 3), event("msg_1", 3, 9), event("msg_2", 1, 4)]
    )
    mapped = CLAUDE.parse(spawn_result(stdout=stdout, exit_code=None, signal=9, timed_out=True))
    assert mapped.usage is not None
    assert mapped.usage.input_tokens == 200
    assert mapped.usage.output_tokens == 9 + 4
    assert mapped.usage.cache_read_tokens == 100
    assert mapped.usage.cache_write_tokens == 10
    assert mapped.usage.model == "claude-opus-5-5"


def test_a_zero_usd_beside_tokens_is_unknown_not_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXECKIT_PRICES", raising=False)
    mapped = _parse("claude/midstream_error")
    assert mapped.usage is not None
    assert mapped.usage.tokens > 0
    assert mapped.usage.usd is None
    assert mapped.cost_usd is None


# --- the live reading agrees with the final one ----------------------------------------------

LIVE = ["claude", "codex", "opencode", "kilo", "pi", "qwen", "copilot"]


@pytest.mark.parametrize(
    "key",
    [
        f"{cli}/{cell}"
        for cli in LIVE
        for cell in ("success", "flaky_503_then_success", "midstream_error", "stream_cut")
    ],
)
def test_usage_of_line_by_line_reads_what_parse_reads(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EXECKIT_PRICES", raising=False)
    adapter: Any = get_adapter(key.split("/")[0])
    stdout = (RECORDED / key / "stdout").read_text()
    live = read_usage(stdout, adapter.usage_of)
    final = _parse(key).usage
    if final is None:
        assert live is None
        return
    assert live is not None
    assert (live.input_tokens, live.output_tokens, live.cache_read_tokens) == (
        final.input_tokens,
        final.output_tokens,
        final.cache_read_tokens,
    )
    assert (live.usd, live.premium_requests) == (final.usd, final.premium_requests)


def test_gemini_stream_json_result_stats_are_its_final_total() -> None:
    # gemini-cli's stream-json `result` event (`--output-format stream-json`; not the
    # adapter's default argv, so not recorded here): totals, cached tokens inside input.
    line = json.dumps(
        {
            "type": "result",
            "timestamp": "2026-12-07T10:00:00.000Z",
            "status": "success",
            "stats": {
                "total_tokens": 150,
                "input_tokens": 100,
                "output_tokens": 50,
                "cached": 40,
                "input": 60,
                "duration_ms": 900,
                "tool_calls": 0,
            },
        }
    )
    got = get_adapter("gemini").usage_of(Line("stdout", line))  # type: ignore[attr-defined]
    assert isinstance(got, UsageEvent) and got.final
    assert (got.usage.input_tokens, got.usage.cache_read_tokens) == (60, 40)
    assert got.usage.output_tokens == 50
    assert got.usage.usd is None


def test_copilot_keeps_a_fractional_premium_request_as_it_is() -> None:
    line = '{"type":"result","sessionId":"s","exitCode":0,"usage":{"premiumRequests":0.33}}'
    got = get_adapter("copilot").usage_of(Line("stdout", line))  # type: ignore[attr-defined]
    assert isinstance(got, Usage)
    assert got.premium_requests == pytest.approx(0.33)
    assert got.usd is None and got.tokens == 0
    assert (got + got).premium_requests == pytest.approx(0.66)


class Scripted:
    """Spawns `true` (a real process) and reports the next scripted result."""

    name = "scripted"
    binary = "true"
    install_hint = "-"
    login_hint = None

    def __init__(self, results: list[MappedResult]) -> None:
        self.results = list(results)

    def build_argv(self, request: AgentRequest) -> list[str]:
        return ["true"]

    def parse(self, result: object) -> MappedResult:
        return self.results.pop(0)


def test_a_try_that_ran_and_reported_nothing_makes_the_agents_usd_unknown() -> None:
    from execkit._classify import FailureClass

    overloaded = MappedResult(
        ok=False, failure_class=FailureClass.UPSTREAM, reason="overloaded", usage=REPORTED
    )
    silent = MappedResult(ok=True, text="done")  # its CLI printed no usage
    proof = run_agent(
        Scripted([overloaded, silent]),
        AgentRequest(prompt="x"),
        max_attempts=2,
        sleep=lambda _s: None,
    )
    assert proof.usage is not None
    assert proof.usage.input_tokens == REPORTED.input_tokens
    # The known part is kept; the source says the total is not complete (never a zero).
    assert proof.usage.usd == pytest.approx(REPORTED.usd)
    assert proof.usage.usd_source is UsdSource.UNKNOWN


def test_claude_is_given_its_own_spend_bound_and_others_ignore_it() -> None:
    request = AgentRequest(prompt="fix it", max_budget_usd=0.5, max_turns=3)
    argv = CLAUDE.build_argv(request)
    assert argv[argv.index("--max-budget-usd") + 1] == "0.5"
    assert argv[-1] == "fix it"
    assert "--max-budget-usd" not in get_adapter("codex").build_argv(request)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_a_spend_bound_out_of_range_is_refused_naming_the_field(bad: object) -> None:
    from execkit._errors import InvalidInput

    with pytest.raises(InvalidInput) as caught:
        AgentRequest(prompt="x", max_budget_usd=bad)  # type: ignore[arg-type]
    assert caught.value.field == "max_budget_usd"


# --- the run's cost reaches the ledger ---------------------------------------------------------


@pytest.mark.parametrize("story", ["ok", "refused"])
def test_run_attempt_records_what_the_cli_reported_on_the_run(
    ledger: Any, fake_vendor: FakeVendor, story: str
) -> None:
    # What the adapter read (part A) is what the ledger keeps (part B), a refused attempt's
    # included: the result's one write carries it, on every backend.
    from execkit import AttemptOptions, run_attempt

    scene = {"ok": ("success", 0), "refused": ("overloaded_529", 1)}[story]
    stdout = (RECORDED / "claude" / scene[0] / "stdout").read_text()
    fake_vendor.register("claude", stdout=stdout, exit_code=scene[1])
    task = ledger.create_task("t", actor="me").id
    options = AttemptOptions(actor="me", start=fake_vendor.start, agent_attempts=1)
    run_attempt(ledger, task, CLAUDE, AgentRequest(prompt="hi"), options)
    (run,) = ledger.runs(task)
    read = CLAUDE.parse(spawn_result(stdout=stdout, exit_code=scene[1])).usage
    assert read is not None and read.known
    assert (run.input_tokens, run.output_tokens, run.usd_source) == (
        read.input_tokens,
        read.output_tokens,
        read.usd_source,
    )
    assert run.usd == pytest.approx(read.usd)
