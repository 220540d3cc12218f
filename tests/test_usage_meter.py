"""Issue #45 part A.4: usage while a run goes (`usage_of`, `UsageMeter`) and the stop seam."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from _support import spawn_result
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.claude import ClaudeAdapter
from execkit import AgentRequest, MappedResult, SpawnResult, run_agent, spawn
from execkit._exec import Line, StopTree
from execkit._meter import SPEND_LIMIT_REASON, UsageEvent, UsageMeter, read_usage
from execkit._proof import AgentStatus
from execkit._usage import Usage, UsdSource

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded"
CLAUDE = ClaudeAdapter()


def assistant(message: str, output: int, *, text: str = "working") -> str:
    """A claude stream-json `assistant` event in the CLI's own key order."""
    return json.dumps(
        {
            "type": "assistant",
            "message": {
                "id": message,
                "type": "message",
                "role": "assistant",
                "model": "claude-opus-5-5",
                "content": [{"type": "text", "text": text}],
                "usage": {"input_tokens": 10, "output_tokens": output},
            },
            "session_id": "s",
        },
        separators=(",", ":"),
    )


def line(text: str) -> Line:
    return Line("stdout", text)


# --- the meter ---------------------------------------------------------------------------------


def test_a_message_repeated_on_each_content_block_counts_once_at_its_latest_figure() -> None:
    meter = UsageMeter(CLAUDE.usage_of)
    for text in (assistant("m1", 1), assistant("m1", 1), assistant("m1", 5), assistant("m2", 2)):
        meter.on_line(line(text))
    assert meter.events == 4
    assert (meter.total.input_tokens, meter.total.output_tokens) == (20, 7)
    assert meter.total.model == "claude-opus-5-5"
    assert meter.total.usd is None


def test_the_clis_final_total_replaces_the_sum() -> None:
    recorded = (RECORDED / "claude" / "success" / "stdout").read_text().splitlines()
    meter = UsageMeter(CLAUDE.usage_of)
    for text in recorded:
        meter.on_line(line(text))
    assert meter.total == Usage(
        input_tokens=12,
        output_tokens=7,
        usd=0.000188,
        usd_source="reported",
        model="claude-opus-5-5",
    )
    # The parse reads the same figure from the same output.
    assert read_usage("\n".join(recorded), CLAUDE.usage_of) == meter.total


def test_the_limit_stops_once_at_the_first_event_past_it() -> None:
    seen: list[int] = []

    def limit(usage: Usage) -> bool:
        seen.append(usage.output_tokens)
        return usage.output_tokens >= 30

    meter = UsageMeter(CLAUDE.usage_of, limit)
    answers = [meter.on_line(line(assistant(f"m{i}", 10))) for i in range(5)]
    assert answers[:2] == [None, None]
    assert isinstance(answers[2], StopTree)
    assert answers[3:] == [None, None]  # one stop; later events are still counted
    assert meter.crossed is not None and meter.crossed.output_tokens == 30
    assert meter.total.output_tokens == 50
    assert seen == [10, 20, 30]


def test_a_line_with_no_usage_costs_no_limit_call() -> None:
    calls: list[Usage] = []

    def never(usage: Usage) -> bool:
        calls.append(usage)
        return False

    meter = UsageMeter(CLAUDE.usage_of, never)
    meter.on_line(line('{"type":"system","subtype":"init"}'))
    meter.on_line(Line("stderr", assistant("m", 3)))  # usage is read from stdout only
    assert meter.events == 0 and calls == []
    assert not meter.total.known


def test_a_reader_that_returns_something_else_is_a_type_error() -> None:
    meter = UsageMeter(lambda _line: 12)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="usage_of must return"):
        meter.on_line(line("x"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1000)), max_size=40))
def test_prop_the_meter_sums_each_messages_latest_figure(events: list[tuple[int, int]]) -> None:
    meter = UsageMeter(lambda got: None)
    latest: dict[int, int] = {}
    for message, output in events:
        meter.add(UsageEvent(Usage(output_tokens=output, model="m"), message=f"m{message}"))
        latest[message] = output
    assert meter.total.output_tokens == sum(latest.values())
    assert meter.events == len(events)


# --- the seam: a real process stopped within one usage event -----------------------------------

# Prints one new message of 100 output tokens per event, forever: only a stop ends it.
STREAMER = r"""
import json, sys
i = 0
while True:
    i += 1
    event = {"type": "assistant", "message": {"id": "msg_%d" % i, "type": "message",
             "role": "assistant", "model": "claude-opus-5-5",
             "content": [{"type": "text", "text": "step %d" % i}],
             "usage": {"input_tokens": 0, "output_tokens": 100}}}
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()
"""


class StreamingClaude:
    """claude's reading of a stand-in CLI that streams usage events (a real process)."""

    name = "claude"
    binary = sys.executable
    install_hint = "-"
    login_hint = None

    def build_argv(self, request: AgentRequest) -> list[str]:
        return [sys.executable, "-c", STREAMER]

    def parse(self, result: SpawnResult) -> MappedResult:
        return CLAUDE.parse(result)

    def usage_of(self, line: Line) -> Usage | UsageEvent | None:
        return CLAUDE.usage_of(line)


def test_a_real_process_is_stopped_at_the_usage_event_that_crosses_the_limit() -> None:
    meter = UsageMeter(CLAUDE.usage_of, lambda usage: usage.output_tokens >= 1_000)
    result = spawn([sys.executable, "-c", STREAMER], on_line=meter.on_line, timeout=120)
    assert result.stopped_by is not None and "usage limit crossed" in result.stopped_by
    assert not result.timed_out
    # The decision came on the tenth event exactly: within one event of the limit.
    assert meter.crossed is not None and meter.crossed.output_tokens == 1_000
    # What the pipes still held was read after the stop, and counted.
    assert meter.total.output_tokens >= 1_000


def test_run_agent_usage_limit_stops_the_tree_and_ends_the_agent_with_what_it_spent() -> None:
    asked: list[Usage] = []

    def limit(usage: Usage) -> bool:
        asked.append(usage)
        return usage.output_tokens >= 500

    with pytest.raises(Exception) as failed:
        run_agent(
            StreamingClaude(),
            AgentRequest(prompt="go", timeout_s=120),
            max_attempts=3,
            usage_limit=limit,
        )
    proof: Any = failed.value.proof  # type: ignore[attr-defined]
    assert proof.status is AgentStatus.FAILED
    assert proof.reason == SPEND_LIMIT_REASON
    assert proof.attempts == 1  # a stop by the limit is never retried
    assert proof.usage is not None and proof.usage.output_tokens >= 500
    assert "spend limit was crossed" in (proof.error or "")
    # The limit saw the usage priced where the table knows the model (it does not here:
    # the fake's model is not a real one) and each event once, up to the crossing one.
    assert [u.output_tokens for u in asked] == [100, 200, 300, 400, 500]
    assert all(u.usd_source is UsdSource.UNKNOWN for u in asked)


class ReplayedClaude(StreamingClaude):
    """claude's reading of a real process that prints a recorded claude run."""

    def __init__(self, recording: Path) -> None:
        self.recording = recording

    def build_argv(self, request: AgentRequest) -> list[str]:
        script = "import sys; sys.stdout.write(open(sys.argv[1]).read())"
        return [sys.executable, "-c", script, str(self.recording)]


def test_a_metered_run_records_what_the_parse_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXECKIT_PRICES", raising=False)
    recording = RECORDED / "claude" / "success" / "stdout"
    asked: list[Usage] = []

    def never(usage: Usage) -> bool:
        asked.append(usage)
        return False

    proof = run_agent(ReplayedClaude(recording), AgentRequest(prompt="x"), usage_limit=never)
    assert proof.usage == read_usage(recording.read_text(), CLAUDE.usage_of)
    assert proof.usage is not None and proof.usage.usd_source is UsdSource.REPORTED
    assert len(asked) == 2  # the assistant event, then the result's total


def test_a_later_block_that_grew_only_after_a_nested_object_is_not_taken_for_a_repeat() -> None:
    # claude-code's usage puts `cache_creation` (an object) before `output_tokens`.
    def event(output: int) -> str:
        usage = (
            '{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,'
            '"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},'
            f'"output_tokens":{output},"service_tier":"standard"}}'
        )
        return (
            '{"type":"assistant","message":{"id":"msg_nested","type":"message",'
            '"role":"assistant","model":"claude-opus-5-5","content":[{"type":"text",'
            f'"text":"x"}}],"usage":{usage},"context_management":null}},'
            f'"parent_tool_use_id":null,"session_id":"s","uuid":"u{output}"}}'
        )

    meter = UsageMeter(CLAUDE.usage_of)
    for output in (1, 1, 40):
        json.loads(event(output))  # the stand-in is valid JSON
        meter.on_line(line(event(output)))
    assert meter.total.output_tokens == 40
    assert meter.total.input_tokens == 3


def test_a_result_longer_than_a_hooked_line_still_gives_the_runs_total() -> None:
    recorded = (RECORDED / "claude" / "success" / "stdout").read_text().splitlines()[-1]
    event = json.loads(recorded)
    event["result"] = "a long final reply " * 1000  # past LINE_BYTES: the hook cuts it
    text = json.dumps(event, separators=(",", ":"))
    assert len(text.encode()) > 8 * 1024 and text.index('"usage"') < 8 * 1024
    got = CLAUDE.usage_of(Line("stdout", text[: 8 * 1024], cut=True))
    assert isinstance(got, UsageEvent) and got.final
    assert got.usage.usd == pytest.approx(0.000188)
    assert got.usage.usd_source is UsdSource.REPORTED
    assert (got.usage.input_tokens, got.usage.output_tokens) == (12, 7)


# --- vendor output never makes a reader raise ------------------------------------------------

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_usage_keys = st.sampled_from(
    [
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "cached_input_tokens",
        "input",
        "output",
        "reasoning",
        "cache",
        "cacheRead",
        "cost",
        "total_cost_usd",
        "premiumRequests",
        "prompt",
        "candidates",
        "thoughts",
        "cached",
    ]
)
_usages = st.dictionaries(_usage_keys, _values, max_size=6)
_events = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["assistant", "result", "turn.completed", "step_finish", "message_end", "x"]
        ),
        # claude's own key order (type, then message with its id first): its fast path.
        "message": st.fixed_dictionaries(
            {
                "id": st.text(max_size=8) | _values,
                "role": st.just("assistant"),
                "usage": _usages | _values,
            }
        ),
        "usage": _usages | _values,
        "part": st.fixed_dictionaries({"tokens": _usages | _values, "cost": _values}),
        "stats": st.dictionaries(_usage_keys | st.just("models"), _values, max_size=4),
        "total_cost_usd": _values,
    }
)
READERS = ["claude", "codex", "gemini", "opencode", "kilo", "pi", "qwen", "copilot"]


@settings(max_examples=300, deadline=None)
@given(_events, st.sampled_from(READERS), st.booleans())
def test_prop_a_usage_reader_never_raises_on_vendor_output(
    event: dict[str, Any], cli: str, cut: bool
) -> None:
    from execkit import get_adapter

    adapter: Any = get_adapter(cli)
    text = json.dumps(event, separators=(",", ":"))
    got = adapter.usage_of(Line("stdout", text[: len(text) // 2] if cut else text, cut))
    assert got is None or isinstance(got, Usage | UsageEvent)
    meter = UsageMeter(adapter.usage_of, lambda usage: usage.tokens > 10**40)
    meter.on_line(Line("stdout", text))
    parsed = adapter.parse(spawn_result(("x",), stdout=text + "\n"))
    assert parsed.usage is None or isinstance(parsed.usage, Usage)


def test_a_limit_crossed_only_as_the_cli_ended_by_itself_keeps_the_tries_outcome() -> None:
    # The stop a hook asks after the child's exit changes nothing (the spawn says it was
    # not stopped): the try keeps its success, with the usage it reached.
    from execkit._agent import _with_usage
    from execkit._prices import builtin_prices

    meter = UsageMeter(CLAUDE.usage_of, lambda usage: usage.output_tokens >= 7)
    for text in (RECORDED / "claude" / "success" / "stdout").read_text().splitlines():
        meter.on_line(line(text))
    assert meter.crossed is not None
    done = MappedResult(ok=True, text="pong")
    kept = _with_usage(done, meter, None, stopped=False)
    assert kept.ok and kept.usage == meter.total and kept.cost_usd == pytest.approx(0.000188)
    stopped = _with_usage(done, meter, None, stopped=True)
    assert not stopped.ok and stopped.reason == SPEND_LIMIT_REASON
    assert builtin_prices().of("claude-opus-5-5") is None  # the fake's model: not priced
