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

from execkit._errors import Conflict, ExecKitError, InvalidInput, NotFound
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


# A board as a person writes one: tabs, arrays on one line, an unknown key first, keys in
# their own order, spaces around a colon, an escape and non-ASCII text, no final newline.
HAND_WRITTEN = (
    "{\n"
    '\t"owner": "ops-team",\n'
    '\t"states": ["icebox", {"name": "todo", "eligible": true},\n'
    '\t           {"name": "done", "terminal": true}, {"name": "blocked", "terminal": true}],\n'
    '\t"issues": [\n'
    '\t\t{"state": "todo", "id": "A", "title": "Caf\\u00e9 menu \u2014 fix", "argv": ["x"]},\n'
    '\t\t{ "id" : "B" , "title" : "b" , "state" : "todo" },\n'
    '\t\t{"id": "C",\n'
    '\t\t "state": "icebox"}\n'
    "\t],\n"
    '\t"dispatch": {"max_attempts": 4}\n'
    "}"
)


def test_a_move_changes_only_the_moved_value_of_a_hand_written_board(tmp_path: Path) -> None:
    # Issue 44, item 16: every move rewrote the whole file (re-indented, keys reordered
    # by nothing but json.dump, the escapes undone) and the first pass added a `ledger` key.
    path = tmp_path / "board.json"
    path.write_text(HAND_WRITTEN, encoding="utf-8")
    board = JsonFileBoard(path)
    assert board.move("A", "done")
    moved_a = HAND_WRITTEN.replace('{"state": "todo", "id": "A"', '{"state": "done", "id": "A"')
    assert path.read_text(encoding="utf-8") == moved_a
    # A give-up writes its column beside the state, in the object's own spacing...
    assert board.give_up("B", "blocked")
    assert path.read_text(encoding="utf-8") == moved_a.replace(
        '"state" : "todo" }', '"state" : "blocked" , "given_up_from" : "todo" }'
    )
    # ...and the next move takes it out again: the file is the one before the give-up.
    assert board.move("B", "todo")
    assert path.read_text(encoding="utf-8") == moved_a
    assert board.give_up("C", "blocked") and board.move("C", "icebox")
    assert path.read_text(encoding="utf-8") == moved_a
    # Binding a ledger writes beside the board, not into it.
    board.bind_ledger("L-1", "/srv/ledger.db")
    assert path.read_text(encoding="utf-8") == moved_a
    assert JsonFileBoard(path).ledger_binding() == ("L-1", "/srv/ledger.db")
    board.bind_ledger("L-1", "/srv/ledger.db")  # the same ledger again: nothing to do
    with pytest.raises(Conflict, match="belongs to ledger L-1"):
        board.bind_ledger("L-2", "/elsewhere.db")
    assert JsonFileBoard(path).ledger_binding() == ("L-1", "/srv/ledger.db")
    assert path.read_text(encoding="utf-8") == moved_a


def test_a_board_bound_in_the_file_keeps_its_binding(tmp_path: Path) -> None:
    # Boards bound before the binding moved beside the file keep theirs, and win.
    path = write_board(
        tmp_path / "board.json",
        [{"id": "A", "title": "a", "state": "todo"}],
        ledger={"id": "L-old", "location": "/old.db"},
    )
    before = path.read_text()
    board = JsonFileBoard(path)
    assert board.ledger_binding() == ("L-old", "/old.db")
    board.bind_ledger("L-old", "/old.db")
    with pytest.raises(Conflict, match="belongs to ledger L-old"):
        board.bind_ledger("L-new", "/new.db")
    assert path.read_text() == before
    assert not (tmp_path / "board.json.ledger").exists()


def test_a_bad_binding_file_is_one_clear_error(tmp_path: Path) -> None:
    path = write_board(tmp_path / "board.json", [{"id": "A", "title": "a", "state": "todo"}])
    for junk in ("not json", "[1]", '{"id": 1, "location": "x"}'):
        (tmp_path / "board.json.ledger").write_text(junk)
        with pytest.raises(InvalidInput, match=r"board\.json\.ledger"):
            JsonFileBoard(path).ledger_binding()
        with pytest.raises(InvalidInput, match=r"board\.json\.ledger"):
            JsonFileBoard(path).bind_ledger("L-1", "/x.db")


_ISSUE_KEYS = ("id", "title", "state", "prompt", "argv")
_STATE_NAMES = ("todo", "doing", "done", "blocked", "Ünïcode \u2028 state")


@settings(max_examples=60, deadline=None)
@given(
    st.data(),
    st.lists(st.sampled_from(_STATE_NAMES), min_size=1, max_size=6),
    st.sampled_from([None, 0, 1, 2, 4, "\t"]),
    st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")]),
    st.booleans(),
)
def test_prop_moves_change_only_the_moved_values(
    data: st.DataObject,
    initial: list[str],
    indent: int | str | None,
    separators: tuple[str, str],
    ascii_only: bool,
) -> None:
    import tempfile

    states: list[object] = [
        {"name": "todo", "eligible": True},
        "doing",
        {"name": "done", "terminal": True},
        {"name": "blocked", "terminal": True},
        "Ünïcode \u2028 state",
    ]
    issues = []
    for n, state in enumerate(initial):
        full = {"id": f"I-{n}", "title": f't\\{n} "q"', "state": state, "prompt": "p", "argv": []}
        keys = data.draw(st.permutations(_ISSUE_KEYS))
        kept = [k for k in keys if k in ("id", "state") or data.draw(st.booleans())]
        issues.append({k: full[k] for k in kept})
    doc = {"x-first": [1, {"nested": "}"}], "states": states, "issues": issues, "x-last": None}
    text = json.dumps(doc, indent=indent, separators=separators, ensure_ascii=ascii_only)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "board.json"
        path.write_text(text, encoding="utf-8")
        board = JsonFileBoard(path)
        model = json.loads(text)
        ops = data.draw(
            st.lists(
                st.tuples(
                    st.booleans(),
                    st.integers(0, len(issues) - 1),
                    st.sampled_from(_STATE_NAMES),
                ),
                max_size=8,
            )
        )
        for give_up, index, target in ops:
            raw = model["issues"][index]
            if give_up:
                assert board.give_up(raw["id"], target)
                raw["given_up_from"] = raw["state"]
            else:
                assert board.move(raw["id"], target)
                raw.pop("given_up_from", None)
            raw["state"] = target
            after = path.read_text(encoding="utf-8")
            assert json.loads(after) == model
        # Every issue moved back where it stood: the file is the one written.
        for index, state in enumerate(initial):
            assert board.move(f"I-{index}", state)
        assert path.read_text(encoding="utf-8") == text
