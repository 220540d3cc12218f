"""Trackers' webhooks (issues #47 and #48): `POST /hooks/<tracker>` wakes every waiting
dispatcher at once instead of at its next poll (`execkit serve --github-webhook-secret-file
FILE`, `--linear-webhook-secret-file FILE`, `--gitlab-webhook-secret-file FILE`).

Every hook is one route with one shape; what differs per tracker is a row of `HOOK_KINDS`
(a `HookKind`): how a delivery proves it comes from the tracker, and which header names
it. A fourth tracker's hook is one more row.

- GitHub signs each delivery with the webhook's secret: `X-Hub-Signature-256:
  sha256=<hex>`, the HMAC-SHA256 of the raw body; the delivery is `X-GitHub-Delivery`.
- Linear signs the same way, the bare hex digest in `Linear-Signature`, and says when it
  sent the delivery (epoch milliseconds) in the `Linear-Timestamp` header and the body's
  `webhookTimestamp`: every one of them present must be within a minute of this server's
  clock, and at least one must be present. The delivery is `Linear-Delivery`.
- GitLab sends the webhook's secret token itself in `X-Gitlab-Token` (no signature of the
  body); the delivery is `Idempotency-Key` (GitLab 17.4 and later: the same on a retry),
  else `X-Gitlab-Event-UUID`.

A delivery that does not authenticate (a missing or wrong signature or token, compared in
constant time with `hmac.compare_digest`, or a stale Linear timestamp) is 401
`unauthenticated` and changes nothing; the routes take no bearer token (the trackers send
none: the signature or the token is their credential). An authenticated delivery is noted
by its id (`Ledger.note_delivery`, the tracker's name as the source): the first time, 202
and the ledger's wake number is bumped in the same transaction (every dispatcher waiting on
`wait_for_wake` runs a pass); a redelivery, 200 and nothing else. An authenticated request
without a delivery id is 400 `invalid`. What the delivery says is not acted on (only a
Linear body's timestamp is read): the dispatcher's next pass reads the board itself, so a
forged or stale payload can at most cost one poll. A body past 25 MiB (GitHub's own cap on
a payload) is 413, unread.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from execkit._errors import ExecKitError, InvalidInput
from execkit._mask import mask_json
from execkit.ledger import Ledger

__all__ = [
    "GITHUB_HOOK_PATH",
    "HOOK_KINDS",
    "LINEAR_TOLERANCE_MS",
    "MAX_HOOK_BODY_BYTES",
    "Hook",
    "HookKind",
    "hook_path",
    "read_webhook_secret",
    "verify_github",
    "verify_gitlab",
    "verify_linear",
]

MAX_HOOK_BODY_BYTES = 25 * 1024 * 1024
LINEAR_TOLERANCE_MS = 60_000
_SIGNATURE = re.compile(r"sha256=([0-9a-f]{64})\Z")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_MILLISECONDS = re.compile(r"[0-9]{1,16}\Z")
_DELIVERY = re.compile(r"[A-Za-z0-9._:-]{1,200}\Z")
_MAX_SECRET_BYTES = 4096

# A verifier: the webhook's secret, the raw body, the request's headers (looked up by
# lower-case name) and the server's clock (epoch seconds) -> None when the delivery
# authenticates, else what is wrong with it (said in the 401).
Verifier = Callable[[bytes, bytes, Mapping[str, str], float], str | None]


def _hmac_matches(secret: bytes, body: bytes, given: str | None) -> bool:
    """Whether `given` is the hex HMAC-SHA256 of `body` under `secret`, compared in
    constant time (a missing or malformed value is compared too, against zeros)."""
    expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, given or "0" * 64) and given is not None


def verify_github(secret: bytes, body: bytes, headers: Mapping[str, str], now: float) -> str | None:
    """GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>` (GitHub's
    "Validating webhook deliveries")."""
    found = _SIGNATURE.match(headers.get("x-hub-signature-256") or "")
    if _hmac_matches(secret, body, found.group(1) if found is not None else None):
        return None
    return "X-Hub-Signature-256 is missing or does not match this server's webhook secret"


def verify_linear(secret: bytes, body: bytes, headers: Mapping[str, str], now: float) -> str | None:
    """Linear: `Linear-Signature: <hex HMAC-SHA256 of the raw body>`, and the delivery's
    `Linear-Timestamp` header and the body's `webhookTimestamp` (epoch milliseconds) within
    `LINEAR_TOLERANCE_MS` of `now`: each one present, at least one.

    Followed: Linear's webhook helper in its SDK (linear/linear, packages/sdk/src/webhooks,
    `LinearWebhookClient.verify`, which points at https://linear.app/developers/webhooks
    "Securing webhooks"): the signature is the bare lower-case hex digest of the raw body,
    `LINEAR_WEBHOOK_TS_HEADER = "linear-timestamp"` and `LINEAR_WEBHOOK_TS_FIELD =
    "webhookTimestamp"` are milliseconds, refused past one minute either way. The SDK
    checks the header, else the field, and skips the check when neither is there; here
    the signed field is checked too when present (the header is not signed: a replay could
    carry a fresh one) and a delivery with neither is refused (the SDK's payload types give
    every delivery a `webhookTimestamp`)."""
    given = headers.get("linear-signature")
    if not _hmac_matches(secret, body, given if given and _HEX_DIGEST.match(given) else None):
        return "Linear-Signature is missing or does not match this server's webhook secret"
    stamps: list[int] = []
    header = headers.get("linear-timestamp")
    if header is not None:
        if _MILLISECONDS.match(header.strip()) is None:
            return "Linear-Timestamp must be epoch milliseconds"
        stamps.append(int(header.strip()))
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and "webhookTimestamp" in payload:
        field = payload["webhookTimestamp"]
        if type(field) is not int:
            return "the payload's webhookTimestamp must be epoch milliseconds"
        stamps.append(field)
    if not stamps:
        return "a Linear delivery must carry Linear-Timestamp or webhookTimestamp"
    now_ms = now * 1000.0
    if any(abs(now_ms - stamp) > LINEAR_TOLERANCE_MS for stamp in stamps):
        return "the delivery's timestamp is more than a minute from this server's clock"
    return None


def verify_gitlab(secret: bytes, body: bytes, headers: Mapping[str, str], now: float) -> str | None:
    """GitLab: `X-Gitlab-Token` is the webhook's secret token itself (GitLab's "Webhooks"
    page, doc/user/project/integrations/webhooks.md, "Secret token"; the body is not
    signed). Compared in constant time whatever the
    lengths: the digests of both are compared."""
    # A header's text is its bytes read as latin-1 (as Starlette reads them): back to bytes.
    given = (headers.get("x-gitlab-token") or "").encode("latin-1", "replace")
    same = hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(secret).digest())
    if same and given:
        return None
    return "X-Gitlab-Token is missing or is not this server's webhook secret"


@attrs.frozen
class HookKind:
    """One tracker's webhook: its `name` (the route `/hooks/<name>`, the source its
    deliveries are noted under, the `--<name>-webhook-secret-file` flag), `title` (how
    messages name it), its `verify` (see `Verifier`) and its `delivery_headers` (looked up
    whatever their case; the first one present names the delivery)."""

    name: str
    title: str
    verify: Verifier
    delivery_headers: tuple[str, ...]

    @property
    def path(self) -> str:
        return hook_path(self.name)


def hook_path(name: str) -> str:
    """The route of the tracker `name`'s webhook."""
    return f"/hooks/{name}"


# GitLab: `Idempotency-Key` is "consistent across webhook retries" (GitLab 17.4+); the older
# `X-Gitlab-Event-UUID` (14.8+) is the same for a hook and the hooks it triggered
# ("recursive webhooks share the same value"), so it is only the fallback (GitLab's
# doc/user/project/integrations/webhooks.md, "Delivery headers"). A second hook sharing it
# wakes nobody: its change is seen one poll later.
HOOK_KINDS: Mapping[str, HookKind] = {
    kind.name: kind
    for kind in (
        HookKind("github", "GitHub", verify_github, ("X-GitHub-Delivery",)),
        HookKind("linear", "Linear", verify_linear, ("Linear-Delivery",)),
        HookKind("gitlab", "GitLab", verify_gitlab, ("Idempotency-Key", "X-Gitlab-Event-UUID")),
    )
}
GITHUB_HOOK_PATH = hook_path("github")


def read_webhook_secret(
    path: str | os.PathLike[str], *, field: str = "github_webhook_secret_file"
) -> bytes:
    """The webhook secret in the file `path` (its text, one trailing newline dropped).
    InvalidInput naming `field` for a file that cannot be read, is empty or larger than
    4 KiB, or that others than its owner may read (a secret file is owner-only)."""
    where = Path(path)
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
    """The one writer of these routes' answers: every string masked, then JSON."""
    return Response(json.dumps(mask_json(doc)), status, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    return _answer(status, {"error": {"code": code, "message": message}})


class Hook:
    """The route `POST /hooks/<kind.name>` on `ledger`, checking deliveries against
    `secret` (see the module docstring); `clock` is the server's (epoch seconds). InvalidInput
    for an unknown `kind` name or an empty secret. `deliveries` counts the new ones noted
    (for tests)."""

    def __init__(
        self,
        ledger: Ledger,
        kind: HookKind | str,
        secret: bytes,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(kind, str):
            found = HOOK_KINDS.get(kind)
            if found is None:
                raise InvalidInput(
                    f"no webhook for {kind!r} (known: {', '.join(sorted(HOOK_KINDS))})",
                    field="webhook_secrets",
                )
            kind = found
        if not secret:
            raise InvalidInput("the webhook secret is empty", field=f"{kind.name}_webhook_secret")
        self.kind = kind
        self._ledger = ledger
        self._secret = secret
        self._clock = clock
        self.deliveries = 0

    def routes(self) -> list[Route]:
        return [Route(self.kind.path, self.handle, methods=["POST"])]

    async def handle(self, request: Request) -> Response:
        kind = self.kind
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_HOOK_BODY_BYTES:
            return _error(413, "too_large", "a webhook delivery is at most 25 MiB")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_HOOK_BODY_BYTES:
                return _error(413, "too_large", "a webhook delivery is at most 25 MiB")
        wrong = kind.verify(self._secret, bytes(body), request.headers, self._clock())
        if wrong is not None:
            return _error(401, "unauthenticated", wrong)
        found = (request.headers.get(name) for name in kind.delivery_headers)
        delivery = next((value for value in found if value is not None), "")
        if _DELIVERY.match(delivery) is None:
            return _error(
                400,
                "invalid",
                f"{' or '.join(kind.delivery_headers)} must name the {kind.title} delivery",
            )
        try:
            new = await run_in_threadpool(self._ledger.note_delivery, kind.name, delivery)
        except ExecKitError as exc:
            return _error(503, "storage", f"the delivery was not noted: {exc.message}")
        if new:
            self.deliveries += 1
        return _answer(202 if new else 200, {"delivery": delivery, "new": new})
