"""Whole dispatches against a vendor that recovers by itself (issues 51 and 52).

    python tests/vendors/scenes.py list                      # the scenes
    python tests/vendors/scenes.py record [--only KEY ...]   # the real CLIs (node, minutes)
    python tests/vendors/scenes.py replay [--only KEY ...]   # the recordings (Python only)

A **scene** is what an operator meets: the real `execkit dispatch --concurrency 4
--until-idle` over a 12-issue JSON board, every issue on one vendor CLI, while the scene
vendor (scene_api.py: the loopback fake API on a timeline) goes through phases by itself:
a usage limit that lifts at the reset it stated, some seconds of 529 overload (no reset
stated), or a 401 that lasts until an operator renews the credentials and runs `execkit
lane resume` (then a second `--until-idle` run). The scene's clock starts at the vendor's
first model call (a codex limit's, at the wall-clock second its minute needs). Every call
of the CLI, every request the vendor saw (its time and phase), the dispatcher's output and
the ledger's facts are kept.

`record` runs the real claude-code, codex and gemini (tests/vendors/node_modules; `python
tests/vendors/clis.py install`) through a wrapper that keeps each call's bytes
(scene_standin.py) and writes `fixtures/recorded/scenes/<cli>/<scene>/`: `scene.json`
(the scene, the dispatcher runs with their output, the operator's actions, every call's
times and phases, the vendor's request log and the facts), `replay.json` and `calls/`
(what a stand-in replays, scrubbed of machine paths, ports and keys as record.py does).

`replay` runs the same scene with the stand-ins (scene_standin.py) on a timeline shrunk by
`SCALE` (a 40 s limit lifts after 4 s; the board's backoffs, the dispatcher's pass
interval, the lane breaker's times and the run timeout shrink alike), so the whole thing
runs in `make test` (tests/test_vendor_scenes.py) and in `benchmarks/bench_scenes.py`.

Codex prints a reset as a local clock time rounded down to the minute, so where in its
minute the reset falls matters: a recording waits for the wall clock to reach the second
it needs; a replay instead sets the dispatcher's (and the stand-in's) time zone to one
whose offset has seconds (`TZ=SCN-0:00:37`: POSIX allows it, glibc and Python honour it)
so the replay's reset falls at the same place in the local minute without waiting.

Facts (`Facts`), each from the vendor's log and the ledger, never from timing asserts:
the vendor calls per phase (an attempt is counted once, in the phase of its first
request), the charged failures, the issues done and blocked (and on what), the attempts
in flight when the first refusal was recorded and the attempts admitted before the lane
closed (those and any admitted after the first refusal: issue 51.3), the calls that
arrived before the vendor's reset from attempts admitted after the first refusal (issue
52.1: probes before the reset), how each `--until-idle` run ended (issue 51.2), and the
time from the vendor's recovery to its first successful call (a figure for the README,
never asserted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from fake_api import SCENARIOS  # noqa: E402
from record import Scrubber, base_env  # noqa: E402
from scene_api import ISSUE_MARK, Phase, SceneVendor, Timeline  # noqa: E402
from scene_standin import SLEEP_NOTICE, write_standin, write_wrapper  # noqa: E402
from setups import GATEWAY_TOKEN, KEYS, SETUPS, VENDOR_OF, Sandbox  # noqa: E402

REPO = HERE.parent.parent
SCENES_DIR = REPO / "fixtures" / "recorded" / "scenes"

ISSUES = 12
CONCURRENCY = 4
PROMPT = "Reply with one short sentence."
# A replay runs the recorded timeline this much faster (every time the scene sets).
SCALE = 0.1
# What an operator's defaults are, at the recorded scale; a replay shrinks them by SCALE.
BASE_BACKOFF_S = 10.0
MAX_BACKOFF_S = 300.0
PASS_INTERVAL_S = 10.0
LANE_TIMES = {"cool_base": 30.0, "cool_max": 1800.0, "breaker_window": 60.0}
# How long a dispatcher may keep running once its only lane is stopped before the scene
# takes it for one that would never end (issue 51.2): three passes and some.
STOP_GRACE_PASSES = 4
# No scene runs longer than this (recorded scale); a replay gets it times SCALE, and at
# least REPLAY_CAP_S, since a busy machine slows the processes, not the timeline.
SCENE_CAP_S = 900.0
REPLAY_CAP_S = 120.0
# How long before an aligned replay's start its dispatcher is started (the vendor holds the
# calls that come before the start).
REPLAY_WARMUP_S = 4.0
# Each call kept for replay per phase (a fixture stays small; the rest keep their times).
KEPT_PER_PHASE = 4

Trouble = Literal["limit", "overloaded", "credentials"]
Align = Literal["in_minute", "later_in_minute", "on_minute"]
_STEP: dict[str, str] = {
    "limit": "usage_limit",
    "overloaded": "overloaded_529",
    "credentials": "auth_401",
}
# Where codex's reset falls in its local minute and how long before it the scene starts:
# (second, lead) recorded, then replayed. A replay's lead is short, so its reset "later in
# the minute" is 2 s into the next minute where the recording's is 30 s in.
_ALIGN: dict[str, tuple[int, float, int, float]] = {
    # the printed minute is the current one: a time already past when codex prints it
    "in_minute": (52, 40.0, 57, 5.0),
    # the next minute, some seconds in: codex prints that minute, the seconds early
    "later_in_minute": (30, 40.0, 2, 5.0),
    # exactly on the next minute: printed as it is
    "on_minute": (0, 40.0, 0, 5.0),
}


@dataclass(frozen=True)
class Scene:
    """One scene: a CLI, the vendor's trouble and how long it lasts (recorded scale;
    None: until the operator fixes it), and how the CLI is set up."""

    cli: str
    name: str
    description: str
    trouble: Trouble
    trouble_s: float | None
    align: Align | None = None
    # gemini's `general.maxAttempts` (setups.py writes 2, as docs/vendors.md sets it)
    max_attempts: int | None = None
    # `execkit dispatch --timeout` (recorded scale)
    timeout_s: float | None = None
    # the fake_api scenario setups.py configures the CLI for (its sign-in, its argv)
    setup: str = "success"
    # extra arguments on every board issue (the issue's own `argv`)
    argv: tuple[str, ...] = ()
    # whether the CLI prints the limit's reset at all (claude to an API key does not)
    prints_reset: bool = True

    @property
    def key(self) -> str:
        return f"{self.cli}/{self.name}"

    @property
    def vendor(self) -> str:
        return VENDOR_OF[self.cli]

    def timeline(self, scale: float = 1.0) -> Timeline:
        step = _STEP[self.trouble]
        if self.trouble_s is None:
            trouble = Phase(self.trouble, step, operator=True)
        else:
            trouble = Phase(self.trouble, step, until_s=self.trouble_s * scale)
        return Timeline((trouble, Phase("ok", "success")))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "key": self.key, "timeline": self.timeline().to_dict()}


# claude: the gateway sign-in with `--output-format stream-json --verbose` on every issue
# (the only claude output that states a reset in structure: its `rate_limit_event`), and
# once with an API key (no reset in any format). The argv is explicit on each issue so
# the recording does not depend on the adapter's default.
_CLAUDE_ARGV = ("--output-format", "stream-json", "--verbose")
SCENES: tuple[Scene, ...] = (
    Scene(
        "claude",
        "usage_limit",
        "a usage limit whose reset is 40 s away, lifted by the vendor at the reset",
        "limit",
        40.0,
        setup="usage_limit_gateway",
        argv=_CLAUDE_ARGV,
    ),
    Scene(
        "claude",
        "usage_limit_api_key",
        "the same usage limit to an API key: claude prints no reset in any output format "
        "(issue 51.7), so nothing parks the lane",
        "limit",
        40.0,
        argv=_CLAUDE_ARGV,
        prints_reset=False,
    ),
    Scene(
        "claude",
        "overloaded",
        "20 s of 529 overloaded, no reset stated",
        "overloaded",
        20.0,
        setup="usage_limit_gateway",
        argv=_CLAUDE_ARGV,
    ),
    Scene(
        "claude",
        "credentials",
        "401 until an operator renews the credentials and runs `execkit lane resume`",
        "credentials",
        None,
        setup="usage_limit_gateway",
        argv=_CLAUDE_ARGV,
    ),
    Scene(
        "codex",
        "usage_limit_in_minute",
        "a usage limit whose reset falls inside the current minute (codex prints a time "
        "already past)",
        "limit",
        40.0,
        align="in_minute",
    ),
    Scene(
        "codex",
        "usage_limit_later_in_minute",
        "a usage limit whose reset is 30 s into the next minute (codex prints it 30 s early)",
        "limit",
        40.0,
        align="later_in_minute",
    ),
    Scene(
        "codex",
        "usage_limit_on_minute",
        "a usage limit whose reset is exactly on the next minute",
        "limit",
        40.0,
        align="on_minute",
    ),
    Scene("codex", "overloaded", "20 s of 529 overloaded, no reset stated", "overloaded", 20.0),
    Scene(
        "codex",
        "credentials",
        "401 until an operator renews the credentials and runs `execkit lane resume`",
        "credentials",
        None,
    ),
    Scene(
        "gemini",
        "usage_limit_attempts_1",
        "a per-minute quota whose reset is 40 s away, general.maxAttempts = 1",
        "limit",
        40.0,
        max_attempts=1,
    ),
    Scene(
        "gemini",
        "usage_limit_attempts_2",
        "a per-minute quota whose reset is 40 s away, general.maxAttempts = 2 (gemini "
        "sleeps out the delay itself)",
        "limit",
        40.0,
        max_attempts=2,
    ),
    Scene(
        "gemini",
        "usage_limit_past_timeout",
        "a per-minute quota whose reset is 90 s away, longer than the run timeout (45 s), "
        "general.maxAttempts = 2",
        "limit",
        90.0,
        max_attempts=2,
        timeout_s=45.0,
    ),
    Scene("gemini", "overloaded", "20 s of 529 overloaded, no reset stated", "overloaded", 20.0),
    Scene(
        "gemini",
        "credentials",
        "401 until an operator renews the credentials and runs `execkit lane resume`",
        "credentials",
        None,
    ),
)
SCENE_BY_KEY: dict[str, Scene] = {scene.key: scene for scene in SCENES}


def select(only: Sequence[str]) -> list[Scene]:
    """The scenes named by CLI, scene key (`codex/overloaded`) or scene name."""
    return [s for s in SCENES if not only or s.cli in only or s.key in only or s.name in only]


# --------------------------------------------------------------------------- the board


def issue_id(number: int) -> str:
    return f"S-{number}"


def board(scene: Scene, scale: float) -> dict[str, Any]:
    """The 12-issue board: each issue's prompt names it (the vendor's log ties a call to
    its issue), and carries the scene's explicit argv."""
    issues = []
    for number in range(1, ISSUES + 1):
        issue: dict[str, Any] = {
            "id": issue_id(number),
            "title": f"scene issue {number}",
            "state": "todo",
            "prompt": f"{PROMPT} ({ISSUE_MARK}{issue_id(number)})",
        }
        if scene.argv:
            issue["argv"] = list(scene.argv)
        issues.append(issue)
    return {
        "states": [
            {"name": "todo", "eligible": True},
            {"name": "done", "terminal": True},
            {"name": "blocked", "terminal": True},
        ],
        "issues": issues,
        "dispatch": {
            "base_backoff_s": BASE_BACKOFF_S * scale,
            "max_retry_backoff_s": MAX_BACKOFF_S * scale,
        },
    }


# --------------------------------------------------------------------------- a run


@dataclass
class DispatchRun:
    """One `execkit dispatch --until-idle` process: its argv (scrubbed), when it started
    and ended (epoch), how (`exit_code`; `stopped_by_scene`: it had not ended when the
    scene stopped it), and its output lines (`[t since the scene start, stream, text]`)."""

    argv: list[str]
    started: float
    ended: float | None = None
    exit_code: int | None = None
    stopped_by_scene: bool = False
    lines: list[list[Any]] = field(default_factory=list)


@dataclass
class SceneRun:
    """Everything one run of a scene left: the vendor's calls, the ledger's runs, lanes
    and tasks, the dispatcher runs and the operator's actions (times are epoch seconds)."""

    scene: Scene
    mode: str
    start: float
    recovered_at: float | None
    resets: list[float]
    calls: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    tasks: dict[str, dict[str, Any]]
    runs: list[dict[str, Any]]
    lanes: list[dict[str, Any]]
    lane_events: list[dict[str, Any]]
    dispatches: list[DispatchRun]
    operator: list[dict[str, Any]]
    port: int = 0
    tz: str | None = None


def _ledger_facts(db: Path) -> tuple[Any, ...]:
    """Tasks, runs, lanes and lane events (with when each lane stopped admitting) from the
    ledger the scene's dispatcher wrote."""
    from execkit._lanes import fold, view
    from execkit.ledger import open_ledger

    tasks: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    lanes: list[dict[str, Any]] = []
    lane_events: list[dict[str, Any]] = []
    now = time.time()
    with open_ledger(db) as ledger:
        config = ledger.lane_config()
        for task in ledger.list_tasks(now=now):
            # The dispatcher titles a board issue's task after its id (`board:S-1`).
            key = task.title.removeprefix("board:")
            tasks[key] = {
                "status": str(task.status),
                "state": str(task.state),
                "blocked_on": None if task.blocked_on is None else str(task.blocked_on),
                "charged_attempts": task.charged_attempts,
                "attempts_started": task.attempts_started,
                "uncharged_streak": task.uncharged_streak,
                "reason": task.reason,
            }
            for run in ledger.runs(task.id):
                runs.append(
                    {
                        "issue": key,
                        "attempt": run.attempt,
                        "status": str(run.status),
                        "class": None if run.failure_class is None else str(run.failure_class),
                        "reason": run.reason,
                        "started_at": run.started_at,
                        "ended_at": run.ended_at,
                        "forced": run.forced,
                        "not_before": run.not_before,
                    }
                )
        for lane in ledger.list_lanes(now=now):
            lanes.append({"lane": lane.lane, "state": str(lane.state)})
            events = ledger.lane_history(lane.lane)
            for index, event in enumerate(events):
                summary = fold(lane.lane, events[: index + 1], config)
                entry = event.to_dict()
                entry["admits_after"] = view(summary, event.at).admits
                lane_events.append(entry)
    return tasks, runs, lanes, lane_events


class _Output:
    """Reads a dispatcher's two streams into its `lines`, each with its time."""

    def __init__(self, proc: subprocess.Popen[bytes], run: DispatchRun) -> None:
        self._threads = [
            threading.Thread(target=self._read, args=(stream, name, run), daemon=True)
            for stream, name in ((proc.stdout, "out"), (proc.stderr, "err"))
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _read(stream: Any, name: str, run: DispatchRun) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")
            run.lines.append([time.time(), name, text])

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=10)


class _Stage:
    """The folders, env and commands of one scene run (recorded or replayed)."""

    def __init__(self, scene: Scene, mode: str, root: Path, scale: float) -> None:
        self.scene = scene
        self.mode = mode
        self.scale = scale
        self.box = Sandbox(root)
        self.db = root / "ledger.db"
        self.board = root / "board.json"
        self.bin = root / "bin"
        self.capture = root / "capture"
        self.env: dict[str, str] = {}
        self.setup_files: dict[str, str] = {}

    def execkit(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "execkit", *args]

    def dispatch_argv(self) -> list[str]:
        argv = self.execkit(
            "dispatch",
            "--board",
            str(self.board),
            "--db",
            str(self.db),
            "--adapter",
            self.scene.cli,
            "--concurrency",
            str(CONCURRENCY),
            "--until-idle",
        )
        if self.scale != 1.0:
            argv += ["--interval", f"{PASS_INTERVAL_S * self.scale:g}"]
        if self.scene.timeout_s is not None:
            argv += ["--timeout", f"{self.scene.timeout_s * self.scale:g}"]
        return argv

    def run_command(self, argv: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            argv,
            env=self.env,
            cwd=self.box.work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=False,
        )


def _setup(stage: _Stage, url: str) -> None:
    """The CLI's env and config files (setups.py), the scene's own changes to them."""
    scene = stage.scene
    setup = SETUPS[scene.cli](stage.box, url, SCENARIOS[scene.setup])
    if scene.max_attempts is not None:
        path = stage.box.home / ".gemini" / "settings.json"
        settings = json.loads(path.read_text(encoding="utf-8"))
        settings["general"]["maxAttempts"] = scene.max_attempts
        text = json.dumps(settings, indent=2)
        path.write_text(text, encoding="utf-8")
        setup.files[str(path)] = text
    stage.setup_files = setup.files
    stage.env = {**base_env(stage.box, url, stage.bin), **setup.env}


def _wait_for_local_second(second: int, lead_s: float) -> float:
    """Sleep until `lead_s` before the next wall-clock moment whose local second is
    `second` (at least `lead_s` away); returns that moment (epoch)."""
    now = time.time()
    local = time.localtime(now)
    base = now - local.tm_sec - (now % 1)
    target = base + second
    while target - lead_s < now + 1.0:
        target += 60
    time.sleep(max(0.0, target - lead_s - time.time()))
    return target


def _tz_for_second(reset: int, second: int) -> tuple[str, int]:
    """A POSIX TZ (offset with seconds) under which `reset` (epoch) falls on `second` of
    its local minute, and its offset east of UTC in seconds."""
    offset = (second - reset % 60) % 60
    name = f"SCN-0:00:{offset:02d}" if offset else "SCN0"
    return name, offset


def run_scene(
    scene: Scene,
    mode: Literal["record", "replay"],
    *,
    recording: Path | None = None,
    real_binary: Path | None = None,
    scale: float | None = None,
    keep: Path | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> tuple[SceneRun, _Stage]:
    """Run `scene` once: `record` with the real CLI (`real_binary`), keeping its calls,
    or `replay` with the stand-in over `recording`. Returns the run and its stage (its
    folders are inside `keep`, which the caller removes; without `keep`, already gone)."""
    scale = (1.0 if mode == "record" else SCALE) if scale is None else scale
    root = keep or Path(tempfile.mkdtemp(prefix=f"execkit-scene-{scene.cli}-{scene.name}-"))
    stage = _Stage(scene, mode, root, scale)
    try:
        return _run(stage, recording, real_binary, log), stage
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _run(
    stage: _Stage, recording: Path | None, real: Path | None, log: Callable[[str], None]
) -> SceneRun:
    scene, scale = stage.scene, stage.scale
    stage.board.write_text(json.dumps(board(scene, scale), indent=2), encoding="utf-8")
    cap = SCENE_CAP_S if stage.mode == "record" else max(REPLAY_CAP_S, SCENE_CAP_S * scale)
    # The scene starts when the dispatcher does; a codex scene where its minute needs it.
    vendor = SceneVendor(scene.vendor, scene.timeline(scale), lifetime_s=cap + 120)  # type: ignore[arg-type]
    tz: str | None = None
    with vendor:
        _setup(stage, vendor.url)
        if stage.mode == "record":
            assert real is not None
            write_wrapper(stage.bin, scene.cli, real, stage.capture)
        else:
            assert recording is not None
            write_standin(stage.bin, scene.cli, recording)
            vendor.results_recorded = lambda issues: _results_recorded(stage.db, issues)
            stage.env["SCENE_VENDOR_URL"] = vendor.url
            stage.env["SCENE_TIME_SCALE"] = repr(scale)
            _scale_lanes(stage)
        # The scene starts at the vendor's first model call (a slow start of the dispatcher
        # does not eat a phase); a codex scene at a wall-clock time its minute needs.
        start: float | None = None
        if scene.align is not None:
            second, lead, replay_second, replay_lead = _ALIGN[scene.align]
            if stage.mode != "record":
                second, lead = replay_second, replay_lead
            if stage.mode == "record":
                reset = _wait_for_local_second(second, lead)
            else:
                # The dispatcher starts REPLAY_WARMUP_S early (a Python start-up on a busy
                # machine) and the vendor holds its first calls until the scene starts.
                reset = float(int(time.time() + REPLAY_WARMUP_S + lead + 1.0))
                tz, _ = _tz_for_second(int(reset), second)
                stage.env["TZ"] = tz
            start = reset - lead
            # The trouble lasts until the aligned reset, whatever the scene's own length.
            vendor.timeline = Timeline(
                (
                    Phase(scene.trouble, _STEP[scene.trouble], until_s=lead),
                    Phase("ok", "success"),
                )
            )
        vendor.restart(start)
        launched = time.time()
        log(f"{scene.key}: started ({stage.mode})")
        dispatches: list[DispatchRun] = []
        operator: list[dict[str, Any]] = []
        first = _dispatch(stage, cap, operator, log)
        dispatches.append(first)
        if scene.trouble == "credentials":
            # The operator renews the credentials, resumes the lane, and runs the
            # dispatcher again (the first one ended, or was stopped, while the lane was).
            vendor.fix()
            operator.append({"at": time.time(), "action": "credentials renewed"})
            _resume_lanes(stage, operator)
            dispatches.append(_dispatch(stage, cap, operator, log, last=True))
        calls = vendor.calls()
        requests = vendor.requests()
        start = vendor.start if vendor.start is not None else launched
        recovered_at = vendor.recovered_at()
        resets = [
            float(end)
            for index, end in enumerate(vendor.phase_ends())
            if end is not None and vendor.timeline.phases[index].step == "usage_limit"
        ]
    tasks, runs, lanes, lane_events = _ledger_facts(stage.db)
    return SceneRun(
        scene=scene,
        mode=stage.mode,
        start=start,
        recovered_at=recovered_at,
        resets=resets,
        calls=calls,
        requests=requests,
        tasks=tasks,
        runs=runs,
        lanes=lanes,
        lane_events=lane_events,
        dispatches=dispatches,
        operator=operator,
        port=vendor.port,
        tz=tz,
    )


def _scale_lanes(stage: _Stage) -> None:
    """A new ledger whose lane breaker's times are at the replay's scale (each at least
    its 1 s minimum), set as an operator would with `execkit lane config` (in-process:
    a command is a Python start-up of CPU)."""
    from execkit.ledger import open_ledger, user_name

    def seconds(value: float) -> float:
        return max(1.0, value * stage.scale)

    with open_ledger(stage.db) as ledger:
        ledger.set_lane_config(
            actor=user_name(os.geteuid()),
            cool_base_s=seconds(LANE_TIMES["cool_base"]),
            cool_max_s=seconds(LANE_TIMES["cool_max"]),
            breaker_window_s=seconds(LANE_TIMES["breaker_window"]),
        )


def _results_recorded(db: Path, issues: list[str]) -> bool:
    """Whether the latest run of each board issue in `issues` has its result."""
    from execkit.ledger import open_ledger

    with open_ledger(db) as ledger:
        by_title = {task.title: task.id for task in ledger.list_tasks()}
        for issue in issues:
            task_id = by_title.get(f"board:{issue}")
            runs = ledger.runs(task_id) if task_id is not None else []
            if runs and runs[-1].ended_at is None:
                return False
    return True


def _lane_stopped(db: Path) -> bool:
    from execkit.ledger import open_ledger

    if not db.exists():
        return False
    try:
        with open_ledger(db) as ledger:
            return any(str(lane.state) == "stopped" for lane in ledger.list_lanes())
    except Exception:  # a ledger being created or migrated: not yet
        return False


def _dispatch(
    stage: _Stage,
    cap: float,
    operator: list[dict[str, Any]],
    log: Callable[[str], None],
    *,
    last: bool = False,
) -> DispatchRun:
    """One `--until-idle` dispatcher, until it ends by itself; in a credentials scene,
    until it ends or has run `STOP_GRACE_PASSES` passes with its lane stopped (then the
    scene stops it, as cron's timeout would: issue 51.2)."""
    argv = stage.dispatch_argv()
    run = DispatchRun(argv=argv, started=time.time())
    proc = subprocess.Popen(
        argv,
        env=stage.env,
        cwd=stage.box.work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    output = _Output(proc, run)
    watch_stop = stage.scene.trouble == "credentials" and not last
    grace = STOP_GRACE_PASSES * PASS_INTERVAL_S * stage.scale + 2.0
    deadline = time.time() + cap
    stopped_since: float | None = None
    poll = 0.5 if stage.mode == "record" else 0.2
    try:
        while proc.poll() is None:
            now = time.time()
            if now > deadline:
                log(f"{stage.scene.key}: the dispatcher passed the scene's cap; stopping it")
                run.stopped_by_scene = True
                break
            if watch_stop:
                if stopped_since is None and _lane_stopped(stage.db):
                    stopped_since = now
                    operator.append({"at": now, "action": "saw the lane stop"})
                if stopped_since is not None and now - stopped_since > grace:
                    run.stopped_by_scene = True
                    break
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            # As an operator's Ctrl-C: the dispatcher drains (nothing is running then).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        output.join()
    run.ended = time.time()
    run.exit_code = proc.returncode
    if run.stopped_by_scene:
        operator.append({"at": run.ended, "action": "stopped the dispatcher (it had not ended)"})
    log(f"{stage.scene.key}: dispatcher ended {run.exit_code} (stopped: {run.stopped_by_scene})")
    return run


def _resume_lanes(stage: _Stage, operator: list[dict[str, Any]]) -> None:
    from execkit.ledger import open_ledger

    with open_ledger(stage.db) as ledger:
        stopped = [lane.lane for lane in ledger.list_lanes() if str(lane.state) == "stopped"]
    for lane in stopped:
        done = stage.run_command(stage.execkit("lane", "resume", lane, "--db", str(stage.db)))
        operator.append(
            {
                "at": time.time(),
                "action": f"execkit lane resume {lane}",
                "exit_code": done.returncode,
                "output": (done.stdout + done.stderr).decode("utf-8", "replace").strip(),
            }
        )


# --------------------------------------------------------------------------- the facts


@dataclass(frozen=True)
class Facts:
    """What a scene run says about the issues' invariants (see the module docstring)."""

    calls_by_phase: dict[str, int]
    requests_by_phase: dict[str, int]
    calls_in_trouble: int
    calls: int
    charged_failures: int
    done: int
    blocked: dict[str, int]
    in_flight_at_first_refusal: int | None
    calls_before_close: int | None
    lane_closed: bool
    calls_before_reset_after_refusal: int | None
    until_idle: list[dict[str, Any]]
    recovery_to_first_success_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _run_of(call: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ledger run a vendor call came from: the run of its issue running at its time."""
    at = float(call["at"])
    for run in runs:
        if run["issue"] != call.get("issue"):
            continue
        ended = run["ended_at"] if run["ended_at"] is not None else float("inf")
        if run["started_at"] - 0.001 <= at <= ended + 0.001:
            return run
    return None


def facts(run: SceneRun) -> Facts:
    main = [c for c in run.calls if not c.get("helper")]
    trouble = {p.name for p in run.scene.timeline().phases if p.step != "success"}
    requests_by_phase: dict[str, int] = {}
    for call in main:
        requests_by_phase[call["phase"]] = requests_by_phase.get(call["phase"], 0) + 1
    # An attempt (a CLI call) counts once, in the phase of its first request.
    first_of: dict[tuple[str, int], dict[str, Any]] = {}
    unmatched: list[dict[str, Any]] = []
    for call in main:
        owner = _run_of(call, run.runs)
        if owner is None:
            unmatched.append(call)
            continue
        first_of.setdefault((owner["issue"], owner["attempt"]), {**call, "run": owner})
    attempts = sorted(first_of.values(), key=lambda c: float(c["at"])) + unmatched
    calls_by_phase: dict[str, int] = {}
    for call in attempts:
        calls_by_phase[call["phase"]] = calls_by_phase.get(call["phase"], 0) + 1
    calls_in_trouble = sum(n for phase, n in calls_by_phase.items() if phase in trouble)
    tasks = run.tasks.values()
    done = sum(1 for t in tasks if t["status"] == "done")
    charged = sum(int(t["charged_attempts"]) for t in tasks) - done
    blocked: dict[str, int] = {}
    for task in tasks:
        if task["state"] == "blocked":
            on = str(task["blocked_on"])
            blocked[on] = blocked.get(on, 0) + 1
    refused = [r for r in run.runs if r["class"] in ("upstream", "environment") and r["ended_at"]]
    first_refusal = min((float(r["ended_at"]) for r in refused), default=None)
    in_flight: int | None = None
    before_close: int | None = None
    after_refusal: int | None = None
    closed_at = min(
        (float(e["at"]) for e in run.lane_events if not e["admits_after"]), default=None
    )
    if first_refusal is not None:
        in_flight = sum(
            1
            for r in run.runs
            if r["started_at"] <= first_refusal
            and (r["ended_at"] is None or r["ended_at"] >= first_refusal)
        )
        close = closed_at if closed_at is not None else float("inf")
        # The attempts the vendor got before the lane closed: those in flight when the
        # first refusal was recorded and those admitted after it, before the close.
        before_close = sum(
            1
            for r in run.runs
            if r["started_at"] < close and (r["ended_at"] is None or r["ended_at"] >= first_refusal)
        )
        if run.resets:
            after_refusal = sum(
                1
                for c in main
                if float(c["at"]) < max(run.resets)
                and (owner := _run_of(c, run.runs)) is not None
                and owner["started_at"] > first_refusal
            )
    recovery: float | None = None
    if run.recovered_at is not None:
        successes = [
            float(c["at"])
            for c in main
            if c.get("step") == "success" and float(c["at"]) >= run.recovered_at
        ]
        if successes:
            recovery = round(min(successes) - run.recovered_at, 3)
    until_idle = [
        {
            "exit_code": d.exit_code,
            "ended_by_itself": not d.stopped_by_scene,
            "lasted_s": None if d.ended is None else round(d.ended - d.started, 3),
        }
        for d in run.dispatches
    ]
    return Facts(
        calls_by_phase=calls_by_phase,
        requests_by_phase=requests_by_phase,
        calls_in_trouble=calls_in_trouble,
        calls=len(attempts),
        charged_failures=charged,
        done=done,
        blocked=blocked,
        in_flight_at_first_refusal=in_flight,
        calls_before_close=before_close,
        lane_closed=closed_at is not None,
        calls_before_reset_after_refusal=after_refusal,
        until_idle=until_idle,
        recovery_to_first_success_s=recovery,
    )


# --------------------------------------------------------------------------- recording


def _emits(
    raw: bytes, chunks: list[tuple[float, int]], scrub: Scrubber
) -> tuple[bytes, list[list[Any]]]:
    """One stream's recorded reads as line groups: `[t, start, end]` into the scrubbed
    bytes (scrubbing is line-local, so each group is scrubbed on its own)."""
    groups: list[tuple[float, bytes]] = []
    offset = 0
    pending = b""
    pending_t = 0.0
    for t, size in chunks:
        piece = raw[offset : offset + size]
        offset += size
        if not pending:
            pending_t = t
        pending += piece
        cut = pending.rfind(b"\n")
        if cut >= 0:
            groups.append((pending_t, pending[: cut + 1]))
            pending = pending[cut + 1 :]
            pending_t = t
    if offset < len(raw):
        pending += raw[offset:]
    if pending:
        groups.append((pending_t, pending))
    out = b""
    emits: list[list[Any]] = []
    for t, piece in groups:
        clean = scrub.bytes(piece)
        emits.append([t, len(out), len(out) + len(clean)])
        out += clean
    return out, emits


def _read_calls(capture: Path) -> list[dict[str, Any]]:
    calls = []
    for folder in sorted(p for p in capture.iterdir() if p.is_dir()):
        call = json.loads((folder / "call.json").read_text(encoding="utf-8"))
        call["name"] = folder.name
        call["folder"] = folder
        notes = [
            json.loads(line)
            for line in (folder / "chunks.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        call["notes"] = notes
        end = folder / "end.json"
        call["end"] = json.loads(end.read_text(encoding="utf-8")) if end.exists() else None
        calls.append(call)
    return calls


def write_recording(
    run: SceneRun, capture: Path, out: Path, scrub: Scrubber, version: str
) -> dict[str, Any]:
    """Write the scene's folder (see the module docstring); returns scene.json's value."""
    if out.exists():
        shutil.rmtree(out)
    (out / "calls").mkdir(parents=True)
    start = run.start
    requests = [c for c in run.calls if not c.get("helper")]
    index: list[dict[str, Any]] = []
    plan_phases: dict[str, list[str]] = {}
    by_issue: dict[str, dict[str, str]] = {}
    after: dict[str, list[str]] = {}
    trouble = {p.name for p in run.scene.timeline().phases if p.step != "success"}
    killed: dict[str, Any] | None = None
    for call in _read_calls(capture):
        mine = [
            r
            for r in requests
            if r.get("issue") == call["issue"]
            and call["start"] - 0.001 <= float(r["at"])
            and (call["end"] is None or float(r["at"]) <= call["end"]["end"] + 0.001)
        ]
        phases = [str(r["phase"]) for r in mine]
        got_signal = any("signal" in note for note in call["notes"])
        end = call["end"] or {"exit_code": None, "signal": 9, "end": None}
        if got_signal:
            killed = (
                {"ignores_sigterm": True}
                if call["end"] is None
                else {"exit_code": end["exit_code"], "signal": end["signal"]}
            )
        entry: dict[str, Any] = {
            "name": call["name"],
            "issue": call["issue"],
            "start_t": round(call["start"] - start, 3),
            "end_t": None if call["end"] is None else round(call["end"]["end"] - start, 3),
            "phases": phases,
            "requests": [{"t": r["t"], "phase": r["phase"], "status": r["status"]} for r in mine],
            "exit_code": end["exit_code"],
            "signal": end["signal"],
            "killed": got_signal,
            "stdout_bytes": (call["folder"] / "stdout").stat().st_size,
            "stderr_bytes": (call["folder"] / "stderr").stat().st_size,
        }
        index.append(entry)
        if not mine:
            continue
        t_request = float(mine[0]["at"]) - call["start"]
        phase = phases[0]
        kept = plan_phases.setdefault(phase, [])
        if len(kept) >= KEPT_PER_PHASE:
            continue
        kept.append(call["name"])
        by_issue.setdefault(phase, {}).setdefault(str(call["issue"]), call["name"])
        entry["kept"] = True
        if phase in trouble and call["end"] is not None:
            ended = float(call["end"]["end"])
            after[call["name"]] = _recorded_while(run.runs, call["issue"], call["start"], ended)
        _write_call(call, mine, t_request, end, out / "calls", scrub)
    plan = {
        "phases": plan_phases,
        "by_issue": by_issue,
        "after": after,
        "fallback": "ok" if "ok" in plan_phases else next(iter(plan_phases), "ok"),
        "killed": killed,
    }
    (out / "replay.json").write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
    the_facts = facts(run)
    document = {
        "scene": run.scene.to_dict(),
        "cli_version": version,
        "date": datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "start": start,
        "recovered_t": None if run.recovered_at is None else round(run.recovered_at - start, 3),
        "resets_t": [round(r - start, 3) for r in run.resets],
        "facts": the_facts.to_dict(),
        "dispatches": [
            {
                **{
                    k: v
                    for k, v in asdict(d).items()
                    if k not in ("argv", "lines", "started", "ended")
                },
                "argv": ["execkit", *d.argv[3:]],
                "started_t": round(d.started - start, 3),
                "ended_t": None if d.ended is None else round(d.ended - start, 3),
                "lines": [[round(at - start, 3), stream, text] for at, stream, text in d.lines],
            }
            for d in run.dispatches
        ],
        "operator": [_relative(action, start) for action in run.operator],
        "tasks": run.tasks,
        "runs": [_relative(r, start) for r in run.runs],
        "lanes": run.lanes,
        "lane_events": [_relative(e, start) for e in run.lane_events],
        "calls": index,
        "requests": [
            {k: v for k, v in r.items() if k not in ("at", "method", "model", "call")}
            for r in run.requests
        ],
    }
    scrubbed: dict[str, Any] = scrub.value(document)
    (out / "scene.json").write_text(json.dumps(scrubbed, indent=1) + "\n", encoding="utf-8")
    return scrubbed


def _recorded_while(runs: list[dict[str, Any]], issue: str, start: float, end: float) -> list[str]:
    """The other issues whose results the dispatcher recorded while a call of `issue` ran
    (from `start` to its CLI's `end`): a replay ends that call no sooner than those are
    recorded again, so results come in the order the dispatcher met them."""
    return sorted(
        {
            str(r["issue"])
            for r in runs
            if r["issue"] != issue and r["ended_at"] is not None and start < r["ended_at"] < end
        }
    )


def _relative(row: dict[str, Any], start: float) -> dict[str, Any]:
    out = dict(row)
    for key in ("started_at", "ended_at", "at", "until", "not_before"):
        if isinstance(out.get(key), int | float):
            out[key.removesuffix("_at") + "_t" if key.endswith("_at") else key + "_t"] = round(
                float(out.pop(key)) - start, 3
            )
    return out


def _write_call(
    call: dict[str, Any],
    mine: list[dict[str, Any]],
    t_request: float,
    end: dict[str, Any],
    folder: Path,
    scrub: Scrubber,
) -> None:
    """One kept call: its scrubbed streams and how to replay them (`head`, a `wait` and
    its `tails` when the CLI slept out the vendor's delay itself, the `end`)."""
    streams: dict[int, bytes] = {}
    timed: list[list[Any]] = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = (call["folder"] / name).read_bytes()
        chunks = [(float(n["t"]), int(n["n"])) for n in call["notes"] if n.get("fd") == fd]
        clean, emits = _emits(raw, chunks, scrub)
        streams[fd] = clean
        timed += [[t, fd, a, b] for t, a, b in emits]
        (folder / f"{call['name']}.{name}").write_bytes(clean)
    timed.sort(key=lambda e: e[0])
    # A CLI that announced a wait of its own: what it printed before it asked the vendor
    # again is the head, the rest (in the phase that request met) its tail. What a call
    # printed once it got a signal (a timeout) is printed by a stand-in when it gets one.
    signalled = min((float(n["t"]) for n in call["notes"] if "signal" in n), default=None)
    wait: dict[str, Any] | None = None
    retry_t = float("inf")
    for t, fd, a, b in timed:
        found = SLEEP_NOTICE.search(streams[fd][a:b])
        if not found:
            continue
        stated = re_suggested(streams[fd][a:b])
        jitter = int(found.group(1)) / 1000 / stated if stated else 1.0
        wait = {"announced_ms": int(found.group(1)), "jitter": round(jitter, 4)}
        later = [r for r in mine if float(r["at"]) - call["start"] > t]
        if later:
            retry_t = float(later[0]["at"]) - call["start"]
            wait["phase"] = str(later[0]["phase"])
        break
    cut = min(retry_t, signalled if signalled is not None else float("inf"))
    plan: dict[str, Any] = {
        "head": [[round(t - t_request, 4), fd, a, b] for t, fd, a, b in timed if t < cut],
        "end": {"exit_code": end["exit_code"], "signal": end["signal"]},
        "t_request": round(t_request, 4),
    }
    if wait is not None:
        plan["wait"] = wait
    if "phase" in (wait or {}):
        assert wait is not None
        tail = [[round(t - retry_t, 4), fd, a, b] for t, fd, a, b in timed if t >= retry_t]
        plan["tails"] = {wait["phase"]: tail}
        plan["tail_end"] = {wait["phase"]: plan["end"]}
    elif signalled is not None:
        plan["on_kill"] = [
            [round(t - signalled, 4), fd, a, b] for t, fd, a, b in timed if t >= signalled
        ]
        # Killed while it waited without a word: a stand-in waits too, until it is killed.
        plan["hang"] = wait is None
    (folder / f"{call['name']}.json").write_text(json.dumps(plan) + "\n", encoding="utf-8")


def re_suggested(line: bytes) -> float | None:
    """The vendor's delay a CLI repeats before its own wait (`Suggested retry after 24s`)."""
    import re

    found = re.search(rb"(?:Suggested retry after|retry in) (\d+(?:\.\d+)?)s", line)
    return float(found.group(1)) if found else None


def record(scenes: Sequence[Scene], out_root: Path = SCENES_DIR) -> int:
    """Record each scene with the real CLI; prints SKIP for a CLI that is not installed."""
    from clis import find_cli

    failures = 0
    for scene in scenes:
        cli = find_cli(scene.cli)
        if not cli.ok or cli.path is None:
            print(f"SKIP {scene.key}: {cli.missing}")
            continue
        root = Path(tempfile.mkdtemp(prefix=f"execkit-scene-{scene.cli}-{scene.name}-"))
        try:
            run, stage = run_scene(
                scene, "record", real_binary=cli.path, keep=root, log=lambda s: print(s, flush=True)
            )
            scrub = Scrubber(stage.box, [run.port], [*KEYS.values(), GATEWAY_TOKEN])
            target = out_root / scene.cli / scene.name
            document = write_recording(run, stage.capture, target, scrub, str(cli.version))
            print(f"{scene.key}: {summary_line(document['facts'])}", flush=True)
        except Exception as exc:  # one scene's failure does not lose the others
            failures += 1
            print(f"FAILED {scene.key}: {exc!r}", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


def summary_line(values: dict[str, Any]) -> str:
    blocked = ",".join(f"{k}:{v}" for k, v in values["blocked"].items()) or "0"
    rec = values["recovery_to_first_success_s"]
    return (
        f"calls {values['calls']} ({values['calls_in_trouble']} in trouble), "
        f"charged {values['charged_failures']}, done {values['done']}, blocked {blocked}, "
        f"recovery->success {rec if rec is None else f'{rec:.1f}s'}, "
        f"until-idle {[d['exit_code'] for d in values['until_idle']]}"
    )


# --------------------------------------------------------------------------- replay


def recording_of(scene: Scene, root: Path = SCENES_DIR) -> Path:
    return root / scene.cli / scene.name


def recorded_run(scene: Scene, root: Path = SCENES_DIR) -> SceneRun:
    """The run a recording kept (`scene.json`), its times counted from the scene's start:
    its facts are the live CLIs' (the recorded row beside a replayed one)."""
    document = json.loads((recording_of(scene, root) / "scene.json").read_text(encoding="utf-8"))

    def absolute(row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for key, value in row.items():
            if key.endswith("_t") and key not in ("start_t", "end_t"):
                name = key.removesuffix("_t")
                out[name if name in ("until", "not_before") else name + "_at"] = value
        if "at_at" in out:
            out["at"] = out.pop("at_at")
        return out

    calls = [{**r, "at": r["t"]} for r in document["requests"] if r["role"] == "model"]
    dispatches = [
        DispatchRun(
            argv=d["argv"],
            started=d["started_t"],
            ended=d["ended_t"],
            exit_code=d["exit_code"],
            stopped_by_scene=d["stopped_by_scene"],
            lines=d["lines"],
        )
        for d in document["dispatches"]
    ]
    recovered = document["recovered_t"]
    return SceneRun(
        scene=scene,
        mode="recorded",
        start=0.0,
        recovered_at=recovered,
        resets=list(document["resets_t"]),
        calls=calls,
        requests=document["requests"],
        tasks=document["tasks"],
        runs=[absolute(r) for r in document["runs"]],
        lanes=document["lanes"],
        lane_events=[absolute(e) for e in document["lane_events"]],
        dispatches=dispatches,
        operator=document["operator"],
    )


def replay(scene: Scene, *, root: Path = SCENES_DIR, scale: float | None = None) -> SceneRun:
    """Run `scene` against its recording's stand-in (Python only)."""
    run, _ = run_scene(scene, "replay", recording=recording_of(scene, root), scale=scale)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("list", "record", "replay"))
    parser.add_argument("--only", nargs="*", default=[], help="CLI, CLI/SCENE or SCENE")
    parser.add_argument("--out", type=Path, default=SCENES_DIR, help="recordings' folder")
    parser.add_argument("--json", action="store_true", help="replay: the facts as JSON")
    args = parser.parse_args(argv)
    scenes = select(args.only)
    if not scenes:
        parser.error(f"no scene matches {args.only}")
    if args.action == "list":
        for scene in scenes:
            print(f"{scene.key:<40} {scene.description}")
        return 0
    if args.action == "record":
        return record(scenes, args.out)
    results = {}
    for scene in scenes:
        result = facts(replay(scene, root=args.out)).to_dict()
        results[scene.key] = result
        if not args.json:
            print(f"{scene.key}: {summary_line(result)}", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
