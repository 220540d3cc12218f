"""execkit._classify: the structural rules, every row of the documented list, hard negatives."""

from __future__ import annotations

import errno
import functools
import json
import re

import _support
import attrs
import pytest

from execkit._classify import (
    EVIDENCE_CHARS,
    TAIL_CHARS,
    Classification,
    FailureClass,
    classification_fields,
    classify,
    classify_text,
    rules,
    scan,
    stated_wait_s,
)
from execkit._errors import InvalidInput
from execkit._exec import SpawnFailure

# A failed codex spawn unless a test says otherwise.
spawn_result = functools.partial(_support.spawn_result, exit_code=1)


def assert_text_verdict(text: str, failure_class: FailureClass, reason: str) -> None:
    verdict = classify_text(text)
    assert verdict.failure_class is failure_class, verdict
    assert verdict.reason == reason


def deciding_rule(text: str) -> str | None:
    """The name of the rule that decided `text` (None when nothing matched)."""
    decided = scan.decide(text)
    return None if decided is None else decided[1].rule


# --- the documented table ------------------------------------------------------------------


def _table_rows() -> list[tuple[str, str, str, list[str]]]:
    """(rule, class, reason, examples) per rule, continuation rows folded into their rule."""
    doc = rules.__doc__
    assert doc is not None
    rows: list[tuple[str, str, str, list[str]]] = []
    for line in doc.splitlines():
        if not line.startswith("| ") or line.startswith("| rule "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rule, cls, reason, examples = cells
        found = re.findall(r"`([^`]+)`", examples)
        if not rule:
            rows[-1][3].extend(found)
            continue
        rows.append((rule.strip("`"), cls, reason.strip("`"), found))
    return rows


TABLE = _table_rows()
SPECIAL_ROWS = {"retry-notice", "(none)"}


def test_the_table_documents_exactly_the_rules_in_the_code() -> None:
    names = [row[0] for row in TABLE]
    assert len(names) == len(set(names))
    code_rules = {rule.name for rule in rules.RULES}
    assert set(names) - SPECIAL_ROWS == code_rules
    assert set(names) >= SPECIAL_ROWS
    assert all(row[3] for row in TABLE), "every row shows at least one example"


def test_the_table_and_the_code_agree_row_for_row() -> None:
    # One table in two forms: the docstring's rows are the code's rules in the same order
    # (the order breaks ties), each with the class its group gives and the reason it names.
    documented = [row for row in TABLE if row[0] not in SPECIAL_ROWS]
    assert [row[0] for row in documented] == [rule.name for rule in rules.RULES]
    groups = [
        (rules.NUMERIC_RULES, "upstream"),
        (rules.UPSTREAM_WORDING, "upstream"),
        (rules.ACCOUNT_LIMITS, "work"),
    ]
    in_code = {
        rule.name: (cls, "http N" if rule.reason is None else rule.reason)
        for group, cls in groups
        for rule in group
    }
    assert {name: (cls, reason) for name, cls, reason, _ in documented} == in_code


@pytest.mark.parametrize(
    ("rule", "cls", "reason", "example"),
    [
        pytest.param(rule, cls, reason, example, id=f"{rule}:{example}")
        for rule, cls, reason, examples in TABLE
        if rule not in SPECIAL_ROWS
        for example in examples
    ],
)
def test_every_documented_example_classifies_as_its_row_says(
    rule: str, cls: str, reason: str, example: str
) -> None:
    verdict = classify_text(example)
    assert verdict.failure_class.value == cls
    if reason == "http N":
        code = re.search(r"\d{3}", example)
        assert code is not None
        assert verdict.reason == f"http {code.group()}"
    else:
        assert verdict.reason == reason
    assert deciding_rule(example) == rule
    assert verdict.evidence is not None and verdict.evidence in example


@pytest.mark.parametrize(
    "example", [ex for rule, _, _, exs in TABLE if rule == "(none)" for ex in exs]
)
def test_documented_non_signals_are_work_default(example: str) -> None:
    assert classify_text(example) == Classification(FailureClass.WORK, "default")


def test_retry_notice_row() -> None:
    notice = "stream error: unexpected status 503 Service Unavailable; retrying 1/5 in 212ms…"
    # More output followed: the retry went on, so the notice is not the outcome.
    assert classify_text(notice + "\nERROR: 1 failed, 7 passed").reason == "default"
    # The run ended on the notice (killed while retrying): it is the outcome.
    assert classify_text(notice + "\n\n").reason == "http 503"
    # A final error line after notices still counts.
    final = notice + "\nERROR: exceeded retry limit, last status: 503 Service Unavailable"
    assert classify_text(final).failure_class is FailureClass.UPSTREAM


def test_retry_notice_does_not_hide_an_account_limit() -> None:
    text = "429 Too Many Requests insufficient_quota; retrying 1/3\nError: gave up"
    assert classify_text(text) == Classification(
        FailureClass.WORK,
        "insufficient quota",
        "429 Too Many Requests insufficient_quota; retrying 1/3",
    )


# --- hard negatives and precision details --------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "HTTP 404",
        "HTTP/1.1 404 Not Found",
        "unexpected status 401 Unauthorized",
        "Error code: 400 - {'type': 'invalid_request_error'}",
        "'code': 'context_length_exceeded'",
        "processed 500 files",
        'File "app.py", line 503, in handler',
        "max_tokens: 4290 > 4096",
        "Port 5000 is in use",
        "status 4290",
        "status: 5030",
        "status 1503",
        "HTTP/1.1 200 OK",
        "status 503.5",
        "status: 500/1000 files",
        "status 503 of 1000 documents",
        "status 50%",
        "status_503_handler failed",
        "E       assert resp.status == 503",
        "E       assert response.status_code == 429",
        "assert http_status==502",
        'assert payload["code"] == 500',
        "request_id=req_5034a429be took 429ms",
        "2025-05-03T05:03:29.503Z job 529 failed",
        "http://500.example.test/ refused",
        "HTTPStatus.SERVICE_UNAVAILABLE != resp.status",
        "FAILED tests/test_rate_limit.py::test_rate_limit_exceeded - assert 200 == 429",
        "FAILED test_service_unavailable_is_retried",
        "TypeError: RateLimitExceeded is not a constructor",
        "error: call of overloaded 'clamp(double, int, int)' is ambiguous",
        "error: overloaded function with no contextual type information",
        "error: Overloaded function signatures 1 and 2 overlap",
        "BlockingIOError: [Errno 11] Resource temporarily unavailable",
        "short-circuit open path skipped",
        "test_circuit_open expected 'open'",
        "bash: codex: command not found",
        "Error: connect ECONNREFUSED 127.0.0.1:8080",
        "getaddrinfo ENOTFOUND api.anthropic.com",
        "API Error: Request timed out.",
        "exit status 1",
        "the generated iterate() keeps a separate rate table",
        # Hard negatives of the SDK, high-demand, unreachable and RESOURCE_EXHAUSTED rows.
        "class RateLimitError(Exception):",
        "AssertionError: RateLimitError not raised",
        "app.errors.RateLimitError: too many widgets in cart (limit 500)",
        "from openai import InternalServerError, RateLimitError",
        'E       assert str(err) == "503 status code (no body)"',
        "We are experiencing high demand for tickets, please wait.",
        "currently experiencing high demand",
        "    except anthropic.APIConnectionError:",
        "class APIConnectionError(ConnectionError):",
        "myapp.APIConnectionError: database is down",
        "assert status == Status.RESOURCE_EXHAUSTED",
        "RESOURCE_EXHAUSTED",
        "TypeError: fetch failed",
        "Cannot connect to API: Unable to connect. Is the computer able to access the url?",
        "Reconnecting... waiting for network (Connection failed: error sending request)",
        "Attempt 4 failed. Retrying with backoff... Error: exception TypeError: fetch failed",
    ],
)
def test_hard_negatives_are_work(text: str) -> None:
    verdict = classify_text(text)
    assert verdict.failure_class is FailureClass.WORK, verdict
    assert verdict.charged


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "Error code: 429 - {'error': {'message': 'You exceeded your current quota', "
            "'type': 'insufficient_quota'}}",
            "insufficient quota",
        ),
        ("status 503 then: please check your plan and billing details", "billing"),
        ("usage limit reached.\nHTTP/1.1 503 Service Unavailable", "usage limit"),
        # A reset stated BEFORE the account limit is not its reset.
        ("retry after 5s\nYour credit balance is too low", "billing"),
        ("You've hit your usage limit. Upgrade to Pro or try again later.", "usage limit"),
    ],
)
def test_account_limits_veto_upstream_anywhere_in_the_tail(text: str, reason: str) -> None:
    assert_text_verdict(text, FailureClass.WORK, reason)
    assert classify_text(text).retry_after_s is None


NOW = 1_753_450_000.0


@pytest.mark.parametrize(
    ("text", "reason", "wait"),
    [
        # An epoch in whole seconds is read to the end of its second.
        ("API Error: 529 overloaded; Claude AI usage limit reached|1753459200", "http 529", 9201),
        ("Claude AI usage limit reached|1753459200", "usage limit", 9201),
        # A reset already past still lifts the veto, but states nothing to wait for.
        ("Claude AI usage limit reached|1753000000", "usage limit", "past"),
        (
            "You've hit your usage limit. Upgrade to Pro or try again in "
            "4 days 10 hours 3 minutes.",
            "usage limit",
            4 * 86400 + 10 * 3600 + 180,
        ),
        (
            '{"error":{"code":429,"message":"You exceeded your current quota, please check '
            'your plan and billing details.\\nPlease retry in 17.0s.",'
            '"status":"RESOURCE_EXHAUSTED"}}',
            "http 429",
            17,
        ),
        (
            "You have exhausted your capacity on this model. Your quota will reset after 2h52m39s."
            " usage limit",
            "default",
            None,
        ),
    ],
)
def test_a_stated_reset_after_an_account_limit_makes_it_upstream(
    text: str, reason: str, wait: float | str | None
) -> None:
    verdict = classify_text(text, now=NOW)
    if wait is None:
        # The reset came first and the limit after it: still the veto.
        assert verdict.failure_class is FailureClass.WORK
        return
    assert (verdict.failure_class, verdict.reason) == (FailureClass.UPSTREAM, reason)
    if wait == "past":
        assert verdict.retry_after_s is None
    else:
        assert verdict.retry_after_s == pytest.approx(wait)


@pytest.mark.parametrize(
    ("text", "wait"),
    [
        ("Retry-After: 30", 30.0),
        ("retry-after-ms: 1500", 1.5),
        ('"retryDelay": "17s"', 17.0),
        ("retryDelayMs: 17000,", 17.0),
        ("Please retry in 7200.0s.", 7200.0),
        ("Suggested retry after 17s.. Retrying after 17268ms...", 17.0),
        ("try again in 4 days 10 hours 3 minutes", 4 * 86400 + 10 * 3600 + 180),
        ("Your quota will reset after 2h52m39s.", 2 * 3600 + 52 * 60 + 39),
        ('"resets_in_seconds": 4123', 4123.0),
        ('"resets_at": 1753459200', 9201.0),  # to the end of the stated second
        ("usage limit reached|1753459200", 9201.0),
        ('"resets_at": 1753000000', None),  # already past: no wait, not 0
        ("Retrying in 8 seconds… (attempt 4/10)", None),  # the CLI's own backoff
        ("retry in 5 attempts", None),  # a count, not a duration
        ("try again later", None),
        ("", None),
    ],
)
def test_stated_waits(text: str, wait: float | None) -> None:
    got = stated_wait_s(text, now=NOW)
    assert got == (pytest.approx(wait) if wait is not None else None)


def test_codex_wall_clock_resets_are_local_time() -> None:
    import time

    now = time.mktime((2026, 12, 3, 14, 51, 0, 0, 0, -1))
    # Printed to the minute (rounded down): read to the end of that minute.
    same_day = stated_wait_s("or try again at 4:00 PM.", now=now)
    assert same_day == pytest.approx(70 * 60)
    dated = stated_wait_s("try again at Dec 4th, 2026 4:00 PM.", now=now)
    assert dated == pytest.approx(70 * 60 + 86400, abs=3600)  # a DST change moves it an hour
    # Printed today but already past when read (a clock or zone mismatch): no wait at all.
    assert stated_wait_s("try again at 9:15 AM", now=now) is None
    assert stated_wait_s("try again at 13:00 PM", now=now) is None


def test_the_last_status_decides() -> None:
    # A retried 503 then a final 400: the 400 failed the run.
    assert_text_verdict(
        "HTTP/1.1 503 Service Unavailable\nHTTP/1.1 400", FailureClass.WORK, "default"
    )
    assert_text_verdict('status 503\n{"error": {"code": 401}}', FailureClass.WORK, "default")
    # Wording before the last (non-upstream) status is barred too; after it, it counts.
    assert_text_verdict("model is overloaded\nstatus 404", FailureClass.WORK, "default")
    assert_text_verdict("status 404\nmodel is overloaded", FailureClass.UPSTREAM, "overloaded")
    # An upstream status last still decides.
    assert_text_verdict("HTTP 400\nHTTP 503", FailureClass.UPSTREAM, "http 503")


def test_gemini_notices_with_their_stack_traces_are_not_the_final_error() -> None:
    notice = (
        "Attempt 1 failed with status 503. Retrying with backoff... _ApiError: {...}\n"
        "    at throwErrorIfNotOK (file:///x/chunk.js:267833:24)\n"
        "    at async Turn.run (file:///x/chunk.js:333001:24) {\n"
        "  status: 503\n"
        "}\n"
    )
    # Killed while still retrying: the notice (with its inspected status) is the outcome.
    assert classify_text(notice).reason == "http 503"
    # The retry went on and something else failed: the notice's status is not counted.
    assert classify_text(notice + "Error: tool run_tests failed\n").reason == "default"


def test_codex_reconnecting_banners_are_notices() -> None:
    banner = (
        '{"type":"error","message":'
        '"Reconnecting... 1/5 (unexpected status 503 Service Unavailable)"}'
    )
    assert classify_text(banner).reason == "http 503"
    later = banner + '\n{"type":"turn.failed","error":{"message":"tests failed"}}'
    assert classify_text(later).reason == "default"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('"http_status": 503', "http 503"),
        ('"error_code": 429', "http 429"),
        ("'http_code': 502", "http 502"),
        ("HTTP/2 503", "http 503"),
        ("x-status: 529", "http 529"),
        ("unexpected status 503 Service Unavailable", "http 503"),
        ("[API Error: got status: 500 Internal Server Error.]", "http 500"),
        ("urllib.error.HTTPError: HTTP Error 503: Service Unavailable", "http 503"),
        ("That model is currently overloaded with other requests.", "overloaded"),
        ("Our servers are currently overloaded", "overloaded"),
        ("Error: Rate limited. Retry later.", "rate limited"),
        ("You have been rate-limited by the API", "rate limited"),
        ("exceeded token rate limit of your current tier", "rate limited"),
        ("CircuitOpenError: provider openai", "circuit open"),
        ("circuit breaker state: OPEN", "circuit open"),
        ("anthropic.InternalServerError: Error code: 529 - {'type': 'error'}", "http 529"),
        ("InternalServerError: 500 status code (no body)", "http 500"),
        ("503 status code (no body)", "http 503"),
        ("google.api_core.exceptions.ServiceUnavailable: 503 Connection reset", "http 503"),
        ("openai.APIConnectionError: Connection error.", "vendor unreachable"),
        ('{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}', "http 429"),
        ('{"error": {"status": "RESOURCE_EXHAUSTED"}}', "rate limited"),
        (
            "We\u2019re currently experiencing high demand, which may cause temporary errors.",
            "overloaded",
        ),
    ],
)
def test_more_upstream_shapes(text: str, reason: str) -> None:
    assert_text_verdict(text, FailureClass.UPSTREAM, reason)


def test_a_numeric_status_beats_wording_and_the_latest_wins() -> None:
    text = "circuit breaker is open\nstatus 503\nrate limit exceeded\nAPI Error: 429"
    assert classify_text(text).reason == "http 429"
    assert classify_text("status 502\nstatus 503").reason == "http 503"
    assert classify_text("Too Many Requests\ncircuit open").reason == "circuit open"


def test_nested_json_escapes_are_read() -> None:
    text = '{"message":"{\\n \\"code\\": 503,\\n \\"status\\": \\"UNAVAILABLE\\"}"}'
    assert classify_text(text).reason == "http 503"


def test_only_the_tail_is_read() -> None:
    head = "HTTP/1.1 503 Service Unavailable\n"
    filler = "building module 42 of 97: ok\n" * (TAIL_CHARS // 20)
    text = head + filler + "ERROR: 1 failed"
    assert len(text) - len(head) >= TAIL_CHARS
    assert classify_text(text).reason == "default"
    assert classify_text(text, tail_chars=len(text)).reason == "http 503"


def test_evidence_is_bounded_and_keeps_the_match() -> None:
    line = "x" * 3000 + " unexpected status 503 Service Unavailable " + "y" * 3000
    verdict = classify_text(line)
    assert verdict.reason == "http 503"
    assert verdict.evidence is not None
    assert len(verdict.evidence) <= EVIDENCE_CHARS
    assert "status 503" in verdict.evidence


def test_evidence_offsets_survive_characters_that_change_length_when_lowered() -> None:
    # "İ".lower() is two characters; matching must still point at the right place.
    text = "İ" * 40 + "\n" + "İ" * 10 + " API Error: 529 " + "İ" * 5
    verdict = classify_text(text)
    assert verdict.reason == "http 529"
    assert verdict.evidence is not None and "API Error: 529" in verdict.evidence


def test_classify_text_is_never_environment() -> None:
    for text in ["spawn errno ENOENT", "No such file or directory: 'codex'", "exit 127"]:
        assert classify_text(text).failure_class is not FailureClass.ENVIRONMENT


# --- classify: the structural rules --------------------------------------------------------


def test_a_succeeded_run_is_never_classed() -> None:
    ok = spawn_result(exit_code=0, stderr="status 503 Service Unavailable")
    assert classify(ok) is None
    assert classification_fields(ok) == {
        "class": None,
        "reason": None,
        "evidence": None,
        "retry_after_s": None,
    }


def test_enoent_is_environment() -> None:
    result = spawn_result(
        spawn_errno=errno.ENOENT, spawn_error="[Errno 2] No such file or directory: 'codex'"
    )
    verdict = classify(result)
    assert verdict == Classification(
        FailureClass.ENVIRONMENT,
        "spawn errno ENOENT",
        "[Errno 2] No such file or directory: 'codex'",
    )
    assert not verdict.charged


def test_a_missing_working_directory_is_environment() -> None:
    result = spawn_result(
        spawn_errno=errno.ENOENT,
        spawn_error="working directory not found: /srv/gone",
        spawn_failure=SpawnFailure.CWD_NOT_FOUND,
    )
    verdict = classify(result)
    assert verdict is not None
    assert verdict.failure_class is FailureClass.ENVIRONMENT
    assert verdict.reason == "missing working directory"


@pytest.mark.parametrize(
    ("number", "failure", "reason"),
    [
        (errno.EACCES, SpawnFailure.PERMISSION_DENIED, "spawn errno EACCES"),
        (errno.ENOEXEC, SpawnFailure.EXEC_FORMAT, "spawn errno ENOEXEC"),
        (errno.ENOTDIR, SpawnFailure.OTHER, "spawn errno ENOTDIR"),
        (errno.ENOENT, SpawnFailure.INTERPRETER_NOT_FOUND, "missing interpreter"),
        (errno.ENOENT, SpawnFailure.CWD_NOT_FOUND, "missing working directory"),
        (errno.ENOTDIR, SpawnFailure.CWD_NOT_DIRECTORY, "unusable working directory"),
        (errno.EACCES, SpawnFailure.CWD_UNUSABLE, "unusable working directory"),
    ],
)
def test_a_spawn_errno_that_means_never_started_is_environment(
    number: int, failure: SpawnFailure, reason: str
) -> None:
    # Even when the text looks upstream: the process never started, so no vendor spoke.
    result = spawn_result(
        spawn_errno=number, spawn_error="503 Service Unavailable", spawn_failure=failure
    )
    verdict = classify(result)
    assert verdict is not None
    assert (verdict.failure_class, verdict.reason) == (FailureClass.ENVIRONMENT, reason)
    assert not verdict.charged


@pytest.mark.parametrize(
    ("number", "name"),
    [(errno.E2BIG, "E2BIG"), (errno.EMFILE, "EMFILE"), (errno.ENOMEM, "ENOMEM")],
)
def test_any_other_spawn_errno_is_work(number: int, name: str) -> None:
    # Even when the text looks upstream: the process never started, so no vendor spoke.
    result = spawn_result(spawn_errno=number, spawn_error="503 Service Unavailable")
    verdict = classify(result)
    assert verdict is not None
    assert verdict.failure_class is FailureClass.WORK
    assert verdict.reason == f"spawn errno {name}"


def test_an_unnamed_errno_is_reported_by_number() -> None:
    verdict = classify(spawn_result(spawn_errno=99999, spawn_error=None))
    assert verdict == Classification(FailureClass.WORK, "spawn errno 99999", None)


def test_a_bare_exit_127_is_work() -> None:
    result = spawn_result(exit_code=127, stderr="bash: line 1: codex: command not found")
    assert classify(result) == Classification(FailureClass.WORK, "default")


def test_upstream_text_on_a_failed_run() -> None:
    result = spawn_result(
        stdout="[2025-07-25T09:41:12] OpenAI Codex v0.21.0\nmodel: gpt-5",
        stderr="ERROR: exceeded retry limit, last status: 503 Service Unavailable",
    )
    verdict = classify(result)
    assert verdict is not None
    assert verdict.failure_class is FailureClass.UPSTREAM
    assert verdict.reason == "http 503"
    assert not verdict.charged


def test_a_timeout_is_work_unless_the_text_says_upstream() -> None:
    plain = spawn_result(exit_code=None, signal=9, timed_out=True, stdout="thinking...")
    assert classify(plain) == Classification(FailureClass.WORK, "timeout")
    retrying = spawn_result(
        exit_code=None,
        signal=15,
        timed_out=True,
        stderr="API Error (529 overloaded_error) · Retrying in 32 seconds… (attempt 6/10)",
    )
    verdict = classify(retrying)
    assert verdict is not None and verdict.reason == "http 529"


def test_death_by_signal_is_work() -> None:
    assert classify(spawn_result(signal=9)) == Classification(FailureClass.WORK, "default")


def test_classify_reads_the_tail_of_failure_text() -> None:
    result = spawn_result(stderr="status 503\n" + "z" * (TAIL_CHARS + 10))
    assert classify(result) == Classification(FailureClass.WORK, "default")
    wide = classify(result, tail_chars=TAIL_CHARS * 2)
    assert wide is not None and wide.reason == "http 503"


# --- the value type ------------------------------------------------------------------------


def test_to_dict_and_classification_fields() -> None:
    result = spawn_result(stderr="HTTP/1.1 502 Bad Gateway")
    fields = classification_fields(result)
    assert fields == {
        "class": "upstream",
        "reason": "http 502",
        "evidence": "HTTP/1.1 502 Bad Gateway",
        "retry_after_s": None,
    }
    assert json.loads(json.dumps(fields)) == fields
    assert Classification(FailureClass.WORK, "default").to_dict() == {
        "class": "work",
        "reason": "default",
        "evidence": None,
        "retry_after_s": None,
    }
    limited = classification_fields(spawn_result(stderr="HTTP/1.1 429\nRetry-After: 30"))
    assert (limited["reason"], limited["retry_after_s"]) == ("http 429", 30.0)


def test_classification_is_frozen() -> None:
    verdict = Classification(FailureClass.WORK, "default")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        verdict.reason = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"failure_class": "work", "reason": "default"}, "failure_class"),
        ({"failure_class": FailureClass.WORK, "reason": ""}, "reason"),
        ({"failure_class": FailureClass.WORK, "reason": "x" * 65}, "reason"),
        (
            {"failure_class": FailureClass.WORK, "reason": "r", "evidence": "e" * 201},
            "evidence",
        ),
        ({"failure_class": FailureClass.UPSTREAM, "reason": "r", "retry_after_s": -1}, "retry"),
        (
            {"failure_class": FailureClass.UPSTREAM, "reason": "r", "retry_after_s": float("nan")},
            "retry",
        ),
    ],
)
def test_bad_classification_values_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        Classification(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("tail_chars", [0, -1, True])
def test_bad_tail_chars_is_invalid_input(tail_chars: int) -> None:
    with pytest.raises(InvalidInput, match="tail_chars"):
        classify_text("status 503", tail_chars=tail_chars)
    with pytest.raises(InvalidInput, match="tail_chars"):
        classify(spawn_result(), tail_chars=tail_chars)


def test_non_text_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="text"):
        classify_text(b"status 503")  # type: ignore[arg-type]


def test_failure_class_values_and_charging() -> None:
    assert [c.value for c in FailureClass] == ["work", "environment", "upstream"]
    assert [c.charged for c in FailureClass] == [True, False, False]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("spawn errno ENOENT", True),
        ("spawn errno EACCES", True),
        ("spawn errno E2BIG", True),
        ("missing interpreter", True),
        ("missing working directory", True),
        ("unusable working directory", True),
        ("credentials", False),
        ("http 401", False),
        ("default", False),
        (None, False),
    ],
)
def test_never_started_reads_the_reason_only(reason: str | None, expected: bool) -> None:
    from execkit._classify import never_started

    assert never_started(reason) is expected


# --- the SDK exception names, a whole "Overloaded", per-minute quotas (issue 29) ------------


@pytest.mark.parametrize(
    ("text", "reason", "wait"),
    [
        ("openai.InternalServerError: upstream connect error or disconnect", "server error", None),
        ("litellm.InternalServerError: AnthropicException - Overloaded", "server error", None),
        ("litellm.ServiceUnavailableError: OpenAIException - busy", "server error", None),
        ("google.genai.errors.ServerError: 503 UNAVAILABLE", "http 503", None),
        ("AI_APICallError: Internal server error", "server error", None),
        ("anthropic.RateLimitError: slow down", "rate limited", None),
        ("HTTP 200: Overloaded", "overloaded", None),
        ("Error: model call failed\nOverloaded\n", "overloaded", None),
        ("API Error: Unable to connect to API (ConnectionRefused)", "vendor unreachable", None),
        (
            "You exceeded your current quota, please check your plan and billing details.\n"
            '"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"\n'
            "Please retry in 17.0s.",
            "rate limited",
            17.0,
        ),
    ],
)
def test_sdk_names_whole_overloaded_and_per_minute_quotas_are_upstream(
    text: str, reason: str, wait: float | None
) -> None:
    verdict = classify_text(text)
    assert verdict.failure_class is FailureClass.UPSTREAM, verdict
    assert verdict.reason == reason
    assert verdict.retry_after_s == wait


@pytest.mark.parametrize(
    "text",
    [
        # Beside sdk-server-error and sdk-rate-limit: code, imports, other libraries.
        "    except openai.InternalServerError:",
        "class InternalServerError(Exception):",
        "raise litellm.ServiceUnavailableError",
        "myapp.errors.ServerError: disk full",
        "AI_APICallError: Bad Request",
        "from litellm import RateLimitError",
        "    except litellm.RateLimitError:",
        "app.RateLimitError: too many widgets",
        # Beside the whole-message overloaded: the word inside code or a sentence.
        "The method is overloaded for ints",
        "note: candidate: overloaded",
        "Overloaded operators: +, -",
        "HTTP 200: OK",
        # Beside unreachable: network words that do not name the API.
        "Error: connect ECONNREFUSED 127.0.0.1:8080",
        "tcp connect error: Connection refused (os error 111)",
        "Connection error. (cause: connect ECONNREFUSED 127.0.0.1:443)",
        # Beside per-minute-quota: a per-day quota stays an account limit (work).
        "You exceeded your current quota, please check your plan and billing details.\n"
        '"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"',
        "quotaId per_minute_limit_test failed",
    ],
)
def test_hard_negatives_of_the_issue_29_rows(text: str) -> None:
    verdict = classify_text(text)
    assert verdict.failure_class is FailureClass.WORK, verdict


def test_a_per_day_quota_in_text_charges_and_a_per_minute_one_does_not() -> None:
    quota = "You exceeded your current quota, please check your plan and billing details."
    per_day = classify_text(quota + ' "quotaId": "GenerateRequestsPerDayPerProject"')
    per_minute = classify_text(quota + ' "quotaId": "GenerateRequestsPerMinutePerProject"')
    assert per_day.failure_class is FailureClass.WORK
    assert per_day.reason in ("insufficient quota", "billing")
    assert (per_minute.failure_class, per_minute.reason) == (FailureClass.UPSTREAM, "rate limited")


_LADDER = "".join(
    f'  ⎿  API Error (529 {{"type":"error","error":{{"type":"overloaded_error",'
    f'"message":"Overloaded"}}}}) · Retrying in {2**n} seconds… (attempt {n + 1}/10)\n'
    for n in range(3)
)


@pytest.mark.parametrize(
    "ending",
    [
        "API Error: Operation aborted",
        "API Error: Operation aborted\nInterrupted by user",
        "[Request interrupted by user]",
        "Connection error.",
        "API Error: Connection error.\nTypeError (fetch failed)",
        "TypeError: fetch failed",
        "Error: This operation was aborted",
    ],
)
def test_a_retry_ladder_ending_in_a_generic_abort_is_still_the_vendors_refusal(
    ending: str,
) -> None:
    # Issue 44 item 10: the CLI gave up on (or was stopped in) a request the vendor kept
    # refusing; its last line says nothing about the work, so the ladder above decides.
    assert_text_verdict(_LADDER + ending + "\n", FailureClass.UPSTREAM, "http 529")
    # The same line alone, or after the work's own output, stays work.
    assert_text_verdict(ending + "\n", FailureClass.WORK, "default")
    after_work = _LADDER + "⏺ Bash(pytest -q)\n  ⎿  1 failed, 7 passed\n" + ending + "\n"
    assert_text_verdict(after_work, FailureClass.WORK, "default")
