"""OpenTelemetry spans around each attempt (`execkit._trace`): a no-op without the API, and
with the SDK one span per try carrying its adapter, attempt number, class and charge."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from execkit import AgentRequest, _trace, get_adapter
from execkit._agent import run_agent
from execkit._proof import AgentFailed
from execkit.testing import FakeVendor

REQUEST = AgentRequest(prompt="do it")


@pytest.fixture
def fresh_tracer(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The tracer is looked up again (and put back after)."""
    monkeypatch.setattr(_trace, "_tracer", _trace._UNSET)
    yield


def _run_twice_failing(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stderr="HTTP 503 Service Unavailable", exit_code=1)
    fake_vendor.register("codex", stdout="done")
    run_agent(
        get_adapter("codex"),
        REQUEST,
        max_attempts=3,
        sleep=lambda _s: None,
        start=fake_vendor.start,
    )


def test_without_opentelemetry_a_span_is_a_no_op(
    fresh_tracer: None, monkeypatch: pytest.MonkeyPatch, fake_vendor: FakeVendor
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails: not installed
    assert not _trace.tracing_available()
    with _trace.attempt_span("codex", 1, 2) as span:
        span.outcome("work", True, "default")  # records nothing, raises nothing
    _run_twice_failing(fake_vendor)  # the agent loop runs as ever
    assert fake_vendor.call_count("codex") == 2


def test_with_the_sdk_each_try_is_a_span(
    fresh_tracer: None, monkeypatch: pytest.MonkeyPatch, fake_vendor: FakeVendor
) -> None:
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    exporting = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    assert _trace.tracing_available()  # the API is installed (the test extra has it)
    exporter = memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(exporting.SimpleSpanProcessor(exporter))
    # A provider of the test's own, not the process-global one.
    monkeypatch.setattr(_trace, "_tracer", provider.get_tracer("execkit"))
    _run_twice_failing(fake_vendor)
    spans: list[Any] = list(exporter.get_finished_spans())
    assert [s.name for s in spans] == ["execkit.attempt", "execkit.attempt"]
    seen = [
        {k: s.attributes[k] for k in ("execkit.adapter", "execkit.attempt", "execkit.class")}
        | {"charged": s.attributes["execkit.charged"], "error": s.status.is_ok is False}
        for s in spans
    ]
    assert seen == [
        {
            "execkit.adapter": "codex",
            "execkit.attempt": 1,
            "execkit.class": "upstream",
            "charged": False,
            "error": True,
        },
        {
            "execkit.adapter": "codex",
            "execkit.attempt": 2,
            "execkit.class": "none",
            "charged": True,
            "error": False,
        },
    ]


def test_a_failure_ends_its_span_as_an_error(
    fresh_tracer: None, monkeypatch: pytest.MonkeyPatch, fake_vendor: FakeVendor
) -> None:
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    exporting = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(exporting.SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_trace, "_tracer", provider.get_tracer("execkit"))
    fake_vendor.register("codex", missing=True)
    with pytest.raises(AgentFailed):
        run_agent(get_adapter("codex"), REQUEST, max_attempts=3, start=fake_vendor.start)
    (span,) = exporter.get_finished_spans()
    assert span.attributes["execkit.class"] == "environment"
    assert span.attributes["execkit.charged"] is False
    assert span.status.status_code.name == "ERROR"
