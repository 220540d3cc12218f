"""The bounded tail buffer: last bytes kept, exact totals, never raises on decode."""

from __future__ import annotations

import contextlib
import os
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from secrets_corpus import SAMPLES, Sample, leaked

from execkit._exec import BINARY_NOTICE, result
from execkit._exec import tail as tail_module
from execkit._exec.tail import KeptText, TailBuffer
from execkit._redact import redact

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


# ================================================================ binary output


def _kept(data: bytes, limit: int | None = None, context: int = 4096) -> KeptText:
    tail = TailBuffer(len(data) if limit is None else limit, context)
    tail.feed(data)
    return tail.kept()


@settings(max_examples=500)
@given(
    chunks=st.lists(
        st.one_of(
            st.binary(max_size=60),
            st.text(max_size=60).map(lambda text: text.encode("utf-8")),
            st.sampled_from([b"\0", b"\xff", b"\xc3", b"\n", b"token=", b"\xe2\x84\xaa"]),
        ),
        max_size=20,
    ),
    limit=st.integers(min_value=1, max_value=400),
)
def test_kept_is_the_text_or_what_follows_the_binary_output(
    chunks: list[bytes], limit: int
) -> None:
    tail = TailBuffer(limit, 50)
    for chunk in chunks:
        tail.feed(chunk)
    text, raw = tail.text(), tail._text_bytes()
    kept = tail.kept()
    undecodable = text.count("\ufffd") + text.count("\0")
    if undecodable * 4 <= len(raw):  # text: as `text()` has it, with the bytes before
        context = tail.context_bytes().decode("utf-8", "replace") if tail.truncated else ""
        assert kept == KeptText(text, context, 0)
        return
    # Binary: only what follows the last NUL or undecodable byte, which is valid UTF-8,
    # and the exact count of the kept bytes before it.
    assert kept.binary_bytes > 0
    assert tail.tail_bytes()[kept.binary_bytes :].decode("utf-8") == kept.text
    assert "\ufffd" not in kept.text and "\0" not in kept.text
    before = text[: len(text) - len(kept.text)]
    assert text.endswith(kept.text) and before[-1] in "\ufffd\0"
    assert before.endswith(kept.context) and len(kept.context) <= 50


def test_text_in_a_legacy_encoding_is_kept_as_text() -> None:
    # Latin-1 German: one byte in nine is not UTF-8. Damaged, but text an operator reads.
    data = "Größe der Datei: 12 MB, Übertragung läuft...\n".encode("latin-1") * 100
    kept = _kept(data)
    assert kept.binary_bytes == 0 and kept.text.startswith("Gr\ufffd\ufffde der Datei")


@pytest.mark.parametrize(
    ("data", "binary"),
    [
        (b"abc\0", False),  # a quarter of it: still text
        (b"ab\0", True),  # more than a quarter
        (b"\xff\xfeabcdef", False),
        (b"\xff\xfe\xfdabcdef", True),
        (b"\0" * 10, True),
    ],
)
def test_binary_is_more_than_a_quarter_nul_or_not_utf8(data: bytes, binary: bool) -> None:
    assert (_kept(data).binary_bytes > 0) == binary


def test_binary_output_keeps_the_text_after_it_and_counts_the_rest() -> None:
    noise = random.Random(1).randbytes(100_000)
    line = b"Error: 503 Service Unavailable\n"
    kept = _kept(noise + b"\0" + line, limit=65_536)
    assert kept == KeptText(line.decode(), kept.context, 65_536 - len(line))
    assert kept.context.endswith("\0") and len(kept.context) == 4096
    assert _kept(noise + b"\0").text == ""  # binary to the end: nothing kept as text


@settings(max_examples=600, deadline=None)
@given(
    sample=st.sampled_from(SAMPLES),
    noise=st.binary(min_size=1, max_size=300),
    after=st.text(max_size=30),
    data=st.data(),
)
def test_binary_output_never_lets_a_secret_through(
    sample: Sample, noise: bytes, after: str, data: st.DataObject
) -> None:
    # Binary output and then a credential, with a NUL somewhere before the secret (between
    # a name and its value, say): the binary part is dropped and the rest is redacted with
    # what came before it, so wherever the whole text would have been masked, it is.
    line = sample.text + after
    at = data.draw(st.integers(min_value=0, max_value=line.index(sample.secret)), label="nul")
    text_bytes = (line[:at] + "\0" + line[at:]).encode("utf-8")
    masked_as_text = redact(text_bytes.decode("utf-8"), sample.extra_secrets)
    assume(not leaked(sample.secret, masked_as_text))
    tail = TailBuffer(1 << 16, 4096)
    # The noise ends its own line: glued to the line's first word it would change that
    # word ("0" + "7z" is no 7z command), which no redactor can know.
    tail.feed(b"\0" * (4 * len(text_bytes)) + noise + b"\n" + text_bytes)
    kept = tail.kept()
    assert kept.binary_bytes > 0
    stored = result._stored_tail(kept, sample.extra_secrets)
    assert stored.startswith(BINARY_NOTICE.format(kept.binary_bytes))
    assert not leaked(sample.secret, stored), stored


def test_a_silent_stream_is_kept_as_nothing_without_slicing_or_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Most spawns leave stderr (and many stdout) empty: nothing to join, decode or search.
    decoded: list[int] = []
    real = tail_module._decode

    def counted(data: bytes | memoryview) -> str:
        decoded.append(len(data))
        return real(data)

    monkeypatch.setattr(tail_module, "_decode", counted)
    assert TailBuffer(64, 16).kept() == KeptText("", "", 0)
    assert decoded == []
    fed = TailBuffer(64, 16)
    fed.feed(b"x")
    assert fed.kept() == KeptText("x", "", 0)
    assert decoded == [1]
