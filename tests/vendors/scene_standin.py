"""The two binaries a scene puts first on the dispatcher's PATH, named like the vendor CLI.

**Recording** (`write_wrapper`): a wrapper that runs the real CLI with the same arguments,
passes its bytes through as they come, and keeps a copy of each call in a capture folder,
`NNNN/`: `call.json` (argv, the issue its prompt names, when it started), `stdout`,
`stderr`, `chunks.jsonl` (each read: its time since the start, the stream, its length; a
signal the wrapper received) and `end.json` (when it ended, its exit code or signal).
execkit stops a call's whole process tree on timeout; the wrapper then waits for the CLI
to end and ends the same way, so a killed call's ending is recorded too (unless execkit
had to SIGKILL them both).

**Replay** (`write_standin`, Python only): a stand-in that, for each call, looks which
phase the scene vendor is in, picks a recorded call of that phase (the issue's own when it
was kept), waits that call's start-up before its first request, asks the vendor (`GET
/scene/call?issue=ID`, its model call: the phase then decides) and prints what the real
CLI printed in that phase (the call's bytes, read by its line groups, at its recorded pace
times the scene's time scale), with each reset the CLI stated rewritten to the replay's
timeline in the CLI's own format (`rewrite`), then ends as that call ended, no sooner
than the results the dispatcher had recorded before it ended are recorded here too
(`/scene/done`). A call that announced a wait of its own and slept it (gemini:
`Retrying after Nms...`) sleeps the rewritten wait, asks the vendor again and prints what
the CLI printed after its retry in the phase met; a call that was killed while it waited,
silent, waits until it is killed. On SIGTERM it prints what the killed call printed after
the signal and ends as a killed call of the recording ended. Its arguments are read only
for the issue its prompt names.

The recording a stand-in reads (scenes.py writes it): `replay.json` (for each phase the
calls to replay, and which issue each was; for each call of a trouble phase, the issues
whose results the dispatcher recorded while it ran; how a killed call ended) and
`calls/NNNN.{stdout,stderr,json}` (each call's streams, their reads' times, its delay
before its first request, how it ended).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import sys
import time

# A stand-in starts for every replayed call: it imports only what it needs (typing,
# pathlib, contextlib and subprocess would double its start-up). Type checkers take this
# name for `typing.TYPE_CHECKING`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

__all__ = ["rewrite", "standin_main", "wrap_main", "write_standin", "write_wrapper"]

HERE = os.path.dirname(os.path.realpath(__file__))
_ISSUE = re.compile(r"scene issue (S-\d{1,3})\b")
# A stand-in never lives longer than this, whatever a recording says.
MAX_LIFE_S = 600.0

# --------------------------------------------------------------------------- the scripts


def _launcher(python: str, call: str) -> str:
    return (
        f"#!{python} -IS\n"
        "# A scene binary (tests/vendors/scene_standin.py); do not edit.\n"
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import scene_standin\n"
        f"sys.exit(scene_standin.{call})\n"
    )


def write_wrapper(bin_dir: Path, name: str, real: Path, capture: Path) -> Path:
    """`bin_dir/name`: runs `real` with its arguments, keeping each call in `capture`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    capture.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    call = f"wrap_main({str(real)!r}, {str(capture)!r}, sys.argv[1:])"
    script.write_text(_launcher(sys.executable, call), encoding="utf-8")
    script.chmod(0o755)
    return script


def write_standin(bin_dir: Path, name: str, recording: Path) -> Path:
    """`bin_dir/name`: replays `recording` (a scene's folder); the vendor's URL and the
    time scale come from the environment (`SCENE_VENDOR_URL`, `SCENE_TIME_SCALE`)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    call = f"standin_main({str(recording)!r}, sys.argv[1:])"
    script.write_text(_launcher(sys.executable, call), encoding="utf-8")
    script.chmod(0o755)
    return script


# --------------------------------------------------------------------------- recording


def _new_call_dir(capture: Path) -> Path:
    for number in range(1, 100_000):
        folder = capture / f"{number:04d}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise RuntimeError(f"{capture}: no free call number")


def wrap_main(real: str, capture: str, argv: list[str]) -> int:
    """Run `real argv...`, pass its streams through and keep a copy (see the module)."""
    # Imported here: a replay stand-in, which starts for every call, needs none of them.
    import contextlib
    import selectors
    import subprocess
    from pathlib import Path

    folder = _new_call_dir(Path(capture))
    started = time.time()
    issue = next((m.group(1) for a in argv if (m := _ISSUE.search(a))), None)
    (folder / "call.json").write_text(
        json.dumps({"argv": argv, "issue": issue, "start": started, "pid": os.getpid()}),
        encoding="utf-8",
    )
    chunks = open(folder / "chunks.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def note(**fields: object) -> None:
        chunks.write(json.dumps({"t": round(time.time() - started, 4), **fields}) + "\n")
        chunks.flush()

    # The tree kill reaches the CLI itself: the wrapper only notes the signal and waits.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: note(signal=s))
    child = subprocess.Popen([real, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    outs = {
        child.stdout.fileno(): (1, open(folder / "stdout", "wb")),  # noqa: SIM115
        child.stderr.fileno(): (2, open(folder / "stderr", "wb")),  # noqa: SIM115
    }
    selector = selectors.DefaultSelector()
    for fd in outs:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    while outs:
        for key, _ in selector.select(timeout=1.0):
            fd = int(key.fd)
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                selector.unregister(fd)
                outs.pop(fd)[1].close()
                continue
            stream, copy = outs[fd]
            copy.write(data)
            copy.flush()
            note(fd=stream, n=len(data))
            with contextlib.suppress(OSError):  # execkit may have stopped reading
                _write_all(stream, data)
    code = child.wait()
    ended = {"end": time.time(), "exit_code": code if code >= 0 else None}
    ended["signal"] = -code if code < 0 else None
    (folder / "end.json").write_text(json.dumps(ended), encoding="utf-8")
    chunks.close()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(5)
        return 128 - code
    return code


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            done = os.write(fd, view)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        view = view[done:]


# --------------------------------------------------------------------------- resets


def _claude_clock(reset: float) -> str:
    """claude's prose reset: `4:38am`, or `1am` on the hour (local time)."""
    local = time.localtime(reset)
    hour = local.tm_hour % 12 or 12
    ampm = "am" if local.tm_hour < 12 else "pm"
    return f"{hour}{ampm}" if local.tm_min == 0 else f"{hour}:{local.tm_min:02d}{ampm}"


def _codex_clock(reset: float, now: float) -> str:
    """codex's `try again at` time: the local clock rounded down to the minute, with the
    date when it is not today (`Dec 4th, 2026 4:00 PM`)."""
    local = time.localtime(reset)
    hour = local.tm_hour % 12 or 12
    clock = f"{hour}:{local.tm_min:02d} {'AM' if local.tm_hour < 12 else 'PM'}"
    today = time.localtime(now)
    if (local.tm_year, local.tm_yday) == (today.tm_year, today.tm_yday):
        return clock
    day = local.tm_mday
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{time.strftime('%b', local)} {day}{suffix}, {local.tm_year} {clock}"


_CLAUDE_EPOCH = re.compile(rb'("resetsAt":)(\d{9,11})')
_CLAUDE_PROSE = re.compile(rb"(resets )(\d{1,2}(?::\d{2})?(?:am|pm))( \()")
_CODEX_AT = re.compile(
    rb"(try again at )((?:[A-Z][a-z]{2} \d{1,2}(?:st|nd|rd|th), \d{4} )?\d{1,2}:\d{2} [AP]M)"
)
_GEMINI_WAITS = (
    (re.compile(rb"(Please retry in )(\d+(?:\.\d+)?)(s)"), "s1"),
    (re.compile(rb"(Suggested retry after )(\d+)(s)"), "s0"),
    (re.compile(rb"(retryDelayMs: )(\d+)()"), "ms"),
    (re.compile(rb"""(retryDelay["']?: ?["'])(\d+)(s)"""), "s0"),
)
# A CLI's announcement that it sleeps out the vendor's delay itself before retrying.
SLEEP_NOTICE = re.compile(rb"Retrying after (\d+)ms")


def rewrite(data: bytes, reset: float | None, now: float, jitter: float = 1.0) -> bytes:
    """`data` with every reset a CLI printed restated as `reset` (epoch seconds), seen
    from `now`: claude's `resetsAt` and `resets 4:38am`, codex's `try again at 4:37 AM`,
    gemini's `Please retry in 24.0s`, `Suggested retry after 24s`, `retryDelayMs: 24000`,
    and its own sleep `Retrying after Nms` (the wait times `jitter`, its recorded share
    over the stated delay). Unchanged without a reset."""
    if reset is None:
        return data
    wait = max(0, math.ceil(reset) - math.floor(now))
    data = _CLAUDE_EPOCH.sub(lambda m: m.group(1) + str(int(reset)).encode(), data)
    data = _CLAUDE_PROSE.sub(
        lambda m: m.group(1) + _claude_clock(reset).encode() + m.group(3), data
    )
    data = _CODEX_AT.sub(lambda m: m.group(1) + _codex_clock(reset, now).encode(), data)
    for pattern, unit in _GEMINI_WAITS:
        value = {"s1": f"{wait}.0", "s0": str(wait), "ms": str(wait * 1000)}[unit].encode()
        data = pattern.sub(_keep_around(value), data)
    return SLEEP_NOTICE.sub(
        lambda m: b"Retrying after " + str(round(wait * 1000 * jitter)).encode() + b"ms", data
    )


def _keep_around(value: bytes) -> Callable[[re.Match[bytes]], bytes]:
    """A substitution that keeps a match's first and third groups around `value`."""

    def sub(match: re.Match[bytes]) -> bytes:
        return match.group(1) + value + match.group(3)

    return sub


# --------------------------------------------------------------------------- replay


def _ask(
    url: str, issue: str | None, *, look: bool = False, wait: list[str] | None = None
) -> dict[str, Any]:
    """The stand-in's model call: which phase the scene vendor is in now, and the reset it
    states; with `look`, only the phase, and no call; with `wait`, no call either, but an
    answer once those issues' results are recorded (raw HTTP/1.0 on a socket: `urllib`
    alone costs more than the rest of a stand-in's start)."""
    host, _, port = url.split("://", 1)[1].rstrip("/").partition(":")
    if wait:
        path = f"/scene/done?wait={','.join(wait)}"
    else:
        path = "/scene/phase" if look else f"/scene/call?issue={issue or ''}"
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        response = b""
        while chunk := conn.recv(65536):
            response += chunk
    _head, _, body = response.partition(b"\r\n\r\n")
    answer: dict[str, Any] = json.loads(body)
    return answer


class _Replay:
    def __init__(self, recording: str, argv: list[str]) -> None:
        self.recording = recording
        self.plan: dict[str, Any] = json.loads(_read(recording, "replay.json"))
        self.url = os.environ["SCENE_VENDOR_URL"]
        self.scale = float(os.environ.get("SCENE_TIME_SCALE", "1"))
        self.issue = next((m.group(1) for a in argv if (m := _ISSUE.search(a))), None)
        self.current: dict[str, Any] | None = None
        self.answer: dict[str, Any] = {}
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def pick(self, phase: str) -> dict[str, Any]:
        """The recorded call to replay for `phase`: this issue's own call in that phase
        when it was kept, else one of the phase's calls chosen by the issue's number (so
        the calls of one pass end at their recorded paces, in their recorded order)."""
        own = self.plan.get("by_issue", {}).get(phase, {}).get(self.issue)
        calls = self.plan["phases"].get(phase) or self.plan["phases"][self.plan["fallback"]]
        number = int(self.issue.split("-")[1]) if self.issue else 0
        name = own or calls[number % len(calls)]
        call: dict[str, Any] = json.loads(_read(self.recording, "calls", f"{name}.json"))
        call["name"] = name
        return call

    def play(self, call: dict[str, Any], emits: list[list[Any]], answer: dict[str, Any]) -> None:
        streams = {
            1: _read(self.recording, "calls", f"{call['name']}.stdout"),
            2: _read(self.recording, "calls", f"{call['name']}.stderr"),
        }
        asked = time.monotonic()
        for at, fd, start, end in emits:
            delay = asked + max(0.0, float(at)) * self.scale - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            data = rewrite(streams[fd][start:end], answer.get("reset"), time.time())
            try:
                _write_all(fd, data)
            except OSError:  # the dispatcher stopped reading (it killed the call)
                return

    def run(self) -> int:
        # The call this phase gets, then its own start-up before its first request (at
        # the recorded pace), then the request; a phase that changed meanwhile decides.
        phase = str(_ask(self.url, self.issue, look=True)["phase"])
        call = self.pick(phase)
        time.sleep(max(0.0, float(call["t_request"]) * self.scale - self.elapsed()))
        answer = self.answer = _ask(self.url, self.issue)
        if str(answer["phase"]) != phase:
            call = self.pick(str(answer["phase"]))
        self.current = call
        self.play(call, call["head"], answer)
        wait = call.get("wait")
        if wait is not None:
            # The CLI sleeps out the vendor's delay itself (its announcement says how
            # long, rewritten to this timeline; without a reset, a backoff of its own at
            # the recorded pace), then asks again.
            if answer.get("reset") is not None:
                until = max(0.0, math.ceil(answer["reset"]) - math.floor(time.time()))
                pause = until * float(wait["jitter"])
            else:
                pause = float(wait["announced_ms"]) / 1000 * self.scale
            time.sleep(min(pause, MAX_LIFE_S))
            answer = self.answer = _ask(self.url, self.issue)
            tails = call.get("tails", {})
            if str(answer["phase"]) in tails:
                self.play(call, tails[str(answer["phase"])], answer)
                return self.end(call, call["tail_end"].get(str(answer["phase"]), call["end"]))
            # No recording of what it printed after a retry in this phase: what a call
            # that met this phase printed.
            call = self.current = self.pick(str(answer["phase"]))
            self.play(call, call["head"], answer)
        elif call.get("hang"):
            time.sleep(MAX_LIFE_S)  # it waited, saying nothing more, until it was killed
        return self.end(call, call["end"])

    def end(self, call: dict[str, Any], ending: dict[str, Any]) -> int:
        """End as `ending` says, once the results the dispatcher had recorded before this
        call's CLI ended (in the recording) are recorded here too: replayed ten times
        faster, calls that ended seconds apart would otherwise end together, before the
        dispatcher could act on the first (the order issue 51.3 is about)."""
        after = self.plan.get("after", {}).get(call["name"])
        if after:
            _ask(self.url, self.issue, wait=after)
        return _end(ending)

    def killed(self, ending: dict[str, Any]) -> None:
        """SIGTERM (a timeout): print what the call printed once killed, end as it did."""
        if self.current is not None and self.current.get("on_kill"):
            self.play(self.current, self.current["on_kill"], self.answer)
        sys.exit(_end(ending))


def _read(*parts: str) -> bytes:
    with open(os.path.join(*parts), "rb") as file:
        return file.read()


def _end(end: dict[str, Any]) -> int:
    if end.get("signal") is not None:
        signum = int(end["signal"])
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(5)
        return 128 + signum
    return int(end.get("exit_code") or 0)


def standin_main(recording: str, argv: list[str]) -> int:
    """Replay one call of the scene recorded in `recording` (see the module docstring)."""
    replay = _Replay(recording, argv)
    killed = replay.plan.get("killed")
    if killed is not None:
        if killed.get("ignores_sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, lambda *_: replay.killed(killed))
    return replay.run()
