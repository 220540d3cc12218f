"""Every corpus credential, given to execkit through every door that takes text, is then
looked for in every byte execkit stored and every byte it wrote (issue #30, part 2).

The doors: task titles, run finish reasons, retry reasons, `--on-behalf-of` and
`X-On-Behalf-Of`, role principals, a board's issue titles and ids (and the agent's
output they dispatch), keys, a task id, a wrong-typed field, an unknown field name and a
finish status sent to the server. The bytes: the SQLite ledger file and its -wal, the
server's tokens file (and any other file in its directory), a `pg_dump` of a PostgreSQL
ledger, the CLI's stdout and stderr (text and `--json`), the HTTP answers of a real
`execkit serve` on loopback (the audit and the dashboard's snapshot and task pages among
them) and its stderr.

Each world is built once with every sample at once (one task, one run, one issue per
sample), then each sample is looked for in each blob: the test for a sample names the
blobs that hold any 8 characters of it. The samples are `tests/secrets_corpus.SAMPLES`, the
project's corpus, read at import: a sample added there is covered here with no change.
Samples that only a child's environment marks as secret are left out (no sink here knows
that environment).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO, write_board
from ledger_backends import PgSchemas
from secrets_corpus import SAMPLES, Sample, leaked

from execkit._classify import FailureClass
from execkit._redact import redact
from execkit.cli import main
from execkit.ledger import Actor, open_ledger

SHAPED = [sample for sample in SAMPLES if not sample.extra_secrets]
IDS = [sample.name for sample in SHAPED]
ME = pwd.getpwuid(os.geteuid()).pw_name
MAX_NAME = 200  # a principal, a key, a board state

Blobs = dict[str, str]


def _holding(sample: Sample, blobs: Blobs) -> list[str]:
    """The names of the blobs that hold any piece of the sample's secret."""
    return sorted(
        name
        for name, text in blobs.items()
        if leaked(sample.secret, text) or leaked(sample.secret, text, escaped=True)
    )


def _bytes_of(*paths: Path) -> str:
    """The raw bytes of the files that exist among `paths` (a -wal may not), as text."""
    raw = b"".join(path.read_bytes() for path in paths if path.exists())
    return raw.decode("utf-8", errors="replace")


def _stored(db: Path) -> str:
    return _bytes_of(db, db.with_name(db.name + "-wal"))


class _Cli:
    """`execkit ARGV` in this process, every byte of stdout and stderr kept."""

    def __init__(self) -> None:
        self.text = io.StringIO()
        self.json = io.StringIO()

    def __call__(self, *argv: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        (self.json if "--json" in argv else self.text).write(out.getvalue() + err.getvalue())
        return code, out.getvalue()


# ------------------------------------------------------------- the CLI, SQLite, a board


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Blobs]:
    where = tmp_path_factory.mktemp("local")
    db = str(where / "ledger.db")
    cli = _Cli()
    for sample in SHAPED:
        text = sample.text
        code, out = cli("task", "create", text, "--db", db, "--json", "--on-behalf-of", text)
        assert code == 0, cli.json.getvalue()[-2000:]
        task_id = json.loads(out)["id"]
        code, out = cli("run", "start", task_id, "--db", db, "--json", "--on-behalf-of", text)
        assert code == 0, out
        run_id = json.loads(out)["id"]
        code, _ = cli("run", "finish", run_id, "failed", "--reason", text, "--db", db)
        assert code == 0
        code, _ = cli("task", "retry", task_id, "--reason", text, "--db", db, "--json")
        assert code in (0, 5, 9), code
        code, _ = cli("role", "grant", text, "agent.operate", "--db", db)
        assert code == (0 if len(text) <= MAX_NAME else 3)  # a longer name is refused
        assert cli("task", "show", text, "--db", db)[0] == 4
        assert cli("task", "show", text, "--db", db, "--json")[0] == 4
        assert cli("task", "create", "t", "--max-attempts", text, "--db", db)[0] == 3
        assert cli("run", "finish", run_id, text, "--db", db, "--json")[0] == 3
        assert cli("task", "show", task_id, "--db", db)[0] == 0
    # A board whose issue titles hold the samples, and one agent per issue that prints its
    # sample on stderr and fails: the dispatch events, the reasons and the status show them.
    script = 'printf "%s\\n" "$0" >&2; exit 1'
    issues: list[dict[str, object]] = [
        {
            "id": f"S{index}",
            "title": sample.text,
            "state": "todo",
            "argv": ["sh", "-c", script, sample.text],
        }
        for index, sample in enumerate(SHAPED)
    ]
    board = write_board(where / "board.json", issues, dispatch={"max_attempts": 3})
    board_db = str(where / "board.db")
    dispatch = ["dispatch", "--board", str(board), "--db", board_db, "--adapter", "generic"]
    assert cli(*dispatch, "--once", "--concurrency", "4")[0] == 0
    for extra in ((), ("--json",)):
        assert cli("status", "--board", str(board), "--db", board_db, *extra)[0] == 0
        assert cli("task", "list", "--db", db, *extra)[0] == 0
        assert cli("status", "--db", db, *extra)[0] == 0
        assert cli("db", "check", "--db", db, *extra)[0] == 0
    yield {
        "cli text output": cli.text.getvalue(),
        "cli --json output": cli.json.getvalue(),
        "sqlite ledger and -wal": _stored(Path(db)),
        "the board's sqlite ledger and -wal": _stored(Path(board_db)),
    }


@pytest.mark.parametrize("sample", SHAPED, ids=IDS)
def test_no_cli_output_or_sqlite_byte_holds_it(sample: Sample, local: Blobs) -> None:
    assert _holding(sample, local) == []


def test_the_local_world_is_not_empty(local: Blobs) -> None:
    # The doors were opened: every sample's masked title is in the ledger.
    assert local["sqlite ledger and -wal"].count("[REDACTED]") >= len(SHAPED)
    assert "S0" in local["cli --json output"]


# ------------------------------------------------------- a real `execkit serve` on loopback


class _Http:
    def __init__(self, url: str, token: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token = token
        self.answers = io.StringIO()

    def __call__(
        self, method: str, path: str, body: Any = None, **headers: str
    ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        sent = {"Authorization": f"Bearer {self.token}", **headers}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=sent)
            answer = conn.getresponse()
            raw = answer.read().decode("utf-8", errors="replace")
            self.answers.write(raw + "\n")
            return answer.status, json.loads(raw)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Blobs]:
    from execkit.server import add_token

    where = tmp_path_factory.mktemp("serve")
    tokens = where / "tokens.json"
    token = add_token(tokens, ME, ["agent.operate", "ledger.admin"])
    db = where / "ledger.db"
    log = where / "serve.log"
    argv = [sys.executable, "-m", "execkit", "serve", "--db", str(db), "--tokens", str(tokens)]
    argv += ["--listen", "127.0.0.1:0", "--json"]
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
        http = _Http(json.loads(line)["url"], token)
        for sample in SHAPED:
            text = sample.text
            fits = len(text) <= MAX_NAME
            behalf = {"X-On-Behalf-Of": urllib.parse.quote(text, safe="")} if fits else {}
            key = _key_for(sample)
            status, doc = http("POST", "/v1/tasks", {"title": text}, **behalf, **key)
            assert status == 201, doc
            task = doc["id"]
            assert http("POST", "/v1/tasks", {"title": "x", "max_attempts": text})[0] == 400
            assert http("POST", "/v1/tasks", {"title": "x", text: 1})[0] == 400
            assert http("GET", "/v1/tasks/" + urllib.parse.quote(text, safe=""))[0] == 404
            status, doc = http("POST", f"/v1/tasks/{task}/runs", {}, **behalf)
            assert status == 201, doc
            run = doc["id"]
            finish = {"status": "failed", "failure_class": "work", "reason": text}
            assert http("POST", f"/v1/runs/{run}/finish", {"status": text})[0] == 400
            assert http("POST", f"/v1/runs/{run}/finish", finish)[0] == 200
            assert http("POST", f"/v1/tasks/{task}/retry", {"reason": text}, **behalf)[0] < 500
            grant = {"principal": text, "role": "agent.operate"}
            assert http("POST", "/v1/grants", grant)[0] == (201 if fits else 400)
            give_up = http("POST", f"/v1/tasks/{task}/give-up", {"state": text})[0]
            assert give_up == (200 if fits else 400)
        for path in ("/v1/tasks", "/v1/audit", "/v1/grants", "/v1/check"):
            assert http("GET", path)[0] == 200
        # The dashboard's answers: its snapshot, and each task's page.
        assert http("GET", "/dashboard/api/snapshot")[0] == 200
        for index in range(1, len(SHAPED) + 1):
            assert http("GET", f"/dashboard/api/tasks/t-{index}")[0] == 200
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    yield {
        "http answers": http.answers.getvalue(),
        "server stderr": log.read_text(errors="replace"),
        "sqlite ledger and -wal": _stored(db),
        "tokens file": tokens.read_text(),
        # The server keeps no file of its own (the ledger holds the Idempotency-Keys):
        # anything else written beside the ledger is looked in too.
        "other files": "".join(
            path.read_text(errors="replace")
            for path in sorted(where.iterdir())
            if path.is_file() and path not in (db, db.with_name(db.name + "-wal"), tokens, log)
        ),
    }


def _key_for(sample: Sample) -> dict[str, str]:
    """An Idempotency-Key header holding the sample, where one can: a key is 1..200 visible
    ASCII characters (no room for the text around a secret), so only a secret that is a
    credential on its own is sent as one."""
    secret = sample.secret
    visible = 0 < len(secret) <= MAX_NAME and all("\x21" <= ch <= "\x7e" for ch in secret)
    return {"Idempotency-Key": secret} if visible and redact(secret) != secret else {}


@pytest.mark.parametrize("sample", SHAPED, ids=IDS)
def test_no_http_answer_or_server_byte_holds_it(sample: Sample, served: Blobs) -> None:
    assert _holding(sample, served) == []


def test_the_served_world_is_not_empty(served: Blobs) -> None:
    answers = served["http answers"]
    assert answers.count('"task.create"') >= len(SHAPED) and '"events"' in answers


# ------------------------------------------------------------ PostgreSQL, read by pg_dump


def _pg_dump(pg_schemas: PgSchemas, schema: str) -> str:
    cluster = pg_schemas.cluster
    program = cluster.bindir / "pg_dump"
    found = str(program) if program.exists() else shutil.which("pg_dump")
    if found is None:
        pytest.skip("pg_dump is not installed")
    done = subprocess.run(
        [found, "--dbname", cluster.url(), "--schema", schema, "--no-owner"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def postgres(pg_schemas: PgSchemas) -> Blobs:
    url = pg_schemas.new()
    schema = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["options"][0]
    schema = schema.removeprefix("-csearch_path=")
    with open_ledger(url) as ledger:
        for index, sample in enumerate(SHAPED):
            text = sample.text
            actor = Actor(ME, on_behalf_of=text)
            # A name or key longer than 200 characters is refused: such a sample is given
            # only where free text goes (a cut credential is no longer its shape).
            name = text if len(text) <= MAX_NAME else f"plain-{index}"
            task = ledger.create_task(text, actor=actor, idempotency_key=name)
            run = ledger.start_run(task.id, request_key=name, actor=actor)
            ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK, reason=text)
            ledger.retry_task(task.id, actor=actor, reason=text)
            ledger.record_give_up(task.id, state=name, actor=actor)
            if name == text:
                ledger.grant_role(name, "agent.operate", actor=ME)
    return {"pg_dump of the ledger": _pg_dump(pg_schemas, schema)}


@pytest.mark.parametrize("sample", SHAPED, ids=IDS)
def test_no_postgresql_byte_holds_it(sample: Sample, postgres: Blobs) -> None:
    assert _holding(sample, postgres) == []


def test_the_dump_is_not_empty(postgres: Blobs) -> None:
    assert postgres["pg_dump of the ledger"].count("[REDACTED]") >= len(SHAPED)
