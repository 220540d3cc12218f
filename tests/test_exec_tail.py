"""The bounded tail buffer: last bytes kept, exact totals, never raises on decode."""

from __future__ import annotations

import pytest
from hypothesis import given
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


def test_memory_is_bounded_by_twice_the_limit() -> None:
    tail = TailBuffer(1000)
    for _ in range(10_000):
        tail.feed(b"x" * 333)
        assert len(tail._buf) < 2 * 1000 + 333
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
