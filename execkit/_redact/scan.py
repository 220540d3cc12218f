"""The anchor scanner: which anchors of every pass a text holds, in one compiled pass.

With several hundred rules, looking for each anchor with its own substring search costs a
search per anchor (gate.py's pure-Python way). Hyperscan (the `fast` extra) compiles every
anchor into one database and finds them all in one scan of the text; the gate then knows
each anchor's presence exactly, and the passes run as before. The output is the same
either way, byte for byte: the scanner only answers, for each anchor, what `literal in
text` (or `literal in fold(text)`) answers, and the gate only decides which passes run at
all (tests/test_redact.py runs every check under both engines).

Exactness. An exact anchor is ASCII, and an ASCII literal occurs in a text exactly when its
bytes occur in the text's UTF-8 (lone surrogates encoded as `surrogatepass` does, which
makes no ASCII byte). A folded anchor is looked for caseless; on an ASCII text that is
exactly `literal in text.lower()`; a text outside ASCII is scanned twice, as it is for its
exact anchors and as its fold for its folded ones (the fold maps a few non-ASCII letters to
ASCII, which a caseless byte scan would not see).

Which engine: `use_engine` chooses ("hyperscan", "python", or None for the best one that
loads, the default). The database is built on the first text a rule could match (about a
tenth of a second for the table), never at import, and again when the anchors change. A
scratch space is kept per thread (Hyperscan's scratch is not shared between threads).
Importing this file loads neither Hyperscan nor the table: the package imports it for
`use_engine`.

Openings. On a text full of credentials, many provider rules' anchors occur, and each such
rule scanned the whole text with `re` for the few places its literal opens a match
(a scan each, some 1 ms per MiB). `Openings` reports where each rule's opening literal
occurs, every occurrence, in one more scan; each rule then tries its pattern only there
(engine.py). An ASCII text is scanned as its bytes, any other as its UTF-32 (offsets then
divide by four); up to a budget of reports (a literal every few characters stops the scan:
the rules then scan as before).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from execkit._redact.record import Anchor

__all__ = [
    "ENGINES",
    "Openings",
    "Scanner",
    "ascii_bytes",
    "available_engines",
    "engine_in_use",
    "openings",
    "scanner",
    "use_engine",
]

ENGINES = ("hyperscan", "python")
_T = TypeVar("_T")

_chosen: str | None = None  # None: the best engine that loads
_loaded: dict[str, bool] = {}
# What `_built_once` built, by kind: (the key it was built for, the thing).
_built: dict[str, tuple[object, Any]] = {}


def _loads(name: str) -> bool:
    if name not in _loaded:
        if name == "python":
            _loaded[name] = True
        else:
            try:
                import hyperscan  # noqa: F401  (the optional `fast` extra)
            except ImportError:
                _loaded[name] = False
            else:
                _loaded[name] = True
    return _loaded[name]


def available_engines() -> tuple[str, ...]:
    """The engines that load here, the faster first."""
    return tuple(name for name in ENGINES if _loads(name))


def use_engine(name: str | None) -> None:
    """Redact with `name` from now on (None: the best that loads). ValueError for an
    unknown engine or one that does not load here."""
    global _chosen
    if name is not None and name not in ENGINES:
        raise ValueError(f"unknown redaction engine {name!r}; known: {', '.join(ENGINES)}")
    if name is not None and not _loads(name):
        raise ValueError(f"redaction engine {name!r} does not load here (install the fast extra)")
    _chosen = name


def engine_in_use() -> str:
    """The engine `redact` uses now."""
    return _chosen if _chosen is not None else available_engines()[0]


class Scanner:
    """Every anchor compiled into one Hyperscan database (block mode, one report per
    anchor and scan); bit i of what it finds is anchor i."""

    def __init__(self, anchors: Sequence[Anchor]) -> None:
        import hyperscan

        self.count = len(anchors)
        self._hyperscan: Any = hyperscan
        for literal, _ in anchors:
            if not literal.isascii():
                raise ValueError(f"anchor {literal!r} is not ASCII")
        single = hyperscan.HS_FLAG_SINGLEMATCH
        caseless = hyperscan.HS_FLAG_CASELESS
        self._database: Any = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._database.compile(
            expressions=[literal.encode("ascii") for literal, _ in anchors],
            ids=list(range(self.count)),
            elements=self.count,
            flags=[single | (caseless if folded else 0) for _, folded in anchors],
            literal=True,
        )
        self._folded = sum(1 << index for index, (_, f) in enumerate(anchors) if f)
        self._local = threading.local()

    def _scratch(self) -> Any:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._hyperscan.Scratch(self._database)
        return scratch

    def _hits(self, data: bytes) -> int:
        found: list[int] = []
        on_match: Callable[..., None] = lambda index, *_: found.append(index)  # noqa: E731
        self._database.scan(data, match_event_handler=on_match, scratch=self._scratch())
        bits = 0
        for index in found:
            bits |= 1 << index
        return bits

    def chunk_bits(
        self, text: str, fold: Callable[[], str], chunks: Sequence[tuple[int, int]]
    ) -> list[int]:
        """`bits` of each chunk [start, end) of `text`, one scan each, each chunk encoded
        on its own (and, outside ASCII, its fold too, so that offsets count characters).
        Never the whole text at once: an agent's end is masked while many others' are
        (one thread each), and a whole encoding held through this loop measured 2.6 MiB
        more an agent at the peak of 64 agents' 4 MiB tails."""
        if text.isascii():
            return [self._hits(text[start:end].encode("ascii")) for start, end in chunks]
        low = fold()
        folded = self._folded
        exact = ~folded
        found: list[int] = []
        for start, end in chunks:
            bits = self._hits(text[start:end].encode("utf-8", "surrogatepass")) & exact
            found.append(
                bits | self._hits(low[start:end].encode("utf-8", "surrogatepass")) & folded
            )
        return found

    def bits(self, text: str, ascii_bytes: bytes | None, fold: Callable[[], str]) -> int:
        """Bit i set when anchor i occurs: an exact one in `text`, a folded one in
        `fold()` (called only for a text outside ASCII). `ascii_bytes` is `text` encoded,
        for an ASCII text (`ascii_bytes`), else None."""
        if ascii_bytes is not None:
            return self._hits(ascii_bytes)
        exact = self._hits(text.encode("utf-8", "surrogatepass")) & ~self._folded
        return exact | (self._hits(fold().encode("utf-8", "surrogatepass")) & self._folded)


def ascii_bytes(text: str) -> bytes | None:
    """`text` encoded as ASCII, or None when it is not ASCII: what the scanners read."""
    return text.encode("ascii") if text.isascii() else None


_lock = threading.Lock()


def _built_once(kind: str, key: object, build: Callable[[], _T]) -> _T:
    """The `kind` built for `key`: built once, by one thread, and again only when the key
    changes (double-checked under `_lock`, so a scan never waits on a lock once built)."""
    held = _built.get(kind)
    if held is None or held[0] != key:
        with _lock:
            held = _built.get(kind)
            if held is None or held[0] != key:
                held = _built[kind] = (key, build())
    built: _T = held[1]
    return built


def scanner(anchors: Sequence[Anchor]) -> Scanner | None:
    """The scanner for `anchors` under the engine in use (None: the pure-Python gate)."""
    if engine_in_use() != "hyperscan":
        return None
    return _built_once("scanner", len(anchors), lambda: Scanner(anchors))


# Anchors of this many characters or more say which chunks of a long text a rule can
# match in (gate.py): a shorter one (`-`, `=`, `sk`) is in nearly every chunk, and would
# rule out none.
CHUNK_ANCHOR_CHARS = 3


# Reports an `Openings` scan may make per text: this many, and one per this many characters.
# A report costs a Python call (well under a microsecond); each rule it spares a scan of
# the text saves about a millisecond per MiB, so the budget still pays when it is reached.
_OPENINGS_BASE = 1024
_OPENINGS_PER = 64


class Openings:
    """Literals compiled into Hyperscan databases that report every occurrence of each
    (block mode, case-sensitive, ASCII literals): one for an ASCII text's bytes, and one,
    built on the first text outside ASCII, for a text's UTF-32 (four bytes a character,
    so an occurrence at a byte offset that is a multiple of four is one at a quarter of
    it, and any other is none)."""

    def __init__(self, literals: Sequence[str]) -> None:
        import hyperscan

        self.literals = tuple(literals)
        self._hyperscan: Any = hyperscan
        for literal in self.literals:
            if not literal.isascii() or not literal:
                raise ValueError(f"opening {literal!r} is not a non-empty ASCII literal")
        self._lengths = tuple(map(len, self.literals))
        self._databases: dict[str, Any] = {}
        self._local = threading.local()

    def _database(self, encoding: str) -> Any:
        database = self._databases.get(encoding)
        if database is None:
            hyperscan = self._hyperscan
            database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            # Hyperscan's literal mode stops at a NUL byte, which UTF-32 is full of: each
            # byte is written as a `\xHH` escape of a pattern instead.
            database.compile(
                expressions=[
                    "".join(f"\\x{byte:02x}" for byte in literal.encode(encoding)).encode()
                    for literal in self.literals
                ],
                ids=list(range(len(self.literals))),
                elements=len(self.literals),
                flags=[0] * len(self.literals),
            )
            self._databases[encoding] = database
        return database

    def _scratch(self, encoding: str, database: Any) -> Any:
        scratches: dict[str, Any] | None = getattr(self._local, "scratches", None)
        if scratches is None:
            scratches = self._local.scratches = {}
        scratch = scratches.get(encoding)
        if scratch is None:
            scratch = scratches[encoding] = self._hyperscan.Scratch(database)
        return scratch

    def starts(self, text: str) -> dict[str, list[int]] | None:
        """Where each literal occurs in `text` (each start, ascending; a literal that does
        not occur is absent). None when the occurrences pass the budget (`_OPENINGS_BASE`
        + one per `_OPENINGS_PER` characters)."""
        if text.isascii():
            encoding, unit, data = "ascii", 1, text.encode("ascii")
        else:
            encoding, unit = "utf-32-le", 4
            data = text.encode(encoding, "surrogatepass")
        with _lock:
            database = self._database(encoding)
        found: list[tuple[int, int]] = []
        budget = _OPENINGS_BASE + len(text) // _OPENINGS_PER
        sizes = [length * unit for length in self._lengths]

        def on_match(index: int, _start: int, end: int, *_: object) -> bool:
            found.append((index, end - sizes[index]))
            return len(found) > budget  # True stops the scan

        try:
            database.scan(
                data, match_event_handler=on_match, scratch=self._scratch(encoding, database)
            )
        except self._hyperscan.ScanTerminated:
            return None
        starts: dict[str, list[int]] = {}
        for index, start in found:  # reported by end offset: each literal's in order
            if start % unit == 0:
                starts.setdefault(self.literals[index], []).append(start // unit)
        return starts


def openings(literals: Sequence[str]) -> Openings | None:
    """The `Openings` for `literals` under the engine in use (None: the pure-Python gate,
    whose rules scan as before)."""
    if engine_in_use() != "hyperscan":
        return None
    return _built_once("openings", tuple(literals), lambda: Openings(literals))
