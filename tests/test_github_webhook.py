"""GitHub's webhooks on `execkit serve` (issue #47), over real HTTP on loopback: a signed
delivery wakes a dispatcher waiting on the ledger's wake number, once per delivery id; a
bad or missing signature is 401 and changes nothing; the secret file is owner-only; and
`execkit serve --github-webhook-secret-file` serves the route."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _support import REPO
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tracker_webhooks import SECRETS, ran_after_a_delivery, serve_with_hooks

from execkit._errors import InvalidInput
from execkit.ledger import Ledger, open_ledger
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token
from execkit.server._hooks import GITHUB_HOOK_PATH, read_webhook_secret, verify_github

SECRET = SECRETS["github"]


def _signature(body: bytes, secret: bytes = SECRET) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def test_githubs_published_example_signature_is_accepted() -> None:
    # GitHub's documentation ("Validating webhook deliveries") gives this secret, payload
    # and signature as its test vector.
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert _signed(b"Hello, World!", expected)
    assert not _signed(b"Hello, World?", expected)
    assert not _signed(b"Hello, World!", expected.upper())
    assert not _signed(b"Hello, World!", None)


def _signed(body: bytes, signature: str | None) -> bool:
    headers = {} if signature is None else {"x-hub-signature-256": signature}
    return verify_github(SECRET, body, headers, 0.0) is None


@given(body=st.binary(max_size=200), other=st.binary(min_size=1, max_size=40))
@settings(max_examples=50)
def test_only_the_secrets_signature_of_the_very_body_is_accepted(body: bytes, other: bytes) -> None:
    assert _signed(body, _signature(body))
    if other != SECRET:
        assert not _signed(body, _signature(body, other))
    assert not _signed(body + b"x", _signature(body))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Ledger]]:
    yield from serve_with_hooks(open_ledger(tmp_path / "ledger.db"), tmp_path)


@pytest.fixture
def served_pg(tmp_path: Path, pg_url: str) -> Iterator[tuple[str, Ledger]]:
    yield from serve_with_hooks(open_ledger(pg_url), tmp_path)


def _deliver(url: str, body: bytes, delivery: str | None, signature: str | None) -> httpx.Response:
    headers = {"content-type": "application/json", "x-github-event": "issues"}
    if delivery is not None:
        headers["x-github-delivery"] = delivery
    if signature is not None:
        headers["x-hub-signature-256"] = signature
    return httpx.post(url + GITHUB_HOOK_PATH, content=body, headers=headers, timeout=30)


def test_a_signed_delivery_wakes_a_waiting_dispatcher_once(
    served: tuple[str, Ledger],
) -> None:
    _wakes_once(*served)


def test_a_signed_delivery_wakes_a_waiting_dispatcher_once_on_postgres(
    served_pg: tuple[str, Ledger],
) -> None:
    _wakes_once(*served_pg)


def _wakes_once(url: str, ledger: Ledger) -> None:
    body = json.dumps({"action": "labeled", "issue": {"number": 1}}).encode()
    seen = ledger.wake_seq()
    woke: list[int] = []
    waiter = threading.Thread(target=lambda: woke.append(ledger.wait_for_wake(seen, 120)))
    waiter.start()
    answer = _deliver(url, body, "72d3162e-cc78-11e3-81ab-4c9367dc0958", _signature(body))
    waiter.join(timeout=130)
    assert answer.status_code == 202 and answer.json()["new"] is True
    assert woke == [seen + 1]  # woken by the delivery, not by its timeout
    # A redelivery (GitHub's "Redeliver", or a retry) is noted once: no second wake.
    again = _deliver(url, body, "72d3162e-cc78-11e3-81ab-4c9367dc0958", _signature(body))
    assert again.status_code == 200 and again.json()["new"] is False
    assert ledger.wake_seq() == seen + 1
    other = _deliver(url, body, "another-delivery", _signature(body))
    assert other.status_code == 202
    assert ledger.wake_seq() == seen + 2


def test_a_delivery_wakes_a_dispatcher_waiting_through_the_server(tmp_path: Path) -> None:
    """A dispatcher on another host waits on the server (`RemoteLedger`'s long poll): the
    delivery the server notes wakes it."""
    from execkit.remote import RemoteLedger

    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, "me", ["agent.operate"])
    app = LedgerApp(ledger, TokenFile(tokens), github_webhook_secret=SECRET)
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
                answer = _deliver(running.url, b"{}", "remote-1", _signature(b"{}"))
                waiter.join(timeout=130)
                assert answer.status_code == 202
                assert woke == [seen + 1]
            finally:
                client.close()
    finally:
        app.close()
        ledger.close()


@pytest.mark.parametrize(
    "signature",
    [None, "", "sha256=" + "0" * 64, "sha1=abc", _signature(b"another body"), "sha256=zz"],
    ids=["missing", "empty", "zeros", "sha1", "other-body", "not-hex"],
)
def test_a_bad_signature_is_401_and_changes_nothing(
    served: tuple[str, Ledger], signature: str | None
) -> None:
    url, ledger = served
    seen = ledger.wake_seq()
    answer = _deliver(url, b'{"action": "opened"}', "d-1", signature)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthenticated"
    assert ledger.wake_seq() == seen
    # Signed properly afterwards, the same delivery id is still new: nothing was noted.
    good = _deliver(url, b"{}", "d-1", _signature(b"{}"))
    assert good.status_code == 202


def test_a_signed_request_without_a_delivery_id_is_400(served: tuple[str, Ledger]) -> None:
    url, ledger = served
    seen = ledger.wake_seq()
    assert _deliver(url, b"{}", None, _signature(b"{}")).status_code == 400
    assert _deliver(url, b"{}", "bad id with spaces", _signature(b"{}")).status_code == 400
    assert ledger.wake_seq() == seen


def test_without_a_secret_there_is_no_route(tmp_path: Path) -> None:
    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    add_token(tokens, "me", ["agent.operate"])
    app = LedgerApp(ledger, TokenFile(tokens))
    try:
        with ServerThread(app) as running:
            answer = _deliver(running.url, b"{}", "d", _signature(b"{}"))
            assert answer.status_code in (404, 405)
    finally:
        app.close()
        ledger.close()


def test_the_secret_file_is_owner_only_and_not_empty(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    path.chmod(0o600)
    assert read_webhook_secret(path) == SECRET
    path.chmod(0o640)
    with pytest.raises(InvalidInput) as refused:
        read_webhook_secret(path)
    assert refused.value.field == "github_webhook_secret_file"
    path.write_bytes(b"\n")
    path.chmod(0o600)
    with pytest.raises(InvalidInput):
        read_webhook_secret(path)
    with pytest.raises(InvalidInput):
        read_webhook_secret(tmp_path / "absent")


def test_execkit_serve_takes_the_secret_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    add_token(tokens, "me", ["agent.operate"])
    secret = tmp_path / "webhook-secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    db = tmp_path / "ledger.db"
    argv = [sys.executable, "-m", "execkit", "serve", "--db", str(db), "--tokens", str(tokens)]
    argv += ["--github-webhook-secret-file", str(secret), "--listen", "127.0.0.1:0", "--json"]
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"execkit serve did not start: {log.read_text()}"
        url = json.loads(line)["url"]
        assert _deliver(url, b"{}", "d-9", _signature(b"{}")).status_code == 202
        assert _deliver(url, b"{}", "d-9", _signature(b"{}", b"wrong")).status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    with open_ledger(db) as ledger:
        assert ledger.wake_seq() == 1
    # An open secret file: refused before anything listens, exit 3.
    secret.chmod(0o644)
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "github_webhook_secret_file" in done.stderr or "webhook secret" in done.stderr


def test_a_delivery_wakes_a_dispatcher_polling_a_github_board(
    served: tuple[str, Ledger],
) -> None:
    """A dispatcher whose next poll is five minutes away runs a new issue once GitHub's
    delivery arrives: the webhook, not the interval, ran its pass."""
    from github_fake import TOKEN, FakeGitHub

    from execkit.dispatch import GitHubBoard, GitHubConfig

    pytest.importorskip("githubkit")
    url, ledger = served
    fake = FakeGitHub()
    try:
        fake.add_issue("first")
        board = GitHubBoard(GitHubConfig(repo="acme/widgets", api_url=fake.url), ledger, TOKEN)
        body = json.dumps({"action": "labeled"}).encode()
        calls = ran_after_a_delivery(
            ledger,
            board,
            lambda: fake.add_issue("second"),
            lambda: _deliver(url, body, "wake-1", _signature(body)).status_code,
        )
        assert calls == ["acme/widgets#1", "acme/widgets#2"]
    finally:
        fake.close()
