"""`AttemptOptions`: the one value `run_attempt`, `run_attempt_async` and `AdapterRunner`
share (issue #46), and the older keywords that still work for one release, warned."""

from __future__ import annotations

import asyncio
import sys
import warnings
from pathlib import Path

import attrs
import pytest
from _support import a_slot

from adapters import GenericAdapter
from execkit import AgentRequest, AttemptOptions, InvalidInput, run_attempt, run_attempt_async
from execkit._classify import FailureClass
from execkit.dispatch import AdapterRunner, BoardIssue
from execkit.ledger import open_ledger

PY = [sys.executable, "-I", "-S"]


def _fails() -> AgentRequest:
    return AgentRequest(prompt="", extra_args=[*PY, "-c", "import sys; sys.exit(3)"])


def test_the_options_value_runs_an_attempt_and_warns_nothing(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path / "l.db")
    task = ledger.create_task("t", actor="runner")
    ticks = iter(range(1_000_000, 2_000_000))
    options = AttemptOptions(actor="my-runner", clock=lambda: float(next(ticks)), lane=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome = run_attempt(ledger, task.id, GenericAdapter(), _fails(), options)
    assert (outcome.failure_class, outcome.charged) == (FailureClass.WORK, True)
    (run,) = ledger.runs(task.id)
    # The injected clock dated the run: the options reached the ledger calls.
    assert run.started_at >= 1_000_000 and run.started_at < 2_000_000


def test_the_older_keywords_still_work_with_a_deprecation_warning(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path / "l.db")
    task = ledger.create_task("t", actor="runner")
    with pytest.warns(DeprecationWarning, match=r"run_attempt\(\.\.\., actor=, lane=\)") as said:
        outcome = run_attempt(
            ledger, task.id, GenericAdapter(), _fails(), actor="old-runner", lane=None
        )
    # Pointed at the caller's line, with the replacement spelled out.
    assert said[0].filename == __file__
    assert "options=AttemptOptions(actor=..., lane=...)" in str(said[0].message)
    assert outcome.failure_class is FailureClass.WORK
    (run,) = ledger.runs(task.id)
    assert run.actor == "old-runner"


def test_a_keyword_that_was_never_an_option_is_a_type_error(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path / "l.db")
    task = ledger.create_task("t", actor="runner")
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        run_attempt(ledger, task.id, GenericAdapter(), _fails(), colour="red")
    assert ledger.runs(task.id) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lease_s", 0),
        ("lease_s", float("nan")),
        ("agent_attempts", 0),
        ("agent_attempts", 101),
        ("agent_attempts", True),
        ("kill_grace", -1),
        ("stall_timeout_s", 0),
        ("stall_timeout_s", float("inf")),
        ("actor", " "),
        ("forced", "yes"),
        ("clock", 3),
    ],
)
def test_a_bad_option_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=f"^{field} must be") as caught:
        AttemptOptions(**{field: value})  # type: ignore[arg-type]
    assert caught.value.field == field


def test_options_are_frozen_and_evolve() -> None:
    options = AttemptOptions()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        options.lease_s = 1  # type: ignore[misc]
    assert attrs.evolve(options, agent_attempts=3).agent_attempts == 3
    with pytest.raises(InvalidInput, match="agent_attempts"):
        attrs.evolve(options, agent_attempts=0)


def test_the_async_form_takes_the_same_value(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path / "l.db")
    task = ledger.create_task("t", actor="runner")
    options = AttemptOptions(actor="async-runner", lane=None)
    outcome = asyncio.run(run_attempt_async(ledger, task.id, GenericAdapter(), _fails(), options))
    assert outcome.failure_class is FailureClass.WORK
    assert ledger.runs(task.id)[0].actor == "async-runner"


def test_the_dispatcher_runner_takes_the_same_value_and_warns_the_old_keywords() -> None:
    started: list[object] = []

    def start(*args: object, **kwargs: object) -> object:
        started.append(args)
        raise FileNotFoundError(2, "no such program")

    issue = BoardIssue("A", "a", "todo", argv=["acme-agent"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = AdapterRunner(GenericAdapter(), AttemptOptions(start=start))  # type: ignore[arg-type]
    outcome = runner.run(issue, a_slot(1, "generic"))
    assert outcome.failure_class is FailureClass.ENVIRONMENT
    assert len(started) == 1
    with pytest.warns(DeprecationWarning, match=r"AdapterRunner\(\.\.\., start=\)"):
        old = AdapterRunner(GenericAdapter(), start=start)
    assert old.options.start is start
