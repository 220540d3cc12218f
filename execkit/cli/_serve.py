"""`execkit serve`: one ledger over HTTP (docs/remote.md), and `--add-token` to mint tokens.

    execkit serve --db TARGET --listen 127.0.0.1:8750 --tokens FILE [--without-capability NAME]
                  [--max-connections N] [--idle-timeout S] [--head-timeout S]
                  [--github-webhook-secret-file FILE] [--linear-webhook-secret-file FILE]
                  [--gitlab-webhook-secret-file FILE]
    execkit serve --add-token FILE --actor NAME [--role ROLE ...]

The server is `execkit.server` (Starlette on uvicorn, the optional extra
`execkit-runner[server]`, imported only when serving); `--add-token` needs neither. Once the
socket listens, one line says where (`--json`: one JSON object), so a script can start
the server on `--listen 127.0.0.1:0` and read the port it got.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from execkit._errors import InvalidInput
from execkit.cli._args import parse_int, parse_seconds
from execkit.cli._output import emit, log_handler, print_json, safe_text, show_credential
from execkit.ledger import CAPABILITIES, KNOWN_ROLES, Ledger

__all__ = ["register"]

_MAX_BODY_LIMIT = 64 * 1024 * 1024
_MAX_TIMEOUT_S = 3600.0  # as `ConnectionLimits` allows
# The trackers whose webhooks `execkit serve` answers (execkit.server._hooks, HOOK_KINDS),
# each with what its route checks: `--<tracker>-webhook-secret-file`.
_WEBHOOKS = (
    (
        "github",
        "GitHub webhook: POST /hooks/github checks X-Hub-Signature-256 (401 when wrong) and "
        "notes X-GitHub-Delivery once",
    ),
    (
        "linear",
        "Linear webhook: POST /hooks/linear checks Linear-Signature and that Linear-Timestamp "
        "/ webhookTimestamp is within a minute of this host's clock (401 otherwise) and notes "
        "Linear-Delivery once",
    ),
    (
        "gitlab",
        "GitLab webhook (its secret token): POST /hooks/gitlab checks X-Gitlab-Token (401 when "
        "wrong) and notes Idempotency-Key (else X-Gitlab-Event-UUID) once",
    ),
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `serve`."""
    from execkit.server import DEFAULT_LISTEN

    serve = sub.add_parser(
        "serve",
        help="serve a ledger over HTTP with token auth (for --remote and the SDKs)",
        description=(
            "Serve one ledger (a SQLite file or a postgresql:// URL) over an HTTP JSON API "
            "(docs/remote.md). Every API request but GET /openapi.json needs a bearer token "
            "from --tokens; the ledger's rules and grants apply as for a local caller, with the "
            "token's actor acting. It serves the operator's dashboard at / (any token reads, "
            "agent.operate acts), /healthz, /readyz and /metrics, and writes one JSON "
            "access-log line per request on stderr. With a tracker's webhook secret file it "
            "answers that tracker's webhook on POST /hooks/github, /hooks/linear or "
            "/hooks/gitlab: each new delivery wakes the dispatchers at once instead of at "
            "their next poll. Listens on loopback only unless --allow-non-loopback. "
            "With --add-token FILE: mint a token for --actor with the given --role(s), store "
            "its hash in FILE and print the token once."
        ),
    )
    serve.add_argument(
        "--db",
        metavar="TARGET",
        default=None,
        help="ledger file or postgresql:// URL (default: $EXECKIT_DB, else "
        "./.execkit/ledger.db; created if missing)",
    )
    serve.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help=f"address to listen on (default {DEFAULT_LISTEN}; port 0 picks a free one)",
    )
    serve.add_argument("--tokens", metavar="FILE", help="the tokens file (hashes, actors, roles)")
    serve.add_argument(
        "--board",
        metavar="FILE",
        default=None,
        help="the board file the ledger's tasks were dispatched from: the dashboard shows its "
        "columns and its issues' titles (default: the ledger's task states)",
    )
    for tracker, checks in _WEBHOOKS:
        serve.add_argument(
            f"--{tracker}-webhook-secret-file",
            metavar="FILE",
            default=None,
            help=f"a file only its owner may read, holding the secret of a {checks}; each "
            "new delivery wakes the dispatchers at once, a redelivery nobody",
        )
    serve.add_argument(
        "--idempotency-db",
        metavar="PATH",
        default=None,
        help="deprecated and ignored: the ledger keeps the answers to Idempotency-Key "
        "requests in its own transactions",
    )
    serve.add_argument(
        "--without-capability",
        action="append",
        default=[],
        metavar="NAME",
        help="do not advertise NAME (stands in for an older server in tests)",
    )
    serve.add_argument(
        "--allow-non-loopback",
        action="store_true",
        help="allow --listen on an address other hosts can reach (plain HTTP: put TLS in front)",
    )
    serve.add_argument(
        "--max-body-bytes", default=None, metavar="N", help="request body limit (default 1 MiB)"
    )
    serve.add_argument(
        "--request-timeout",
        default=None,
        metavar="S",
        help="seconds one request may take before it is answered 503 (default 60)",
    )
    serve.add_argument(
        "--max-connections",
        default=None,
        metavar="N",
        help="connections served at once (default 1024); a request on one past them is "
        "answered 503, except /healthz and /readyz",
    )
    serve.add_argument(
        "--idle-timeout",
        default=None,
        metavar="S",
        help="seconds a connection with no request under way stays open (default 5)",
    )
    serve.add_argument(
        "--head-timeout",
        default=None,
        metavar="S",
        help="seconds a request's head may take, in all, from its first byte (default 10; "
        "past it 408 and closed)",
    )
    serve.add_argument(
        "--add-token",
        metavar="FILE",
        default=None,
        help="mint a token into the tokens file FILE (created owner-only) and print it once",
    )
    serve.add_argument("--actor", metavar="NAME", default=None, help="with --add-token: who")
    serve.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="ROLE",
        help=f"with --add-token: a role the token may use ({' | '.join(sorted(KNOWN_ROLES))})",
    )
    serve.add_argument("--json", action="store_true", help="print JSON")
    serve.set_defaults(handler=_serve)


def _refuse_with(args: argparse.Namespace, mode: str, flags: dict[str, object]) -> None:
    for flag, value in flags.items():
        if value:
            raise InvalidInput(f"execkit serve: {flag} does not apply {mode}", field=flag)


def _serve(args: argparse.Namespace) -> int:
    if args.add_token is not None:
        return _add_token(args)
    _refuse_with(
        args, "without --add-token", {"--actor": args.actor is not None, "--role": args.role}
    )
    if not args.tokens:
        raise InvalidInput(
            # Worded so that no flag named like a secret is followed by a word: redaction
            # (rightly) masks the value after `--token`-like flags in every message.
            "execkit serve: the tokens file is required (--tokens); to make one, run "
            "`execkit serve --add-token` with --actor (see `execkit serve --help`)",
            field="--tokens",
        )
    unknown = sorted(set(args.without_capability) - CAPABILITIES)
    if unknown:
        raise InvalidInput(
            f"--without-capability: unknown capability {', '.join(unknown)} (known: "
            f"{', '.join(sorted(CAPABILITIES))})",
            field="--without-capability",
        )
    from execkit.server import DEFAULT_LISTEN, parse_listen

    listen = args.listen or DEFAULT_LISTEN
    parse_listen(listen, allow_non_loopback=args.allow_non_loopback)  # before any import
    options: dict[str, Any] = {}
    if args.max_body_bytes is not None:
        options["max_body_bytes"] = parse_int(
            "--max-body-bytes", args.max_body_bytes, 1, _MAX_BODY_LIMIT
        )
    if args.request_timeout is not None:
        options["request_timeout_s"] = parse_seconds(
            "--request-timeout", args.request_timeout, allow_zero=False
        )
    options["limits"] = _limits(args)
    # ExecKitError naming the extra when Starlette or uvicorn is not installed.
    from execkit.server import serve

    def ready(url: str, ledger: Ledger) -> None:
        if args.json:
            print_json({"url": url, "ledger": ledger.location(), "ledger_id": ledger.ledger_id()})
        else:
            line = f"execkit serve: listening on {url} (ledger {ledger.location()})"
            emit(safe_text(line))
        sys.stdout.flush()

    _quiet_logging()
    serve(
        args.db,
        args.tokens,
        listen=listen,
        idempotency_db=args.idempotency_db,
        without=args.without_capability,
        allow_non_loopback=args.allow_non_loopback,
        ready=ready,
        board=args.board,
        webhook_secret_files=_webhook_secret_files(args),
        **options,
    )
    return 0


def _webhook_secret_files(args: argparse.Namespace) -> dict[str, str]:
    """The webhook secret files given, by tracker."""
    given = {tracker: getattr(args, f"{tracker}_webhook_secret_file") for tracker, _ in _WEBHOOKS}
    return {tracker: path for tracker, path in given.items() if path is not None}


def _limits(args: argparse.Namespace) -> Any:
    """`--max-connections`, `--idle-timeout` and `--head-timeout` as `ConnectionLimits`."""
    from execkit.server import MAX_CONNECTIONS_LIMIT, ConnectionLimits

    given: dict[str, Any] = {}
    if args.max_connections is not None:
        given["max_connections"] = parse_int(
            "--max-connections", args.max_connections, 1, MAX_CONNECTIONS_LIMIT
        )
    for flag, name, raw in (
        ("--idle-timeout", "idle_timeout_s", args.idle_timeout),
        ("--head-timeout", "head_timeout_s", args.head_timeout),
    ):
        seconds = parse_seconds(flag, raw, allow_zero=False)
        if seconds is not None:
            if seconds > _MAX_TIMEOUT_S:
                raise InvalidInput(
                    f"{flag} must be at most {_MAX_TIMEOUT_S:g} seconds, got {raw!r}", field=flag
                )
            given[name] = seconds
    return ConnectionLimits(**given)


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on whatever `sys.stderr` is when a record is written, never on a stream
    that was replaced (and closed) since the command started."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _quiet_logging() -> None:
    """Warnings and errors on stderr, each line escaped; uvicorn's start-up chatter off."""
    import logging

    logging.basicConfig(level=logging.WARNING, handlers=[log_handler("execkit serve")])
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    # The access log (execkit.server._access_log): one JSON line per request on stderr,
    # route templates only, so no token can be in it.
    access = logging.getLogger("execkit.server.access")
    access_handler = _CurrentStderr()
    access_handler.setFormatter(logging.Formatter("%(message)s"))
    # One handler however often the command runs in a process (tests call it in-process).
    for old in [h for h in access.handlers if isinstance(h, _CurrentStderr)]:
        access.removeHandler(old)
    access.addHandler(access_handler)
    access.setLevel(logging.INFO)
    access.propagate = False


def _add_token(args: argparse.Namespace) -> int:
    _refuse_with(
        args,
        "with --add-token",
        {
            "--tokens": args.tokens,
            "--listen": args.listen,
            "--db": args.db,
            "--idempotency-db": args.idempotency_db,
            "--without-capability": args.without_capability,
            "--max-body-bytes": args.max_body_bytes,
            "--request-timeout": args.request_timeout,
            "--max-connections": args.max_connections,
            "--idle-timeout": args.idle_timeout,
            "--head-timeout": args.head_timeout,
            "--allow-non-loopback": args.allow_non_loopback,
            "--board": args.board,
            **{
                f"--{tracker}-webhook-secret-file": path
                for tracker, path in _webhook_secret_files(args).items()
            },
        },
    )
    if not args.actor:
        raise InvalidInput(
            "execkit serve: --actor NAME is required with --add-token", field="--actor"
        )
    from execkit.server import add_token

    token = add_token(args.add_token, args.actor, args.role)
    if args.json:
        print_json(
            {
                "token": token,
                "actor": args.actor,
                "roles": sorted(set(args.role)),
                "tokens_file": args.add_token,
            },
            credential="token",
        )
    else:
        show_credential(token)
        emit(
            safe_text(
                f"execkit serve: token for {args.actor} "
                f"(roles: {', '.join(sorted(set(args.role))) or 'none'}) added to "
                f"{args.add_token}; it is shown only now"
            ),
            err=True,
        )
    return 0
