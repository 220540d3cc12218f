"""The documented file formats (docs/formats.md, docs/schemas/) agree with the code.

What `execkit demo --keep` writes validates against the schemas and is read back by
`execkit decide`; documents the schemas refuse are refused by the code too, with the code's
own exit codes; the examples in docs/formats.md are valid for both; and the documentation
explains itself without pointing outside the repository.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO

# jsonschema ships no type information; the ignore stays valid if stubs are added later.
from jsonschema import Draft202012Validator  # type: ignore[import-untyped, unused-ignore]

from execkit._budget import Attempt, AttemptStatus
from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit._exec import BINARY_NOTICE, MAX_TAIL_BYTES
from execkit._exec.result import REDACT_CONTEXT
from execkit._exec.tail import _BINARY_SHARE
from execkit._prices import PRICES_ENV, load_prices
from execkit._usage import load_usage
from execkit.cli import main
from execkit.cli._decide import _parse_attempt, attempt_to_json
from execkit.ledger import open_ledger

DOCS = REPO / "docs"
SCHEMAS = DOCS / "schemas"
FORMATS = DOCS / "formats.md"

# `execkit decide` and board errors: one exit code per error code (README "exit codes").
EXIT_INVALID = 3
EXIT_INVALID_HISTORY = 11


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EXECKIT_DB", None)
    return env


def execkit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "execkit", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def validator(name: str) -> Any:
    schema = load_json(SCHEMAS / f"{name}.schema.json")
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_errors(name: str, document: object) -> list[str]:
    return [error.message for error in validator(name).iter_errors(document)]


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One `execkit demo --keep DIR` for the module (it spawns a dozen processes)."""
    where = tmp_path_factory.mktemp("docs") / "kept"
    result = execkit("demo", "--keep", str(where))
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("kept in ")]
    assert "execkit decide --history history/DEMO-4.json" in line
    return where


def histories(kept: Path) -> list[Path]:
    return sorted((kept / "history").glob("*.json"))


# --- the schemas themselves -------------------------------------------------------------


@pytest.mark.parametrize("name", ["board", "attempt-history", "board-config"])
def test_each_schema_is_a_valid_draft_2020_12_schema(name: str) -> None:
    schema = load_json(SCHEMAS / f"{name}.schema.json")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


# --- what the demo writes ---------------------------------------------------------------


def test_the_kept_board_matches_its_schema(kept: Path) -> None:
    assert schema_errors("board", load_json(kept / "board.json")) == []


def test_the_demo_keeps_one_history_per_issue(kept: Path) -> None:
    assert [path.name for path in histories(kept)] == [
        "DEMO-1.json",
        "DEMO-2.json",
        "DEMO-3.json",
        "DEMO-4.json",
    ]
    # The files say what the demo's table says: classes, charges and the gapless numbers.
    classes = {
        path.stem: [(a["number"], a["status"], a["class"]) for a in load_json(path)]
        for path in histories(kept)
    }
    assert classes == {
        "DEMO-1": [(1, "succeeded", None)],
        "DEMO-2": [(1, "failed", "environment")],
        "DEMO-3": [(1, "failed", "upstream"), (2, "failed", "upstream"), (3, "succeeded", None)],
        "DEMO-4": [(1, "failed", "work"), (2, "failed", "work"), (3, "failed", "work")],
    }


def test_every_kept_history_matches_its_schema(kept: Path) -> None:
    for path in histories(kept):
        assert schema_errors("attempt-history", load_json(path)) == [], path.name


def test_execkit_decide_reads_every_kept_history(kept: Path) -> None:
    expected = {
        "DEMO-1": ("done", None),
        "DEMO-2": ("blocked", "environment"),
        "DEMO-3": ("done", None),
        "DEMO-4": ("blocked", "work"),
    }
    for path in histories(kept):
        result = execkit("decide", "--history", str(path), "--json")
        assert result.returncode == 0, (path.name, result.stderr)
        decision = json.loads(result.stdout)
        assert (decision["state"], decision["blocked_on"]) == expected[path.stem]


def test_attempt_to_json_round_trips_through_the_reader() -> None:
    attempts = [
        Attempt(1, AttemptStatus.FAILED, FailureClass.UPSTREAM, "http 503", 10.0, 11.5),
        Attempt(2, AttemptStatus.FAILED, None, None, 20.0, None, forced=True, not_before=90.0),
        Attempt(3, AttemptStatus.RUNNING, started_at=30.0),
    ]
    written = [attempt_to_json(attempt) for attempt in attempts]
    assert written[0] == {
        "number": 1,
        "status": "failed",
        "class": "upstream",
        "reason": "http 503",
        "started_at": 10.0,
        "ended_at": 11.5,
        "forced": False,
        "not_before": None,
    }
    assert written[1]["not_before"] == 90.0
    assert schema_errors("attempt-history", written) == []
    assert [_parse_attempt(i, item) for i, item in enumerate(written)] == attempts


# --- schema and code refuse the same documents -------------------------------------------


def _attempt(**changes: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"number": 1, "status": "failed", "class": "work", "reason": "x"}
    item.update(changes)
    return {key: value for key, value in item.items() if value is not ...}


BAD_HISTORIES: dict[str, object] = {
    "unknown key": [_attempt(colour="red")],
    "bad status": [_attempt(status="crashed")],
    "status in upper case": [_attempt(status="FAILED")],
    "bad class": [_attempt(**{"class": "network"})],
    "number 0": [_attempt(number=0)],
    "number a string": [_attempt(number="1")],
    "number a boolean": [_attempt(number=True)],
    "no number": [_attempt(number=...)],
    "no status": [_attempt(status=...)],
    "class and failure_class": [_attempt(failure_class="work")],
    "reason not a string": [_attempt(reason=503)],
    "time not a number": [_attempt(started_at="yesterday")],
    "forced not a boolean": [_attempt(forced=1)],
    "not a list": {"attempts": []},
    "an item not an object": [1],
}


@pytest.mark.parametrize("case", sorted(BAD_HISTORIES))
def test_a_history_the_schema_refuses_the_code_refuses(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = BAD_HISTORIES[case]
    assert schema_errors("attempt-history", document), f"the schema accepts {case}"
    path = tmp_path / "history.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    code = main(["decide", "--history", str(path), "--json"])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID_HISTORY, (case, err)
    assert json.loads(err)["error"]["code"] == "invalid_history"


def test_a_history_that_is_not_json_is_invalid_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "history.json"
    path.write_text("[{", encoding="utf-8")
    assert main(["decide", "--history", str(path)]) == EXIT_INVALID
    assert "not valid JSON" in capsys.readouterr().err


GOOD_HISTORIES: dict[str, object] = {
    "empty": [],
    "minimal": [{"number": 1, "status": "abandoned"}],
    "failure_class instead of class": [_attempt(**{"class": ...}, failure_class="upstream")],
    "nulls everywhere": [
        _attempt(**{"class": None}, reason=None, started_at=None, ended_at=None, forced=None)
    ],
    "integer times": [_attempt(started_at=10, ended_at=11)],
}


@pytest.mark.parametrize("case", sorted(GOOD_HISTORIES))
def test_a_history_the_schema_accepts_the_code_accepts(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = GOOD_HISTORIES[case]
    assert schema_errors("attempt-history", document) == []
    path = tmp_path / "history.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert main(["decide", "--history", str(path), "--json", "--now", "100"]) == 0
    capsys.readouterr()


def test_the_history_rules_only_the_code_can_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Valid item by item, so the schema accepts them; the history invariants refuse them.
    for document in (
        [_attempt(number=2)],
        [_attempt(status="running"), _attempt(number=2, status="running")],
        [_attempt(status="succeeded", **{"class": None}), _attempt(number=2)],
    ):
        assert schema_errors("attempt-history", document) == []
        path = tmp_path / "history.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        assert main(["decide", "--history", str(path)]) == EXIT_INVALID_HISTORY
        capsys.readouterr()


def _board(**changes: Any) -> dict[str, Any]:
    board: dict[str, Any] = {
        "states": [{"name": "todo", "eligible": True}, {"name": "done", "terminal": True}],
        "issues": [{"id": "A-1", "title": "a", "state": "todo", "argv": ["true"]}],
    }
    board.update(changes)
    return board


TODO = {"name": "todo", "eligible": True}

BAD_BOARDS: dict[str, object] = {
    "no states": {"issues": []},
    "empty states": _board(states=[]),
    "no eligible state": _board(states=["todo"], issues=[]),
    "eligible and terminal": _board(states=[{"name": "todo", "eligible": True, "terminal": True}]),
    "unknown state key": _board(states=[{**TODO, "colour": "red"}]),
    "blank state name": _board(states=[{"name": "  ", "eligible": True}]),
    "state name too long": _board(states=[{"name": "x" * 201, "eligible": True}]),
    "eligible not a boolean": _board(states=[{"name": "todo", "eligible": "yes"}]),
    "unknown issue key": _board(issues=[{"id": "A-1", "state": "todo", "colour": "red"}]),
    "issue without an id": _board(issues=[{"state": "todo"}]),
    "issue without a state": _board(issues=[{"id": "A-1"}]),
    "argv a string": _board(issues=[{"id": "A-1", "state": "todo", "argv": "true"}]),
    "title null": _board(issues=[{"id": "A-1", "state": "todo", "title": None}]),
    "issues not a list": _board(issues={"A-1": {}}),
    "the same state twice": _board(states=[TODO, TODO]),
    "dispatch not an object": _board(dispatch=[]),
    "unknown dispatch key": _board(dispatch={"retries": 3}),
    "dispatch cap 0": _board(dispatch={"max_attempts": 0}),
    "dispatch backoff 0": _board(dispatch={"base_backoff_s": 0}),
    "blank failed state": _board(dispatch={"failed_state": " "}),
}


def _status_exit(
    board: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    path = tmp_path / "board.json"
    path.write_text(json.dumps(board), encoding="utf-8")
    # An empty ledger: `status` reads the board and its dispatch settings, then finds no
    # task for any issue (it refuses to print a table of blanks).
    open_ledger(tmp_path / "empty.db").close()
    code = main(["status", "--board", str(path), "--db", str(tmp_path / "empty.db")])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("case", sorted(BAD_BOARDS))
def test_a_board_the_schema_refuses_the_code_refuses(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    board = BAD_BOARDS[case]
    assert schema_errors("board", board), f"the schema accepts {case}"
    code, err = _status_exit(board, tmp_path, capsys)
    assert code == EXIT_INVALID, (case, err)


GOOD_BOARDS: dict[str, object] = {
    "states by name": _board(states=[TODO, "review", "done"]),
    "no issues key": {"states": [TODO]},
    "body instead of prompt": _board(issues=[{"id": "A-1", "state": "todo", "body": "b"}]),
    "every dispatch key": _board(
        dispatch={
            "max_attempts": -1,
            "failed_state": None,
            "base_backoff_s": 1,
            "max_retry_backoff_s": 2.5,
            "done_state": "done",
        }
    ),
    "failed_state none": _board(dispatch={"failed_state": "none"}),
    "unknown top-level key": _board(owner="team-a"),
}


@pytest.mark.parametrize("case", sorted(GOOD_BOARDS))
def test_a_board_the_schema_accepts_the_code_accepts(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    board = GOOD_BOARDS[case]
    assert schema_errors("board", board) == []
    code, err = _status_exit(board, tmp_path, capsys)
    # Accepted: either nothing to show, or refused only for the ledger that never saw it.
    assert code == 0 or (code == 4 and "no task for any issue" in err), (case, err)


def test_the_board_rules_only_the_code_can_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    issue = {"id": "A-1", "state": "todo"}
    for board in (
        _board(states=[TODO, {"name": "todo"}]),  # a duplicate name, not a duplicate item
        _board(issues=[issue, {**issue, "title": "again"}]),
        _board(issues=[{"id": "A-1", "state": "doing"}]),
        _board(dispatch={"base_backoff_s": 20, "max_retry_backoff_s": 10}),
        _board(dispatch={"failed_state": "done"}),
    ):
        assert schema_errors("board", board) == []
        code, err = _status_exit(board, tmp_path, capsys)
        assert code == EXIT_INVALID, (board, err)


# --- the board configuration file (GitHub boards) -------------------------------------------


def _config_refused(document: object, tmp_path: Path) -> bool:
    """Whether the code refuses `document` as a board configuration file (InvalidInput)."""
    from execkit.dispatch import (
        DispatchConfig,
        GitHubConfig,
        GitHubProjectConfig,
        read_board_config,
    )
    from execkit.dispatch._gitlab import GitLabConfig
    from execkit.dispatch._jira import JiraConfig
    from execkit.dispatch._linear import LinearConfig

    path = tmp_path / "board-config.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    try:
        settings = read_board_config(path)
        GitHubConfig.from_mapping("acme/widgets", settings.get("github", {}), {})
        GitHubProjectConfig.parse("acme/1", settings.get("github_project", {}), {})
        LinearConfig.parse("ENG", settings.get("linear", {}), {})
        GitLabConfig.parse("acme/widgets", settings.get("gitlab", {}), {})
        JiraConfig.parse("ENG", settings.get("jira", {}), {"JIRA_URL": "https://x"})
        DispatchConfig.from_mapping(settings.get("dispatch", {}))
    except InvalidInput:
        return True
    return False


BAD_CONFIGS: dict[str, object] = {
    "not an object": [],
    "unknown top-level key": {"asana": {}},
    "unknown jira key": {"jira": {"colour": "red"}},
    "jira jql empty": {"jira": {"jql": ""}},
    "unknown linear key": {"linear": {"colour": "red"}},
    "linear eligible empty": {"linear": {"eligible": []}},
    "linear done empty": {"linear": {"done": ""}},
    "unknown gitlab key": {"gitlab": {"colour": "red"}},
    "gitlab label with a comma": {"gitlab": {"labels": {"done": "a,b"}}},
    "gitlab close_on_done not a boolean": {"gitlab": {"close_on_done": "yes"}},
    "github not an object": {"github": []},
    "unknown github key": {"github": {"colour": "red"}},
    "unknown label": {"github": {"labels": {"finished": "x"}}},
    "empty label": {"github": {"labels": {"done": ""}}},
    "label with a comma": {"github": {"labels": {"eligible": "a,b"}}},
    "label too long": {"github": {"labels": {"running": "x" * 51}}},
    "close_on_done not a boolean": {"github": {"close_on_done": "yes"}},
    "comments not a boolean": {"github": {"comments": 1}},
    "comments_max_chars zero": {"github": {"comments_max_chars": 0}},
    "comments_max_chars too large": {"github": {"comments_max_chars": 200001}},
    "api_url not http": {"github": {"api_url": "ftp://example"}},
    "unknown project key": {"github_project": {"columns": []}},
    "no eligible option": {"github_project": {"eligible": []}},
    "eligible not a list": {"github_project": {"eligible": "Todo"}},
    "empty option": {"github_project": {"terminal": [""]}},
    "done not a string": {"github_project": {"done": 3}},
    "unknown dispatch key": {"dispatch": {"speed": 3}},
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_board_config_the_schema_refuses_the_code_refuses(case: str, tmp_path: Path) -> None:
    document = BAD_CONFIGS[case]
    assert schema_errors("board-config", document), f"the schema accepts {case}"
    assert _config_refused(document, tmp_path), f"the code accepts {case}"


GOOD_CONFIGS: dict[str, object] = {
    "empty": {},
    "every github key": {
        "github": {
            "api_url": "https://ghe.example/api/v3",
            "labels": {"eligible": "a", "running": "b", "done": "c", "blocked": "d"},
            "close_on_done": True,
            "comments": True,
            "comments_max_chars": 200000,
        }
    },
    "every project key": {
        "github_project": {
            "api_url": "http://127.0.0.1:1",
            "status_field": "Stage",
            "eligible": ["Ready", "Again"],
            "terminal": ["Shipped"],
            "done": "Shipped",
            "failed": None,
        }
    },
    "dispatch settings": {"dispatch": {"max_attempts": 3, "failed_state": "none"}},
}


@pytest.mark.parametrize("case", sorted(GOOD_CONFIGS))
def test_a_board_config_the_schema_accepts_the_code_accepts(case: str, tmp_path: Path) -> None:
    document = GOOD_CONFIGS[case]
    assert schema_errors("board-config", document) == []
    assert not _config_refused(document, tmp_path)


def test_the_board_config_rules_only_the_code_can_check(tmp_path: Path) -> None:
    for document in (
        {"github": {"labels": {"done": "execkit"}}},  # two states, one label
        {"github": {"labels": {"done": "   "}}},
        {"github": {"comments_max_chars": 10.0}},
        {"github_project": {"failed": "Done"}},
        {"github_project": {"eligible": ["Done"]}},
        {"dispatch": {"failed_state": "done"}},
    ):
        assert schema_errors("board-config", document) == [], document
        assert _config_refused(document, tmp_path), document


# --- the documentation ------------------------------------------------------------------


def _json_blocks(markdown: str) -> Iterator[object]:
    for match in re.finditer(r"```json\n(.*?)```", markdown, re.DOTALL):
        yield json.loads(match.group(1))


def test_the_examples_in_formats_md_are_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = list(_json_blocks(FORMATS.read_text(encoding="utf-8")))
    board, github, linear, history, prices, usage, event = blocks
    # A notification event (issue #49) is what `render` sends for one, key for key.
    from execkit._notify import render
    from execkit.ledger import NotifyEvent

    assert isinstance(event, dict)
    sent = NotifyEvent(
        seq=1, id=event["id"], kind=event["kind"], subject=event["subject"],
        payload=event["data"], at=event["at"],
    )  # fmt: skip
    assert json.loads(render(sent, "json")) == event
    # The GitHub board's configuration file (issue #47) is read by the code that reads it.
    from execkit.dispatch import DispatchConfig
    from execkit.dispatch._github import GitHubConfig, read_board_config

    config_file = tmp_path / "board-config.json"
    config_file.write_text(json.dumps(github), encoding="utf-8")
    settings = read_board_config(config_file)
    assert GitHubConfig.from_mapping("acme/widgets", settings["github"], {}).comments
    DispatchConfig.from_mapping(settings["dispatch"])
    assert schema_errors("board-config", github) == []
    # The Linear board's configuration (issue #48), read by the code that reads it.
    from execkit.dispatch._linear import LinearConfig

    config_file.write_text(json.dumps(linear), encoding="utf-8")
    settings = read_board_config(config_file)
    assert LinearConfig.parse("ENG", settings["linear"], {}).running == "In Progress"
    assert schema_errors("board-config", linear) == []
    # The price file and a proof's usage (issue #45) are read by the code that reads them.
    price_file = tmp_path / "prices.json"
    price_file.write_text(json.dumps(prices), encoding="utf-8")
    assert "gpt-5" in load_prices({PRICES_ENV: str(price_file)}).models
    assert load_usage(usage) is not None
    assert schema_errors("board", board) == []
    code, err = _status_exit(board, tmp_path, capsys)
    assert code == 0 or (code == 4 and "no task for any issue" in err), err
    assert schema_errors("attempt-history", history) == []
    path = tmp_path / "history.json"
    path.write_text(json.dumps(history), encoding="utf-8")
    assert main(["decide", "--history", str(path), "--now", "1735700000"]) == 0
    capsys.readouterr()


def test_kept_output_is_described_as_spawn_keeps_it() -> None:
    # The notice a binary tail is kept as, and the limits, read as the code has them.
    text = FORMATS.read_text(encoding="utf-8")
    section = text[text.index("## Kept output") : text.index("## The ledger storage")]
    assert f"`{BINARY_NOTICE.format('N')}`" in section
    assert f"at most {MAX_TAIL_BYTES >> 20} MiB" in section
    assert f"up to {REDACT_CONTEXT >> 10} KiB before the cut" in section
    assert "more than a quarter of the bytes" in section and _BINARY_SHARE == 4


DOCUMENTS = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

# A link or path that leaves the repository for the design notes it was built from, or
# names the machine it was written on.
OUTSIDE = re.compile(r"\.\./shared|(?<![\w.])/work/")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_documentation_stays_inside_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [m.group(0) for m in OUTSIDE.finditer(text)]
    assert found == [], f"{path.name} points outside the repository: {found}"
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def test_the_board_key_tables_name_every_key_the_code_reads() -> None:
    # `dispatch.default_adapter` (and the concurrency keys) were accepted by the schema and
    # `--help` but missing from the table; a new key must come with its row, and an issue
    # key with its words.
    import attrs

    from execkit.dispatch import BoardIssue, DispatchConfig

    text = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.MULTILINE))
    assert {field.name for field in attrs.fields(DispatchConfig)} <= rows
    issue_keys = {field.name for field in attrs.fields(BoardIssue)} - {"prompt"}
    for key in issue_keys | {"prompt", "body"}:
        assert f"`{key}`" in text, key
