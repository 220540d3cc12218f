"""`execkit decide`: print the budget Decision for a JSON attempt history.

A tool for operators who want to know why an item stopped; every rule lives in
`execkit._budget`, this module only parses input and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from execkit._budget import EXPLICIT_LIMIT_MAX, Attempt, Decision, ExplicitLimit, WorkBudget, decide
from execkit._errors import HistoryError, InvalidInput, NotFound
from execkit.cli._args import parse_int, parse_seconds
from execkit.cli._output import emit, print_json, safe_text, utc_stamp

__all__ = ["attempt_to_json", "register"]

_KEYS = frozenset(
    {
        "number",
        "status",
        "class",
        "failure_class",
        "reason",
        "started_at",
        "ended_at",
        "forced",
        "not_before",
    }
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `decide`."""
    parser = sub.add_parser(
        "decide",
        help="explain what the attempt budgets say about a history",
        description=(
            "Print the budget decision for a JSON list of attempts (keys: number, status, "
            "class or failure_class, reason, started_at, ended_at, forced, not_before). Exit "
            "0 whatever "
            "the decision; bad input exits 3 (invalid) or 11 (invalid_history)."
        ),
    )
    parser.add_argument(
        "--history", required=True, metavar="FILE", help="JSON file of attempts, or - for stdin"
    )
    # Values are parsed in `_handle`, not by argparse `type=`, so a bad one is an `invalid`
    # error naming the flag and its range (argparse would only say "invalid int value").
    parser.add_argument(
        "--max-attempts",
        default="3",
        metavar="N",
        help="charged attempts allowed, >= 1 (default 3)",
    )
    parser.add_argument(
        "--max-uncharged-attempts",
        default="3",
        metavar="N",
        help="consecutive upstream attempts allowed, >= 1 (default 3)",
    )
    parser.add_argument(
        "--limit",
        default=None,
        metavar="N",
        help=f"explicit limit on every admitted attempt, 1..{EXPLICIT_LIMIT_MAX}",
    )
    parser.add_argument(
        "--now",
        default=None,
        metavar="T",
        help="evaluate at POSIX time T, seconds >= 0 (default: the clock)",
    )
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    budget = WorkBudget(
        parse_int("--max-attempts", args.max_attempts, 1),
        parse_int("--max-uncharged-attempts", args.max_uncharged_attempts, 1),
    )
    limit = None
    if args.limit is not None:
        limit = ExplicitLimit(parse_int("--limit", args.limit, 1, EXPLICIT_LIMIT_MAX))
    now = parse_seconds("--now", args.now, allow_zero=True)
    attempts = _parse_history(_read(args.history))
    decision = decide(attempts, budget=budget, limit=limit, now=now)
    if args.json:
        print_json(decision.to_dict())
    else:
        emit(_summary(decision, now).removesuffix("\n"))
    return 0


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise NotFound(f"--history: no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"--history: cannot read {path}: {exc}", field="--history") from None


def attempt_to_json(attempt: Attempt) -> dict[str, Any]:
    """One attempt in the history-file shape `--history` reads (docs/formats.md).

    The one writer of that shape: the class is written under `"class"` (null for none),
    times as POSIX seconds or null. `_parse_attempt` reads it back to an equal `Attempt`.
    """
    return {
        "number": attempt.number,
        "status": attempt.status.value,
        "class": attempt.failure_class.value if attempt.failure_class is not None else None,
        "reason": attempt.reason,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "forced": attempt.forced,
        "not_before": attempt.not_before,
    }


def _parse_history(text: str) -> list[Attempt]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"--history: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            field="--history",
        ) from None
    except RecursionError:
        # json.loads recurses: a history nested thousands deep is hostile, not a history.
        raise InvalidInput(
            "--history: nests too deeply to be an attempt history", field="--history"
        ) from None
    if not isinstance(data, list):
        raise HistoryError(f"history: expected a JSON list of attempts, got {type(data).__name__}")
    return [_parse_attempt(index, item) for index, item in enumerate(data)]


def _parse_attempt(index: int, item: object) -> Attempt:
    where = f"history[{index}]"
    if not isinstance(item, dict):
        raise HistoryError(f"{where}: expected an object, got {type(item).__name__}")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise HistoryError(
            f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(_KEYS))})"
        )
    if "class" in item and "failure_class" in item:
        raise HistoryError(f"{where}: give one of 'class' and 'failure_class', not both")
    for required in ("number", "status"):
        if required not in item:
            raise HistoryError(f"{where}: missing field {required!r}")
    fields: dict[str, Any] = {key: value for key, value in item.items() if key != "class"}
    if "class" in item:
        fields["failure_class"] = item["class"]
    if fields.get("forced") is None:
        fields.pop("forced", None)
    try:
        return Attempt(**fields)
    except InvalidInput as exc:
        # The value types name the field; add which item it is.
        field, _, detail = exc.message.partition(":")
        raise HistoryError(f"{where}.{field}:{detail}") from None


def _when(ts: float, now: float | None) -> str:
    stamp = utc_stamp(ts)
    if now is None:
        return stamp
    return f"{stamp} ({ts - now:+.1f} s from --now)"


def _summary(decision: Decision, now: float | None) -> str:
    state = str(decision.state)
    if decision.blocked_on:
        state += f" on {decision.blocked_on}"
    lines = [
        f"state: {state}",
        f"next action: {decision.next_action}",
    ]
    if decision.next_attempt_at is not None:
        lines.append(f"next attempt at: {_when(decision.next_attempt_at, now)}")
    if decision.reason:
        lines.append(f"reason: {safe_text(decision.reason)}")
    lines.append(
        f"attempts used: {decision.attempts_used}, charged: {decision.charged_attempts}, "
        f"uncharged streak: {decision.uncharged_streak}, remaining: {decision.remaining}"
    )
    return "\n".join(lines) + "\n"
