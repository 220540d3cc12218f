"""The HTTP API of `execkit serve`, described once (docs/remote.md).

Both ends are built from this room: the server (`execkit.server`) routes requests with the
table and serves the OpenAPI document generated from it; the client
(`execkit.remote.RemoteLedger`) has the table's rows as its `Ledger` methods. It imports
neither Starlette nor uvicorn, so a runner that installs only the base package has the
client.

    row.py      one row: `Endpoint` with its `Field`s, its server side (a handler taking a
                `Call`) and its client side (the `Ledger` method it binds, `Needs`)
    wire.py     the client's half of the wire: answers back into the ledger's values
    routes.py   the table: `LedgerRoutes`, `CAPABILITIES`, `OPENAPI`, `ENDPOINTS`
    openapi.py  `ERROR_STATUSES` and `openapi_document()`, generated from the table
"""

from __future__ import annotations

from execkit._api.openapi import ERROR_STATUSES, openapi_document, package_version
from execkit._api.routes import CAPABILITIES, ENDPOINTS, OPENAPI, LedgerRoutes
from execkit._api.row import Call, Endpoint, Field, Handler, Needs, Sender
from execkit._api.wire import ATTEMPT_LIMITS

__all__ = [
    "ATTEMPT_LIMITS",
    "CAPABILITIES",
    "ENDPOINTS",
    "ERROR_STATUSES",
    "OPENAPI",
    "Call",
    "Endpoint",
    "Field",
    "Handler",
    "LedgerRoutes",
    "Needs",
    "Sender",
    "openapi_document",
    "package_version",
]
