"""`execkit notify add|list|test|remove` (issue #49): the secret is read from a file and
never printed, nor is the URL's path; bad input is one clear error naming the field and
stores nothing; the health of each endpoint is listed; every action works through
`--remote` too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.ledger import open_ledger

HOOK = "https://hooks.slack.test/services/T000/B000/sEcReTpAtH"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out if code == 0 else captured.err)


def test_add_list_test_remove_never_print_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "l.db")
    open_ledger(db).close()
    secret = tmp_path / "secret"
    secret.write_text("whsec-0123456789\n", encoding="utf-8")
    assert main(["notify", "add", HOOK, "--events", "lane.stopped, issue.blocked",
                 "--secret-file", str(secret), "--db", db]) == 0  # fmt: skip
    added = capsys.readouterr().out
    assert "https://hooks.slack.test/…  json (signed)  lane.stopped,issue.blocked" in added
    code, doc = _json(capsys, "notify", "list", "--db", db)
    endpoints = doc["endpoints"]
    assert isinstance(endpoints, list) and len(endpoints) == 1
    endpoint: dict[str, Any] = endpoints[0]
    assert code == 0 and endpoint["has_secret"] is True
    assert main(["notify", "test", endpoint["id"], "--db", db]) == 0
    assert main(["notify", "list", "--db", db]) == 0
    listed = capsys.readouterr().out
    assert "waiting 1" in listed
    for shown in (added, listed, json.dumps(doc)):
        assert "sEcReTpAtH" not in shown and "whsec-0123456789" not in shown
    with open_ledger(db) as ledger:
        assert "whsec" not in str([a.detail for a in ledger.audit_events()])
    assert main(["notify", "remove", endpoint["id"], "--db", db]) == 0
    assert "removed" in capsys.readouterr().out
    assert main(["notify", "remove", endpoint["id"], "--db", db]) == 0
    assert "was not there" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["ftp://x.test/", "--events", "*"], "url"),
        (["http://x.test/", "--events", "issue.exploded"], "events"),
        (["http://x.test/", "--events", ","], "events"),
        (["http://x.test/", "--events", "*", "--secret-file", "/nonexistent/s"], "--secret-file"),
    ],
)
def test_bad_input_names_the_field_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], field: str
) -> None:
    db = str(tmp_path / "l.db")
    open_ledger(db).close()
    code, error = _json(capsys, "notify", "add", *argv, "--db", db)
    assert code == EXIT_CODES["invalid"]
    assert field in error["error"]["message"]  # type: ignore[index]
    with open_ledger(db) as ledger:
        assert ledger.notify_endpoints() == []
    code, _ = _json(capsys, "notify", "test", "ep_nope", "--db", db)
    assert code == EXIT_CODES["not_found"]


def test_through_the_server(
    remote: Remote,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EXECKIT_TOKEN", remote.token)
    code, doc = _json(
        capsys, "notify", "add", HOOK, "--events", "*", "--format", "slack",
        "--remote", remote.url,
    )  # fmt: skip
    assert code == 0 and doc["format"] == "slack" and doc["events"] == ["*"]
    assert [e.id for e in remote.ledger.notify_endpoints()] == [doc["id"]]
    assert main(["notify", "list", "--remote", remote.url]) == 0
    assert "https://hooks.slack.test/…  slack  *" in capsys.readouterr().out
    code, removed = _json(capsys, "notify", "remove", str(doc["id"]), "--remote", remote.url)
    assert code == 0 and removed["removed"] is True


def _stopped(ledger: Any, endpoint_id: str) -> int:
    """Stop `endpoint_id` as a sender does on a 404: its one test event refused."""
    event = ledger.notify_test(endpoint_id, actor=ME)
    ledger.notify_settle(endpoint_id, event.seq, "stopped", owner="s", error="answered 404")
    return int(event.seq)


def test_enable_sends_again_to_a_stopped_endpoint_locally_and_through_the_server(
    tmp_path: Path,
    remote: Remote,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = str(tmp_path / "l.db")
    open_ledger(db).close()
    assert main(["notify", "add", "http://127.0.0.1:9/h", "--events", "*", "--db", db]) == 0
    capsys.readouterr()
    with open_ledger(db) as ledger:
        [endpoint] = ledger.notify_endpoints()
        _stopped(ledger, endpoint.id)
    assert main(["notify", "list", "--db", db]) == 0
    assert "STOPPED: answered 404" in capsys.readouterr().out
    assert main(["notify", "enable", endpoint.id, "--db", db]) == 0
    enabled = capsys.readouterr().out
    assert "STOPPED" not in enabled and "waiting 1" in enabled and "enabled" in enabled
    code, _ = _json(capsys, "notify", "enable", "ep_nope", "--db", db)
    assert code == EXIT_CODES["not_found"]
    # Through the server: the same, and a token without ledger.admin is refused.
    monkeypatch.setenv("EXECKIT_TOKEN", remote.token)
    added = remote.ledger.add_notify_endpoint("http://127.0.0.1:9/r", events=["*"], actor=ME)
    _stopped(remote.ledger, added.id)
    code, doc = _json(capsys, "notify", "enable", added.id, "--remote", remote.url)
    assert code == 0 and doc["stopped_reason"] is None and doc["backlog"] == 1
    [audited] = [e for e in remote.ledger.audit_events() if e.action == "notify.enable"]
    assert audited.detail == {"endpoint": added.id, "was": "answered 404"}
