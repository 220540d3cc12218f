"""Every argument of a ledger operation checked before its transaction opens.

Each check returns the value as the rules use it, or raises `InvalidInput` naming the field
(`.field`), so a refused call writes nothing.

This is where secrets are masked on the way in: every piece of text a caller hands a ledger
operation is returned by one of `check_text` (a title, a board state), `check_name` (a
principal, an idempotency or request key), `as_actor` (an actor and the one it acts for)
or `clean_reason` already masked (`execkit._mask`), and only that returned value is stored
or echoed (tests/test_sink_layer.py checks every operation of `_core` takes its text
through one of them). So no stored byte, and nothing read back from the ledger (a task
list, an audit, a server's answer) holds a credential the redactor knows. Names and keys
are masked with a tag (`mask_name`), so two of them stay two, and a key is masked the same
way wherever it is given: replaying it still finds its first answer. A fingerprint is
taken of what the caller sent, before masking: only its hash is stored.
Free text is bounded here (`clean_reason`), times are finite POSIX seconds (`moment`: a NaN
stored as a start time would make a history unreadable), and a keyed request's fingerprint
(`fingerprint_of`) is the SHA-256 of the canonical JSON of what it asked, so replaying a key
with another request is told apart.
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from execkit._budget import TaskState
from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit._mask import mask_json, mask_name, mask_text
from execkit._validate import is_integer, is_number
from execkit.ledger._model import (
    LIST_PAGE,
    MAX_ATTEMPT_LIMIT,
    MAX_LEASE_S,
    MAX_UNCHARGED_LIMIT,
    Actor,
)

__all__ = [
    "MAX_KEY",
    "MAX_TITLE",
    "as_actor",
    "as_failure_class",
    "check_bool",
    "check_lease",
    "check_limit",
    "check_name",
    "check_session",
    "check_text",
    "check_uncharged",
    "clean_reason",
    "creation_fingerprint",
    "fingerprint_of",
    "moment",
    "optional_time",
]

MAX_TITLE = 1000
MAX_KEY = 200
_MAX_REASON = 4000


def _checked(field: str, value: object, max_len: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{field} must be a non-empty string", field=field)
    if len(value) > max_len:
        raise InvalidInput(
            f"{field} must be at most {max_len} characters, got {len(value)}", field=field
        )
    return _unicode(field, value)


def _unicode(field: str, value: str) -> str:
    # A command-line argument that was not UTF-8 arrives with lone surrogates (`ab\xe4cd`
    # is 'ab\udce4cd'): no database, JSON document or terminal can take it.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{field} is not valid UTF-8 text (character {exc.start})", field=field
        ) from None
    return value


def check_text(field: str, value: object, max_len: int) -> str:
    """`value`, a non-empty string of at most `max_len` characters, masked as text: the
    caller stores and echoes the returned value, never the argument."""
    return mask_text(_checked(field, value, max_len))


def check_session(field: str, value: object, max_len: int) -> str:
    """`value`, a vendor session id as the vendor wrote it (issue #46): a non-empty string
    of at most `max_len` characters with no control character, kept verbatim (a resume
    hands it back to the vendor's CLI, so it is never masked). InvalidInput naming
    `field` otherwise."""
    text = _checked(field, value, max_len)
    bad = next((n for n, char in enumerate(text) if unicodedata.category(char) == "Cc"), None)
    if bad is not None:
        raise InvalidInput(
            f"{field} must be a session id without control characters "
            f"(character {bad} is {text[bad]!r})",
            field=field,
        )
    return text


def check_name(field: str, value: object, max_len: int) -> str:
    """Like `check_text` for a name or a key: masked with a tag (`mask_name`), so two
    different names never become one."""
    return mask_name(_checked(field, value, max_len))


def check_json(field: str, value: object, max_bytes: int) -> dict[str, Any]:
    """`value`, a JSON object (string keys) of at most `max_bytes` as JSON, with every
    string in it masked (`mask_json`, keys included). InvalidInput naming `field`
    otherwise."""
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise InvalidInput(f"{field} must be a JSON object (string keys)", field=field)
    masked = mask_json(dict(value))
    try:
        size = len(json.dumps(masked, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{field} must be JSON: {exc}", field=field) from None
    if size > max_bytes:
        raise InvalidInput(f"{field} are {size} bytes as JSON; at most {max_bytes}", field=field)
    result: dict[str, Any] = masked
    return result


def check_task_ids(task_ids: Iterable[object]) -> list[str]:
    """A bulk read's `task_ids` as a list: at most `LIST_PAGE` (InvalidInput beyond, or
    for an id that is not text)."""
    ids = list(task_ids)
    if len(ids) > LIST_PAGE:
        raise InvalidInput(
            f"task_ids: at most {LIST_PAGE} at once (0..{LIST_PAGE}), got {len(ids)}",
            field="task_ids",
        )
    if not all(type(task_id) is str for task_id in ids):
        raise InvalidInput("task_ids: each must be a task id (text)", field="task_ids")
    return ids  # type: ignore[return-value]


def check_limit(field: str, value: object, *, allow_zero: bool) -> int:
    low = 0 if allow_zero else 1
    allowed = f"1..{MAX_ATTEMPT_LIMIT}"
    if allow_zero:
        allowed = f"0 (no explicit limit) or {allowed}"
    if not is_integer(value):
        raise InvalidInput(
            f"{field} must be a whole number in {allowed}, got {value!r}", field=field
        )
    if not low <= value <= MAX_ATTEMPT_LIMIT:
        raise InvalidInput(f"{field} must be {allowed}, got {value}", field=field)
    return value


def check_uncharged(value: object) -> int | None:
    if value is None:
        return None
    if not is_integer(value) or not 1 <= value <= MAX_UNCHARGED_LIMIT:
        raise InvalidInput(
            f"max_uncharged_attempts must be a whole number in 1..{MAX_UNCHARGED_LIMIT} "
            f"(or None for the ledger's budget), got {value!r}",
            field="max_uncharged_attempts",
        )
    return value


def check_lease(field: str, value: object) -> float:
    if not is_number(value) or not 0 < value <= MAX_LEASE_S:
        raise InvalidInput(
            f"{field} must be a number of seconds in (0, {MAX_LEASE_S:g}], got {value!r}",
            field=field,
        )
    return float(value)


def check_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        # Anything truthy would lift a stop: only a real True may.
        raise InvalidInput(f"{field} must be true or false, got {value!r}", field=field)
    return value


def as_actor(value: object) -> Actor:
    """`value` as an Actor whose name and on-behalf-of are masked (an `X-On-Behalf-Of`
    header or a `--on-behalf-of` flag is free text from outside)."""
    if isinstance(value, Actor):
        behalf = value.on_behalf_of
        masked = None if behalf is None else mask_text(_unicode("on_behalf_of", behalf))
        return Actor(mask_name(_unicode("actor", value.name)), on_behalf_of=masked)
    return Actor(check_name("actor", value, MAX_KEY))


def moment(now: float | None) -> float:
    """`now`, or the clock; a time that is not a finite number is refused before any write
    (a NaN stored as a start or end time would make the task's history unreadable)."""
    if now is None:
        return time.time()
    if not is_number(now):
        raise InvalidInput(
            f"now must be a finite number of POSIX seconds, got {now!r}", field="now"
        )
    return float(now)


def optional_time(field: str, value: object) -> float | None:
    if value is None:
        return None
    if not is_number(value):
        raise InvalidInput(
            f"{field} must be a finite number of POSIX seconds or None, got {value!r}",
            field=field,
        )
    return float(value)


def clean_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise InvalidInput(
            f"reason must be a string or None, got {type(reason).__name__}", field="reason"
        )
    cleaned = mask_text(_unicode("reason", reason))
    if len(cleaned) > _MAX_REASON:
        # Keep the end: the last lines of a failure say the most about it.
        cleaned = "…" + cleaned[-(_MAX_REASON - 1) :]
    return cleaned


def as_failure_class(value: FailureClass | str | None) -> FailureClass | None:
    if value is None or isinstance(value, FailureClass):
        return value
    try:
        return FailureClass(value)
    except ValueError:
        allowed = ", ".join(FailureClass)
        raise InvalidInput(
            f"failure_class must be one of {allowed}, got {value!r}", field="failure_class"
        ) from None


def as_task_state(value: object) -> TaskState:
    if isinstance(value, TaskState):
        return value
    if isinstance(value, str) and value in TaskState.__members__.values():
        return TaskState(value)
    allowed = ", ".join(TaskState)
    raise InvalidInput(f"state must be one of {allowed}, got {value!r}", field="state")


def fingerprint_of(request: dict[str, Any]) -> str:
    import hashlib  # at the first write: loading OpenSSL is no read-only command's cost

    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a lone surrogate (an argument that was not UTF-8) is refused later, by
    # the check of the value itself; valid text hashes exactly as before.
    return hashlib.sha256(canonical.encode("utf-8", errors="surrogatepass")).hexdigest()


def creation_fingerprint(title: str, max_attempts: int, max_uncharged: int | None) -> str:
    # ADR 0033: the legacy fingerprint (title only) is unchanged when there is no limit;
    # explicit limits (and a per-task uncharged ceiling) extend it.
    request: dict[str, Any] = {"title": title}
    if max_attempts:
        request["max_attempts"] = max_attempts
    if max_uncharged is not None:
        request["max_uncharged_attempts"] = max_uncharged
    return fingerprint_of(request)
