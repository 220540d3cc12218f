"""`execkit serve`: the ledger over HTTP (docs/remote.md).

The route table (every endpoint, its token role, its fields, its ledger call) and the
OpenAPI 3.1 document generated from it live in `execkit._api`, the one description of the
API, which the client (`execkit.remote`) is built from too. The rooms here: `_app` (the
Starlette application over that table: authentication, checks, idempotency, bounds),
`_tokens` (the hashed tokens file), `_listen` (the listening address and
`ConnectionLimits`), `_protocol` (the HTTP/1.1 protocol: the connection limit, the
timeouts, the head's bounds, the answers made before any application sees a request),
`_api_cycle` (an API request served from the parser's callbacks) and `_serve` (uvicorn, a
server in a thread). Idempotency-Key answers are the ledger's own (docs/remote.md).
`python -m execkit.server --openapi` prints the document without starting a server.

Starlette, uvicorn and httptools are the optional extra `execkit-runner[server]`; the names
that need them load on first use, so `add_token`, `TokenFile` (`execkit serve
--add-token`), `ConnectionLimits` and `openapi_document` work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from execkit.server._listen import (
    DEFAULT_LISTEN,
    MAX_CONNECTIONS_LIMIT,
    ConnectionLimits,
    parse_listen,
)
from execkit.server._tokens import Principal, TokenFile, add_token, token_hash

if TYPE_CHECKING:
    from execkit._api import openapi_document
    from execkit.server._app import LedgerApp
    from execkit.server._serve import ServerThread, serve, serving

__all__ = [
    "DEFAULT_LISTEN",
    "MAX_CONNECTIONS_LIMIT",
    "ConnectionLimits",
    "LedgerApp",
    "Principal",
    "ServerThread",
    "TokenFile",
    "add_token",
    "openapi_document",
    "parse_listen",
    "serve",
    "serving",
    "token_hash",
]

INSTALL_HINT = "pip install 'execkit-runner[server]'"
_EXTRA = ("starlette", "uvicorn", "httptools")

_LAZY = {
    "LedgerApp": "execkit.server._app",
    "openapi_document": "execkit._api",
    "ServerThread": "execkit.server._serve",
    "serve": "execkit.server._serve",
    "serving": "execkit.server._serve",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'execkit.server' has no attribute {name!r}")
    try:
        loaded = __import__(module, fromlist=[name])
    except ImportError as exc:
        if exc.name not in _EXTRA and not str(exc.name).startswith(
            tuple(f"{name}." for name in _EXTRA)
        ):
            raise
        from execkit._errors import ExecKitError

        raise ExecKitError(
            f"execkit serve needs {exc.name.split('.')[0] if exc.name else 'starlette'}, "
            f"which is not installed: {INSTALL_HINT}"
        ) from None
    return getattr(loaded, name)
