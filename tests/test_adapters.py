"""Every adapter over its recorded-shape fixtures, plus argv building and the registry."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path
from typing import Any

import pytest
from _support import spawn_result

import adapters
from execkit import (
    Adapter,
    AgentRequest,
    Envelope,
    adapter_names,
    available_adapters,
    get_adapter,
    map_result,
)
from execkit._classify import FailureClass
from execkit._errors import InvalidInput, UnknownAdapter
from execkit._exec import SpawnFailure, SpawnResult
from execkit.adapterkit import load_json_document, parse_retry_after

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
VENDORS = ("codex", "claude", "gemini", "opencode", "generic")


def load_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for vendor in VENDORS:
        manifest = json.loads((FIXTURES / vendor / "manifest.json").read_text())
        assert manifest["vendor"] == vendor
        cases += [(vendor, case) for case in manifest["cases"]]
    return cases


CASES = load_cases()


def adapter_for(vendor: str) -> Adapter:
    if vendor == "generic":
        return adapters.GenericAdapter(command=("mytool",))
    return get_adapter(vendor)


def result_for(vendor: str, case: dict[str, Any]) -> SpawnResult:
    adapter = adapter_for(vendor)
    argv = tuple(adapter.build_argv(AgentRequest(prompt="fix the test")))
    if case["missing"]:
        return spawn_result(
            argv,
            spawn_errno=errno.ENOENT,
            spawn_error=f"[Errno 2] No such file or directory: {argv[0]!r}",
        )

    def read(name: str | None) -> str:
        return (FIXTURES / vendor / name).read_text() if name else ""

    return spawn_result(
        argv, exit_code=case["exit_code"], stdout=read(case["stdout"]), stderr=read(case["stderr"])
    )


def test_every_vendor_has_fixtures_for_each_failure_kind() -> None:
    by_vendor: dict[str, set[str]] = {}
    for vendor, case in CASES:
        by_vendor.setdefault(vendor, set()).add(case["name"])
    for vendor in ("codex", "claude", "gemini", "opencode"):
        kinds = by_vendor[vendor]
        assert {
            "success",
            "rate_limit",
            "overloaded",
            "auth_failure",
            "bad_request",
            "missing",
        } <= (kinds), vendor
    assert {"success", "work_failure", "upstream_text", "missing"} <= by_vendor["generic"]


def test_every_vendor_fixture_set_covers_each_class_and_upstream_kind() -> None:
    # By outcome, not by file name: each class, and the 429 and 5xx kinds of upstream.
    for vendor in ("codex", "claude", "gemini", "opencode"):
        outcomes = {
            (c["expect"]["class"], c["expect"].get("reason")) for v, c in CASES if v == vendor
        }
        classes = {cls for cls, _ in outcomes}
        assert {None, "work", "upstream", "environment"} <= classes, vendor
        upstream = {reason for cls, reason in outcomes if cls == "upstream"}
        assert "http 429" in upstream, vendor
        assert any(re.fullmatch(r"http 5\d\d", r or "") for r in upstream), vendor


@pytest.mark.parametrize(("vendor", "case"), CASES, ids=[f"{v}-{c['name']}" for v, c in CASES])
def test_adapter_classes_each_fixture(vendor: str, case: dict[str, Any]) -> None:
    expect = case["expect"]
    raw = adapter_for(vendor).parse(result_for(vendor, case))

    assert raw.ok is expect["ok"]
    assert (raw.failure_class.value if raw.failure_class else None) == expect["class"]
    for key in ("reason", "text", "session_id", "retry_after_s"):
        if key in expect:
            assert getattr(raw, key) == expect[key], key
    if "cost_usd" in expect:
        assert raw.cost_usd == pytest.approx(expect["cost_usd"])
    if "precondition_startswith" in expect:
        assert raw.precondition is not None
        assert raw.precondition.startswith(expect["precondition_startswith"])
    else:
        assert raw.precondition is None
    if raw.ok:
        assert raw.error is None and raw.reason is None
    else:
        assert raw.error and raw.reason


def test_missing_codex_names_the_precondition_exactly() -> None:
    codex = get_adapter("codex")
    raw = codex.parse(
        spawn_result(
            ("codex", "exec", "--json", "x"),
            spawn_errno=errno.ENOENT,
            spawn_error="[Errno 2] No such file or directory: 'codex'",
        )
    )
    assert raw.failure_class is FailureClass.ENVIRONMENT
    assert raw.reason == "spawn errno ENOENT"
    assert raw.spawn_errno == errno.ENOENT
    assert raw.precondition == (
        "codex CLI not found on PATH; install: npm install -g @openai/codex; "
        "then log in: codex login"
    )


def test_missing_working_directory_names_the_directory_not_the_binary() -> None:
    raw = get_adapter("claude").parse(
        spawn_result(
            ("claude", "-p", "x"),
            spawn_errno=errno.ENOENT,
            spawn_error="working directory not found: /no/such/dir",
            spawn_failure=SpawnFailure.CWD_NOT_FOUND,
        )
    )
    assert raw.failure_class is FailureClass.ENVIRONMENT
    assert raw.precondition == "working directory not found: /no/such/dir"


@pytest.mark.parametrize(
    ("number", "failure", "error", "says"),
    [
        (
            errno.EACCES,
            SpawnFailure.PERMISSION_DENIED,
            "permission denied: cannot execute /usr/bin/gemini",
            "gemini CLI is not executable (EACCES): permission denied: cannot execute "
            "/usr/bin/gemini; make it executable (chmod +x) or reinstall: "
            "npm install -g @google/gemini-cli",
        ),
        (
            errno.ENOEXEC,
            SpawnFailure.EXEC_FORMAT,
            "exec format error: /usr/bin/gemini is not a runnable program",
            "gemini CLI is not a program this machine can run (ENOEXEC): exec format error: "
            "/usr/bin/gemini is not a runnable program; reinstall it for this platform: "
            "npm install -g @google/gemini-cli",
        ),
        (
            errno.ENOENT,
            SpawnFailure.INTERPRETER_NOT_FOUND,
            "interpreter not found: /usr/bin/node (the #! line of /usr/bin/gemini)",
            "gemini CLI is installed but its interpreter is missing: interpreter not found: "
            "/usr/bin/node (the #! line of /usr/bin/gemini); install the interpreter its #! "
            "line names (an npm-installed CLI needs node on PATH), or reinstall: "
            "npm install -g @google/gemini-cli",
        ),
        (
            errno.ENOTDIR,
            SpawnFailure.OTHER,
            "could not start /opt/tool.tgz/gemini: [Errno 20] Not a directory",
            "gemini CLI path runs through a file, not a directory (ENOTDIR): could not start "
            "/opt/tool.tgz/gemini: [Errno 20] Not a directory; fix the path or PATH, or "
            "install: npm install -g @google/gemini-cli",
        ),
    ],
)
def test_each_never_started_errno_is_environment_with_its_own_precondition(
    number: int, failure: SpawnFailure, error: str, says: str
) -> None:
    raw = get_adapter("gemini").parse(
        spawn_result(("gemini",), spawn_errno=number, spawn_error=error, spawn_failure=failure)
    )
    assert raw.failure_class is FailureClass.ENVIRONMENT
    assert raw.precondition == says
    assert "not found on PATH" not in raw.precondition


def test_an_errno_that_is_not_a_missing_precondition_charges_as_work() -> None:
    raw = get_adapter("gemini").parse(
        spawn_result(("gemini",), spawn_errno=errno.E2BIG, spawn_error="Argument list too long")
    )
    assert (raw.failure_class, raw.reason) == (FailureClass.WORK, "spawn errno E2BIG")
    assert raw.precondition is None


def test_bare_exit_127_without_errno_is_work() -> None:
    raw = get_adapter("codex").parse(
        spawn_result(("codex", "exec"), exit_code=127, stderr="sh: 1: codex: not found\n")
    )
    assert raw.failure_class is FailureClass.WORK
    assert raw.precondition is None


def test_timeout_is_work_unless_the_vendor_said_upstream() -> None:
    claude = get_adapter("claude")
    plain = claude.parse(spawn_result(("claude",), exit_code=None, signal=9, timed_out=True))
    assert plain.failure_class is FailureClass.WORK and plain.timed_out
    assert plain.reason == "timeout"
    said = claude.parse(
        spawn_result(
            ("claude",), exit_code=None, signal=9, timed_out=True, stderr="API Error: 503 x\n"
        )
    )
    assert said.failure_class is FailureClass.UPSTREAM


def test_structured_status_decides_over_the_wording() -> None:
    codex = get_adapter("codex")
    result = spawn_result(("codex",), exit_code=1, stderr="boom")
    upstream = map_result(
        codex, result, Envelope(found=True, is_error=True, error_message="x", http_status=503)
    )
    assert (upstream.failure_class, upstream.reason) == (FailureClass.UPSTREAM, "http 503")
    work = map_result(
        codex,
        result,
        Envelope(
            found=True,
            is_error=True,
            error_message="upstream 503 Service Unavailable",
            http_status=400,
        ),
    )
    assert (work.failure_class, work.reason) == (FailureClass.WORK, "http 400")


def test_account_limit_wording_vetoes_a_structured_429() -> None:
    result = spawn_result(("claude",), exit_code=1)
    raw = map_result(
        get_adapter("claude"),
        result,
        Envelope(
            found=True,
            is_error=True,
            error_message="Your credit balance is too low",
            http_status=429,
        ),
    )
    assert raw.failure_class is FailureClass.WORK
    assert raw.reason == "billing"


def test_envelope_error_on_exit_zero_is_still_a_failure() -> None:
    stdout = json.dumps(
        {
            "type": "result",
            "subtype": "success",
            "is_error": True,
            "result": "API Error: 529 x",
            "api_error_status": 529,
            "session_id": "s1",
        }
    )
    raw = get_adapter("claude").parse(spawn_result(("claude",), exit_code=0, stdout=stdout))
    assert not raw.ok
    assert raw.failure_class is FailureClass.UPSTREAM
    assert raw.session_id == "s1"


def test_exit_zero_without_an_envelope_is_plain_text_success() -> None:
    raw = get_adapter("codex").parse(spawn_result(("codex",), stdout="just text\n"))
    assert raw.ok and raw.text == "just text"


def test_secrets_never_reach_the_raw_error() -> None:
    for vendor, case in CASES:
        raw = adapter_for(vendor).parse(result_for(vendor, case))
        assert "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234" not in (raw.error or "")


def test_codex_recovered_reconnect_error_is_not_a_failure() -> None:
    case = next(c for v, c in CASES if v == "codex" and c["name"] == "reconnect_then_success")
    raw = get_adapter("codex").parse(result_for("codex", case))
    assert raw.ok and raw.failure_class is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("Retry-After: 30", 30.0),
        ("retry after 12 seconds", 12.0),
        ("Please try again in 14.036s. Visit https://x", 14.036),
        ("try again in 250ms", 0.25),
        ("try again in 2 minutes", 120.0),
        ("Rate limit resets; try again in 2 hours", 7200.0),
        ("retry in 1h", 3600.0),
        ("retry-after: 5\n...later: Retry-After: 9", 9.0),
        ("nothing here", None),
        ("", None),
    ],
)
def test_parse_retry_after(text: str, seconds: float | None) -> None:
    assert parse_retry_after(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_parse_retry_after_has_bounded_gaps() -> None:
    # With unbounded gaps each start position would rescan the run of spaces (quadratic).
    assert parse_retry_after("retry after" + " " * 20_000 + "soon") is None
    assert parse_retry_after("Retry-After:    12") == 12.0


def test_load_json_document_finds_the_envelope_after_banners() -> None:
    assert load_json_document('warning: x\n{"a": 1}\n') == {"a": 1}
    assert load_json_document("no json") is None
    assert load_json_document("") is None
    assert load_json_document('Attempt 1 failed\n{\n  "error": {"code": 429}\n}\n') == {
        "error": {"code": 429}
    }


# --- argv --------------------------------------------------------------------------------


def test_build_argv_per_vendor() -> None:
    request = AgentRequest(
        prompt="fix it", model="m1", cwd="/repo", max_turns=7, extra_args=("--flag",)
    )
    assert get_adapter("codex").build_argv(request) == [
        "codex",
        "exec",
        "--json",
        "--model",
        "m1",
        "--cd",
        "/repo",
        "--flag",
        "fix it",
    ]
    # The output format with the most structure (issue 51): stream-json, which -p runs
    # only with --verbose.
    assert get_adapter("claude").build_argv(request) == [
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "m1",
        "--max-turns",
        "7",
        "--flag",
        "fix it",
    ]
    assert get_adapter("gemini").build_argv(request) == [
        "gemini",
        "--output-format",
        "json",
        "--model",
        "m1",
        "--flag",
        "--prompt=fix it",
    ]
    assert get_adapter("opencode").build_argv(request) == [
        "opencode",
        "run",
        "--format",
        "json",
        "--model",
        "m1",
        "--flag",
        "fix it",
    ]
    assert adapters.GenericAdapter(command=("tool", "-q")).build_argv(request) == [
        "tool",
        "-q",
        "--flag",
        "fix it",
    ]


def test_a_prompt_that_looks_like_a_flag_stays_a_prompt() -> None:
    request = AgentRequest(prompt="--delete-everything")
    assert get_adapter("codex").build_argv(request)[-2:] == ["--", "--delete-everything"]
    assert get_adapter("gemini").build_argv(request)[-1] == "--prompt=--delete-everything"


def test_generic_without_a_command_is_a_clear_error() -> None:
    with pytest.raises(InvalidInput, match="needs a command"):
        get_adapter("generic").build_argv(AgentRequest(prompt="x"))
    assert get_adapter("generic").build_argv(AgentRequest(prompt="", extra_args=("ls",))) == ["ls"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -1.5}, "timeout_s"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": True}, "max_turns"),
        ({"extra_args": ("ok", 3)}, "extra_args"),
        ({"extra_args": "--one-string"}, "extra_args"),
    ],
)
def test_agent_request_rejects_bad_values_naming_the_field(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput, match=field):
        AgentRequest(prompt="x", **kwargs)


# --- registry ----------------------------------------------------------------------------


def test_builtin_names_and_get() -> None:
    assert {"codex", "claude", "gemini", "opencode", "generic"} <= set(adapter_names())
    for name in ("codex", "claude", "gemini", "opencode", "generic"):
        adapter = get_adapter(name)
        assert isinstance(adapter, Adapter)
        assert adapter.name == name
    assert [a.name for a in available_adapters()] == sorted(a.name for a in available_adapters())


def test_unknown_adapter_lists_the_known_ones() -> None:
    with pytest.raises(UnknownAdapter) as info:
        get_adapter("nope")
    assert "'nope'" in info.value.message
    for name in ("claude", "codex", "gemini", "generic", "opencode"):
        assert name in info.value.message
    assert isinstance(info.value, LookupError)


def test_a_line_nested_thousands_deep_is_skipped_as_noise() -> None:
    from execkit.adapterkit import iter_json_objects

    text = "{" * 100_000 + '\n{"type": "result"}\n' + '{"a": ' * 50_000
    assert list(iter_json_objects(text)) == [{"type": "result"}]
