"""Whole dispatches against a vendor that recovers by itself: the README's scenario table.

    python benchmarks/bench_scenes.py                 # every recorded scene, replayed
    python benchmarks/bench_scenes.py --only codex    # some (CLI, CLI/SCENE or SCENE)
    python benchmarks/bench_scenes.py --live          # the real CLIs, when installed
    python benchmarks/bench_scenes.py --recorded      # the recordings' own figures
    python benchmarks/bench_scenes.py --json          # the facts of each scene

Each scene (tests/vendors/scenes.py) is `execkit dispatch --concurrency 4 --until-idle`
over 12 board issues while the scene vendor goes through its phases by itself: a usage
limit lifted at the reset it stated, 20 s of 529s, a 401 until an operator renews the
credentials and runs `execkit lane resume`. Replayed (the default, Python only: the
recordings in fixtures/recorded/scenes/, on a timeline ten times shorter), or `--live`
with the real claude-code, codex and gemini (tests/vendors/node_modules; minutes; the
recordings are left as they are).

For each scene, per CLI: the calls to the vendor while it was in trouble and in all (an
attempt counted once, at its first request), the attempts admitted before the lane closed
against those in flight when the first refusal was recorded (issue 51.3), the calls that
reached the vendor before its reset from attempts admitted after the first refusal (52.1),
the charged attempts, the issues left blocked (and on what), the time from the vendor's
recovery to its first successful call (on the recorded timeline: a replay's seconds times
ten), and how each `--until-idle` run ended. Counts, and one time figure that the tests
never assert.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "vendors"))

import scenes  # noqa: E402


def _live(scene: scenes.Scene) -> dict[str, Any] | str:
    from clis import find_cli

    cli = find_cli(scene.cli)
    if not cli.ok or cli.path is None:
        return f"SKIP: {cli.missing}"
    with tempfile.TemporaryDirectory(prefix="execkit-scene-live-") as folder:
        run, _stage = scenes.run_scene(scene, "record", real_binary=cli.path, keep=Path(folder))
    values: dict[str, Any] = scenes.facts(run).to_dict()
    return values


def _blocked(values: dict[str, Any]) -> str:
    blocked = values["blocked"]
    if not blocked:
        return "0"
    return ", ".join(f"{n} {on}" for on, n in sorted(blocked.items()))


def _until_idle(values: dict[str, Any]) -> str:
    parts = []
    for run in values["until_idle"]:
        how = f"exit {run['exit_code']}" if run["ended_by_itself"] else "did not end"
        parts.append(how)
    return " / ".join(parts)


def _pair(first: int | None, second: int | None) -> str:
    return "-" if first is None or second is None else f"{first} / {second}"


def table(rows: list[tuple[scenes.Scene, dict[str, Any] | str]], *, scale: float) -> str:
    lines = []
    for cli in dict.fromkeys(scene.cli for scene, _ in rows):
        lines += [
            "",
            f"**{cli}**",
            "",
            "| scene | vendor calls in trouble / in all | admitted before the lane closed / "
            "in flight at the first refusal | calls before the reset after the first refusal "
            "| charged | blocked | recovery to first success | `--until-idle` |",
            "|---|---:|---:|---:|---:|---|---:|---|",
        ]
        for scene, values in rows:
            if scene.cli != cli:
                continue
            if isinstance(values, str):
                lines.append(f"| {scene.name} | {values} | | | | | | |")
                continue
            recovery = values["recovery_to_first_success_s"]
            shown = "-" if recovery is None else f"{recovery / scale:.1f} s"
            early = values["calls_before_reset_after_refusal"]
            lines.append(
                f"| {scene.name} | {values['calls_in_trouble']} / {values['calls']} | "
                + _pair(values["calls_before_close"], values["in_flight_at_first_refusal"])
                + f" | {'-' if early is None else early} | {values['charged_failures']} | "
                f"{_blocked(values)} | {shown} | {_until_idle(values)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="CLI, CLI/SCENE or SCENE")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="the real CLIs (minutes)")
    mode.add_argument(
        "--recorded", action="store_true", help="the recordings' own figures (nothing runs)"
    )
    parser.add_argument("--json", action="store_true", help="the facts of each scene")
    args = parser.parse_args(argv)
    rows: list[tuple[scenes.Scene, dict[str, Any] | str]] = []
    for scene in scenes.select(args.only):
        recorded = (scenes.recording_of(scene) / "scene.json").exists()
        if args.live:
            rows.append((scene, _live(scene)))
        elif not recorded:
            rows.append((scene, "not recorded"))
        elif args.recorded:
            rows.append((scene, scenes.facts(scenes.recorded_run(scene)).to_dict()))
        else:
            rows.append((scene, scenes.facts(scenes.replay(scene)).to_dict()))
    if args.json:
        print(json.dumps({scene.key: values for scene, values in rows}, indent=2))
        return 0
    if args.live:
        how = "live, the real CLIs"
    elif args.recorded:
        how = "as recorded from the real CLIs"
    else:
        how = f"replayed on a timeline x{scenes.SCALE:g}, times scaled back"
    print(
        f"Scenes ({how}): execkit dispatch --concurrency {scenes.CONCURRENCY} --until-idle "
        f"over {scenes.ISSUES} issues"
    )
    print(table(rows, scale=scenes.SCALE if not (args.live or args.recorded) else 1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
