"""The dashboard's routes on `execkit serve`: the page, its static files, its session, its
JSON reads and its actions, "retry once" and a lane's "resume" (docs/dashboard.md).

Who may do what. Every read needs a valid token (any role: a viewer); "retry once" (and
"resume" of a vendor lane, where the ledger has lanes) needs the token role
`agent.operate`, and the ledger audits it under the token's actor, as the CLI's `task retry
--force` is. A browser signs in once: it posts the token to
`/dashboard/api/session` and gets a session cookie (random, HttpOnly, SameSite=Strict,
Path=/dashboard) standing for the token; the token itself is never sent back, written into a
page or logged. It is kept in this process's memory and looked up again on every request,
so removing it from the tokens file ends its sessions at their next request. A script may
send `Authorization: Bearer TOKEN` instead.

Cross-site requests. A POST that a cookie authenticates must carry the session's CSRF
token in `X-CSRF-Token` (compared in constant time) and an `Origin` equal to the server's
own (scheme and Host); either missing or different is 403 with nothing done. The sign-in
POST is checked for its Origin too (no login CSRF). A bearer-token POST needs neither: a
browser never attaches that header by itself. The CSRF token is a per-session random value
that the page reads from `GET /dashboard/api/session`; it authenticates nothing alone.

Answers: 401 `unauthenticated` (no or unknown token or session), 403 `forbidden` (role,
CSRF, Origin), 404 `not_found` (no such task), 400 `invalid`; the error shape is the API's.
Ledger reads and the action run in worker threads, never on the event loop.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from execkit._api import ERROR_STATUSES
from execkit._errors import ExecKitError, StorageError
from execkit._mask import mask_json
from execkit._redact import redact
from execkit.ledger import OPERATE_ROLE, Actor
from execkit.server._dashboard import LedgerView
from execkit.server._tokens import Principal, TokenFile

__all__ = ["SESSION_COOKIE", "Sessions", "dashboard_routes"]

SESSION_COOKIE = "execkit_session"
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 10_000
MAX_SESSIONS_PER_TOKEN = 64
_MAX_LOGIN_BYTES = 4096
_log = logging.getLogger("execkit.server")
_STATIC = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The page runs only its own script and style, and can be framed by nobody.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


@attrs.frozen
class _Session:
    # The token stays in this process's memory (never in an answer or a log), so that
    # each request looks it up again: a token revoked in the tokens file ends its
    # sessions at their next request, and a changed role applies at once.
    token: str = attrs.field(repr=False)
    csrf: str = attrs.field(repr=False)
    expires_at: float


class Sessions:
    """Browser sessions in memory (a restart signs everyone out), each valid for `ttl_s`.
    Thread-safe.

    Bounded per token and in all, and a token's sign-ins never sign another token out: a
    token holds at most `per_token` sessions (a new one drops its own oldest), and the
    server at most `limit`. When the pool is full even after the expired sessions are
    dropped, a token that holds sessions gives up its own oldest for the new one; a token
    that holds none is refused (`StorageError`, 503: "try again later"), since making room
    would sign out someone else."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = SESSION_TTL_S,
        limit: int = MAX_SESSIONS,
        per_token: int = MAX_SESSIONS_PER_TOKEN,
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._limit = limit
        self._per_token = min(per_token, limit)
        self._lock = threading.Lock()
        self._by_id: dict[str, _Session] = {}
        # Each token's session ids, oldest first (one TTL for all, so also the first to
        # expire): the bounds are kept by popping from the front.
        self._by_token: dict[str, OrderedDict[str, None]] = {}

    def open(self, token: str) -> tuple[str, str]:
        """A new session for a token already checked: (session id, CSRF token).
        StorageError when the pool is full of other tokens' sessions."""
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            mine = self._by_token.get(token)
            if mine is not None:
                self._expire(mine, now)
            if len(self._by_id) >= self._limit:
                for held in list(self._by_token.values()):
                    self._expire(held, now)
            mine = self._by_token.setdefault(token, OrderedDict())
            if len(self._by_id) >= self._limit and not mine:
                self._drop_empty(token)
                raise StorageError(
                    f"the server holds its limit of {self._limit} dashboard sessions, none "
                    "of them this token's: sign out elsewhere, or try again later"
                )
            while mine and (len(mine) >= self._per_token or len(self._by_id) >= self._limit):
                self._by_id.pop(mine.popitem(last=False)[0], None)
            self._by_id[sid] = _Session(token, csrf, now + self._ttl_s)
            mine[sid] = None
        return sid, csrf

    def _expire(self, held: OrderedDict[str, None], now: float) -> None:
        """Drop `held`'s expired sessions (the oldest first; the lock is held)."""
        while held:
            sid = next(iter(held))
            session = self._by_id.get(sid)
            if session is not None and session.expires_at > now:
                return
            held.popitem(last=False)
            if session is not None:
                self._drop(sid, session)

    def _drop(self, sid: str, session: _Session) -> None:
        del self._by_id[sid]
        held = self._by_token.get(session.token)
        if held is not None:
            held.pop(sid, None)
            self._drop_empty(session.token)

    def _drop_empty(self, token: str) -> None:
        if not self._by_token.get(token, True):
            del self._by_token[token]

    def get(self, sid: str | None) -> _Session | None:
        if not sid:
            return None
        with self._lock:
            session = self._by_id.get(sid)
            if session is not None and session.expires_at <= self._clock():
                self._drop(sid, session)
                return None
            return session

    def close(self, sid: str | None) -> None:
        with self._lock:
            session = self._by_id.get(sid or "")
            if session is not None:
                self._drop(sid or "", session)

    def count(self, token: str | None = None) -> int:
        """Sessions held (expired ones not yet dropped included): all, or `token`'s."""
        with self._lock:
            if token is None:
                return len(self._by_id)
            return len(self._by_token.get(token, ()))


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> Response:
    # Every string masked, as every API answer is (`_app._dumps`): the snapshot carries
    # titles, reasons and actors.
    return Response(
        json.dumps(mask_json(doc), sort_keys=True),
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def _error(status: int, code: str, message: str) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return _json(status, {"error": {"code": code, "message": redact(message)}}, headers)


def _static(name: str) -> bytes:
    return resources.files("execkit.server").joinpath("static", name).read_bytes()


class _Dashboard:
    def __init__(self, tokens: TokenFile, view: LedgerView, sessions: Sessions) -> None:
        self.tokens = tokens
        self.view = view
        self.sessions = sessions
        self.page = _static("dashboard.html")

    # -- who is asking ------------------------------------------------------------------

    def _lookup(self, token: str) -> Principal:
        try:
            principal = self.tokens.lookup(token)
        except ExecKitError as exc:
            message = f"the server cannot check tokens: {exc.message}"
            raise _Refused(503, "storage", message) from None
        if principal is None:
            raise _Refused(401, "unauthenticated", "unknown token")
        return principal

    def _who(self, request: Request) -> tuple[Principal, _Session | None]:
        """The principal asking: a bearer token, else the session cookie."""
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise _Refused(401, "unauthenticated", "send Authorization: Bearer TOKEN")
            return self._lookup(token.strip()), None
        sid = request.cookies.get(SESSION_COOKIE)
        session = self.sessions.get(sid)
        if session is None:
            raise _Refused(401, "unauthenticated", "sign in with a token (no session)")
        try:
            return self._lookup(session.token), session
        except _Refused as refused:
            if refused.status == 401:  # revoked since: this session is over
                self.sessions.close(sid)
                raise _Refused(401, "unauthenticated", "the session's token was revoked") from None
            raise

    @staticmethod
    def _same_origin(request: Request) -> None:
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin is None or origin != own:
            raise _Refused(403, "forbidden", "a cross-site request is refused (Origin)")

    def _posting(self, request: Request) -> Principal:
        principal, session = self._who(request)
        if session is not None:  # a cookie rode along: prove the page sent it
            self._same_origin(request)
            sent = request.headers.get("x-csrf-token", "")
            if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
                raise _Refused(403, "forbidden", "the CSRF token is missing or wrong")
        return principal

    # -- routes -------------------------------------------------------------------------

    def guarded(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except _Refused as exc:
                return _error(exc.status, exc.code, exc.message)
            except ExecKitError as exc:  # the API's statuses for the ledger's errors
                status = ERROR_STATUSES.get(exc.code, 500)
                return _error(status, exc.code if status != 500 else "error", exc.message)
            except Exception:  # the last line of defence: a JSON 500, never a traceback
                _log.exception("internal error serving %s", request.url.path)
                return _error(500, "error", "internal server error")

        handle.__name__ = handler.__name__
        return handle

    async def root(self, _request: Request) -> Response:
        return RedirectResponse("/dashboard", status_code=303)

    async def page_view(self, _request: Request) -> Response:
        return Response(self.page, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    async def task_view(self, request: Request) -> Response:
        self._who(request)
        task_id = request.path_params["task_id"]
        await run_in_threadpool(self.view.ledger.get_task, task_id)  # NotFound: 404
        return await self.page_view(request)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        kind = _STATIC.get(name)
        if kind is None:
            raise _Refused(404, "not_found", "no such file")
        return Response(
            _static(name), media_type=kind, headers={"X-Content-Type-Options": "nosniff"}
        )

    async def session_show(self, request: Request) -> Response:
        principal, session = self._who(request)
        return _json(200, self._describe(principal, session.csrf if session else None))

    @staticmethod
    def _describe(principal: Principal, csrf: str | None) -> dict[str, Any]:
        return {
            "actor": principal.actor,
            "roles": sorted(principal.roles),
            "can_operate": OPERATE_ROLE in principal.roles,
            "csrf": csrf,
        }

    async def session_open(self, request: Request) -> Response:
        self._same_origin(request)
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > _MAX_LOGIN_BYTES:
                raise _Refused(413, "invalid", "the sign-in body is too large")
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            raise _Refused(400, "invalid", "the sign-in body is not JSON") from None
        token = doc.get("token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token.strip():
            raise _Refused(400, "invalid", 'send {"token": "..."}')
        principal = self._lookup(token.strip())
        sid, csrf = self.sessions.open(token.strip())
        answer = _json(200, self._describe(principal, csrf))
        answer.set_cookie(
            SESSION_COOKIE,
            sid,
            max_age=int(SESSION_TTL_S),
            path="/dashboard",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    async def session_close(self, request: Request) -> Response:
        self._posting(request)
        self.sessions.close(request.cookies.get(SESSION_COOKIE))
        answer = _json(200, {"signed_out": True})
        answer.delete_cookie(SESSION_COOKIE, path="/dashboard")
        return answer

    async def snapshot(self, request: Request) -> Response:
        principal, _session = self._who(request)
        doc = dict(await run_in_threadpool(self.view.snapshot))
        doc["can_operate"] = OPERATE_ROLE in principal.roles
        return _json(200, doc)

    async def task(self, request: Request) -> Response:
        self._who(request)
        doc = await run_in_threadpool(self.view.task_page, request.path_params["task_id"])
        return _json(200, doc)

    async def retry_once(self, request: Request) -> Response:
        principal = self._posting(request)
        _needs_operate(principal, "retry once")
        task_id = request.path_params["task_id"]

        def retry() -> dict[str, Any]:
            task = self.view.ledger.retry_task(
                task_id,
                actor=Actor(principal.actor),
                reason="retry once (dashboard)",
                force=True,
            )
            return {"task": task.to_dict()}

        doc = await run_in_threadpool(retry)
        self.view.invalidate()
        return _json(200, doc)

    async def resume_lane(self, request: Request) -> Response:
        principal = self._posting(request)
        _needs_operate(principal, "resume")
        lane = request.path_params["lane"]
        doc = await run_in_threadpool(self.view.resume_lane, lane, Actor(principal.actor))
        return _json(200, {"lane": doc})


def _needs_operate(principal: Principal, action: str) -> None:
    if OPERATE_ROLE not in principal.roles:
        raise _Refused(
            403,
            "forbidden",
            f"{action} needs the token role {OPERATE_ROLE}; this token "
            f"({principal.actor}) has {', '.join(sorted(principal.roles)) or 'none'}",
        )


def dashboard_routes(tokens: TokenFile, view: LedgerView, sessions: Sessions) -> list[BaseRoute]:
    """The dashboard's routes (see the module docstring)."""
    board = _Dashboard(tokens, view, sessions)
    g = board.guarded
    return [
        Route("/", g(board.root), methods=["GET"]),
        Route("/dashboard", g(board.page_view), methods=["GET"]),
        Route("/dashboard/tasks/{task_id}", g(board.task_view), methods=["GET"]),
        Route("/dashboard/static/{name}", g(board.static), methods=["GET"]),
        Route("/dashboard/api/session", g(board.session_show), methods=["GET"]),
        Route("/dashboard/api/session", g(board.session_open), methods=["POST"]),
        Route("/dashboard/api/session/close", g(board.session_close), methods=["POST"]),
        Route("/dashboard/api/snapshot", g(board.snapshot), methods=["GET"]),
        Route("/dashboard/api/tasks/{task_id}", g(board.task), methods=["GET"]),
        Route("/dashboard/api/tasks/{task_id}/retry-once", g(board.retry_once), methods=["POST"]),
        # A lane's name has a slash in it (`adapter/credential[@host]`).
        Route("/dashboard/api/lanes/{lane:path}/resume", g(board.resume_lane), methods=["POST"]),
    ]
