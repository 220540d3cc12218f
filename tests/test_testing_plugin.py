"""The `fake_vendor` fixture, used the way a user of the pytest plugin would."""

from __future__ import annotations

import asyncio
import errno
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from pytest_subprocess import ProcessNotRegisteredError

from execkit import AgentFailed, AgentRequest, FailureClass, get_adapter, run_agent
from execkit._errors import InvalidInput
from execkit._exec import spawn, spawn_async
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
            proof = run_agent(
                get_adapter("gemini"), AgentRequest(prompt="hi"), start=fake_vendor.start
            )
            assert proof.output == "ok from gemini"


        def test_transcript_from_strings_and_exit_code(fake_vendor):
            fake_vendor.register("mycli", stdout="out\\n", stderr="err\\n", exit_code=7)
            result = spawn(["mycli", "--flag"], start=fake_vendor.start)
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
                run_agent(
                    get_adapter("codex"),
                    AgentRequest(prompt="x"),
                    max_attempts=3,
                    start=fake_vendor.start,
                )
            assert failed.value.proof.failure_class is FailureClass.ENVIRONMENT
            assert fake_vendor.call_count("codex") == 1


        def test_hang_until_killed(fake_vendor):
            fake_vendor.register("claude", hang=True)
            # A real process: its timeout really elapses, so it is short.
            result = spawn(
                ["claude", "-p", "x"], timeout=0.3, kill_grace=0.1, start=fake_vendor.start
            )
            assert result.timed_out
            assert result.signal is not None


        def test_start_errno_eacces(fake_vendor):
            fake_vendor.register("/opt/bin/mycli", start_errno=errno.EACCES, occurrences=2)
            result = spawn(["/opt/bin/mycli"], start=fake_vendor.start)
            assert result.spawn_errno == errno.EACCES
            assert result.spawn_error == "permission denied: cannot execute /opt/bin/mycli"
            with pytest.raises(PermissionError) as info:
                subprocess.run(["/opt/bin/mycli", "--version"])
            assert info.value.errno == errno.EACCES
            assert fake_vendor.call_count("/opt/bin/mycli") == 2


        def test_inputs_record_what_each_spawn_read(fake_vendor):
            fake_vendor.register("mycli", stdout="ok", occurrences=2)
            spawn(["mycli"], input="the prompt", start=fake_vendor.start)
            spawn(["mycli"], start=fake_vendor.start)
            assert fake_vendor.inputs("mycli") == [b"the prompt", b""]
            assert fake_vendor.call_count("mycli") == 2


        def test_unregistered_commands_are_still_refused(fake_vendor):
            with pytest.raises(Exception, match="not registered"):
                subprocess.run(["something-else"])


        def test_bad_registration(fake_vendor):
            with pytest.raises(ValueError, match="either missing or hangs"):
                fake_vendor.register("x", missing=True, hang=True)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)


@pytest.mark.parametrize("occurrences", [0, -1, True, 1.5])
def test_bad_occurrences_are_refused_naming_the_field(
    fake_vendor: FakeVendor, occurrences: object
) -> None:
    with pytest.raises(InvalidInput, match="occurrences"):
        fake_vendor.register("codex", occurrences=occurrences)  # type: ignore[arg-type]
    assert fake_vendor.call_count("codex") == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"missing": True, "start_errno": errno.EACCES}, "start_errno"),
        ({"start_errno": errno.EACCES, "hang": True}, "hang"),
        ({"start_errno": 0}, "start_errno"),
        ({"start_errno": 99999}, "start_errno"),
        ({"start_errno": "EACCES"}, "start_errno"),
        ({"exit_code": 256}, "exit_code"),
        ({"exit_code": -int(signal.SIGSTOP)}, "exit_code"),
        ({"exit_code": 1.0}, "exit_code"),
        ({"stdout": 12}, "stdout"),
        ({"missing": "yes"}, "missing"),
    ],
)
def test_bad_registrations_are_refused_naming_the_field(
    fake_vendor: FakeVendor, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput, match=field) as info:
        fake_vendor.register("codex", **kwargs)
    assert info.value.field == field
    with pytest.raises(InvalidInput, match="name"):
        fake_vendor.register("")
    with pytest.raises(ProcessNotRegisteredError):
        spawn(["codex"], start=fake_vendor.start)  # nothing half-registered


def test_registrations_are_used_in_order_and_the_last_stays(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout="first")
    fake_vendor.register("codex", exit_code=-int(signal.SIGTERM))
    assert spawn(["codex", "a"], start=fake_vendor.start).stdout_tail == "first"
    for argv in (["codex", "b"], ["codex", "c"], ["codex", "d"]):
        assert spawn(argv, start=fake_vendor.start).signal == signal.SIGTERM
    assert fake_vendor.calls("codex") == [
        ("codex", "a"),
        ("codex", "b"),
        ("codex", "c"),
        ("codex", "d"),
    ]


def test_a_limited_last_registration_is_refused_once_used_up(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout="first", occurrences=2)
    fake_vendor.register("codex", stdout="second", occurrences=1)
    tails = [spawn(["codex"], start=fake_vendor.start).stdout_tail for _ in range(3)]
    assert tails == ["first", "first", "second"]
    with pytest.raises(ProcessNotRegisteredError, match="occurrences=1"):
        spawn(["codex", "again"], start=fake_vendor.start)
    assert fake_vendor.call_count("codex") == 4


def test_a_registration_followed_by_another_serves_one_start(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("gemini", exit_code=3)
    fake_vendor.register("gemini", exit_code=4)
    fake_vendor.register("gemini", exit_code=5, occurrences=1)
    codes = [spawn(["gemini"], start=fake_vendor.start).exit_code for _ in range(3)]
    assert codes == [3, 4, 5]


def test_a_failure_registered_once_meets_every_retry_without_real_sleeps(
    fake_vendor: FakeVendor,
) -> None:
    overloaded = Path(__file__).parent.parent / "fixtures" / "claude" / "overloaded.json"
    fake_vendor.register("claude", stdout=overloaded, exit_code=1)
    with pytest.raises(AgentFailed) as failed:
        run_agent(
            get_adapter("claude"),
            AgentRequest(prompt="x"),
            max_attempts=3,
            start=fake_vendor.start,
            sleep=fake_vendor.sleep,
        )
    assert failed.value.proof.failure_class is FailureClass.UPSTREAM
    tries = fake_vendor.call_count("claude")
    # Every upstream retry within the agent's ceiling met the same failure, and each wait
    # between them went to the fake sleep instead of the clock.
    assert tries > 1
    assert len(fake_vendor.sleeps) == tries - 1
    assert all(wait > 0 for wait in fake_vendor.sleeps)


def test_the_fake_sleep_returns_at_once_and_records_each_wait(
    fake_vendor: FakeVendor, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # any real wait would land here
    fake_vendor.sleep(3600)
    fake_vendor.sleep(0.5)
    assert slept == []  # an hour asked for, not taken
    assert fake_vendor.sleeps == [3600.0, 0.5]


def test_a_direct_subprocess_call_of_a_hanging_fake_ends_by_its_signal(
    fake_vendor: FakeVendor,
) -> None:
    fake_vendor.register("claude", hang=True, stdout="thinking\n")
    proc = subprocess.Popen(["claude", "-p", "x"], stdout=subprocess.PIPE)
    proc.terminate()
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert fake_vendor.calls("claude") == [("claude", "-p", "x")]


def test_spawn_async_takes_the_fake_too(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("gemini", stdout="async ok", exit_code=3)
    result = asyncio.run(spawn_async(["gemini", "-p", "x"], start=fake_vendor.start))
    assert (result.exit_code, result.stdout_tail) == (3, "async ok")


def test_a_fake_left_running_is_killed_at_teardown(tmp_path: Path, fp: Any) -> None:
    vendor = FakeVendor(fp, tmp_path)
    vendor.register("claude", hang=True)
    proc = vendor.start(["claude"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.poll() is None
    vendor.close()
    assert proc.returncode == -signal.SIGKILL
