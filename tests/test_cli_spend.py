"""The spend commands (issue #45) on a local ledger and through `execkit serve`
(`--remote`): caps set and shown, a task's budget, a run's cost, a refusal by a window
with its code and exit status, and the report."""

from __future__ import annotations

from test_cli_ledger import Cli, cli, remote_server  # noqa: F401 - the fixtures


def test_budget_spend_and_a_windows_refusal_locally_and_through_a_server(
    cli: Cli,  # noqa: F811
) -> None:
    assert cli("task", "create", "first")[0] == 0
    assert cli("task", "create", "second")[0] == 0
    code, config, _ = cli("budget", "set", "--day-usd", "1", "--floor-usd", "0.6")
    assert code == 0 and config["caps"][0]["usd"] == 1.0 and config["floor_usd"] == 0.6
    assert cli("budget", "show")[1] == config
    code, budget, _ = cli("task", "set-budget", "t-1", "--usd", "3")
    assert (code, budget) == (0, {"task_id": "t-1", "usd": 3.0, "tokens": None})
    # `task show` gives the task's own cap, as a board issue names it; none for another.
    shown = [cli("task", "show", task)[1] for task in ("t-1", "t-2")]
    assert [(s["budget_usd"], s["budget_tokens"]) for s in shown] == [(3.0, None), (None, None)]
    assert cli("run", "start", "t-1", "--request-key", "a")[0] == 0
    usage = '{"input_tokens": 10, "usd": 0.42, "usd_source": "reported", "model": "m"}'
    code, run, _ = cli("run", "finish", "r-1", "succeeded", "--usage", usage)
    assert (code, run["usd"], run["model"]) == (0, 0.42, "m")
    message = cli.error("spend_cap", "run", "start", "t-2", "--request-key", "b")
    assert "waiting on the day's budget until" in message
    code, report, _ = cli("spend", "--by", "task")
    assert code == 0 and [g["key"] for g in report["groups"]] == ["t-1"]
    assert report["total"]["usd"] == 0.42 and report["usd_per_done_issue"] == 0.42
    # An operator lifts the day's cap for today: the refused run is admitted now.
    code, lifted, _ = cli("budget", "override", "--window", "day")
    assert code == 0 and set(lifted["overrides"]) == {"*|day"}
    assert cli("run", "start", "t-2", "--request-key", "b2")[0] == 0
    assert "no week's budget" in cli.error("invalid", "budget", "override", "--window", "week")
    code, marked, _ = cli("budget", "subscription", "claude/default", "on")
    assert code == 0 and marked["subscription_lanes"] == ["claude/default"]
