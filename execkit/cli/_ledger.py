"""Ledger commands: `execkit task ...`, `execkit run start|finish`, `execkit capabilities`,
`execkit db ...`.

Every rule lives in `execkit.ledger`; this module parses, calls, prints. Integers are
parsed here (not with argparse `type=int`) so that "abc", "2.5" or "-1" is an `invalid`
error naming the flag and its range, with `--json` shape and exit code like any other.
Commands that only read never create a ledger file: a missing file is `not_found`.
"""

from __future__ import annotations

import argparse
import getpass
import os
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from execkit.cli._args import parse_int
from execkit.cli._output import EXIT_CODES, print_json
from execkit.ledger import (
    CAPABILITIES,
    MAX_ATTEMPT_LIMIT,
    SCHEMA_VERSION,
    Run,
    SqliteLedger,
    Task,
    TaskState,
    default_db_path,
    migrate,
)

_T = TypeVar("_T")


def _common() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="ledger file (default: $EXECKIT_DB, else ./.execkit/ledger.db)",
    )
    parent.add_argument("--json", action="store_true", help="print JSON")
    return parent


def _actor_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--actor",
        default=None,
        help="who acts (default: $EXECKIT_ACTOR, else the login name)",
    )


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `task`, `run-start`, `run-finish`, `capabilities` and `db`."""
    common = _common()

    task = sub.add_parser("task", help="durable tasks with optional attempt limits")
    task_sub = task.add_subparsers(dest="task_command", metavar="ACTION", required=True)

    create = task_sub.add_parser("create", parents=[common], help="create a task")
    create.add_argument("title")
    create.add_argument(
        "--max-attempts",
        default="0",
        metavar="N",
        help=f"explicit limit on every admitted run, 1..{MAX_ATTEMPT_LIMIT}; 0 = none (default)",
    )
    create.add_argument("--idempotency-key", default=None, metavar="KEY")
    _actor_flag(create)
    create.set_defaults(handler=_task_create)

    show = task_sub.add_parser("show", parents=[common], help="one task and its state")
    show.add_argument("task_id", metavar="TASK_ID")
    show.set_defaults(handler=_task_show)

    listing = task_sub.add_parser("list", parents=[common], help="every task")
    listing.set_defaults(handler=_task_list)

    runs = task_sub.add_parser("runs", parents=[common], help="a task's run history")
    runs.add_argument("task_id", metavar="TASK_ID")
    runs.set_defaults(handler=_task_runs)

    limit = task_sub.add_parser(
        "set-attempt-limit",
        parents=[common],
        help="compare-and-set a task's attempt limit",
        description=(
            "Set the explicit limit (1..10000) if it is still EXPECTED (0 = none set). The "
            "creator may change it before the first run; afterwards --role agent.operate."
        ),
    )
    limit.add_argument("task_id", metavar="TASK_ID")
    limit.add_argument("max_attempts", metavar="N")
    limit.add_argument("--expected", required=True, metavar="N", help="the current limit")
    limit.add_argument(
        "--role", action="append", default=[], metavar="ROLE", help="a role the actor holds"
    )
    limit.add_argument("--idempotency-key", default=None, metavar="KEY")
    _actor_flag(limit)
    limit.set_defaults(handler=_task_set_attempt_limit)

    cancel = task_sub.add_parser("cancel", parents=[common], help="cancel an open task")
    cancel.add_argument("task_id", metavar="TASK_ID")
    _actor_flag(cancel)
    cancel.set_defaults(handler=_task_cancel)

    # Reached as `execkit run start|finish` (the CLI rewrites those to these names).
    start = sub.add_parser("run-start", parents=[common], prog="execkit run start")
    start.add_argument("task_id", metavar="TASK_ID")
    start.add_argument(
        "--request-key",
        default=None,
        metavar="KEY",
        help="replaying an accepted key returns the same run (default: a fresh key)",
    )
    start.add_argument(
        "--forced", action="store_true", help="start past an environment stop (audited)"
    )
    start.add_argument(
        "--owner-pid",
        default=None,
        metavar="PID",
        help="process whose death abandons the run (default: the caller of execkit)",
    )
    _actor_flag(start)
    start.set_defaults(handler=_run_start)

    finish = sub.add_parser("run-finish", parents=[common], prog="execkit run finish")
    finish.add_argument("run_id", metavar="RUN_ID")
    finish.add_argument("status", metavar="STATUS", help="succeeded | failed | abandoned")
    finish.add_argument(
        "--class",
        dest="failure_class",
        default=None,
        metavar="CLASS",
        help="work | environment | upstream (failed runs only; none = work)",
    )
    finish.add_argument("--reason", default=None, help="why it failed (stored redacted)")
    finish.set_defaults(handler=_run_finish)

    caps = sub.add_parser("capabilities", parents=[common], help="what this ledger enforces")
    caps.set_defaults(handler=_capabilities)

    db = sub.add_parser("db", help="the ledger file: schema, migration, checks")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    db_migrate = db_sub.add_parser(
        "migrate", parents=[common], help="upgrade the schema (writes a backup first)"
    )
    db_migrate.set_defaults(handler=_db_migrate)
    db_status = db_sub.add_parser("status", parents=[common], help="schema version and counts")
    db_status.set_defaults(handler=_db_status)
    db_check = db_sub.add_parser(
        "check",
        parents=[common],
        help=f"validate every history (exit {EXIT_CODES['invalid_history']} on problems)",
    )
    db_check.set_defaults(handler=_db_check)


# -- parsing helpers ------------------------------------------------------------------


def _parse_limit(flag: str, text: str, *, zero: str | None) -> int:
    """An attempt limit, 1..MAX_ATTEMPT_LIMIT; also 0 when `zero` says what 0 means there."""
    if zero is None:
        return parse_int(flag, text, 1, MAX_ATTEMPT_LIMIT)
    return parse_int(
        flag, text, 0, MAX_ATTEMPT_LIMIT, allowed=f"0 ({zero}) or 1..{MAX_ATTEMPT_LIMIT}"
    )


def _actor(args: argparse.Namespace) -> str:
    if args.actor:
        return str(args.actor)
    from_env = os.environ.get("EXECKIT_ACTOR")
    if from_env:
        return from_env
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return "local"


def _open(args: argparse.Namespace, *, create: bool) -> SqliteLedger:
    return SqliteLedger(default_db_path(args.db), create=create)


def _with_ledger(
    args: argparse.Namespace, *, create: bool, action: Callable[[SqliteLedger], _T]
) -> _T:
    with _open(args, create=create) as ledger:
        return action(ledger)


# -- output -----------------------------------------------------------------------------


def _limit_text(task: Task) -> str:
    return str(task.max_attempts) if task.max_attempts else "-"


def _print_task(task: Task, *, as_json: bool) -> None:
    if as_json:
        print_json(task.to_dict())
        return
    print(f"{task.id}  {task.title}")
    print(f"  status {task.status}, state {task.state}, ready {'yes' if task.ready else 'no'}")
    print(
        f"  attempts started {task.attempts_started}, limit {_limit_text(task)}, "
        f"charged {task.charged_attempts}, uncharged streak {task.uncharged_streak}, "
        f"remaining {task.remaining if task.remaining is not None else '-'}"
    )
    if task.blocked_on:
        print(f"  blocked on {task.blocked_on}")
    if task.reason:
        print(f"  reason: {task.reason}")
    if task.next_attempt_at is not None and task.state is TaskState.BACKOFF:
        print(f"  next attempt at {task.next_attempt_at:.3f}")


def _run_line(run: Run) -> str:
    klass = run.failure_class.value if run.failure_class else "-"
    forced = " forced" if run.forced else ""
    reason = f"  {run.reason}" if run.reason else ""
    return f"{run.id}  {run.task_id} attempt {run.attempt}  {run.status}  {klass}{forced}{reason}"


def _print_run(run: Run, *, as_json: bool) -> None:
    if as_json:
        print_json(run.to_dict())
    else:
        print(_run_line(run))


def _print_result(
    args: argparse.Namespace,
    operation: Callable[[SqliteLedger], Task | Run],
    *,
    create: bool = False,
) -> int:
    """Do one ledger operation and print the task or run it returns (text or --json)."""
    with _open(args, create=create) as ledger:
        result = operation(ledger)
        if isinstance(result, Run):
            _print_run(result, as_json=args.json)
        else:
            _print_task(result, as_json=args.json)
    return 0


def _print_listing(args: argparse.Namespace, doc: dict[str, Any], lines: list[str]) -> int:
    """Print `doc` with --json, else one line per item."""
    if args.json:
        print_json(doc)
    else:
        for line in lines:
            print(line)
    return 0


# -- handlers ---------------------------------------------------------------------------


def _task_create(args: argparse.Namespace) -> int:
    max_attempts = _parse_limit("--max-attempts", args.max_attempts, zero="no explicit limit")
    actor = _actor(args)
    return _print_result(
        args,
        lambda ledger: ledger.create_task(
            args.title,
            max_attempts=max_attempts,
            idempotency_key=args.idempotency_key,
            actor=actor,
        ),
        create=True,
    )


def _task_show(args: argparse.Namespace) -> int:
    return _print_result(args, lambda ledger: ledger.get_task(args.task_id))


def _task_list(args: argparse.Namespace) -> int:
    tasks = _with_ledger(args, create=False, action=lambda ledger: ledger.list_tasks())
    lines = [
        f"{task.id}  {task.state:<9} attempts {task.attempts_started}/"
        f"{_limit_text(task)}  {task.title}"
        for task in tasks
    ]
    return _print_listing(args, {"tasks": [task.to_dict() for task in tasks]}, lines)


def _task_runs(args: argparse.Namespace) -> int:
    runs = _with_ledger(args, create=False, action=lambda ledger: ledger.runs(args.task_id))
    doc = {"task_id": args.task_id, "runs": [run.to_dict() for run in runs]}
    return _print_listing(args, doc, [_run_line(run) for run in runs])


def _task_set_attempt_limit(args: argparse.Namespace) -> int:
    # A limit is required here: 0 is not "no limit" but invalid (ADR 0033: 1..10000).
    max_attempts = _parse_limit("N (max attempts)", args.max_attempts, zero=None)
    expected = _parse_limit("--expected", args.expected, zero="no limit set")
    actor = _actor(args)
    return _print_result(
        args,
        lambda ledger: ledger.set_attempt_limit(
            args.task_id,
            max_attempts,
            expected_max_attempts=expected,
            actor=actor,
            roles=tuple(args.role),
            idempotency_key=args.idempotency_key,
        ),
    )


def _task_cancel(args: argparse.Namespace) -> int:
    actor = _actor(args)
    return _print_result(args, lambda ledger: ledger.cancel_task(args.task_id, actor=actor))


def _run_start(args: argparse.Namespace) -> int:
    # The CLI process exits at once; the run belongs to whoever called it.
    owner_pid = (
        os.getppid()
        if args.owner_pid is None
        else parse_int("--owner-pid", args.owner_pid, 1, 2**31 - 1, allowed="a process id >= 1")
    )
    request_key = args.request_key or f"cli-{uuid.uuid4()}"
    actor = _actor(args)
    return _print_result(
        args,
        lambda ledger: ledger.start_run(
            args.task_id,
            request_key=request_key,
            actor=actor,
            forced=args.forced,
            owner_pid=owner_pid,
        ),
    )


def _run_finish(args: argparse.Namespace) -> int:
    return _print_result(
        args,
        lambda ledger: ledger.finish_run(
            args.run_id, args.status, failure_class=args.failure_class, reason=args.reason
        ),
    )


def _capabilities(args: argparse.Namespace) -> int:
    # A property of this code, not of a file: answers without opening a ledger.
    caps = sorted(CAPABILITIES)
    if args.json:
        print_json({"capabilities": caps, "schema_version": SCHEMA_VERSION})
    else:
        for cap in caps:
            print(cap)
    return 0


def _db_migrate(args: argparse.Namespace) -> int:
    path = default_db_path(args.db)
    result = migrate(path)
    if args.json:
        print_json({"path": str(path), **result.to_dict()})
    elif result.backup_path is None:
        print(f"{path}: already at schema version {result.to_version}; nothing to do")
    else:
        print(
            f"{path}: migrated schema {result.from_version} -> {result.to_version}; "
            f"backup written to {result.backup_path}"
        )
    return 0


def _db_status(args: argparse.Namespace) -> int:
    # Inspection only: an older schema is reported, not migrated.
    with SqliteLedger(default_db_path(args.db), create=False, upgrade=False) as ledger:
        info = ledger.status_info()
    if args.json:
        print_json(info)
    else:
        for key, value in info.items():
            print(f"{key}: {value}")
    return 0


def _db_check(args: argparse.Namespace) -> int:
    def action(ledger: SqliteLedger) -> int:
        problems = ledger.validate()
        if args.json:
            print_json({"ok": not problems, "problems": problems})
        elif problems:
            for problem in problems:
                print(problem)
        else:
            print("ok: every history validates")
        return EXIT_CODES["invalid_history"] if problems else 0

    return _with_ledger(args, create=False, action=action)
