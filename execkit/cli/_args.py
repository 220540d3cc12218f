"""Parsing of flag values shared by CLI groups.

Flags take plain strings and are parsed here, so a bad value is an `invalid` error that
names the flag and its allowed range (exit 3, JSON with `--json`), never a usage error.
"""

from __future__ import annotations

import math

from execkit.errors import InvalidInput

__all__ = ["parse_seconds"]


def parse_seconds(flag: str, raw: object, *, allow_zero: bool) -> float | None:
    """`raw` as a finite number of seconds (> 0, or >= 0 with `allow_zero`); None stays None.

    Raises InvalidInput naming `flag` and the range for anything else ("soon", -1, nan, inf).
    """
    if raw is None:
        return None
    bound = ">= 0" if allow_zero else "> 0"
    try:
        seconds = float(str(raw))
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidInput(f"{flag} must be a finite number of seconds {bound}, got {raw!r}")
    return seconds
