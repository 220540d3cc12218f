"""The bounded tail buffer: last bytes kept, exact totals, never raises on decode."""

from __future__ import annotations

import contextlib
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execkit._tail import TailBuffer

chunks = st.lists(st.binary(max_size=300), max_size=30)


@given(chunks=chunks, limit=st.integers(min_value=1, max_value=200))
def test_keeps_exactly_the_last_bytes_and_counts_all(chunks: list[bytes], limit: int) -> None:
    tail = TailBuffer(limit)
    for chunk in chunks:
        tail.feed(chunk)
    everything = b"".join(chunks)
    assert tail.total == len(everything)
    assert tail.truncated == (len(everything) > limit)
    assert tail.tail_bytes() == everything[-limit:]


@given(chunks=chunks, limit=st.integers(min_value=1, max_value=200))
def test_text_decodes_the_tail_skipping_at_most_a_cut_character(
    chunks: list[bytes], limit: int
) -> None:
    tail = TailBuffer(limit)
    for chunk in chunks:
        tail.feed(chunk)
    kept = tail.tail_bytes()
    text = tail.text()
    if not tail.truncated:
        assert text == kept.decode("utf-8", "replace")
    else:
        candidates = {kept[skip:].decode("utf-8", "replace") for skip in range(4)}
        assert text in candidates


@given(
    text=st.text(min_size=1, max_size=200),
    limit=st.integers(min_value=4, max_value=100),
    split=st.integers(min_value=0, max_value=50),
)
def test_valid_utf8_never_opens_with_a_replacement(text: str, limit: int, split: int) -> None:
    data = text.encode("utf-8")
    tail = TailBuffer(limit)
    tail.feed(data[:split])
    tail.feed(data[split:])
    decoded = tail.text()
    assert "\ufffd" not in decoded or "\ufffd" in text
    assert text.endswith(decoded)


def test_memory_is_bounded_by_the_limit() -> None:
    tail = TailBuffer(1000)
    for _ in range(10_000):
        tail.feed(b"x" * 333)
        assert len(tail._buf) <= 1000
    assert tail.total == 3_330_000


@pytest.mark.parametrize("limit", [0, -5])
def test_limit_must_be_positive(limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        TailBuffer(limit)


@given(
    chunks=chunks,
    limit=st.integers(min_value=1, max_value=200),
    context=st.integers(min_value=0, max_value=100),
)
def test_context_is_exactly_the_bytes_before_the_tail(
    chunks: list[bytes], limit: int, context: int
) -> None:
    tail = TailBuffer(limit, context)
    for chunk in chunks:
        tail.feed(chunk)
        assert len(tail._buf) < 2 * (limit + context) + len(chunk)
    everything = b"".join(chunks)
    assert tail.tail_bytes() == everything[-limit:]
    tail_starts = max(0, len(everything) - limit)
    assert tail.context_bytes() == everything[max(0, tail_starts - context) : tail_starts]


def test_negative_context_is_refused() -> None:
    with pytest.raises(ValueError, match="context"):
        TailBuffer(10, -1)


def _filled(chunks: list[bytes], limit: int, context: int) -> TailBuffer:
    """A TailBuffer that read `chunks`, one pipe write each, through `fill`."""
    tail = TailBuffer(limit, context)
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                with contextlib.suppress(BlockingIOError):  # full: read some first
                    view = view[os.write(write_fd, view) :]
                while True:
                    try:
                        if not tail.fill(read_fd):
                            break
                    except BlockingIOError:
                        break
    finally:
        os.close(read_fd)
        os.close(write_fd)
    return tail


@settings(deadline=None, max_examples=60)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=200_000), max_size=6),
    limit=st.sampled_from([1, 7, 65_536, 70_000, 200_000]),
    context=st.sampled_from([0, 13, 4096]),
)
def test_filling_from_a_pipe_keeps_what_feeding_keeps(
    sizes: list[int], limit: int, context: int
) -> None:
    # Large enough to go round the ring (read straight into it) several times.
    chunks = [bytes((n * 7 + i) % 251 for i in range(size)) for n, size in enumerate(sizes)]
    filled = _filled(chunks, limit, context)
    fed = TailBuffer(limit, context)
    for chunk in chunks:
        fed.feed(chunk)
    everything = b"".join(chunks)
    assert filled.total == fed.total == len(everything)
    assert filled.tail_bytes() == fed.tail_bytes() == everything[-limit:]
    assert filled.context_bytes() == fed.context_bytes()
    assert filled.text() == fed.text()
    assert len(filled._buf) <= limit + context


@given(chunks=chunks, limit=st.integers(min_value=1, max_value=200))
def test_the_ring_is_never_larger_than_what_it_keeps(chunks: list[bytes], limit: int) -> None:
    tail = TailBuffer(limit, 5)
    for chunk in chunks:
        tail.feed(chunk)
        assert len(tail._buf) <= limit + 5
