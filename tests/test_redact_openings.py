"""Phase 3 rules that open with a literal, tried only where it occurs (engine.py, scan.py's
`Openings`): on a credential-dense text under the compiled engine no such rule scans the
whole text (ASCII or not), and the output is the pure-Python engine's, byte for byte.
Work is counted (passes that scan the text), never timed; the speed is in
benchmarks/bench_redact.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from secrets_corpus import SAMPLES

import execkit._redact as _redact_package
from execkit._redact import engine, redact, scan
from execkit._redact.gate import EAGER_CHARS
from execkit._redact.record import example_of

# What may sit before a credential in a tool's output: JSON's escaped newline, URL
# encoding, quotes, a letter (which must keep a prefix from counting as a key's start).
_JOINS = ("\n", "\\n", "%3D", '"', " ", "x", "\\u0041", "=", "sk", "sk-")


@pytest.fixture
def compiled() -> Iterator[None]:
    _redact_package.use_engine("hyperscan")
    try:
        yield
    finally:
        _redact_package.use_engine(None)


def _dense_text(samples: int) -> str:
    """Corpus credentials and every phase 3 rule's own example, one after another with
    the joins above between them and log words every so often: ASCII, longer than the
    gate's eager size."""
    examples = [example_of(shape)[0] for step in engine.EXTRA_PASSES for shape in step.shapes]
    texts = [sample.text for sample in SAMPLES if sample.text.isascii()] + examples
    parts: list[str] = []
    for index, (text, join) in enumerate(zip(itertools.cycle(texts), itertools.cycle(_JOINS))):
        if index >= samples:
            break
        parts.append(text)
        parts.append(join if index % 7 else " the build step compiled module warning\n")
    return "".join(parts)


def _scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the passes that run `_find_spans` (a scan of the text or its fold)."""
    names: list[str] = []
    original = engine._find_spans

    def counted(step: engine.Pass, *args: Any) -> engine.SpanList:
        names.append(step.name)
        return original(step, *args)

    monkeypatch.setattr(engine, "_find_spans", counted)
    return names


def test_a_dense_text_tries_a_literal_rule_only_where_its_literal_occurs(
    compiled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _dense_text(3000)
    assert text.isascii() and len(text) > EAGER_CHARS
    scans = _scans(monkeypatch)
    masked = redact(text)
    literals = set(engine._opening_literals())
    by_name = {step.name: step for step in engine.EXTRA_PASSES}
    assert scans, "the dense text runs some passes that scan"
    tried_at_openings = [
        name
        for name in scans
        if name in by_name
        and engine._opens_with_a_literal(by_name[name])
        and engine.opening(by_name[name].source) in literals
    ]
    assert tried_at_openings == []
    opened = [step for step in engine.EXTRA_PASSES if step.name not in scans]
    assert sum(map(engine._opens_with_a_literal, opened)) >= 100  # the many provider rules
    _redact_package.use_engine("python")
    assert redact(text) == masked


def test_past_the_budget_the_rules_scan_as_before_with_the_same_output(
    compiled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A literal on every line passes the report budget: the openings scan gives up.
    secrets = "".join(sample.text + "\n" for sample in SAMPLES[:40] if sample.text.isascii())
    text = "sk_ " * 40_000 + secrets
    finder = scan.openings(engine._opening_literals())
    assert finder is not None and finder.starts(text) is None
    assert finder.starts(secrets * 4) is not None
    scans = _scans(monkeypatch)
    masked = redact(text)
    scanned = [step for step in engine.EXTRA_PASSES if step.name in scans]
    assert any(map(engine._opens_with_a_literal, scanned))
    _redact_package.use_engine("python")
    assert redact(text) == masked


def test_a_text_outside_ascii_is_scanned_as_utf32_aligned(compiled: None) -> None:
    finder = scan.openings(engine._opening_literals())
    assert finder is not None
    found = finder.starts("ab sk-proj-x sk-proj-")
    assert found is not None and found["sk-proj-"] == [3, 13]
    # U+7341 U+6B00 U+2D00 U+0100 hold the UTF-32 bytes of "sk-" one byte off: no
    # occurrence there.
    text = "\u7341\u6b00\u2d00\u0100 é sk-proj-\ud800 sk-"
    found = finder.starts(text)
    assert found is not None and found["sk-"] == [text.index("sk-"), len(text) - 3]
    assert found["sk-proj-"] == [text.index("sk-proj-")]
    dense = _dense_text(3000).replace("\n", "\n\u00e9\U0001f600 ")
    assert not dense.isascii()
    masked = redact(dense)
    _redact_package.use_engine("python")
    assert redact(dense) == masked


@pytest.mark.parametrize(
    ("source", "literal"),
    [
        (r"sk\-(?:(?<![A-Za-z0-9])|(?<=\\n))[A-Za-z0-9]{20,}", "sk-"),
        (r"gh[pousr]_[A-Za-z0-9]{36}", "gh"),
        (r"sk?-[a-z]+", "s"),  # the k is optional: not part of every match
        (r"ab{2}c", "a"),
        (r"(?i)abc", ""),
        (r"ab|cd", ""),
        (r"(ab)c", ""),
        (r"[a]bc", "abc"),  # a one-character class is that character
        (r"[ab]c", ""),
    ],
)
def test_the_opening_literal_is_what_every_match_opens_with(source: str, literal: str) -> None:
    assert engine.opening(source) == literal


def test_every_rule_example_opens_with_its_rule_literal() -> None:
    for step in engine.EXTRA_PASSES:
        if not engine._opens_with_a_literal(step):
            continue
        literal = engine.opening(step.source)
        for shape in step.shapes:
            example, _ = example_of(shape)
            matches = list(step.pattern.finditer(example))
            assert all(m.group().startswith(literal) for m in matches), step.name


@pytest.mark.parametrize(
    ("source", "literals"),
    [
        (
            r"((?:accountkey(?<!\waccountkey)|sharedaccesskey)[ \t]{0,8}=)[^\s;]+",
            ("accountkey", "sharedaccesskey"),
        ),
        (r"(authorization(?<!\wauthorization)[ \t]*:)", ()),  # `re` finds one itself
        (r"(?:abcd|ef)x", ()),  # a word too short to gain
        (r"(?i:abcd|efgh)x", ()),
        (r"(?:abcd|[ef]ghi)x", ()),
        (r"(?:abcd)?efgh", ()),
    ],
)
def test_the_words_a_pattern_opens_with_are_read_by_its_parser(
    source: str, literals: tuple[str, ...]
) -> None:
    assert engine.branch_openings(source) == literals


def test_a_pass_that_opens_with_words_finds_what_its_scan_finds() -> None:
    text = _dense_text(3000) + "".join(
        f" {word}={word}AccountKey=abc SharedAccessKey=q{index} cookie: a=b"
        for index, word in enumerate(("accountkey", "set-cookie", "https://x", "discord"))
    )
    low = text.lower()
    checked = 0
    for step in engine.REFERENCE_PASSES + engine.EXTRA_PASSES:
        if step.lead or step.named or step.nearby is not None or step.alternative_sources:
            continue
        literals = engine.branch_openings(step.source)
        if not literals:
            continue
        subject = low if step.folded else text
        tried = engine.matches_from(step.pattern, subject, engine._places(subject, literals))
        assert [m.span() for m in tried] == [m.span() for m in step.pattern.finditer(subject)]
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("engine_name", scan.available_engines())
def test_texts_holding_the_same_anchors_ask_each_pass_whether_it_opens_once(
    engine_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request keys, ids and messages of one kind hold the same anchors: which passes
    open is remembered for them, not asked of every pass again for each text (it cost
    ~65 us a key, more than the rest of masking one). The output is the same."""
    from execkit._redact import gate

    _redact_package.use_engine(engine_name)
    monkeypatch.setattr(gate, "_OPEN_BY_ANCHORS", {})
    asked: list[object] = []
    original = gate.Gate.opens

    def counted(self: gate.Gate, step: gate.Opening) -> bool:
        asked.append(step)
        return original(self, step)

    monkeypatch.setattr(gate.Gate, "opens", counted)
    passes = len(engine.EXTRA_PASSES) + len(engine.REFERENCE_PASSES)
    secret = example_of(engine.EXTRA_PASSES[0].shapes[0])[0]
    try:
        for n in range(50):
            assert redact(f"admission-{n:04}-of-task-t-{n}") == f"admission-{n:04}-of-task-t-{n}"
            assert "[REDACTED" in redact(f"key {n}: {secret}")
    finally:
        _redact_package.use_engine(None)
    # Each kind's first text asks every pass once (phase 2 and phase 3); the rest ask none.
    assert len(asked) <= 2 * passes


def test_the_memory_of_open_passes_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from execkit._redact import gate

    monkeypatch.setattr(gate, "_OPEN_BY_ANCHORS", {})
    monkeypatch.setattr(gate, "_OPEN_BY_ANCHORS_MAX", 3)
    words = ["token", "secret", "password", "bearer", "apikey", "cookie", "sk-"]
    for count in range(1, len(words) + 1):
        redact(" ".join(words[:count]) + " = x")
        assert len(gate._OPEN_BY_ANCHORS) <= 3
