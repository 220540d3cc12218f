"""Helpers for writing an adapter: reading a vendor's output and building its argv.

Public, for adapter authors (the built-in adapters use nothing else):

    from execkit.adapterkit import load_json_document, number_field, request_argv, str_field

Every function here is pure, never raises for malformed vendor output, and runs in time
linear in its input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from execkit._adapter import AgentRequest

__all__ = [
    "http_status",
    "iter_json_objects",
    "load_json_document",
    "number_field",
    "parse_retry_after",
    "prompt_args",
    "request_argv",
    "str_field",
]


# Every gap is bounded, so a long run of spaces after the keyword costs linear time.
_RETRY_AFTER = re.compile(
    r"(?:retry[-_ ]?after|(?:try again|retry) in)[\"']?\s{0,4}[:=]?\s{0,4}"
    r"(\d{1,9}(?:\.\d{1,6})?)\s{0,2}"
    r"(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?)?\b",
    re.IGNORECASE,
)


def parse_retry_after(text: str | None) -> float | None:
    """The last wait (seconds) a vendor asked for: `Retry-After: 30`, `try again in 14.0s`.

    Units default to seconds; `ms`, minutes and hours are converted. None when absent.
    """
    if not text:
        return None
    found = None
    for match in _RETRY_AFTER.finditer(text):
        found = match
    if found is None:
        return None
    unit = (found.group(2) or "s").lower()
    if unit.startswith(("ms", "milli")):
        factor = 0.001
    elif unit.startswith("m"):
        factor = 60.0
    elif unit.startswith("h"):
        factor = 3600.0
    else:
        factor = 1.0
    return float(found.group(1)) * factor


def iter_json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Each line of `text` that is a JSON object (JSONL); other lines are skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def load_json_document(text: str) -> Any:
    """The JSON document in `text`: the whole text, else its last JSON line, else None.

    Vendors print banners or warnings around their envelope; this finds it anyway.
    """
    body = text.strip()
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        pass
    for line in reversed(body.splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except ValueError:
                continue
    start = body.find("{")
    if start > 0:
        try:
            return json.loads(body[start:])
        except ValueError:
            return None
    return None


def str_field(obj: object, *keys: str) -> str | None:
    """The first of `keys` in a mapping whose value is a non-empty string."""
    if isinstance(obj, Mapping):
        for key in keys:
            value = obj.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def number_field(obj: object, *keys: str) -> float | None:
    """The first of `keys` in a mapping whose value is a number (bools are not)."""
    if isinstance(obj, Mapping):
        for key in keys:
            value = obj.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    return None


def prompt_args(prompt: str) -> list[str]:
    """The prompt as the final positional argument, never mistaken for a flag."""
    return ["--", prompt] if prompt.startswith("-") else [prompt]


def request_argv(
    head: Sequence[str],
    request: AgentRequest,
    *,
    options: Sequence[str] = (),
    prompt: Sequence[str] | None = None,
) -> list[str]:
    """`head`, `--model M` (when the request names one), `options`, `extra_args`, the prompt.

    The request's `extra_args` go in verbatim; the prompt is `prompt_args` unless the
    vendor passes it in its own form as `prompt`.
    """
    model = ["--model", request.model] if request.model else []
    tail = prompt_args(request.prompt) if prompt is None else prompt
    return [*head, *model, *options, *request.extra_args, *tail]


def http_status(code: float | None) -> int | None:
    """A vendor's numeric status field as an HTTP status: None unless it is a whole number
    in 100..599 (a NaN, an infinity or 503.5 is not a status, and must not raise)."""
    if code is None or not 100 <= code <= 599 or code != int(code):
        return None
    return int(code)
