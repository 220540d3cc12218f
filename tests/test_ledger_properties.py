"""Properties: no sequence of operations admits more runs than the limit in force; admission
refuses exactly when the task's projection says no run may start; keyed requests replay.
On both backends: each example gets a fresh ledger (a new file, or a new PostgreSQL schema)."""

from __future__ import annotations

import getpass
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from ledger_backends import open_at

from execkit._budget import WorkBudget
from execkit._classify import FailureClass
from execkit._errors import AdmissionRefused, Conflict, Forbidden

_OUTCOMES = st.sampled_from(
    [
        ("failed", None),
        ("failed", FailureClass.WORK),
        ("failed", FailureClass.UPSTREAM),
        ("failed", FailureClass.ENVIRONMENT),
        ("abandoned", None),
        ("succeeded", None),
    ]
)


class LimitMachine(RuleBasedStateMachine):
    """Random creates, limit changes, starts (forced or not) and finishes on one real ledger.

    The model keeps only what the test states: the limit in force per task and how many runs
    each task has had. The ledger decides everything else; the checks are that it never
    admits past the limit in force, numbers attempts 1..N, and refuses with
    `attempt_limit` only when the limit is really used up.
    """

    tasks: Bundle[str] = Bundle("tasks")

    def __init__(self, new_target: Callable[[], str]) -> None:
        super().__init__()
        # A fresh, empty ledger per example: a new file, or a new PostgreSQL schema.
        self.ledger = open_at(
            new_target(), budget=WorkBudget(max_attempts=3, max_uncharged_attempts=2)
        )
        self.limit: dict[str, int] = {}
        self.started: dict[str, int] = {}
        self.running: dict[str, str] = {}
        self.accepted: dict[str, tuple[str, str]] = {}  # request key -> (task, run id)
        self.creations: dict[str, tuple[str, int]] = {}  # idempotency key -> (task, limit)
        self.keys = 0
        self.now = 1000.0
        # The role is a grant in the ledger: its owner (this user) grants it.
        self.ledger.grant_role("op", "agent.operate", actor=getpass.getuser())

    def teardown(self) -> None:
        self.ledger.close()

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    @initialize(target=tasks, limit=st.integers(1, 3))
    def create_limited(self, limit: int) -> str:
        return self._create(limit)

    @rule(target=tasks, limit=st.integers(0, 4))
    def create(self, limit: int) -> str:
        return self._create(limit)

    def _create(self, limit: int) -> str:
        key = f"c{len(self.creations)}"
        task = self.ledger.create_task(
            "t", max_attempts=limit, idempotency_key=key, actor="creator", now=self._tick()
        )
        self.creations[key] = (task.id, limit)
        self.limit[task.id] = limit
        self.started[task.id] = 0
        return task.id

    @precondition(lambda self: bool(self.creations))
    @rule(data=st.data(), other_limit=st.booleans())
    def replay_creation(self, data: st.DataObject, other_limit: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.creations)))
        task_id, limit = self.creations[key]
        asked = limit + 1 if other_limit else limit
        try:
            task = self.ledger.create_task("t", max_attempts=asked, idempotency_key=key, actor="x")
        except Conflict:
            assert other_limit
            return
        assert not other_limit
        assert task.id == task_id

    @rule(task=tasks, new=st.integers(1, 5), operator=st.booleans(), stale=st.booleans())
    def set_limit(self, task: str, new: int, operator: bool, stale: bool) -> None:
        expected = self.limit[task] + (1 if stale else 0)
        actor = "op" if operator else "creator"
        try:
            self.ledger.set_attempt_limit(task, new, expected_max_attempts=expected, actor=actor)
        except Forbidden:
            assert not operator and self.started[task] > 0
            return
        except Conflict:
            assert stale
            return
        except AdmissionRefused as refused:
            assert refused.code == "finished"
            return
        assert not stale
        self.limit[task] = new

    @rule(task=tasks, forced=st.booleans())
    def start(self, task: str, forced: bool) -> None:
        self._try_start(task, forced)

    @rule(task=tasks, outcomes=st.lists(_OUTCOMES, min_size=1, max_size=6), forced=st.booleans())
    def burst(
        self, task: str, outcomes: list[tuple[str, FailureClass | None]], forced: bool
    ) -> None:
        """Start and finish repeatedly, so the bound is reached within one step."""
        for status, klass in outcomes:
            self._try_start(task, forced)
            if task in self.running:
                self.ledger.finish_run(
                    self.running.pop(task), status, failure_class=klass, now=self._tick()
                )

    def _try_start(self, task: str, forced: bool) -> None:
        self.keys += 1
        key = f"k{self.keys}"
        limit, before = self.limit[task], self.started[task]
        at = self._tick()
        shown = self.ledger.get_task(task, now=at)
        try:
            run = self.ledger.start_run(task, request_key=key, actor="a", forced=forced, now=at)
        except AdmissionRefused as refused:
            if refused.code == "attempt_limit":
                assert limit and before >= limit
            if not forced:
                # Refused for exactly the reason the task shows: one truth about "ready".
                assert not shown.ready
                assert shown.state in ("running", "blocked", "done", "cancelled", "backoff")
                assert (refused.code == "attempt_limit") == (shown.blocked_on == "attempt_limit")
                assert (refused.code == "backoff") == (shown.state == "backoff")
            return
        assert limit == 0 or run.attempt <= limit, (run.attempt, limit)
        assert run.attempt == before + 1
        assert task not in self.running
        if not forced:
            assert shown.ready and shown.state == "ready"
        self.started[task] = run.attempt
        self.running[task] = run.id
        self.accepted[key] = (task, run.id)

    @precondition(lambda self: bool(self.accepted))
    @rule(data=st.data())
    def replay_start(self, data: st.DataObject) -> None:
        """A transport retry of an accepted start returns that run and admits nothing."""
        key = data.draw(st.sampled_from(sorted(self.accepted)))
        task, run_id = self.accepted[key]
        before = self.started[task]
        run = self.ledger.start_run(task, request_key=key, actor="a", now=self._tick())
        assert (run.id, run.task_id) == (run_id, task)
        assert self.ledger.get_task(task).attempts_started == before
        other = next((t for t in self.limit if t != task), None)
        if other is not None:
            with pytest.raises(Conflict):
                self.ledger.start_run(other, request_key=key, actor="a", now=self._tick())

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), outcome=_OUTCOMES)
    def finish(self, data: st.DataObject, outcome: tuple[str, FailureClass | None]) -> None:
        task = data.draw(st.sampled_from(sorted(self.running)))
        status, klass = outcome
        run = self.ledger.finish_run(
            self.running.pop(task), status, failure_class=klass, now=self._tick()
        )
        assert run.status == status

    @rule(task=consumes(tasks))
    def cancel(self, task: str) -> None:
        try:
            self.ledger.cancel_task(task, actor="op")
        except AdmissionRefused as refused:
            assert refused.code == "finished"

    @invariant()
    def history_matches_the_model(self) -> None:
        for task_id, count in self.started.items():
            shown = self.ledger.get_task(task_id, now=self.now)
            assert shown.attempts_started == count
            assert shown.max_attempts == self.limit[task_id]
            if shown.max_attempts and count >= shown.max_attempts:
                assert not shown.ready
        assert self.ledger.validate(now=self.now) == []


_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_no_sequence_admits_more_than_the_limit(new_target: Callable[[], str]) -> None:
    class OnThisBackend(LimitMachine):
        def __init__(self) -> None:
            super().__init__(new_target)

    run_state_machine_as_test(OnThisBackend, settings=_SETTINGS)
