"""OpenTelemetry spans around each attempt, for runners that trace; a no-op without it.

`attempt_span(adapter, attempt, max_attempts)` is a context manager yielding an
`AttemptSpan`; `outcome(failure_class, reason)` records how the try ended. With the extra
`execkit-runner[otel]` (the `opentelemetry-api` package) installed, each attempt is a span
`execkit.attempt` on the tracer `execkit`, with the attributes `execkit.adapter`,
`execkit.attempt`, `execkit.max_attempts`, `execkit.class` (`work`, `environment`,
`upstream`, or `none` for a success) and `execkit.charged`; a failure sets the span's
status to ERROR with the (already redacted) reason. Whatever tracer provider the runner
configured receives them; with none, the API's own no-op provider drops them.

Without the package every call is a no-op that costs one attribute check: nothing is
imported, nothing recorded. The import is tried once, on the first span. Tracing never
changes an attempt: an exception inside the span is recorded on it and re-raised as is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["AttemptSpan", "attempt_span", "tracing_available"]

_UNSET: Any = object()
_tracer: Any = _UNSET


def _get_tracer() -> Any:
    global _tracer
    if _tracer is _UNSET:
        try:
            from opentelemetry import trace
        except ImportError:
            _tracer = None
        else:
            _tracer = trace.get_tracer("execkit")
    return _tracer


def tracing_available() -> bool:
    """Whether spans are emitted (the OpenTelemetry API is installed)."""
    return _get_tracer() is not None


class AttemptSpan:
    """One attempt's span (or nothing, when tracing is off)."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def outcome(self, failure_class: str | None, charged: bool, reason: str | None) -> None:
        """How the try ended: its class (None for a success), whether it was charged."""
        if self._span is None:
            return
        self._span.set_attribute("execkit.class", failure_class or "none")
        self._span.set_attribute("execkit.charged", charged)
        if failure_class is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, reason or failure_class))


@contextlib.contextmanager
def attempt_span(adapter: str, attempt: int, max_attempts: int) -> Iterator[AttemptSpan]:
    """A span around one attempt (see the module docstring)."""
    tracer = _get_tracer()
    if tracer is None:
        yield AttemptSpan(None)
        return
    attributes = {
        "execkit.adapter": adapter,
        "execkit.attempt": attempt,
        "execkit.max_attempts": max_attempts,
    }
    with tracer.start_as_current_span("execkit.attempt", attributes=attributes) as span:
        yield AttemptSpan(span)
