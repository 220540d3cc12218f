"""Ledger commands: `execkit task ...`, `execkit run start|finish`, `execkit capabilities`,
`execkit db ...`.

Every rule lives in `execkit.ledger`; this module parses, calls, prints. The ledger is the
one `--db` names (a file, or a postgresql:// URL), or with `--remote URL` (else
`$EXECKIT_REMOTE` when no `--db` is given) the one `execkit serve` serves there, reached
through `execkit.remote.RemoteLedger` with the token in `$EXECKIT_TOKEN` (never a flag: a
flag shows in `ps`). Every command prints the same and exits the same either way, except
`db init|migrate|status`, which work on a local file only and refuse a remote. Integers are
parsed here (not with argparse `type=int`) so that "abc", "2.5" or "-1" is an `invalid`
error naming the flag and its range, with `--json` shape and exit code like any other.
Commands that only read never create a ledger file: a missing file is `not_found`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from execkit._budget import WorkBudget
from execkit._errors import InvalidInput, NotFound, StorageError
from execkit.cli._args import CliParser, parse_int, parse_money, parse_seconds, parse_usage
from execkit.cli._output import (
    EXIT_CODES,
    charged_cell,
    counts_phrase,
    emit,
    print_json,
    print_json_list,
    safe_text,
    started_cell,
    utc_stamp,
    waiting_text,
    write_lines,
)
from execkit.ledger import (
    CAPABILITIES,
    KNOWN_ROLES,
    LANES_CAPABILITY,
    MAX_ATTEMPT_LIMIT,
    MAX_LEASE_S,
    MAX_UNCHARGED_LIMIT,
    SCHEMA_VERSION,
    SPEND_CAPABILITY,
    Actor,
    Grant,
    Ledger,
    Migration,
    Run,
    Task,
    TaskBudget,
    TaskState,
    TaskValues,
    iter_task_values,
    ledger_status,
    open_ledger,
    spend_of,
    task_values,
    user_name,
)

_T = TypeVar("_T")

# A shell that calls `run start` may never renew the lease: give it a long one.
_CLI_LEASE_S = 1800.0

# Named here (as `execkit.remote` names them) so a local command never imports the client.
REMOTE_ENV_VAR = "EXECKIT_REMOTE"
TOKEN_ENV_VAR = "EXECKIT_TOKEN"
_REMOTE_SCHEMES = ("http://", "https://")


def _common() -> argparse.ArgumentParser:
    parent = CliParser(add_help=False)
    parent.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="ledger file (default: $EXECKIT_DB, else ./.execkit/ledger.db)",
    )
    parent.add_argument(
        "--remote",
        metavar="URL",
        default=None,
        help=f"the ledger `execkit serve` serves at URL (default: ${REMOTE_ENV_VAR} when no "
        f"--db is given); the token is read from ${TOKEN_ENV_VAR}",
    )
    parent.add_argument("--json", action="store_true", help="print JSON")
    return parent


def _acting(parser: argparse.ArgumentParser) -> None:
    """The one identity flag: whom you act for. Who you are is the operating system's."""
    parser.add_argument(
        "--on-behalf-of",
        default=None,
        metavar="NAME",
        help="you act for NAME: recorded as 'you on behalf of NAME' (your roles apply)",
    )


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `task`, `role`, `run-start`, `run-finish`, `run-heartbeat`, `capabilities`, `db`."""
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
    create.add_argument(
        "--max-uncharged-attempts",
        default=None,
        metavar="N",
        help=f"this task's ceiling on consecutive upstream attempts, 1..{MAX_UNCHARGED_LIMIT} "
        "(default: the ledger's, 3)",
    )
    create.add_argument("--idempotency-key", default=None, metavar="KEY")
    create.add_argument(
        "--budget-usd", default=None, metavar="USD", help="the task's own USD cap (issue #45)"
    )
    create.add_argument(
        "--budget-tokens", default=None, metavar="N", help="the task's own token cap"
    )
    _acting(create)
    create.set_defaults(handler=_task_create)

    show = task_sub.add_parser(
        "show",
        parents=[common],
        help="one task and its state (by task id, or by the board issue id it was made for)",
    )
    show.add_argument("task_id", metavar="TASK_ID|ISSUE_ID")
    show.set_defaults(handler=_task_show)

    listing = task_sub.add_parser(
        "list",
        parents=[common],
        help="every task, or a page of them",
        description=(
            "Tasks in creation order, read a page at a time (memory stays flat however many "
            "there are). --state keeps one state; --limit N prints at most N and then the "
            "--after ID that continues the listing (with --json: `next_after`, null on the "
            "last page)."
        ),
    )
    listing.add_argument("--state", choices=[str(state) for state in TaskState], default=None)
    listing.add_argument("--limit", default=None, metavar="N", help=f"1..{MAX_ATTEMPT_LIMIT}")
    listing.add_argument(
        "--after", default=None, metavar="TASK_ID", help="start after this task (a page's last)"
    )
    listing.set_defaults(handler=_task_list)

    runs = task_sub.add_parser("runs", parents=[common], help="a task's run history")
    runs.add_argument("task_id", metavar="TASK_ID")
    runs.set_defaults(handler=_task_runs)

    retry = task_sub.add_parser(
        "retry",
        parents=[common],
        help="ask for one forced retry of a stopped task",
        description=(
            "Ask for one forced retry of a task that stopped: after an environment or "
            "upstream stop it needs nothing more (those attempts were uncharged, the budget "
            "is intact); after a work stop it needs --force; past an explicit limit it needs "
            "--force and the role agent.operate, and raises the limit by one. The next "
            "admission (the dispatcher, or `execkit run start`) is then forced, at once. "
            "Everything is recorded in the audit with your name and --reason."
        ),
    )
    retry.add_argument("task_id", metavar="TASK_ID")
    retry.add_argument("--reason", default=None, help="why (stored redacted, in the audit)")
    retry.add_argument(
        "--force", action="store_true", help="also after a work or attempt-limit stop"
    )
    _acting(retry)
    retry.set_defaults(handler=_task_retry)

    limit = task_sub.add_parser(
        "set-attempt-limit",
        parents=[common],
        help="compare-and-set a task's attempt limit",
        description=(
            "Set the explicit limit (1..10000) if it is still EXPECTED (0 = none set). The "
            "creator may change it before the first run; afterwards it needs the role "
            "agent.operate, granted in the ledger (`execkit role grant USER agent.operate`)."
        ),
    )
    limit.add_argument("task_id", metavar="TASK_ID")
    limit.add_argument("max_attempts", metavar="N")
    limit.add_argument("--expected", required=True, metavar="N", help="the current limit")
    limit.add_argument("--idempotency-key", default=None, metavar="KEY")
    _acting(limit)
    limit.set_defaults(handler=_task_set_attempt_limit)

    budget = task_sub.add_parser(
        "set-budget",
        parents=[common],
        help="compare-and-set a task's own spend cap (USD and/or tokens)",
        description=(
            "Set the task's own cap (`off` removes one; a flag not given keeps its value) if "
            "it is still what --expected-usd/--expected-tokens say (default: what it is as "
            "this command reads it). The creator may change it before the first run; "
            "afterwards it needs the role agent.operate. A raise lets a task blocked on its "
            "spend run again. Audited."
        ),
    )
    budget.add_argument("task_id", metavar="TASK_ID")
    budget.add_argument("--usd", default=None, metavar="USD")
    budget.add_argument("--tokens", default=None, metavar="N")
    budget.add_argument("--expected-usd", default=None, metavar="USD", help="`off`: none set")
    budget.add_argument("--expected-tokens", default=None, metavar="N", help="`off`: none set")
    _acting(budget)
    budget.set_defaults(handler=_task_set_budget)

    cancel = task_sub.add_parser("cancel", parents=[common], help="cancel an open task")
    cancel.add_argument("task_id", metavar="TASK_ID")
    _acting(cancel)
    cancel.set_defaults(handler=_task_cancel)

    role = sub.add_parser(
        "role",
        help="roles granted in the ledger (agent.operate, ledger.admin)",
        description=(
            "Roles are grants stored in the ledger, never claims made on the command line. "
            "Only the ledger's owner (the user owning its file) or a holder of ledger.admin "
            "may grant or revoke them; every change is audited."
        ),
    )
    role_sub = role.add_subparsers(dest="role_command", metavar="ACTION", required=True)
    for verb, helptext, handler in (
        ("grant", "grant ROLE to USER", _role_grant),
        ("revoke", "revoke ROLE from USER", _role_revoke),
    ):
        change = role_sub.add_parser(verb, parents=[common], help=helptext)
        change.add_argument("principal", metavar="USER")
        change.add_argument("role", metavar="ROLE", help=" | ".join(sorted(KNOWN_ROLES)))
        change.set_defaults(handler=handler)
    role_list = role_sub.add_parser("list", parents=[common], help="every grant")
    role_list.add_argument("principal", nargs="?", default=None, metavar="USER")
    role_list.set_defaults(handler=_role_list)

    # Reached as `execkit run start|finish|heartbeat` (the CLI rewrites those names).
    start = sub.add_parser(
        "run-start",
        parents=[common],
        prog="execkit run start",
        description=(
            "Admit one run of TASK_ID in one transaction, or refuse (attempt limit, a stop, "
            "a run still running, the backoff). The run holds a lease of --lease seconds: "
            "renew it with `execkit run heartbeat RUN_ID` while the work goes on, or finish "
            "it; once the lease has expired the next admission on the task abandons it "
            "(it still counts)."
        ),
    )
    start.add_argument("task_id", metavar="TASK_ID")
    start.add_argument(
        "--request-key",
        default=None,
        metavar="KEY",
        help="replaying an accepted key returns the same run (default: a fresh key)",
    )
    start.add_argument(
        "--forced",
        action="store_true",
        help="an operator's retry: past a stop (never an explicit limit) and at once (audited)",
    )
    start.add_argument(
        "--ignore-backoff",
        action="store_true",
        help="start now even if the task is backing off (audited)",
    )
    start.add_argument(
        "--lease",
        default=None,
        metavar="S",
        help=f"seconds the run's lease lasts unless renewed (default {_CLI_LEASE_S:g})",
    )
    start.add_argument(
        "--lane",
        default=None,
        metavar="LANE",
        help="the vendor lane ADAPTER/CREDENTIAL the run uses: refused while it waits",
    )
    _acting(start)
    start.set_defaults(handler=_run_start)

    heartbeat = sub.add_parser(
        "run-heartbeat",
        parents=[common],
        prog="execkit run heartbeat",
        description="Renew a running run's lease (by its own length, or --lease seconds).",
    )
    heartbeat.add_argument("run_id", metavar="RUN_ID")
    heartbeat.add_argument("--lease", default=None, metavar="S", help="new lease length")
    heartbeat.set_defaults(handler=_run_heartbeat)

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
    finish.add_argument(
        "--retry-after",
        default=None,
        metavar="S",
        help="the vendor asked for S seconds before another request: none is admitted sooner",
    )
    finish.add_argument(
        "--lane-cause",
        default=None,
        metavar="CAUSE",
        help="what the vendor's structure said of the run's lane: reset (with --retry-after), "
        "credentials, billing, binary_missing",
    )
    finish.add_argument(
        "--usage",
        default=None,
        metavar="JSON",
        help="what the run cost, a JSON object: input_tokens, output_tokens, "
        "cache_read_tokens, cache_write_tokens, usd, usd_source (reported | priced | "
        "unknown), model; none: unknown",
    )
    finish.set_defaults(handler=_run_finish)

    listing = sub.add_parser(
        "run-list",
        parents=[common],
        prog="execkit run list",
        description=(
            "The running runs: which task and attempt, where each runs (host, pid, the "
            "dispatcher's instance), since when, and until when its lease holds."
        ),
    )
    listing.add_argument(
        "--running",
        action="store_true",
        help="the runs running now (the only listing: a task's whole history is "
        "`execkit task runs TASK_ID`)",
    )
    listing.set_defaults(handler=_run_list)

    caps = sub.add_parser("capabilities", parents=[common], help="what this ledger enforces")
    caps.set_defaults(handler=_capabilities)

    db = sub.add_parser("db", help="the ledger (a file or a PostgreSQL URL): schema, checks")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    db_init = db_sub.add_parser(
        "init",
        parents=[common],
        help="create a ledger here (also over an empty file, never over anything else)",
    )
    db_init.set_defaults(handler=_db_init)
    db_migrate = db_sub.add_parser(
        "migrate",
        parents=[common],
        help="upgrade the schema (a file is backed up first; a PostgreSQL ledger, by you)",
    )
    db_migrate.add_argument(
        "--backed-up",
        action="store_true",
        help="PostgreSQL only: you took the pg_dump this command names, so it may migrate",
    )
    db_migrate.set_defaults(handler=_db_migrate)
    db_status = db_sub.add_parser("status", parents=[common], help="schema version and counts")
    db_status.set_defaults(handler=_db_status)
    db_check = db_sub.add_parser(
        "check",
        parents=[common],
        help=(
            f"validate every history (exit {EXIT_CODES['invalid_history']} on problems, "
            f"{EXIT_CODES['storage']} when the file is no usable ledger)"
        ),
    )
    db_check.add_argument(
        "--repair",
        action="store_true",
        help="abandon runs whose lease expired and rebuild summaries from their histories",
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


def _actor(args: argparse.Namespace) -> Actor:
    """Who acts: the operating-system user running this command (as PostgreSQL's `peer`
    authentication reads it), never a flag or an environment variable; `--on-behalf-of`
    only says for whom."""
    return Actor(user_name(os.geteuid()), on_behalf_of=getattr(args, "on_behalf_of", None))


def remote_url(args: argparse.Namespace) -> str | None:
    """The server the command goes through: `--remote`, else `$EXECKIT_REMOTE` unless a
    `--db` is given; None for a local ledger. Both flags at once is InvalidInput."""
    given = getattr(args, "remote", None)
    db = getattr(args, "db", None)
    if given:
        if db:
            raise InvalidInput(
                "--db and --remote both name a ledger: give one of them", field="--remote"
            )
        return str(given)
    from_env = os.environ.get(REMOTE_ENV_VAR)
    if from_env and not db:
        return from_env
    return None


def open_remote(url: str) -> Ledger:
    """The `RemoteLedger` at `url`, with the token from `$EXECKIT_TOKEN`."""
    token = os.environ.get(TOKEN_ENV_VAR, "")
    if not token.strip():
        raise InvalidInput(
            f"a remote ledger ({url}) needs its bearer token in ${TOKEN_ENV_VAR} "
            "(never a flag: flags show in `ps`); `execkit serve --add-token` makes one",
            field=TOKEN_ENV_VAR,
        )
    from execkit.remote import RemoteLedger

    return RemoteLedger(url, token)


def is_remote_url(target: str) -> bool:
    """Whether `target` (a board's remembered ledger location) is a server's URL."""
    return target.startswith(_REMOTE_SCHEMES)


def open_target(target: str | None, *, create: bool, write: bool) -> Ledger:
    """The local ledger `target` names (`open_ledger`: a file, a postgresql:// URL, None for
    `$EXECKIT_DB` or the default path). A command that only reads opens it without writing
    anything (no file, schema or migration is created by a read); one that writes migrates
    an older file as `open_ledger` does by default (a server's ledger waits for `db
    migrate`)."""
    return open_ledger(target, create=create, upgrade=None if write else False)


def _open(args: argparse.Namespace, *, create: bool = False, write: bool = True) -> Ledger:
    """The ledger this command works on: the server `--remote` names, else `--db`'s."""
    url = remote_url(args)
    if url is not None:
        return open_remote(url)
    return open_target(args.db, create=create, write=write)


@contextlib.contextmanager
def _using(
    args: argparse.Namespace, *, create: bool = False, write: bool = True
) -> Iterator[Ledger]:
    ledger = _open(args, create=create, write=write)
    try:
        yield ledger
    finally:
        ledger.close()


def _local_only(args: argparse.Namespace, command: str) -> None:
    """`db init|migrate|status` read and write a local file: refuse a remote clearly."""
    url = remote_url(args)
    if url is not None:
        source = "--remote" if getattr(args, "remote", None) else f"${REMOTE_ENV_VAR}"
        raise InvalidInput(
            f"execkit {command} works on a local ledger file only, and {source} names the "
            f"server {url}: run it on the server's host with --db (or drop {source})",
            field="--remote",
        )


def _with_ledger(args: argparse.Namespace, *, create: bool, action: Callable[[Ledger], _T]) -> _T:
    with _using(args, create=create, write=create) as ledger:
        return action(ledger)


# -- output -----------------------------------------------------------------------------


def _print_task(task: Task, *, as_json: bool, budget: int | None) -> None:
    if as_json:
        print_json(task.to_dict())
        return
    emit(f"{safe_text(task.id)}  {safe_text(task.title)}")
    emit(f"  status {task.status}, state {task.state}, ready {'yes' if task.ready else 'no'}")
    counts = counts_phrase(
        task.attempts_started,
        task.charged_attempts,
        task.uncharged_streak,
        explicit_limit=task.max_attempts,
        ceiling=task.max_uncharged_attempts,
        budget=budget,
    )
    left = f"; {task.remaining} left" if task.remaining is not None else ""
    emit(f"  {counts}{left}")
    if task.retry_pending:
        emit("  an operator's forced retry is pending")
    if task.blocked_on:
        emit(f"  blocked on {task.blocked_on}")
    if task.reason:
        emit(f"  reason: {safe_text(task.reason)}")
    if task.next_attempt_at is not None and task.state is TaskState.BACKOFF:
        emit(f"  next attempt at {utc_stamp(task.next_attempt_at)}")


def _run_line(run: Run) -> str:
    klass = run.failure_class.value if run.failure_class else "-"
    forced = " forced" if run.forced else ""
    reason = f"  {run.reason}" if run.reason else ""
    cost = ""
    if run.usd is not None or run.usage.tokens:  # what it cost, when its result said
        usd = "$?" if run.usd is None else f"${run.usd:,.2f}"
        cost = f"  {usd} {run.usage.tokens:,} tokens"
    return safe_text(
        f"{run.id}  {run.task_id} attempt {run.attempt}  {run.status}  {klass}{cost}{forced}"
        f"{reason}"
    )


def _running_line(run: Run) -> str:
    instance = f" instance {run.owner_instance}" if run.owner_instance else ""
    lease = (
        f"  lease until {utc_stamp(run.lease_expires_at)}"
        if run.lease_expires_at is not None
        else ""
    )
    return safe_text(
        f"{run.id}  {run.task_id} attempt {run.attempt}  on {run.owner_host} pid "
        f"{run.owner_pid}{instance}  since {utc_stamp(run.started_at)}{lease}"
    )


def _run_list(args: argparse.Namespace) -> int:
    if not args.running:
        raise InvalidInput(
            "run list needs --running (a task's whole history: execkit task runs TASK_ID)",
            field="--running",
        )
    runs = _with_ledger(args, create=False, action=lambda ledger: ledger.running_runs())
    lines = [_running_line(run) for run in runs] or ["nothing is running"]
    return _print_listing(args, {"runs": [run.to_dict() for run in runs]}, lines)


def _print_run(run: Run, *, as_json: bool) -> None:
    if as_json:
        print_json(run.to_dict())
    else:
        emit(_run_line(run))


def _print_result(
    args: argparse.Namespace,
    operation: Callable[[Ledger], Task | Run],
    *,
    create: bool = False,
    write: bool = True,
) -> int:
    """Do one ledger operation and print the task or run it returns (text or --json)."""
    with _using(args, create=create, write=write) as ledger:
        result = operation(ledger)
        if isinstance(result, Run):
            _print_run(result, as_json=args.json)
        else:
            _print_task(result, as_json=args.json, budget=ledger.budget.max_attempts)
    return 0


def _print_listing(args: argparse.Namespace, doc: dict[str, Any], lines: list[str]) -> int:
    """Print `doc` with --json, else one line per item."""
    if args.json:
        print_json(doc)
    else:
        for line in lines:
            emit(line)
    return 0


# -- handlers ---------------------------------------------------------------------------


def _task_create(args: argparse.Namespace) -> int:
    max_attempts = _parse_limit("--max-attempts", args.max_attempts, zero="no explicit limit")
    uncharged = (
        None
        if args.max_uncharged_attempts is None
        else parse_int("--max-uncharged-attempts", args.max_uncharged_attempts, 1,
                       MAX_UNCHARGED_LIMIT)
    )  # fmt: skip
    budget_usd = parse_money("--budget-usd", args.budget_usd)
    budget_tokens = (
        None
        if args.budget_tokens is None
        else _budget_tokens("--budget-tokens", args.budget_tokens)
    )
    actor = _actor(args)

    capped = (budget_usd, budget_tokens) != (None, None)
    with _using(args, create=True) as ledger:
        task = ledger.create_task(
            args.title,
            max_attempts=max_attempts,
            max_uncharged_attempts=uncharged,
            idempotency_key=args.idempotency_key,
            actor=actor,
        )
        # Its budget in a second transaction, compare-and-set on none: a replayed
        # creation whose budget is set already is left as it is.
        wanted = TaskBudget(task.id, budget_usd, budget_tokens)
        if capped and ledger.task_budget(task.id) != wanted:
            ledger.set_task_budget(
                task.id,
                usd=budget_usd,
                tokens=budget_tokens,
                expected_usd=None,
                expected_tokens=None,
                actor=actor,
            )
        if args.json:
            print_json({**task.to_dict(), **_budget_fields(wanted if capped else None)})
            return 0
        _print_task(task, as_json=False, budget=ledger.budget.max_attempts)
    if capped:
        emit(f"  spend budget {_budget_phrase(budget_usd, budget_tokens)}")
    return 0


def _task_show(args: argparse.Namespace) -> int:
    with _using(args, write=False) as ledger:
        task = _task_or_issue(ledger, args.task_id)
        runs = ledger.runs(task.id)
        spend = spend_of(runs)
        # The task's own cap (issue #45), where the ledger can say (a server without
        # `spend.caps` cannot).
        budget = ledger.task_budget(task.id) if SPEND_CAPABILITY in ledger.capabilities() else None
        if args.json:
            print_json({**task.to_dict(), "spend": spend.to_dict(), **_budget_fields(budget)})
            return 0
        _print_task(task, as_json=False, budget=ledger.budget.max_attempts)
        if spend.runs:
            emit(f"  spend {spend.phrase()}")
        if budget is not None and (budget.usd, budget.tokens) != (None, None):
            emit(f"  spend budget {_budget_phrase(budget.usd, budget.tokens)}")
        if LANES_CAPABILITY in ledger.capabilities():
            lane = ledger.task_lane(task.id)
            if lane is not None and not lane.admits and task.status == "open":
                emit(f"  {waiting_text(lane)}")
        # Where its agents worked (issue #46): the last run that said.
        places = [run for run in runs if run.workspace]
        if places:
            last = places[-1]
            emit(f"  workspace: {safe_text(str(last.workspace))} (attempt {last.attempt})")
        # Each attempt that fell back to a later adapter, or resumed a vendor session,
        # and after what (issue #46).
        from execkit._attempt import announced

        for run in runs:
            for said in announced(runs, run):
                emit(f"  attempt {run.attempt}: {safe_text(said)}")
    return 0


def _budget_fields(budget: TaskBudget | None) -> dict[str, Any]:
    """A task's own spend cap as `task show --json` gives it, named as a board issue's
    fields are (`budget_usd`, `budget_tokens`; None: no such cap); nothing when the
    ledger cannot say."""
    if budget is None:
        return {}
    return {"budget_usd": budget.usd, "budget_tokens": budget.tokens}


def _task_or_issue(ledger: Ledger, ref: str) -> Task:
    """The task `ref` names: its id, else the board issue id a dispatcher made it for (the
    id `execkit status` shows in its ISSUE column); else the ledger's NotFound."""
    try:
        return ledger.get_task(ref)
    except NotFound:
        from execkit.dispatch import task_key  # only on this path: the CLI starts light

        title = task_key(ref)
        found = [task for task in ledger.list_tasks() if task.title == title]
        if len(found) != 1:
            raise  # the ledger's own "no task" answer
        return ledger.get_task(found[0].id)


def _task_retry(args: argparse.Namespace) -> int:
    actor = _actor(args)
    return _print_result(
        args,
        lambda ledger: ledger.retry_task(
            args.task_id, actor=actor, reason=args.reason, force=args.force
        ),
    )


def _task_line(task: Task | TaskValues, budget: int | None = WorkBudget().max_attempts) -> str:
    """A listing's line for a task (its values, or a Task: one line either way): its
    attempts started (against its explicit limit, when it has one) and its charged
    attempts (against the work budget, `budget`, when no limit replaces it), named as on
    every surface (`started_cell`, `charged_cell`)."""
    limit = task.max_attempts
    started = started_cell(task.attempts_started, limit, limit or None)
    charged = charged_cell(task.charged_attempts, None if limit else budget)
    return (
        f"{task.id}  {_PADDED_STATES[task.state]} started {started}, charged {charged}  "
        f"{safe_text(task.title)}"
    )


# Each state as a listing line shows it, padded to 9 (`f"{state:<9}"`, once a state).
_PADDED_STATES = {state: f"{state:<9}" for state in TaskState}


def task_json(task: Task | TaskValues) -> str:
    """`json.dumps(task.to_dict(), sort_keys=True)` (for values, of `Task(*values)`),
    written from the fields directly: a JSON listing of 100,000 tasks writes one per task,
    and building the dict and sorting its keys cost more than reading the task. The keys
    in sorted order, each value as `json.dumps` writes it (ASCII, `float.__repr__`);
    tests/test_bulk_projection.py compares the two on every kind of task. A field of a
    type this does not expect (a value a caller put in a Task built by hand: a bool for an
    int, NaN) is written by `json.dumps` itself, the whole task."""
    return values_json(task if isinstance(task, TaskValues) else task_values(task))


def values_json(values: TaskValues) -> str:
    """`task_json` of a task's values (what a listing writes each task with)."""
    try:
        return _task_json_text(values, _escape())
    except TypeError:  # a field of another type: the general encoder, key order and all
        import json

        return json.dumps(Task(*values).to_dict(), sort_keys=True)


def _task_json_text(values: TaskValues, text: Callable[[str], str]) -> str:
    """The JSON text of `values`; TypeError for a field whose type it does not write: each
    int field an int (not a bool), each time a finite float, each flag a bool, each text
    a str (`text` raises for anything else)."""
    (
        task_id,
        title,
        status,
        state,
        blocked_on,
        reason,
        ready,
        max_attempts,
        started,
        charged,
        streak,
        remaining,
        next_at,
        created_by,
        created_at,
        ceiling,
        pending,
        gave_up,
    ) = values
    if not (
        max_attempts.__class__ is started.__class__ is charged.__class__ is int
        and streak.__class__ is ceiling.__class__ is int
        and (remaining is None or remaining.__class__ is int)
        and (gave_up is None or gave_up.__class__ is int)
        and created_at.__class__ is float
        and created_at - created_at == 0  # not NaN or an infinity
        and (next_at is None or (next_at.__class__ is float and next_at - next_at == 0))
        and ready.__class__ is pending.__class__ is bool
    ):
        raise TypeError("a field of a type json.dumps writes otherwise")
    return (
        f'{{"attempts_started": {started}, '
        f'"blocked_on": {"null" if blocked_on is None else text(blocked_on)}, '
        f'"charged_attempts": {charged}, "created_at": {created_at!r}, '
        f'"created_by": {text(created_by)}, '
        f'"gave_up_at_attempt": {"null" if gave_up is None else gave_up}, '
        f'"id": {text(task_id)}, "max_attempts": {max_attempts}, '
        f'"max_uncharged_attempts": {ceiling}, '
        f'"next_attempt_at": {"null" if next_at is None else repr(next_at)}, '
        f'"ready": {"true" if ready else "false"}, '
        f'"reason": {"null" if reason is None else text(reason)}, '
        f'"remaining": {"null" if remaining is None else remaining}, '
        f'"retry_pending": {"true" if pending else "false"}, '
        f'"state": {text(state)}, "status": {text(status)}, "title": {text(title)}, '
        f'"uncharged_streak": {streak}}}'
    )


@functools.cache
def _escape() -> Callable[[str], str]:
    """How `json.dumps` writes a str (an enum member is its value; TypeError for anything
    but a str): the encoder's own C function, found at the first JSON listing, as `json`
    is imported."""
    from json.encoder import encode_basestring_ascii

    return encode_basestring_ascii


def _primed(items: Iterator[_T]) -> Iterator[_T]:
    """`items` with its first one read now: a listing that fails at its first page (a bad
    filter, a refused token, no ledger) prints nothing on stdout, only the error. A later
    page that fails leaves what was printed, then the error on stderr."""
    first = list(itertools.islice(items, 1))
    return itertools.chain(first, items)


def _task_list(args: argparse.Namespace) -> int:
    """Streamed: each task is printed as its page is read, never the whole list held (a
    page of --limit N is N tasks, and one more read to know whether another page follows)."""
    limit = None if args.limit is None else parse_int("--limit", args.limit, 1, MAX_ATTEMPT_LIMIT)
    with _using(args, create=False, write=False) as ledger:
        if limit is None:
            listed = _primed(iter_task_values(ledger, state=args.state, after=args.after))
            if args.json:
                print_json_list("tasks", listed, encoded=values_json)
            else:
                budget = ledger.budget.max_attempts
                write_lines(_task_line(task, budget) for task in listed)
            return 0
        tasks = _primed(ledger.iter_tasks(state=args.state, after=args.after))
        page = list(itertools.islice(tasks, limit + 1))
        budget = ledger.budget.max_attempts
    more = len(page) > limit
    del page[limit:]
    next_after = page[-1].id if more else None
    if args.json:
        print_json({"next_after": next_after, "tasks": [task.to_dict() for task in page]})
        return 0
    write_lines(_task_line(task, budget) for task in page)
    if next_after is not None:
        emit(f"more: continue with --after {safe_text(next_after)}")
    return 0


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
            idempotency_key=args.idempotency_key,
        ),
    )


def _budget_tokens(flag: str, raw: str) -> int | None:
    return None if raw.strip().lower() in ("off", "none") else parse_int(flag, raw, 1)


def _task_set_budget(args: argparse.Namespace) -> int:
    given: dict[str, Any] = {}
    if args.usd is not None:
        given["usd"] = parse_money("--usd", args.usd)
    if args.tokens is not None:
        given["tokens"] = _budget_tokens("--tokens", args.tokens)
    if not given:
        raise InvalidInput("task set-budget needs --usd and/or --tokens", field="--usd")
    actor = _actor(args)
    with _using(args) as ledger:
        current = ledger.task_budget(args.task_id)
        expected_usd = (
            current.usd
            if args.expected_usd is None
            else parse_money("--expected-usd", args.expected_usd)
        )
        expected_tokens = (
            current.tokens
            if args.expected_tokens is None
            else _budget_tokens("--expected-tokens", args.expected_tokens)
        )
        budget = ledger.set_task_budget(
            args.task_id,
            usd=given.get("usd", current.usd),
            tokens=given.get("tokens", current.tokens),
            expected_usd=expected_usd,
            expected_tokens=expected_tokens,
            actor=actor,
        )
    if args.json:
        print_json(budget.to_dict())
    else:
        emit(safe_text(f"{budget.task_id}  budget {_budget_phrase(budget.usd, budget.tokens)}"))
    return 0


def _budget_phrase(usd: float | None, tokens: int | None) -> str:
    parts = [] if usd is None else [f"${usd:,.2f}"]
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    return " and ".join(parts) or "none"


def _task_cancel(args: argparse.Namespace) -> int:
    actor = _actor(args)
    return _print_result(args, lambda ledger: ledger.cancel_task(args.task_id, actor=actor))


def _lease(flag: str, raw: str | None, default: float | None) -> float | None:
    seconds = parse_seconds(flag, raw, allow_zero=False)
    if seconds is not None and seconds > MAX_LEASE_S:
        raise InvalidInput(
            f"{flag} must be at most {MAX_LEASE_S:g} seconds, got {raw!r}", field=flag
        )
    return default if seconds is None else seconds


def _run_start(args: argparse.Namespace) -> int:
    import uuid  # only `run start` needs a fresh key

    request_key = args.request_key or f"cli-{uuid.uuid4()}"
    actor = _actor(args)
    lease = _lease("--lease", args.lease, _CLI_LEASE_S)
    assert lease is not None
    return _print_result(
        args,
        lambda ledger: ledger.start_run(
            args.task_id,
            request_key=request_key,
            actor=actor,
            forced=args.forced,
            # An operator forcing from the command line means now.
            ignore_backoff=args.ignore_backoff or args.forced,
            lease_s=lease,
            lane=args.lane,
        ),
    )


def _run_heartbeat(args: argparse.Namespace) -> int:
    lease = _lease("--lease", args.lease, None)
    return _print_result(args, lambda ledger: ledger.heartbeat(args.run_id, lease_s=lease))


def _run_finish(args: argparse.Namespace) -> int:
    import time

    retry_after = parse_seconds("--retry-after", args.retry_after, allow_zero=True)
    not_before = None if retry_after is None else time.time() + retry_after
    usage = None if args.usage is None else parse_usage("--usage", args.usage)
    return _print_result(
        args,
        lambda ledger: ledger.finish_run(
            args.run_id,
            args.status,
            failure_class=args.failure_class,
            reason=args.reason,
            not_before=not_before,
            lane_cause=args.lane_cause,
            usage=usage,
        ),
    )


def _role_grant(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        grant = ledger.grant_role(args.principal, args.role, actor=actor)
    return _print_grants(args, [grant])


def _role_revoke(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        removed = ledger.revoke_role(args.principal, args.role, actor=actor)
    if args.json:
        print_json({"principal": args.principal, "role": args.role, "revoked": removed})
    else:
        what = "revoked" if removed else "was not granted"
        emit(safe_text(f"{args.principal} {args.role}: {what}"))
    return 0


def _role_list(args: argparse.Namespace) -> int:
    grants = _with_ledger(args, create=False, action=lambda ledger: ledger.grants(args.principal))
    return _print_grants(args, grants)


def _print_grants(args: argparse.Namespace, grants: list[Grant]) -> int:
    lines = [
        safe_text(
            f"{g.principal}  {g.role}  granted by {g.granted_by} at {utc_stamp(g.granted_at)}"
        )
        for g in grants
    ]
    return _print_listing(args, {"grants": [g.to_dict() for g in grants]}, lines)


def _capabilities(args: argparse.Namespace) -> int:
    # Locally a property of this code, not of a file: answers without opening a ledger.
    # Through a remote, what the server advertises (an older one may lack some).
    url = remote_url(args)
    if url is None:
        caps, version = sorted(CAPABILITIES), SCHEMA_VERSION
    else:
        with contextlib.closing(open_remote(url)) as ledger:
            caps, version = sorted(ledger.capabilities()), ledger.schema_version()
    if args.json:
        print_json({"capabilities": caps, "schema_version": version})
    else:
        for cap in caps:
            emit(cap)
    return 0


def _db_migrate(args: argparse.Namespace) -> int:
    _local_only(args, "db migrate")
    # Opened without writing: `migrate` decides (a file is backed up first; a PostgreSQL
    # ledger waits for --backed-up, naming the pg_dump to take).
    with open_ledger(args.db, create=False, upgrade=False) as ledger:
        result = ledger.migrate(backed_up=args.backed_up)
        key, where = ledger.where()
    if args.json:
        print_json({key: where, **result.to_dict()})
    elif result.from_version == result.to_version:
        emit(safe_text(f"{where}: already at schema version {result.to_version}; nothing to do"))
    elif isinstance(result, Migration):
        emit(
            safe_text(
                f"{where}: migrated schema {result.from_version} -> {result.to_version}; "
                f"backup written to {result.backup_path}"
            )
        )
    else:
        emit(
            safe_text(
                f"{where}: migrated schema {result.from_version} -> {result.to_version} "
                f"(restore from the dump `{result.backup_command}` names, if need be)"
            )
        )
    return 0


def _db_status(args: argparse.Namespace) -> int:
    # Inspection only: an older schema is reported, not migrated.
    _local_only(args, "db status")
    info = ledger_status(args.db)
    if args.json:
        print_json(info)
    else:
        for key, value in info.items():
            emit(safe_text(f"{key}: {value}"))
    return 0


def _db_init(args: argparse.Namespace) -> int:
    _local_only(args, "db init")
    with open_ledger(args.db, create=True, init=True) as ledger:
        created = ledger.migration is not None
        key, where = ledger.where()
        info = {key: where, "created": created, "ledger_id": ledger.ledger_id()}
    if args.json:
        print_json(info)
    elif created:
        emit(safe_text(f"{where}: a new, empty ledger (id {info['ledger_id']})"))
    else:
        emit(safe_text(f"{where}: already an execkit ledger; nothing to do"))
    return 0


def _db_check(args: argparse.Namespace) -> int:
    repaired: list[str] = []
    refused: StorageError | None = None
    try:
        # --repair writes; a plain check reads only (a file it cannot even open is the
        # first problem it reports, not an error).
        with _using(args, write=args.repair) as ledger:
            if args.repair:
                repaired = ledger.repair()
            problems = ledger.validate()
    except StorageError as exc:
        problems = [f"storage: {exc.message}"]
        refused = exc
    if args.json:
        print_json({"ok": not problems, "problems": problems, "repaired": repaired})
    else:
        for line in repaired:
            emit(safe_text(f"repaired: {line}"))
        for problem in problems:
            emit(safe_text(problem))
        if not problems:
            emit("ok: every history validates")
    # A file that is no usable ledger (random bytes, another program's database, a FIFO,
    # an empty file, a missing table) is `storage`, as for every other command; only a
    # readable ledger whose histories break a rule is `invalid_history`.
    if refused is not None:
        return refused.exit_code
    if any(problem.startswith("storage:") for problem in problems):
        return EXIT_CODES["storage"]
    return EXIT_CODES["invalid_history"] if problems else 0
