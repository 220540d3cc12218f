"""Record the real vendor CLIs against the fake API: one directory per CLI x scenario.

    python tests/vendors/record.py                     # every cell into fixtures/recorded
    python tests/vendors/record.py --only claude:hang  # some cells (CLI, CLI:SCENARIO)
    python tests/vendors/record.py --check             # run live, compare with the recordings

Each cell starts a `FakeAPI` for the CLI's vendor, writes the CLI's config into a fresh
sandbox (HOME, config dirs, TMPDIR and the working directory all under one temp
directory), runs the adapter's argv (`CodexAdapter().build_argv(...)` and so on) with a
bounded timeout, and writes `fixtures/recorded/<cli>/<scenario>/`:

- `argv.json`: the adapter's argv (the binary by its bare name);
- `stdout`, `stderr`: the raw bytes, machine paths, ports and keys scrubbed;
- `meta.json`: exit code or signal, `timed_out`, duration, CLI version, date, scenario,
  the fake API's request log, the outside connections it refused, the env and config.

`--check` runs the same matrix into a temp directory and compares each cell's shape
(how it ended, the JSON shape of stdout, whether it reached the API) with the recording;
it prints SKIP and exits 0 when node, npm or the CLIs are missing. How each CLI is
pointed at the fake API is documented in tests/vendors/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from clis import (  # noqa: E402
    CLI,
    CLI_NAMES,
    PACKAGES,
    VERSIONS,
    find_cli,
    find_older,
    install_latest,
    node_bin_dir,
    write_versions,
)
from fake_api import SCENARIOS, FakeAPI, Scenario, dead_port  # noqa: E402
from setups import (  # noqa: E402
    GATEWAY_TOKEN,
    KEYS,
    SETUPS,
    TIMEOUT_S,
    VENDOR_OF,
    Sandbox,
    Setup,
    applies,
    output_argv,
)

REPO = HERE.parent.parent
RECORDED = REPO / "fixtures" / "recorded"

PROMPT = "Reply with one short sentence."
DEFAULT_TIMEOUT_S = 60.0
KILL_GRACE_S = 5.0
MAX_FILE_BYTES = 2 * 1024 * 1024
# A host name the resolver refuses before any query leaves this machine: its first label
# is longer than DNS allows (63), so no packet is ever sent for it.
DNS_FAILURE_HOST = "x" * 64 + ".invalid"
# CLIs that offer the model no tools: none of their chat calls is a helper call.
TOOL_LESS = frozenset({"aider", "llm"})


def base_env(box: Sandbox, sink_url: str, bin_dir: Path | None = None) -> dict[str, str]:
    """What every CLI gets: nothing from this machine but PATH to node and the sandbox."""
    dirs = [str(bin_dir) if bin_dir else None, node_bin_dir(), "/usr/local/bin", "/usr/bin", "/bin"]
    path = os.pathsep.join(filter(None, dirs))
    env = {
        "PATH": path,
        "HOME": str(box.home),
        "USER": "execkit",
        "LOGNAME": "execkit",
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        # Wall-clock resets (codex's `try again at 3:52 AM`) are printed in UTC, so a replay
        # reads them in the zone they were printed in (replay.recorded_zone).
        "TZ": "UTC",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        "TMPDIR": str(box.tmp),
        "XDG_CONFIG_HOME": str(box.home / ".config"),
        "XDG_DATA_HOME": str(box.home / ".local" / "share"),
        "XDG_CACHE_HOME": str(box.home / ".cache"),
        "XDG_STATE_HOME": str(box.home / ".local" / "state"),
        "NO_PROXY": "127.0.0.1,localhost,.invalid",
        "no_proxy": "127.0.0.1,localhost,.invalid",
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = sink_url
        env[name.lower()] = sink_url
    return env


# --------------------------------------------------------------------------- running a cell


@dataclass
class Outcome:
    stdout: bytes
    stderr: bytes
    exit_code: int | None
    signal: int | None
    timed_out: bool
    duration_s: float
    killed_with: str | None


def run_bounded(argv: Sequence[str], env: dict[str, str], cwd: Path, timeout_s: float) -> Outcome:
    """Run `argv` in its own session; on timeout SIGTERM its group, then SIGKILL."""
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    killed_with: str | None = None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        killed_with = "SIGTERM"
        _killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            killed_with = "SIGKILL"
            _killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
    # Whatever the leader left running in its group (a helper, a daemon) goes too.
    _killpg(proc.pid, signal.SIGKILL)
    duration = time.monotonic() - started
    code = proc.returncode
    return Outcome(
        stdout=out,
        stderr=err,
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        timed_out=timed_out,
        duration_s=duration,
        killed_with=killed_with,
    )


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def adapter_argv(cli: str, setup: Setup | None = None, output: str | None = None) -> list[str]:
    """The adapter's argv for the prompt, with what the cell's setup adds (a model, args)
    and, for a scenario that asks for another output mode, that mode instead of the
    adapter's (`setups.output_argv`)."""
    from execkit import AgentRequest, get_adapter

    model = setup.model if setup else None
    extra = setup.extra_args if setup else ()
    request = AgentRequest(prompt=PROMPT, model=model, extra_args=extra)
    return output_argv(cli, get_adapter(cli).build_argv(request), output)


# --------------------------------------------------------------------------- scrubbing


class Scrubber:
    """Replaces machine paths, ports, the host name and keys with stable placeholders."""

    def __init__(self, box: Sandbox, ports: Iterable[int], keys: Iterable[str]) -> None:
        pairs: list[tuple[str, str]] = [
            (str(box.home), "<HOME>"),
            (str(box.work), "<WORK>"),
            # Claude names its per-project memory folder after the path, every character
            # but a letter or digit (slashes, and a scenario name's underscores) a dash.
            (re.sub(r"[^A-Za-z0-9]", "-", str(box.work)), "-<WORK>"),
            (str(box.tmp), "<TMP>"),
            (str(box.root), "<SANDBOX>"),
            (str(REPO), "<REPO>"),
        ]
        for key in keys:
            pairs.append((key, "<KEY>"))
        host = socket.gethostname()
        if len(host) >= 4:
            pairs.append((host, "<HOSTNAME>"))
        # Longest first, so a sandbox path is replaced before the repo path inside it.
        pairs.sort(key=lambda pair: -len(pair[0]))
        self._literals = [(a.encode(), b.encode()) for a, b in pairs]
        port_alt = "|".join(str(p) for p in sorted(set(ports), reverse=True))
        hosts = rb"127\.0\.0\.1|localhost|\[::1\]|0\.0\.0\.0|" + re.escape(
            DNS_FAILURE_HOST.encode()
        )
        self._ports = re.compile(rb"(" + hosts + rb")(:|%3A)(" + port_alt.encode() + rb")\b")
        self._keys = re.compile(
            rb"(sk-(?:ant-(?:api03-)?)?test-[A-Za-z0-9*_-]+|AIzaSy[A-Za-z0-9_-]{10,})"
        )
        self._tmp_paths = re.compile(rb"/tmp/[A-Za-z0-9._-]+")
        self._work_paths = re.compile(rb"/work/[A-Za-z0-9._/-]+")

    def bytes(self, data: bytes) -> bytes:
        for literal, placeholder in self._literals:
            data = data.replace(literal, placeholder)
        data = self._ports.sub(rb"\1\2<PORT>", data)
        data = self._keys.sub(b"<KEY>", data)
        data = self._tmp_paths.sub(b"<TMP>", data)
        return self._work_paths.sub(b"<PATH>", data)

    def text(self, text: str) -> str:
        return self.bytes(text.encode()).decode()

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        return value


def collapse(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request log with each run of like requests (a retry loop) as one entry, `times`."""
    out: list[dict[str, Any]] = []
    previous: tuple[Any, ...] | None = None
    for entry in log:
        key = tuple(sorted((k, str(v)) for k, v in entry.items() if k != "call"))
        if key == previous:
            out[-1]["times"] = out[-1].get("times", 1) + 1
            continue
        out.append(dict(entry))
        previous = key
    return out


def cut(data: bytes, limit: int = MAX_FILE_BYTES) -> tuple[bytes, dict[str, Any] | None]:
    """The tail of `data` that fits `limit` bytes (the cause of a failure is at the end)."""
    if len(data) <= limit:
        return data, None
    kept = data[-limit:]
    return kept, {"original_bytes": len(data), "kept_bytes": len(kept), "kept": "tail"}


# --------------------------------------------------------------------------- one cell


@dataclass
class Cell:
    cli: str
    scenario: Scenario


def record_cell(cli: CLI, scenario: Scenario, out_root: Path) -> dict[str, Any]:
    """Run one cell and write its directory under `out_root`; returns its meta."""
    assert cli.path is not None
    # Outside the repository: a CLI walks up to the nearest git root and would see this one.
    root = Path(tempfile.mkdtemp(prefix=f"execkit-vendor-{cli.name}-{scenario.name}-"))
    try:
        return _record_in(cli, scenario, out_root, Sandbox(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _record_in(cli: CLI, scenario: Scenario, out_root: Path, box: Sandbox) -> dict[str, Any]:
    assert cli.path is not None
    timeout_s = scenario.timeout_s or TIMEOUT_S.get(cli.name, DEFAULT_TIMEOUT_S)
    vendor = VENDOR_OF[cli.name]
    started_at = datetime.now(UTC)
    dump_dir = os.environ.get("EXECKIT_FAKE_API_DUMP")  # debugging: keep request bodies
    if dump_dir:
        Path(dump_dir).mkdir(parents=True, exist_ok=True)
    lifetime_s = timeout_s + KILL_GRACE_S + 30
    # A chat call with no tools is a helper (a title call) except for the CLIs whose every
    # call is tool-less (aider, llm): theirs are the main calls.
    helpers = cli.name not in TOOL_LESS
    with FakeAPI(
        vendor, scenario, lifetime_s=lifetime_s, dump_dir=dump_dir, tool_less_helpers=helpers
    ) as api:
        ports = [api.port]
        base_url = api.url
        if scenario.endpoint == "refused":
            refused_port = dead_port()
            ports.append(refused_port)
            base_url = f"http://127.0.0.1:{refused_port}"
        elif scenario.endpoint == "dns":
            base_url = f"http://{DNS_FAILURE_HOST}:{api.port}"
        elif scenario.endpoint == "tls":
            base_url = f"https://127.0.0.1:{api.port}"
        setup = SETUPS[cli.name](box, base_url, scenario)
        argv = adapter_argv(cli.name, setup, scenario.output)
        setup.env.update(scenario.cli_env)
        env = {**base_env(box, api.url, cli.path.parent), **setup.env}
        outcome = run_bounded([str(cli.path), *argv[1:]], env, box.work, timeout_s)
        log = api.requests()
    scrub = Scrubber(box, ports, [*KEYS.values(), GATEWAY_TOKEN])
    stdout, stdout_cut = cut(scrub.bytes(outcome.stdout))
    stderr, stderr_cut = cut(scrub.bytes(outcome.stderr))
    model_calls = [entry for entry in log if entry["role"] == "model"]
    external = sorted({str(entry.get("host")) for entry in log if entry["role"] == "external"})
    meta: dict[str, Any] = {
        "cli": cli.name,
        "package": cli.package,
        "version": cli.version,
        "scenario": scenario.name,
        "description": scenario.description,
        "vendor_api": vendor,
        "steps": list(scenario.steps),
        "date": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        # When the CLI ended (epoch seconds): the clock a replay reads its stated resets by.
        "ended_at": round(started_at.timestamp() + outcome.duration_s, 3),
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "timed_out": outcome.timed_out,
        "killed_with": outcome.killed_with,
        "timeout_s": timeout_s,
        "duration_s": round(outcome.duration_s, 2),
        "reached_api": bool(model_calls),
        "model_calls": len(model_calls),
        "requests": scrub.value(collapse(log)),
        "external_refused": scrub.value(external),
        "stdout_bytes": len(outcome.stdout),
        "stderr_bytes": len(outcome.stderr),
        "env": scrub.value({k: v for k, v in sorted(setup.env.items())}),
        "config_files": scrub.value(setup.files),
    }
    if scenario.endpoint == "refused":
        meta["base_url"] = "http://127.0.0.1:<PORT> (nobody listens there)"
    elif scenario.endpoint == "dns":
        meta["base_url"] = f"http://{DNS_FAILURE_HOST}:<PORT> (cannot resolve)"
    elif scenario.endpoint == "tls":
        meta["base_url"] = "https://127.0.0.1:<PORT> (the server speaks plain HTTP)"
    if scenario.no_key:
        meta["credentials"] = "left out"
    if scenario.logged_out:
        meta["base_url"] = "not set: the CLI's own default (outside, refused by the proxy)"
    if stdout_cut:
        meta["stdout_cut"] = stdout_cut
    if stderr_cut:
        meta["stderr_cut"] = stderr_cut
    cell_dir = out_root / cli.name / scenario.name
    if cell_dir.exists():
        shutil.rmtree(cell_dir)
    cell_dir.mkdir(parents=True)
    (cell_dir / "argv.json").write_text(json.dumps(scrub.value(argv)) + "\n", encoding="utf-8")
    (cell_dir / "stdout").write_bytes(stdout)
    (cell_dir / "stderr").write_bytes(stderr)
    (cell_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


# --------------------------------------------------------------------------- shapes (--check)


def _json_shape(data: bytes) -> str:
    text = data.decode(errors="replace").strip()
    if not text:
        return "empty"
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict):
        return "json object: " + ",".join(sorted(document))
    if isinstance(document, list):
        kinds = sorted({str(e.get("type")) for e in document if isinstance(e, dict)})
        return "json list: " + ",".join(kinds)
    kinds_seen: set[str] = set()
    json_lines = 0
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            json_lines += 1
            kinds_seen.add(str(event.get("type")))
    if json_lines:
        return "jsonl: " + ",".join(sorted(kinds_seen))
    return "text"


def shape(stdout: bytes, meta: dict[str, Any]) -> dict[str, Any]:
    """What `--check` compares: how the cell ended, stdout's JSON shape, API reached."""
    if meta.get("timed_out"):
        ended = "timeout"
    elif meta.get("signal") is not None:
        ended = f"signal {meta['signal']}"
    else:
        ended = "exit 0" if meta.get("exit_code") == 0 else "exit nonzero"
    return {"ended": ended, "stdout": _json_shape(stdout), "reached_api": meta.get("reached_api")}


def recorded_shape(cell_dir: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((cell_dir / "meta.json").read_text(encoding="utf-8"))
        stdout = (cell_dir / "stdout").read_bytes()
    except (OSError, ValueError):
        return None
    return shape(stdout, meta)


# --------------------------------------------------------------------------- the matrix


def _last_words(cell_dir: Path, meta: dict[str, Any]) -> str:
    """The CLI's own last error or reply, short: what an operator would read."""
    out = (cell_dir / "stdout").read_text(encoding="utf-8", errors="replace")
    err = (cell_dir / "stderr").read_text(encoding="utf-8", errors="replace")
    words = ""
    for text in (out, err):
        body = text.strip()
        if not body:
            continue
        start = body.rfind("\n{\n")
        candidates = [body, body[start + 1 :] if start >= 0 else ""]
        candidates += list(reversed(body.splitlines()))
        for candidate in candidates:
            try:
                document = json.loads(candidate)
            except ValueError:
                continue
            if isinstance(document, dict):
                words = _message_of(document)
                if words:
                    break
        if words:
            break
    if not words:
        lines = [ln.strip() for ln in (err.strip() or out.strip()).splitlines()]
        lines = [ln for ln in lines if len(ln) > 3 and not ln.startswith("at ")] or lines
        words = lines[-1] if lines else "(nothing printed)"
    words = " ".join(words.split())
    return words if len(words) <= 160 else words[:157] + "..."


def _message_of(document: dict[str, Any]) -> str:
    error = document.get("error")
    if isinstance(error, dict):
        data = error.get("data")
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return str(data["message"])
        if isinstance(error.get("message"), str):
            return str(error["message"])
        return json.dumps(error)[:160]
    for key in ("result", "response", "message"):
        if isinstance(document.get(key), str):
            return str(document[key])
    item = document.get("item")
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return str(item["text"])
    part = document.get("part")
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return str(part["text"])
    return ""


def write_matrix(root: Path) -> None:
    """`root/MATRIX.md`: one row per recorded cell (regenerated after a full run)."""
    rows = [
        "# Recorded cells",
        "",
        "Written by `tests/vendors/record.py` after a full run; see tests/vendors/README.md.",
        "`model calls` are the statuses the fake API answered (xN: N times in a row; helper",
        "calls such as gemini's router and opencode's title call included);",
        "`last words` is the CLI's own final error or reply.",
        "",
        "| cli | scenario | ended | s | model calls | last words |",
        "|---|---|---|---|---|---|",
    ]
    for meta_path in sorted(root.glob("*/*/meta.json")):
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        ended = _ended(meta)
        calls = ", ".join(
            f"{e['status']}" + (f"x{e['times']}" if e.get("times") else "")
            for e in meta["requests"]
            if e["role"] == "model"
        )
        if len(calls) > 60:
            calls = calls[:50] + f"... ({meta['model_calls']} in all)"
        words = _last_words(meta_path.parent, meta).replace("|", "\\|")
        rows.append(
            f"| {meta['cli']} | {meta['scenario']} | {ended} | {meta['duration_s']:.0f} "
            f"| {calls or 'none: API not reached'} | {words} |"
        )
    (root / "MATRIX.md").write_text("\n".join(rows) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- version drift

DRIFT = RECORDED / "drift.json"


def _class_of(cell_dir: Path) -> tuple[str | None, str | None]:
    from replay import load, replay_spawn

    from execkit import get_adapter

    recording = load(cell_dir)
    timeout = 1.5 if recording.meta.get("timed_out") else 60.0
    mapped = get_adapter(recording.cli).parse(replay_spawn(cell_dir, timeout_s=timeout))
    return (None if mapped.failure_class is None else mapped.failure_class.value), mapped.reason


def drift(cells: list[tuple[str, Scenario]], jobs: int) -> int:
    """Record the newest version of each CLI whose pin is older (`--latest`), class every
    cell through its adapter, and name each cell whose class differs from expected.json
    (the failure says which cell and what the CLI says now, beside what the pinned one
    said). Writes fixtures/recorded/versions.json and drift.json (MATRIX.md's second
    column). Exit 1 when a cell's class changed."""
    versions = write_versions()
    newer = sorted(
        {name for name, _ in cells if name in PACKAGES}
        & {name for name, row in versions.items() if row["newest"] != row["pinned"]}
    )
    report: dict[str, Any] = {}
    expected = json.loads((RECORDED / "expected.json").read_text(encoding="utf-8"))["cells"]
    changed = 0
    installed = install_latest(newer)
    with tempfile.TemporaryDirectory(prefix="execkit-vendor-latest-") as scratch:
        out_root = Path(scratch)
        for name in newer:
            row: dict[str, Any] = {"version": versions[name]["newest"], "cells": {}}
            report[name] = row
            binary = installed[name]
            if not isinstance(binary, Path):
                row["not_installed"] = binary
                print(f"{name:<9}newest {row['version']} could not be installed: {binary}")
                continue
            cli = CLI(name, PACKAGES[name], row["version"], path=binary, version=row["version"])
            mine = [scenario for cli_name, scenario in cells if cli_name == name]
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                list(pool.map(record_cell, [cli] * len(mine), mine, [out_root] * len(mine)))
            for scenario in mine:
                live = out_root / name / scenario.name
                got, reason = _class_of(live)
                want = expected.get(f"{name}/{scenario.name}", {}).get("class")
                meta = json.loads((live / "meta.json").read_text(encoding="utf-8"))
                words = _last_words(live, meta)
                row["cells"][scenario.name] = {"class": got, "reason": reason, "words": words}
                if got != want:
                    changed += 1
                    kept = RECORDED / name / scenario.name
                    before = _last_words(kept, {}) if kept.exists() else "(not recorded)"
                    print(
                        f"DRIFT {name}/{scenario.name}: expected {want}, {row['version']} gives "
                        f"{got} ({reason})\n    now says:    {words}\n    pinned said: {before}"
                    )
    DRIFT.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {VERSIONS.name} and {DRIFT.name}; {changed} cell(s) changed class")
    return 1 if changed else 0


# --------------------------------------------------------------------------- main


def _binary_key(name: str, scenario: Scenario) -> str:
    return name if scenario.version is None else f"{name}@{scenario.version}"


def _select(only: Sequence[str]) -> list[tuple[str, Scenario]]:
    cells: list[tuple[str, Scenario]] = []
    for name in CLI_NAMES:
        for scenario in SCENARIOS.values():
            key = f"{name}:{scenario.name}"
            if not applies(name, scenario.name):
                continue
            if not only or name in only or key in only or scenario.name in only:
                cells.append((name, scenario))
    return cells


def _ended(meta: dict[str, Any]) -> str:
    if meta["timed_out"]:
        how = f"exit {meta['exit_code']}" if meta["signal"] is None else f"signal {meta['signal']}"
        return f"timed out ({meta['killed_with']}, then {how})"
    if meta["signal"] is not None:
        return f"signal {meta['signal']}"
    return f"exit {meta['exit_code']}"


def _summary(meta: dict[str, Any]) -> str:
    ended = _ended(meta)
    statuses = [
        f"{e['status']}" + (f"x{e['times']}" if e.get("times") else "")
        for e in meta["requests"]
        if e["role"] == "model"
    ]
    shown = "/".join(statuses)
    if len(shown) > 80:
        shown = shown[:60] + f"... ({meta['model_calls']} in all)"
    reached = f"model calls {shown}" if statuses else "API NOT reached"
    refused = ", ".join(meta["external_refused"])
    ext = f", refused outside: {refused}" if refused else ""
    return f"{ended:<34} {meta['duration_s']:>6.1f}s  {reached}{ext}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="CLI, SCENARIO or CLI:SCENARIO")
    parser.add_argument("--check", action="store_true", help="run live, compare shapes")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default fixtures)")
    parser.add_argument("--matrix", action="store_true", help="only rewrite MATRIX.md")
    parser.add_argument(
        "--latest",
        action="store_true",
        help="version drift: record the newest version the registry serves of each CLI whose "
        "pin is older, class every cell, name each cell whose class or sentence changed",
    )
    parser.add_argument(
        "--jobs", type=int, default=3, help="cells run at once (most time is spent waiting)"
    )
    args = parser.parse_args(argv)
    if args.matrix:
        write_matrix(args.out or RECORDED)
        return 0
    cells = _select(args.only)
    if not cells:
        parser.error(f"nothing matches {args.only}")
    if args.latest:
        return drift(cells, args.jobs)
    found = {name: find_cli(name) for name in sorted({name for name, _ in cells})}
    # A scenario that records an older release of its CLI runs that release instead.
    for name, scenario in cells:
        if scenario.version is not None:
            found[f"{name}@{scenario.version}"] = find_older(name, scenario.version)
    usable = {name: cli for name, cli in found.items() if cli.ok}
    for name, cli in found.items():
        if not cli.ok:
            print(f"SKIP {name}: {cli.missing}")
    if not usable:
        return 0
    scratch: tempfile.TemporaryDirectory[str] | None = None
    if args.check:
        scratch = tempfile.TemporaryDirectory(prefix="execkit-vendor-check-")
        out_root = Path(scratch.name)
    else:
        out_root = args.out or RECORDED
    mismatches = 0
    runnable = [
        (usable[_binary_key(name, scenario)], scenario)
        for name, scenario in cells
        if _binary_key(name, scenario) in usable
    ]

    def run(cell: tuple[CLI, Scenario]) -> tuple[str, Scenario, dict[str, Any]]:
        return cell[0].name, cell[1], record_cell(cell[0], cell[1], out_root)

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            done = pool.map(run, runnable)
            for name, scenario, meta in done:
                line = f"{name:<9}{scenario.name:<24}{_summary(meta)}"
                if args.check:
                    live = recorded_shape(out_root / name / scenario.name)
                    kept = recorded_shape(RECORDED / name / scenario.name)
                    if kept is None:
                        line += "  (no recording to compare)"
                    elif live != kept:
                        mismatches += 1
                        line += f"\n    SHAPE CHANGED: recorded {kept}\n{'live':>22} {live}"
                print(line, flush=True)
    finally:
        if scratch is not None:
            scratch.cleanup()
    if not args.check and not args.only:
        write_matrix(out_root)
    if args.check and mismatches:
        print(f"{mismatches} cell(s) changed shape")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
