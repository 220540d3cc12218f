"""The labelled corpus (fixtures/failures): precision 1.0 and recall >= 0.95 for upstream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from execkit._classify import FailureClass, classify_text

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "failures"
VENDORS = ("codex", "claude", "gemini", "opencode")


def _cases() -> list[dict[str, Any]]:
    manifest = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    cases: list[dict[str, Any]] = manifest["cases"]
    return cases


CASES = _cases()


def _text(case: dict[str, Any]) -> str:
    name: str = case["file"]
    return (CORPUS / name).read_text(encoding="utf-8")


def test_manifest_and_files_agree() -> None:
    listed = [case["file"] for case in CASES]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(p.name for p in CORPUS.glob("*.txt"))
    for case in CASES:
        assert case["class"] in {c.value for c in FailureClass} - {"environment"}
        assert case["reason"] and case["note"]


def test_corpus_size_and_coverage() -> None:
    negatives = [c for c in CASES if c["class"] == "work"]
    assert len(CASES) >= 40
    assert len(negatives) >= 20
    # Each vendor's rate limit, overload, 5xx and circuit wording is represented.
    for vendor in VENDORS:
        reasons = {
            c["reason"]
            for c in CASES
            if c["class"] == "upstream" and c["file"].startswith(vendor + "-")
        }
        assert reasons & {"http 429", "rate limited"}, vendor
        assert reasons & {"http 529", "http 503", "overloaded", "service unavailable"}, vendor
        assert any(r.startswith("http 5") for r in reasons), vendor
        assert "circuit open" in reasons, vendor


def test_upstream_precision_and_recall() -> None:
    true_pos = false_pos = false_neg = 0
    for case in CASES:
        predicted = classify_text(_text(case)).failure_class is FailureClass.UPSTREAM
        expected = case["class"] == "upstream"
        true_pos += predicted and expected
        false_pos += predicted and not expected
        false_neg += expected and not predicted
    precision = true_pos / (true_pos + false_pos)
    recall = true_pos / (true_pos + false_neg)
    assert precision == 1.0
    assert recall >= 0.95


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_each_case_has_its_class_and_reason(case: dict[str, Any]) -> None:
    verdict = classify_text(_text(case))
    assert (verdict.failure_class.value, verdict.reason) == (case["class"], case["reason"])
    if verdict.reason != "default":
        assert verdict.evidence


def test_banners_come_first_and_the_reason_last() -> None:
    # The deciding line ends in the second half of every case that has a reason.
    for case in CASES:
        text = _text(case)
        verdict = classify_text(text)
        if verdict.evidence is None:
            continue
        position = text.rfind(verdict.evidence)
        assert position >= 0
        assert position + len(verdict.evidence) >= len(text.rstrip()) * 0.5, case["file"]
