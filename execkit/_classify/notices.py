"""Retry notices: the lines where a vendor CLI announced a retry and then went on.

A CLI announces a transient failure it is about to retry (`...; retrying 1/5`, `Retrying in
1 seconds`, codex's `Reconnecting... 1/5 (...)`, gemini's `Attempt 1 failed with status
503. Retrying with backoff...` with its stack trace). When more output follows a notice the
retry went on, so the notice is stale: if the retry succeeded and the work failed later, it
must not excuse the work. `NoticeIndex` finds the stale notices of a lowered tail once, with
the stack frames (`    at ...`) and the inspected error object printed under each, and
answers `is_stale_notice(offset)` by bisection. A notice that is the last thing in the text
(the run ended while still retrying) is not stale, and counts.

Nor is a notice followed only by a generic ending (issue 44): the line a CLI prints when
the request it was retrying was abandoned, which says nothing about the work: claude's
`API Error: Operation aborted`, `Interrupted by user`, `[Request interrupted by user]`,
`Connection error.`, `TypeError (fetch failed)`, node's `This operation was aborted`. A
ladder of 529 notices that ends in one of them was still the vendor's refusal; the same
line after anything else (a tool's output, the work's own error) is just more output.

Linear time: each keyword (`retrying`, `reconnecting`) is searched again only once the scan
has passed its last occurrence, and each line is read once.
"""

from __future__ import annotations

import bisect

from execkit._classify import patterns

_NOTICE_WORDS = ("retrying", "reconnecting")
# A whole (lowered) line that is only a CLI abandoning its request: an abort, an interrupt,
# a lost connection, with the decorations claude puts around it. Bounded and anchored, so
# matching a line is linear in it; only short lines are tried.
GENERIC_ENDING_SOURCE = (
    r"[ \t\u23bf\u23fa\u25cf>\[]{0,8}(?:(?:api )?error:[ \t]{0,4})?"
    r"(?:(?:the|this) )?(?:(?:operation|request) (?:was )?aborted"
    r"|(?:request )?interrupted by user(?: for tool use)?"
    r"|(?:api )?connection error|typeerror[ \t]{0,2}[(:][ \t]{0,2}fetch failed\)?"
    r"|fetch failed)"
    r"[ \t.!\]]{0,8}"
)
_ENDING_WORDS = ("abort", "interrupted", "connection error", "fetch failed")
_ENDING_LINE_CHARS = 120


def is_generic_ending(line: str) -> bool:
    """Whether a lowered line is only a CLI abandoning its request (see the docstring)."""
    if len(line) > _ENDING_LINE_CHARS or not any(word in line for word in _ENDING_WORDS):
        return False
    return patterns.compiled(GENERIC_ENDING_SOURCE).fullmatch(line) is not None


def content_end(low: str) -> int:
    """Where a lowered text's content ends: its end without trailing blank lines and
    trailing generic endings (each character read at most twice, from the end)."""
    end = len(low.rstrip())
    while end > 0:
        start = low.rfind("\n", 0, end) + 1
        if not is_generic_ending(low[start:end].strip()):
            return end
        end = start - 1
        while end > 0 and low[end - 1].isspace():
            end -= 1
    return max(end, 0)


def _next_line(low: str, line_end: int) -> tuple[int, int]:
    """(start, end) of the line after the one ending at `line_end` (a newline or the end)."""
    start = line_end + 1
    end = low.find("\n", start)
    return start, len(low) if end < 0 else end


def _continuation_end(low: str, line_start: int, line_end: int) -> int:
    """Where a notice's printout ends: its stack frames (`    at ...`) and the inspected
    error object a frame opens with `{` (indented lines up to a closing `}`) belong to it."""
    in_block = low[line_start:line_end].rstrip().endswith("{")
    end = line_end
    while end < len(low):
        start, next_end = _next_line(low, end)
        line = low[start:next_end]
        if in_block:
            if line.startswith("}"):
                in_block = False
            elif not line.startswith((" ", "\t")):
                break
        elif line.startswith((" ", "\t")) and line.lstrip().startswith("at "):
            in_block = line.rstrip().endswith("{")
        else:
            break
        end = next_end
    return end


class NoticeIndex:
    """The retry notices of a lowered tail that more output followed (stale ones)."""

    def __init__(self, low: str) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        # Output after a notice makes it stale; a generic ending after it does not.
        ending = content_end(low)
        position = 0
        upcoming = [low.find(word) for word in _NOTICE_WORDS]
        while True:
            # Each keyword's next occurrence is searched again only once passed: linear.
            upcoming = [
                found if found < 0 or found >= position else low.find(word, position)
                for word, found in zip(_NOTICE_WORDS, upcoming, strict=True)
            ]
            live = [found for found in upcoming if found >= 0]
            if not live:
                break
            found = min(live)
            line_start = low.rfind("\n", position, found) + 1 or position
            line_end = low.find("\n", found)
            line_end = len(low) if line_end < 0 else line_end
            end = _continuation_end(low, line_start, line_end)
            if end < ending:  # output followed: the retry went on
                self._starts.append(line_start)
                self._ends.append(end)
            position = end + 1

    def is_stale_notice(self, start: int) -> bool:
        """True when `start` lies on a retry notice that more output followed."""
        index = bisect.bisect_right(self._starts, start) - 1
        return index >= 0 and start <= self._ends[index]
