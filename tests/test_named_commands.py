"""Every `execkit ...` command that a message, a page or a doc tells a person to run is one
the CLI has: a fix that names a command which does not exist is no fix (the dashboard once
told an operator to run `execkit task limit`, which is `execkit task set-attempt-limit`).

The named commands are read from the source (its messages and docstrings), the README and
docs/: each backticked `execkit WORD [WORD]` whose first word is a command of the CLI is
asked for its help, which exits 0 only when the command (and its action) exist."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from _support import REPO

from execkit.cli import _COMMANDS, main

_NAMED = re.compile(r"`execkit ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def _named() -> dict[tuple[str, ...], str]:
    """Each command named, by its words, with one place that names it."""
    places = [*sorted((REPO / "execkit").rglob("*.py")), REPO / "README.md"]
    places += sorted((REPO / "docs").glob("*.md"))
    found: dict[tuple[str, ...], str] = {}
    for place in places:
        for match in _NAMED.finditer(place.read_text(encoding="utf-8")):
            if match.group(1) in _COMMANDS:
                words = tuple(word for word in match.groups() if word)
                found.setdefault(words, str(place.relative_to(REPO)))
    return found


NAMED = _named()


def test_the_sources_name_commands_at_all() -> None:
    # The scan itself works: it finds the commands the operator's fixes name.
    assert {("task", "set-budget"), ("lane", "resume"), ("db", "migrate")} <= set(NAMED)


@pytest.mark.parametrize("words", sorted(NAMED), ids=" ".join)
def test_each_named_command_exists(words: tuple[str, ...]) -> None:
    code: object
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main([*words, "--help"])
    except SystemExit as exc:  # argparse's help exits
        code = exc.code
    assert code == 0, f"{NAMED[words]} names `execkit {' '.join(words)}`, which the CLI lacks"
