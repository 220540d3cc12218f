"""The dashboard's and the monitoring's routes over HTTP, without a browser (the browser's
click-throughs are tests/test_dashboard_browser.py): tokens, sessions, CSRF and Origin,
bad input, the view's bounds on a 10,000-task ledger (by counts of ledger reads), the
metrics, the health checks, the access log, the lanes hook.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
from dashboard_scene import (
    BOARD_COLUMNS,
    BOARD_ISSUES,
    ME,
    PARKED_LANE,
    STOP_REASON,
    STOPPED_LANE,
    UNDISPATCHED,
    Scene,
    add_lanes,
    make_scene,
    write_board,
)
from starlette.applications import Starlette
from starlette.testclient import TestClient

from execkit._budget import AttemptStatus, TaskState
from execkit._classify import FailureClass
from execkit._errors import Conflict, StorageError
from execkit.dispatch import JsonFileBoard
from execkit.ledger import Ledger, Run, Task, TaskStatus, open_ledger
from execkit.server import ServerThread, token_hash
from execkit.server._dashboard import (
    CHART_BUCKETS,
    CHART_MAX_LANES,
    NO_LANE,
    OTHER_LANES,
    LedgerView,
    chart,
)
from execkit.server._dashboard_http import MAX_SESSIONS_PER_TOKEN, Sessions, dashboard_routes

ORIGIN = "http://testserver"


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    made = make_scene(tmp_path)
    yield made
    made.close()


@pytest.fixture
def client(scene: Scene) -> TestClient:
    return TestClient(scene.app.front.asgi, base_url=ORIGIN)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _sign_in(client: TestClient, token: str) -> str:
    answer = client.post(
        "/dashboard/api/session", json={"token": token}, headers={"Origin": ORIGIN}
    )
    assert answer.status_code == 200, answer.text
    csrf: str = answer.json()["csrf"]
    return csrf


def _code(answer: Any) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


# -- reading ----------------------------------------------------------------------------


def test_reading_needs_a_token_or_a_session(scene: Scene, client: TestClient) -> None:
    for path in ("/dashboard/api/snapshot", "/dashboard/api/session", "/dashboard/api/tasks/t-1"):
        assert _code(client.get(path)) == (401, "unauthenticated")
        assert _code(client.get(path, headers=_bearer("ekt_forged"))) == (401, "unauthenticated")
        assert _code(client.get(path, headers={"Authorization": "Basic x"})) == (
            401,
            "unauthenticated",
        )
        forged = TestClient(scene.app.front.asgi, base_url=ORIGIN)
        forged.cookies.set("execkit_session", "forged", path="/dashboard")
        assert _code(forged.get(path)) == (401, "unauthenticated")
    assert client.get("/dashboard/api/snapshot", headers=_bearer(scene.viewer)).status_code == 200
    # The page itself holds no data: it is served to anyone, and asks for a token.
    page = client.get("/dashboard")
    assert page.status_code == 200 and "sign-in" in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard"


def test_the_snapshot_has_every_panel(scene: Scene, client: TestClient) -> None:
    snap = client.get("/dashboard/api/snapshot", headers=_bearer(scene.viewer)).json()
    columns = {c["state"]: {card["issue"] for card in c["cards"]} for c in snap["columns"]}
    assert columns == {
        "ready": {"ENG-106"},
        "running": {"ENG-104"},
        "backoff": {"ENG-103"},
        "blocked": {"ENG-101", "ENG-102"},
        "done": {"ENG-105"},
        "cancelled": set(),
    }
    blocked = {card["issue"]: card for card in snap["blocked"]}
    assert blocked["ENG-101"]["blocked_on"] == "environment"
    assert "npm i -g @openai/codex" in blocked["ENG-101"]["reason"]
    assert blocked["ENG-101"]["fix"].startswith("fix the precondition")
    assert blocked["ENG-102"]["last_reason"] == "tests failed: 3 of 41 (test_parse_dates)"
    assert blocked["ENG-102"]["last_class"] == "work"
    (retry,) = snap["retries"]
    assert (retry["issue"], retry["attempts"], retry["uncharged_streak"]) == ("ENG-103", 1, 1)
    assert retry["next_attempt_at"] is not None and retry["last_class"] == "upstream"
    (flight,) = snap["in_flight"]
    assert flight["issue"] == "ENG-104" and flight["host"] and flight["lease_expires_at"]
    assert flight["workspace"] == "/srv/ws/ENG-104"  # issue #46: where its agent works
    totals = {k: sum(b[k] for b in snap["chart"]["buckets"]) for k in ("work", "charged")}
    assert totals == {"work": 3, "charged": 4}  # three work failures and one success
    assert snap["lanes"] == [] and snap["can_operate"] is False


def test_a_task_page_and_its_history(scene: Scene, client: TestClient) -> None:
    task_id = scene.ids["ENG-102"]
    doc = client.get(f"/dashboard/api/tasks/{task_id}", headers=_bearer(scene.viewer)).json()
    assert [(r["attempt"], r["class"], r["charged"]) for r in doc["runs"]] == [
        (1, "work", True),
        (2, "work", True),
        (3, "work", True),
    ]
    assert _code(client.get("/dashboard/api/tasks/t-999", headers=_bearer(scene.viewer))) == (
        404,
        "not_found",
    )
    assert _code(client.get("/dashboard/tasks/t-999", headers=_bearer(scene.viewer))) == (
        404,
        "not_found",
    )
    assert client.get(f"/dashboard/tasks/{task_id}", headers=_bearer(scene.viewer)).is_success
    assert _code(client.get(f"/dashboard/tasks/{task_id}")) == (401, "unauthenticated")


def test_unknown_routes_methods_and_files(scene: Scene, client: TestClient) -> None:
    assert _code(client.get("/nowhere")) == (404, "not_found")
    assert _code(client.get("/dashboard/static/../_app.py")) == (404, "not_found")
    assert _code(client.get("/dashboard/static/secret.txt")) == (404, "not_found")
    assert client.delete("/dashboard").status_code == 405
    assert client.put("/dashboard/api/snapshot").status_code == 405
    assert client.get(f"/dashboard/api/tasks/{scene.ids['ENG-101']}/retry-once").status_code == 405
    assert (
        client.get("/dashboard/static/dashboard.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )


# -- acting -----------------------------------------------------------------------------


def _retry(client: TestClient, task_id: str, **headers: str) -> Any:
    return client.post(f"/dashboard/api/tasks/{task_id}/retry-once", json={}, headers=headers)


def test_retry_once_needs_operate_csrf_and_origin_and_is_audited(
    scene: Scene, client: TestClient
) -> None:
    task_id = scene.ids["ENG-101"]
    csrf = _sign_in(client, scene.operator)
    before = scene.ledger.audit_events()
    refused = [
        _retry(client, task_id),  # no CSRF token, no Origin
        _retry(client, task_id, Origin=ORIGIN),  # no CSRF token
        _retry(client, task_id, Origin=ORIGIN, **{"X-CSRF-Token": "forged"}),
        _retry(client, task_id, **{"X-CSRF-Token": csrf}),  # no Origin
        _retry(client, task_id, Origin="http://evil.example", **{"X-CSRF-Token": csrf}),
    ]
    assert [_code(a) for a in refused] == [(403, "forbidden")] * 5
    assert scene.ledger.audit_events() == before
    assert scene.ledger.get_task(task_id).state is TaskState.BLOCKED

    done = _retry(client, task_id, Origin=ORIGIN, **{"X-CSRF-Token": csrf})
    assert done.status_code == 200 and done.json()["task"]["state"] == "ready"
    (event,) = scene.ledger.audit_events()[len(before) :]
    assert (event.action, event.actor, event.detail["force"]) == ("task.retry", ME, True)
    assert event.detail["reason"] == "retry once (dashboard)"
    # The snapshot after an action is read afresh: the card has moved.
    snap = client.get("/dashboard/api/snapshot").json()
    ready = next(c for c in snap["columns"] if c["state"] == "ready")
    assert task_id in {card["task_id"] for card in ready["cards"]}
    assert _code(_retry(client, "t-999", Origin=ORIGIN, **{"X-CSRF-Token": csrf})) == (
        404,
        "not_found",
    )


def test_a_viewer_is_refused_an_action_and_nothing_changes(
    scene: Scene, client: TestClient
) -> None:
    task_id = scene.ids["ENG-101"]
    before = scene.ledger.audit_events()
    assert _code(_retry(client, task_id, **_bearer(scene.viewer))) == (403, "forbidden")
    csrf = _sign_in(client, scene.viewer)
    assert _code(_retry(client, task_id, Origin=ORIGIN, **{"X-CSRF-Token": csrf})) == (
        403,
        "forbidden",
    )
    assert scene.ledger.audit_events() == before
    # A script with an operator's bearer token needs no CSRF token: no browser sends it.
    other = TestClient(scene.app.front.asgi, base_url=ORIGIN)
    assert _retry(other, task_id, **_bearer(scene.operator)).status_code == 200


def test_signing_in_is_checked_and_returns_no_token(scene: Scene, client: TestClient) -> None:
    post = client.post
    assert _code(post("/dashboard/api/session", json={"token": scene.operator})) == (
        403,
        "forbidden",
    )
    evil = {"Origin": "http://evil.example"}
    assert _code(post("/dashboard/api/session", json={"token": scene.operator}, headers=evil)) == (
        403,
        "forbidden",
    )
    good = {"Origin": ORIGIN}
    assert _code(post("/dashboard/api/session", json={"token": "ekt_x"}, headers=good)) == (
        401,
        "unauthenticated",
    )
    assert _code(post("/dashboard/api/session", content=b"[", headers=good)) == (400, "invalid")
    assert _code(post("/dashboard/api/session", content=b"x" * 5000, headers=good)) == (
        413,
        "invalid",
    )
    answer = post("/dashboard/api/session", json={"token": scene.operator}, headers=good)
    assert answer.status_code == 200
    assert scene.operator not in answer.text
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    sid = re.search(r"execkit_session=([^;]+)", cookie)
    assert sid is not None and sid.group(1) not in answer.text
    # Signing out needs the CSRF token too, and ends the session.
    csrf = answer.json()["csrf"]
    assert client.post("/dashboard/api/session/close").status_code == 403
    closing = {"Origin": ORIGIN, "X-CSRF-Token": csrf}
    assert client.post("/dashboard/api/session/close", headers=closing).status_code == 200
    assert client.get("/dashboard/api/snapshot").status_code == 401


# -- size -------------------------------------------------------------------------------


class _Counting:
    """A ledger of `n` tasks, each with one failed run, counting the reads made of it."""

    def __init__(self, n: int) -> None:
        self.calls = {"list_tasks": 0, "runs": 0}
        self.tasks = [
            Task(
                id=f"t-{i}",
                title=f"board:BULK-{i}",
                status=TaskStatus.OPEN,
                state=TaskState.BACKOFF,
                blocked_on=None,
                reason=None,
                ready=False,
                max_attempts=0,
                attempts_started=1,
                charged_attempts=0,
                uncharged_streak=1,
                remaining=None,
                next_attempt_at=100.0 + i,
                created_by="d",
                created_at=float(i),
                max_uncharged_attempts=3,
            )
            for i in range(n)
        ]

    def list_tasks(self, *, now: float | None = None, **_filters: Any) -> list[Task]:
        self.calls["list_tasks"] += 1
        return self.tasks

    def runs(self, task_id: str) -> list[Run]:
        self.calls["runs"] += 1
        return [
            Run(
                id=f"r-{task_id}",
                task_id=task_id,
                attempt=1,
                status=AttemptStatus.FAILED,
                failure_class=FailureClass.UPSTREAM,
                reason="HTTP 503",
                request_key="k",
                actor="d",
                forced=False,
                started_at=10.0,
                ended_at=11.0,
            )
        ]


def test_ten_thousand_tasks_cost_one_read_each_once_and_a_bounded_answer() -> None:
    ledger = _Counting(10_000)
    now = [1000.0]
    view = LedgerView(ledger, clock=lambda: now[0])  # type: ignore[arg-type]
    snap = view.snapshot()
    assert ledger.calls == {"list_tasks": 1, "runs": 10_000}
    backoff = next(c for c in snap["columns"] if c["state"] == "backoff")
    assert (backoff["count"], len(backoff["cards"]), backoff["more"]) == (10_000, 100, 9_900)
    assert len(snap["retries"]) == 100 and snap["retries_more"] == 9_900
    assert len(json.dumps(snap)) < 200_000  # bounded: 100 cards a panel, not 10,000
    assert sum(b["upstream"] for b in snap["chart"]["buckets"]) == 10_000
    view.snapshot()  # within the ttl: shared, no read at all
    assert ledger.calls == {"list_tasks": 1, "runs": 10_000}
    now[0] += 5
    view.snapshot()  # nothing changed: one list, no runs read again
    assert ledger.calls == {"list_tasks": 2, "runs": 10_000}
    ledger.tasks[7] = attrs.evolve(ledger.tasks[7], attempts_started=2)
    now[0] += 5
    view.snapshot()  # one task changed: its runs alone are read
    assert ledger.calls == {"list_tasks": 3, "runs": 10_001}


# -- monitoring -------------------------------------------------------------------------


def test_healthz_readyz_and_a_ledger_that_does_not_answer(scene: Scene, client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["status"] == "ready"

    def broken() -> int:
        raise StorageError("database is locked at postgresql://u:hunter2@db/x")

    scene.app.front.monitoring.ledger = type(
        "Broken", (), {"schema_version": staticmethod(broken)}
    )()
    answer = client.get("/readyz")
    assert answer.status_code == 503 and answer.json()["code"] == "storage"
    assert "hunter2" not in answer.text and "postgresql" not in answer.text


def test_metrics_need_a_token_and_count_what_operators_watch(
    scene: Scene, client: TestClient
) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=_bearer("ekt_forged")).status_code == 401
    ready = scene.ids["ENG-106"]
    op = _bearer(scene.operator)
    assert client.post(f"/v1/tasks/{ready}/runs", json={}, headers=op).status_code == 201
    refused = client.post(f"/v1/tasks/{ready}/runs", json={}, headers=op)
    refused_code = refused.json()["error"]["code"]
    text = client.get("/metrics", headers=_bearer(scene.viewer)).text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['execkit_attempts_total{charged="true",class="work"}'] == 3
    assert samples['execkit_attempts_total{charged="false",class="environment"}'] == 1
    assert samples['execkit_attempts_total{charged="false",class="upstream"}'] == 1
    assert samples['execkit_attempts_total{charged="true",class="succeeded"}'] == 1
    assert samples["execkit_admissions_total"] == 1
    assert samples[f'execkit_refusals_total{{code="{refused_code}"}}'] == 1
    assert samples["execkit_runs_in_flight"] == 2  # ENG-104 and the one just admitted
    assert samples['execkit_tasks{state="blocked"}'] == 2
    assert samples["execkit_ledger_up"] == 1
    latency = (
        "execkit_http_request_duration_seconds_count"
        '{method="POST",route="/v1/tasks/{task_id}/runs",status="201"}'
    )
    assert samples[latency] == 1
    assert "execkit_lanes{" not in text  # the series, with no lane used yet
    assert scene.operator not in text and scene.viewer not in text


def test_metrics_count_what_runs_cost_by_lane_model_and_kind(
    scene: Scene, client: TestClient
) -> None:
    op = _bearer(scene.operator)
    ready = scene.ids["ENG-106"]
    run = client.post(f"/v1/tasks/{ready}/runs", json={}, headers=op).json()
    usage = {"input_tokens": 1000, "cache_read_tokens": 20, "usd": 0.25,
             "usd_source": "reported", "model": "sonnet"}  # fmt: skip
    finished = client.post(
        f"/v1/runs/{run['id']}/finish", json={"status": "succeeded", "usage": usage}, headers=op
    )
    assert finished.status_code == 200 and finished.json()["usd"] == 0.25
    text = client.get("/metrics", headers=_bearer(scene.viewer)).text
    assert 'execkit_spend_usd_total{lane="-",model="sonnet"} 0.25' in text
    assert 'execkit_spend_tokens_total{kind="input",lane="-"} 1000.0' in text
    assert 'execkit_spend_tokens_total{kind="cache_read",lane="-"} 20.0' in text


def test_the_access_log_is_json_and_never_holds_a_token(
    scene: Scene, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret = scene.operator
    with caplog.at_level(logging.INFO, logger="execkit.server.access"):
        client.get(f"/v1/tasks/{secret}", headers=_bearer(secret))
        client.get(f"/{secret}?token={secret}", headers={"Cookie": f"execkit_session={secret}"})
        client.post("/dashboard/api/session", json={"token": secret}, headers={"Origin": ORIGIN})
        client.get("/healthz")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith(".access")]
    assert [(x["method"], x["route"], x["status"]) for x in lines] == [
        ("GET", "/v1/tasks/{task_id}", 404),
        ("GET", "(unmatched)", 404),
        ("POST", "/dashboard/api/session", 200),
        ("GET", "/healthz", 200),
    ]
    assert lines[0]["code"] == "not_found" and lines[3]["code"] is None
    assert set(lines[0]) == {"method", "route", "status", "code", "bytes", "ms"}
    assert secret not in caplog.text


# -- lanes ------------------------------------------------------------------------------


def _lane_scene(scene: Scene) -> dict[str, str]:
    return add_lanes(scene.ledger, scene.ids)


def _truth(ledger: Ledger, lane_of: dict[str, str]) -> dict[str, tuple[int, int, int]]:
    """Finished runs per lane as the ledger holds them: (attempts, charged, uncharged)."""
    counted: dict[str, list[int]] = {}
    for task in ledger.list_tasks():
        for run in ledger.runs(task.id):
            if run.status is AttemptStatus.RUNNING:
                continue
            was = run.status is not AttemptStatus.FAILED or (
                run.failure_class is None or run.failure_class.charged
            )
            row = counted.setdefault(lane_of.get(task.id, NO_LANE), [0, 0, 0])
            row[0] += 1
            row[1 if was else 2] += 1
    return {lane: (a, c, u) for lane, (a, c, u) in counted.items()}


def test_the_chart_per_lane_counts_the_runs_the_ledger_holds(
    scene: Scene, client: TestClient
) -> None:
    lane_of = _lane_scene(scene)
    snap = client.get("/dashboard/api/snapshot", headers=_bearer(scene.viewer)).json()
    chart = snap["chart"]
    shown = {s["lane"]: (s["attempts"], s["charged"], s["uncharged"]) for s in chart["lanes"]}
    assert shown == _truth(scene.ledger, lane_of)
    assert shown[PARKED_LANE] == (2, 1, 1)  # a success, an upstream reset
    assert shown[STOPPED_LANE] == (3, 2, 1)  # two work failures, one on credentials
    assert [s["lane"] for s in chart["lanes"]] == [PARKED_LANE, STOPPED_LANE, NO_LANE]
    for series in chart["lanes"]:
        assert len(series["buckets"]) == CHART_BUCKETS
        assert sum(b["charged"] + b["uncharged"] for b in series["buckets"]) == series["attempts"]
    for key in ("work", "environment", "upstream", "succeeded", "charged", "uncharged"):
        for i, bucket in enumerate(chart["buckets"]):  # the lanes add up to the whole
            assert bucket[key] == sum(s["buckets"][i][key] for s in chart["lanes"])


def _run(run_id: str, at: float, klass: FailureClass | None) -> Run:
    return Run(
        id=run_id,
        task_id="t",
        attempt=1,
        status=AttemptStatus.FAILED if klass else AttemptStatus.SUCCEEDED,
        failure_class=klass,
        reason=None,
        request_key=run_id,
        actor="d",
        forced=False,
        started_at=at,
        ended_at=at + 1,
    )


def test_the_chart_per_lane_is_bounded() -> None:
    # Twelve lanes, lane i with i + 1 runs, and three runs on no lane.
    runs, lane_of = [], {}
    for i in range(12):
        for j in range(i + 1):
            run_id = f"r-{i}-{j}"
            runs.append(_run(run_id, 1000.0 + 100 * j, FailureClass.UPSTREAM))
            lane_of[run_id] = f"a{i:02d}/default"
    runs += [_run(f"free-{k}", 1000.0, None) for k in range(3)]
    doc = chart(runs, 5000.0, lane_of=lane_of)
    names = [s["lane"] for s in doc["lanes"]]
    kept = [f"a{i:02d}/default" for i in range(4, 12)]  # the eight with the most runs
    assert names == [*kept, OTHER_LANES, NO_LANE]
    assert len(names) == CHART_MAX_LANES + 2
    by_name = {s["lane"]: s["attempts"] for s in doc["lanes"]}
    assert by_name[OTHER_LANES] == 1 + 2 + 3 + 4 and by_name[NO_LANE] == 3
    assert all(len(s["buckets"]) == CHART_BUCKETS for s in doc["lanes"])
    unread = chart(runs, 5000.0, lane_of=lane_of, lanes_unread=2)
    assert unread["lanes"][-1]["lane"] == "no lane or an unread lane"
    assert unread["lanes_unread"] == 2
    assert chart(runs, 5000.0)["lanes"] is None  # a ledger with no lanes


class _CountingHistory:
    """A real ledger, counting the lane histories read from it."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.histories = 0

    def lane_history(self, lane: str) -> Any:
        self.histories += 1
        return self._ledger.lane_history(lane)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def test_a_board_that_stands_still_reads_no_lane_history(scene: Scene) -> None:
    _lane_scene(scene)
    counting = _CountingHistory(scene.ledger)
    now = [time.time()]
    view = LedgerView(cast(Ledger, counting), clock=lambda: now[0])
    view.snapshot()
    assert counting.histories == 2  # one per lane
    now[0] += 5
    view.snapshot()
    assert counting.histories == 2  # nothing changed: none read
    # A run ends (on no lane): the histories are read again, once.
    (running,) = [r for r in scene.ledger.runs(scene.ids["ENG-104"]) if r.status == "running"]
    scene.ledger.finish_run(running.id, "succeeded")
    now[0] += 5
    view.snapshot()
    assert counting.histories == 4
    now[0] += 5
    view.snapshot()
    assert counting.histories == 4


def test_a_real_lane_shows_why_and_when_and_an_operator_resumes_it(scene: Scene) -> None:
    lane_of = _lane_scene(scene)
    (stopped_task,) = [t for t, lane in lane_of.items() if lane == STOPPED_LANE]
    client = TestClient(scene.app.front.asgi, base_url=ORIGIN)
    snap = client.get("/dashboard/api/snapshot", headers=_bearer(scene.viewer)).json()
    lanes = {lane["lane"]: lane for lane in snap["lanes"]}
    parked, stopped = lanes[PARKED_LANE], lanes[STOPPED_LANE]
    assert (parked["state"], parked["reason"]) == ("parked", "claude: usage limit reached")
    assert parked["opens_at"] == scene.ledger.get_lane(PARKED_LANE).opens_at
    assert parked["opens_at"] > snap["now"] + 3000
    assert (stopped["state"], stopped["reason"], stopped["opens_at"]) == (
        "stopped",
        STOP_REASON,
        None,
    )
    text = client.get("/metrics", headers=_bearer(scene.viewer)).text
    assert 'execkit_lanes{state="parked"} 1.0' in text
    assert 'execkit_lanes{state="stopped"} 1.0' in text

    resume = f"/dashboard/api/lanes/{STOPPED_LANE}/resume"
    before = scene.ledger.audit_events()
    assert _code(client.post(resume, headers=_bearer(scene.viewer))) == (403, "forbidden")
    csrf = _sign_in(client, scene.operator)
    assert _code(client.post(resume, headers={"Origin": ORIGIN})) == (403, "forbidden")
    assert scene.ledger.audit_events() == before
    assert scene.ledger.get_lane(STOPPED_LANE).state == "stopped"
    done = client.post(resume, headers={"Origin": ORIGIN, "X-CSRF-Token": csrf})
    assert done.status_code == 200, done.text
    assert done.json()["lane"]["state"] == "open"
    assert scene.ledger.get_lane(STOPPED_LANE).state == "open"
    (entry,) = [e for e in scene.ledger.audit_events() if e.action == "lane.resume"]
    assert entry.actor == ME and entry.detail["lane"] == STOPPED_LANE
    assert entry.detail["reason"] == "resume (dashboard)"
    assert scene.ledger.get_task(stopped_task).retry_pending  # the stopping task retries
    snap = client.get("/dashboard/api/snapshot").json()  # the action took a fresh snapshot
    assert {lane["lane"]: lane["state"] for lane in snap["lanes"]}[STOPPED_LANE] == "open"
    headers = {"Origin": ORIGIN, "X-CSRF-Token": csrf}
    missing = client.post("/dashboard/api/lanes/nope/default/resume", headers=headers)
    assert _code(missing) == (404, "not_found")
    assert _code(client.post("/dashboard/api/lanes/nope/resume", headers=headers)) == (
        400,
        "invalid",
    )


def test_resuming_a_lane_no_run_has_used_changes_nothing(scene: Scene, client: TestClient) -> None:
    before = scene.ledger.audit_events()
    answer = client.post(
        "/dashboard/api/lanes/codex%2Fdefault/resume", headers=_bearer(scene.operator)
    )
    assert answer.status_code in (400, 404), answer.text
    assert scene.ledger.audit_events() == before
    assert "execkit_lanes{" not in client.get("/metrics", headers=_bearer(scene.viewer)).text


def test_a_revoked_token_ends_its_sessions(scene: Scene, client: TestClient) -> None:
    _sign_in(client, scene.viewer)
    assert client.get("/dashboard/api/snapshot").status_code == 200
    path = scene.folder / "tokens.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["tokens"] = [t for t in doc["tokens"] if t["sha256"] != token_hash(scene.viewer)]
    fresh = path.with_suffix(".new")
    fresh.write_text(json.dumps(doc), encoding="utf-8")
    fresh.chmod(0o600)
    fresh.replace(path)  # a new inode: the server reads the file again
    assert _code(client.get("/dashboard/api/snapshot")) == (401, "unauthenticated")
    assert _code(client.get("/dashboard/api/session")) == (401, "unauthenticated")


class _Held:
    """A ledger whose task list waits until released (a very large ledger, held still)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.entered = threading.Event()
        self.release = threading.Event()

    def list_tasks(self, *, now: float | None = None, **_filters: Any) -> list[Task]:
        self.entered.set()
        assert self.release.wait(60), "never released"
        return self._ledger.list_tasks(now=now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def test_a_slow_snapshot_does_not_hold_the_server(scene: Scene) -> None:
    held = _Held(scene.ledger)
    scene.app.front.view.ledger = held
    answers: list[int] = []
    with ServerThread(scene.app) as running:

        def read() -> None:
            request = urllib.request.Request(
                f"{running.url}/dashboard/api/snapshot", headers=_bearer(scene.viewer)
            )
            with urllib.request.urlopen(request, timeout=60) as answer:
                answers.append(answer.status)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert held.entered.wait(60)
            # While the snapshot is being read, the server answers everything else.
            with urllib.request.urlopen(f"{running.url}/healthz", timeout=60) as answer:
                assert answer.status == 200
            request = urllib.request.Request(
                f"{running.url}/v1/tasks/{scene.ids['ENG-101']}", headers=_bearer(scene.viewer)
            )
            with urllib.request.urlopen(request, timeout=60) as answer:
                assert json.loads(answer.read())["state"] == "blocked"
            assert answers == []  # the snapshot is still held
        finally:
            held.release.set()
            reader.join(60)
    assert answers == [200]


# -- sessions: bounded per token, never another token's -------------------------------------


def test_a_token_signing_in_again_and_again_never_signs_another_out() -> None:
    """A pool of 5 sessions: the operator signs in once, a viewer 1,001 times. The
    operator's session stays; the viewer's sign-ins replace the viewer's own oldest."""
    sessions = Sessions(limit=5)
    operator, _ = sessions.open("operator-token")
    viewer = [sessions.open("viewer-token")[0] for _ in range(1001)]
    assert sessions.get(operator) is not None
    assert sessions.get(viewer[-1]) is not None
    assert sessions.get(viewer[0]) is None
    assert sum(sessions.get(sid) is not None for sid in viewer) == 4
    assert sessions.count() == 5


def test_sessions_are_bounded_per_token_and_a_full_pool_refuses_a_new_token() -> None:
    """3 sessions a token, 5 in all, 10 s each (a clock of our own): a token's fourth
    sign-in drops its own first; with the pool full of two tokens' sessions a third token
    is refused (StorageError, the 503 the page shows) until sessions expire, and nobody
    else's was dropped to make room."""
    now = [0.0]
    sessions = Sessions(clock=lambda: now[0], ttl_s=10, limit=5, per_token=3)
    a = [sessions.open("a")[0] for _ in range(4)]
    assert [sessions.get(sid) is not None for sid in a] == [False, True, True, True]
    assert sessions.count("a") == 3
    b = [sessions.open("b")[0] for _ in range(2)]
    with pytest.raises(StorageError, match="limit of 5 dashboard sessions"):
        sessions.open("c")
    assert all(sessions.get(sid) is not None for sid in a[1:] + b)
    assert sessions.count("c") == 0 and sessions.count() == 5
    now[0] = 11.0  # every session has expired: room again
    c, _ = sessions.open("c")
    assert sessions.get(c) is not None and sessions.get(b[0]) is None
    assert sessions.count() == 1
    sessions.close(c)
    assert sessions.count() == 0 and sessions.count("c") == 0


def test_signing_in_past_a_tokens_bound_over_http_keeps_the_others(
    scene: Scene, client: TestClient
) -> None:
    operator = TestClient(scene.app.front.asgi, base_url=ORIGIN)
    _sign_in(operator, scene.operator)
    _sign_in(client, scene.viewer)
    first = dict(client.cookies)
    for _ in range(MAX_SESSIONS_PER_TOKEN):
        _sign_in(client, scene.viewer)
    assert client.get("/dashboard/api/snapshot").status_code == 200  # the latest
    assert operator.get("/dashboard/api/snapshot").status_code == 200
    stale = TestClient(scene.app.front.asgi, base_url=ORIGIN, cookies=first)
    assert _code(stale.get("/dashboard/api/snapshot")) == (401, "unauthenticated")
    assert scene.app.front.sessions.count() == MAX_SESSIONS_PER_TOKEN + 1


def test_a_full_session_pool_answers_a_json_503(scene: Scene) -> None:
    """A pool full of other tokens' sessions refuses a sign-in in the error shape."""
    full = Sessions(limit=1)
    full.open("someone else")
    routes = dashboard_routes(scene.app.tokens, scene.app.front.view, full)
    client = TestClient(Starlette(routes=routes), base_url=ORIGIN)
    answer = client.post(
        "/dashboard/api/session", json={"token": scene.viewer}, headers={"Origin": ORIGIN}
    )
    assert _code(answer) == (503, "storage")


# -- the board's own columns and titles (issue 44, item 15) ---------------------------


def test_with_its_board_the_columns_and_titles_are_the_boards(tmp_path: Path) -> None:
    # A card was titled by its task (`board:ENG-101`, shown as the id) and placed in the
    # ledger's state columns, whatever the board the operator works from calls them.
    made = make_scene(tmp_path, board=True)
    try:
        client = TestClient(made.app.front.asgi, base_url=ORIGIN)
        snap = client.get("/dashboard/api/snapshot", headers=_bearer(made.viewer)).json()
        assert snap["columns_from"] == "board"
        assert [c["state"] for c in snap["columns"]] == BOARD_COLUMNS
        placed = {c["state"]: [card["issue"] for card in c["cards"]] for c in snap["columns"]}
        assert placed == {
            column: [i for i, (where, _title) in BOARD_ISSUES.items() if where == column]
            for column in BOARD_COLUMNS
        }
        cards = {card["issue"]: card for c in snap["columns"] for card in c["cards"]}
        for issue, (column, title) in BOARD_ISSUES.items():
            assert (cards[issue]["issue_title"], cards[issue]["board_state"]) == (title, column)
        # The ledger's state and history ride on the card; a never-dispatched issue has none.
        assert cards["ENG-102"]["state"] == "blocked" and cards["ENG-102"]["charged"] == 3
        assert cards["ENG-102"]["last_reason"] == "tests failed: 3 of 41 (test_parse_dates)"
        assert cards[UNDISPATCHED]["task_id"] is None and cards[UNDISPATCHED]["state"] is None
        # Every other panel names the issue's title too.
        blocked = {card["issue"]: card["issue_title"] for card in snap["blocked"]}
        assert blocked["ENG-101"] == BOARD_ISSUES["ENG-101"][1]
        assert snap["retries"][0]["issue_title"] == BOARD_ISSUES["ENG-103"][1]
        assert snap["in_flight"][0]["issue_title"] == BOARD_ISSUES["ENG-104"][1]
        task = client.get(
            f"/dashboard/api/tasks/{made.ids['ENG-105']}", headers=_bearer(made.viewer)
        ).json()
        assert task["card"]["issue_title"] == BOARD_ISSUES["ENG-105"][1]
        # The counts (and the metrics) stay the ledger's.
        assert snap["counts"]["blocked"] == 2
        # An edit of the board shows at the next snapshot.
        board = made.folder / "board.json"
        board.write_text(board.read_text().replace("Bump the lockfile", "Bump the lock file"))
        made.app.front.view.invalidate()
        snap = client.get("/dashboard/api/snapshot", headers=_bearer(made.viewer)).json()
        cards = {card["issue"]: card for c in snap["columns"] for card in c["cards"]}
        assert cards["ENG-105"]["issue_title"] == "Bump the lock file"
        assert snap["board_error"] is None
        # A board file broken by a hand edit: the last good one stays, the page says why,
        # and the metrics go on.
        board.write_text(board.read_text()[:-10])
        made.app.front.view.invalidate()
        snap = client.get("/dashboard/api/snapshot", headers=_bearer(made.viewer)).json()
        assert [c["state"] for c in snap["columns"]] == BOARD_COLUMNS
        error = snap["board_error"]
        assert error.startswith("invalid: board file") and "not valid JSON" in error
        assert client.get("/metrics", headers=_bearer(made.viewer)).status_code == 200
    finally:
        made.close()


def test_a_board_dispatched_with_another_ledger_is_refused(tmp_path: Path) -> None:
    board = JsonFileBoard(write_board(tmp_path / "board.json"))
    with open_ledger(tmp_path / "other.db") as other:
        board.bind_ledger(other.ledger_id(), other.location())
    with open_ledger(tmp_path / "served.db") as served:
        with pytest.raises(Conflict, match="dispatched with ledger"):
            LedgerView(served, board=board)
        board_of_served = JsonFileBoard(write_board(tmp_path / "mine.json"))
        board_of_served.bind_ledger(served.ledger_id(), served.location())
        LedgerView(served, board=board_of_served)  # its own ledger: fine


def test_serve_refuses_a_board_it_cannot_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from execkit.cli import main
    from execkit.server import add_token

    tokens = tmp_path / "tokens.json"
    add_token(tokens, ME, [])
    db = tmp_path / "served.db"
    argv = ["serve", "--db", str(db), "--tokens", str(tokens), "--listen", "127.0.0.1:0"]
    assert main([*argv, "--board", str(tmp_path / "absent.json")]) == 4
    assert "no board file" in capsys.readouterr().err
    board = JsonFileBoard(write_board(tmp_path / "board.json"))
    board.bind_ledger("L-another", str(tmp_path / "another.db"))
    assert main([*argv, "--board", str(board.path)]) == 5
    assert "dispatched with ledger L-another" in capsys.readouterr().err
    assert main(["serve", "--add-token", str(tokens), "--actor", "a", "--board", "x"]) == 3


def test_metrics_show_each_notification_endpoints_health(scene: Scene) -> None:
    import getpass

    owner = getpass.getuser()
    endpoint = scene.ledger.add_notify_endpoint(
        "http://127.0.0.1:9/hook", events=["*"], actor=owner
    )
    scene.ledger.notify_test(endpoint.id, actor=owner)
    client = TestClient(scene.app.front.asgi, base_url=ORIGIN)
    text = client.get("/metrics", headers=_bearer(scene.viewer)).text
    labels = f'endpoint="{endpoint.id}",format="json"'
    assert f"execkit_notify_backlog{{{labels}}} 1.0" in text
    assert f"execkit_notify_delivered_total{{{labels}}} 0.0" in text
    assert f"execkit_notify_stopped{{{labels}}} 0.0" in text
    snap = client.get("/dashboard/api/snapshot", headers=_bearer(scene.viewer)).json()
    [shown] = snap["notify"]
    assert (shown["id"], shown["url"], shown["backlog"]) == (endpoint.id, "http://127.0.0.1:9/…", 1)


def test_the_spend_panel_shows_each_windows_cap_and_each_lanes_day(scene: Scene) -> None:
    import getpass

    from execkit._usage import Usage, UsdSource
    from execkit.ledger import SpendCap, SpendWindow

    owner = getpass.getuser()
    scene.ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=2.0), actor=owner, floor_usd=0.5)
    task = scene.ledger.create_task("costed", actor=owner)
    run = scene.ledger.start_run(task.id, request_key="costed-1", actor=owner)
    cost = Usage(input_tokens=1200, usd=0.42, usd_source=UsdSource.REPORTED)
    scene.ledger.finish_run(run.id, "succeeded", usage=cost)
    client = TestClient(scene.app.front.asgi, base_url=ORIGIN)
    snap = client.get("/dashboard/api/snapshot", headers=_bearer(scene.viewer)).json()
    [window] = snap["spend"]["windows"]
    assert (window["name"], window["cap_usd"], window["full"]) == ("the day's budget", 2.0, False)
    assert window["usd"] >= 0.42 and window["overridden_until"] is None
    [today] = [row for row in snap["spend"]["lanes_today"] if row["usd"] == 0.42]
    assert (today["tokens"], today["runs"]) == (1200, 1)
    page = client.get(f"/dashboard/api/tasks/{task.id}", headers=_bearer(scene.viewer)).json()
    assert page["spend"]["phrase"] == "$0.42, 1,200 tokens over 1 run"
