"""A long text under the compiled engine is scanned a chunk at a time (gate.py), and a pass
that matches within a line reads only the runs of chunks that hold its anchors
(engine.py's `_spans_in`): the output is the pure-Python engine's (which never chunks),
byte for byte, wherever the chunks fall; and a rule whose anchor occurs once reads about
a chunk, not the text. Work is counted (characters a pass is given), never timed; the
speed is in benchmarks/bench_exec.py."""

from __future__ import annotations

import random
import re
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from secrets_corpus import SAMPLES

import execkit._redact as _redact_package
from execkit._redact import engine, gate, redact
from execkit._redact.record import example_of

pytestmark = pytest.mark.skipif(
    "hyperscan" not in _redact_package.available_engines(),
    reason="chunks are the compiled engine's",
)

# Every phase 3 and phase 2 shape's own example and the corpus's credentials: what a
# line may hold besides log words.
_CREDENTIALS = [
    example_of(shape)[0]
    for step in (*engine.REFERENCE_PASSES, *engine.EXTRA_PASSES)
    for shape in step.shapes
] + [sample.text for sample in SAMPLES]
_FILLER = (
    "2024-05-01T12:00:00Z worker[42] token count 5, build step compiled module ok",
    "DEBUG cache warm for 🚀 région",
    "",
    "  at Module._compile (node:internal/modules/cjs/loader:1256:14)",
    "x",
)


def _with_engine(name: str | None) -> None:
    _redact_package.use_engine(name)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Chunks of about 256 characters from 1,024 on: many boundaries in a short text."""
    monkeypatch.setattr(gate, "CHUNK_CHARS", 256)
    monkeypatch.setattr(gate, "CHUNKED_FROM", 1024)
    try:
        yield
    finally:
        _with_engine(None)


def _both_engines(text: str) -> tuple[str, str]:
    _with_engine("hyperscan")
    chunked = redact(text)
    _with_engine("python")
    whole = redact(text)
    _with_engine(None)
    return chunked, whole


def _text(rng: random.Random, lines: int, credential_share: float) -> str:
    out: list[str] = []
    for _ in range(lines):
        if rng.random() < credential_share:
            out.append(
                rng.choice(_FILLER[:2]) + " " + rng.choice(_CREDENTIALS) + rng.choice(" \"'")
            )
        else:
            out.append(rng.choice(_FILLER))
    return "\n".join(out)


@pytest.mark.parametrize("seed", range(6))
def test_chunked_output_is_the_whole_texts_byte_for_byte(small_chunks: None, seed: int) -> None:
    rng = random.Random(seed)
    text = _text(rng, 400, 0.05)
    assert len(text) >= gate.CHUNKED_FROM
    chunked, whole = _both_engines(text)
    assert chunked == whole
    assert chunked != text  # something was masked: the comparison saw work


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parts=st.lists(
        st.one_of(st.sampled_from(_CREDENTIALS), st.sampled_from(_FILLER), st.text(max_size=40)),
        min_size=20,
        max_size=120,
    ),
    joins=st.lists(st.sampled_from(["\n", " ", "\\n", "=", '"', "\n\n", "x"]), min_size=1),
)
def test_any_text_in_small_chunks_redacts_as_the_pure_python_engine(
    small_chunks: None, parts: list[str], joins: list[str]
) -> None:
    text = "".join(part + joins[index % len(joins)] for index, part in enumerate(parts))
    text = (text + "\n") * max(1, gate.CHUNKED_FROM // max(1, len(text)) + 1)
    chunked, whole = _both_engines(text)
    assert chunked == whole


class _Reading:
    """A pass's compiled pattern that records how many characters each search may read."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.sizes: list[int] = []

    def _note(self, text: str, pos: int, endpos: int) -> None:
        self.sizes.append(min(endpos, len(text)) - pos)

    def finditer(self, text: str, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self._note(text, pos, endpos)
        return self.pattern.finditer(text, pos, endpos)

    def search(self, text: str, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self._note(text, pos, endpos)
        return self.pattern.search(text, pos, endpos)

    def match(self, text: str, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self._note(text, pos, min(endpos, pos + 1))  # a match at one place reads on from it
        return self.pattern.match(text, pos, endpos)


def _given_chars(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """How many characters each search of the pass `name`'s pattern may read."""
    (step,) = [step for step in engine.EXTRA_PASSES if step.name == name]
    reading = _Reading(step.pattern)
    monkeypatch.setattr(step, "_pattern", reading)
    return reading.sizes


def test_a_rule_whose_anchor_occurs_once_reads_about_a_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A key whose pattern opens with a character class (so `re` would try every position
    # of the text), once in a long log: its pattern reads the chunk it is in, plus what
    # it looks at around it, not the 64 chunks.
    by_name = {shape.name: shape for step in engine.EXTRA_PASSES for shape in step.shapes}
    example, masked = example_of(by_name["new_relic_license_key"])
    line = "2024-05-01T12:00:00Z worker[42] build step compiled module ok\n"
    log = line * (64 * gate.CHUNK_CHARS // len(line))
    text = log[: len(log) // 2] + example + "\n" + log[len(log) // 2 :]
    sizes = _given_chars(monkeypatch, "new_relic_license_key")
    _with_engine("hyperscan")
    try:
        assert redact(text) == log[: len(log) // 2] + masked + "\n" + log[len(log) // 2 :]
    finally:
        _with_engine(None)
    assert sizes and sum(sizes) <= 2 * gate.CHUNK_CHARS + 2 * len(line), sizes


def test_no_anchor_holds_a_newline() -> None:
    # What makes a chunk's anchors the text's: each occurrence lies in one chunk.
    engine.EXTRA_PASSES  # noqa: B018 - the table's anchors are numbered once loaded
    assert gate.ANCHORS
    assert not any("\n" in literal for literal, _ in gate.ANCHORS)


def test_chunks_end_after_a_newline_and_cover_the_text() -> None:
    text = "a" * 10 + "\n" + "b" * 3 + "\n\n" + "c" * 20
    chunks = gate.line_chunks(text, 4)
    assert chunks == [(0, 11), (11, 15), (15, 36)]
    assert gate.line_chunks(text, 1) == [(0, 11), (11, 15), (15, 16), (16, 36)]
    assert gate.line_chunks("", 4) == []


@pytest.mark.parametrize(
    ("source", "reach"),
    [
        ("abc", (1, 1)),
        (r"(?<![A-Za-z0-9])abc(?![A-Za-z0-9]{3})", (2, 4)),
        (r"\babc(?:(?<=\\[nrt]abc)|x)", (6, 1)),
        (r"x(?=(?<=ab)c)", (3, 2)),
        ("^abc", None),
        ("abc$", None),
        (r"abc\Z", None),
        ("abc(?=a*)", None),
    ],
)
def test_the_reach_of_a_pattern_is_read_by_its_parser(
    source: str, reach: tuple[int, int] | None
) -> None:
    assert engine.line_reach(source) == reach


def test_every_line_bound_rule_has_a_reach() -> None:
    # Each pass that matches within a line and reads a bounded way around it can be
    # searched in chunks; the two that assert a line's start cannot (and scan whole).
    unbounded = sorted(
        step.name
        for step in engine.EXTRA_PASSES
        if not step.shapes[0].crosses_lines and engine.line_reach(step.source) is None
    )
    assert unbounded == ["netrc_password_line", "pgpass_line"]


def test_a_long_text_is_never_encoded_whole_to_find_its_anchors() -> None:
    # An agent's end is masked while other agents' are (a thread each): a whole copy of a
    # 4 MiB tail held while its anchors are found measured 2.6 MiB more an agent at the
    # peak of 64 agents. Finding them reads the text a chunk at a time: the largest block
    # allocated meanwhile is about a chunk's encoding, whatever the text's length. (Text
    # outside ASCII is folded whole for its passes anyway, a copy twice its size while
    # the fold is made, so only ASCII text, an agent's usual log, can show it here.)
    line = "2024-05-01T12:00:00Z worker[42] compiled module ok, token count 5\n"
    text = line * (64 * gate.CHUNK_CHARS // len(line))
    assert gate.Gate(text[:100]) is not None  # the scanners built, outside the measurement
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        found = gate.Gate(text)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert found._chunks, "the text was scanned in chunks"
    # A chunk, its encoding and the chunks' list, with room to spare; the whole text's
    # encoding is 64 chunks.
    assert peak < 8 * gate.CHUNK_CHARS, (peak, len(text))
