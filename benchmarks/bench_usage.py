"""Benchmark the usage hook: draining claude stream-json with a `UsageMeter` on the line hook.

    python benchmarks/bench_usage.py [--mib N] [--rounds N]

The child is `cat` of a file of `--mib` MiB (256 by default) of claude `--output-format
stream-json` events as the CLI prints them (tests of issue #45): `assistant` events, one
per content block, each repeating its message's `usage`; `user` events carrying tool
results (a few longer than a line the hook hands over whole); a final `result`. Three
ways to drain it, interleaved over `--rounds` rounds (the order rotates each round), the
medians compared:

1. `spawn(["cat", FILE])`: no line hook (what a run without a spend limit costs),
2. the same with a line hook that does nothing (what any line hook costs: the exec
   stage's line splitting, paid by an adapter's `watch` too),
3. the same with `UsageMeter(ClaudeAdapter().usage_of, limit)` as the hook, the limit
   never crossed (what a run with a spend limit costs).

Target (issue #45): the usage hook adds <= 5% to draining. Printed: the command, the
sizes, and a markdown table with the medians and the ratios 3/1 and 3/2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.claude import ClaudeAdapter  # noqa: E402
from execkit import spawn  # noqa: E402
from execkit._exec import Line, StopTree  # noqa: E402
from execkit._meter import UsageMeter  # noqa: E402
from execkit._usage import Usage  # noqa: E402

MIB = 1024 * 1024
_WORDS = [
    "the",
    "a",
    "function",
    "test",
    "file",
    "change",
    "fix",
    "read",
    "write",
    "run",
    "build",
    "check",
    "value",
    "error",
]


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _assistant(message: str, block: dict[str, object], output: int) -> str:
    return json.dumps(
        {
            "type": "assistant",
            "message": {
                "id": message,
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [block],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 4,
                    "cache_creation_input_tokens": 812,
                    "cache_read_input_tokens": 21_344,
                    "output_tokens": output,
                    "service_tier": "standard",
                },
                "context_management": None,
            },
            "parent_tool_use_id": None,
            "session_id": "c3b6afb9-078d-4534-9bcc-791fc188245f",
            "uuid": "72aab223-cac0-4740-9852-86c9b9507d05",
        },
        separators=(",", ":"),
    )


def _user(rng: random.Random, tool: str) -> str:
    # A tool result: no usage; every so often longer than a line the hook takes whole.
    chars = rng.choice((300, 1_500, 4_000, 12_000))
    return json.dumps(
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {"tool_use_id": tool, "type": "tool_result", "content": _text(rng, chars)}
                ],
            },
            "parent_tool_use_id": None,
            "session_id": "c3b6afb9-078d-4534-9bcc-791fc188245f",
        },
        separators=(",", ":"),
    )


def write_stream(path: Path, size: int, seed: int = 45) -> int:
    """Write about `size` bytes of claude stream-json to `path`; return the message count."""
    rng = random.Random(seed)
    written = 0
    messages = 0
    with path.open("w", encoding="utf-8") as out:
        while written < size:
            messages += 1
            message = f"msg_{messages:08d}"
            tool = f"toolu_{messages:08d}"
            blocks: list[dict[str, object]] = [
                {"type": "text", "text": _text(rng, rng.choice((80, 400, 1_200)))}
            ]
            if rng.random() < 0.7:
                command = _text(rng, rng.choice((40, 200, 2_000)))
                blocks.append(
                    {"type": "tool_use", "id": tool, "name": "Bash", "input": {"command": command}}
                )
            # The CLI repeats the message's usage as it stood on each of its blocks.
            output = 1 + rng.randrange(400)
            lines = [_assistant(message, block, output) for block in blocks]
            if len(blocks) > 1:
                lines.append(_user(rng, tool))
            chunk = "\n".join(lines) + "\n"
            out.write(chunk)
            written += len(chunk.encode())
        result = {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "total_cost_usd": 12.5,
            "usage": {"input_tokens": 4 * messages, "output_tokens": 200 * messages},
            "result": "done",
            "session_id": "c3b6afb9-078d-4534-9bcc-791fc188245f",
        }
        out.write(json.dumps(result, separators=(",", ":")) + "\n")
    return messages


def _drain(argv: list[str], hook: Callable[[Line], StopTree | None] | None) -> None:
    result = spawn(argv, on_line=hook)
    if result.exit_code != 0:
        raise SystemExit(f"the drain failed: {result}")


def _never(_usage: Usage) -> bool:
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("$ python benchmarks/bench_usage.py " + shlex.join(sys.argv[1:]))
    claude = ClaudeAdapter()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "stream.jsonl"
        messages = write_stream(path, args.mib * MIB)
        size = os.path.getsize(path)
        argv = ["cat", str(path)]
        meters: list[UsageMeter] = []

        def metered() -> None:
            meter = UsageMeter(claude.usage_of, _never)
            meters.append(meter)
            _drain(argv, meter.on_line)

        rows: dict[str, Callable[[], None]] = {
            "no line hook": lambda: _drain(argv, None),
            "a line hook that does nothing": lambda: _drain(argv, lambda _line: None),
            "the usage hook (UsageMeter, claude's usage_of)": metered,
        }
        times: dict[str, list[float]] = {name: [] for name in rows}
        names = list(rows)
        _drain(argv, None)  # warm the page cache
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                start = time.perf_counter()
                rows[name]()
                times[name].append(time.perf_counter() - start)
        total = meters[-1].total
        print(
            f"\n{size / MIB:.0f} MiB, {messages} messages, {meters[-1].events} usage events; "
            f"metered total: {total.output_tokens} output tokens, ${total.usd}\n"
        )
        medians = {name: statistics.median(values) for name, values in times.items()}
        base, empty, usage = (medians[name] for name in names)
        print("| drain | median | vs no hook | vs an empty hook |")
        print("|---|---:|---:|---:|")
        for name in names:
            median = medians[name]
            print(f"| {name} | {median:.3f} s | {median / base:.2f}x | {median / empty:.2f}x |")
        print(
            f"\nthe usage hook adds {100 * (usage / empty - 1):+.1f}% to a line-hooked drain and "
            f"{100 * (usage / base - 1):+.1f}% to a bare one (target: <= +5%)"
        )


if __name__ == "__main__":
    main()
