"""Vendor lanes (issue #28): what an attempt shares with every other attempt on the same
vendor account, and the pure fold from a lane's events to its state. No I/O but reading a
credential file to fingerprint it (`credential_material`).

A lane is the (adapter, credential identity) an attempt uses, plus the host where the fact
is local to it (a missing binary): `claude/3f2a9c0d1e7b4a55`, `claude/default`,
`claude/3f2a9c0d1e7b4a55@build-7`. The credential identity is an HMAC-SHA256 of the
credential the adapter would use (its environment variables' values and its credential
files' bytes), keyed by the ledger's identity, so the same secret gives the same lane on
every host of one ledger, no lane name says anything about the secret, and two ledgers name
the same secret differently. With no credential at all it is `default`.

States (`LaneState`), stored as the fold of the lane's events (`fold`, `step`):

    open       admits every attempt
    parked     until a time the vendor stated in its structure (a usage limit's reset,
               Retry-After, `resetsAt`, `RetryInfo`), capped at `LaneConfig.max_park_s`
               (the cap is kept as `capped` and reported); or an operator's `park`
    cooling    until a time execkit chose: `breaker_k` upstream failures on the lane within
               `breaker_window_s` seconds, across tasks, trip the breaker; the wait doubles
               from `cool_base_s` to `cool_max_s` with each trip in a row
    half_open  the wait passed: one attempt (the probe) is admitted and the others wait
               for its result
    stopped    environment that belongs to the lane (credentials refused or missing,
               billing, the binary missing on that host), with the fix named; only an
               operator's `resume` opens it

What moves a lane (`LaneEventKind`): a success, or any result that is not upstream, opens
it for everyone; an upstream failure counts toward the breaker, or, from the probe, closes
the lane again with a longer wait (one more trip); a reset the vendor stated parks it (a
stated reset already past opens it); lane environment stops it; an abandoned probe frees
the probe slot; an operator parks or resumes it. A result that arrives from a run admitted
before the lane closed changes nothing but a success (the vendor answered, so the lane is
open). `view` projects a stored state onto a moment: a parked or cooling lane whose time
has passed is `half_open` and admits its probe. The fold reads no clock, so `db check` can
recompute every lane's state from its events and compare it with the stored one; it does
depend on `LaneConfig`, which lives in the ledger (`LaneConfigHistory`): every event is
folded, and rechecked, with the configuration in force for its number.

Nothing parks for ever (a stated reset is capped; an operator's park is refused past the
cap), and nothing retries without end (each failed probe lengthens the wait up to
`cool_max_s`, and every task keeps its own ceiling of consecutive upstream attempts).
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import attrs
from attrs.validators import ge, le, optional

from execkit._errors import InvalidInput, StorageError
from execkit._json import to_json
from execkit._validate import checked, finite, integer, opt_checked

__all__ = [
    "DEFAULT_CREDENTIAL",
    "DEFAULT_LANES",
    "LANE_WAIT",
    "LaneCause",
    "LaneConfig",
    "LaneConfigHistory",
    "LaneEvent",
    "LaneEventKind",
    "LaneGate",
    "LaneKey",
    "LaneState",
    "LaneSummary",
    "LaneView",
    "admission",
    "credential_fingerprint",
    "credential_material",
    "fold",
    "host_lane",
    "lane_for",
    "open_lane",
    "step",
    "view",
]

# How the reason of an open task held by a lane that does not admit begins (the dispatcher's
# `waiting_reason` words it): the operator's table shows it before the last failure.
LANE_WAIT = "waiting on lane "

DEFAULT_CREDENTIAL = "default"
"""The credential identity of a lane whose adapter would use no credential at all."""

_FINGERPRINT_HEX = 16  # 64 bits: enough to tell one account from another, short to read
# Pattern strings, compiled (and cached by `re`) at first use: importing the ledger, which
# every CLI command does, compiles nothing.
_ADAPTER = r"[a-z0-9][a-z0-9._-]{0,63}\Z"
_CREDENTIAL = rf"(?:{DEFAULT_CREDENTIAL}|[0-9a-f]{{{_FINGERPRINT_HEX}}})\Z"
_HOST = r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z"
_MAX_REASON = 500
_MAX_FAILURES = 1000  # the breaker's window never holds more than K times (K <= 1000)


class LaneState(enum.StrEnum):
    """A lane's state (see the module docstring); compares equal to its stored string."""

    OPEN = "open"
    PARKED = "parked"
    COOLING = "cooling"
    HALF_OPEN = "half_open"
    STOPPED = "stopped"


class LaneEventKind(enum.StrEnum):
    """What happened on a lane: one row of its history."""

    SUCCESS = "success"  # a success, or a result that is not upstream: the vendor works
    UPSTREAM = "upstream"  # an upstream failure with no reset the vendor stated
    RESET = "reset"  # an upstream failure whose structure stated a reset (`until`)
    STOP = "stop"  # environment that belongs to the lane; `reason` names the fix
    PROBE = "probe"  # the half-open attempt was admitted (`run_id`)
    ABANDON = "abandon"  # a run of the lane was abandoned (its lease expired)
    PARK = "park"  # an operator parked the lane until `until`
    RESUME = "resume"  # an operator re-opened it


class LaneCause(enum.StrEnum):
    """What a failed run's result says about its lane, as the adapter read it from the
    vendor's structure (`finish_run(lane_cause=...)`); never from free text."""

    RESET = "reset"  # a usage or rate limit with its reset time (the run's `not_before`)
    CREDENTIALS = "credentials"  # the credentials were refused or are missing
    BILLING = "billing"  # no billing or credit on the account
    BINARY_MISSING = "binary_missing"  # the CLI is not installed on this host


STOPPING_CAUSES = frozenset({LaneCause.CREDENTIALS, LaneCause.BILLING, LaneCause.BINARY_MISSING})


def _reason(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"reason must be a string or None, got {type(value).__name__}")
    return value if len(value) <= _MAX_REASON else value[: _MAX_REASON - 1] + "…"


@attrs.frozen
class LaneKey:
    """A lane's name: `adapter/credential`, or `adapter/credential@host` for a fact local
    to one host (a missing binary). `parse` reads one back; `str()` writes it."""

    adapter: str = attrs.field(
        validator=checked("a lower-case adapter name", lambda _i, _a, v: _match(_ADAPTER, v))
    )
    credential: str = attrs.field(
        default=DEFAULT_CREDENTIAL,
        validator=checked(
            f"{DEFAULT_CREDENTIAL!r} or a {_FINGERPRINT_HEX}-hex fingerprint",
            lambda _i, _a, v: _match(_CREDENTIAL, v),
        ),
    )
    host: str | None = attrs.field(
        default=None,
        validator=opt_checked("a host name", lambda _i, _a, v: _match(_HOST, v)),
    )

    def __str__(self) -> str:
        base = f"{self.adapter}/{self.credential}"
        return base if self.host is None else f"{base}@{self.host}"

    def on_host(self, host: str) -> LaneKey:
        """This lane narrowed to one host (where a missing binary is a fact)."""
        return attrs.evolve(self, host=host)

    def without_host(self) -> LaneKey:
        return attrs.evolve(self, host=None)

    @classmethod
    def parse(cls, text: object) -> LaneKey:
        """A lane name read back; InvalidInput (field `lane`) for anything else."""
        if not isinstance(text, str) or "/" not in text or len(text) > 400:
            raise InvalidInput(
                f"lane must be ADAPTER/CREDENTIAL[@HOST] (e.g. claude/default), got {text!r}",
                field="lane",
            )
        adapter, _, rest = text.partition("/")
        credential, at, host = rest.partition("@")
        try:
            return cls(adapter, credential, host if at else None)
        except InvalidInput as exc:
            raise InvalidInput(f"lane {text!r}: {exc.message}", field="lane") from None


_NOT_HOST = r"[^A-Za-z0-9._-]"


def host_lane(lane: str, host: str) -> str:
    """`lane` (`ADAPTER/CREDENTIAL`) narrowed to `host`: the name of the lane where a fact
    is local to that host (a missing binary). The host is the one the run's owner named
    (a dispatcher's `RunOwner.host`, sent with its admission): the admission that checks
    the lane and the result that stops it name it from the same stored words. A host name
    a lane cannot hold (a character outside `[A-Za-z0-9._-]`, a leading `.`, `_` or `-`,
    or none at all) is written with each such character as `-`, prefixed with `h` where it
    must start with a letter or digit, and cut to 253 characters: the same host always
    gives the same lane. InvalidInput (field `lane`) for a lane name that is not one."""
    cleaned = re.sub(_NOT_HOST, "-", host)
    if not cleaned[:1].isalnum():
        cleaned = "h" + cleaned
    return str(LaneKey.parse(lane).on_host(cleaned[:253]))


def _match(pattern: str, value: object) -> None:
    if not isinstance(value, str) or re.match(pattern, value) is None:
        raise ValueError("no match")


def _lane_name(value: object) -> None:
    LaneKey.parse(value)


def credential_fingerprint(material: Sequence[tuple[str, bytes]], key: str) -> str:
    """The credential identity of `material` (pairs of a name and the secret's bytes, as
    `credential_material` reads them): HMAC-SHA256 keyed by `key` (the ledger's identity),
    its first 16 hex digits; `default` when there is no material. The secret never leaves
    this function: only the keyed digest does, and without the key it names nothing."""
    if not material:
        return DEFAULT_CREDENTIAL
    # OpenSSL's hashes load here, not at import: a listing or a plain run never asks.
    import hashlib
    import hmac

    mac = hmac.new(key.encode("utf-8"), digestmod=hashlib.sha256)
    for name, value in sorted(material):
        # Length-prefixed, so no two different materials feed the same bytes.
        for part in (name.encode("utf-8"), value):
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
    return mac.hexdigest()[:_FINGERPRINT_HEX]


def credential_material(
    env: Mapping[str, str], names: Iterable[str], files: Iterable[str | os.PathLike[str]]
) -> list[tuple[str, bytes]]:
    """What an adapter would authenticate with: each of `names` set (non-empty) in `env`,
    and each of `files` that can be read (a missing or unreadable file is no credential;
    `~` is expanded against `env`'s HOME). Bounded: a file's first 64 KiB."""
    found: list[tuple[str, bytes]] = []
    for name in names:
        value = env.get(name)
        if value:
            found.append((f"env:{name}", value.encode("utf-8", "surrogateescape")))
    home = env.get("HOME")
    for entry in files:
        path = os.fspath(entry)
        if path.startswith("~") and home:
            path = home + path[1:]
        try:
            with open(path, "rb") as handle:
                found.append((f"file:{os.fspath(entry)}", handle.read(65536)))
        except OSError:
            continue
    return found


def lane_for(
    adapter: str,
    *,
    key: str,
    env: Mapping[str, str],
    credential_env: Iterable[str] = (),
    credential_files: Iterable[str | os.PathLike[str]] = (),
) -> LaneKey:
    """The lane an adapter's attempt uses with `env`: its name and the fingerprint of the
    credentials it would read, keyed by `key` (the ledger's identity)."""
    material = credential_material(env, credential_env, credential_files)
    return LaneKey(adapter, credential_fingerprint(material, key))


FOLD_RULES = 2
"""The version of the fold's rules a new `LaneConfig` folds with (`LaneConfig.rules`)."""


@attrs.frozen
class LaneConfig:
    """The breaker and the bounds of every wait. InvalidInput for a value out of range.

    `breaker_k` upstream failures (1..1000) within `breaker_window_s` seconds (1..86400)
    cool the lane for `cool_base_s` (1..3600) doubling per trip in a row up to
    `cool_max_s` (`cool_base_s`..86400); a stated reset further than `max_park_s`
    (60..30 days) away is capped there. The probe after a stated reset goes
    `reset_margin_s` (0..300) past it, plus a jitter of up to as much again (a vendor lifts
    its limit a little after the second it named, and lanes of one vendor should not all
    probe on that second); a probe that meets the vendor's limit again waits `recheck_s`
    (1..3600), doubling per such probe in a row up to `cool_max_s`, not the breaker's
    doubled cool; a lane that closes `max_trips` times in a row (1..1000) with no answer
    between them stops until an operator resumes it, so nothing probes without end.

    `rules` is the version of the fold's rules (1..`FOLD_RULES`): 1 is how lanes folded
    before these three knobs (a stated reset already past opened the lane, a failed probe
    always waited the breaker's cool, nothing stopped a lane that kept closing); a ledger's
    events from then keep folding so (`LaneConfigHistory`), new ones fold with the rules
    of today. It is not an operator's setting."""

    breaker_k: int = attrs.field(
        default=3, validator=checked("an integer in 1..1000", integer, ge(1), le(1000))
    )
    breaker_window_s: float = attrs.field(
        default=60.0, validator=checked("a number of seconds in 1..86400", finite, ge(1), le(86400))
    )
    cool_base_s: float = attrs.field(
        default=30.0, validator=checked("a number of seconds in 1..3600", finite, ge(1), le(3600))
    )
    cool_max_s: float = attrs.field(
        default=1800.0,
        validator=checked("a number of seconds in 1..86400", finite, ge(1), le(86400)),
    )
    max_park_s: float = attrs.field(
        default=86400.0,
        validator=checked("a number of seconds in 60..2592000", finite, ge(60), le(2592000)),
    )
    reset_margin_s: float = attrs.field(
        default=2.0, validator=checked("a number of seconds in 0..300", finite, ge(0), le(300))
    )
    recheck_s: float = attrs.field(
        default=5.0, validator=checked("a number of seconds in 1..3600", finite, ge(1), le(3600))
    )
    max_trips: int = attrs.field(
        default=20, validator=checked("an integer in 1..1000", integer, ge(1), le(1000))
    )
    rules: int = attrs.field(
        default=FOLD_RULES,
        validator=checked(f"an integer in 1..{FOLD_RULES}", integer, ge(1), le(FOLD_RULES)),
    )

    def __attrs_post_init__(self) -> None:
        if self.cool_max_s < self.cool_base_s:
            raise InvalidInput(
                f"cool_max_s must be >= cool_base_s ({self.cool_base_s:g}), "
                f"got {self.cool_max_s:g}",
                field="cool_max_s",
            )

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    def cooling_wait(self, trips: int) -> float:
        """How long the breaker's `trips`-th closing in a row lasts."""
        return min(self.cool_max_s, self.cool_base_s * 2.0 ** min(max(trips - 1, 0), 32))

    def recheck_wait(self, trips: int) -> float:
        """How long a lane waits after its `trips`-th closing in a row when that closing was
        a probe meeting the vendor's limit again: `recheck_s`, doubling from the second
        closing on (the first is the park itself), up to `cool_max_s`."""
        return min(self.cool_max_s, self.recheck_s * 2.0 ** min(max(trips - 2, 0), 32))

    def probe_at(self, stated: float, lane: str, seed: str) -> float:
        """When the probe after a reset stated for `stated` goes: `reset_margin_s` past it,
        plus a jitter in [0, reset_margin_s) drawn from `lane` and `seed` (the run whose
        result stated it): the same event always folds to the same time."""
        if self.rules < 2 or self.reset_margin_s <= 0:
            return stated
        import zlib  # only a lane event that states a reset needs it

        share = zlib.crc32(f"{lane}|{seed}".encode()) / 2**32
        return stated + self.reset_margin_s * (1.0 + share)


DEFAULT_LANES = LaneConfig()

LANE_CONFIG_FIELDS = tuple(field.name for field in attrs.fields(LaneConfig))
# The fields an operator sets (`set_lane_config`): all but the fold's rules version.
LANE_SETTINGS = tuple(name for name in LANE_CONFIG_FIELDS if name != "rules")
# What a stored epoch that predates a field folded with: the rules of version 1 (the three
# knobs they added have no effect there, so their defaults stand for them).
_LEGACY_FIELDS: dict[str, Any] = {"rules": 1}


@attrs.frozen
class LaneConfigHistory:
    """Every `LaneConfig` the ledger has had and the first lane event each one folded:
    `epochs` is ((from_seq, config), ...) by `from_seq`, and the event numbered `seq`
    (its `lane_events.seq`) was folded with the last config whose `from_seq <= seq`.
    No epoch at all is `DEFAULT_LANES` for every event. Stored in `ledger_meta` under
    `lane_config` as a JSON list of `{"from_seq": N, <the config's fields>}`
    (`to_stored`, `from_stored`)."""

    epochs: tuple[tuple[int, LaneConfig], ...] = ()

    @property
    def current(self) -> LaneConfig:
        """The config a new lane event is folded with."""
        return self.epochs[-1][1] if self.epochs else DEFAULT_LANES

    def at(self, seq: int) -> LaneConfig:
        """The config the event numbered `seq` was folded with."""
        found = DEFAULT_LANES
        for from_seq, config in self.epochs:
            if from_seq > seq:
                break
            found = config
        return found

    def changed(self, config: LaneConfig, from_seq: int) -> LaneConfigHistory:
        """This history with `config` in force from the event numbered `from_seq` on. An
        epoch no event was folded with (the same `from_seq`) is replaced, so a run of
        changes with no lane traffic between them stores one epoch, not one each."""
        kept = tuple(epoch for epoch in self.epochs if epoch[0] < from_seq)
        return LaneConfigHistory((*kept, (from_seq, config)))

    def upgraded(self, last_seq: int) -> LaneConfigHistory:
        """This history, from a ledger written before the rules of version 2, as the
        migration to them stores it: every event up to `last_seq` (the last there is) keeps
        folding with the rules of version 1 (an epoch stored before `rules` existed is read
        as version 1), and every later event folds with today's rules and the knobs in
        force. A ledger with no lane event and no stored configuration needs no epoch."""
        history = self
        if not history.epochs:
            if last_seq == 0:
                return history
            history = LaneConfigHistory(((0, LaneConfig(rules=1)),))
        today = attrs.evolve(history.current, rules=FOLD_RULES)
        return history.changed(today, last_seq + 1)

    def to_stored(self) -> str:
        return json.dumps(
            [{"from_seq": from_seq, **to_json(config)} for from_seq, config in self.epochs],
            separators=(",", ":"),
        )

    @classmethod
    def from_stored(cls, text: str | None) -> LaneConfigHistory:
        """The stored history (None: no epoch); StorageError for a value that is not one."""
        if text is None:
            return cls()
        try:
            rows = json.loads(text)
            epochs = tuple(
                (
                    int(row["from_seq"]),
                    LaneConfig(
                        **{
                            name: row[name] if name in row else _LEGACY_FIELDS[name]
                            for name in LANE_CONFIG_FIELDS
                            if name in row or name in _LEGACY_FIELDS
                        }
                    ),
                )
                for row in rows
            )
        except (ValueError, TypeError, KeyError, InvalidInput) as exc:
            raise StorageError(
                f"the ledger's stored lane configuration is unreadable: {exc}"
            ) from None
        return cls(epochs)


@attrs.frozen(kw_only=True)
class LaneEvent:
    """One row of a lane's history. `until` is a stated reset (`reset`) or an operator's
    park time (`park`); `reason` why (a stop's fix); `run_id`/`task_id` the run it came
    from; `actor` who (the run's actor, an operator, or `execkit`)."""

    lane: str = attrs.field(validator=checked("a lane name", lambda _i, _a, v: _lane_name(v)))
    kind: LaneEventKind = attrs.field(converter=LaneEventKind)
    at: float = attrs.field(validator=checked("a finite number of POSIX seconds", finite))
    actor: str = "execkit"
    run_id: str | None = None
    task_id: str | None = None
    until: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number of POSIX seconds", finite)
    )
    reason: str | None = attrs.field(default=None, converter=_reason)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def _times(value: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(item) for item in value)


@attrs.frozen(kw_only=True)
class LaneSummary:
    """A lane's stored state: the fold of its events (`fold`), what admission reads.

    `trips` counts closings since the lane was last open (each lengthens the next wait);
    `failures` the upstream failure times still inside the breaker's window; `probe_run`
    the half-open attempt in flight; `stopped_task` the task whose run stopped it (an
    operator's `resume` retries it once); `capped` that a stated reset was cut to
    `max_park_s`; `events` how many events were folded."""

    lane: str
    state: LaneState = attrs.field(converter=LaneState)
    until: float | None = attrs.field(
        default=None, validator=opt_checked("a finite number", finite)
    )
    reason: str | None = None
    trips: int = attrs.field(default=0, validator=checked("an integer >= 0", integer, ge(0)))
    failures: tuple[float, ...] = attrs.field(default=(), converter=_times)
    probe_run: str | None = None
    stopped_task: str | None = None
    capped: bool = False
    events: int = attrs.field(default=0, validator=checked("an integer >= 0", integer, ge(0)))
    updated_at: float | None = attrs.field(
        default=None, validator=optional(checked("a finite number", finite))
    )

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def open_lane(lane: str) -> LaneSummary:
    """A lane nothing has happened on: open (a lane with no row is this)."""
    return LaneSummary(lane=lane, state=LaneState.OPEN)


def _opened(summary: LaneSummary, event: LaneEvent) -> LaneSummary:
    return LaneSummary(
        lane=summary.lane,
        state=LaneState.OPEN,
        events=summary.events + 1,
        updated_at=event.at,
    )


def _closed(
    summary: LaneSummary,
    event: LaneEvent,
    state: LaneState,
    until: float,
    reason: str | None,
    *,
    trips: int,
    capped: bool = False,
) -> LaneSummary:
    return attrs.evolve(
        summary,
        state=state,
        until=until,
        reason=reason,
        trips=trips,
        failures=(),
        probe_run=None,
        stopped_task=None,
        capped=capped,
        events=summary.events + 1,
        updated_at=event.at,
    )


def _is_probe(summary: LaneSummary, event: LaneEvent) -> bool:
    return summary.probe_run is not None and summary.probe_run == event.run_id


def step(summary: LaneSummary, event: LaneEvent, config: LaneConfig = DEFAULT_LANES) -> LaneSummary:
    """The lane's state after `event` (see the module docstring). Pure and total: any
    event on any state gives a valid state, so any interleaving folds. `config.rules` says
    which version of the rules folds it (see `LaneConfig`)."""
    kind = event.kind
    state = summary.state
    v2 = config.rules >= 2
    counted = attrs.evolve(summary, events=summary.events + 1, updated_at=event.at)
    if kind is LaneEventKind.RESUME:
        return _opened(summary, event)
    if kind is LaneEventKind.PARK:
        until = event.until if event.until is not None else event.at
        capped = until - event.at > config.max_park_s
        until = min(until, event.at + config.max_park_s)
        return _closed(
            summary,
            event,
            LaneState.PARKED,
            until,
            event.reason or "parked by an operator",
            trips=summary.trips,
            capped=capped,
        )
    if state is LaneState.STOPPED:
        # Only an operator opens a stopped lane: the fix is outside execkit, and a late
        # success from a run admitted before the stop does not prove it was made.
        return counted
    if kind is LaneEventKind.SUCCESS:
        return _opened(summary, event)
    if kind is LaneEventKind.STOP:
        stopped = _closed(
            summary, event, LaneState.STOPPED, event.at, event.reason, trips=summary.trips
        )
        return attrs.evolve(stopped, until=None, stopped_task=event.task_id)
    if kind is LaneEventKind.PROBE:
        if v2 and state in (LaneState.PARKED, LaneState.COOLING):
            # The probe in flight is kept on the closed state, so its result knows what
            # closed the lane (a stated limit or the breaker); `admission` shows it half-open.
            return attrs.evolve(counted, probe_run=event.run_id)
        return attrs.evolve(counted, state=LaneState.HALF_OPEN, probe_run=event.run_id)
    if kind is LaneEventKind.ABANDON:
        if _is_probe(summary, event):
            return attrs.evolve(counted, probe_run=None)
        return counted
    probe = _is_probe(summary, event)
    if kind is LaneEventKind.RESET:
        stated = event.until if event.until is not None else event.at
        if stated <= event.at:
            if not v2:
                # Rules 1: a reset already past opened the lane.
                return _opened(summary, event) if state is not LaneState.OPEN else counted
            # A reset stated for a moment already past is no opening: the vendor still
            # refuses. A probe that meets it waits a short while; on an open lane it counts
            # toward the breaker as any upstream failure does.
            if probe:
                return _limit_held(summary, event, config)
            return _counted_upstream(summary, event, counted, config)
        capped = stated - event.at > config.max_park_s
        stated = min(config.probe_at(stated, summary.lane, event.run_id or repr(event.at)),
                     event.at + config.max_park_s)  # fmt: skip
        if state is LaneState.OPEN:
            return _tripped(
                summary,
                event,
                LaneState.PARKED,
                stated,
                event.reason or "usage limit",
                config,
                capped=capped,
            )
        if probe:
            trips = summary.trips + 1
            wait = config.recheck_wait(trips) if v2 else config.cooling_wait(trips)
            return _tripped(
                summary,
                event,
                LaneState.PARKED,
                max(stated, event.at + wait),
                event.reason or "usage limit",
                config,
                capped=capped,
            )
        # A late result on a closed lane: a later stated reset still holds the lane.
        if summary.until is not None and stated > summary.until:
            return attrs.evolve(
                counted,
                state=LaneState.PARKED if state is not LaneState.HALF_OPEN else state,
                until=stated,
                capped=summary.capped or capped,
            )
        return counted
    # UPSTREAM with no stated reset.
    if probe:
        if v2 and state is LaneState.PARKED:
            # The lane was parked on a limit the vendor stated; its probe meeting the vendor
            # refusing again is that limit lifting late, not a storm: a short wait.
            return _limit_held(summary, event, config)
        trips = summary.trips + 1
        return _tripped(
            summary,
            event,
            LaneState.COOLING,
            event.at + config.cooling_wait(trips),
            f"breaker: the probe failed upstream again ({event.reason or 'upstream'})",
            config,
        )
    return _counted_upstream(summary, event, counted, config)


def _counted_upstream(
    summary: LaneSummary, event: LaneEvent, counted: LaneSummary, config: LaneConfig
) -> LaneSummary:
    """An upstream failure that is not the probe's: on an open lane it joins the breaker's
    window (and trips it at `breaker_k`); on a closed lane it only counts."""
    if summary.state is not LaneState.OPEN:
        return counted
    window = tuple(t for t in summary.failures if t > event.at - config.breaker_window_s)
    window = (*window, event.at)[-_MAX_FAILURES:]
    if len(window) >= config.breaker_k:
        return _tripped(
            summary,
            event,
            LaneState.COOLING,
            event.at + config.cooling_wait(summary.trips + 1),
            f"breaker: {len(window)} upstream failures within "
            f"{config.breaker_window_s:g}s ({event.reason or 'upstream'})",
            config,
        )
    return attrs.evolve(counted, failures=window)


def _limit_held(summary: LaneSummary, event: LaneEvent, config: LaneConfig) -> LaneSummary:
    """The probe after a stated reset met the vendor refusing again (its reset now past,
    or none stated): parked again for `recheck_wait`, not the breaker's doubled cool."""
    trips = summary.trips + 1
    return _tripped(
        summary,
        event,
        LaneState.PARKED,
        event.at + config.recheck_wait(trips),
        f"the vendor's limit held past its stated reset ({event.reason or 'upstream'})",
        config,
    )


def _tripped(
    summary: LaneSummary,
    event: LaneEvent,
    state: LaneState,
    until: float,
    reason: str,
    config: LaneConfig,
    *,
    capped: bool = False,
) -> LaneSummary:
    """The lane closed once more (`trips` + 1) as `state` until `until`; under the rules of
    version 2, the closing past `max_trips` in a row stops it instead (nothing probes a
    vendor that never answers without end: a person looks, then resumes it)."""
    trips = summary.trips + 1
    if config.rules >= 2 and trips > config.max_trips:
        stopped = _closed(
            summary,
            event,
            LaneState.STOPPED,
            event.at,
            f"closed {trips} times in a row with no answer between them (last: {reason}); "
            "resume the lane once the vendor answers",
            trips=trips,
        )
        return attrs.evolve(stopped, until=None)
    return _closed(summary, event, state, until, reason, trips=trips, capped=capped)


def fold(lane: str, events: Iterable[LaneEvent], config: LaneConfig = DEFAULT_LANES) -> LaneSummary:
    """The lane's state from its whole history, in order (what `db check` recomputes)."""
    summary = open_lane(lane)
    for event in events:
        summary = step(summary, event, config)
    return summary


@attrs.frozen
class LaneView:
    """A lane as it stands at one moment: `state` (a parked or cooling lane whose time
    passed is `half_open`), whether the next admission may go (`admits`; `probe` when it
    is the half-open attempt), when it opens (`opens_at`, None when only an operator or
    the probe's result opens it), why, whether a stated reset was capped, the task whose
    run stopped it, how many closings in a row (`trips`) and when it last changed."""

    lane: str
    state: LaneState
    admits: bool
    probe: bool
    opens_at: float | None
    reason: str | None
    capped: bool
    stopped_task: str | None
    trips: int = 0
    updated_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class LaneGate(NamedTuple):
    """What admission reads of a stored lane: its name, state, `until` and probe run (the
    rest of its row words a refusal, and is read only then)."""

    lane: str
    state: str
    until: float | None
    probe_run: str | None


def admission(
    state: LaneState, until: float | None, probe_run: str | None, now: float
) -> tuple[LaneState, bool, bool, float | None]:
    """A stored lane at `now`: (its state shown, whether the next admission may go,
    whether that one is the probe, when it opens). The one rule `view` and admission
    share: a parked or cooling lane whose time passed is `half_open` and admits its probe;
    a half-open lane admits one probe at a time; a stopped one nothing. Pure."""
    admits, probe, opens_at = True, False, None
    if state is LaneState.STOPPED:
        admits = False
    elif state is LaneState.PARKED or state is LaneState.COOLING:
        ends = until if until is not None else now
        if ends > now:
            admits, opens_at = False, ends
        else:
            # Half-open: one probe, and while it is in flight (kept on the closed state
            # by the rules of version 2) nothing else.
            state = LaneState.HALF_OPEN
            admits = probe = probe_run is None
    elif state is LaneState.HALF_OPEN:
        admits = probe = probe_run is None
    return state, admits, probe, opens_at


def view(summary: LaneSummary, now: float) -> LaneView:
    """`summary` projected onto `now` (see `LaneView`, `admission`). Pure."""
    state, admits, probe, opens_at = admission(summary.state, summary.until, summary.probe_run, now)
    return LaneView(
        lane=summary.lane,
        state=state,
        admits=admits,
        probe=probe,
        opens_at=opens_at,
        reason=summary.reason,
        capped=summary.capped,
        stopped_task=summary.stopped_task,
        trips=summary.trips,
        updated_at=summary.updated_at,
    )
