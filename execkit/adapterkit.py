"""Helpers for writing an adapter: reading a vendor's output and building its argv.

Public, for adapter authors (the built-in adapters use nothing else):

    from execkit.adapterkit import ErrorKind, last_json_value, request_argv, str_field

`ErrorKind` is what an adapter read from the vendor's *structured* output about a failure
(an error type field, the CLI's own credential or connection error event); it goes on
`Envelope.error_kind` and `map_result` turns it into a class the same way for every vendor.

`Usage` is what a run cost as the CLI reported it; an adapter puts it on `Envelope.usage`
(from structure only), and may read it per printed line with an optional `usage_of(line)`
returning a `Usage` or a `UsageEvent` (`execkit._meter`): `read_usage` runs that same reader
over a finished spawn's stdout, so `parse` and the live meter agree.

`Line` is what an adapter's optional `watch(line)` reads: one line of the CLI's output as
it is printed. A `watch` returns an `Envelope` (is_error, the kind, `retry_after_s`) when
its CLI announces a wait longer than `LONG_WAIT_S` that it would sleep out in the attempt;
the attempt then ends there, `upstream` with that reset (`execkit._adapter.AdapterWatch`).

Every function here is pure (a clock, where one is read, can be passed as `now`), never
raises for malformed vendor output, and runs in time linear in its input.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from execkit._adapter import LONG_WAIT_S, AgentRequest, ErrorKind, priced
from execkit._classify import epoch_wait, stated_wait_s
from execkit._exec import Line
from execkit._meter import UsageEvent, read_usage
from execkit._usage import Usage, UsdSource, checked_usage

__all__ = [
    "LONG_WAIT_S",
    "ErrorKind",
    "Line",
    "Usage",
    "UsageEvent",
    "UsdSource",
    "count_field",
    "embedded_object",
    "header_wait_s",
    "http_status",
    "iter_json_objects",
    "json_object",
    "last_json_value",
    "load_json_document",
    "number_field",
    "parse_retry_after",
    "priced",
    "prompt_args",
    "read_usage",
    "reported_usage",
    "request_argv",
    "reset_wait_s",
    "str_field",
]


def parse_retry_after(text: str | None, *, now: float | None = None) -> float | None:
    """The wait (seconds) until the last reset a vendor stated: `Retry-After: 30`,
    `try again in 14.0s`, `retryDelay: "17s"`, `try again in 4 days 10 hours`,
    `"resets_in_seconds": 4123`, `"resets_at": <epoch>`, `usage limit reached|<epoch>`,
    codex's `try again at 4:00 PM` (local time).

    Units default to seconds (milliseconds after an `-ms` key); `now` is the clock for an
    absolute reset (default `time.time()`). An absolute reset is read to the end of what
    was printed (a time to the minute: the end of that minute; an epoch in whole seconds:
    the end of that second), and one still past after that gives None, not 0: nothing
    stated is left to wait for. None when absent.
    """
    return stated_wait_s(text, now=now)


def reset_wait_s(epoch: float | None, *, now: float | None = None) -> float | None:
    """The wait (seconds) until a reset a vendor stated as an epoch in a structured field
    (claude's `resetsAt`, OpenAI's `resets_at`): to the end of its second when it is whole
    seconds. None when `epoch` is None, not finite, or already past (never 0); `now` is the
    clock (default `time.time()`)."""
    if epoch is None:
        return None
    return epoch_wait(epoch, time.time() if now is None else now)


def header_wait_s(headers: object, *, now: float | None = None) -> float | None:
    """The wait a response's headers ask for: `retry-after-ms`, then `retry-after` (seconds
    or an HTTP date, read to the end of its second). Keys are matched case-insensitively;
    None when absent, malformed, or a date already past."""
    if not isinstance(headers, Mapping):
        return None
    lowered = {str(key).lower(): value for key, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if isinstance(millis, str | int | float) and not isinstance(millis, bool):
        seconds = _finite(millis)
        if seconds is not None:
            return max(0.0, seconds / 1000.0)
    value = lowered.get("retry-after")
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = _finite(value)
        return None if seconds is None else max(0.0, seconds)
    if not isinstance(value, str) or not value.strip():
        return None
    seconds = _finite(value.strip())
    if seconds is not None:
        return max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    clock = time.time() if now is None else now
    # An HTTP date is whole seconds: read to the end of its second; one already past
    # states nothing left to wait for (None, not 0).
    return epoch_wait(when.timestamp(), clock)


def _finite(value: str | float) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def iter_json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Each line of `text` that is a JSON object (JSONL); other lines are skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):  # a line nested thousands deep is noise too
            continue
        if isinstance(value, dict):
            yield value


def load_json_document(text: str) -> Any:
    """The JSON document in `text`: the whole text, else its last complete JSON object or
    array (`last_json_value`), else None.

    Vendors print banners, warnings and stack traces around their envelope; this finds it
    anyway.
    """
    body = text.strip()
    if not body:
        return None
    if body[0] in "{[" and body[-1] in "}]":
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            pass
    return last_json_value(body)


def json_object(text: object) -> dict[str, Any] | None:
    """`text` itself as a JSON object (a vendor's message that is a serialized error body),
    else None."""
    if not isinstance(text, str):
        return None
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


# --- the last JSON value ------------------------------------------------------------------

_OPENER_OF = {"}": "{", "]": "["}
_STRUCTURE = re.compile(r'[{}\[\]"\n]')
_CHUNK = 1 << 16
_DECODER = json.JSONDecoder()
_TRY_COST = 32  # characters of budget one decode attempt costs beyond its length
_OBJECT_START = re.compile(r'\{\s*["}]')


class _LastValue:
    """The backward scan of `last_json_value`: bracket pairs outside strings, each tried
    (outermost and nearest the end first) as soon as nothing after it can enclose it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.closers: list[int] = []  # unmatched closers, innermost last
        self.pending: list[tuple[int, int]] = []  # complete pairs an open closer may enclose
        # Parsing work allowed in all (characters): a constant times the input, so no
        # flood of candidates can make the search quadratic.
        self.budget = 8 * len(text) + 4096
        self.found: Any = None
        self.done = False

    def scan(self) -> Any:
        text = self.text
        in_string = False
        high = len(text)
        while high > 0 and not self.done:
            low = max(0, high - _CHUNK)
            marks = [m.start() for m in _STRUCTURE.finditer(text, low, high)]
            for position in reversed(marks):
                char = text[position]
                if char == "\n":
                    in_string = False  # a JSON string never holds a raw newline
                elif char == '"':
                    if not self._escaped(position):
                        in_string = not in_string
                elif in_string:
                    continue
                elif char in "}]":
                    self.closers.append(position)
                else:
                    self._opener(position, char)
                if self.done:
                    break
            high = low
        if not self.done:
            self._flush()
        return self.found

    def _escaped(self, position: int) -> bool:
        # Each run of backslashes is counted once, by the quote right after it: linear.
        start = position
        while start > 0 and self.text[start - 1] == "\\":
            start -= 1
        return (position - start) % 2 == 1

    def _opener(self, position: int, char: str) -> None:
        if not self.closers:
            return  # an opener nothing after it closes: noise
        closer = self.closers.pop()
        if _OPENER_OF[self.text[closer]] != char:
            # Mismatched: nothing enclosing this point is JSON; what is pending is maximal.
            self.closers.clear()
            self._flush()
            return
        self.pending.append((position, closer))
        if not self.closers:
            self._flush()

    def _flush(self) -> None:
        # Outermost and nearest the end first: by closing position, descending. Each
        # candidate is decoded on its own slice, so a failure costs its length (a decode
        # error on the whole text would count its lines from the start: quadratic), and
        # the budget charges that length plus a constant per try.
        candidates = sorted(self.pending, key=lambda pair: pair[1], reverse=True)
        self.pending.clear()
        for start, end in candidates:
            self.budget -= end - start + 1 + _TRY_COST
            if self.budget < 0:
                self.done = True
                return
            if self.text[start] == "{" and not _OBJECT_START.match(self.text, start, end + 1):
                continue  # `{x}`, `{ status: 401 }`: cannot open an object, skip the decode
            piece = self.text[start : end + 1]
            try:
                value, stop = _DECODER.raw_decode(piece)
            except (ValueError, RecursionError):
                continue
            if stop == len(piece):
                self.found, self.done = value, True
                return


def last_json_value(text: str) -> Any:
    """The last complete JSON object or array in `text`, or None when there is none.

    For a stream that also holds warnings, stack traces, inspected objects (`{ status:
    401 }`) and partial lines: the text is scanned from the end for brackets outside JSON
    strings, and the first balanced pair (nearest the end, outermost) that parses is the
    answer. Linear time in `len(text)` whatever it holds: the parsing of failed candidates
    is bounded by a constant times the input (so a flood of bracketed noise AFTER the value
    can use that up first: then None). Never raises for a str.
    """
    if not isinstance(text, str) or not text:
        return None
    return _LastValue(text).scan()


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


def count_field(obj: object, *keys: str) -> int:
    """The sum of `keys` in a mapping whose values are whole numbers >= 0 (a token count);
    anything else (missing, negative, fractional, a bool, a string) counts 0."""
    total = 0
    if isinstance(obj, Mapping):
        for key in keys:
            value = obj.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                total += value
            elif isinstance(value, float) and value.is_integer() and value > 0:
                total += int(value)
    return total


def reported_usage(
    *,
    input_tokens: int = 0,
    output_tokens: int = 0,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    usd: float | None = None,
    model: str | None = None,
    premium_requests: float = 0.0,
) -> Usage:
    """A `Usage` of what a CLI reported: a USD it printed is `reported`; without one the
    money is `unknown` (execkit prices the tokens later where its price table knows the
    model). A USD that is not a finite number >= 0 is dropped, never raised on, and so is
    a USD of 0 beside tokens: a CLI prints 0 for a model it has no price for (opencode,
    pi, a custom provider) and for a call it did not finish pricing (claude's failed
    stream), and unknown is never zero."""
    money = usd if usd is not None and math.isfinite(usd) and usd >= 0 else None
    counts = (input_tokens, output_tokens, cache_read_tokens, cache_write_tokens)
    if money == 0 and sum(counts) > 0:
        money = None
    premium = premium_requests if math.isfinite(premium_requests) and premium_requests > 0 else 0.0
    if all(type(count) is int and count >= 0 for count in counts) and (
        model is None or type(model) is str
    ):
        # Checked here: skip the validators (a meter reads one of these per usage event).
        source = UsdSource.UNKNOWN if money is None else UsdSource.REPORTED
        return checked_usage(
            *counts, float(money) if money is not None else None, source, model, float(premium)
        )
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens,
        usd=money,
        usd_source=UsdSource.UNKNOWN if money is None else UsdSource.REPORTED,
        model=model,
        premium_requests=float(premium),
    )


_DECODER = json.JSONDecoder()


def embedded_object(text: str, key: str) -> dict[str, Any] | None:
    """The object value of the last `"key":{...}` in one line of JSON, decoded alone
    (not the whole line): how a per-line usage reader stays cheap on long events.

    Structural, not a text search: inside a JSON string every `"` is escaped, so an
    unescaped `"key":{` is a key of the document (the last one: vendors print the usage
    after the content). None when absent, or when the object does not decode (a line cut
    before its end)."""
    needle = f'"{key}":{{'
    at = text.rfind(needle)
    if at < 0:
        return None
    try:
        value, _end = _DECODER.raw_decode(text, at + len(needle) - 1)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
