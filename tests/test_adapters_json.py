"""execkit.adapterkit's readers of vendor output: `last_json_value` (the envelope at the end of
a stream of warnings, stack traces and partial lines, in linear time), `load_json_document`,
`json_object`, `header_wait_s` and `parse_retry_after`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from work_counts import python_lines

import execkit.adapterkit as adapterkit
from execkit.adapterkit import (
    header_wait_s,
    json_object,
    last_json_value,
    load_json_document,
    parse_retry_after,
)

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded"

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)
CONTAINERS = st.one_of(
    st.lists(JSON, max_size=4), st.dictionaries(st.text(max_size=8), JSON, max_size=4)
)
# Noise with everything a stack trace or a warning holds, closers included.
NOISE = st.text(alphabet=st.sampled_from(list('{}[]"\\ \n\tabc:,0at()')), max_size=200)
# What may follow the envelope: partial lines, `{` floods, quotes; nothing that closes.
TRAILER = st.text(alphabet=st.sampled_from(list('{["\\ \tabc:,0')), max_size=200)


@given(NOISE, CONTAINERS, TRAILER, st.sampled_from([None, 2]))
def test_the_last_complete_value_is_found_whatever_surrounds_it(
    noise: str, value: Any, trailer: str, indent: int | None
) -> None:
    text = f"{noise}\n{json.dumps(value, indent=indent)}\n{trailer}"
    assert last_json_value(text) == value


@given(st.text(max_size=300))
def test_any_text_is_answered_without_raising(text: str) -> None:
    found = last_json_value(text)
    assert found is None or isinstance(found, dict | list)
    assert load_json_document(text) is None or True


@given(st.lists(CONTAINERS, min_size=2, max_size=4), NOISE)
def test_the_last_of_several_values_wins(values: list[Any], noise: str) -> None:
    text = "\n".join(f"{noise}\n{json.dumps(v)}" for v in values)
    assert last_json_value(text) == values[-1]


def test_the_gemini_envelope_after_a_node_stack_trace_is_found() -> None:
    for cell in ("auth_401", "flaky_503_then_400", "unavailable_503", "rate_limit_429"):
        stderr = (RECORDED / "gemini" / cell / "stderr").read_text(encoding="utf-8")
        envelope = last_json_value(stderr)
        assert isinstance(envelope, dict) and "session_id" in envelope, cell
        assert load_json_document(stderr) == envelope


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('x {"a": {"b": [1, 2]}} y', {"a": {"b": [1, 2]}}),
        ('{"a": "} { \\" ]"}', {"a": '} { " ]'}),
        ("at f (x.js:1:2) {\n  status: 401\n}\n", None),  # an inspected object is not JSON
        ('{"a": 1}\n}\n', {"a": 1}),  # a stray closer after it
        ('{"a": 1}\n{"type":"item.comp', {"a": 1}),  # a partial line after it
        ('[1, 2] {"cut": ', [1, 2]),
        ("{" * 1000, None),
        ("}" * 1000, None),
        ("[" * 5000 + "]" * 5000, None),  # too deep to be an envelope: never raises
        ("", None),
    ],
)
def test_last_json_value_shapes(text: str, value: Any) -> None:
    assert last_json_value(text) == value


# --- linear time -------------------------------------------------------------------------

ADVERSARIAL = [
    "{",
    "}",
    "{}",
    "[",
    "]",
    '{"a":',
    '{"a":{"a":',
    '"',
    '\\"',
    "\\",
    "[{",
    "}]",
    '{"a": 1} x',
    "{x}",
    "\n",
]


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _work(text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """(Python lines run, characters handed to the JSON decoder) for one scan of `text`:
    the scanner's own loops are Python, and the decoder's work is its input's length."""
    decoded = 0
    decoder = adapterkit._DECODER

    class Counting:
        def raw_decode(self, piece: str) -> tuple[Any, int]:
            nonlocal decoded
            decoded += len(piece)
            return decoder.raw_decode(piece)

    monkeypatch.setattr(adapterkit, "_DECODER", Counting())
    lines = python_lines(lambda: last_json_value(text))
    monkeypatch.setattr(adapterkit, "_DECODER", decoder)
    return lines, decoded


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(ADVERSARIAL), min_size=1, max_size=4))
def test_adversarial_floods_cost_linear_work(units: list[str]) -> None:
    # Counted, not timed: a bounded number of the scanner's Python lines per character
    # (measured at most 11 on these floods; a quadratic scan of 50,000 characters would run
    # a billion), and the decoder never reads more than its budget of eight times the text.
    # Sizes are not compared with each other: where the cut of the flood falls decides
    # whether a value is found early, so the work is linear but not monotone in the size.
    with pytest.MonkeyPatch.context() as monkeypatch:
        text = _fill("".join(units), 50_000)
        lines, decoded = _work(text, monkeypatch)
    assert lines <= 16 * len(text) + 1000, lines
    assert decoded <= 8 * len(text) + 4096, decoded


def test_doubling_the_input_about_doubles_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    unit = '{"a":{"b":[1,'
    lines_small, decoded_small = _work(unit * 2_000, monkeypatch)
    lines_large, decoded_large = _work(unit * 8_000, monkeypatch)
    # Four times the input: about 4x when linear, about 16x when quadratic.
    assert lines_large < 4.5 * lines_small
    assert decoded_large <= 4.5 * decoded_small + 8192


# --- small readers -----------------------------------------------------------------------


def test_json_object_reads_only_a_whole_object() -> None:
    assert json_object('{"error": {"code": 503}}') == {"error": {"code": 503}}
    assert json_object(' {"a": 1} ') == {"a": 1}
    for text in ("[1]", "x {}", "{bad}", None, 3, ""):
        assert json_object(text) is None


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "17"}, 17.0),
        ({"Retry-After": "17"}, 17.0),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": 30}, 30.0),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),  # a date long past: no wait
        ({"retry-after": "soon"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": True}, None),
        ({}, None),
        (None, None),
        ("retry-after: 5", None),
    ],
)
def test_header_wait_s(headers: object, wait: float | None) -> None:
    assert header_wait_s(headers) == wait


def test_header_wait_s_reads_an_http_date_on_the_given_clock() -> None:
    date = "Thu, 03 Dec 2026 16:00:00 GMT"
    now = 1796313600.0 - 4123.0  # that date in epoch seconds, minus 4123 s
    # An HTTP date is whole seconds: read to the end of that second.
    assert header_wait_s({"retry-after": date}, now=now) == pytest.approx(4124.0)


@pytest.mark.parametrize(
    ("text", "wait"),
    [
        ("try again in 4 days 10 hours 3 minutes", 4 * 86400 + 10 * 3600 + 180),
        ("try again in 4 days", 4 * 86400),  # not 4 seconds
        ('"retryDelay": "17s"', 17.0),
        ("Claude AI usage limit reached|1753459200", 9201.0),  # to the end of its second
        ("retry in 3 attempts", None),
    ],
)
def test_parse_retry_after_reads_the_vendors_resets(text: str, wait: float | None) -> None:
    got = parse_retry_after(text, now=1_753_450_000.0)
    assert got == (pytest.approx(wait) if wait is not None else None)
