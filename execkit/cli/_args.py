"""Parsing of flag values shared by CLI groups.

Flags take plain strings and are parsed here, so a bad value is an `invalid` error that
names the flag and its allowed range (exit 3, JSON with `--json`), never a usage error.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Any, NoReturn

from execkit._errors import InvalidInput

__all__ = [
    "DB_ENV_VAR",
    "CliParser",
    "parse_db",
    "parse_int",
    "parse_money",
    "parse_seconds",
    "parse_usage",
]


class CliParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are `invalid` input like any other, and which
    never imports shutil.

    Plain argparse prints usage and exits 2; raising instead gives a bad flag value the
    same documented exit code and, with `--json`, the same JSON error object as every
    other invalid input. Subparsers inherit the class (a parent parser must be one too).
    """

    def error(self, message: str) -> NoReturn:
        raise InvalidInput(f"{self.prog}: {message} (see '{self.prog} --help')")

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for every argument added, and without a width its
        # formatter imports shutil (with zlib, bz2 and lzma: 2 ms of every start) for the
        # terminal's. The same width, found without it.
        make: Any = self.formatter_class
        formatter: argparse.HelpFormatter = make(prog=self.prog, width=help_width())
        return formatter


def help_width() -> int:
    """The width argparse formats help to: `shutil.get_terminal_size().columns - 2`
    ($COLUMNS if it is a positive number, else stdout's terminal, else 80), without
    importing shutil."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns if columns > 0 else 80) - 2


# Read by `execkit.ledger.default_db_path` when no --db is given (named here so that a bad
# value is caught without importing the ledger).
DB_ENV_VAR = "EXECKIT_DB"

# A pattern string, compiled (and cached by `re`) at its first use, not at import.
_INT = r"[+-]?[0-9]+"


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
        raise InvalidInput(
            f"{flag} must be a finite number of seconds {bound}, got {raw!r}", field=flag
        )
    return seconds


def parse_int(
    flag: str, text: str, low: int, high: int | None = None, *, allowed: str | None = None
) -> int:
    """`text` as a whole number in low..high (no upper bound when `high` is None).

    Anything else ("abc", "2.5", "", out of range) is InvalidInput naming `flag` and the
    range (`allowed` overrides how the range is said).
    """
    if allowed is None:
        allowed = f">= {low}" if high is None else f"{low}..{high}"
    if not re.fullmatch(_INT, text.strip()):
        raise InvalidInput(f"{flag} must be a whole number, {allowed}; got {text!r}", field=flag)
    value = int(text)
    if value < low or (high is not None and value > high):
        raise InvalidInput(f"{flag} must be {allowed}; got {value}", field=flag)
    return value


def parse_money(flag: str, raw: object) -> float | None:
    """`raw` as a USD amount > 0 ("1.50", "$1.50"); None stays None, and `off` or `none`
    is None too (no cap). Anything else is InvalidInput naming `flag` and the range."""
    if raw is None or str(raw).strip().lower() in ("off", "none"):
        return None
    text = str(raw).strip().removeprefix("$")
    try:
        usd = float(text)
    except ValueError:
        usd = math.nan
    if not math.isfinite(usd) or usd <= 0:
        raise InvalidInput(f"{flag} must be a USD amount > 0 (or off), got {raw!r}", field=flag)
    return usd


def parse_usage(flag: str, raw: str) -> Any:
    """`raw` (a JSON object of `Usage`'s fields) as a `Usage`; InvalidInput naming `flag`
    for text that is not such an object, and `Usage`'s own for a bad field."""
    import json

    from execkit._usage import Usage

    try:
        fields = json.loads(raw)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise InvalidInput(
            f"{flag} must be a JSON object of input_tokens, output_tokens, cache_read_tokens, "
            f"cache_write_tokens, usd, usd_source, model; got {raw!r}",
            field=flag,
        )
    try:
        return Usage(**fields)
    except TypeError as exc:
        raise InvalidInput(f"{flag}: {exc}", field=flag) from None


def parse_db(raw: str | None) -> str | None:
    """The `--db PATH` value, checked before any ledger is opened; None stays None.

    A directory is never a ledger file: `--db DIR` (or `$EXECKIT_DB` naming a directory,
    when no --db is given) is InvalidInput naming where the path came from, instead of
    whatever the storage layer would make of it. Anything else is left to the ledger
    (a missing file is `not_found` for commands that only read).
    """
    if raw is not None and raw != "":
        if os.path.isdir(raw):
            raise InvalidInput(
                f"--db must name a ledger file, got the directory {raw}", field="--db"
            )
        return raw
    from_env = os.environ.get(DB_ENV_VAR)
    if from_env and os.path.isdir(from_env):
        raise InvalidInput(
            f"--db not given and ${DB_ENV_VAR} names a directory, not a ledger file: {from_env}",
            field=DB_ENV_VAR,
        )
    return raw
