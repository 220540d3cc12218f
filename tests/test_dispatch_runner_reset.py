"""`AdapterRunner` carries a vendor's stated reset to the scheduler: `RunOutcome.not_before
= clock() + retry_after_s` for an upstream failure, and the next dispatch is no earlier."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from _support import a_slot

from adapters import GenericAdapter
from execkit._attempt import AttemptOptions
from execkit._classify import FailureClass
from execkit.dispatch import AdapterRunner, BoardIssue, DispatchConfig, Dispatcher, InMemoryBoard
from execkit.ledger import open_ledger

T0 = 1_800_000_000.0


def _vendor(tmp_path: Path, stderr: str, exit_code: int = 1) -> list[str]:
    script = tmp_path / "vendor.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.stderr.write({stderr!r})
            sys.exit({exit_code})
            """
        )
    )
    return [sys.executable, str(script)]


def _issue(argv: list[str]) -> BoardIssue:
    return BoardIssue("ISS-1", "t", "todo", prompt="", argv=argv)


def test_a_stated_reset_becomes_not_before_on_the_runners_clock(tmp_path: Path) -> None:
    argv = _vendor(tmp_path, "HTTP/1.1 429 Too Many Requests\nRetry-After: 120\n")
    runner = AdapterRunner(GenericAdapter(), AttemptOptions(clock=lambda: T0))
    outcome = runner.run(_issue(argv), a_slot(1))
    assert (outcome.failure_class, outcome.reason) == (FailureClass.UPSTREAM, "http 429")
    assert outcome.not_before == T0 + 120.0
    assert outcome.charged is False


@pytest.mark.parametrize(
    "stderr",
    [
        "HTTP/1.1 503 Service Unavailable\n",  # upstream, but no reset stated
        "HTTP/1.1 400 Bad Request\nRetry-After: 120\n",  # a reset on a work failure
        "You exceeded your current quota\n",  # an account limit with no reset: work
    ],
)
def test_no_reset_no_not_before(tmp_path: Path, stderr: str) -> None:
    runner = AdapterRunner(GenericAdapter(), AttemptOptions(clock=lambda: T0))
    assert runner.run(_issue(_vendor(tmp_path, stderr)), a_slot(1)).not_before is None


def test_the_default_clock_is_the_wall_clock(tmp_path: Path) -> None:
    import time

    before = time.time()
    outcome = AdapterRunner(GenericAdapter()).run(
        _issue(_vendor(tmp_path, "API Error: 529 overloaded\nPlease try again in 30s.\n")),
        a_slot(1),
    )
    assert outcome.not_before is not None
    assert before + 30.0 <= outcome.not_before <= time.time() + 30.0


def test_the_dispatcher_schedules_the_next_attempt_no_earlier(tmp_path: Path) -> None:
    # The vendor says two hours; the scheduler's own backoff would say seconds.
    argv = _vendor(tmp_path, "HTTP/1.1 429 Too Many Requests\nRetry-After: 7200\n")
    board = InMemoryBoard([BoardIssue("RL", "t", "todo", argv=argv)])
    runner = AdapterRunner(GenericAdapter())
    config = DispatchConfig(max_attempts=5, base_backoff_s=1.0, max_retry_backoff_s=5.0)
    with open_ledger(tmp_path / "l.db") as ledger:
        events = Dispatcher(board, runner, ledger, config).tick()
        (event,) = [e for e in events if e.issue_id == "RL"]
        history = ledger.history(ledger.list_tasks()[0].id)
    assert history[-1].not_before is not None
    assert event.next_attempt_at is not None
    assert event.next_attempt_at >= history[-1].not_before
    assert event.next_attempt_at - history[-1].ended_at >= 7200.0 - 5.0  # type: ignore[operator]
