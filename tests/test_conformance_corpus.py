"""The conformance corpus execkit.testing serves: every recorded cell, as package data.

The packaged copy must equal what the recordings build (fixtures/recorded stays the source
of truth); every packaged cell through its adapter gets the class an operator needs; and
the `recorded_cell` fixture parametrizes a user's own test over them.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from execkit import get_adapter
from execkit._corpus import CORPUS_FILE, STREAM_CHARS, build_corpus
from execkit.testing import RecordedCell, recorded_cell_params, recorded_cells

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "fixtures" / "recorded"


def test_the_packaged_corpus_is_the_recordings() -> None:
    packaged = json.loads(gzip.decompress((REPO / "execkit" / CORPUS_FILE).read_bytes()))
    built = json.loads(json.dumps(build_corpus(RECORDED)))
    assert packaged == built, "run: python tests/vendors/measure.py --write-corpus"


def test_every_recorded_cell_is_served_compactly() -> None:
    cells = recorded_cells()
    on_disk = sorted(
        f"{p.parent.parent.name}/{p.parent.name}" for p in RECORDED.glob("*/*/meta.json")
    )
    assert sorted(cell.key for cell in cells) == on_disk
    assert all(
        len(cell.stdout) <= STREAM_CHARS and len(cell.stderr) <= STREAM_CHARS for cell in cells
    )
    # Compact: well under a megabyte for every CLI in every scenario.
    assert (REPO / "execkit" / CORPUS_FILE).stat().st_size < 1024 * 1024


@pytest.mark.parametrize("cell", recorded_cell_params())
def test_each_packaged_cell_gets_its_expected_class_through_its_adapter(
    cell: RecordedCell,
) -> None:
    mapped = get_adapter(cell.cli).parse(cell.spawn_result())
    assert mapped.failure_class == cell.expected_class, (cell.key, mapped.reason, cell.why)
    if cell.expected_class is not None:
        assert mapped.reason == cell.expected_reason, cell.key


def test_filters_and_params() -> None:
    claude = recorded_cells("claude")
    assert claude and {cell.cli for cell in claude} == {"claude"}
    pair = recorded_cells(["pi", "qwen"], "server_500")
    assert sorted(cell.key for cell in pair) == ["pi/server_500", "qwen/server_500"]
    params = recorded_cell_params(cli="codex", scenario="usage_limit")
    assert [param.id for param in params] == ["codex/usage_limit"]
    assert recorded_cells("no-such-cli") == ()


def test_the_recorded_cell_fixture_in_a_user_test_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mine=textwrap.dedent(
            """
            import pytest
            from execkit import get_adapter

            @pytest.mark.recorded_cells(cli="claude", scenario=["auth_401", "server_500"])
            def test_claude(recorded_cell):
                mapped = get_adapter("claude").parse(recorded_cell.spawn_result())
                assert mapped.failure_class == recorded_cell.expected_class

            @pytest.mark.recorded_cells(cli="gemini")
            def test_every_gemini_cell_has_a_why(recorded_cell):
                assert recorded_cell.why and recorded_cell.key.startswith("gemini/")
            """
        )
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")
    gemini = len(recorded_cells("gemini"))
    result.assert_outcomes(passed=2 + gemini)
    result.stdout.fnmatch_lines(["*test_claude?claude/auth_401?*PASSED*"])


def test_a_wrong_marker_argument_is_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad=textwrap.dedent(
            """
            import pytest

            @pytest.mark.recorded_cells(vendor="claude")
            def test_it(recorded_cell):
                pass
            """
        )
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*recorded_cells takes cli= and scenario=*"])
    assert result.ret != 0


def test_a_recorded_reset_reads_as_recorded_against_the_cells_own_clock() -> None:
    # A stated reset is what the CLI printed then: against `recorded_at` (in UTC, the zone
    # the recorder runs every CLI in) it gives the expected wait whatever the day today.
    import attrs

    cells = [c for c in recorded_cells() if isinstance(c.expected_retry_after_s, tuple)]
    assert {"codex/usage_limit_this_minute", "claude/usage_limit_gateway"} <= {c.key for c in cells}
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        for cell in cells:
            assert cell.recorded_at is not None, cell.key
            adapter = get_adapter(cell.cli)
            kind: type[Any] = type(adapter)
            if attrs.has(kind) and "clock" in attrs.fields_dict(kind):  # a clock-time reset
                clock = functools.partial(float, cell.recorded_at)
                adapter = attrs.evolve(adapter, clock=clock)  # type: ignore[misc]
            mapped = adapter.parse(cell.spawn_result())
            low, high = cell.expected_retry_after_s  # type: ignore[misc]
            assert mapped.retry_after_s is not None, cell.key
            assert low <= mapped.retry_after_s <= high, (cell.key, mapped.retry_after_s)
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()
