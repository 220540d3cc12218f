"""Boards (in memory and JSON file) and `DispatchConfig` validation."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from _support import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from execkit._errors import ExecKitError, InvalidInput, NotFound
from execkit.dispatch import (
    BoardIssue,
    BoardState,
    DispatchConfig,
    GiveUpBoard,
    InMemoryBoard,
    JsonFileBoard,
    Tracker,
)

STATES = [
    {"name": "todo", "eligible": True},
    {"name": "in_progress", "eligible": True},
    {"name": "done", "terminal": True},
    {"name": "blocked", "terminal": True},
    "icebox",
]


def write_board(path: Path, issues: Sequence[Mapping[str, object]], **extra: object) -> Path:
    doc = {"states": STATES, "issues": [dict(issue) for issue in issues], **extra}
    path.write_text(json.dumps(doc))
    return path


def test_json_board_lists_eligible_issues_and_moves_atomically(tmp_path: Path) -> None:
    path = write_board(
        tmp_path / "board.json",
        [
            {"id": "A", "title": "a", "state": "todo", "body": "do a", "argv": ["x", "-y"]},
            {"id": "B", "title": "b", "state": "in_progress", "prompt": "do b"},
            {"id": "C", "title": "c", "state": "icebox"},
            {"id": "D", "title": "d", "state": "done"},
        ],
        owner="ops-team",
    )
    board = JsonFileBoard(path)
    assert isinstance(board, Tracker)
    assert [i.id for i in board.list_candidates()] == ["A", "B"]
    first = board.list_candidates()[0]
    assert (first.prompt, first.argv) == ("do a", ("x", "-y"))
    assert board.move("A", "blocked") is True
    assert [i.id for i in board.list_candidates()] == ["B"]
    saved = json.loads(path.read_text())
    assert saved["owner"] == "ops-team"  # unknown keys survive a rewrite
    assert saved["issues"][0]["state"] == "blocked"
    assert not list(tmp_path.glob("*.tmp"))  # the temp file was renamed into place
    # A fresh reader sees the move (the file is the state).
    assert JsonFileBoard(path).list_issues()[0].state == "blocked"


def test_json_board_refuses_unknown_states_and_issues(tmp_path: Path) -> None:
    path = write_board(tmp_path / "board.json", [{"id": "A", "title": "a", "state": "todo"}])
    board = JsonFileBoard(path)
    before = path.read_text()
    assert board.move("A", "nowhere") is False
    assert board.move("Z", "done") is False
    assert path.read_text() == before


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ({"states": [], "issues": []}, "states"),
        ({"states": ["todo"], "issues": []}, "eligible"),
        ({"states": STATES, "issues": [{"id": "A", "title": "a", "state": "gone"}]}, "gone"),
        ({"states": STATES, "issues": [{"id": "", "title": "a", "state": "todo"}]}, "id"),
        (
            {"states": STATES, "issues": [{"id": "A", "title": "a", "state": "todo", "argv": "x"}]},
            "argv",
        ),
        (
            {"states": STATES, "issues": [{"id": "A", "title": "a", "state": "todo", "x": 1}]},
            "unknown keys",
        ),
        (
            {
                "states": STATES,
                "issues": [
                    {"id": "A", "title": "a", "state": "todo"},
                    {"id": "A", "title": "b", "state": "todo"},
                ],
            },
            "duplicate",
        ),
        ({"states": [{"name": "x", "eligible": True, "terminal": True}]}, "both"),
        ({"states": STATES, "issues": [], "dispatch": []}, "dispatch"),
        ([1, 2], "object"),
    ],
)
def test_json_board_rejects_a_bad_file_naming_the_field(
    tmp_path: Path, doc: object, names: str
) -> None:
    path = tmp_path / "board.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidInput, match=names):
        JsonFileBoard(path)


def test_json_board_errors_for_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        JsonFileBoard(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidInput, match="not valid JSON"):
        JsonFileBoard(bad)


_MOVER = """
import sys
from execkit.dispatch import JsonFileBoard
board = JsonFileBoard(sys.argv[1])
for issue_id in sys.argv[2:]:
    assert board.move(issue_id, "done"), issue_id
"""

_READER = """
import sys, time
from execkit.dispatch import JsonFileBoard
board = JsonFileBoard(sys.argv[1])
deadline = time.time() + 60
reads = 0
while time.time() < deadline:
    states = [i.state for i in board.list_issues()]  # raises on a half-written file
    reads += 1
    if reads >= 20 and all(s == "done" for s in states):
        break
print(reads)
"""


def test_concurrent_moves_from_processes_are_never_lost_nor_half_seen(tmp_path: Path) -> None:
    issues = [{"id": f"I{n}", "title": "t", "state": "todo"} for n in range(24)]
    path = write_board(tmp_path / "board.json", issues, owner="ops-team")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start(code: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", code, str(path), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    reader = start(_READER)
    movers = [start(_MOVER, *(f"I{n}" for n in range(k, 24, 4))) for k in range(4)]
    for proc in [*movers, reader]:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert {i.state for i in JsonFileBoard(path).list_issues()} == {"done"}
    assert json.loads(path.read_text())["owner"] == "ops-team"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_move_keeps_the_board_file_permissions(tmp_path: Path) -> None:
    path = write_board(tmp_path / "board.json", [{"id": "A", "title": "a", "state": "todo"}])
    path.chmod(0o640)
    assert JsonFileBoard(path).move("A", "done")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_board_file_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    path = write_board(tmp_path / "board.json", [{"id": "A", "title": "a", "state": "todo"}])
    # The lock can't be opened (a folder sits at its name): an OSError even for root.
    (tmp_path / "board.json.lock").mkdir()
    with pytest.raises(ExecKitError, match="cannot write board file"):
        JsonFileBoard(path).move("A", "done")
    assert JsonFileBoard(path).list_issues()[0].state == "todo"


def test_create_round_trips(tmp_path: Path) -> None:
    issue = BoardIssue("A", "a", "todo", prompt="p", argv=["prog", "--flag"])
    board = JsonFileBoard.create(tmp_path / "b.json", [issue], dispatch={"max_attempts": 4})
    assert board.list_issues() == [issue]
    assert board.dispatch_settings() == {"max_attempts": 4}
    assert {s.name for s in board.states} == {"todo", "done", "blocked"}


def test_in_memory_board() -> None:
    board = InMemoryBoard([BoardIssue("A", "a", "todo")])
    assert isinstance(board, Tracker)
    assert board.move("A", "done") is True
    assert board.move("A", "nowhere") is False
    assert board.list_candidates() == []
    with pytest.raises(InvalidInput, match="duplicate"):
        board.add(BoardIssue("A", "again", "todo"))
    with pytest.raises(InvalidInput, match="unknown state"):
        board.add(BoardIssue("B", "b", "limbo"))
    with pytest.raises(NotFound):
        board.get("Z")
    with pytest.raises(InvalidInput, match="eligible"):
        InMemoryBoard([], [BoardState("done", terminal=True)])


def test_board_issue_validation() -> None:
    with pytest.raises(InvalidInput, match="single string"):
        BoardIssue("A", "a", "todo", argv="prog --flag")
    with pytest.raises(InvalidInput, match="only strings"):
        BoardIssue("A", "a", "todo", argv=["prog", 3])  # type: ignore[list-item]


# --- config --------------------------------------------------------------------------------


def test_config_defaults_follow_adr_015() -> None:
    config = DispatchConfig()
    assert (config.max_attempts, config.failed_state) == (10, "blocked")
    assert (config.base_backoff_s, config.max_retry_backoff_s) == (10, 300)
    assert config.cap.max_attempts == 10 and config.cap.capped
    assert (config.backoff.base_s, config.backoff.max_s) == (10.0, 300.0)


def test_negative_max_attempts_means_no_cap() -> None:
    assert not DispatchConfig(max_attempts=-1).cap.capped


@pytest.mark.parametrize("value", ["none", "None", "NONE", None])
def test_failed_state_none_in_a_config_file(value: object) -> None:
    assert DispatchConfig.from_mapping({"failed_state": value}).failed_state is None


@pytest.mark.parametrize(
    ("mapping", "names"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": "10"}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"failed_state": ""}, "failed_state"),
        ({"base_backoff_s": 0}, "base_backoff_s"),
        ({"base_backoff_s": float("inf")}, "base_backoff_s"),
        ({"base_backoff_s": 20, "max_retry_backoff_s": 10}, "max_retry_backoff_s"),
        ({"failed_state": "done"}, "differ"),
        ({"max_attemps": 3}, "unknown keys"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(mapping: dict[str, object], names: str) -> None:
    with pytest.raises(InvalidInput, match=names):
        DispatchConfig.from_mapping(mapping)


@settings(max_examples=50)
@given(st.integers(min_value=-(10**6), max_value=10**6).filter(lambda n: n != 0))
def test_cap_matches_the_sign_of_max_attempts(value: int) -> None:
    cap = DispatchConfig(max_attempts=value).cap
    assert cap.capped == (value > 0)
    if value > 0:
        assert cap.max_attempts == value


def test_a_give_up_keeps_the_column_on_the_card_and_the_next_move_drops_it(
    tmp_path: Path,
) -> None:
    path = write_board(tmp_path / "board.json", [{"id": "A", "title": "a", "state": "in_progress"}])
    board = JsonFileBoard(path)
    assert isinstance(board, GiveUpBoard)
    assert board.give_up("A", "blocked") is True
    assert json.loads(path.read_text())["issues"][0]["given_up_from"] == "in_progress"
    # A fresh reader (a restarted dispatcher) reads it back.
    assert JsonFileBoard(path).list_issues()[0].given_up_from == "in_progress"
    assert board.give_up("A", "nowhere") is False  # unknown state: nothing changes
    assert board.move("A", "in_progress") is True
    assert "given_up_from" not in json.loads(path.read_text())["issues"][0]
    memory = InMemoryBoard([BoardIssue("A", "a", "todo")])
    assert memory.give_up("A", "blocked") and memory.get("A").given_up_from == "todo"
    assert memory.move("A", "todo") and memory.get("A").given_up_from is None
    bad = write_board(tmp_path / "bad.json", [{"id": "A", "state": "todo", "given_up_from": 7}])
    with pytest.raises(InvalidInput, match="given_up_from"):
        JsonFileBoard(bad)
