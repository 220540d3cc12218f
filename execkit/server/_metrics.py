"""Monitoring on `execkit serve`: `/healthz`, `/readyz` and `/metrics` (docs/remote.md,
"Monitoring").

- `GET /healthz`: 200 while the process answers; no token, touches nothing.
- `GET /readyz`: 200 when the ledger answers a read (its schema version), else 503 with
  the error's code; no token, and no ledger location in the answer (a PostgreSQL URL may
  hold a password).
- `GET /metrics`: the Prometheus text format (`prometheus_client`, a registry of this
  server's own, never the process-global one), for any valid bearer token (a scraper's
  `authorization` setting): 401 without one.

The series. From this process, since it started: `execkit_http_request_duration_seconds`
(histogram by method, route template and status), `execkit_admissions_total` (runs
admitted through `POST /v1/tasks/{task_id}/runs`) and `execkit_refusals_total{code}` (that
route's error answers by code). From the ledger, at each scrape (the dashboard's cached
`LedgerView`, so a scrape reads only the tasks that changed): `execkit_attempts_total`
(every finished attempt in the history by `class` and `charged`), `execkit_runs_in_flight`,
`execkit_tasks{state}`, `execkit_lanes{state}` when the ledger has lanes, what its runs
cost (issue #45): `execkit_spend_usd_total{lane,model}` and
`execkit_spend_tokens_total{lane,kind}` (kind: input, output, cache_read, cache_write), and
per notification endpoint (issue #49) `execkit_notify_delivered_total`,
`execkit_notify_failed_total`, `execkit_notify_backlog` and `execkit_notify_stopped` by
`endpoint` and `format`. A ledger that cannot be read leaves its series out and sets
`execkit_ledger_up` to 0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from execkit._errors import ExecKitError
from execkit._redact import redact
from execkit.ledger import Ledger
from execkit.server._access_log import Request
from execkit.server._dashboard import COLUMNS, LedgerView, totals
from execkit.server._tokens import TokenFile

__all__ = ["Monitoring"]

ADMISSION_ROUTE = "/v1/tasks/{task_id}/runs"
_TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")
_log = logging.getLogger("execkit.server")


class _LedgerCollector(Collector):
    def __init__(self, view: LedgerView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("execkit_ledger_up", "1 when the ledger answered this scrape")
        try:
            tasks, runs = self.view.tasks_and_runs()
            lanes = self.view.lanes()
        except ExecKitError as exc:
            _log.warning("metrics: the ledger did not answer: %s", exc.message)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        attempts = CounterMetricFamily(
            "execkit_attempts",
            "finished attempts in the ledger's history by class and whether they were charged",
            labels=["class", "charged"],
        )
        for (klass, charged), count in sorted(totals(runs).items()):
            attempts.add_metric([klass, "true" if charged else "false"], count)
        yield attempts
        in_flight = GaugeMetricFamily("execkit_runs_in_flight", "runs holding a lease now")
        in_flight.add_metric([], sum(1 for run in runs if run.status == "running"))
        yield in_flight
        states = GaugeMetricFamily("execkit_tasks", "tasks by state", labels=["state"])
        for state in COLUMNS:
            states.add_metric([state.value], sum(1 for t in tasks if t.state is state))
        yield states
        if lanes is not None:
            by_state: dict[str, int] = {}
            for lane in lanes:
                key = str(lane.get("state") or "unknown")
                by_state[key] = by_state.get(key, 0) + 1
            family = GaugeMetricFamily("execkit_lanes", "vendor lanes by state", labels=["state"])
            for key, count in sorted(by_state.items()):
                family.add_metric([key], count)
            yield family
        yield from self._spend()
        yield from self._notify()

    def _spend(self) -> Iterator[Metric]:
        """What every run of the ledger cost (issue #45): USD by lane and model, tokens by
        lane and kind; a run with no USD figure adds none (its tokens still count)."""
        try:
            rows = self.view.ledger.spend_rows()
        except ExecKitError as exc:
            _log.warning("metrics: the ledger's spend did not answer: %s", exc.message)
            return
        usd: dict[tuple[str, str], float] = {}
        tokens: dict[tuple[str, str], int] = {}
        for row in rows:
            lane = row.lane or "-"
            key = (lane, row.model or "unknown")
            usd[key] = usd.get(key, 0.0) + (row.usd or 0.0)
            for kind in _TOKEN_KINDS:
                count = getattr(row, f"{kind}_tokens")
                tokens[(lane, kind)] = tokens.get((lane, kind), 0) + count
        money = CounterMetricFamily(
            "execkit_spend_usd",
            "USD the ledger's runs cost, by lane and model",
            labels=["lane", "model"],
        )
        for (lane, model), total in sorted(usd.items()):
            money.add_metric([lane, model], total)
        yield money
        counted = CounterMetricFamily(
            "execkit_spend_tokens", "tokens the ledger's runs used, by lane and kind",
            labels=["lane", "kind"],
        )  # fmt: skip
        for (lane, kind), total in sorted(tokens.items()):
            counted.add_metric([lane, kind], total)
        yield counted

    def _notify(self) -> Iterator[Metric]:
        """Each notification endpoint's health (issue #49), when the ledger has them."""
        listing = getattr(self.view.ledger, "notify_endpoints", None)
        if listing is None or not callable(listing):
            return
        try:
            endpoints = listing()
        except ExecKitError as exc:
            _log.warning("metrics: the notification endpoints did not answer: %s", exc.message)
            return
        labels = ["endpoint", "format"]
        delivered = CounterMetricFamily(
            "execkit_notify_delivered", "events delivered to the endpoint", labels=labels
        )
        failed = CounterMetricFamily(
            "execkit_notify_failed", "events given up on the endpoint", labels=labels
        )
        backlog = GaugeMetricFamily(
            "execkit_notify_backlog", "events waiting for the endpoint", labels=labels
        )
        stopped = GaugeMetricFamily(
            "execkit_notify_stopped", "1 when the endpoint refused for good", labels=labels
        )
        for endpoint in endpoints:
            key = [endpoint.id, endpoint.format]
            delivered.add_metric(key, endpoint.delivered)
            failed.add_metric(key, endpoint.failed)
            backlog.add_metric(key, endpoint.backlog)
            stopped.add_metric(key, 1 if endpoint.stopped_reason is not None else 0)
        yield from (delivered, failed, backlog, stopped)


class Monitoring:
    """The registry, the request observer (for `AccessLog`) and the three routes."""

    def __init__(self, ledger: Ledger, tokens: TokenFile, view: LedgerView) -> None:
        self.ledger = ledger
        self.tokens = tokens
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "execkit_http_request_duration_seconds",
            "time to answer a request, by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.admissions = Counter(
            "execkit_admissions", "runs admitted over HTTP", registry=self.registry
        )
        self.refusals = Counter(
            "execkit_refusals",
            "admissions refused over HTTP, by error code",
            ["code"],
            registry=self.registry,
        )
        self.registry.register(_LedgerCollector(view))
        # Bounded: methods are the seven HTTP ones or OTHER, routes the templates or
        # "(unmatched)", statuses the few the server answers.
        self._latency_series: dict[tuple[str, str, int], Histogram] = {}

    def observe(self, request: Request) -> None:
        """One answered request (an `AccessLog` observer). The histogram's series for a
        (method, route, status) is looked up once and kept: `labels` takes the metric's
        lock and builds its key on every call."""
        key = (request.method, request.route, request.status)
        series = self._latency_series.get(key)
        if series is None:
            series = self._latency_series[key] = self.latency.labels(
                request.method, request.route, str(request.status)
            )
        series.observe(request.seconds)
        if request.method == "POST" and request.route == ADMISSION_ROUTE:
            if 200 <= request.status < 300:
                self.admissions.inc()
            else:
                self.refusals.labels(request.code or str(request.status)).inc()

    async def healthz(self, _request: HttpRequest) -> Response:
        return Response('{"status": "ok"}\n', media_type="application/json")

    async def readyz(self, _request: HttpRequest) -> Response:
        try:
            version = await run_in_threadpool(self.ledger.schema_version)
        except ExecKitError as exc:
            body = f'{{"status": "not ready", "code": "{exc.code}"}}\n'
            _log.warning("readyz: the ledger did not answer: %s", redact(exc.message))
            return Response(body, status_code=503, media_type="application/json")
        return Response(
            f'{{"status": "ready", "schema_version": {int(version)}}}\n',
            media_type="application/json",
        )

    async def metrics(self, request: HttpRequest) -> Response:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        try:
            principal = self.tokens.lookup(token.strip()) if scheme.lower() == "bearer" else None
        except ExecKitError:
            principal = None
        if principal is None:
            return Response(
                '{"error": {"code": "unauthenticated", "message": "send Authorization: '
                'Bearer TOKEN"}}',
                status_code=401,
                media_type="application/json",
                headers={"WWW-Authenticate": "Bearer"},
            )
        text = await run_in_threadpool(generate_latest, self.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
