"""Adapter invariants over any vendor output: parse never raises, ENOENT is always
environment, a structured status is an HTTP status only when it is one, and nothing
is uncharged unless positively identified."""

from __future__ import annotations

import errno
import json

import pytest
from _support import spawn_result
from hypothesis import given, settings
from hypothesis import strategies as st

import adapters
from execkit import Adapter, AgentRequest, Envelope, get_adapter, map_result
from execkit._classify import FailureClass
from execkit.adapterkit import http_status

VENDORS = ("codex", "claude", "gemini", "opencode", "generic")


def adapter_for(vendor: str) -> Adapter:
    if vendor == "generic":
        return adapters.GenericAdapter(command=("mytool",))
    return get_adapter(vendor)


# Keys and values the vendors' envelopes use, so generated documents reach the parsers'
# deep branches instead of being dismissed as unrecognised.
KEYS = st.sampled_from(
    [
        "type",
        "subtype",
        "is_error",
        "result",
        "api_error_status",
        "session_id",
        "total_cost_usd",
        "error",
        "code",
        "status",
        "statusCode",
        "message",
        "name",
        "data",
        "response",
        "item",
        "text",
        "part",
        "cost",
        "thread_id",
        "sessionID",
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(
        [
            "result",
            "error",
            "error_max_turns",
            "turn.failed",
            "turn.completed",
            "item.completed",
            "agent_message",
            "step_finish",
            "text",
            "API Error: 529 overloaded",
            "Retry-After: 30",
        ]
    )
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=12,
)


@st.composite
def vendor_outputs(draw: st.DrawFn) -> str:
    """Text a vendor CLI might print: JSON documents or lines (NaN included), or noise."""
    parts = draw(
        st.lists(
            st.one_of(
                JSON_VALUES.map(lambda value: json.dumps(value, allow_nan=True)),
                st.text(max_size=40),
            ),
            max_size=4,
        )
    )
    return "\n".join(parts)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(VENDORS),
    vendor_outputs(),
    vendor_outputs(),
    st.sampled_from([0, 1, 2, 127, None]),
    st.booleans(),
)
def test_prop_parse_never_raises_and_never_grants_a_free_pass(
    vendor: str, stdout: str, stderr: str, exit_code: int | None, timed_out: bool
) -> None:
    signal = 9 if exit_code is None else None
    result = spawn_result(
        (vendor,),
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        signal=signal,
        timed_out=timed_out,
    )
    raw = adapter_for(vendor).parse(result)
    if raw.ok:
        # Success only for a process that exited 0 in time.
        assert result.ok
        assert raw.failure_class is None and raw.error is None
    else:
        assert raw.failure_class is not None and raw.reason
    # The process ran: environment comes only from what a vendor adapter read in the
    # vendor's structured output (a 401/403, a credential or billing error), always naming
    # the fix; the text-only generic adapter never says environment.
    if raw.failure_class is FailureClass.ENVIRONMENT:
        assert vendor != "generic"
        assert raw.precondition is not None
        assert raw.reason in {"http 401", "http 402", "http 403", "credentials", "billing"}
    else:
        assert raw.precondition is None
    if raw.retry_after_s is not None:
        assert raw.failure_class is FailureClass.UPSTREAM and raw.retry_after_s >= 0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(VENDORS), vendor_outputs(), vendor_outputs())
def test_prop_enoent_is_environment_for_every_adapter(
    vendor: str, stdout: str, stderr: str
) -> None:
    adapter = adapter_for(vendor)
    argv = tuple(adapter.build_argv(AgentRequest(prompt="x")))
    result = spawn_result(
        argv,
        spawn_errno=errno.ENOENT,
        spawn_error=f"executable not found: {argv[0]}",
        stdout=stdout,
        stderr=stderr,
    )
    raw = adapter.parse(result)
    assert raw.failure_class is FailureClass.ENVIRONMENT
    assert raw.spawn_errno == errno.ENOENT
    assert raw.precondition is not None
    assert raw.precondition.startswith(f"{argv[0]} CLI not found on PATH; install: ")


@pytest.mark.parametrize(
    "status", ["NaN", "Infinity", "-Infinity", "1e400", "1000", "503.5", "99", '"503"']
)
def test_claude_non_http_api_error_status_is_not_a_status(status: str) -> None:
    # A status that is not a whole number in 100..599 must neither raise nor go uncharged.
    stdout = (
        '{"type": "result", "subtype": "success", "is_error": true, '
        f'"result": "request failed", "api_error_status": {status}}}'
    )
    raw = get_adapter("claude").parse(spawn_result(("claude",), exit_code=1, stdout=stdout))
    assert (raw.failure_class, raw.reason) == (FailureClass.WORK, "default")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (503.0, 503),
        (429, 429),
        (100, 100),
        (599, 599),
        (600, None),
        (99, None),
        (503.5, None),
        (float("nan"), None),
        (float("inf"), None),
    ],
)
def test_http_status_accepts_only_whole_numbers_in_range(
    value: float | None, expected: int | None
) -> None:
    assert http_status(value) == expected


@pytest.mark.parametrize(("status", "cls"), [(599, "upstream"), (600, "work"), (1000, "work")])
def test_a_structured_status_above_599_is_not_upstream(status: int, cls: str) -> None:
    # A third-party adapter may fill Envelope.http_status without range-checking it.
    envelope = Envelope(found=True, is_error=True, error_message="x", http_status=status)
    raw = map_result(get_adapter("codex"), spawn_result(("codex",), exit_code=1), envelope)
    assert raw.failure_class is not None
    assert raw.failure_class.value == cls


def _gemini_error(code: int) -> str:
    return json.dumps({"error": {"type": "ApiError", "message": "failed", "code": code}})


@pytest.mark.parametrize(
    ("code", "cls", "reason"),
    [(503, "upstream", "http 503"), (429, "upstream", "http 429"), (5030, "work", "default")],
)
def test_gemini_reads_its_structured_error_code(code: int, cls: str, reason: str) -> None:
    raw = get_adapter("gemini").parse(
        spawn_result(("gemini",), exit_code=1, stderr=_gemini_error(code))
    )
    assert raw.failure_class is not None
    assert (raw.failure_class.value, raw.reason) == (cls, reason)
