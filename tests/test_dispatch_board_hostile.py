"""Board files from hostile hands: bytes that are not UTF-8, absurd nesting, NULs in a
command, files others can write. One clear error each, never a traceback."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execkit._errors import ExecKitError, Forbidden, InvalidInput
from execkit.dispatch import BoardIssue, Dispatcher, JsonFileBoard, RunOutcome, Slot
from execkit.ledger import open_ledger

GOOD = {"states": [{"name": "todo", "eligible": True}, "done"], "issues": []}


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def test_bytes_that_are_not_utf8_are_one_clear_error(tmp_path: Path) -> None:
    board = write(tmp_path / "b.json", b'{"states": ["\xff\xfe"]}')
    with pytest.raises(InvalidInput, match="not UTF-8"):
        JsonFileBoard(board)


def test_a_100000_deep_board_is_refused_without_recursion(tmp_path: Path) -> None:
    board = write(tmp_path / "b.json", b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(InvalidInput, match="nests deeper"):
        JsonFileBoard(board)


def test_a_nul_in_a_board_argv_is_refused(tmp_path: Path) -> None:
    doc = {**GOOD, "issues": [{"id": "A", "state": "todo", "argv": ["tool\x00rm -rf /"]}]}
    board = write(tmp_path / "b.json", json.dumps(doc).encode())
    with pytest.raises(InvalidInput, match="NUL"):
        JsonFileBoard(board)


class Never:
    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        raise AssertionError("a board others can write must not run anything")


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_the_dispatcher_refuses_a_board_others_can_write(tmp_path: Path, mode: int) -> None:
    # Writing a board means running commands as the dispatcher, as ssh says of keys.
    doc = {**GOOD, "issues": [{"id": "A", "state": "todo", "argv": ["true"]}]}
    path = write(tmp_path / "b.json", json.dumps(doc).encode())
    path.chmod(mode)
    with open_ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(Forbidden, match="chmod"):
            Dispatcher(JsonFileBoard(path), Never(), ledger).tick()
        assert ledger.list_tasks() == []


def test_a_board_in_a_folder_others_can_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    path = write(shared / "b.json", json.dumps(GOOD).encode())
    shared.chmod(0o777)
    with open_ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(Forbidden, match="folder"):
            Dispatcher(JsonFileBoard(path), Never(), ledger).tick()
        shared.chmod(0o1777)  # sticky, like /tmp: others cannot replace our file
        assert Dispatcher(JsonFileBoard(path), Never(), ledger).tick() == []


def test_a_board_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    path = write(tmp_path / "b.json", json.dumps(GOOD).encode())
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    with open_ledger(tmp_path / "l.db") as ledger, pytest.raises(Forbidden, match="another"):
        Dispatcher(JsonFileBoard(path), Never(), ledger).tick()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    doc=st.one_of(
        _JSON,
        st.fixed_dictionaries({"states": _JSON, "issues": _JSON}),
        st.fixed_dictionaries(
            {"states": st.just(GOOD["states"]), "issues": st.lists(_JSON, max_size=3)}
        ),
    ),
    raw=st.binary(max_size=64),
    use_raw=st.booleans(),
)
def test_prop_any_board_file_reads_as_a_board_or_one_error(
    tmp_path: Path, doc: object, raw: bytes, use_raw: bool
) -> None:
    path = write(tmp_path / "fuzz.json", raw if use_raw else json.dumps(doc).encode())
    try:
        board = JsonFileBoard(path)
        board.list_issues()
        board.list_candidates()
        board.dispatch_settings()
    except ExecKitError as exc:
        assert exc.message
