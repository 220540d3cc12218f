"""The dashboard in a real browser: a headless Chromium driven by Playwright against
`execkit serve` on loopback (the one tests/chromium.py finds; `make test` installs one when
there is none, with or without root).

Click-throughs: a blocked card shows its fix; "retry once" runs it (audited with the
operator) and the card moves to `ready`; a viewer sees no action button and is refused
(403, nothing changed) when it posts one anyway; the chart and every panel draw. Vendor
lanes are real ones, made through the library (`start_run(lane=)`, `finish_run(lane_cause=)`):
two lanes with different histories draw different counts in the chart per lane, a parked
and a stopped lane show their state, why and when they open, an operator's "resume"
re-opens the stopped one (audited), and a viewer has no resume and is refused one. Waits are
bounded by Playwright's timeouts; nothing here measures time.

Under `CI=true` a missing browser fails the run: it is never skipped there.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_scene import (
    BOARD_COLUMNS,
    BOARD_ISSUES,
    CHROMIUM,
    ME,
    PARKED_LANE,
    STOP_REASON,
    STOPPED_LANE,
    UNDISPATCHED,
    Scene,
    add_lanes,
    fail,
    launch,
    make_scene,
)

from execkit._classify import FailureClass
from execkit.server import ServerThread

if CHROMIUM is None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError("no Chromium found: `make test` installs one (tests/chromium.py)")
    pytest.skip(
        "no Chromium found (`python tests/chromium.py ensure` installs one)",
        allow_module_level=True,
    )

from playwright.sync_api import Page, sync_playwright

WAIT_MS = 20_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as playwright:
        launched = launch(playwright)
        yield launched
        launched.close()


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[tuple[Scene, str]]:
    made = make_scene(tmp_path)
    with ServerThread(made.app) as running:
        yield made, running.url
    made.close()


def _sign_in(browser: Any, url: str, token: str) -> Page:
    page: Page = browser.new_context().new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{url}/dashboard?refresh_ms=500")
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#board .card")
    return page


def _column_of(page: Page, task_id: str) -> str | None:
    found: str | None = page.evaluate(
        "(id) => { const c = document.querySelector(`#board .card[data-task-id='${id}']`);"
        " return c ? c.closest('.column').dataset.column : null; }",
        task_id,
    )
    return found


def test_a_blocked_card_shows_its_fix_and_retry_once_moves_it(
    browser: Any, scene: tuple[Scene, str]
) -> None:
    made, url = scene
    task_id = made.ids["ENG-101"]
    page = _sign_in(browser, url, made.operator)
    card = page.locator(f"#board .column[data-column=blocked] .card[data-task-id='{task_id}']")
    assert "install it with `npm i -g @openai/codex`" in card.inner_text()
    assert "fix: fix the precondition the reason names" in card.inner_text()
    work = page.locator(f"#board .card[data-task-id='{made.ids['ENG-102']}']")
    assert "last failure: tests failed: 3 of 41" in work.inner_text()

    card.locator("button.retry-once").click()
    page.wait_for_selector(
        f"#board .column[data-column=ready] .card[data-task-id='{task_id}']", timeout=WAIT_MS
    )
    assert _column_of(page, task_id) == "ready"
    task = made.ledger.get_task(task_id)
    assert task.retry_pending
    retries = [e for e in made.ledger.audit_events(task_id) if e.action == "task.retry"]
    assert [(e.actor, e.detail["force"]) for e in retries] == [(ME, True)]


def test_a_viewer_sees_no_action_and_is_refused_when_it_posts_one(
    browser: Any, scene: tuple[Scene, str]
) -> None:
    made, url = scene
    task_id = made.ids["ENG-101"]
    page = _sign_in(browser, url, made.viewer)
    page.wait_for_selector(f"#board .card[data-task-id='{task_id}']")
    assert page.locator("button.retry-once").count() == 0
    assert "viewer" in page.inner_text("#who")
    before = made.ledger.audit_events()
    status = page.evaluate(
        """async (id) => {
            const session = await (await fetch('/dashboard/api/session')).json();
            const answer = await fetch(`/dashboard/api/tasks/${id}/retry-once`, {
                method: 'POST', body: '{}',
                headers: {'Content-Type': 'application/json', 'X-CSRF-Token': session.csrf}});
            return answer.status;
        }""",
        task_id,
    )
    assert status == 403
    assert made.ledger.audit_events() == before
    assert made.ledger.get_task(task_id).state == "blocked"


def test_every_panel_draws_and_a_task_shows_its_history(
    browser: Any, scene: tuple[Scene, str]
) -> None:
    made, url = scene
    page = _sign_in(browser, url, made.operator)
    assert page.locator("#chart svg rect[data-class=work]").count() >= 1
    assert page.locator("#chart svg rect[data-class=upstream]").count() >= 1
    assert page.locator("#chart svg rect[data-charged]").count() >= 1
    assert made.ids["ENG-103"] in page.inner_text("#retries")
    assert made.ids["ENG-104"] in page.inner_text("#in-flight")
    assert page.locator("#lanes-panel").is_hidden()  # no lane has been used yet
    page.locator(f"#board .card[data-task-id='{made.ids['ENG-102']}']").click()
    page.wait_for_selector("#task-panel:not([hidden]) #task-runs tbody tr")
    assert page.locator("#task-runs tbody tr").count() == 3
    assert "charged" in page.inner_text("#task-runs")
    # The task page's own address opens the same panel.
    page.goto(f"{url}/dashboard/tasks/{made.ids['ENG-103']}")
    page.wait_for_selector("#task-panel:not([hidden]) #task-runs tbody tr")
    assert "upstream" in page.inner_text("#task-runs")


def test_no_page_or_answer_carries_the_token_or_the_session(
    browser: Any, scene: tuple[Scene, str]
) -> None:
    made, url = scene
    page: Page = browser.new_context().new_page()
    page.set_default_timeout(WAIT_MS)
    bodies: list[str] = []
    page.on("response", lambda answer: bodies.append(answer.text()))
    page.goto(f"{url}/dashboard?refresh_ms=500")
    page.fill("#token", made.operator)
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#board .card")
    cookies = page.context.cookies()
    session = next(c for c in cookies if c["name"] == "execkit_session")
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # the script cannot read it
    page.wait_for_selector("body[data-refreshed-at]")
    html = page.content()
    for text in [*bodies, html]:
        assert made.operator not in text
        assert session["value"] not in text
    # A sign-out ends the session: the page asks for a token again.
    page.click("#sign-out")
    page.wait_for_selector("#sign-in:not([hidden])")


def _lane_figure(page: Page, lane: str) -> dict[str, str]:
    figure = page.locator(f"#lane-charts .lane-chart[data-lane='{lane}']")
    found: dict[str, str] = figure.evaluate("(node) => ({...node.dataset})")
    found["caption"] = figure.locator("figcaption").inner_text()
    found["bars"] = str(figure.locator("rect[data-class]").count())
    return found


def test_two_lanes_draw_their_own_counts(browser: Any, scene: tuple[Scene, str]) -> None:
    made, url = scene
    add_lanes(made.ledger, made.ids)
    page = _sign_in(browser, url, made.viewer)
    page.wait_for_selector("#lane-charts:not([hidden]) .lane-chart")
    lanes = page.eval_on_selector_all(
        "#lane-charts .lane-chart", "(nodes) => nodes.map((n) => n.dataset.lane)"
    )
    assert lanes == [PARKED_LANE, STOPPED_LANE, "no lane"]
    parked, stopped = _lane_figure(page, PARKED_LANE), _lane_figure(page, STOPPED_LANE)
    assert (parked["attempts"], parked["charged"], parked["uncharged"]) == ("2", "1", "1")
    assert (stopped["attempts"], stopped["charged"], stopped["uncharged"]) == ("3", "2", "1")
    assert "2 attempts" in parked["caption"] and "3 attempts" in stopped["caption"]
    classes = page.eval_on_selector_all(
        f"#lane-charts .lane-chart[data-lane='{STOPPED_LANE}'] rect[data-class]",
        "(nodes) => nodes.map((n) => [n.dataset.class, Number(n.dataset.count)])",
    )
    drawn: dict[str, int] = {}
    for klass, count in classes:
        drawn[klass] = drawn.get(klass, 0) + count
    assert drawn == {"work": 2, "environment": 1}
    assert _lane_figure(page, "no lane")["attempts"] == "6"


def _lane_row(page: Page, lane: str) -> Any:
    return page.locator(f"#lanes tbody tr[data-lane='{lane}']")


def test_a_real_lane_shows_why_and_when_and_an_operator_resumes_it(
    browser: Any, scene: tuple[Scene, str]
) -> None:
    made, url = scene
    lane_of = add_lanes(made.ledger, made.ids)
    (stopped_task,) = [t for t, lane in lane_of.items() if lane == STOPPED_LANE]
    page = _sign_in(browser, url, made.operator)
    page.wait_for_selector("#lanes-panel:not([hidden]) #lanes tbody tr")
    parked, stopped = _lane_row(page, PARKED_LANE), _lane_row(page, STOPPED_LANE)
    assert parked.get_attribute("data-state") == "parked"
    assert "claude: usage limit reached" in parked.inner_text()
    assert re.search(r"in (59|60)m", parked.inner_text())  # opens at the vendor's reset
    assert stopped.get_attribute("data-state") == "stopped"
    assert STOP_REASON in stopped.inner_text()
    assert "when an operator resumes it" in stopped.inner_text()
    assert page.locator("button.resume-lane").count() == 2

    stopped.locator("button.resume-lane").click()
    page.wait_for_selector(f"#lanes tbody tr[data-lane='{STOPPED_LANE}'][data-state=open]")
    assert made.ledger.get_lane(STOPPED_LANE).state == "open"
    assert made.ledger.get_lane(PARKED_LANE).state == "parked"
    (entry,) = [e for e in made.ledger.audit_events() if e.action == "lane.resume"]
    assert (entry.actor, entry.detail["lane"]) == (ME, STOPPED_LANE)
    assert made.ledger.get_task(stopped_task).retry_pending
    assert page.locator("button.resume-lane").count() == 1  # the open lane has none


def test_a_viewer_sees_no_resume_and_is_refused_when_it_posts_one(
    browser: Any, scene: tuple[Scene, str]
) -> None:
    made, url = scene
    add_lanes(made.ledger, made.ids)
    page = _sign_in(browser, url, made.viewer)
    page.wait_for_selector(f"#lanes tbody tr[data-lane='{STOPPED_LANE}']")
    assert page.locator("button.resume-lane").count() == 0
    before = made.ledger.audit_events()
    status = page.evaluate(
        """async (lane) => {
            const session = await (await fetch('/dashboard/api/session')).json();
            const answer = await fetch(`/dashboard/api/lanes/${lane}/resume`, {
                method: 'POST', body: '{}',
                headers: {'Content-Type': 'application/json', 'X-CSRF-Token': session.csrf}});
            return answer.status;
        }""",
        STOPPED_LANE,
    )
    assert status == 403
    assert made.ledger.audit_events() == before
    assert made.ledger.get_lane(STOPPED_LANE).state == "stopped"


# -- issue 44, item 15: the board's own columns and titles; long text wraps ------------


def test_with_its_board_the_page_shows_its_columns_and_titles(browser: Any, tmp_path: Path) -> None:
    made = make_scene(tmp_path, board=True)
    try:
        with ServerThread(made.app) as running:
            page = _sign_in(browser, running.url, made.viewer)
            columns = page.eval_on_selector_all(
                "#board .column", "(nodes) => nodes.map((n) => n.dataset.column)"
            )
            assert columns == BOARD_COLUMNS
            for issue, (column, title) in BOARD_ISSUES.items():
                card = page.locator(
                    f"#board .column[data-column='{column}'] .card[data-issue='{issue}']"
                )
                assert title in card.inner_text()
            assert (
                "not dispatched yet"
                in page.locator(f"#board .card[data-issue='{UNDISPATCHED}']").inner_text()
            )
            # The board's title names the issue in the other panels too.
            assert BOARD_ISSUES["ENG-103"][1] in page.inner_text("#retries")
            assert BOARD_ISSUES["ENG-101"][1] in page.inner_text("#blocked")
    finally:
        made.close()


LONG = "x" * 4000  # one unbroken word: a base64 blob, a minified stack line, a URL
# What every holder of it shows, whatever its prefix (a stored reason is cut to its last
# 4,000 characters).
PROBE = "x" * 3000


def test_long_text_wraps_inside_its_cell_at_every_width(browser: Any, tmp_path: Path) -> None:
    # One 4,000-character reason made the page 40,410 px wide.
    made = make_scene(tmp_path, board=True)
    board = made.folder / "board.json"
    doc = json.loads(board.read_text())
    doc["issues"].append({"id": "ENG-900", "title": f"title {LONG}", "state": "Needs a human"})
    board.write_text(json.dumps(doc))
    long_task = made.ledger.create_task("board:ENG-900", actor="dispatcher").id
    fail(made.ledger, long_task, 3, FailureClass.WORK, LONG)
    retrying = made.ledger.create_task("board:ENG-901", actor="dispatcher").id
    fail(made.ledger, retrying, 1, FailureClass.UPSTREAM, f"HTTP 503: {LONG}")
    try:
        with ServerThread(made.app) as running:
            for width in (320, 768, 1280, 1920):
                context = browser.new_context(viewport={"width": width, "height": 800})
                page = context.new_page()
                page.set_default_timeout(WAIT_MS)
                page.goto(f"{running.url}/dashboard?refresh_ms=60000")
                page.fill("#token", made.operator)
                page.click("#sign-in-form button[type=submit]")
                page.wait_for_selector(f"#board .card[data-task-id='{long_task}']")
                page.locator(f"#board .card[data-task-id='{long_task}']").click()
                page.wait_for_selector("#task-panel:not([hidden]) #task-runs tbody tr")
                measured = page.evaluate(
                    """(long) => {
                        const holders = [...document.querySelectorAll('body *')].filter(
                            (n) => n.children.length === 0 && n.textContent.includes(long));
                        return {
                            page: document.documentElement.scrollWidth,
                            window: window.innerWidth,
                            holders: holders.length,
                            widest: Math.max(...holders.map(
                                (n) => n.getBoundingClientRect().right)),
                        };
                    }""",
                    PROBE,
                )
                # The board's card (its title, its last failure), the blocked panel's (the
                # same two), the retries row, the task panel's title and its three runs:
                # each wrapped within the window.
                assert measured["holders"] == 9, measured
                assert measured["page"] <= measured["window"] == width, measured
                assert measured["widest"] <= width, measured
                context.close()
    finally:
        made.close()


def test_the_spend_panel_draws_each_cap_and_a_task_page_its_cost(
    browser: Any, scene: tuple[Scene, str]
) -> None:
    from execkit._usage import Usage, UsdSource
    from execkit.ledger import SpendCap, SpendWindow

    made, url = scene
    made.ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=2.0), actor=ME, floor_usd=0.5)
    task = made.ledger.create_task("costed", actor=ME)
    run = made.ledger.start_run(task.id, request_key="costed-1", actor=ME)
    cost = Usage(input_tokens=1200, usd=0.42, usd_source=UsdSource.REPORTED)
    made.ledger.finish_run(run.id, "succeeded", usage=cost)
    page = _sign_in(browser, url, made.viewer)
    page.wait_for_selector("#spend-panel:not([hidden]) #spend-windows tbody tr")
    windows = page.inner_text("#spend-windows")
    assert "the day's budget" in windows and "$2.00" in windows and "room" in windows
    assert "$0.42" in page.inner_text("#spend-lanes")
    page.goto(f"{url}/dashboard/tasks/{task.id}")
    page.wait_for_selector("#task-panel:not([hidden]) #task-runs tbody tr")
    assert page.inner_text("#task-spend") == "cost: $0.42, 1,200 tokens over 1 run"
