"""Sending the ledger's notification events (issue #49): signed JSON webhooks and Slack
messages, retried with capped backoff and jitter, bounded, in order per endpoint.

`NotifySender.drain()` is one round: it claims the endpoints owed something
(`Ledger.notify_claim`, a lease: a second sender, on this host or another, skips them),
sends each endpoint its events in order and settles each send (`notify_settle`). The
dispatcher and `execkit serve` each run one (`run_notify_loop`, a thread with its own
ledger): whichever runs sends, and the lease keeps two from sending one event at once.

What a send's answer means:

- 2xx: delivered.
- a timeout, a connection refused or reset, 5xx, 408 or 429: retried, no sooner than the
  backoff after its tries (capped exponential with jitter, `Backoff`) or, for 429 and 503,
  the `Retry-After` the receiver asked (clamped to `max_s`); the endpoint's later events
  wait behind it (their order is kept). An event still failing `give_up_after_s` after its
  first try is given up: counted in the endpoint's `failed`, the reason in `last_error`
  (`execkit notify list`), and the next event goes.
- any other 4xx, or a redirect (3xx: never followed, to another host or not): the endpoint
  refused for good; it is stopped with the reason and sent nothing more until an admin
  enables it again (`execkit notify enable`: its waiting events then go, in order).

The JSON format (docs/formats.md, "Notification events"): the body is
`{"id", "kind", "subject", "at", "data"}`, sent with `X-Execkit-Event-Id`,
`X-Execkit-Event`, `X-Execkit-Timestamp` (POSIX seconds) and, for an endpoint with a
secret, `X-Execkit-Signature: sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<body>` under
the secret. The Slack format is an incoming-webhook message (`{"text": ...}`) a person
reads: what stopped, why, the command that fixes it, and the dashboard's page for it when
the server's URL is known. Events are masked when written (the ledger's sink rule), so
nothing sent carries a secret.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import attrs

from execkit._backoff import Backoff
from execkit._http1 import Connection
from execkit.ledger import NotifyEvent

__all__ = [
    "NOTIFY_BACKOFF",
    "NotifySender",
    "render",
    "sender_owner",
    "sending",
    "sign",
    "tell_dispatcher_stopped",
    "verify",
]

NOTIFY_BACKOFF = Backoff(base_s=2.0, factor=2.0, max_s=300.0, jitter=0.2)
"""The wait between tries of one event: 2 s doubling to 5 minutes, 20% jitter."""

_ANSWER_LIMIT = 64 * 1024
_RETRIED = frozenset({408, 429})


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """`X-Execkit-Signature`'s value: `sha256=` and the hex HMAC-SHA256 of
    `<timestamp>.<body>` under `secret`."""
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, "sha256")
    return "sha256=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """Whether `signature` is `sign(secret, timestamp, body)` (compared in constant time)."""
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


def _fix(event: NotifyEvent) -> str | None:
    """The command that mends what `event` reports, for a person to run."""
    data = event.payload
    if event.kind == "lane.stopped" or event.kind == "lane.parked":
        return f"execkit lane resume {data.get('lane')}"
    if event.kind == "issue.blocked":
        return f"execkit task retry {data.get('task_id')}"
    if event.kind == "dispatcher.stopped":
        return "execkit dispatch (start it again)"
    if event.kind == "spend.capped":
        if str(data.get("cap", "")).startswith("the budget of task"):
            return f"execkit task set-budget {data.get('task_id')} --usd N"
        lane = f" --lane {data['lane']}" if data.get("lane") else ""
        return f"execkit budget set --window {data.get('window')}{lane} --usd N"
    if event.kind == "spend.warning":
        return "execkit spend (what the window holds)"
    return None


_TASK_PAGES = frozenset({"issue.blocked", "run.stalled", "spend.capped"})


def _page(event: NotifyEvent, server_url: str | None) -> str | None:
    """The dashboard's page for what `event` reports (`execkit serve`'s `/dashboard`, a
    task's own page for an issue), when the server's URL is known."""
    if server_url is None:
        return None
    base = server_url.rstrip("/") + "/dashboard"
    data = event.payload
    if event.kind in _TASK_PAGES and data.get("task_id"):
        return f"{base}/tasks/{quote(str(data['task_id']), safe='')}"
    return base


def _slack_text(event: NotifyEvent, dashboard_url: str | None) -> str:
    data = event.payload
    if event.kind == "issue.blocked":
        moved = f" (moved to {data['state']})" if data.get("state") else ""
        head = f":no_entry: *{data.get('title') or data.get('task_id')}* is blocked{moved}"
        why = (
            f"{data.get('attempts')} attempts; last failure {data.get('class') or 'unknown'}: "
            f"{data.get('reason') or data.get('decision') or 'no reason recorded'}"
        )
    elif event.kind == "lane.stopped":
        head = f":octagonal_sign: lane *{data.get('lane')}* stopped"
        why = str(data.get("reason") or "no reason recorded")
    elif event.kind == "lane.parked":
        head = f":double_vertical_bar: lane *{data.get('lane')}* parked"
        why = str(data.get("reason") or "parked until its reset")
    elif event.kind == "lane.resumed":
        head = f":arrow_forward: lane *{data.get('lane')}* resumed"
        why = f"by {data.get('actor')}"
    elif event.kind == "dispatcher.stopped":
        head = f":warning: dispatcher *{data.get('dispatcher')}* stopped with work left"
        why = f"{data.get('left')} issues left; {data.get('reason')}"
    elif event.kind == "run.stalled":
        head = f":hourglass: a run of *{data.get('task_id')}* stalled"
        lane = f" on lane {data['lane']}" if data.get("lane") else ""
        why = (
            f"no output for {data.get('seconds')} s{lane}: its watchdog stopped run "
            f"{data.get('run_id')} ({data.get('class')}); the ledger retries it as its "
            "policy says"
        )
    elif event.kind == "spend.warning":
        head = f":moneybag: {data.get('cap')} is {float(data.get('share') or 0):.0%} used"
        why = "an admitted run brought its window to 80% of the cap"
    elif event.kind == "spend.capped":
        head = f":money_with_wings: {data.get('cap')} is spent: runs wait"
        why = str(data.get("reason") or "no room for a run's reservation")
    else:
        head = f":bell: execkit {event.kind}"
        why = "a test of this endpoint"
    lines = [head, f"Why: {why}"]
    fix = _fix(event)
    if data.get("fix"):
        lines.append(f"Fix: {data['fix']}")
    if fix is not None:
        lines.append(f"Then: `{fix}`")
    page = _page(event, dashboard_url)
    if page is not None:
        lines.append(f"<{page}|Open in the dashboard>")
    return "\n".join(lines)


def render(event: NotifyEvent, fmt: str, *, dashboard_url: str | None = None) -> bytes:
    """The body sent for `event` as `fmt` (`json` or `slack`)."""
    if fmt == "slack":
        document: dict[str, Any] = {"text": _slack_text(event, dashboard_url)}
    else:
        document = {
            "id": event.id,
            "kind": event.kind,
            "subject": event.subject,
            "at": event.at,
            "data": event.payload,
        }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


@attrs.frozen
class _Answer:
    outcome: str  # delivered | retry | stopped
    reason: str | None = None
    retry_after_s: float | None = None


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None
    return seconds if seconds >= 0 else None


def _post(url: str, headers: dict[str, str], body: bytes, timeout_s: float) -> _Answer:
    """POST `body` to `url`: what its answer means (see the module docstring). A redirect
    is never followed."""
    parts = urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    host = parts.hostname or ""
    connection = Connection(host, parts.port, tls=parts.scheme == "https", timeout_s=timeout_s)
    try:
        answer, _ = connection.request("POST", target, headers, body, _ANSWER_LIMIT)
    except (OSError, ConnectionError) as exc:
        kind = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
        return _Answer("retry", f"{kind}: {exc}"[:300])
    finally:
        connection.close()
    status = answer.status
    if 200 <= status < 300:
        return _Answer("delivered")
    lowered = {name.lower(): value for name, value in answer.headers.items()}
    if status >= 500 or status in _RETRIED:
        wait = _retry_after(lowered.get("retry-after")) if status in (429, 503) else None
        return _Answer("retry", f"answered {status}", wait)
    if 300 <= status < 400:
        return _Answer("stopped", f"answered a redirect ({status}); execkit follows none")
    return _Answer("stopped", f"answered {status}; fix the endpoint, then `execkit notify enable`")


@attrs.define
class NotifySender:
    """Sends what the ledger owes its endpoints (see the module docstring). `owner` names
    this sender in the ledger's claims. `clock` and `rng` are seams for tests; `timeout_s`
    bounds each socket operation of a send (a receiver that hangs)."""

    ledger: Any
    owner: str
    timeout_s: float = 10.0
    give_up_after_s: float = 3600.0
    lease_s: float = 120.0
    backoff: Backoff = NOTIFY_BACKOFF
    dashboard_url: str | None = None
    clock: Callable[[], float] = time.time
    rng: Callable[[], float] = random.random

    def drain(self) -> int:
        """One round: every endpoint owed something and not held by another sender is
        sent its due events in order; the number of sends settled."""
        settled = 0
        for claim in self.ledger.notify_claim(
            owner=self.owner, lease_s=self.lease_s, now=self.clock()
        ):
            endpoint = claim.endpoint
            try:
                for event, tries, first_at in claim.events:
                    answer = self._send(claim.url, claim.secret, endpoint.format, event)
                    now = self.clock()
                    outcome, reason, retry_at = answer.outcome, answer.reason, None
                    if outcome == "retry":
                        started = now if first_at is None else first_at
                        if now - started >= self.give_up_after_s:
                            outcome = "failed"
                            reason = f"given up after {tries + 1} tries: {reason}"
                        else:
                            wait = self.backoff.delay(
                                tries + 1, retry_after_s=answer.retry_after_s, rng=self.rng
                            )
                            retry_at = now + wait
                    self.ledger.notify_settle(
                        endpoint.id,
                        event.seq,
                        outcome,
                        owner=self.owner,
                        error=reason,
                        retry_at=retry_at,
                        now=now,
                    )
                    settled += 1
                    if outcome in ("retry", "stopped"):
                        break  # the endpoint's later events wait behind this one
            finally:
                self.ledger.notify_release(endpoint.id, owner=self.owner)
        return settled

    def _send(self, url: str, secret: str | None, fmt: str, event: NotifyEvent) -> _Answer:
        body = render(event, fmt, dashboard_url=self.dashboard_url)
        headers = {"Content-Type": "application/json", "User-Agent": "execkit-notify"}
        if fmt == "json":
            stamp = str(int(self.clock()))
            headers.update(
                {
                    "X-Execkit-Event-Id": event.id,
                    "X-Execkit-Event": event.kind,
                    "X-Execkit-Timestamp": stamp,
                }
            )
            if secret is not None:
                headers["X-Execkit-Signature"] = sign(secret, stamp, body)
        return _post(url, headers, body, self.timeout_s)


def tell_dispatcher_stopped(
    ledger: Any,
    owner: str,
    *,
    left: int,
    signal_number: int | None,
    stopped_lanes: Sequence[str],
) -> str | None:
    """A dispatcher ended with `left` issues still on its board: a signal stopped it, or
    only a person can let them run (`stopped_lanes`). Writes `dispatcher.stopped` (its id)
    when there is work left and the ledger keeps the outbox; None otherwise."""
    if signal_number is None and not stopped_lanes:
        return None
    if not hasattr(ledger, "notify_dispatcher_stopped"):
        return None  # a ledger behind a server: its own dispatchers are not its to tell
    reason = (
        f"stopped by signal {signal_number}"
        if signal_number is not None
        else "waiting on a person: " + ", ".join(f"lane {lane} stopped" for lane in stopped_lanes)
    )
    found: str | None = ledger.notify_dispatcher_stopped(owner, left=left, reason=reason)
    return found


def sender_owner(role: str) -> str:
    """A sender's name in the ledger's claims: what runs it, the host and the process."""
    import os
    import socket

    return f"{role}@{socket.gethostname()}/{os.getpid()}"


@contextlib.contextmanager
def sending(
    open_ledger: Callable[[], Any] | None,
    owner: str,
    *,
    interval_s: float = 2.0,
    dashboard_url: str | None = None,
    final_wait_s: float = 30.0,
) -> Iterator[threading.Thread | None]:
    """While the block runs, a daemon thread sends the ledger's notifications every
    `interval_s` on a ledger of its own (`open_ledger()`: a ledger is one per thread); when
    the block ends, one last round sends what the block's end wrote (a give-up, a
    dispatcher's stop), waited for at most `final_wait_s`. `open_ledger` None (a ledger
    behind `execkit serve`, whose server sends): nothing runs. A round that fails (the
    storage away) is tried again at the next one."""
    if open_ledger is None:
        yield None
        return
    stop = threading.Event()
    thread = _notify_loop(open_ledger, owner, stop, interval_s, dashboard_url)
    try:
        yield thread
    finally:
        stop.set()
        thread.join(final_wait_s)


def _notify_loop(
    open_ledger: Callable[[], Any],
    owner: str,
    stop: threading.Event,
    interval_s: float,
    dashboard_url: str | None,
) -> threading.Thread:
    def loop() -> None:
        try:
            ledger = open_ledger()
        except Exception:
            return
        try:
            sender = NotifySender(ledger, owner, dashboard_url=dashboard_url)
            while True:
                last = stop.is_set()
                # A round that failed (the storage away, a bug in one send) is tried
                # again at the next one: the sender must outlive it.
                with contextlib.suppress(Exception):
                    sender.drain()
                if last:
                    return
                stop.wait(interval_s)
        finally:
            ledger.close()

    thread = threading.Thread(target=loop, name="execkit-notify", daemon=True)
    thread.start()
    return thread
