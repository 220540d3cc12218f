"""`execkit notify add|list|test|remove`: where the ledger's notification events are sent
(issue #49), local or through `--remote`, each with `--json`.

Endpoints live in the ledger, so every host sends to the same ones; adding, testing and
removing one needs the ledger's owner or the role `ledger.admin` and is audited. A signing
secret is read from a file (`--secret-file`), never from a flag, and is never printed; nor
is a URL's path (a Slack webhook's path is its credential). Every rule is the ledger's:
this module parses flags and prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from execkit._errors import InvalidInput
from execkit.cli._ledger import _acting, _actor, _common, _using
from execkit.cli._output import emit, print_json, safe_text, utc_stamp
from execkit.ledger import NotifyEndpoint

__all__ = ["register"]

_KINDS = (
    "issue.blocked, lane.stopped, lane.parked, lane.resumed, dispatcher.stopped, run.stalled, "
    "spend.warning, spend.capped, or *"
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `notify` and its actions."""
    common = _common()
    notify = sub.add_parser(
        "notify", help="notification endpoints: add, list, test, enable, remove"
    )
    notify_sub = notify.add_subparsers(dest="notify_command", metavar="ACTION", required=True)

    add = notify_sub.add_parser(
        "add", parents=[common], help="send events to a URL (ledger.admin; audited)"
    )
    add.add_argument("url", metavar="URL", help="an http:// or https:// URL")
    add.add_argument("--events", required=True, metavar="KINDS", help=f"comma-separated: {_KINDS}")
    add.add_argument(
        "--format",
        default="json",
        choices=("json", "slack"),
        help="json: a signed webhook (default); slack: an incoming-webhook message",
    )
    add.add_argument(
        "--secret-file",
        default=None,
        metavar="FILE",
        help="sign each JSON delivery with the secret in FILE (HMAC-SHA256)",
    )
    _acting(add)
    add.set_defaults(handler=_add)

    listing = notify_sub.add_parser("list", parents=[common], help="every endpoint and its health")
    listing.set_defaults(handler=_list)

    test = notify_sub.add_parser(
        "test", parents=[common], help="send a notify.test event to one endpoint (ledger.admin)"
    )
    test.add_argument("endpoint", metavar="ID")
    _acting(test)
    test.set_defaults(handler=_test)

    enable = notify_sub.add_parser(
        "enable",
        parents=[common],
        help="send again to an endpoint a refusal stopped, its waiting events in order "
        "(ledger.admin; audited)",
    )
    enable.add_argument("endpoint", metavar="ID")
    _acting(enable)
    enable.set_defaults(handler=_enable)

    remove = notify_sub.add_parser(
        "remove", parents=[common], help="stop sending to an endpoint (ledger.admin; audited)"
    )
    remove.add_argument("endpoint", metavar="ID")
    _acting(remove)
    remove.set_defaults(handler=_remove)


def _secret(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(
            f"--secret-file: cannot read {path}: {type(exc).__name__}", field="--secret-file"
        ) from None
    secret = text.strip()
    if not secret:
        raise InvalidInput(f"--secret-file: {path} is empty", field="--secret-file")
    return secret


def endpoint_lines(endpoint: NotifyEndpoint) -> tuple[str, str]:
    """One endpoint as `notify list` prints it: what it is, then its health."""
    signed = "signed" if endpoint.has_secret else "unsigned"
    kind = f"{endpoint.format} ({signed})" if endpoint.format == "json" else endpoint.format
    if endpoint.stopped_reason is not None:
        health = f"STOPPED: {endpoint.stopped_reason}"
    elif endpoint.last_error is not None and endpoint.backlog:
        health = f"retrying: {endpoint.last_error}"
    else:
        health = "ok"
    last = utc_stamp(endpoint.last_at) if endpoint.last_at is not None else "-"
    failed = f", last failure: {endpoint.last_error}" if endpoint.failed else ""
    return (
        safe_text(f"{endpoint.id}  {endpoint.url}  {kind}  {','.join(endpoint.events)}"),
        safe_text(
            f"  {health}; delivered {endpoint.delivered} (last {last}), given up "
            f"{endpoint.failed}{failed}, waiting {endpoint.backlog}"
        ),
    )


def _add(args: argparse.Namespace) -> int:
    secret = _secret(args.secret_file)
    kinds = [kind.strip() for kind in str(args.events).split(",") if kind.strip()]
    actor = _actor(args)
    with _using(args) as ledger:
        endpoint = ledger.add_notify_endpoint(
            args.url, events=kinds, format=args.format, secret=secret, actor=actor
        )
    if args.json:
        print_json(endpoint.to_dict())
    else:
        for line in endpoint_lines(endpoint):
            emit(line)
        emit(safe_text(f"  check it: execkit notify test {endpoint.id}"))
    return 0


def _list(args: argparse.Namespace) -> int:
    with _using(args, write=False) as ledger:
        endpoints = ledger.notify_endpoints()
    if args.json:
        print_json({"endpoints": [endpoint.to_dict() for endpoint in endpoints]})
    elif not endpoints:
        emit("no notification endpoints; add one with: execkit notify add URL --events '*'")
    else:
        for endpoint in endpoints:
            for line in endpoint_lines(endpoint):
                emit(line)
    return 0


def _test(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        event = ledger.notify_test(args.endpoint, actor=actor)
    if args.json:
        print_json(event.to_dict())
    else:
        emit(
            safe_text(
                f"test event {event.id} written for {args.endpoint}: the next sender round "
                "(a dispatcher or execkit serve) sends it; `execkit notify list` shows how it went"
            )
        )
    return 0


def _enable(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        endpoint = ledger.enable_notify_endpoint(args.endpoint, actor=actor)
    if args.json:
        print_json(endpoint.to_dict())
    else:
        for line in endpoint_lines(endpoint):
            emit(line)
        emit(
            safe_text(
                f"  enabled: the next sender round sends its {endpoint.backlog} waiting "
                "events, in order"
            )
        )
    return 0


def _remove(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _using(args) as ledger:
        removed = ledger.remove_notify_endpoint(args.endpoint, actor=actor)
    if args.json:
        print_json({"endpoint": args.endpoint, "removed": removed})
    else:
        emit(safe_text(f"{args.endpoint} {'removed' if removed else 'was not there'}"))
    return 0
