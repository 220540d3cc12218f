"""Every corpus credential, pushed through each place execkit prints or stores text.

Sinks: `execkit run --json` (argv, stderr tail, class and evidence; a command line of
issue #44's attacks split across the argv, as a shell splits it), `execkit classify
--json` (evidence), `execkit run --adapter generic --json` (the proof's output and error),
a dispatcher pass (events, logs, and the raw bytes of the SQLite ledger and its -wal
file), `execkit run finish RUN failed --reason` (the raw ledger bytes) and error messages
(`execkit task show ID`). A credential leaks when any 8 characters of it (or of its
JSON-escaped form) appear in the bytes (see `secrets_corpus.leaked`).

A value that only the child's environment marks as secret (`extra_secrets`) can only be
masked where that environment is known: `execkit run` gets it from its own environment;
the other sinks never see one, so those samples are left out of them.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _support import REPO
from secrets_corpus import ATTACKS, SAMPLES, Sample, leaked

from execkit._classify import FailureClass
from execkit.cli import main
from execkit.dispatch import BoardIssue, DispatchConfig, Dispatcher, InMemoryBoard, RunOutcome, Slot
from execkit.ledger import open_ledger

IDS = [sample.name for sample in SAMPLES]
# Samples whose secret has a shape (or a name) a sink can recognise without an environment.
SHAPED = [sample for sample in SAMPLES if not sample.extra_secrets]
SHAPED_IDS = [sample.name for sample in SHAPED]


def leaks(sample: Sample, blob: bytes | str) -> list[str]:
    """The pieces of the sample's secret found in `blob`, as written or JSON-escaped."""
    text = blob if isinstance(blob, str) else blob.decode("utf-8", errors="replace")
    return leaked(sample.secret, text) + leaked(sample.secret, text, escaped=True)


def _env_for(sample: Sample) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for index, secret in enumerate(sample.extra_secrets):
        env[f"EXECKIT_SINK_TEST_TOKEN_{index}"] = secret  # a secret-sounding name
    return env


def _execkit(sample: Sample, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`python -m execkit ARGS` in a real process, with the sample's secrets in its env."""
    return subprocess.run(
        [sys.executable, "-m", "execkit", *args],
        env=_env_for(sample),
        capture_output=True,
        timeout=120,
    )


# ------------------------------------------------- execkit run --json, run --adapter

# Each sample as the command's own argument, printed on stderr with an upstream status on
# its line: the argv, the stderr tail and the classification's evidence all hold it.
_TO_STDERR = 'printf "status 503: %s\\n" "$1" >&2; exit 1'
_TO_BOTH = 'printf "%s\\n" "$1"; printf "%s\\n" "$1" >&2; exit "$2"'


def _run_cli(
    sample: Sample,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str]:
    """`execkit ARGV` in this process (its children are real), with the sample's secrets in
    the environment under secret-sounding names; the exit code and stdout + stderr."""
    for index, secret in enumerate(sample.extra_secrets):
        monkeypatch.setenv(f"EXECKIT_SINK_TEST_TOKEN_{index}", secret)
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_execkit_run_json_masks_argv_stderr_and_evidence(
    sample: Sample, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--json", "--", "sh", "-c", _TO_STDERR, "sh", sample.text]
    code, out = _run_cli(sample, argv, monkeypatch, capsys)
    assert code == 1
    payload = json.loads(out)
    assert payload["class"] == "upstream" and payload["evidence"], payload
    assert not leaks(sample, out), payload


@pytest.mark.parametrize("exit_code", [1, 0], ids=["failed", "succeeded"])
@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_execkit_run_adapter_generic_masks_the_proof(
    sample: Sample,
    exit_code: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Failed: the proof's error is the stderr tail; succeeded: its output is the reply.
    script = ["sh", "-c", _TO_BOTH, "sh", sample.text, str(exit_code)]
    code, out = _run_cli(
        sample, ["run", "--adapter", "generic", "--json", "--", *script], monkeypatch, capsys
    )
    assert code == exit_code
    proof = json.loads(out)
    assert proof["error" if exit_code else "output"], proof
    assert not leaks(sample, out), proof


# The command lines of issue #44's attacks, as the argv a process is started with: each
# argument alone may look like nothing (`-pS3cret`, `bob:S3cret`).
_COMMAND_LINES = [sample for sample in ATTACKS if " -" in sample.text and "{" not in sample.text]


@pytest.mark.parametrize("sample", _COMMAND_LINES, ids=[s.name for s in _COMMAND_LINES])
def test_execkit_run_json_masks_a_password_split_across_the_argv(
    sample: Sample, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--json", "--", "sh", "-c", "exit 1", *shlex.split(sample.text)]
    code, out = _run_cli(sample, argv, monkeypatch, capsys)
    assert code == 1
    assert not leaks(sample, out), json.loads(out)["argv"]


_EVERYONE = Sample(
    "all",
    "",
    "",
    covered_before=True,
    extra_secrets=tuple(secret for sample in SAMPLES for secret in sample.extra_secrets),
)


@pytest.fixture(scope="module")
def run_json_process() -> subprocess.CompletedProcess[bytes]:
    # One real `python -m execkit run --json` for every sample at once: each an argument of
    # its own and a line of stderr (all of it within the kept tail).
    script = 'for a; do printf "%s\\n" "$a" >&2; done; exit 1'
    texts = [sample.text for sample in SAMPLES]
    done = _execkit(_EVERYONE, "run", "--json", "--", "sh", "-c", script, "sh", *texts)
    assert done.returncode == 1, done.stderr
    return done


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_execkit_run_json_in_a_real_process(
    sample: Sample, run_json_process: subprocess.CompletedProcess[bytes]
) -> None:
    payload = json.loads(run_json_process.stdout)
    assert not payload["stderr_truncated"] and sample.text not in payload["argv"]
    assert not leaks(sample, run_json_process.stdout + run_json_process.stderr), payload


# -------------------------------------------------------------- execkit classify --json


@pytest.mark.parametrize("sample", SHAPED, ids=SHAPED_IDS)
def test_execkit_classify_json_masks_the_evidence(
    sample: Sample, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The status sits on the sample's (first) line, so that line is the evidence. (A key
    # block's first line is its BEGIN line: evidence is one line, and one base64 line on
    # its own is no more a key than any other base64.)
    transcript = f"starting\nstatus 503 from {sample.text}\n"
    stdin = io.TextIOWrapper(io.BytesIO(transcript.encode()), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["classify", "--json"]) == 0
    out = capsys.readouterr()
    payload = json.loads(out.out)
    assert payload["class"] == "upstream" and payload["evidence"], payload
    assert not leaks(sample, out.out + out.err), payload


# ------------------------------------------------------------------ a dispatcher pass


class _SecretRunner:
    """Fails every dispatch with the sample's text as its reason and detail."""

    def __init__(self, text: str, failure_class: FailureClass) -> None:
        self.text = text
        self.failure_class = failure_class

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        if self.failure_class is FailureClass.ENVIRONMENT:
            return RunOutcome("failed", self.failure_class, "spawn errno ENOENT", self.text)
        return RunOutcome("failed", self.failure_class, self.text, detail=self.text)


def _ledger_bytes(db: Path) -> bytes:
    """The raw bytes of the ledger file and of its write-ahead log, when there is one."""
    wal = db.with_name(db.name + "-wal")
    return db.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


@pytest.mark.parametrize("failure_class", [FailureClass.WORK, FailureClass.ENVIRONMENT])
@pytest.mark.parametrize("sample", SHAPED, ids=SHAPED_IDS)
def test_a_dispatcher_pass_masks_events_logs_and_ledger_bytes(
    sample: Sample,
    failure_class: FailureClass,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = tmp_path / "ledger.db"
    board = InMemoryBoard([BoardIssue("ISS-1", "the issue", "todo", prompt="do it")])
    runner = _SecretRunner(sample.text, failure_class)
    caplog.set_level(logging.DEBUG)
    with open_ledger(db) as ledger:
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=2))
        events = dispatcher.tick()
        assert [event.kind for event in events] == ["dispatched"]
        history = ledger.runs(ledger.list_tasks()[0].id)
        assert history and history[0].reason, history
        while_open = _ledger_bytes(db)
    assert db.with_name(db.name + "-wal").exists() or while_open
    dumped = json.dumps([event.to_dict() for event in events])
    assert not leaks(sample, dumped), dumped
    assert not leaks(sample, caplog.text), caplog.text
    assert not leaks(sample, while_open), "the ledger (or its -wal) holds the secret open"
    assert not leaks(sample, _ledger_bytes(db)), "the ledger file holds the secret"


# ---------------------------------------------- execkit run finish RUN failed --reason


@pytest.fixture
def ledger_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A ledger file holding one task, made through the CLI."""
    db = tmp_path / "cli.db"
    assert main(["task", "create", "a task", "--db", str(db), "--json"]) == 0
    capsys.readouterr()
    return db


def _started_run(db: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["task", "list", "--db", str(db), "--json"]) == 0
    task_id = json.loads(capsys.readouterr().out)["tasks"][0]["id"]
    assert main(["run", "start", task_id, "--db", str(db), "--json"]) == 0
    run_id: str = json.loads(capsys.readouterr().out)["id"]
    return run_id


@pytest.mark.parametrize("sample", SHAPED, ids=SHAPED_IDS)
def test_run_finish_reason_is_masked_in_the_ledger_bytes(
    sample: Sample, ledger_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _started_run(ledger_cli, capsys)
    argv = ["run", "finish", run_id, "failed", "--reason", sample.text]
    assert main([*argv, "--db", str(ledger_cli), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["status"] == "failed"
    assert not leaks(sample, out.out + out.err), out.out
    assert not leaks(sample, _ledger_bytes(ledger_cli)), "the ledger bytes hold the secret"


def test_run_finish_reason_is_masked_through_a_real_process(tmp_path: Path) -> None:
    # The same sink end to end once, in a process of its own (what an agent runner calls).
    db = str(tmp_path / "proc.db")
    sample = next(s for s in SAMPLES if s.name == "postgres_url")
    created = _execkit(sample, "task", "create", "t", "--db", db, "--json")
    task_id = json.loads(created.stdout)["id"]
    run_id = json.loads(_execkit(sample, "run", "start", task_id, "--db", db, "--json").stdout)
    finished = _execkit(
        sample, "run", "finish", run_id["id"], "failed", "--reason", sample.text, "--db", db
    )
    assert finished.returncode == 0, finished.stderr
    assert not leaks(sample, finished.stdout + finished.stderr)
    assert not leaks(sample, _ledger_bytes(Path(db)))


# ------------------------------------------------------------------------ error messages


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("sample", SHAPED, ids=SHAPED_IDS)
def test_an_error_naming_the_task_id_does_not_leak_it(
    sample: Sample, as_json: bool, ledger_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["task", "show", sample.text, "--db", str(ledger_cli)] + (["--json"] if as_json else [])
    assert main(argv) != 0
    out = capsys.readouterr()
    assert out.err, "an error is reported"
    assert not leaks(sample, out.out + out.err), out.err
