"""The `fake_vendor` fixture, used the way a user of the pytest plugin would."""

from __future__ import annotations

import pytest

from execkit._errors import InvalidInput
from execkit.testing import FakeVendor

pytest_plugins = ["pytester"]


def test_plugin_fixture_for_a_user_test_suite(pytester: pytest.Pytester) -> None:
    pytester.makefile(".json", transcript='{"response": "ok from gemini", "stats": {}}')
    pytester.makepyfile(
        """
        import errno
        import subprocess
        from pathlib import Path

        import pytest

        from execkit import AgentFailed, AgentRequest, FailureClass, get_adapter, run_agent, spawn


        def test_transcript_from_a_file(fake_vendor):
            fake_vendor.register("gemini", stdout=Path("transcript.json"))
            proof = run_agent(get_adapter("gemini"), AgentRequest(prompt="hi"))
            assert proof.output == "ok from gemini"


        def test_transcript_from_strings_and_exit_code(fake_vendor):
            fake_vendor.register("mycli", stdout="out\\n", stderr="err\\n", exit_code=7)
            result = spawn(["mycli", "--flag"])
            assert (result.exit_code, result.stdout_tail, result.stderr_tail) == (
                7, "out\\n", "err\\n")
            assert fake_vendor.calls("mycli") == [("mycli", "--flag")]


        def test_missing_raises_enoent_for_plain_subprocess_too(fake_vendor):
            fake_vendor.register("codex", missing=True)
            with pytest.raises(FileNotFoundError) as info:
                subprocess.run(["codex", "exec", "x"])
            assert info.value.errno == errno.ENOENT


        def test_missing_stops_the_agent(fake_vendor):
            fake_vendor.register("codex", missing=True, occurrences=3)
            with pytest.raises(AgentFailed) as failed:
                run_agent(get_adapter("codex"), AgentRequest(prompt="x"), max_attempts=3)
            assert failed.value.proof.failure_class is FailureClass.ENVIRONMENT
            assert fake_vendor.call_count("codex") == 1


        def test_hang_until_killed(fake_vendor):
            fake_vendor.register("claude", hang=True)
            result = spawn(["claude", "-p", "x"], timeout=30, kill_grace=0.1)
            assert result.timed_out
            assert result.signal is not None


        def test_unregistered_commands_are_still_refused(fake_vendor):
            with pytest.raises(Exception, match="not registered"):
                subprocess.run(["something-else"])


        def test_bad_registration(fake_vendor):
            with pytest.raises(ValueError, match="either missing or hangs"):
                fake_vendor.register("x", missing=True, hang=True)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=7)


@pytest.mark.parametrize("occurrences", [0, -1, True, 1.5])
def test_bad_occurrences_are_refused_naming_the_field(
    fake_vendor: FakeVendor, occurrences: object
) -> None:
    with pytest.raises(InvalidInput, match="occurrences"):
        fake_vendor.register("codex", occurrences=occurrences)  # type: ignore[arg-type]
    assert fake_vendor.call_count("codex") == 0
