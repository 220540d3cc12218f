"""Spend caps (issue #45) on SQLite, PostgreSQL and through `execkit serve`: caps stored
in the ledger, a task's own budget compare-and-set, and admission holding every cap that
applies, racing admissions included."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_backends import AnyLedger, open_at
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit._errors import (
    AdmissionRefused,
    Conflict,
    InvalidInput,
    SpendCapReached,
    TaskBlocked,
)
from execkit._usage import Usage, UsdSource
from execkit.cli import main
from execkit.dispatch import spend_report
from execkit.ledger import (
    SpendCap,
    SpendConfig,
    SpendWindow,
    Task,
    TaskBudget,
    iter_task_values_with_last,
    window_bounds,
)

# 2027-01-15 08:00:00 UTC, a Friday.
NOW = 1_800_000_000.0
MIDNIGHT = 1_799_971_200.0  # 2027-01-15 00:00 UTC
LANE = "claude/default"


def paid(usd: float, tokens: int = 1000) -> Usage:
    return Usage(input_tokens=tokens, usd=usd, usd_source=UsdSource.REPORTED)


def test_windows_begin_and_reopen_at_their_boundaries() -> None:
    day = SpendCap(SpendWindow.DAY, usd=1.0)
    assert window_bounds(day, NOW) == (MIDNIGHT, MIDNIGHT + 86400)
    week = SpendCap("week", usd=1.0)
    monday = MIDNIGHT - 4 * 86400
    assert window_bounds(week, NOW) == (monday, monday + 7 * 86400)
    paris = SpendCap(SpendWindow.DAY, usd=1.0, tz="Europe/Paris")
    assert window_bounds(paris, NOW) == (MIDNIGHT - 3600, MIDNIGHT - 3600 + 86400)
    rolling = SpendCap(SpendWindow.ROLLING_5H, tokens=10)
    assert window_bounds(rolling, NOW) == (NOW - 18000, NOW + 18000)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"window": "month", "usd": 1.0}, "window"),
        ({"window": "day", "usd": -1.0}, "usd"),
        ({"window": "day", "usd": 0.0}, "usd"),
        ({"window": "day", "tokens": 0}, "tokens"),
        ({"window": "day", "usd": 1.0, "tz": "Mars/Olympus"}, "tz"),
        ({"window": "day", "usd": 1.0, "lane": "nolane"}, "lane"),
    ],
)
def test_a_bad_cap_is_refused_naming_its_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        SpendCap(**fields)  # type: ignore[arg-type]
    assert refused.value.field == field


def test_caps_are_stored_in_the_ledger_and_audited(ledger: AnyLedger) -> None:
    assert ledger.spend_config() == SpendConfig()
    config = ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=10.0), actor=ME, floor_usd=0.25)
    assert config.caps == (SpendCap(SpendWindow.DAY, usd=10.0),) and config.floor_usd == 0.25
    lane_cap = SpendCap(SpendWindow.ROLLING_5H, lane=LANE, tokens=100_000)
    config = ledger.set_spend_cap(lane_cap, actor=ME)
    assert set(config.caps) == {SpendCap(SpendWindow.DAY, usd=10.0), lane_cap}
    assert ledger.spend_config() == config
    removed = ledger.set_spend_cap(SpendCap(SpendWindow.DAY), actor=ME)
    assert removed.caps == (lane_cap,)
    actions = [event.action for event in ledger.audit_events()]
    assert actions.count("spend.caps") == 3
    with pytest.raises(InvalidInput):
        ledger.set_spend_cap(actor=ME, floor_usd=-1.0)
    assert ledger.spend_config() == removed


def test_a_task_budget_is_compare_and_set_and_audited(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor=ME)
    assert ledger.task_budget(task.id) == TaskBudget(task.id)
    budget = ledger.set_task_budget(
        task.id, usd=1.0, tokens=None, expected_usd=None, expected_tokens=None, actor=ME
    )
    assert budget == TaskBudget(task.id, 1.0, None) == ledger.task_budget(task.id)
    with pytest.raises(Conflict, match=r"usd 1\.0"):
        ledger.set_task_budget(
            task.id, usd=2.0, tokens=None, expected_usd=None, expected_tokens=None, actor=ME
        )
    assert ledger.task_budget(task.id).usd == 1.0
    assert [e.action for e in ledger.audit_events(task.id)].count("task.set_budget") == 1


def test_admission_holds_a_days_cap_and_says_when_it_reopens(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.4)
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(4)]
    first = ledger.start_run(tasks[0], request_key="a", actor=ME, now=NOW)
    ledger.start_run(tasks[1], request_key="b", actor=ME, now=NOW + 1)
    with pytest.raises(SpendCapReached) as refused:
        ledger.start_run(tasks[2], request_key="c", actor=ME, now=NOW + 2)
    assert refused.value.cap == "the day's budget"
    assert refused.value.reopens_at == MIDNIGHT + 86400
    assert "2027-01-16T00:00" in str(refused.value) and isinstance(refused.value, AdmissionRefused)
    assert ledger.runs(tasks[2]) == []  # uncharged: no run
    # The first run's actual cost replaces its reservation: room for one more.
    ledger.finish_run(first.id, "succeeded", usage=paid(0.1), now=NOW + 3)
    ledger.start_run(tasks[2], request_key="c2", actor=ME, now=NOW + 4)
    with pytest.raises(SpendCapReached):
        ledger.start_run(tasks[3], request_key="d", actor=ME, now=NOW + 5)
    # The next day is a new window.
    assert ledger.start_run(tasks[3], request_key="d2", actor=ME, now=MIDNIGHT + 86400).attempt == 1


def test_an_unknown_cost_keeps_its_reservation(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.5)
    a, b, c = (ledger.create_task(name, actor=ME).id for name in "abc")
    run = ledger.start_run(a, request_key="a", actor=ME, now=NOW)
    ledger.finish_run(run.id, "abandoned", stopped=True, now=NOW + 1)  # no report: unknown
    ledger.start_run(b, request_key="b", actor=ME, now=NOW + 2)
    with pytest.raises(SpendCapReached):
        ledger.start_run(c, request_key="c", actor=ME, now=NOW + 3)


def test_a_lanes_cap_holds_only_its_lane_and_the_reservation_reads_its_costs(
    ledger: AnyLedger,
) -> None:
    ledger.set_spend_cap(
        SpendCap(SpendWindow.ROLLING_5H, lane=LANE, usd=2.0), actor=ME, floor_usd=0.1
    )
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(5)]
    # One costly run on the lane: the p90 of its recent costs is now $1.50.
    run = ledger.start_run(tasks[0], request_key="0", actor=ME, now=NOW - 20000, lane=LANE)
    ledger.finish_run(run.id, "succeeded", usage=paid(1.5), now=NOW - 19000)
    ledger.start_run(tasks[1], request_key="1", actor=ME, now=NOW, lane=LANE)
    with pytest.raises(SpendCapReached) as refused:
        ledger.start_run(tasks[2], request_key="2", actor=ME, now=NOW + 1, lane=LANE)
    assert refused.value.cap == f"the rolling 5h budget of lane {LANE}"
    assert refused.value.reopens_at == NOW + 18000  # when the run at NOW leaves the window
    # Another lane, and no lane at all, are not held by it.
    ledger.start_run(tasks[3], request_key="3", actor=ME, now=NOW + 2, lane="codex/default")
    ledger.start_run(tasks[4], request_key="4", actor=ME, now=NOW + 3)


def test_eighty_percent_is_warned_once_a_window(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, tokens=1000), actor=ME, floor_tokens=300)
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(6)]
    for n in range(3):
        ledger.start_run(tasks[n], request_key=str(n), actor=ME, now=NOW + n)
    warnings = [e for e in ledger.audit_events() if e.action == "spend.warning"]
    assert len(warnings) == 1 and warnings[0].task_id == tasks[2]
    assert warnings[0].detail["cap"] == "the day's budget"
    for n in range(3, 6):
        ledger.start_run(tasks[n], request_key=str(n), actor=ME, now=MIDNIGHT + 86400 + n)
    warned = [e for e in ledger.audit_events() if e.action == "spend.warning"]
    assert len(warned) == 2  # the next day's window warns once again


def test_a_task_past_its_budget_is_blocked_on_spend_until_raised(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(actor=ME, floor_usd=0.2)
    task = ledger.create_task("t", actor=ME).id
    ledger.set_task_budget(
        task, usd=1.0, tokens=None, expected_usd=None, expected_tokens=None, actor=ME
    )
    run = ledger.start_run(task, request_key="1", actor=ME, now=NOW)
    ledger.finish_run(run.id, "failed", usage=paid(1.2), now=NOW + 1)  # charged: it ran
    assert ledger.run(run.id).usd == 1.2
    shown = ledger.get_task(task, now=NOW + 2)
    assert (shown.state, shown.blocked_on, shown.ready) == ("blocked", "spend", False)
    assert "execkit task set-budget" in (shown.reason or "")
    with pytest.raises(TaskBlocked, match=r"blocked on spend.*execkit task set-budget"):
        ledger.start_run(task, request_key="2", actor=ME, now=NOW + 2, ignore_backoff=True)
    ledger.set_task_budget(
        task, usd=3.0, tokens=None, expected_usd=1.0, expected_tokens=None, actor=ME
    )
    raised = ledger.get_task(task, now=NOW + 3)
    # Raised: it may run, and it is an operator's retry (a given-up card comes back).
    assert (raised.blocked_on, raised.retry_pending) == (None, True)
    again = ledger.start_run(task, request_key="3", actor=ME, now=NOW + 3)  # no backoff wait
    assert (again.attempt, again.forced) == (2, True)
    audited = [e for e in ledger.audit_events(task) if e.action == "task.set_budget"]
    assert [e.detail.get("retry", False) for e in audited] == [False, True]


def _budgeted(ledger: Any, title: str, usd: float | None, tokens: int | None = None) -> str:
    task = ledger.create_task(title, actor=ME).id
    ledger.set_task_budget(
        task, usd=usd, tokens=tokens, expected_usd=None, expected_tokens=None, actor=ME
    )
    return str(task)


def _listings_match_get_task(ledger: Any, now: float) -> dict[str, tuple[str, str | None]]:
    """Each task's (state, blocked_on) as every listing shows it, checked to be what
    `get_task` shows, field for field."""
    whole = {task.id: ledger.get_task(task.id, now=now) for task in ledger.list_tasks(now=now)}
    listed = {
        "list_tasks": ledger.list_tasks(now=now),
        "iter_tasks_with_last": [task for task, _ in ledger.iter_tasks_with_last(now=now)],
        "list_tasks_with_last": [task for task, _ in ledger.list_tasks_with_last(now=now)],
        "iter_task_values_with_last": [
            Task(*values) for values, _ in iter_task_values_with_last(ledger, now=now)
        ],
    }
    for name, tasks in listed.items():
        assert {task.id: task for task in tasks} == whole, name
    return {task.id: (task.state, task.blocked_on) for task in whole.values()}


def test_a_listing_shows_a_task_its_budget_holds_as_get_task_does(ledger: AnyLedger) -> None:
    # `execkit status`, `task list` and the dashboard read listings: a task its own budget
    # blocks must not read `ready` there (the dispatcher gives its card up as blocked).
    ledger.set_spend_cap(actor=ME, floor_usd=0.2, floor_tokens=100)
    plain = ledger.create_task("no budget", actor=ME).id
    roomy = _budgeted(ledger, "room left", 5.0)
    spent = _budgeted(ledger, "spent", 1.0)
    tokens = _budgeted(ledger, "tokens spent", None, 1500)
    # Admitted on its floor; while it runs it holds its reservation (the lane's costs).
    running = _budgeted(ledger, "held, running", 0.6)
    done = _budgeted(ledger, "spent, done", 1.0)
    for n, task in enumerate((plain, roomy, spent, tokens, running, done)):
        run = ledger.start_run(task, request_key=str(n), actor=ME, now=NOW + n)
        status = "succeeded" if task == done else "failed"
        cost = paid(0.3) if task == running else paid(0.9, 1450)
        ledger.finish_run(run.id, status, usage=cost, now=NOW + n + 0.5)
    ledger.start_run(running, request_key="again", actor=ME, now=NOW + 10, ignore_backoff=True)
    shown = _listings_match_get_task(ledger, NOW + 20)
    assert shown == {
        plain: ("ready", None),
        roomy: ("ready", None),
        spent: ("blocked", "spend"),  # $0.90 spent + the $0.20 floor > $1.00
        tokens: ("blocked", "spend"),  # 1,450 + 100 > 1,500
        running: ("running", None),
        done: ("done", None),
    }
    # Raised, it shows what its policies say again, in the listings too.
    ledger.set_task_budget(
        spent, usd=2.0, tokens=None, expected_usd=1.0, expected_tokens=None, actor=ME
    )
    assert _listings_match_get_task(ledger, NOW + 21)[spent] == ("ready", None)


def test_caps_work_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    config = client.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.6)
    assert config == remote.ledger.spend_config() == client.spend_config()
    a, b = client.create_task("a", actor=ME), client.create_task("b", actor=ME)
    client.start_run(a.id, request_key="1", actor=ME)
    with pytest.raises(SpendCapReached) as refused:
        client.start_run(b.id, request_key="2", actor=ME)
    assert refused.value.cap == "the day's budget" and refused.value.reopens_at is not None
    (use,) = client.spend_windows()
    assert (use.full, use.usd, use.name) == (True, 0.6, "the day's budget")
    assert use.reopens_at == refused.value.reopens_at
    budget = client.set_task_budget(
        b.id, usd=None, tokens=5000, expected_usd=None, expected_tokens=None, actor=ME
    )
    assert budget == client.task_budget(b.id) == TaskBudget(b.id, None, 5000)


# -- racing admissions ---------------------------------------------------------------------


def _race(target: str, tasks: list[str], at: float) -> int:
    """Admit one run of each task at once, each from its own connection; how many ran."""
    barrier = threading.Barrier(len(tasks))
    admitted: list[str] = []
    errors: list[BaseException] = []

    def admit(task_id: str) -> None:
        with open_at(target) as ledger:
            barrier.wait()
            try:
                admitted.append(
                    ledger.start_run(task_id, request_key=f"k-{task_id}", actor=ME, now=at).id
                )
            except SpendCapReached:
                pass
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=admit, args=(task_id,)) for task_id in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return len(admitted)


def test_64_racing_admissions_never_reserve_past_a_days_cap(
    ledger: AnyLedger, ledger_target: str
) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=3.0), actor=ME, floor_usd=0.1)
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(64)]
    assert _race(ledger_target, tasks, NOW) == 30  # 30 x $0.10 fill $3.00 exactly
    running = ledger.running_runs()
    assert len(running) == 30


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    floor=st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.7]),
    cap=st.sampled_from([0.2, 1.0, 1.55, 2.0]),
    racers=st.integers(min_value=2, max_value=12),
)
def test_the_reserved_sum_never_passes_the_cap(
    new_target: Callable[[], str], floor: float, cap: float, racers: int
) -> None:
    target = new_target()
    with open_at(target) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=cap), actor=ME, floor_usd=floor)
        tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(racers)]
    admitted = _race(target, tasks, NOW)
    assert admitted * floor <= cap + 1e-9
    assert admitted == min(racers, int(cap / floor + 1e-9))  # and no room is left unused


# -- the CLI -----------------------------------------------------------------------------


def test_budget_set_and_show_and_task_budgets_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--db", str(tmp_path / "ledger.db")]

    def cli(*argv: str) -> tuple[int, Any]:
        capsys.readouterr()
        code = main([*argv, *db, "--json"])
        out = capsys.readouterr().out
        return code, json.loads(out) if out else None

    assert main(["task", "create", "first", *db]) == 0  # the ledger, made
    code, config = cli("budget", "set", "--day-usd", "10", "--floor-usd", "0.25")
    assert code == 0 and config["caps"] == [
        {"window": "day", "lane": None, "usd": 10.0, "tokens": None, "tz": "UTC"}
    ]
    assert config["floor_usd"] == 0.25
    # A field not given keeps the stored one; another window of a lane is another cap.
    cli("budget", "set", "--day-tokens", "500000")
    cli("budget", "set", "--lane", LANE, "--usd", "2", "--window", "5h", "--tz", "Europe/Paris")
    code, shown = cli("budget", "show")
    assert shown["caps"] == [
        {"window": "day", "lane": None, "usd": 10.0, "tokens": 500000, "tz": "UTC"},
        {"window": "5h", "lane": LANE, "usd": 2.0, "tokens": None, "tz": "Europe/Paris"},
    ]
    cli("budget", "set", "--day-usd", "off", "--day-tokens", "off")
    assert len(cli("budget", "show")[1]["caps"]) == 1
    capsys.readouterr()
    assert main(["budget", "show", *db]) == 0
    shown_text = capsys.readouterr().out
    assert f"5h    lane {LANE}" in shown_text
    assert f"the rolling 5h budget of lane {LANE}: $0.00 and 0 tokens since" in shown_text
    # Bad values: `invalid` naming the flag, nothing stored.
    assert main(["budget", "set", "--day-usd", "-3", *db]) == 3
    assert "--day-usd" in capsys.readouterr().err
    assert main(["budget", "set", "--usd", "1", *db]) == 3  # no --window
    assert main(["budget", "set", "--day-usd", "1", "--tz", "Nowhere/Else", *db]) == 3

    code, task = cli("task", "create", "capped", "--budget-usd", "1.5", "--budget-tokens", "9000")
    assert code == 0 and (task["budget_usd"], task["budget_tokens"]) == (1.5, 9000)
    assert main(["task", "show", task["id"], *db]) == 0
    assert "spend budget $1.50 and 9,000 tokens" in capsys.readouterr().out
    code, budget = cli("task", "set-budget", task["id"], "--usd", "3")
    assert budget == {"task_id": task["id"], "usd": 3.0, "tokens": 9000}
    assert cli("task", "set-budget", task["id"], "--usd", "4", "--expected-usd", "1")[0] == 5
    capsys.readouterr()
    assert main(["task", "set-budget", task["id"], "--tokens", "off", *db]) == 0
    assert "budget $3.00" in capsys.readouterr().out


# -- spend reports (item 5) ----------------------------------------------------------------


def _spent_ledger(ledger: Any) -> None:
    """Two issues: one done after a failed attempt (2 runs, $0.30 and $0.50), one failed
    with an unknown cost; runs on two lanes and two models, over two days."""
    done = ledger.create_task("board:ISS-1", actor=ME).id
    open_ = ledger.create_task("board:ISS-2", actor=ME).id
    one = ledger.start_run(done, request_key="1", actor=ME, now=NOW, lane=LANE)
    ledger.finish_run(one.id, "failed", usage=Usage(input_tokens=100, usd=0.3,
                      usd_source=UsdSource.REPORTED, model="sonnet"), now=NOW + 1)  # fmt: skip
    two = ledger.start_run(
        done, request_key="2", actor=ME, now=NOW + 86400, lane=LANE, ignore_backoff=True
    )
    ledger.finish_run(two.id, "succeeded", usage=Usage(output_tokens=50, usd=0.5,
                      usd_source=UsdSource.PRICED, model="sonnet"), now=NOW + 86401)  # fmt: skip
    three = ledger.start_run(open_, request_key="3", actor=ME, now=NOW + 86402,
                             lane="codex/default")  # fmt: skip
    ledger.finish_run(three.id, "failed", usage=Usage(input_tokens=7, model="gpt-5"),
                      now=NOW + 86403)  # fmt: skip


def test_a_spend_report_groups_each_run_once(ledger: AnyLedger) -> None:
    _spent_ledger(ledger)
    rows = ledger.spend_rows()
    assert [row.usd for row in rows] == [0.3, 0.5, None]
    assert [row.lane for row in rows] == [LANE, LANE, "codex/default"]
    by_issue = spend_report(rows, "issue")
    assert [(g.key, g.runs, g.unknown_usd) for g in by_issue.groups] == [
        ("ISS-1", 2, 0),
        ("ISS-2", 1, 1),
    ]
    assert by_issue.groups[0].usd == pytest.approx(0.8) and by_issue.total.tokens == 157
    assert by_issue.done == 1 and by_issue.per_done == pytest.approx(0.8)
    assert [g.key for g in spend_report(rows, "model").groups] == ["sonnet", "gpt-5"]
    assert [g.key for g in spend_report(rows, "day").groups] == ["2027-01-15", "2027-01-16"]
    assert [g.runs for g in spend_report(rows, "lane").groups] == [2, 1]
    assert len(ledger.spend_rows(since=NOW + 10)) == 2
    with pytest.raises(InvalidInput) as refused:
        spend_report(rows, "week")
    assert refused.value.field == "by"


def test_spend_rows_come_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    _spent_ledger(client)
    assert client.spend_rows() == remote.ledger.spend_rows()
    assert client.spend_rows(since=NOW + 10) == remote.ledger.spend_rows(since=NOW + 10)


def test_execkit_spend_prints_usd_tokens_runs_and_the_cost_of_a_done_issue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    with open_at(str(db)) as ledger:
        _spent_ledger(ledger)
    capsys.readouterr()
    assert main(["spend", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "ISS-1" in out and "$0.80" in out and "$0.00+?" in out
    assert "$ per done issue: $0.80 (1 done, 2 runs, failed ones included)" in out
    assert main(["spend", "--by", "day", "--since", "2027-01-16", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [g["key"] for g in report["groups"]] == ["2027-01-16"]
    assert report["total"]["runs"] == 2 and report["usd_per_done_issue"] == 0.5
    assert main(["spend", "--since", "yesterday", "--db", str(db)]) == 3
    assert "--since" in capsys.readouterr().err


def test_status_shows_each_tasks_spend_and_what_a_full_day_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    with open_at(str(db)) as ledger:
        assert main(["status", "--db", str(db)]) == 0  # no cost yet: no SPEND column
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.6)
        done = ledger.create_task("board:ISS-1", actor=ME).id
        ledger.create_task("board:ISS-2", actor=ME)
        run = ledger.start_run(done, request_key="1", actor=ME)
        ledger.finish_run(run.id, "succeeded", usage=paid(0.42))
    capsys.readouterr()
    assert main(["status", "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-3:] == ["CLASS", "SPEND", "REASON"]
    assert "$0.42" in lines[1].split()
    assert "waiting on the day's budget until" in lines[2] and "(budget)" in lines[2]


def _admit_from_a_process(
    target: str, tasks: list[str], at: float, barrier: Any, results: Any
) -> None:
    """A child process: admit one run of each of `tasks` at once, a thread each with its
    own connection, after every process is ready; put how many ran."""
    threads_ready = threading.Barrier(len(tasks), action=barrier.wait)
    admitted: list[str] = []
    errors: list[str] = []

    def admit(task_id: str) -> None:
        with open_at(target) as ledger:
            threads_ready.wait()
            try:
                admitted.append(ledger.start_run(task_id, request_key=f"k-{task_id}", actor=ME,
                                                 now=at).id)  # fmt: skip
            except SpendCapReached:
                pass
            except Exception as exc:
                errors.append(repr(exc))

    threads = [threading.Thread(target=admit, args=(task_id,)) for task_id in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put((len(admitted), errors))


def test_64_admissions_racing_from_8_processes_never_reserve_past_a_days_cap(
    ledger: AnyLedger, ledger_target: str
) -> None:
    import multiprocessing

    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=2.0), actor=ME, floor_usd=0.1)
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(64)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(8), context.Queue()
    children = [
        context.Process(
            target=_admit_from_a_process,
            args=(ledger_target, tasks[n::8], NOW, barrier, results),
        )
        for n in range(8)
    ]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=300) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert [errors for _, errors in outcomes] == [[]] * 8
    assert sum(count for count, _ in outcomes) == 20  # 20 x $0.10 fill $2.00 exactly
    assert len(ledger.running_runs()) == 20


def test_a_lanes_estimate_is_read_once_a_minute_once_it_has_one(ledger: AnyLedger) -> None:
    # A run's reservation is its lane's estimate (the p90 of its recent reported costs),
    # read at most once a minute (ESTIMATE_TTL_S) by a ledger handle; a lane with no cost
    # reported yet keeps no estimate, so its first cost counts at the next admission.
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=100.0), actor=ME, floor_usd=0.1)
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(4)]

    def reserved(n: int, at: float) -> float | None:
        run = ledger.start_run(tasks[n], request_key=str(n), actor=ME, now=at, lane=LANE)
        room = ledger.spend_room(run.id, now=at)
        ledger.finish_run(run.id, "succeeded", usage=paid(1.0 + 2 * n), now=at + 1)
        return room.usd

    assert reserved(0, NOW) == pytest.approx(0.1)  # no cost yet: the floor
    assert reserved(1, NOW + 2) == pytest.approx(1.0)  # read again: the first run's $1
    assert reserved(2, NOW + 4) == pytest.approx(1.0)  # kept: $3 came after the read
    assert reserved(3, NOW + 63) == pytest.approx(5.0)  # a minute on: p90 of 1, 3, 5
