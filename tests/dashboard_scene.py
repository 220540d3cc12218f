"""A ledger the dashboard can show, for its tests, its benchmark and its screenshot.

`make_scene(folder)` writes a SQLite ledger with one card of every kind a board has (an
issue blocked on environment, one blocked on work, one backing off on upstream, one
running, one done, one never dispatched), a tokens file with an operator (`agent.operate`)
and a viewer (no role), and returns them with a `LedgerApp` over them. `extra_tasks` adds
that many more dispatched issues (one failed attempt each), for the size checks.
`add_lanes(ledger, ids)` adds runs on two vendor lanes, one left parked and one stopped.
With `board=True` the app shows `BOARD`, a board file of those issues in columns of its
own, with titles, and one issue never dispatched (`UNDISPATCHED`).

`launch(playwright)` starts the Chromium `tests/chromium.py` finds (Debian's, one on PATH,
one in Playwright's cache, or the one `make unit` installed without root) through
Playwright, headless, with the flags this machine's closed network needs (never the
library's own browser download). `CHROMIUM` is that path, or None when there is none.
"""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path
from typing import Any

import attrs
from chromium import find_chromium

from execkit._classify import FailureClass
from execkit.dispatch import JsonFileBoard
from execkit.ledger import Ledger, open_ledger
from execkit.server import LedgerApp, TokenFile, add_token

CHROMIUM: Path | None = find_chromium()
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ME = pwd.getpwuid(os.geteuid()).pw_name
ENV_REASON = "codex: program not found on PATH: install it with `npm i -g @openai/codex`"
WORK_REASON = "tests failed: 3 of 41 (test_parse_dates)"


@attrs.define
class Scene:
    folder: Path
    ledger: Ledger
    app: LedgerApp
    operator: str  # the ledger's owner's token, with agent.operate
    viewer: str  # a token with no role
    ids: dict[str, str]  # issue id -> task id

    def close(self) -> None:
        self.app.close()
        self.ledger.close()


def fail(
    ledger: Ledger,
    task_id: str,
    n: int,
    klass: FailureClass,
    reason: str,
    *,
    ago_s: float = 0.0,
) -> None:
    for i in range(n):
        at = time.time() - ago_s + i * 60.0 if ago_s else None
        run = ledger.start_run(
            task_id, request_key=f"{task_id}-{i}", actor="dispatcher", ignore_backoff=True, now=at
        )
        ledger.finish_run(
            run.id, "failed", failure_class=klass, reason=reason, now=at + 30 if at else None
        )


PARKED_LANE = "claude/default"
STOPPED_LANE = "codex/default"
STOP_REASON = "codex: the API key was refused (HTTP 401): log in again with `codex login`"


def add_lanes(ledger: Ledger, ids: dict[str, str]) -> dict[str, str]:
    """Two vendor lanes with different histories, made through the library: on
    `PARKED_LANE` a task succeeds and another fails upstream with the vendor's stated reset
    an hour away (the lane parks until then); on `STOPPED_LANE` a task fails twice on its
    work and then on its credentials (the lane stops, the reason is the fix). Returns
    {task id: lane} for every task that ran on a lane."""
    lane_of: dict[str, str] = {}

    def run_on(name: str, lane: str, status: str, **finish: Any) -> None:
        if name not in ids:
            ids[name] = ledger.create_task(f"board:{name}", actor="dispatcher").id
        task_id = ids[name]
        n = len(ledger.runs(task_id))
        run = ledger.start_run(
            task_id,
            request_key=f"{task_id}-lane-{n}",
            actor="dispatcher",
            ignore_backoff=True,
            lane=lane,
        )
        ledger.finish_run(run.id, status, **finish)
        lane_of[task_id] = lane

    run_on("ENG-201", PARKED_LANE, "succeeded")
    run_on(
        "ENG-202",
        PARKED_LANE,
        "failed",
        failure_class=FailureClass.UPSTREAM,
        reason="claude: usage limit reached",
        not_before=time.time() + 3600.0,
        lane_cause="reset",
    )
    for _ in range(2):
        run_on(
            "ENG-203", STOPPED_LANE, "failed", failure_class=FailureClass.WORK, reason=WORK_REASON
        )
    run_on(
        "ENG-203",
        STOPPED_LANE,
        "failed",
        failure_class=FailureClass.ENVIRONMENT,
        reason=STOP_REASON,
        lane_cause="credentials",
    )
    return lane_of


# The scene's board: its own columns (not the ledger's states), each issue with a title.
BOARD_COLUMNS = ["Backlog", "In progress", "Needs a human", "Shipped"]
BOARD_ISSUES = {
    "ENG-101": ("Needs a human", "Port the parser to the new tokenizer"),
    "ENG-102": ("Needs a human", "Fix the date parsing of invoices"),
    "ENG-103": ("In progress", "Rate-limit the importer"),
    "ENG-104": ("In progress", "Rename fetch_rows"),
    "ENG-105": ("Shipped", "Bump the lockfile"),
    "ENG-106": ("Backlog", "Write the changelog"),
    "ENG-107": ("Backlog", "Profile the exporter"),
}
UNDISPATCHED = "ENG-107"


def write_board(path: Path) -> Path:
    doc = {
        "states": [
            {"name": "Backlog", "eligible": True},
            "In progress",
            {"name": "Needs a human", "terminal": True},
            {"name": "Shipped", "terminal": True},
        ],
        "issues": [
            {"id": issue, "title": title, "state": column}
            for issue, (column, title) in BOARD_ISSUES.items()
        ],
    }
    path.write_text(json.dumps(doc, indent=2))
    return path


def make_scene(folder: Path, *, extra_tasks: int = 0, board: bool = False) -> Scene:
    folder.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(folder / "ledger.db")
    ids: dict[str, str] = {}

    def issue(name: str) -> str:
        ids[name] = ledger.create_task(f"board:{name}", actor="dispatcher").id
        return ids[name]

    fail(ledger, issue("ENG-101"), 1, FailureClass.ENVIRONMENT, ENV_REASON)
    fail(ledger, issue("ENG-102"), 3, FailureClass.WORK, WORK_REASON)
    fail(ledger, issue("ENG-103"), 1, FailureClass.UPSTREAM, "HTTP 429: rate limited")
    ledger.start_run(
        issue("ENG-104"), request_key="running", actor="dispatcher", workspace="/srv/ws/ENG-104"
    )
    done = ledger.start_run(issue("ENG-105"), request_key="done", actor="dispatcher")
    ledger.finish_run(done.id, "succeeded")
    issue("ENG-106")
    for i in range(extra_tasks):
        # Spread over the last hours, so the chart has a shape; every fourth one was work.
        task = ledger.create_task(f"board:BULK-{i}", actor="dispatcher")
        klass = FailureClass.WORK if i % 4 == 3 else FailureClass.UPSTREAM
        reason = WORK_REASON if klass is FailureClass.WORK else "HTTP 503: overloaded"
        fail(ledger, task.id, 1, klass, reason, ago_s=3600.0 * (1 + i % 6))
    tokens = folder / "tokens.json"
    operator = add_token(tokens, ME, ["agent.operate"])
    viewer = add_token(tokens, "viola", [])
    shown = JsonFileBoard(write_board(folder / "board.json")) if board else None
    app = LedgerApp(ledger, TokenFile(tokens), board=shown)
    return Scene(folder, ledger, app, operator, viewer, ids)


def launch(playwright: Any) -> Any:
    """The Chromium `find_chromium` found, headless, under Playwright."""
    if CHROMIUM is None:
        raise RuntimeError("no Chromium found: `python tests/chromium.py ensure` installs one")
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def screenshot(target: Path) -> None:
    """Write the picture of the dashboard in docs/ (`python tests/dashboard_scene.py`)."""
    import tempfile

    from playwright.sync_api import sync_playwright

    from execkit.server import ServerThread

    with tempfile.TemporaryDirectory() as folder:
        made = make_scene(Path(folder), extra_tasks=16)
        add_lanes(made.ledger, made.ids)
        try:
            with ServerThread(made.app) as running, sync_playwright() as playwright:
                browser = launch(playwright)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"{running.url}/dashboard")
                page.fill("#token", made.operator)
                page.click("#sign-in-form button[type=submit]")
                page.wait_for_selector("#board .card")
                page.locator(f"#board .card[data-task-id='{made.ids['ENG-102']}']").click()
                page.wait_for_selector("#task-panel:not([hidden]) #task-runs tbody tr")
                page.screenshot(path=str(target), full_page=True)
                browser.close()
        finally:
            made.close()


if __name__ == "__main__":
    screenshot(Path(__file__).resolve().parent.parent / "docs" / "dashboard.png")
