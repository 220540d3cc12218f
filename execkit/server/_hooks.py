"""GitHub's webhooks (issue #47): `POST /hooks/github` wakes every waiting dispatcher at once
instead of at its next poll (`execkit serve --github-webhook-secret-file FILE`).

GitHub signs each delivery with the webhook's secret: `X-Hub-Signature-256: sha256=<hex>`,
the HMAC-SHA256 of the raw body. A delivery whose signature is missing or wrong is 401
`unauthenticated` (compared in constant time, `hmac.compare_digest`) and changes nothing;
the route takes no bearer token (GitHub sends none: the signature is its credential). A
signed delivery is noted by its `X-GitHub-Delivery` id (`Ledger.note_delivery`, source
`github`): the first time, 202 and the ledger's wake number is bumped in the same
transaction (every dispatcher waiting on `wait_for_wake` runs a pass); a redelivery, 200
and nothing else. A signed request without a delivery id is 400 `invalid`. What the
delivery says is not read: the dispatcher's next pass reads the board itself, so a forged
or stale payload can at most cost one poll. A body past 25 MiB (GitHub's own cap on a
payload) is 413, unread.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from execkit._errors import ExecKitError, InvalidInput
from execkit._mask import mask_json
from execkit.ledger import Ledger

__all__ = ["GITHUB_HOOK_PATH", "MAX_HOOK_BODY_BYTES", "GitHubHook", "read_webhook_secret"]

GITHUB_HOOK_PATH = "/hooks/github"
MAX_HOOK_BODY_BYTES = 25 * 1024 * 1024
_SIGNATURE = re.compile(r"sha256=([0-9a-f]{64})\Z")
_DELIVERY = re.compile(r"[A-Za-z0-9._:-]{1,200}\Z")
_MAX_SECRET_BYTES = 4096


def read_webhook_secret(path: str | os.PathLike[str]) -> bytes:
    """The webhook secret in the file `path` (its text, one trailing newline dropped).
    InvalidInput naming `github_webhook_secret_file` for a file that cannot be read, is
    empty or larger than 4 KiB, or that others than its owner may read (a secret file is
    owner-only)."""
    where = Path(path)
    field = "github_webhook_secret_file"
    try:
        info = where.stat()
        raw = where.read_bytes() if stat.S_ISREG(info.st_mode) else None
    except OSError as exc:
        raise InvalidInput(
            f"the webhook secret file {where} cannot be read: {exc.strerror}", field=field
        ) from None
    if raw is None:
        raise InvalidInput(f"the webhook secret file {where} is not a file", field=field)
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidInput(
            f"the webhook secret file {where} is open to others (mode "
            f"{stat.S_IMODE(info.st_mode):o}): chmod 600 it",
            field=field,
        )
    secret = raw.removesuffix(b"\n").removesuffix(b"\r")
    if not secret or len(secret) > _MAX_SECRET_BYTES:
        raise InvalidInput(
            f"the webhook secret file {where} must hold 1..{_MAX_SECRET_BYTES} bytes",
            field=field,
        )
    return secret


def _answer(status: int, doc: dict[str, object]) -> Response:
    """The one writer of this route's answers: every string masked, then JSON."""
    return Response(json.dumps(mask_json(doc)), status, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    return _answer(status, {"error": {"code": code, "message": message}})


class GitHubHook:
    """The route `POST /hooks/github` on `ledger`, checking deliveries against `secret`
    (see the module docstring). `deliveries` counts the new ones noted (for tests)."""

    def __init__(self, ledger: Ledger, secret: bytes) -> None:
        if not secret:
            raise InvalidInput("the webhook secret is empty", field="github_webhook_secret")
        self._ledger = ledger
        self._secret = secret
        self.deliveries = 0

    def routes(self) -> list[Route]:
        return [Route(GITHUB_HOOK_PATH, self.handle, methods=["POST"])]

    async def handle(self, request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_HOOK_BODY_BYTES:
            return _error(413, "too_large", "a webhook delivery is at most 25 MiB")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_HOOK_BODY_BYTES:
                return _error(413, "too_large", "a webhook delivery is at most 25 MiB")
        if not self.signed(bytes(body), request.headers.get("x-hub-signature-256")):
            return _error(
                401,
                "unauthenticated",
                "X-Hub-Signature-256 is missing or does not match this server's webhook secret",
            )
        delivery = request.headers.get("x-github-delivery", "")
        if _DELIVERY.match(delivery) is None:
            return _error(400, "invalid", "X-GitHub-Delivery must name the delivery")
        try:
            new = await run_in_threadpool(self._ledger.note_delivery, "github", delivery)
        except ExecKitError as exc:
            return _error(503, "storage", f"the delivery was not noted: {exc.message}")
        if new:
            self.deliveries += 1
        return _answer(202 if new else 200, {"delivery": delivery, "new": new})

    def signed(self, body: bytes, header: str | None) -> bool:
        """Whether `header` is `sha256=` and the HMAC-SHA256 of `body` under the secret,
        compared in constant time."""
        found = _SIGNATURE.match(header or "")
        expected = hmac.new(self._secret, body, hashlib.sha256).hexdigest()
        given = found.group(1) if found is not None else "0" * 64
        return hmac.compare_digest(expected, given) and found is not None
