"""What `execkit serve` serves: the API (`_app.LedgerApp.app`, exactly its route table)
behind the dashboard's and the monitoring's own routes, all inside the access log.

    AccessLog (_access_log) ─► /v1/..., /openapi.json ─► the API (its route table)
                               /healthz /readyz /metrics (_metrics)
                               /, /dashboard... (_dashboard_http)
                               POST /hooks/github|linear|gitlab, each with its
                               webhook secret (_hooks)
                               everything else ─► the API (its 404 and 405 answers)

The API's application keeps only the routes of its table (its OpenAPI document and
docs/remote.md's "Endpoints" are checked against it); these routes are documented in
docs/remote.md, "Monitoring and the dashboard".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from execkit.dispatch import Board
from execkit.ledger import Ledger
from execkit.server._access_log import AccessLog
from execkit.server._dashboard import LedgerView
from execkit.server._dashboard_http import Sessions, dashboard_routes
from execkit.server._hooks import Hook
from execkit.server._metrics import Monitoring
from execkit.server._tokens import TokenFile

__all__ = ["Front"]

_API_PREFIX = "/v1/"
_API_DOCUMENT = "/openapi.json"


class Front:
    """The served ASGI application (`asgi`) and the parts a test or a benchmark reaches:
    `view` (the cached ledger reading), `monitoring` (the registry), `sessions`, `hooks`
    (the trackers' webhook routes by tracker: one per secret in `webhook_secrets`)."""

    def __init__(
        self,
        api: ASGIApp,
        ledger: Ledger,
        tokens: TokenFile,
        http_exception: Callable[[Request, Exception], Awaitable[Response]],
        server_error: Callable[[Request, Exception], Awaitable[Response]],
        *,
        board: Board | None = None,
        webhook_secrets: Mapping[str, bytes] | None = None,
    ) -> None:
        self.view = LedgerView(ledger, board=board)
        self.monitoring = Monitoring(ledger, tokens, self.view)
        self.sessions = Sessions()
        # The trackers' webhooks, each whose secret is given (_hooks): a delivery wakes the
        # dispatchers.
        self.hooks = {
            name: Hook(ledger, name, secret) for name, secret in (webhook_secrets or {}).items()
        }
        routes = [
            *self.monitoring.routes(),
            *dashboard_routes(tokens, self.view, self.sessions),
            *(route for hook in self.hooks.values() for route in hook.routes()),
        ]
        for route in routes:
            path = getattr(route, "path", "")
            if path.startswith(_API_PREFIX) or path == _API_DOCUMENT:
                raise ValueError(f"the route {path} is in the API's paths")
        site = Starlette(
            routes=routes,
            exception_handlers={HTTPException: http_exception, Exception: server_error},
        )
        # What no route here matches goes to the API, whose 404 and 405 answers it keeps
        # (a wrong method on a route here is this router's 405, before the API is asked).
        site.router.default = api
        self.site = site
        self.api = api
        self.asgi = AccessLog(self._serve, (self.monitoring.observe,))

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        # No route here is under /v1/ or is /openapi.json (checked at construction): such a
        # path would go through this router's patterns to reach the API; it goes there at once.
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(_API_PREFIX) or path == _API_DOCUMENT:
            await self.api(scope, receive, send)
        else:
            await self.site(scope, receive, send)
