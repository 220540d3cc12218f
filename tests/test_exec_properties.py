"""Properties of SpawnResult.failure_text: the text the upstream classifier reads (ADR 0046
reads the tail-preserving failure text), so its end must survive every cut."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from execkit._exec import SpawnResult, TreeMechanism

_CUT = "…"
_streams = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)


def _result(
    stderr: str,
    stdout: str,
    spawn_error: str | None,
    truncated: bool,
    mechanism: TreeMechanism | None = None,
) -> SpawnResult:
    return SpawnResult(
        argv=("codex",),
        pid=None if spawn_error else 7,
        exit_code=None if spawn_error else 1,
        signal=None,
        spawn_errno=2 if spawn_error else None,
        spawn_error=spawn_error,
        timed_out=False,
        duration_s=0.0,
        stdout_tail=stdout,
        stderr_tail=stderr,
        stdout_bytes=len(stdout.encode()) + (100 if truncated else 0),
        stderr_bytes=len(stderr.encode()) + (100 if truncated else 0),
        stdout_truncated=truncated,
        stderr_truncated=truncated,
        tree_mechanism=None if spawn_error else mechanism,
    )


@given(
    stderr=_streams,
    stdout=_streams,
    spawn_error=st.none() | st.text(min_size=1, max_size=30),
    truncated=st.booleans(),
    max_chars=st.integers(min_value=0, max_value=300),
)
def test_failure_text_keeps_the_end_and_marks_every_cut(
    stderr: str, stdout: str, spawn_error: str | None, truncated: bool, max_chars: int
) -> None:
    result = _result(stderr, stdout, spawn_error, truncated)
    whole = result.failure_text(10**6)
    text = result.failure_text(max_chars)
    assert len(text) <= max_chars
    if len(whole) <= max_chars:
        assert text == whole
    elif max_chars >= 1:
        assert text.startswith(_CUT) and whole.endswith(text[1:])
    # Order: spawn error, then stderr, then stdout; a stream cut at capture says so.
    pieces = [(spawn_error or "", False), (stderr.strip(), truncated), (stdout.strip(), truncated)]
    assert whole == "\n".join(_CUT + p if cut else p for p, cut in pieces if p)


@given(
    stderr=_streams,
    stdout=_streams,
    truncated=st.booleans(),
    mechanism=st.none() | st.sampled_from(TreeMechanism),
)
def test_to_dict_is_json_and_round_trips_every_field(
    stderr: str, stdout: str, truncated: bool, mechanism: TreeMechanism | None
) -> None:
    result = _result(stderr, stdout, None, truncated, mechanism)
    data = json.loads(json.dumps(result.to_dict()))
    assert data.pop("ok") is result.ok
    assert data["tree_mechanism"] == (None if mechanism is None else mechanism.value)
    data["argv"] = tuple(data["argv"])
    assert SpawnResult(**data) == result
