"""Property tests for the ADR 0046 invariants the classifier carries."""

from __future__ import annotations

import errno
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from work_counts import c_calls, nested_unbounded_repeats, python_lines

from execkit._classify import (
    ENVIRONMENT_ERRNOS,
    TAIL_CHARS,
    FailureClass,
    classify,
    classify_text,
    patterns,
    resets,
    rules,
    stated_wait_s,
)
from execkit._exec import SpawnResult

UPSTREAM_SAMPLES = [
    "HTTP/1.1 503 Service Unavailable",
    "API Error: 529 overloaded_error",
    "Error code: 429",
    "circuit breaker is open",
    "The model is overloaded.",
    "rate limit exceeded",
]
ACCOUNT_LIMITS = [
    "insufficient_quota",
    "You exceeded your current quota",
    "Your credit balance is too low",
    "Claude AI usage limit reached",
]
STATUS_CONTEXTS = [
    "status ",
    "HTTP/1.1 ",
    "API Error: ",
    "Error code: ",
    '"code": ',
    "statusCode: ",
]


def _result(text: str, **overrides: object) -> SpawnResult:
    fields: dict[str, object] = {
        "argv": ("gemini", "-p", "task"),
        "pid": 7,
        "exit_code": 1,
        "signal": None,
        "spawn_errno": None,
        "spawn_error": None,
        "timed_out": False,
        "duration_s": 1.0,
        "stdout_tail": "",
        "stderr_tail": text,
        "stdout_bytes": 0,
        "stderr_bytes": len(text),
        "stdout_truncated": False,
        "stderr_truncated": False,
    }
    fields.update(overrides)
    return SpawnResult(**fields)  # type: ignore[arg-type]


@given(st.text(max_size=400))
def test_text_alone_is_never_environment(text: str) -> None:
    assert classify_text(text).failure_class in {FailureClass.WORK, FailureClass.UPSTREAM}


@given(st.text(alphabet=string.digits + string.punctuation + string.whitespace, max_size=400))
def test_numbers_and_punctuation_alone_are_never_upstream(text: str) -> None:
    # Default to charging: a bare number is never enough.
    assert classify_text(text).failure_class is FailureClass.WORK


@given(
    st.sampled_from(["line", "port", "processed", "max_tokens:", "took", "job", "pid", "id="]),
    st.integers(min_value=0, max_value=10**7),
    st.sampled_from(["", " files", "ms", ".", " items", ","]),
)
def test_numbers_outside_a_status_context_are_work(context: str, number: int, suffix: str) -> None:
    assert classify_text(f"{context} {number}{suffix}").failure_class is FailureClass.WORK


@given(st.sampled_from(STATUS_CONTEXTS), st.integers(min_value=100, max_value=999))
def test_a_presented_status_is_upstream_exactly_for_429_and_5xx(context: str, code: int) -> None:
    verdict = classify_text(f"{context}{code}")
    if code == 429 or 500 <= code <= 599:
        assert verdict.failure_class is FailureClass.UPSTREAM
        assert verdict.reason == f"http {code}"
    else:
        assert verdict.failure_class is FailureClass.WORK


@given(st.sampled_from(STATUS_CONTEXTS), st.integers(min_value=0, max_value=9), st.booleans())
def test_a_status_inside_a_longer_number_is_work(context: str, digit: int, front: bool) -> None:
    for code in (429, 500, 503, 529):
        number = f"{digit}{code}" if front and digit else f"{code}{digit}"
        assert classify_text(f"{context}{number}").failure_class is FailureClass.WORK


@given(
    st.sampled_from(UPSTREAM_SAMPLES),
    st.sampled_from(ACCOUNT_LIMITS),
    st.booleans(),
    st.text(alphabet=string.ascii_lowercase + " \n", max_size=80),
)
def test_an_account_limit_always_charges(upstream: str, limit: str, before: bool, gap: str) -> None:
    text = f"{limit}\n{gap}\n{upstream}" if before else f"{upstream}\n{gap}\n{limit}"
    assert classify_text(text).failure_class is FailureClass.WORK


@given(st.text(max_size=200), st.sampled_from(UPSTREAM_SAMPLES))
def test_only_the_tail_counts(noise: str, upstream: str) -> None:
    padding = "compiling crate 17 of 40\n" * (TAIL_CHARS // 24 + 1)
    text = upstream + "\n" + padding + noise
    assert classify_text(text) == classify_text(text[-TAIL_CHARS:])
    assert classify_text(upstream + "\n" + padding).failure_class is FailureClass.WORK


@given(st.text(max_size=300), st.booleans())
def test_succeeded_runs_are_never_classed(text: str, on_stdout: bool) -> None:
    where = {"stdout_tail": text, "stderr_tail": ""} if on_stdout else {"stderr_tail": text}
    assert classify(_result("", exit_code=0, **where)) is None


@given(
    st.sampled_from(sorted(errno.errorcode)),
    st.one_of(st.none(), st.text(max_size=100), st.sampled_from(UPSTREAM_SAMPLES)),
)
def test_structure_decides_a_spawn_failure(number: int, spawn_error: str | None) -> None:
    verdict = classify(
        _result("", exit_code=None, pid=None, spawn_errno=number, spawn_error=spawn_error)
    )
    assert verdict is not None
    if number in ENVIRONMENT_ERRNOS:
        # Never started for a missing precondition: ENOENT, EACCES, ENOEXEC, ENOTDIR.
        assert verdict.failure_class is FailureClass.ENVIRONMENT
        assert verdict.reason == f"spawn errno {errno.errorcode[number]}"
    else:
        assert verdict.failure_class is FailureClass.WORK
        assert verdict.reason == f"spawn errno {errno.errorcode[number]}"


@given(st.text(max_size=300))
def test_without_an_errno_nothing_is_environment(text: str) -> None:
    for overrides in ({"exit_code": 127}, {"exit_code": None, "signal": 9, "timed_out": True}):
        verdict = classify(_result(text, **overrides))
        assert verdict is not None
        assert verdict.failure_class is not FailureClass.ENVIRONMENT


@given(st.text(max_size=300), st.floats(0, 2e9))
def test_a_work_verdict_never_carries_a_wait_and_waits_are_never_negative(
    text: str, now: float
) -> None:
    verdict = classify_text(text, now=now)
    if verdict.failure_class is FailureClass.WORK:
        assert verdict.retry_after_s is None
    wait = stated_wait_s(text, now=now)
    assert wait is None or wait >= 0


@given(st.text(max_size=300))
def test_evidence_is_bounded(text: str) -> None:
    verdict = classify_text(text + "\nstatus 503 " + text)
    assert verdict.evidence is None or len(verdict.evidence) <= 200


# --- linear time ---------------------------------------------------------------------------

ADVERSARIAL_UNITS = [
    "status ",
    "status: ",
    "HTTP/1.1 ",
    "http ",
    "API Error ",
    "error code ",
    '"code": ',
    '\\"',
    "503 ",
    "4290",
    "9",
    "circuit ",
    "circuit breaker is ",
    "overloaded ",
    "error: overloaded ",
    "server is ",
    "service ",
    "rate limit ",
    "exceeded the ",
    "too many ",
    "retrying ",
    "status 503; retrying\n",
    "Reconnecting... 1/5 (status 503)\n",
    "    at f (x.js:1:2) {\n",
    "  status: 503\n",
    "}\n",
    "retry after ",
    "try again in 4 days ",
    "10 hours ",
    "usage limit reached|1753459200 ",
    "try again at 4:00 pm ",
    "ratelimiterror: 429 ",
    "503 status code (no body)",
    "\n",
    " ",
    "İ",
]
_SIZE = 1024 * 1024
_BENIGN = "INFO worker: task 17 status ok, http client ready, error count 0\n"


def _classify_whole(text: str) -> None:
    classify_text(text, tail_chars=len(text))


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def test_no_pattern_the_classifier_uses_can_backtrack_super_linearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CPython's `re` counts no steps, so the cause of super-linear matching is checked on
    # the patterns themselves: every one compiled while classifying every adversarial unit.
    used: set[str] = set()
    compiled = patterns.compiled

    def recording(source: str) -> re.Pattern[str]:
        used.add(source)
        return compiled(source)

    monkeypatch.setattr(patterns, "compiled", recording)
    for unit in ADVERSARIAL_UNITS:
        _classify_whole(_fill(unit, 4096))
        stated_wait_s(_fill(unit, 4096))
    assert len(used) >= 20  # the recording saw the classifier at work
    # Those, and every rule's patterns whether or not a unit reached them.
    declared = {alt.source for rule in rules.RULES for alt in rule.alternatives}
    declared |= {*resets.WAIT_SOURCES, resets.PART_SOURCE}
    for source in sorted(used | declared):
        assert nested_unbounded_repeats(re.compile(source, patterns.FLAGS)) == [], source


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(ADVERSARIAL_UNITS), min_size=1, max_size=4))
def test_matching_work_is_linear_on_adversarial_text(units: list[str]) -> None:
    # The Python the classifier runs per match, counted: four times the text may cost
    # about four times the lines (the matches scale with it), never sixteen; the same for
    # the regex searches it starts (a pass per pattern, and a bounded look around a match).
    unit = "".join(units)
    small, large = _fill(unit, _SIZE // 16), _fill(unit, _SIZE // 4)
    # Once first, uncounted: the first verdict a process words loads the redactor (its
    # rules file parsed, its patterns compiled), which only the larger text may reach;
    # counted, that one-time load read as super-linear work (seen: 123,410 lines, then
    # 1,352,778 for `status 503; retrying` units when no test before had loaded it).
    _classify_whole(large)
    lines_small = python_lines(lambda: _classify_whole(small))
    lines_large = python_lines(lambda: _classify_whole(large))
    assert lines_large <= 4.5 * lines_small + 2000, (lines_small, lines_large)
    searches_small = c_calls(lambda: _classify_whole(small))
    searches_large = c_calls(lambda: _classify_whole(large))
    for name in ("Pattern.search", "Pattern.finditer", "Pattern.match", "Pattern.sub"):
        assert searches_large[name] <= 4.5 * searches_small[name] + 8, (name, searches_small)
