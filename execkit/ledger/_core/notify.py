"""Being told (issue #49): the notification outbox, its endpoints and what came of each
send.

An event a person must act on (`issue.blocked`, `lane.stopped`, `lane.parked`,
`lane.resumed`, `dispatcher.stopped`, `run.stalled`, `spend.warning`, `spend.capped`) is
written by `_notify` in the transaction of the change it reports, so a change never commits
without its event and an event never exists for a change that rolled back. The one
exception is `spend.capped` for a refused admission: the refusal writes nothing (its
transaction rolls back), so the event is written right after it in a small transaction of
its own, once a window. Each event has a stable id (a receiver de-duplicates on it)
and a number (`seq`) that orders the outbox.

Endpoints are stored in the ledger, so every host sends to the same ones, and are managed
as grants are: only the ledger's owner or a holder of `ledger.admin` adds or removes one,
and each change is audited. An endpoint is sent the events written after it was added
(`from_seq`), of the kinds it asked for, in order. A sender (the dispatcher, `execkit
serve`) claims an endpoint for a lease (`notify_claim`), so one sender at a time sends to
it and an endpoint's events go out in order; each send is settled (`notify_settle`): the
event delivered, to be retried no sooner than a time, given up (counted in `failed`, the
reason in `last_error`), or the endpoint stopped for good with its reason (a refusal that
no retry mends). A sender that dies leaves its claim to run out; the next one sends what
was not settled, so an event is sent at least once and settled once: a receiver that
de-duplicates on the id sees it exactly once.

An endpoint a refusal stopped is sent to again when an admin enables it
(`enable_notify_endpoint`): nothing it was owed is lost, and the refused event goes first.

The URL and the secret are what the operator gave and are never shown: a listing shows
the URL's scheme and host only, and whether there is a secret.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs

from execkit._errors import Forbidden, InvalidInput, NotFound
from execkit._validate import is_number
from execkit.ledger._core.base import CoreBase
from execkit.ledger._core.inputs import (
    MAX_KEY,
    as_actor,
    check_name,
    clean_reason,
    moment,
)
from execkit.ledger._core.store import Tx
from execkit.ledger._model import (
    ADMIN_ROLE,
    Actor,
    AuditAction,
    AuditEntry,
    NotifyEndpoint,
    NotifyEvent,
    NotifyKind,
)

__all__ = ["NOTIFY_EVENT_KINDS", "NotifyClaim", "NotifyOps", "shown_url"]

NOTIFY_EVENT_KINDS = tuple(kind.value for kind in NotifyKind if kind is not NotifyKind.TEST)
"""The kinds an endpoint may ask for (`*`: all of them)."""

NOTIFY_FORMATS = ("json", "slack")
_MAX_URL = 2000
_MAX_SECRET = 512
_MAX_CLAIM = 500
_MAX_LEASE_S = 3600.0
_OUTCOMES = ("delivered", "retry", "failed", "stopped")


def shown_url(url: str) -> str:
    """What a listing shows of an endpoint's URL: its scheme and host (a Slack webhook's
    path is its credential)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"


@attrs.frozen(kw_only=True)
class NotifyClaim:
    """An endpoint a sender holds for its lease, with what it owes it: `events` in order,
    each with the failed tries so far and when the first was made (None: never tried).
    `url` and `secret` are the operator's, for the sender only (never shown)."""

    endpoint: NotifyEndpoint
    url: str = attrs.field(repr=False)
    secret: str | None = attrs.field(repr=False)
    events: tuple[tuple[NotifyEvent, int, float | None], ...]


def _check_url(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_URL:
        raise InvalidInput(
            f"url must be an http:// or https:// URL of at most {_MAX_URL} characters",
            field="url",
        )
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        raise InvalidInput(f"url is not a URL: {exc}", field="url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(
            "url must be an http:// or https:// URL with a host, got "
            f"{parts.scheme or 'no scheme'}",
            field="url",
        )
    if any(ch in value for ch in "\r\n \t"):
        raise InvalidInput("url must not hold a space or a line break", field="url")
    return value


def _check_events(value: object) -> tuple[str, ...]:
    allowed = ", ".join(("*", *NOTIFY_EVENT_KINDS))
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidInput(f"events must be a list of: {allowed}", field="events")
    kinds = tuple(dict.fromkeys(value))
    if not kinds or any(kind != "*" and kind not in NOTIFY_EVENT_KINDS for kind in kinds):
        raise InvalidInput(
            f"events must be one or more of: {allowed}; got {kinds!r}", field="events"
        )
    return ("*",) if "*" in kinds else kinds


def _endpoint(row: Mapping[str, Any], backlog: int = 0) -> NotifyEndpoint:
    return NotifyEndpoint(
        id=row["id"],
        url=shown_url(row["url"]),
        format=row["format"],
        events=tuple(json.loads(row["events"])),
        has_secret=row["secret"] is not None,
        from_seq=int(row["from_seq"]),
        created_by=row["created_by"],
        created_at=float(row["created_at"]),
        stopped_reason=row["stopped_reason"],
        delivered=int(row["delivered"]),
        failed=int(row["failed"]),
        last_error=row["last_error"],
        last_at=row["last_at"],
        claimed_by=row["claimed_by"],
        claimed_until=row["claimed_until"],
        backlog=backlog,
    )


def _event(row: Mapping[str, Any]) -> NotifyEvent:
    return NotifyEvent(
        seq=int(row["seq"]),
        id=row["id"],
        kind=row["kind"],
        subject=row["subject"],
        payload=json.loads(row["payload"]),
        at=float(row["at"]),
    )


def _kinds(row: Mapping[str, Any]) -> tuple[str, ...] | None:
    kinds = tuple(json.loads(row["events"]))
    return None if "*" in kinds else kinds


def _may_claim(row: Mapping[str, Any], owner: str, at: float) -> bool:
    """Whether `owner` may claim the endpoint: not stopped, and held by nobody else."""
    if row["stopped_reason"] is not None:
        return False
    held = row["claimed_by"]
    return held is None or held == owner or (row["claimed_until"] or 0) <= at


class NotifyOps(CoreBase):
    """The notification outbox and its endpoints (see the module docstring)."""

    def _admin(self, tx: Tx, who: Actor, what: str) -> None:
        if ADMIN_ROLE not in self._roles(tx, who):
            raise Forbidden(
                f"{what} needs the ledger's owner ({self._store.owner() or 'unknown'}) "
                f"or the role {ADMIN_ROLE}; {who.name} has neither"
            )

    def add_notify_endpoint(
        self,
        url: str,
        *,
        events: Sequence[str],
        format: str = "json",
        secret: str | None = None,
        actor: Actor | str,
        now: float | None = None,
    ) -> NotifyEndpoint:
        """Store an endpoint: sent the events of `events` (kinds of `NOTIFY_EVENT_KINDS`,
        or `*`) written from now on, as `format` (`json`: signed with `secret` when given;
        `slack`). Admin only (Forbidden), audited (the URL's scheme and host only). The
        same endpoint added again (one not stopped) is the one stored: nothing is added.
        InvalidInput naming the field for a URL that is not http(s) with a host, an
        unknown kind or format, or a secret that is empty or longer than 512."""
        url = _check_url(url)
        kinds = _check_events(events)
        if format not in NOTIFY_FORMATS:
            raise InvalidInput(
                f"format must be one of {', '.join(NOTIFY_FORMATS)}, got {format!r}",
                field="format",
            )
        if secret is not None and (
            not isinstance(secret, str) or not secret.strip() or len(secret) > _MAX_SECRET
        ):
            raise InvalidInput(
                f"secret must be a non-empty string of at most {_MAX_SECRET} characters",
                field="secret",
            )
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            self._admin(tx, who, "adding a notification endpoint")
            for found in tx.notify_endpoint_rows(None, lock=False):
                # The same endpoint again (a client's retry after a lost answer) is the
                # first one: never two that would each be sent every event.
                same = (found["url"], found["format"], found["events"], found["secret"])
                if found["stopped_reason"] is None and same == (
                    url,
                    format,
                    json.dumps(list(kinds)),
                    secret,
                ):
                    return _endpoint(found)
            import uuid  # at the first endpoint: no listing loads it

            row: dict[str, Any] = {
                "id": f"ep_{uuid.uuid4().hex[:12]}",
                "url": url,
                "format": format,
                "events": json.dumps(list(kinds)),
                "secret": secret,
                "from_seq": tx.notify_max_seq(),
                "created_by": str(who),
                "created_at": at,
                "stopped_reason": None,
                "delivered": 0,
                "failed": 0,
                "last_error": None,
                "last_at": None,
                "claimed_by": None,
                "claimed_until": None,
            }
            tx.put_notify_endpoint(row)
            shown = _endpoint(row)
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.NOTIFY_ADD,
                    detail={
                        "endpoint": shown.id,
                        "url": shown.url,
                        "format": format,
                        "events": list(kinds),
                        "signed": secret is not None,
                    },
                )
            )
            return shown

    def remove_notify_endpoint(
        self, endpoint_id: str, *, actor: Actor | str, now: float | None = None
    ) -> bool:
        """Remove an endpoint and what was recorded of its sends; True when there was
        one. Admin only (Forbidden), audited."""
        endpoint_id = check_name("endpoint", endpoint_id, MAX_KEY)
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            self._admin(tx, who, "removing a notification endpoint")
            removed = tx.delete_notify_endpoint(endpoint_id)
            if removed:
                tx.audit(
                    AuditEntry(
                        at=at,
                        actor=str(who),
                        action=AuditAction.NOTIFY_REMOVE,
                        detail={"endpoint": endpoint_id},
                    )
                )
            return removed

    def enable_notify_endpoint(
        self, endpoint_id: str, *, actor: Actor | str, now: float | None = None
    ) -> NotifyEndpoint:
        """Send to an endpoint a refusal stopped (a 4xx, a redirect) again, without
        removing and adding it (which would lose what it was owed): its stop is lifted
        and the events it is owed, the refused one first, go in order at the next round,
        the refused one's give-up bound counted from now. Admin only (Forbidden), audited
        with the reason it was stopped for; NotFound for an unknown endpoint. One that
        was not stopped is returned as it is (nothing written)."""
        endpoint_id = check_name("endpoint", endpoint_id, MAX_KEY)
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            self._admin(tx, who, "enabling a notification endpoint")
            rows = tx.notify_endpoint_rows(endpoint_id, lock=True)
            if not rows:
                raise NotFound(f"no notification endpoint {endpoint_id!r}; `execkit notify list`")
            row = dict(rows[0])
            was = row["stopped_reason"]
            if was is None:
                return _endpoint(
                    row, tx.notify_backlog(row["id"], int(row["from_seq"]), _kinds(row))
                )
            row.update(stopped_reason=None, claimed_by=None, claimed_until=None)
            tx.put_notify_endpoint(row)
            # The refused event's tries were against what the operator has now mended:
            # it starts afresh (due at once, given up no sooner than the bound from now).
            for head in tx.notify_owed(row["id"], int(row["from_seq"]), _kinds(row), 1):
                if head["tries"]:
                    tx.put_notify_delivery(
                        {
                            "endpoint_id": row["id"],
                            "event_seq": int(head["seq"]),
                            "status": "retrying",
                            "tries": 0,
                            "first_at": at,
                            "next_at": None,
                            "last_error": None,
                        }
                    )
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.NOTIFY_ENABLE,
                    detail={"endpoint": endpoint_id, "was": was},
                )
            )
            return _endpoint(row, self._backlog(tx, row))

    @staticmethod
    def _backlog(tx: Tx, row: Mapping[str, Any]) -> int:
        return tx.notify_backlog(row["id"], int(row["from_seq"]), _kinds(row))

    def notify_endpoints(self) -> list[NotifyEndpoint]:
        """Every endpoint by id, with its health: what was delivered, given up, the last
        failure, whether it stopped and why, and its backlog (events waiting for it)."""
        with self._store.read() as tx:
            return [
                _endpoint(row, tx.notify_backlog(row["id"], int(row["from_seq"]), _kinds(row)))
                for row in tx.notify_endpoint_rows(None, lock=False)
            ]

    def notify_test(
        self, endpoint_id: str, *, actor: Actor | str, now: float | None = None
    ) -> NotifyEvent:
        """Write a `notify.test` event for one endpoint only (sent as any event is).
        Admin only; NotFound for an unknown endpoint."""
        endpoint_id = check_name("endpoint", endpoint_id, MAX_KEY)
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            self._admin(tx, who, "testing a notification endpoint")
            if not tx.notify_endpoint_rows(endpoint_id, lock=False):
                raise NotFound(f"no notification endpoint {endpoint_id!r}; `execkit notify list`")
            payload = {"endpoint": endpoint_id, "by": str(who)}
            event_id = self._notify(tx, NotifyKind.TEST, endpoint_id, payload, at)
            row = tx.notify_event(event_id)
            assert row is not None  # written above, in this transaction
            return _event(row)

    def notify_events(self, *, after: int = 0, limit: int = 100) -> list[NotifyEvent]:
        """The outbox's events numbered after `after`, in order, at most `limit`."""
        with self._store.read() as tx:
            return [_event(row) for row in tx.notify_events_after(after, limit)]

    def notify_dispatcher_stopped(
        self, owner: str, *, left: int, reason: str, now: float | None = None
    ) -> str | None:
        """A dispatcher (`owner`) ended with `left` issues still to do: a
        `dispatcher.stopped` event (its id); None, and nothing written, when none is left."""
        owner = check_name("owner", owner, MAX_KEY)
        if type(left) is not int or left < 0:
            raise InvalidInput(f"left must be an integer >= 0, got {left!r}", field="left")
        why = clean_reason(reason) or "stopped"
        if left == 0:
            return None
        at = moment(now)
        with self._store.write() as tx:
            return self._notify(
                tx,
                NotifyKind.DISPATCHER_STOPPED,
                owner,
                {"dispatcher": owner, "left": left, "reason": why},
                at,
            )

    def notify_claim(
        self,
        *,
        owner: str,
        lease_s: float = 60.0,
        limit: int = 50,
        now: float | None = None,
    ) -> list[NotifyClaim]:
        """Each endpoint that is not stopped and not held by another sender, claimed for
        `owner` for `lease_s` seconds, with up to `limit` (1..500) events it is owed, in
        order, up to the first one whose retry is not due yet (an endpoint's events are
        sent in order). Endpoints owed nothing are not claimed."""
        owner = check_name("owner", owner, MAX_KEY)
        if type(limit) is not int or not 1 <= limit <= _MAX_CLAIM:
            raise InvalidInput(f"limit must be an integer in 1..{_MAX_CLAIM}", field="limit")
        if not is_number(lease_s) or not 0 < lease_s <= _MAX_LEASE_S:
            raise InvalidInput(
                f"lease_s must be a number of seconds in (0, {_MAX_LEASE_S:g}], got {lease_s!r}",
                field="lease_s",
            )
        at = moment(now)
        # A read first: a sender asks every few seconds, and most of the time nothing is
        # owed (or there is no endpoint): no write transaction then, so an idle sender
        # never queues behind admissions (SQLite's one writer, PostgreSQL's row locks).
        with self._store.read() as tx:
            if not any(
                _may_claim(row, owner, at)
                and tx.notify_backlog(row["id"], int(row["from_seq"]), _kinds(row))
                for row in tx.notify_endpoint_rows(None, lock=False)
            ):
                return []
        claims: list[NotifyClaim] = []
        with self._store.write() as tx:
            for row in tx.notify_endpoint_rows(None, lock=True):
                if not _may_claim(row, owner, at):
                    continue
                owed: list[tuple[NotifyEvent, int, float | None]] = []
                for event_row in tx.notify_owed(
                    row["id"], int(row["from_seq"]), _kinds(row), limit
                ):
                    next_at = event_row["next_at"]
                    if next_at is not None and next_at > at:
                        break
                    owed.append(
                        (_event(event_row), int(event_row["tries"] or 0), event_row["first_at"])
                    )
                if not owed:
                    continue
                row = {**row, "claimed_by": owner, "claimed_until": at + lease_s}
                tx.put_notify_endpoint(row)
                claims.append(
                    NotifyClaim(
                        endpoint=_endpoint(row),
                        url=row["url"],
                        secret=row["secret"],
                        events=tuple(owed),
                    )
                )
        return claims

    def notify_settle(
        self,
        endpoint_id: str,
        event_seq: int,
        outcome: str,
        *,
        owner: str,
        error: str | None = None,
        retry_at: float | None = None,
        now: float | None = None,
    ) -> NotifyEndpoint:
        """What came of sending event `event_seq` to an endpoint: `delivered`; `retry`
        (no sooner than `retry_at`); `failed` (given up: counted, `error` kept); `stopped`
        (the endpoint refused for good: it is sent nothing more, `error` is why). An event
        settled already stays as it was (a late sender changes nothing). NotFound for an
        endpoint that was removed."""
        endpoint_id = check_name("endpoint", endpoint_id, MAX_KEY)
        owner = check_name("owner", owner, MAX_KEY)
        if outcome not in _OUTCOMES:
            raise InvalidInput(f"outcome must be one of {', '.join(_OUTCOMES)}", field="outcome")
        if type(event_seq) is not int or event_seq < 1:
            raise InvalidInput("event_seq must be an integer >= 1", field="event_seq")
        if retry_at is not None and not is_number(retry_at):
            raise InvalidInput(f"retry_at must be a POSIX time, got {retry_at!r}", field="retry_at")
        why = clean_reason(error)
        at = moment(now)
        with self._store.write() as tx:
            rows = tx.notify_endpoint_rows(endpoint_id, lock=True)
            if not rows:
                raise NotFound(f"no notification endpoint {endpoint_id!r}")
            row = dict(rows[0])
            before = tx.notify_delivery(endpoint_id, event_seq)
            if before is not None and before["status"] != "retrying":
                return _endpoint(row)
            tries = 0 if before is None else int(before["tries"])
            first_at = at if before is None else float(before["first_at"])
            delivery = {
                "endpoint_id": endpoint_id,
                "event_seq": event_seq,
                "status": "retrying",
                "tries": tries + 1,
                "first_at": first_at,
                "next_at": None,
                "last_error": why,
            }
            if outcome == "delivered":
                delivery.update(status="delivered", last_error=None)
                row["delivered"] = int(row["delivered"]) + 1
                row["last_at"] = at
            elif outcome == "failed":
                delivery["status"] = "failed"
                row["failed"] = int(row["failed"]) + 1
                row["last_error"] = why or "failed"
            elif outcome == "retry":
                delivery["next_at"] = max(float(retry_at), at) if retry_at is not None else at
                row["last_error"] = why or "failed"
            else:
                row["stopped_reason"] = why or "refused"
                row["last_error"] = why or "refused"
            tx.put_notify_delivery(delivery)
            tx.put_notify_endpoint(row)
            return _endpoint(row)

    def notify_release(self, endpoint_id: str, *, owner: str) -> None:
        """Give back `owner`'s claim on an endpoint (another sender may take it at once)."""
        endpoint_id = check_name("endpoint", endpoint_id, MAX_KEY)
        owner = check_name("owner", owner, MAX_KEY)
        with self._store.write() as tx:
            rows = tx.notify_endpoint_rows(endpoint_id, lock=True)
            if rows and rows[0]["claimed_by"] == owner:
                tx.put_notify_endpoint({**rows[0], "claimed_by": None, "claimed_until": None})
