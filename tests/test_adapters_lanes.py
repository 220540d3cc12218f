"""Lane facts read from the vendor's structure (issue #28): a reset from a structured field
is marked so and may park a lane; a reset named only in prose waits but never parks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _support import spawn_result

from adapters.claude import ClaudeAdapter
from execkit import SpawnResult
from execkit._attempt import _LANE_STOPS
from execkit._classify import FailureClass


def _spawn(stdout: str) -> SpawnResult:
    return spawn_result(("claude", "-p"), exit_code=1, stdout=stdout)


def _result(text: str) -> dict[str, object]:
    return {"type": "result", "subtype": "success", "is_error": True, "result": text}


def test_a_claude_rate_limit_event_gives_a_structured_reset() -> None:
    reset = int(time.time()) + 3600
    lines = [
        {"type": "system", "subtype": "init"},
        {
            "type": "rate_limit_event",
            "rate_limit_info": {
                "status": "rejected",
                "resetsAt": reset,
                "rateLimitType": "five_hour",
            },
        },
        _result("Claude usage limit reached. Your limit will reset at 3pm."),
    ]
    mapped = ClaudeAdapter().parse(_spawn("\n".join(json.dumps(line) for line in lines)))
    assert mapped.failure_class is FailureClass.UPSTREAM
    # Whole seconds: read to the end of the stated second.
    assert mapped.retry_after_s is not None and 3500 < mapped.retry_after_s <= 3601
    assert mapped.reset_from_structure


def test_an_allowed_rate_limit_event_and_a_prose_reset_do_not_count_as_structure() -> None:
    lines = [
        {"type": "rate_limit_event", "rate_limit_info": {"status": "allowed", "resetsAt": 1}},
        _result("API Error: 429 rate limited, try again in 30 seconds"),
    ]
    mapped = ClaudeAdapter().parse(_spawn("\n".join(json.dumps(line) for line in lines)))
    assert not mapped.reset_from_structure


RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "claude"


@pytest.mark.parametrize(
    ("cell", "cause", "fix"),
    [
        ("auth_401_stream", "credentials", "ANTHROPIC_API_KEY"),
        ("payment_402_stream", "billing", "billing: add credits"),
    ],
)
def test_a_stream_json_refusal_stops_the_lane_from_its_error_event(
    cell: str, cause: str, fix: str
) -> None:
    # The recorded stream (claude-code 2.1.332 against the loopback fake API), as recorded,
    # then with its result envelope naming no error type, then cut before the envelope (a
    # run killed after the refusal): each time the assistant event's `error` names the
    # cause, and the lane stops with the fix named.
    lines = (RECORDED / cell / "stdout").read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    untyped = [
        {k: v for k, v in e.items() if k != "api_error_type"} if e["type"] == "result" else e
        for e in events
    ]
    cut = [e for e in events if e["type"] != "result"]
    for stream in (events, untyped, cut):
        mapped = ClaudeAdapter().parse(_spawn("\n".join(json.dumps(e) for e in stream)))
        assert mapped.failure_class is FailureClass.ENVIRONMENT, (cell, mapped)
        assert _LANE_STOPS.get(mapped.reason or "") == cause, mapped.reason
        assert fix in (mapped.precondition or ""), mapped.precondition


def test_claude_stream_json_reads_what_json_reads() -> None:
    # Issue 51 item 7: stream-json is the default argv; its last event is the envelope json
    # prints alone, so every field read from one is read from the other.
    envelope = {
        "type": "result",
        "subtype": "success",
        "is_error": True,
        "api_error_status": 529,
        "api_error_type": "overloaded_error",
        "result": "API Error: Repeated 529 Overloaded errors",
        "session_id": "s-1",
    }
    stream = "\n".join(
        json.dumps(line)
        for line in (
            {"type": "system", "subtype": "init", "session_id": "s-1"},
            {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 529},
            envelope,
        )
    )
    as_json = ClaudeAdapter().parse(_spawn(json.dumps(envelope)))
    as_stream = ClaudeAdapter().parse(_spawn(stream))
    assert as_stream == as_json
    assert (as_stream.failure_class, as_stream.reason) == (FailureClass.UPSTREAM, "http 529")


def test_claude_error_subtypes_say_their_errors() -> None:
    # An error subtype's envelope has no `result`: its `errors` are the message.
    envelope = {
        "type": "result",
        "subtype": "error_during_execution",
        "is_error": True,
        "errors": ["API Error: 529 Overloaded"],
    }
    mapped = ClaudeAdapter().parse(_spawn(json.dumps(envelope)))
    assert mapped.error is not None and "529 Overloaded" in mapped.error
    assert (mapped.failure_class, mapped.reason) == (FailureClass.UPSTREAM, "http 529")


def test_a_claude_stream_killed_while_retrying_is_upstream() -> None:
    # The stream's last event is claude's own retry of a 503: it was killed still retrying.
    lines = [
        {"type": "system", "subtype": "init"},
        {
            "type": "system",
            "subtype": "api_retry",
            "attempt": 3,
            "max_retries": 10,
            "retry_delay_ms": 2400,
            "error_status": 503,
            "error": "server_error",
        },
    ]
    stdout = "\n".join(json.dumps(line) for line in lines)
    timed_out = spawn_result(("claude", "-p"), exit_code=None, stdout=stdout, timed_out=True)
    mapped = ClaudeAdapter().parse(timed_out)
    assert (mapped.failure_class, mapped.reason) == (FailureClass.UPSTREAM, "http 503")
    assert mapped.error is not None and "still retrying (attempt 3/10)" in mapped.error
