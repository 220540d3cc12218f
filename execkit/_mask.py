"""The one place every sink masks through: text, names and keys, JSON documents.

execkit promises that no credential reaches an output or a stored byte. The redactor
(`execkit._redact.redact`) decides what a credential is; this module is how the rest of
the package applies it, at three layers (docs/architecture.md, "Where secrets are masked"):
a value entering a ledger operation (`ledger/_core/inputs.py`), an error message when the
error is built (`_errors.ExecKitError`), and the one writer of each surface (the CLI's
`cli/_output.py`, the server's `_app._dumps`). tests/test_sink_layer.py checks that no
other path reaches a terminal, an answer or a stored row.

- `mask_text(text)`: free text (a title, a reason, a message) with every credential masked.
- `mask_name(name)`: an identity or a key (an actor, a principal, an idempotency or request
  key). Masked like text, and when anything was masked, tagged with the first 16 hex digits
  of the SHA-256 of the whole value, so two different names never become the same stored
  name (a grant to one would be a grant to the other; one key's answer would replay for
  another) and one name is masked the same way wherever it is given. A hash of a
  credential is not the credential (tokens are stored the same way).
- `mask_json(value)`: a JSON value with every string in it masked as text, keys included.
  Masking the strings before they are serialized, never the serialized text, keeps the
  document valid JSON with the same structure whatever the redactor masks.

The redactor is imported on first use, not with this module (start-up time matters).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["PLAIN_TEXTS", "json_masker", "mask_json", "mask_name", "mask_text"]

_TAG_HEX = 16


# Texts of execkit's own that reach `mask_text` as any text does, and that the redactor
# leaves as they are: returned as they are without loading it (its rule table costs a
# process some 60 ms, all of what a dashboard masks). The dispatcher's task title prefix
# (`dispatch._board.TASK_TITLE_PREFIX`), masked by the ledger as every title prefix it is
# given is. Constants only: tests/test_redact.py checks that each is its own redaction
# under every engine, and tests/test_cli_startup.py that `status` loads no redactor.
PLAIN_TEXTS = frozenset({"board:"})


def mask_text(text: str) -> str:
    """`text` with every credential the redactor knows masked."""
    if text in PLAIN_TEXTS and type(text) is str:  # not a str subclass with its own `==`
        return text
    from execkit._redact import redact

    return redact(text)


def mask_name(name: str) -> str:
    """`name` as it is when nothing in it is a credential; else masked and tagged with a
    short hash of the whole value (`[REDACTED]~0123456789abcdef`), unique and stable."""
    masked = mask_text(name)
    if masked == name:
        return name
    import hashlib  # only a masked name needs it: OpenSSL's loading is no CLI start's cost

    tag = hashlib.sha256(name.encode("utf-8", errors="surrogatepass")).hexdigest()[:_TAG_HEX]
    return f"{masked}~{tag}"


def mask_json(value: Any) -> Any:
    """`value` (dicts, lists, tuples, strings, numbers, booleans, None) with every string in
    it masked, keys included; anything else is returned as it is.

    Each distinct string is masked once per call: a document of many rows repeats its keys
    and most of its values (a 200,000-row `status --json` holds 3.8 million strings, a
    tenth of them distinct), and the redactor's cost is per call."""
    return json_masker()(value)


# A streamed document's masker forgets what it masked after this many distinct strings, so
# its memory stays bounded however long the stream is (it only masks some strings twice).
_MASKED_CACHE = 65_536


def json_masker() -> Callable[[Any], Any]:
    """`mask_json` for the items of one streamed document (a listing written item by
    item): each distinct string masked once across the items, up to `_MASKED_CACHE`
    distinct strings held at a time."""
    from execkit._redact import redact

    masked: dict[str, str] = {}

    def text(item: str) -> str:
        found = masked.get(item)
        if found is None:
            if len(masked) >= _MASKED_CACHE:
                masked.clear()
            found = masked[item] = redact(item)
        return found

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return text(item)
        if isinstance(item, dict):
            return {
                text(key) if isinstance(key, str) else key: walk(part) for key, part in item.items()
            }
        if isinstance(item, list | tuple):
            return [walk(part) for part in item]
        return item

    return walk
