"""The reason is the line the class was read from (issue 52, item 4).

A gemini usage-limit run was reported as `usage limit: [STARTUP] Cannot measure phase
'cleanup_ops'...`: the stored reason took the failure's last line, a start-up diagnostic
printed after the limit. The line kept with a reason is the one its class was read from:
the line a shared text rule matched, the first line of the vendor's structured error
(whatever adapter read it), the start failure; the last line only when no line decided.
"""

from __future__ import annotations

import sys

import pytest
from _support import a_slot

from adapters import GenericAdapter
from execkit import AgentProof, AgentStatus, get_adapter, load_agent_proof, run_command
from execkit._attempt import failure_detail, outcome_of
from execkit._classify import FailureClass
from execkit.dispatch import AdapterRunner, BoardIssue
from execkit.testing import FakeVendor, recorded_cells

PY = [sys.executable, "-I", "-S"]
DIAGNOSTIC = "[STARTUP] Cannot measure phase 'cleanup_ops': start mark not found (likely reset)."


def test_a_shared_text_rule_keeps_the_line_it_matched_not_the_diagnostic_after_it() -> None:
    code = (
        "import sys\n"
        'print("Error: You\'ve hit your usage limit. Try again in 2 hours.", file=sys.stderr)\n'
        f"print({DIAGNOSTIC!r}, file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    issue = BoardIssue("ISS-1", "t", "todo", prompt="p", argv=[*PY, "-c", code])
    outcome = AdapterRunner(GenericAdapter()).run(issue, a_slot(1))
    assert (outcome.failure_class, outcome.reason) == (FailureClass.UPSTREAM, "usage limit")
    assert outcome.detail == "Error: You've hit your usage limit. Try again in 2 hours."
    assert outcome.ledger_reason() == (
        "usage limit: Error: You've hit your usage limit. Try again in 2 hours."
    )


def test_a_failure_nothing_identified_keeps_its_last_line() -> None:
    code = "import sys\nprint('compiling', file=sys.stderr)\nprint('exit: 3', file=sys.stderr)\n"
    issue = BoardIssue("ISS-1", "t", "todo", prompt="p", argv=[*PY, "-c", code + "sys.exit(3)"])
    outcome = AdapterRunner(GenericAdapter()).run(issue, a_slot(1))
    assert (outcome.failure_class, outcome.reason, outcome.detail) == (
        FailureClass.WORK,
        "default",
        "exit: 3",
    )


# Recorded real CLIs whose structured error has more than one line, or follows other output:
# the kept line is the error's first (its status, its fixed sentence), not its last.
FIRST_LINES = {
    "gemini/no_credentials": (
        "When using Gemini API, you must specify the GEMINI_API_KEY environment variable."
    ),
    "gemini/rate_limit_429": (
        "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, head to: https://ai.google.dev/gemini-api/docs…"
    ),
    "pi/proxy_502_html": "502 <html>",
    "qwen/proxy_502_html": "[API Error: 502 <html>",
    "copilot/auth_401": (
        "Authentication failed with provider at http://127.0.0.1:<PORT>/v1 (HTTP 401)."
    ),
}


@pytest.mark.parametrize("key", sorted(FIRST_LINES))
def test_a_structured_error_keeps_its_first_line(key: str, fake_vendor: FakeVendor) -> None:
    cli, scenario = key.split("/")
    (cell,) = recorded_cells(cli, scenario)
    fake_vendor.register(
        cell.argv[0], stdout=cell.stdout, stderr=cell.stderr, exit_code=cell.exit_code or 0
    )
    proof = run_command(get_adapter(cli), list(cell.argv), start=fake_vendor.start)
    assert proof.failure_class is cell.expected_class
    assert failure_detail(proof) == FIRST_LINES[key][:160]
    outcome = outcome_of(get_adapter(cli), proof, lambda: 0.0)
    assert outcome.detail == failure_detail(proof)


def test_evidence_survives_a_stored_proof_and_a_success_has_none() -> None:
    failed = AgentProof(
        id="a",
        harness="gemini",
        status=AgentStatus.FAILED,
        failure_class=FailureClass.UPSTREAM,
        reason="rate limited",
        error="Attempt 1 failed\n" + DIAGNOSTIC,
        evidence="Suggested retry after 298s.. Retrying after 310328ms...",
    )
    loaded = load_agent_proof(failed.to_dict())
    assert loaded.evidence == failed.evidence
    assert failure_detail(loaded) == failed.evidence
    done = load_agent_proof({**failed.to_dict(), "status": "succeeded"})
    assert done.evidence is None


def test_a_credential_in_the_evidence_is_masked() -> None:
    secret = "sk-proj-" + "Q1w2E3r4T5y6U7i8O9p0" * 2
    proof = AgentProof(
        id="a",
        harness="x",
        status=AgentStatus.FAILED,
        failure_class=FailureClass.WORK,
        evidence=f"401 bad key {secret}",
    )
    assert proof.evidence is not None and secret not in proof.evidence
