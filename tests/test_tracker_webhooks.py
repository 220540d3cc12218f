"""Linear's and GitLab's webhooks on `execkit serve` (issue #48), beside GitHub's
(test_github_webhook.py), all one route shape over `HOOK_KINDS`: an authenticated delivery
wakes a waiting dispatcher once per delivery id (202, then 200 for a redelivery, which wakes
nobody); a bad or missing signature or token, or a Linear timestamp more than a minute off
the server's clock, is 401 and changes nothing; no delivery id is 400; past 25 MiB, 413. On
SQLite, on PostgreSQL, and waking a dispatcher through the server. The clock is injected:
no test sleeps."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _support import REPO
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.testclient import TestClient

from execkit._errors import InvalidInput
from execkit.ledger import Ledger, open_ledger
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token
from execkit.server._hooks import (
    HOOK_KINDS,
    LINEAR_TOLERANCE_MS,
    MAX_HOOK_BODY_BYTES,
    Hook,
    hook_path,
    verify_github,
    verify_gitlab,
    verify_linear,
)

SECRETS = {
    "github": b"It's a Secret to Everybody",
    "linear": b"lin_wh_fake0123456789abcdefghijklmnopqrstuvwxyz",
    "gitlab": b"gitlab-secret-token-0123456789",
}
NOW_S = 1_800_000_000.0  # the injected clock of the unit tests
NOW_MS = int(NOW_S * 1000)


def _hex(body: bytes, secret: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def _linear_body(stamp_ms: int | None = None, **more: Any) -> bytes:
    doc: dict[str, Any] = {"action": "update", "type": "Issue", "data": {"id": "uuid-1"}}
    if stamp_ms is not None:
        doc["webhookTimestamp"] = stamp_ms
    return json.dumps({**doc, **more}).encode()


def _credentials(
    tracker: str, body: bytes, *, secret: bytes | None = None, stamp_ms: int | None = None
) -> dict[str, str]:
    """The headers `tracker` authenticates `body` with (Linear's stamped `stamp_ms`, by
    default now on the real clock)."""
    key = SECRETS[tracker] if secret is None else secret
    if tracker == "github":
        return {"x-hub-signature-256": "sha256=" + _hex(body, key)}
    if tracker == "linear":
        stamp = int(time.time() * 1000) if stamp_ms is None else stamp_ms
        return {"linear-signature": _hex(body, key), "linear-timestamp": str(stamp)}
    return {"x-gitlab-token": key.decode()}


def _delivery(tracker: str, delivery: str) -> dict[str, str]:
    name = {"github": "x-github-delivery", "linear": "linear-delivery"}.get(
        tracker, "idempotency-key"
    )
    return {name: delivery}


# -- the verifiers, alone ---------------------------------------------------------------


def _linear(body: bytes, headers: dict[str, str], now_s: float = NOW_S) -> str | None:
    return verify_linear(SECRETS["linear"], body, headers, now_s)


def test_a_linear_delivery_signed_and_stamped_now_is_accepted() -> None:
    body = _linear_body(NOW_MS)
    signature = _hex(body, SECRETS["linear"])
    assert _linear(body, {"linear-signature": signature}) is None
    both = {"linear-signature": signature, "linear-timestamp": str(NOW_MS - 1500)}
    assert _linear(body, both) is None
    # The header alone, the body without a webhookTimestamp (or not JSON at all).
    for plain in (_linear_body(), b"not json", b"[1, 2]"):
        headers = {"linear-signature": _hex(plain, SECRETS["linear"])}
        assert _linear(plain, {**headers, "linear-timestamp": str(NOW_MS)}) is None


@pytest.mark.parametrize(
    "signature",
    [None, "", "0" * 64, "sha256=", "zz" * 32, "upper"],
    ids=["missing", "empty", "zeros", "github-style-prefix", "not-hex", "upper-case"],
)
def test_a_linear_delivery_without_its_signature_is_refused(signature: str | None) -> None:
    body = _linear_body(NOW_MS)
    good = _hex(body, SECRETS["linear"])
    headers: dict[str, str] = {}
    if signature == "sha256=":
        headers["linear-signature"] = "sha256=" + good
    elif signature == "upper":
        headers["linear-signature"] = good.upper()
    elif signature is not None:
        headers["linear-signature"] = signature
    wrong = _linear(body, headers)
    assert wrong is not None and "Linear-Signature" in wrong


@pytest.mark.parametrize(
    ("header_ms", "field_ms", "accepted"),
    [
        (NOW_MS - LINEAR_TOLERANCE_MS, None, True),  # a minute old: the edge, accepted
        (NOW_MS + LINEAR_TOLERANCE_MS, None, True),
        (NOW_MS - LINEAR_TOLERANCE_MS - 1, None, False),  # a minute and a millisecond
        (NOW_MS + LINEAR_TOLERANCE_MS + 1, None, False),  # from the future
        (None, NOW_MS - 120_000, False),  # the signed field stale, no header
        (NOW_MS, NOW_MS - 120_000, False),  # a fresh header cannot refresh a stale body
        (NOW_MS - 120_000, NOW_MS, False),  # nor the other way round
        (None, None, False),  # no timestamp at all
    ],
)
def test_a_linear_timestamp_must_be_within_a_minute_of_the_clock(
    header_ms: int | None, field_ms: int | None, accepted: bool
) -> None:
    body = _linear_body(field_ms)
    headers = {"linear-signature": _hex(body, SECRETS["linear"])}
    if header_ms is not None:
        headers["linear-timestamp"] = str(header_ms)
    wrong = _linear(body, headers)
    assert (wrong is None) is accepted, wrong


@pytest.mark.parametrize("field", [f"{NOW_MS}", float(NOW_MS), True, None, [NOW_MS]])
def test_a_linear_timestamp_that_is_not_milliseconds_is_refused(field: object) -> None:
    body = json.dumps({"action": "update", "webhookTimestamp": field}).encode()
    headers = {"linear-signature": _hex(body, SECRETS["linear"]), "linear-timestamp": str(NOW_MS)}
    assert _linear(body, headers) is not None
    plain = _linear_body()
    for header in ("", "soon", "-5", "1e12", str(NOW_MS) + ".5"):
        stamped = {"linear-signature": _hex(plain, SECRETS["linear"]), "linear-timestamp": header}
        assert _linear(plain, stamped) is not None, header


def test_a_gitlab_token_must_be_the_secret_itself() -> None:
    secret = SECRETS["gitlab"]
    assert verify_gitlab(secret, b"{}", {"x-gitlab-token": secret.decode()}, NOW_S) is None
    for token in ("", secret.decode()[:-1], secret.decode() + "x", secret.decode().upper()):
        assert verify_gitlab(secret, b"{}", {"x-gitlab-token": token}, NOW_S) is not None
    assert verify_gitlab(secret, b"{}", {}, NOW_S) is not None
    # GitLab sends its token, not a signature: a GitHub-style signature is no credential.
    signed = {"x-hub-signature-256": "sha256=" + _hex(b"{}", secret)}
    assert verify_gitlab(secret, b"{}", signed, NOW_S) is not None


def _flip(data: bytes, where: int, by: int) -> bytes:
    index = where % len(data)
    return data[:index] + bytes([data[index] ^ by]) + data[index + 1 :]


@given(
    body=st.binary(max_size=300),
    secret=st.binary(min_size=1, max_size=64),
    where=st.integers(min_value=0),
    by=st.integers(min_value=1, max_value=255),
)
@settings(max_examples=150)
def test_any_signed_linear_delivery_is_accepted_and_any_one_byte_change_refused(
    body: bytes, secret: bytes, where: int, by: int
) -> None:
    assume(b"webhookTimestamp" not in body)  # the header alone stamps it
    signature = _hex(body, secret)
    headers = {"linear-signature": signature, "linear-timestamp": str(NOW_MS)}
    assert verify_linear(secret, body, headers, NOW_S) is None
    if body:
        assert verify_linear(secret, _flip(body, where, by), headers, NOW_S) is not None
    assert verify_linear(_flip(secret, where, by), body, headers, NOW_S) is not None
    # One character of the signature changed to another hex digit.
    index = where % len(signature)
    other = "0123456789abcdef"[("0123456789abcdef".index(signature[index]) + by) % 16]
    assume(other != signature[index])
    forged = {**headers, "linear-signature": signature[:index] + other + signature[index + 1 :]}
    assert verify_linear(secret, body, forged, NOW_S) is not None


@given(
    body=st.binary(max_size=300),
    secret=st.binary(min_size=1, max_size=64),
    where=st.integers(min_value=0),
    by=st.integers(min_value=1, max_value=255),
)
@settings(max_examples=100)
def test_any_signed_github_delivery_is_accepted_and_any_one_byte_change_refused(
    body: bytes, secret: bytes, where: int, by: int
) -> None:
    headers = {"x-hub-signature-256": "sha256=" + _hex(body, secret)}
    assert verify_github(secret, body, headers, NOW_S) is None
    if body:
        assert verify_github(secret, _flip(body, where, by), headers, NOW_S) is not None
    assert verify_github(_flip(secret, where, by), body, headers, NOW_S) is not None


@given(
    token=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1),
    where=st.integers(min_value=0),
    by=st.integers(min_value=1, max_value=0x7F),
)
@settings(max_examples=100)
def test_any_gitlab_token_is_accepted_and_any_one_byte_change_refused(
    token: str, where: int, by: int
) -> None:
    secret = token.encode()
    assert verify_gitlab(secret, b"{}", {"x-gitlab-token": token}, NOW_S) is None
    changed = _flip(secret, where, by).decode("latin-1")
    assert verify_gitlab(secret, b"{}", {"x-gitlab-token": changed}, NOW_S) is not None


def test_every_hook_is_one_row_of_the_table() -> None:
    assert set(HOOK_KINDS) == {"github", "linear", "gitlab"}
    for name, kind in HOOK_KINDS.items():
        assert kind.name == name and kind.path == hook_path(name) == f"/hooks/{name}"
        assert kind.delivery_headers
    assert HOOK_KINDS["gitlab"].delivery_headers == ("Idempotency-Key", "X-Gitlab-Event-UUID")


def test_a_tracker_without_a_webhook_or_an_empty_secret_is_refused(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    add_token(tokens, "me", ["agent.operate"])
    try:
        with pytest.raises(InvalidInput) as refused:
            LedgerApp(ledger, TokenFile(tokens), webhook_secrets={"asana": b"s"})
        assert refused.value.field == "webhook_secrets" and "gitlab" in refused.value.message
        with pytest.raises(InvalidInput) as empty:
            Hook(ledger, "linear", b"")
        assert empty.value.field == "linear_webhook_secret"
    finally:
        ledger.close()


# -- the routes, in process, on an injected clock -----------------------------------------


@pytest.fixture
def linear_at(tmp_path: Path) -> Iterator[tuple[TestClient, Ledger, list[float]]]:
    """Linear's route on an ASGI test client, its clock `now[0]` (epoch seconds)."""
    ledger = open_ledger(tmp_path / "ledger.db")
    now = [NOW_S]
    hook = Hook(ledger, "linear", SECRETS["linear"], clock=lambda: now[0])
    try:
        with TestClient(Starlette(routes=hook.routes())) as client:
            yield client, ledger, now
    finally:
        ledger.close()


def test_a_linear_delivery_is_judged_by_the_servers_clock(
    linear_at: tuple[TestClient, Ledger, list[float]],
) -> None:
    client, ledger, now = linear_at
    body = _linear_body(NOW_MS)
    headers = {
        **_credentials("linear", body, stamp_ms=NOW_MS),
        "linear-delivery": "234d1a4e-b617-4388-90fe-adc3633d6b72",
    }
    seen = ledger.wake_seq()
    now[0] = NOW_S + 61  # a minute and a second later: stale
    stale = client.post("/hooks/linear", content=body, headers=headers)
    assert stale.status_code == 401 and stale.json()["error"]["code"] == "unauthenticated"
    assert "minute" in stale.json()["error"]["message"]
    assert ledger.wake_seq() == seen
    now[0] = NOW_S + 59  # within the minute: the same delivery is new, nothing was noted
    fresh = client.post("/hooks/linear", content=body, headers=headers)
    assert fresh.status_code == 202 and fresh.json()["new"] is True
    assert ledger.wake_seq() == seen + 1


# -- over HTTP, on SQLite and PostgreSQL ---------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Ledger]]:
    yield from serve_with_hooks(open_ledger(tmp_path / "ledger.db"), tmp_path)


@pytest.fixture
def served_pg(tmp_path: Path, pg_url: str) -> Iterator[tuple[str, Ledger]]:
    yield from serve_with_hooks(open_ledger(pg_url), tmp_path)


def serve_with_hooks(ledger: Ledger, tmp_path: Path) -> Iterator[tuple[str, Ledger]]:
    """`ledger` served on loopback with every tracker's webhook secret (`SECRETS`): its URL
    and the ledger, closed after."""
    tokens = tmp_path / "tokens.json"
    add_token(tokens, "me", ["agent.operate"])
    app = LedgerApp(ledger, TokenFile(tokens), webhook_secrets=SECRETS)
    try:
        with ServerThread(app) as running:
            yield running.url, ledger
    finally:
        app.close()
        ledger.close()


def _post(url: str, tracker: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    sent = {"content-type": "application/json", **headers}
    return httpx.post(url + hook_path(tracker), content=body, headers=sent, timeout=30)


def _deliver(url: str, tracker: str, body: bytes, delivery: str) -> httpx.Response:
    headers = {**_credentials(tracker, body), **_delivery(tracker, delivery)}
    return _post(url, tracker, body, headers)


@pytest.mark.parametrize("tracker", ["linear", "gitlab", "github"])
def test_a_delivery_wakes_a_waiting_dispatcher_once(
    served: tuple[str, Ledger], tracker: str
) -> None:
    _wakes_once(*served, tracker)


@pytest.mark.parametrize("tracker", ["linear", "gitlab"])
def test_a_delivery_wakes_a_waiting_dispatcher_once_on_postgres(
    served_pg: tuple[str, Ledger], tracker: str
) -> None:
    _wakes_once(*served_pg, tracker)


def _wakes_once(url: str, ledger: Ledger, tracker: str) -> None:
    body = _linear_body(int(time.time() * 1000)) if tracker == "linear" else b'{"x": 1}'
    seen = ledger.wake_seq()
    woke: list[int] = []
    waiter = threading.Thread(target=lambda: woke.append(ledger.wait_for_wake(seen, 120)))
    waiter.start()
    answer = _deliver(url, tracker, body, "13792a34-cac6-4fda-95a8-c58e00a3954e")
    waiter.join(timeout=130)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"delivery": "13792a34-cac6-4fda-95a8-c58e00a3954e", "new": True}
    assert woke == [seen + 1]  # woken by the delivery, not by its timeout
    # A redelivery (the tracker's retry) is noted once: 200, and it wakes nobody.
    again = _deliver(url, tracker, body, "13792a34-cac6-4fda-95a8-c58e00a3954e")
    assert again.status_code == 200 and again.json()["new"] is False
    assert ledger.wake_seq() == seen + 1
    other = _deliver(url, tracker, body, "another-delivery")
    assert other.status_code == 202
    assert ledger.wake_seq() == seen + 2


def test_the_trackers_delivery_ids_are_apart(served: tuple[str, Ledger]) -> None:
    """One id from two trackers is two deliveries: each is noted under its own source."""
    url, ledger = served
    seen = ledger.wake_seq()
    body = _linear_body(int(time.time() * 1000))
    assert _deliver(url, "linear", body, "same-id").status_code == 202
    assert _deliver(url, "gitlab", body, "same-id").status_code == 202
    assert _deliver(url, "github", body, "same-id").status_code == 202
    assert ledger.wake_seq() == seen + 3


def test_a_gitlab_delivery_is_named_by_its_idempotency_key_else_its_event_uuid(
    served: tuple[str, Ledger],
) -> None:
    url, ledger = served
    token = _credentials("gitlab", b"{}")
    seen = ledger.wake_seq()
    # GitLab 17.4+ sends both: a retry keeps the Idempotency-Key (a recursive hook may share
    # the event UUID), so the key decides.
    first = {**token, "idempotency-key": "key-1", "x-gitlab-event-uuid": "event-1"}
    assert _post(url, "gitlab", b"{}", first).json() == {"delivery": "key-1", "new": True}
    retry = {**token, "idempotency-key": "key-1", "x-gitlab-event-uuid": "event-2"}
    assert _post(url, "gitlab", b"{}", retry).status_code == 200
    recursive = {**token, "idempotency-key": "key-2", "x-gitlab-event-uuid": "event-1"}
    assert _post(url, "gitlab", b"{}", recursive).status_code == 202
    # An older GitLab sends only the event UUID.
    older = {**token, "x-gitlab-event-uuid": "event-3"}
    assert _post(url, "gitlab", b"{}", older).json() == {"delivery": "event-3", "new": True}
    assert _post(url, "gitlab", b"{}", older).status_code == 200
    assert ledger.wake_seq() == seen + 3


@pytest.mark.parametrize(
    ("tracker", "spoil"),
    [
        ("linear", lambda h: {k: v for k, v in h.items() if k != "linear-signature"}),
        ("linear", lambda h: {**h, "linear-signature": "0" * 64}),
        ("linear", lambda h: {**h, "linear-timestamp": str(int(time.time() * 1000) - 120_000)}),
        ("linear", lambda h: {k: v for k, v in h.items() if k != "linear-timestamp"}),
        ("gitlab", lambda h: {}),
        ("gitlab", lambda h: {"x-gitlab-token": "wrong"}),
        ("gitlab", lambda h: {"x-gitlab-token": ""}),
    ],
    ids=[
        "linear-missing",
        "linear-zeros",
        "linear-stale",
        "linear-unstamped",
        "gitlab-missing",
        "gitlab-wrong",
        "gitlab-empty",
    ],
)
def test_an_unauthenticated_delivery_is_401_and_changes_nothing(
    served: tuple[str, Ledger],
    tracker: str,
    spoil: Callable[[dict[str, str]], dict[str, str]],
) -> None:
    url, ledger = served
    seen = ledger.wake_seq()
    body = _linear_body() if tracker == "linear" else b"{}"
    headers = {**spoil(_credentials(tracker, body)), **_delivery(tracker, "d-1")}
    answer = _post(url, tracker, body, headers)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthenticated"
    assert SECRETS[tracker].decode() not in answer.text
    assert ledger.wake_seq() == seen
    # Authenticated afterwards, the same delivery id is still new: nothing was noted.
    assert _deliver(url, tracker, body, "d-1").status_code == 202


@pytest.mark.parametrize("tracker", ["linear", "gitlab"])
def test_an_authenticated_request_without_a_delivery_id_is_400(
    served: tuple[str, Ledger], tracker: str
) -> None:
    url, ledger = served
    seen = ledger.wake_seq()
    body = _linear_body() if tracker == "linear" else b"{}"
    unnamed = _post(url, tracker, body, _credentials(tracker, body))
    assert unnamed.status_code == 400 and unnamed.json()["error"]["code"] == "invalid"
    assert HOOK_KINDS[tracker].delivery_headers[0] in unnamed.json()["error"]["message"]
    spaced = {**_credentials(tracker, body), **_delivery(tracker, "bad id with spaces")}
    assert _post(url, tracker, body, spaced).status_code == 400
    assert ledger.wake_seq() == seen


@pytest.mark.parametrize("tracker", ["linear", "gitlab"])
def test_a_delivery_past_25_mib_is_413(served: tuple[str, Ledger], tracker: str) -> None:
    url, ledger = served
    seen = ledger.wake_seq()
    body = b" " * (MAX_HOOK_BODY_BYTES + 1)
    headers = {**_credentials(tracker, b"{}"), **_delivery(tracker, "big")}
    try:
        answer = _post(url, tracker, body, headers)
    except httpx.TransportError:
        pytest.fail("the server closed the connection instead of answering 413")
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "too_large"
    assert ledger.wake_seq() == seen


def test_without_a_secret_a_trackers_route_is_absent(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    add_token(tokens, "me", ["agent.operate"])
    app = LedgerApp(ledger, TokenFile(tokens), webhook_secrets={"gitlab": SECRETS["gitlab"]})
    try:
        with ServerThread(app) as running:
            body = _linear_body()
            answer = _deliver(running.url, "linear", body, "d")
            assert answer.status_code in (404, 405)
            assert _deliver(running.url, "gitlab", b"{}", "d").status_code == 202
    finally:
        app.close()
        ledger.close()


def test_a_delivery_wakes_a_dispatcher_waiting_through_the_server(tmp_path: Path) -> None:
    """A dispatcher on another host waits on the server (`RemoteLedger`'s long poll): the
    Linear delivery the server notes wakes it."""
    from execkit.remote import RemoteLedger

    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, "me", ["agent.operate"])
    app = LedgerApp(ledger, TokenFile(tokens), webhook_secrets=SECRETS)
    try:
        with ServerThread(app) as running:
            client = RemoteLedger(running.url, token)
            try:
                seen = client.wake_seq()
                woke: list[int] = []
                waiter = threading.Thread(
                    target=lambda: woke.append(client.wait_for_wake(seen, 120))
                )
                waiter.start()
                body = _linear_body(int(time.time() * 1000))
                answer = _deliver(running.url, "linear", body, "remote-1")
                waiter.join(timeout=130)
                assert answer.status_code == 202
                assert woke == [seen + 1]
            finally:
                client.close()
    finally:
        app.close()
        ledger.close()


# -- a dispatcher on a Linear or GitLab board --------------------------------------------


def ran_after_a_delivery(
    ledger: Ledger, board: Any, add_second: Callable[[], object], deliver: Callable[[], int]
) -> list[str]:
    """What a dispatcher over `board` ran, whose next poll is five minutes away: the issue
    on the board, then, once `add_second()` added another and `deliver()` sent the
    tracker's delivery (its HTTP status, 202 expected), the second: the webhook, not the
    interval, ran that pass. Bounded: two minutes a wait."""
    from execkit._proof import RunStatus
    from execkit.dispatch import (
        BoardIssue,
        DispatchConfig,
        Dispatcher,
        InlineExecutor,
        RunOutcome,
        Slot,
    )

    first_ran = threading.Event()
    calls: list[str] = []

    class Runner:
        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            calls.append(issue.id)
            first_ran.set()
            return RunOutcome(RunStatus.SUCCEEDED)

    dispatcher = Dispatcher(board, Runner(), ledger, DispatchConfig(), executor=InlineExecutor())
    loop = threading.Thread(
        target=dispatcher.run_forever, args=(300.0,), kwargs={"stop": lambda: len(calls) >= 2}
    )
    loop.start()
    try:
        assert first_ran.wait(timeout=120)
        add_second()
        assert deliver() == 202
        loop.join(timeout=120)
        assert not loop.is_alive(), "the delivery did not wake the dispatcher"
    finally:
        dispatcher.request_stop()
        loop.join(timeout=60)
        dispatcher.shutdown(5)
    return calls


@pytest.mark.parametrize("tracker", ["linear", "gitlab"])
def test_a_delivery_wakes_a_dispatcher_polling_a_tracker_board(
    served: tuple[str, Ledger], tracker: str
) -> None:
    url, ledger = served
    fake: Any
    if tracker == "linear":
        from linear_fake import KEY, FakeLinear

        from execkit.dispatch._linear import LinearBoard, LinearConfig

        fake = FakeLinear()
        board: Any = LinearBoard(LinearConfig(team="ENG", api_url=fake.url), ledger, KEY)
    else:
        from gitlab_fake import TOKEN, FakeGitLab

        from execkit.dispatch._gitlab import GitLabBoard, GitLabConfig

        fake = FakeGitLab()
        board = GitLabBoard(GitLabConfig(project="acme/widgets", url=fake.url), ledger, TOKEN)
    try:
        first = fake.add_issue("first")
        added: list[str] = []
        body = _linear_body(int(time.time() * 1000)) if tracker == "linear" else b"{}"
        calls = ran_after_a_delivery(
            ledger,
            board,
            lambda: added.append(fake.add_issue("second")),
            lambda: _deliver(url, tracker, body, "wake-1").status_code,
        )
        if tracker == "linear":
            assert calls == [first, *added]
        else:
            assert calls == [f"acme/widgets#{first}", *(f"acme/widgets#{n}" for n in added)]
    finally:
        fake.close()


# -- execkit serve ---------------------------------------------------------------------


def test_execkit_serve_takes_every_trackers_secret_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    add_token(tokens, "me", ["agent.operate"])
    db = tmp_path / "ledger.db"
    argv = [sys.executable, "-m", "execkit", "serve", "--db", str(db), "--tokens", str(tokens)]
    for tracker in ("linear", "gitlab"):
        secret = tmp_path / f"{tracker}-secret"
        secret.write_bytes(SECRETS[tracker] + b"\n")
        secret.chmod(0o600)
        argv += [f"--{tracker}-webhook-secret-file", str(secret)]
    argv += ["--listen", "127.0.0.1:0", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"execkit serve did not start: {log.read_text()}"
        url = json.loads(line)["url"]
        body = _linear_body(int(time.time() * 1000))
        assert _deliver(url, "linear", body, "d-9").status_code == 202
        assert _deliver(url, "gitlab", b"{}", "d-9").status_code == 202
        wrong = {**_credentials("gitlab", b"{}", secret=b"wrong"), **_delivery("gitlab", "d-8")}
        assert _post(url, "gitlab", b"{}", wrong).status_code == 401
        # No GitHub secret given: no GitHub route.
        assert _deliver(url, "github", b"{}", "d-7").status_code in (404, 405)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    assert SECRETS["linear"].decode() not in log.read_text()
    with open_ledger(db) as ledger:
        assert ledger.wake_seq() == 2
    # An open secret file: refused before anything listens, exit 3, naming its flag's field.
    (tmp_path / "gitlab-secret").chmod(0o644)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "gitlab_webhook_secret_file" in done.stderr or "gitlab-secret" in done.stderr
    # With --add-token, a webhook flag is refused.
    minted = [sys.executable, "-m", "execkit", "serve", "--add-token", str(tmp_path / "t2")]
    minted += ["--actor", "me", "--linear-webhook-secret-file", str(tmp_path / "linear-secret")]
    refused = subprocess.run(minted, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 3 and "--linear-webhook-secret-file" in refused.stderr


def test_execkit_serve_help_names_every_webhook() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "execkit", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for tracker in HOOK_KINDS:
        assert f"--{tracker}-webhook-secret-file" in text
        assert f"/hooks/{tracker}" in text
