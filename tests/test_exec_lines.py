"""The exec stage's line hook (`spawn(on_line=...)`): each complete line as it arrives, cut
at a bound, and a `StopTree` answer that ends the tree (issue 52, item 3)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _support import wait_gone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execkit import Line, StopTree, spawn
from execkit._exec import LINE_BYTES
from execkit._exec.lines import LineSplitter

PY = [sys.executable, "-I", "-S"]


def _lines_of(data: bytes) -> list[str]:
    """What the hook must see for a stream that wrote `data`: its non-blank lines, each
    without its line ending, cut at LINE_BYTES."""
    lines = data.split(b"\n")
    out = []
    for raw in lines:
        cut = len(raw) > LINE_BYTES
        piece = raw[:LINE_BYTES] if cut else raw
        if not cut and piece.endswith(b"\r"):
            piece = piece[:-1]
        if piece and not piece.isspace():
            out.append(piece.decode("utf-8", "replace"))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from([b"\n", b"\r\n", b"\n\n", b" \n", b"x" * (LINE_BYTES + 3)]),
        ),
        max_size=30,
    ),
    st.data(),
)
def test_any_chunking_hands_over_the_same_lines(pieces: list[bytes], data: st.DataObject) -> None:
    whole = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=12)))
    seen: list[Line] = []
    splitter = LineSplitter("stdout", lambda line: seen.append(line))
    start = 0
    for cut in [*cuts, len(whole)]:
        splitter.feed(whole[start:cut])
        # The unfinished line held between chunks never outgrows a line.
        assert len(splitter._pending) <= LINE_BYTES
        start = cut
    splitter.end()
    assert [line.text for line in seen] == _lines_of(whole)
    assert all(line.stream == "stdout" for line in seen)
    assert [line.cut for line in seen] == [
        len(raw) > LINE_BYTES
        for raw in whole.split(b"\n")
        if (raw[:LINE_BYTES] if len(raw) > LINE_BYTES else raw.removesuffix(b"\r")).strip()
    ]


def test_a_line_longer_than_the_bound_is_cut_and_its_rest_skipped() -> None:
    seen: list[Line] = []
    splitter = LineSplitter("stderr", lambda line: seen.append(line))
    # 10 MiB with no newline, fed as a pipe hands it over, then a short line.
    for _ in range(160):
        splitter.feed(b"y" * 65536)
        assert len(splitter._pending) <= LINE_BYTES
    splitter.feed(b"tail of the long one\nnext\n")
    splitter.end()
    assert [(line.stream, len(line.text), line.cut) for line in seen] == [
        ("stderr", LINE_BYTES, True),
        ("stderr", 4, False),
    ]
    assert seen[1].text == "next"


def test_lines_arrive_live_per_stream_and_the_last_one_without_a_newline() -> None:
    seen: list[Line] = []
    code = (
        "import sys\n"
        "sys.stdout.write('one\\r\\ntwo\\n\\n   \\n'); sys.stdout.flush()\n"
        "sys.stderr.write('warn: é\\n'); sys.stderr.flush()\n"
        "sys.stdout.write('three, no newline')\n"
    )
    result = spawn([*PY, "-c", code], on_line=lambda line: seen.append(line))
    assert result.ok and result.stopped_by is None
    assert [(line.stream, line.text) for line in seen if line.stream == "stdout"] == [
        ("stdout", "one"),
        ("stdout", "two"),
        ("stdout", "three, no newline"),
    ]
    assert [line.text for line in seen if line.stream == "stderr"] == ["warn: é"]
    # The tails are what they are without a hook.
    assert result.stdout_tail == "one\r\ntwo\n\n   \nthree, no newline"


def test_a_stop_tree_answer_ends_a_child_that_would_sleep_for_ten_minutes() -> None:
    code = (
        "import sys, time\n"
        "print('working', flush=True)\n"
        "print('Retrying after 600000ms...', file=sys.stderr, flush=True)\n"
        "time.sleep(600)\n"
        "print('never')\n"
    )
    seen: list[str] = []

    def hook(line: Line) -> StopTree | None:
        seen.append(line.text)
        return StopTree("announced a 600 s sleep") if "Retrying after" in line.text else None

    # The timeout is far beyond what the test waits for: only the hook can end it in time.
    result = spawn([*PY, "-c", code], on_line=hook, timeout=300, kill_grace=5)
    assert result.stopped_by == "announced a 600 s sleep"
    assert not result.timed_out and not result.ok
    assert "never" not in result.stdout_tail
    assert seen == ["working", "Retrying after 600000ms..."]
    assert result.pid is not None and wait_gone(result.pid)


def test_the_stop_reason_is_masked_on_the_result_and_later_stops_are_ignored() -> None:
    code = "import time\nprint('a', flush=True)\nprint('b', flush=True)\ntime.sleep(600)\n"
    secret = "sk-proj-" + "A1b2C3d4E5f6G7h8J9k0" * 2

    def hook(line: Line) -> StopTree:
        return StopTree(f"{line.text}: {secret}")

    result = spawn([*PY, "-c", code], on_line=hook, timeout=300)
    assert result.stopped_by is not None and result.stopped_by.startswith("a: ")
    assert secret not in result.stopped_by and "[REDACTED]" in result.stopped_by
    assert not result.timed_out


def test_a_hook_that_raises_kills_the_child_and_propagates(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        "import os, sys, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "print('boom', flush=True)\n"
        "time.sleep(600)\n"
    )

    def hook(line: Line) -> None:
        raise RuntimeError(f"hook broke on {line.text}")

    with pytest.raises(RuntimeError, match="hook broke on boom"):
        spawn([*PY, "-c", code], on_line=hook, timeout=300)
    assert wait_gone(int(pid_file.read_text()))


def test_a_hook_answering_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="StopTree"):
        spawn([*PY, "-c", "print('x')"], on_line=lambda line: "stop")  # type: ignore[arg-type,return-value]


def test_a_hook_sees_lines_unredacted_while_the_tails_are_masked() -> None:
    secret = "sk-proj-" + "Z9y8X7w6V5u4T3s2R1q0" * 2
    seen: list[str] = []
    result = spawn(
        [*PY, "-c", f"print('key {secret}')"],
        on_line=lambda line: seen.append(line.text),
    )
    assert seen == [f"key {secret}"]
    assert secret not in result.stdout_tail


def test_a_hook_and_a_chunk_callback_both_see_the_output() -> None:
    chunks: list[bytes] = []
    seen: list[str] = []
    code = "import sys; sys.stdout.write('x' * 200000 + '\\nend\\n')"
    result = spawn(
        [*PY, "-c", code],
        on_stdout=chunks.append,
        on_line=lambda line: seen.append(line.text),
    )
    assert result.ok
    assert b"".join(chunks) == b"x" * 200000 + b"\nend\n"
    assert seen == ["x" * LINE_BYTES, "end"]


def test_a_bad_hook_is_refused_before_anything_runs() -> None:
    with pytest.raises(TypeError, match="on_line must be callable or None"):
        spawn(["true"], on_line="not callable")  # type: ignore[arg-type]
