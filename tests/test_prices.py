"""Issue #45 part A.3: the price table as data, `price`, and the operator's override file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execkit import AgentRequest, get_adapter, run_agent
from execkit._errors import InvalidInput
from execkit._prices import (
    PRICES_ENV,
    ModelPrice,
    PriceTable,
    builtin_prices,
    load_prices,
    operator_prices,
    price,
)
from execkit._usage import Usage, UsdSource
from execkit.testing import FakeVendor

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded"
TABLE = PriceTable(
    {
        "m": ModelPrice(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75),
        "reads-only": ModelPrice(input=1.0, output=2.0, cache_read=0.1),
    }
)


def test_the_builtin_table_loads_with_its_source_and_every_price_above_zero() -> None:
    table = builtin_prices()
    assert table.source and table.as_of
    assert "claude-sonnet-4-5" in table.models and "gpt-5" in table.models
    for rates in table.models.values():
        assert rates.input > 0 and rates.output > 0


def test_tokens_only_are_priced_per_million_of_each_kind() -> None:
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=2_000_000,
        cache_read_tokens=1_000_000,
        cache_write_tokens=1_000_000,
        model="m",
    )
    priced = price(usage, TABLE)
    assert priced.usd_source is UsdSource.PRICED
    assert priced.usd == pytest.approx(3.0 + 30.0 + 0.3 + 3.75)
    assert attrs_equal_but_money(priced, usage)


def attrs_equal_but_money(a: Usage, b: Usage) -> bool:
    return (a.input_tokens, a.output_tokens, a.cache_read_tokens, a.cache_write_tokens) == (
        b.input_tokens,
        b.output_tokens,
        b.cache_read_tokens,
        b.cache_write_tokens,
    ) and a.model == b.model


@pytest.mark.parametrize(
    "usage",
    [
        Usage(input_tokens=10, model="not-in-the-table"),
        Usage(input_tokens=10),  # no model named
        Usage(model="m"),  # no tokens: nothing to price (unknown, not 0)
        Usage(cache_write_tokens=10, model="reads-only"),  # a kind with no price
        Usage(input_tokens=10, usd=0.5, usd_source="reported", model="m"),  # reported wins
        Usage(input_tokens=10, usd=0.5, usd_source="unknown", model="m"),  # partial sum
    ],
)
def test_what_the_table_cannot_price_is_left_as_it_is(usage: Usage) -> None:
    assert price(usage, TABLE) == usage


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("openai/gpt-5-mini", "gpt-5-mini"),
        ("gpt-5@20250807", "gpt-5"),
        ("claude-sonnet-4-6", None),  # a newer model is never priced at an older rate
        ("gpt-5.1", None),
        ("gpt-5-ultra", None),
    ],
)
def test_model_names_match_exactly_or_with_a_date(name: str, found: str | None) -> None:
    table = builtin_prices()
    expected = None if found is None else table.models[found]
    assert table.of(name) == expected


# --- the operator's file ---------------------------------------------------------------------


def write(tmp_path: Path, data: object) -> str:
    path = tmp_path / "prices.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_the_operators_file_merges_over_the_builtin_table(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "source": "our contract, 2026-12",
            "models": {"gpt-5": {"input": 1.0, "output": 8.0}, "ours": {"input": 2, "output": 4}},
        },
    )
    table = load_prices({PRICES_ENV: path})
    assert table.models["gpt-5"] == ModelPrice(input=1.0, output=8.0)
    assert table.models["ours"] == ModelPrice(input=2.0, output=4.0)
    assert table.models["claude-sonnet-4-5"] == builtin_prices().models["claude-sonnet-4-5"]
    assert "our contract" in table.source
    assert load_prices({}) == builtin_prices()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ("{not json", PRICES_ENV),
        ([], "models"),
        ({"models": []}, "models"),
        ({"models": {"x": 3}}, "models.x"),
        ({"models": {"x": {"input": 1}}}, "models.x.output"),
        ({"models": {"x": {"input": -1, "output": 1}}}, "models.x.input"),
        ({"models": {"x": {"input": 0, "output": 1}}}, "models.x.input"),
        ({"models": {"x": {"input": "3", "output": 1}}}, "models.x.input"),
        ({"models": {"x": {"input": 1, "output": 1, "cache_read": True}}}, "models.x.cache_read"),
        ({"models": {"x": {"input": 1, "output": 1, "cached": 1}}}, "models.x.cached"),
    ],
)
def test_a_bad_price_file_is_one_error_naming_the_key(
    tmp_path: Path, data: object, field: str
) -> None:
    path = write(tmp_path, data)
    with pytest.raises(InvalidInput) as caught:
        load_prices({PRICES_ENV: path})
    assert caught.value.field == field
    assert path in str(caught.value)
    assert load_prices({}) == builtin_prices()  # the built-in table is untouched


def test_a_missing_price_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as caught:
        operator_prices(str(tmp_path / "absent.json"))
    assert caught.value.field == PRICES_ENV
    with pytest.raises(InvalidInput):
        load_prices({PRICES_ENV: str(tmp_path / "absent.json")})


def test_run_agent_refuses_a_bad_price_file_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vendor: FakeVendor
) -> None:
    monkeypatch.setenv(PRICES_ENV, write(tmp_path, {"models": {"x": {"input": 1}}}))
    fake_vendor.register("codex", stdout="")
    with pytest.raises(InvalidInput, match=r"models\.x\.output"):
        run_agent(get_adapter("codex"), AgentRequest(prompt="hi"), start=fake_vendor.start)
    assert fake_vendor.call_count("codex") == 0


def test_the_agent_prices_codex_tokens_by_the_requests_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vendor: FakeVendor
) -> None:
    # codex's events name no model: the request's model prices them.
    monkeypatch.setenv(
        PRICES_ENV, write(tmp_path, {"models": {"gpt-fake": {"input": 2, "output": 10}}})
    )
    fake_vendor.register("codex", stdout=(RECORDED / "codex" / "success" / "stdout").read_text())
    proof = run_agent(
        get_adapter("codex"), AgentRequest(prompt="hi", model="gpt-fake"), start=fake_vendor.start
    )
    assert proof.usage is not None
    assert proof.usage.usd_source is UsdSource.PRICED
    assert proof.usage.model == "gpt-fake"
    assert proof.usage.usd == pytest.approx((12 * 2 + 7 * 10) / 1e6)
    assert proof.cost_usd == pytest.approx(proof.usage.usd)


# --- properties --------------------------------------------------------------------------------

counts = st.integers(0, 10**10)
rates = st.floats(1e-6, 1000, allow_nan=False, allow_infinity=False)
optional_rates = st.none() | rates


@st.composite
def tables(draw: st.DrawFn) -> PriceTable:
    return PriceTable(
        {
            "m": ModelPrice(
                input=draw(rates),
                output=draw(rates),
                cache_read=draw(optional_rates),
                cache_write=draw(optional_rates),
            )
        }
    )


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    return Usage(
        input_tokens=draw(counts),
        output_tokens=draw(counts),
        cache_read_tokens=draw(counts),
        cache_write_tokens=draw(counts),
        model=draw(st.sampled_from(["m", "other", None])),
    )


KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


@settings(max_examples=300, deadline=None)
@given(tables(), usages(), st.sampled_from(KINDS), st.integers(1, 10**9))
def test_prop_pricing_is_monotone_in_every_token_count(
    table: PriceTable, usage: Usage, kind: str, more: int
) -> None:
    import attrs

    bigger = attrs.evolve(usage, **{kind: getattr(usage, kind) + more})
    low, high = price(usage, table), price(bigger, table)
    if low.usd is not None and high.usd is not None:
        assert high.usd >= low.usd
    if low.usd_source is UsdSource.PRICED and high.usd_source is not UsdSource.PRICED:
        # More tokens of a kind the model has no price for: unknown, never cheaper.
        assert high.usd is None


@settings(max_examples=300, deadline=None)
@given(tables(), usages())
def test_prop_pricing_never_turns_unknown_into_zero(table: PriceTable, usage: Usage) -> None:
    priced = price(usage, table)
    if priced.usd_source is UsdSource.PRICED:
        assert priced.usd is not None and priced.usd > 0
        assert usage.tokens > 0
    else:
        assert priced == usage
        assert priced.usd is None


def test_the_example_in_docs_formats_loads_and_merges(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "formats.md").read_text()
    section = text.split("## The price table", 1)[1]
    example = section.split("```json", 1)[1].split("```", 1)[0]
    path = write(tmp_path, example)
    table = load_prices({PRICES_ENV: path})
    assert table.models["gpt-5"] == ModelPrice(input=1.0, output=8.0, cache_read=0.1)
    assert table.of("our-gateway-model") == ModelPrice(input=2.5, output=10.0)
