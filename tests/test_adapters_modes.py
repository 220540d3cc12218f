"""pi, qwen and gemini as runners actually run them (issue 44, items 9 and 10).

The recorded cells (`*_text`, `*_json`, `connection_refused_gemini_0_*` in
fixtures/recorded) are the real CLIs; these are the edges around them: what the readers
must not take for an error, and what they must not take for structure.
"""

from __future__ import annotations

from typing import Any

import pytest

from execkit import AgentProof, AgentStatus, get_adapter, run_command
from execkit._classify import FailureClass
from execkit.testing import FakeVendor

NOTICE = "Retrying in 1s (attempt 1/1): [API Error: 503 The server is overloaded.]\n"


def _proof(fake_vendor: FakeVendor, name: str, **behaviour: Any) -> AgentProof:
    fake_vendor.register(name, **behaviour)
    return run_command(get_adapter(name), [name, "say hello"], start=fake_vendor.start)


def test_qwen_text_mode_error_after_a_retry_notice_is_final(fake_vendor: FakeVendor) -> None:
    proof = _proof(
        fake_vendor,
        "qwen",
        stderr=NOTICE + "[API Error: 400 Unsupported parameter: 'temperature'.]\n",
        exit_code=1,
    )
    assert (proof.failure_class, proof.reason) == (FailureClass.WORK, "http 400")


def test_qwen_text_mode_reply_is_a_success_whatever_stderr_says(fake_vendor: FakeVendor) -> None:
    # A retry it recovered from leaves its notice on stderr; the exit and the reply decide.
    proof = _proof(fake_vendor, "qwen", stdout="pong\n", stderr=NOTICE, exit_code=0)
    assert proof.status is AgentStatus.SUCCEEDED
    assert proof.output == "pong"


def test_qwen_json_mode_success_is_read_from_its_array(fake_vendor: FakeVendor) -> None:
    array = (
        '[{"type":"system","subtype":"init","session_id":"s-1"},'
        '{"type":"result","subtype":"success","is_error":false,"session_id":"s-1",'
        '"result":"pong"}]\n'
    )
    proof = _proof(fake_vendor, "qwen", stdout=array)
    assert proof.status is AgentStatus.SUCCEEDED
    assert (proof.output, proof.session_id) == ("pong", "s-1")


@pytest.mark.parametrize(
    ("stderr", "klass", "reason"),
    [
        (
            "502 <html>\r\n<head><title>502 Bad Gateway</title></head>\r\n</html>\n",
            "upstream",
            "http 502",
        ),
        ("429 Rate limit reached. Please try again in 17s.\n", "upstream", "http 429"),
        ("fetch failed\n", "upstream", "vendor unreachable"),
        ("Something went wrong in an extension\n", "work", "default"),
    ],
)
def test_pi_text_mode_reads_the_sdk_rendering_on_stderr(
    fake_vendor: FakeVendor, stderr: str, klass: str, reason: str
) -> None:
    proof = _proof(fake_vendor, "pi", stderr=stderr, exit_code=1)
    assert (proof.failure_class, proof.reason) == (FailureClass(klass), reason)


def test_pi_text_mode_reply_is_a_success(fake_vendor: FakeVendor) -> None:
    proof = _proof(fake_vendor, "pi", stdout="pong\n", stderr="401 ignored on a success\n")
    assert proof.status is AgentStatus.SUCCEEDED


def test_an_unprintable_gemini_error_without_a_cause_stays_unidentified(
    fake_vendor: FakeVendor,
) -> None:
    error = '{"error": {"type": "Error", "message": "[object Object]", "code": 1}}\n'
    proof = _proof(fake_vendor, "gemini", stderr="something else broke\n" + error, exit_code=1)
    assert (proof.failure_class, proof.reason) == (FailureClass.WORK, "default")


def test_gemini_fetch_failed_in_its_json_error_is_unreachable(fake_vendor: FakeVendor) -> None:
    error = (
        '{"session_id": "s", "error": {"type": "Error", '
        '"message": "exception TypeError: fetch failed sending request", "code": 1}}\n'
    )
    proof = _proof(fake_vendor, "gemini", stderr=error, exit_code=1)
    assert (proof.failure_class, proof.reason) == (
        FailureClass.UPSTREAM,
        "vendor unreachable",
    )
