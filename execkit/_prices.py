"""The price table: USD per million tokens by model, as data, and `price`, which fills a
tokens-only `Usage` from it.

codex and gemini report tokens only; claude reports its own USD. execkit prices what was
reported as tokens from a table shipped as data (`execkit/prices.json`: per model, USD per
million input, output, cache-read and cache-write tokens, with the table's `source` and
`as_of` date), which an operator overrides or extends from a file (`EXECKIT_PRICES=FILE`,
same shape, merged over the built-in table model by model).

Pricing is conservative by construction:

- a USD the vendor reported is kept (`reported` beats `priced`);
- a model the table does not name, a usage with no model, or a token kind the model has
  no price for while the usage has tokens of it, stays `unknown` (never zero);
- every price is > 0, so a priced usage with any token costs more than nothing, and
  pricing is monotone in every token count.

A model name is matched exactly, after dropping a provider prefix (`openai/gpt-5` is
`gpt-5`), or as a table name followed by a date or `-latest` (`claude-sonnet-4-5-20250929`
is `claude-sonnet-4-5`); never by a looser prefix, which would price a newer model at an
older one's rate.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from importlib import resources

import attrs

from execkit._errors import InvalidInput
from execkit._usage import Usage, UsdSource, checked_usage

__all__ = [
    "PRICES_ENV",
    "ModelPrice",
    "PriceTable",
    "builtin_prices",
    "load_prices",
    "operator_prices",
    "price",
]

PRICES_ENV = "EXECKIT_PRICES"
"""The environment variable naming the operator's price file (merged over the built-in)."""

_KINDS = ("input", "output", "cache_read", "cache_write")
_REQUIRED = ("input", "output")
_DATED = re.compile(r"^(?P<name>.+?)(?:-\d{8}|@\d{8}|-latest)$")


@attrs.frozen
class ModelPrice:
    """USD per million tokens of each kind for one model; None: no price for that kind
    (a usage with tokens of it stays unknown)."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@attrs.frozen
class PriceTable:
    """Model name -> `ModelPrice`, and where the figures came from."""

    models: Mapping[str, ModelPrice] = attrs.field(factory=dict)
    source: str = ""
    as_of: str = ""

    def of(self, model: str | None) -> ModelPrice | None:
        """The price of `model` (see the module docstring for how names match), or None."""
        if not model:
            return None
        name = model.rsplit("/", 1)[-1].strip()
        found = self.models.get(name)
        if found is not None:
            return found
        dated = _DATED.match(name)
        return None if dated is None else self.models.get(dated.group("name"))

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with `other`'s models over it (model by model)."""
        return PriceTable(
            {**self.models, **other.models},
            source="; ".join(part for part in (self.source, other.source) if part),
            as_of=other.as_of or self.as_of,
        )


def price(usage: Usage, table: PriceTable) -> Usage:
    """`usage` with its USD filled from `table` when the vendor reported tokens only.

    Returns `usage` unchanged when it already has a USD (reported, priced, or the known
    part of an incomplete sum), names no model the table knows, reported no tokens, or has
    tokens of a kind the model has no price for: unknown stays unknown, never zero.
    Otherwise the same usage with `usd` = the sum of each kind's tokens times its price per
    million, source `priced`. Pure.
    """
    if usage.usd is not None or usage.tokens == 0:
        return usage
    rates = table.of(usage.model)
    if rates is None:
        return usage
    total = 0.0
    for tokens, rate in (
        (usage.input_tokens, rates.input),
        (usage.output_tokens, rates.output),
        (usage.cache_read_tokens, rates.cache_read),
        (usage.cache_write_tokens, rates.cache_write),
    ):
        if tokens == 0:
            continue
        if rate is None:
            return usage
        try:
            total += tokens * rate
        except OverflowError:  # a count no float holds: no figure to give
            return usage
    if not math.isfinite(total):
        return usage
    # Every field is the checked usage's own but the USD, a finite sum of counts times
    # prices > 0: built without the validators (a metered run prices each usage event).
    return checked_usage(
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        total / 1_000_000,
        UsdSource.PRICED,
        usage.model,
        usage.premium_requests,
    )


def _table(data: object, origin: str) -> PriceTable:
    """A `PriceTable` from the file shape; InvalidInput naming the key on a bad value."""
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{origin}: must be a JSON object with 'models'", field="models")
    models = data.get("models")
    if not isinstance(models, Mapping):
        raise InvalidInput(
            f"{origin}: 'models' must be an object of model name -> prices", field="models"
        )
    table: dict[str, ModelPrice] = {}
    for name, entry in models.items():
        where = f"models.{name}"
        if not isinstance(entry, Mapping):
            raise InvalidInput(
                f"{origin}: {where} must be an object with {', '.join(_KINDS)}", field=where
            )
        unknown = sorted(set(entry) - set(_KINDS))
        if unknown:
            raise InvalidInput(
                f"{origin}: {where}.{unknown[0]} is not a price; the kinds are "
                f"{', '.join(_KINDS)} (USD per million tokens)",
                field=f"{where}.{unknown[0]}",
            )
        rates: dict[str, float | None] = {}
        for kind in _KINDS:
            value = entry.get(kind)
            if value is None and kind not in _REQUIRED:
                rates[kind] = None
                continue
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise InvalidInput(
                    f"{origin}: {where}.{kind} must be a number > 0 (USD per million "
                    f"tokens), got {value!r}",
                    field=f"{where}.{kind}",
                )
            rates[kind] = float(value)
        table[str(name)] = ModelPrice(
            input=rates["input"] or 0.0,
            output=rates["output"] or 0.0,
            cache_read=rates["cache_read"],
            cache_write=rates["cache_write"],
        )
    source = data.get("source", "")
    as_of = data.get("as_of", "")
    return PriceTable(
        table,
        source=source if isinstance(source, str) else "",
        as_of=as_of if isinstance(as_of, str) else "",
    )


_BUILTIN: PriceTable | None = None


def builtin_prices() -> PriceTable:
    """The table shipped with execkit (`execkit/prices.json`), read once."""
    global _BUILTIN
    if _BUILTIN is None:
        text = resources.files("execkit").joinpath("prices.json").read_text(encoding="utf-8")
        _BUILTIN = _table(json.loads(text), "execkit/prices.json")
    return _BUILTIN


def operator_prices(path: str) -> PriceTable:
    """The operator's price file at `path`. Raises InvalidInput naming `EXECKIT_PRICES`
    for a file that cannot be read or is not JSON, and naming the key (`models.NAME.KIND`)
    for a value out of range; the built-in table is never changed by a bad file."""
    origin = f"{PRICES_ENV}={path}"
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise InvalidInput(
            f"{origin}: cannot read the price file ({exc.strerror or exc})", field=PRICES_ENV
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{origin}: not JSON ({exc})", field=PRICES_ENV) from None
    return _table(data, origin)


_CACHE: dict[tuple[str, int, int], PriceTable] = {}


def load_prices(environ: Mapping[str, str] | None = None) -> PriceTable:
    """The table in force: the built-in one, with the file `EXECKIT_PRICES` names (in
    `environ`, default `os.environ`) merged over it. A file is read again only when its
    size or modification time changed. Raises InvalidInput as `operator_prices` does."""
    env = os.environ if environ is None else environ
    path = env.get(PRICES_ENV, "").strip()
    if not path:
        return builtin_prices()
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise InvalidInput(
            f"{PRICES_ENV}={path}: cannot read the price file ({exc.strerror or exc})",
            field=PRICES_ENV,
        ) from None
    key = (path, stat.st_mtime_ns, stat.st_size)
    table = _CACHE.get(key)
    if table is None:
        table = builtin_prices().merged(operator_prices(path))
        _CACHE.clear()
        _CACHE[key] = table
    return table
