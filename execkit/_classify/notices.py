"""Retry notices: the lines where a vendor CLI announced a retry and then went on.

A CLI announces a transient failure it is about to retry (`...; retrying 1/5`, `Retrying in
1 seconds`, codex's `Reconnecting... 1/5 (...)`, gemini's `Attempt 1 failed with status
503. Retrying with backoff...` with its stack trace). When more output follows a notice the
retry went on, so the notice is stale: if the retry succeeded and the work failed later, it
must not excuse the work. `NoticeIndex` finds the stale notices of a lowered tail once, with
the stack frames (`    at ...`) and the inspected error object printed under each, and
answers `is_stale_notice(offset)` by bisection. A notice that is the last thing in the text
(the run ended while still retrying) is not stale, and counts.

Linear time: each keyword (`retrying`, `reconnecting`) is searched again only once the scan
has passed its last occurrence, and each line is read once.
"""

from __future__ import annotations

import bisect

_NOTICE_WORDS = ("retrying", "reconnecting")


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
        content_end = len(low.rstrip())
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
            if end < content_end:  # output followed: the retry went on
                self._starts.append(line_start)
                self._ends.append(end)
            position = end + 1

    def is_stale_notice(self, start: int) -> bool:
        """True when `start` lies on a retry notice that more output followed."""
        index = bisect.bisect_right(self._starts, start) - 1
        return index >= 0 and start <= self._ends[index]
