"""The adapters of issue 29 (copilot, qwen, pi, amp, kilo, crush, auggie, droid, cn, aider,
llm) and the contract signals they needed: a CLI that exits 0 after a refusal, a launcher
whose program is missing, an untrusted directory, a refusal or login still pending when the
timeout killed the CLI. Bad input never crashes an adapter: it is work with a reason.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import attrs
import pytest
from _support import spawn_result

from execkit import Envelope, adapter_names, get_adapter, map_result, spawn
from execkit._classify import FailureClass
from execkit.adapterkit import ErrorKind
from execkit.testing import recorded_cells

ENV, UP, WORK = FailureClass.ENVIRONMENT, FailureClass.UPSTREAM, FailureClass.WORK
NEW = ("copilot", "qwen", "pi", "amp", "kilo", "crush", "auggie", "droid", "cn", "aider", "llm")
ALL = tuple(name for name in adapter_names() if name != "generic")


def test_every_new_cli_is_registered_with_its_hints() -> None:
    for name in NEW:
        adapter = get_adapter(name)
        assert adapter.name == name and adapter.binary == name
        assert adapter.install_hint
        argv = adapter.build_argv(_request())
        assert argv[0] == name and "Reply in one line." in " ".join(argv)


def _request(prompt: str = "Reply in one line.") -> Any:
    from execkit import AgentRequest

    return AgentRequest(prompt=prompt)


# --- bad input: work with a reason, never a crash --------------------------------------------

_BINARY = "\x00\x01\x02\xff\xfe" * 200 + "\x1b[31m\x00"


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    ("stdout", "stderr"),
    [
        ("", ""),
        (_BINARY, _BINARY),
        ('{"type":"result","subtype":"error_during_exec', ""),
        ('{"type":"error","error":{"name":"APIError","data":{"statusCode":5', ""),
        ('[{"type":"system"},{"type":"result","is_err', ""),
        ("{" * 5000, "]" * 5000),
        ('null\n[]\n42\n"x"\n', "{}"),
    ],
    ids=["empty", "binary", "cut-result", "cut-event", "cut-list", "brackets", "scalars"],
)
def test_empty_binary_or_truncated_output_is_work_with_a_reason(
    name: str, stdout: str, stderr: str
) -> None:
    mapped = get_adapter(name).parse(
        spawn_result((name,), exit_code=1, stdout=stdout, stderr=stderr)
    )
    assert mapped.failure_class is WORK, (name, mapped.reason)
    assert mapped.reason


@pytest.mark.parametrize("name", ALL)
def test_another_vendors_output_never_crashes_an_adapter(name: str) -> None:
    for cell in recorded_cells():
        if cell.cli == name:
            continue
        mapped = get_adapter(name).parse(cell.spawn_result())
        if mapped.ok:
            assert mapped.failure_class is None
        else:
            assert mapped.failure_class in (WORK, ENV, UP) and mapped.reason, (name, cell.key)


@pytest.mark.parametrize("name", NEW)
def test_a_truncated_success_envelope_of_its_own_cli_is_work(name: str) -> None:
    cells = recorded_cells(name, "success")
    if not cells:
        pytest.skip(f"{name} has no success recording (it cannot be pointed at an API)")
    cell = cells[0]
    cut = cell.stdout[: len(cell.stdout) // 2]
    mapped = get_adapter(name).parse(spawn_result((name,), exit_code=1, stdout=cut))
    assert mapped.failure_class is WORK, (name, mapped.reason)


# --- the contract signals -------------------------------------------------------------------


def test_a_refusal_reported_by_a_cli_that_exits_0_is_a_failure() -> None:
    refused = Envelope(found=True, is_error=True, error_message="500 boom", http_status=500)
    mapped = map_result(get_adapter("pi"), spawn_result(("pi",), exit_code=0), refused)
    assert not mapped.ok and mapped.failure_class is UP and mapped.reason == "http 500"


def test_a_launcher_whose_program_is_missing_is_environment_naming_the_install() -> None:
    missing = Envelope(found=True, is_error=True, error_kind=ErrorKind.NOT_INSTALLED)
    mapped = map_result(get_adapter("crush"), spawn_result(("crush",), exit_code=1), missing)
    assert mapped.failure_class is ENV
    assert mapped.reason == "spawn errno ENOENT"
    assert (
        mapped.precondition is not None and "npm install -g @charmland/crush" in mapped.precondition
    )


def test_an_untrusted_directory_is_environment_naming_the_trust_fix() -> None:
    untrusted = Envelope(found=True, is_error=True, error_kind=ErrorKind.UNTRUSTED)
    gemini = map_result(get_adapter("gemini"), spawn_result(("gemini",), exit_code=55), untrusted)
    assert (gemini.failure_class, gemini.reason) == (ENV, "untrusted workspace")
    assert gemini.precondition is not None and "GEMINI_CLI_TRUST_WORKSPACE" in gemini.precondition
    # An adapter without a trust_hint still gets a sentence.
    pi = map_result(get_adapter("pi"), spawn_result(("pi",), exit_code=1), untrusted)
    assert pi.precondition is not None and "trusted" in pi.precondition


TIMED: dict[str, Any] = {"exit_code": None, "signal": 15, "timed_out": True}


def test_a_pending_refusal_at_a_timeout_is_classed_by_its_structure() -> None:
    waiting = Envelope(
        found=True, is_error=True, error_message="429 slow down", http_status=429, pending=True
    )
    adapter = get_adapter("copilot")
    assert map_result(adapter, spawn_result(("copilot",), **TIMED), waiting).reason == "http 429"
    login = Envelope(
        found=True,
        error_message="No API key found.",
        error_kind=ErrorKind.CREDENTIALS,
        pending=True,
    )
    amp = map_result(get_adapter("amp"), spawn_result(("amp",), **TIMED), login)
    assert amp.failure_class is ENV and amp.precondition is not None
    # The same errors not pending (final words, then a hang) stay the classifier's call.
    final = attrs.evolve(waiting, pending=False)
    assert map_result(adapter, spawn_result(("copilot",), **TIMED), final).failure_class is WORK
    # And a pending mark without any structure is a silent timeout.
    bare = Envelope(found=True, pending=True)
    assert map_result(adapter, spawn_result(("copilot",), **TIMED), bare).reason == "timeout"


# --- masking must not cost the structure (the kilo 401 case) ---------------------------------


def test_a_kilo_401_whose_hint_masking_breaks_the_json_is_still_read() -> None:
    # kilo's own hint says `Bearer YOUR_KEY`, a placeholder the redactor keeps: a key
    # stands in for it, so that masking has something to take.
    hint = "Invalid API key (set header Authorization: Bearer k3Y7v4Lu3x9Q)."
    event = {
        "type": "error",
        "error": {
            "name": "APIError",
            "data": {
                "message": hint,
                "statusCode": 401,
                "responseBody": json.dumps({"error": {"message": hint}}),
            },
        },
    }
    line = json.dumps(event, separators=(",", ":"))
    # A real process, so the line goes through spawn's own masking.
    result = spawn([sys.executable, "-c", f"print({line!r}); raise SystemExit(1)"], timeout=60)
    assert "k3Y7v4Lu3x9Q" not in result.stdout_tail  # spawn masked it...
    json.loads(result.stdout_tail)  # ...and the line is still JSON (masks keep escapes)
    mapped = get_adapter("kilo").parse(result)
    assert (mapped.failure_class, mapped.reason) == (ENV, "http 401")
