"""The board outbox (issue #47): what a tracker board owes its tracker, recorded in the
ledger first and sent after, so a tracker's outage never loses or doubles a write.

A tracker board (`execkit.dispatch`'s GitHub board) does not write to its tracker when the
dispatcher moves an issue or reports on it: it records the state the issue must show here
(`outbox_put`, one transaction), and sends it later (`outbox_claim`, then `outbox_settle`
with what came of it). One row per (board, item) holds the latest wanted state: each put
merges its keys over the last ones and counts (`seq`), so two moves before a send cost one
write, a put made while a send is in flight stays pending after it (`sent_seq` is the put
that was sent), and what is sent is always the newest. A claim is a lease: another
drainer (a second dispatcher, on this host or another) skips a claimed entry until the
claim runs out, so two never send one entry at once. A failed send is retried no sooner
than the `retry_at` its sender gives, and at most `OUTBOX_MAX_TRIES` times in a row; then
it waits for the next put (the tracker's own lane has usually stopped by then, and names
the fix). Every string put is masked: nothing the outbox sends carries a secret.

The calls a tracker makes on its own lane (`record_lane_call`) are `lanes.py`'s; the
webhook deliveries (`note_delivery`) are here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from execkit._errors import InvalidInput, NotFound
from execkit._validate import is_number
from execkit.ledger._core.inputs import check_json, check_name, clean_reason, moment
from execkit.ledger._core.wake import WakeOps
from execkit.ledger._model import OutboxEntry

__all__ = ["OUTBOX_MAX_BYTES", "OUTBOX_MAX_TRIES", "OutboxOps"]

OUTBOX_MAX_TRIES = 10
"""Failed sends in a row after which an entry waits for its next put."""

OUTBOX_MAX_BYTES = 64 * 1024
"""The largest payload an entry holds, as JSON."""

_MAX_NAME = 400
_MAX_CLAIM = 500
_MAX_LEASE_S = 3600.0


def _count(field: str, value: object, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise InvalidInput(
            f"{field} must be an integer in {low}..{high}, got {value!r}", field=field
        )
    return value


class OutboxOps(WakeOps):
    """The board outbox and tracker webhook deliveries (see the module docstring)."""

    def outbox_put(
        self, board: str, item: str, fields: Mapping[str, Any], *, now: float | None = None
    ) -> OutboxEntry:
        """Record that `item` of `board` must show `fields` (merged over what an earlier put
        asked, key by key); pending until a send of this put settles. Resets the entry's
        failure count. InvalidInput for names that are not text, fields that are not a
        JSON object or larger than `OUTBOX_MAX_BYTES`."""
        board = check_name("board", board, _MAX_NAME)
        item = check_name("item", item, _MAX_NAME)
        fields = check_json("fields", fields, OUTBOX_MAX_BYTES)
        at = moment(now)
        with self._store.write() as tx:
            before = tx.outbox(board, item, lock=True)
            if before is None:
                entry = OutboxEntry(board=board, item=item, seq=1, sent_seq=0, payload=fields)
            else:
                merged = {**before.payload, **fields}
                if merged == dict(before.payload) and not before.pending:
                    return before  # shown already: nothing to send
                entry = attrs.evolve(
                    before,
                    seq=before.seq + 1,
                    payload=merged,
                    tries=0,
                    next_at=None,
                    last_error=None,
                )
            entry = attrs.evolve(entry, updated_at=at)
            tx.write_outbox(entry)
            return entry

    def outbox_claim(
        self,
        board: str,
        *,
        owner: str,
        lease_s: float = 60.0,
        limit: int = 50,
        now: float | None = None,
    ) -> list[OutboxEntry]:
        """Up to `limit` (1..500) pending entries of `board` that are due, claimed for
        `owner` for `lease_s` seconds (each claim counted in `sends`), oldest put first:
        what this drainer sends now. An entry claimed by another drainer is skipped until
        its claim runs out."""
        board = check_name("board", board, _MAX_NAME)
        owner = check_name("owner", owner, _MAX_NAME)
        limit = _count("limit", limit, 1, _MAX_CLAIM)
        if not is_number(lease_s) or not 0 < lease_s <= _MAX_LEASE_S:
            raise InvalidInput(
                f"lease_s must be a number of seconds in (0, {_MAX_LEASE_S:g}], got {lease_s!r}",
                field="lease_s",
            )
        at = moment(now)
        with self._store.write() as tx:
            claimed = []
            for entry in tx.due_outbox(board, at, owner, limit, OUTBOX_MAX_TRIES):
                mine = attrs.evolve(
                    entry, claimed_by=owner, claimed_until=at + lease_s, sends=entry.sends + 1
                )
                tx.write_outbox(mine)
                claimed.append(mine)
            return claimed

    def outbox_settle(
        self,
        board: str,
        item: str,
        seq: int,
        *,
        owner: str,
        ref: str | None = None,
        error: str | None = None,
        retry_at: float | None = None,
        now: float | None = None,
    ) -> OutboxEntry:
        """What came of sending put `seq` of an entry: delivered (`error` None: the entry
        is settled up to `seq`), or failed with `error`, to be retried no sooner than
        `retry_at` (default now). `ref`, when given, is the tracker's handle to keep for the
        item (kept across puts). The claim is released when it is `owner`'s. NotFound for
        an entry never put; InvalidInput for a `seq` it never had."""
        board = check_name("board", board, _MAX_NAME)
        item = check_name("item", item, _MAX_NAME)
        owner = check_name("owner", owner, _MAX_NAME)
        handle = None if ref is None else check_name("ref", ref, _MAX_NAME)
        why = clean_reason(error)
        if error is not None and why is None:
            why = "failed"
        if retry_at is not None and not is_number(retry_at):
            raise InvalidInput(f"retry_at must be a POSIX time, got {retry_at!r}", field="retry_at")
        at = moment(now)
        with self._store.write() as tx:
            before = tx.outbox(board, item, lock=True)
            if before is None:
                raise NotFound(f"no outbox entry for {item!r} of board {board!r}")
            _count("seq", seq, 1, before.seq)
            release: dict[str, Any] = {}
            if before.claimed_by == owner:
                release = {"claimed_by": None, "claimed_until": None}
            if why is None:
                entry = attrs.evolve(
                    before,
                    sent_seq=max(before.sent_seq, seq),
                    ref=handle if handle is not None else before.ref,
                    tries=0,
                    next_at=None,
                    last_error=None,
                    updated_at=at,
                    **release,
                )
            else:
                entry = attrs.evolve(
                    before,
                    ref=handle if handle is not None else before.ref,
                    tries=before.tries + 1,
                    next_at=max(float(retry_at), at) if retry_at is not None else at,
                    last_error=why,
                    updated_at=at,
                    **release,
                )
            tx.write_outbox(entry)
            return entry

    def outbox_entries(self, board: str, *, pending: bool = False) -> list[OutboxEntry]:
        """A board's entries by item; with `pending`, only those not delivered yet."""
        board = check_name("board", board, _MAX_NAME)
        with self._store.read() as tx:
            return tx.outbox_rows(board, pending=bool(pending))

    def note_delivery(self, source: str, delivery: str, *, now: float | None = None) -> bool:
        """A tracker's webhook delivery (`source`, its delivery id): True, and every waiting
        dispatcher is woken (`wait_for_wake`), the first time the id is seen; False for a
        delivery seen before (a redelivery), which changes nothing."""
        source = check_name("source", source, _MAX_NAME)
        delivery = check_name("delivery", delivery, _MAX_NAME)
        at = moment(now)
        scope = f"delivery:{source}"
        with self._store.write() as tx:
            if tx.idempotent(scope, delivery) is not None:
                return False
            tx.remember(scope, delivery, "delivery", {"at": at}, at)
            self._wake(tx)
            return True
