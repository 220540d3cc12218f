"""Shared CLI output: JSON printing, terminal-safe text and the error-code ➜ exit-code table.

Every byte the CLI writes to stdout or stderr goes through this module: `emit` (a line of
text), `print_json` (a JSON document), `report_error`, `report_internal_error` and the log
handler of `log_handler`. Each masks what it writes (`execkit._mask`: text with
`mask_text`, JSON structurally with `mask_json`), so a board field, a path, an argument or a
value read back from a ledger cannot reach the terminal unmasked, whichever command printed
it. No other module of execkit writes to stdout or stderr (tests/test_sink_layer.py).

Human text output prints values that came from outside execkit (task titles, failure
reasons, board issues, paths, error messages). `safe_text` escapes the control characters
in them, so a title holding `ESC [2J` or a carriage return cannot clear or rewrite the
operator's terminal. JSON output needs none of this: `json.dumps` escapes every control
character already.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from execkit._errors import INTERNAL_ERROR_EXIT, ExecKitError, error_types
from execkit._mask import mask_json, mask_text

if TYPE_CHECKING:
    import logging

    from execkit._lanes import LaneView

__all__ = [
    "EXIT_CODES",
    "INTERNAL_ERROR_EXIT",
    "charged_cell",
    "counts_phrase",
    "emit",
    "log_handler",
    "print_json",
    "report_error",
    "report_internal_error",
    "safe_text",
    "show_credential",
    "started_cell",
    "uncharged_cell",
    "utc_stamp",
    "waiting_text",
]

# One distinct, documented exit code per error code (README "Exit codes"), read off the
# error types themselves so the table cannot drift from them. `AgentFailed` (`agent_failed`,
# exit 1) is not in it: it lives in `_proof`, which no command needs to import for this
# table, and an error is reported with its own `exit_code` (`report_error`) in any case.
_ERROR_TYPES: tuple[type[ExecKitError], ...] = error_types()
EXIT_CODES: dict[str, int] = {kind.code: kind.exit_code for kind in _ERROR_TYPES}

# C0 controls, DEL and C1 controls, each written as a visible escape: the usual short
# escapes for tab, newline and carriage return, `\xNN` for the rest (ESC is `\x1b`).
_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_CONTROLS = [*range(0x00, 0x20), *range(0x7F, 0xA0)]
_ESCAPES: dict[int, str] = {
    code: _SHORT_ESCAPES.get(chr(code), f"\\x{code:02x}") for code in _CONTROLS
}
# For text where a line break is meant (a reply, a multi-line message): keep \n and \t.
_ESCAPES_MULTILINE: dict[int, str] = {
    code: escape for code, escape in _ESCAPES.items() if chr(code) not in "\n\t"
}


def safe_text(text: str, *, multiline: bool = False) -> str:
    """`text` with its control characters escaped, safe to print to a terminal.

    Every C0 control (U+0000..U+001F), DEL and every C1 control (U+0080..U+009F) is
    written as an escape (`\\x1b`, `\\r`, `\\n`, `\\t`, `\\x9b`), so nothing in the
    text can move the cursor, clear the screen or overwrite what was printed before.
    With `multiline`, newlines and tabs are kept as they are. Text without controls is
    returned unchanged.
    """
    if text.isprintable():  # no control at all (each is unprintable): the common case
        return text
    return text.translate(_ESCAPES_MULTILINE if multiline else _ESCAPES)


def started_cell(started: int, explicit_limit: int, bound: int | None) -> str:
    """Attempts started against the bound that binds them, named: `1/10 cap` (the dispatch
    cap), `1/5 limit` (the task's explicit limit, when it is the lower), `1` (neither).
    Every surface words the three counts of a task with these (`counts_phrase`)."""
    if bound is None:
        return str(started)
    return f"{started}/{bound} {'limit' if explicit_limit and bound == explicit_limit else 'cap'}"


def charged_cell(charged: int, budget: int | None) -> str:
    """Charged attempts against the work budget (`1/3`); `1` where no budget applies (an
    explicit limit replaces it, or a negative dispatch cap lifts it)."""
    return str(charged) if budget is None else f"{charged}/{budget}"


def uncharged_cell(streak: int, ceiling: int | None) -> str:
    """The uncharged streak against its ceiling (`0/3`)."""
    return str(streak) if ceiling is None else f"{streak}/{ceiling}"


def counts_phrase(
    started: int,
    charged: int,
    streak: int,
    *,
    explicit_limit: int,
    ceiling: int | None,
    budget: int | None,
    cap: int | None = None,
) -> str:
    """A task's three counts in a line, each named: `started 1/10 (dispatch cap), charged
    1/3 (work budget), uncharged streak 0/3`. `budget` is the work budget's charged bound
    (None when none applies); an explicit limit replaces it, and is then named as the
    bound on attempts started. `cap` is the dispatch cap, where a dispatcher applies one."""
    bounds = [b for b in (cap, explicit_limit) if b]
    bound = min(bounds) if bounds else None
    started_text = f"started {started}"
    if bound is not None:
        what = "explicit limit" if explicit_limit and bound == explicit_limit else "dispatch cap"
        started_text += f"/{bound} ({what})"
    if explicit_limit:
        charged_text = f"charged {charged} (the explicit limit replaces the work budget)"
    elif budget is None:
        charged_text = f"charged {charged}"
    else:
        charged_text = f"charged {charged}/{budget} (work budget)"
    return f"{started_text}, {charged_text}, uncharged streak {uncharged_cell(streak, ceiling)}"


def utc_stamp(epoch_s: float) -> str:
    """`epoch_s` as an ISO 8601 UTC time to the second (`2026-12-03T18:21:51+00:00`): what
    a human line prints for a time; JSON output keeps the epoch seconds. Total: a time
    no calendar holds is worded, never raised (`execkit._stamp`)."""
    from execkit._stamp import utc_stamp as stamp  # only the commands that print a time

    return stamp(epoch_s)


def emit(text: str = "", *, err: bool = False, lead: str = "") -> None:
    """`lead`, then `text` masked, and a newline, on stdout (stderr with `err`), flushed.
    The caller escapes control characters (`safe_text`) where the text came from outside.

    `lead` is execkit's own wording written as it is, where the redactor would mask a
    label for a secret-named value (`credentials: present`); it must be a string literal
    (tests/test_sink_layer.py), so nothing from outside can ride on it."""
    stream = sys.stderr if err else sys.stdout
    stream.write(lead + mask_text(text) + "\n")
    stream.flush()


def print_json(obj: Any, *, credential: str | None = None) -> None:
    """One JSON document on stdout, every string in it masked.

    `credential` names the one top-level member left as it is: a credential the operator
    asked execkit to make and show once (`execkit serve --add-token --json`). It is the
    only way past the mask, and tests/test_sink_layer.py allows it in that command only.
    """
    import json  # not every command prints JSON

    from execkit._mask import mask_json

    doc = mask_json(obj)
    if credential is not None:
        doc[credential] = obj[credential]
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()


def show_credential(value: str) -> None:
    """A credential execkit just made, on stdout as it is, shown once to the operator who
    asked for it: the one line the CLI does not mask (see `print_json`'s `credential`)."""
    sys.stdout.write(value + "\n")
    sys.stdout.flush()


def log_handler(prefix: str) -> logging.Handler:
    """A handler writing each log record on stderr as `PREFIX: LEVEL: message`, masked and
    escaped: the only way a CLI command puts log lines on the terminal."""
    import logging  # only the commands that log (dispatch, serve) pay for it

    class SafeFormatter(logging.Formatter):
        """Log lines masked, with their control characters escaped (a traceback keeps its
        newlines)."""

        def formatMessage(self, record: logging.LogRecord) -> str:
            return safe_text(mask_text(super().formatMessage(record)))

        def formatException(self, ei: Any) -> str:
            return safe_text(mask_text(super().formatException(ei)), multiline=True)

        def formatStack(self, stack_info: str) -> str:
            return safe_text(mask_text(super().formatStack(stack_info)), multiline=True)

    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter(f"{prefix}: %(levelname)s: %(message)s"))
    return handler


def print_json_list(
    key: str,
    items: Iterable[Any],
    *,
    head: Mapping[str, Any] | None = None,
    masked: bool = False,
    encoded: Callable[[Any], str] | None = None,
) -> None:
    """`{key: [items]}` on stdout, the bytes `print_json` writes for it, item by item as
    `items` yields them: a listing of any length is never held whole. `head` adds members
    written before the list (masked, as `print_json` masks); `masked` masks every string
    of every item (`_mask.json_masker`: each distinct string once), for items that hold
    text from outside the ledger (a board's titles). `encoded` writes an item's JSON text
    in place of the encoder (the same bytes, faster: `_model.task_json`); not with
    `masked`. An exception from `items` leaves the document unfinished (the error goes to
    stderr with its exit code)."""
    import json

    from execkit._mask import json_masker

    if encoded is not None and masked:
        raise ValueError("print_json_list: an item written by `encoded` cannot be masked")
    encode = json.JSONEncoder(sort_keys=True).encode  # one encoder, not one a call
    encode_item = encoded or encode
    mask = json_masker() if masked else None
    write = sys.stdout.write
    start = "{"
    for name, value in sorted((head or {}).items()):
        start += f"{encode(mask_text(name))}: {encode(mask_json(value))}, "
    write(start + encode(key) + ": [")
    texts = map(encode_item, items if mask is None else map(mask, items))
    separator = ""  # before each batch but the first
    with _fewer_collections():
        # A write per 512 items (see `write_lines`), each batch taken in one call.
        batch = list(itertools.islice(texts, 512))
        while len(batch) == 512:
            write(separator + ", ".join(batch))
            separator = ", "
            batch = list(itertools.islice(texts, 512))
    write((separator + ", ".join(batch) if batch else "") + "]}\n")
    sys.stdout.flush()


# The collector's first threshold while a listing is written: that many more objects made
# than freed before a collection (the default is 700).
BULK_GC_THRESHOLD = 100_000


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The collector's first threshold raised to `BULK_GC_THRESHOLD` while a listing is
    written, and restored after it.

    A listing reads a page of rows at a time and makes a few tuples a row (a record, its
    values, its line), none in a reference cycle: each is freed when the next page is read.
    At the default threshold a page in flight starts a collection every 700 of them, each
    walking the page, some 8% of a listing of 100,000 tasks. Memory is no different: what
    a listing frees it frees as ever (reference counts), and garbage in a cycle is still
    collected, after 100,000 objects instead of 700. A threshold of 0 (automatic
    collection off) is left as it is."""
    threshold = gc.get_threshold()
    if 0 < threshold[0] < BULK_GC_THRESHOLD:
        gc.set_threshold(BULK_GC_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def write_lines(lines: Iterable[str], batch: int = 512, *, masked: bool = False) -> None:
    """Each of `lines` on stdout, `batch` lines a write (a write costs more than the line
    it writes when there are 100,000 of them); flushed at the end. `masked` masks each
    batch as `emit` masks its text (lines are masked a batch at a time: the caller escapes
    control characters, so no credential spans two lines)."""
    write = sys.stdout.write
    pending: list[str] = []
    with _fewer_collections():
        for line in lines:
            pending.append(line)
            if len(pending) == batch:
                pending.append("")
                text = "\n".join(pending)
                write(mask_text(text) if masked else text)
                pending.clear()
    if pending:
        pending.append("")
        text = "\n".join(pending)
        write(mask_text(text) if masked else text)
    sys.stdout.flush()


def report_error(exc: ExecKitError, *, as_json: bool) -> int:
    """Write the error (JSON on stderr with --json: its code, message and `details()`, as
    the server's error document) and return its exit code.

    The message is redacted first (a task id that is a token, a path holding a password
    never reaches the terminal), and the text form escapes its control characters.
    """
    message = mask_text(exc.message)
    if as_json:
        import json

        payload = {"error": {"code": exc.code, "message": message, **exc.details()}}
        sys.stderr.write(json.dumps(payload, sort_keys=True) + "\n")
    else:
        sys.stderr.write(f"execkit: {exc.code}: {safe_text(message)}\n")
    return exc.exit_code


def report_internal_error(exc: BaseException) -> int:
    """The last line of defence: one line naming an unexpected exception, never a traceback."""
    detail = safe_text(mask_text(f"{type(exc).__name__}: {exc}"))
    sys.stderr.write(f"execkit: internal error: {detail} (set EXECKIT_DEBUG=1 for a traceback)\n")
    return INTERNAL_ERROR_EXIT


def waiting_text(lane: LaneView) -> str:
    """ "waiting on lane claude/3f2a... until 15:00:00Z (usage limit)", for status lines."""
    if lane.opens_at is not None:
        until = f"until {utc_stamp(lane.opens_at)}"
    elif lane.state == "stopped":
        until = "until an operator resumes it"
    else:
        until = "until its probe attempt's result"
    why = f" ({lane.reason})" if lane.reason else ""
    return safe_text(f"waiting on lane {lane.lane} {until}{why}")
