"""A loopback fake of the part of Linear's GraphQL API a Linear board uses (issue #48).

Every document the board sends is executed by graphql-core against
`linear_graphql.graphql`, a part of Linear's published schema (linear/linear,
packages/sdk/src/schema.graphql) cut from it, not written by hand: a document asking for a
field or an argument that schema does not have is refused, as Linear would. The resolvers
here answer `teams` (by key, with the team's workflow states), `issues` (an `IssueFilter` on
the team's key and `updatedAt`, ordered by `updatedAt`, cursor pages of `first`), `issue`
(its comments), `issueUpdate` (the state), `commentCreate` and `commentUpdate`.

Rate limits and errors have Linear's shapes (its SDK's `parseLinearError` reads them): every
answer carries `X-RateLimit-Requests-Limit`, `-Remaining`, `-Reset` (epoch milliseconds) and
the complexity headers; a spent budget (`rate_limited`) answers 400 with an error whose
`extensions` say `RATELIMITED` / `ratelimited`; a key that is not the fake's answers 400 with
an `authentication error`; `fail_next` answers the next requests with the given status (502)
and `write_failure` a seeded share of the mutations with 502, half of them after the write
was made (a gateway that lost the answer). It listens on 127.0.0.1 only and stops with
`close()`.
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY = "lin_api_fake0123456789abcdefghijklmnopqrstuvwxyz0123"
TEAM = "ENG"
_STATES = [
    ("st-backlog", "Backlog", "backlog", 0.0),
    ("st-todo", "Todo", "unstarted", 1.0),
    ("st-progress", "In Progress", "started", 2.0),
    ("st-review", "In Review", "started", 3.0),
    ("st-done", "Done", "completed", 4.0),
    ("st-canceled", "Canceled", "canceled", 5.0),
]


def _iso_ms(moment_ms: int) -> str:
    seconds, ms = divmod(moment_ms, 1000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms:03d}Z"


class FakeLinear:
    """The fake's state and server (see the module docstring). `requests` counts every
    request answered, `writes` the mutations made; `comments` holds each issue's comments
    by identifier."""

    def __init__(self, *, write_failure: float = 0.0, seed: int = 48) -> None:
        self.states: list[dict[str, Any]] = [
            {"id": i, "name": n, "type": t, "position": p} for i, n, t, p in _STATES
        ]
        self.issues: dict[str, dict[str, Any]] = {}  # by identifier
        self.comments: dict[str, list[dict[str, Any]]] = {}
        self.requests = 0
        self.writes = 0
        self.rate_limited = 0  # the next this many requests: RATELIMITED
        self.fail_next: list[int] = []
        self.write_failure = write_failure
        self.limit = 5000
        self.remaining = 5000
        self.reset_ms = int(time.time() * 1000) + 3_600_000
        self._rng = random.Random(seed)
        self._clock_ms = 1_800_000_000_000
        self._number = 0
        self._schema: Any = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/graphql"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the state ----------------------------------------------------------------------

    def _tick(self) -> str:
        self._clock_ms += 1
        return _iso_ms(self._clock_ms)

    def add_issue(
        self,
        title: str,
        description: str = "",
        *,
        labels: tuple[str, ...] = ("execkit",),
        state: str = "Todo",
    ) -> str:
        """A new issue of the team; its identifier (`ENG-1`, ...)."""
        with self._lock:
            self._number += 1
            identifier = f"{TEAM}-{self._number}"
            self.issues[identifier] = {
                "id": f"uuid-{self._number:06d}",
                "identifier": identifier,
                "title": title,
                "description": description,
                "updatedAt": self._tick(),
                "archivedAt": None,
                "stateId": self._state_named(state)["id"],
                "labels": list(labels),
            }
            self.comments[identifier] = []
            return identifier

    def set_state(self, identifier: str, state: str) -> None:
        """A person moves the issue (to the state named `state`)."""
        with self._lock:
            issue = self.issues[identifier]
            issue["stateId"] = self._state_named(state)["id"]
            issue["updatedAt"] = self._tick()

    def state_of(self, identifier: str) -> str:
        """The name of the workflow state the issue stands in."""
        return str(self._state_by_id(self.issues[identifier]["stateId"])["name"])

    def _state_named(self, name: str) -> dict[str, Any]:
        return next(state for state in self.states if state["name"] == name)

    def _state_by_id(self, state_id: str) -> dict[str, Any]:
        return next(state for state in self.states if state["id"] == state_id)

    def _by_uuid(self, uuid: str) -> dict[str, Any] | None:
        return next(
            (issue for issue in self.issues.values() if uuid in (issue["id"], issue["identifier"])),
            None,
        )

    # -- the GraphQL resolvers --------------------------------------------------------------

    def _view(self, issue: dict[str, Any]) -> dict[str, Any]:
        identifier = issue["identifier"]
        return {
            **issue,
            "state": self._state_by_id(issue["stateId"]),
            "labels": lambda _info, **_kw: {
                "nodes": [{"id": f"label-{n}", "name": n} for n in issue["labels"]],
                "pageInfo": {"hasNextPage": False, "endCursor": None},
            },
            "comments": lambda _info, first=50, after=None, **_kw: _page(
                list(self.comments[identifier]), first, after
            ),
        }

    def _teams(self, _info: Any, filter: dict[str, Any] | None = None, **_kw: Any) -> Any:
        key = ((filter or {}).get("key") or {}).get("eq")
        nodes = []
        if key in (None, TEAM):
            states = sorted(self.states, key=lambda s: float(s["position"]))
            nodes.append(
                {
                    "id": "team-eng",
                    "key": TEAM,
                    "name": "Engineering",
                    "states": lambda _info, **_kw: {
                        "nodes": states,
                        "pageInfo": {"hasNextPage": False, "endCursor": None},
                    },
                }
            )
        return {"nodes": nodes, "pageInfo": {"hasNextPage": False, "endCursor": None}}

    def _issues(
        self,
        _info: Any,
        filter: dict[str, Any] | None = None,
        first: int = 50,
        after: str | None = None,
        orderBy: str = "createdAt",
        **_kw: Any,
    ) -> Any:
        filter = filter or {}
        key = ((filter.get("team") or {}).get("key") or {}).get("eq")
        updated = filter.get("updatedAt") or {}
        found = [
            issue
            for issue in self.issues.values()
            if key in (None, TEAM)
            and ("gte" not in updated or issue["updatedAt"] >= updated["gte"])
            and ("gt" not in updated or issue["updatedAt"] > updated["gt"])
        ]
        found.sort(key=lambda i: i["updatedAt"] if orderBy == "updatedAt" else i["id"])
        return _page([self._view(issue) for issue in found], first, after)

    def _issue(self, _info: Any, id: str) -> Any:
        issue = self._by_uuid(id)
        if issue is None:
            raise LookupError("Entity not found: Issue")
        return self._view(issue)

    def _issue_update(self, _info: Any, id: str, input: dict[str, Any]) -> Any:
        issue = self._by_uuid(id)
        if issue is None:
            raise LookupError("Entity not found: Issue")
        if "stateId" in input:
            self._state_by_id(input["stateId"])
            issue["stateId"] = input["stateId"]
        issue["updatedAt"] = self._tick()
        self.writes += 1
        return {"success": True, "lastSyncId": 1.0, "issue": self._view(issue)}

    def _comment_create(self, _info: Any, input: dict[str, Any]) -> Any:
        issue = self._by_uuid(input["issueId"])
        if issue is None:
            raise LookupError("Entity not found: Issue")
        comment = {
            "id": f"comment-{sum(len(c) for c in self.comments.values()) + 1}",
            "body": input["body"],
            "updatedAt": self._tick(),
        }
        self.comments[issue["identifier"]].append(comment)
        issue["updatedAt"] = comment["updatedAt"]
        self.writes += 1
        return {"success": True, "lastSyncId": 1.0, "comment": comment}

    def _comment_update(self, _info: Any, id: str, input: dict[str, Any], **_kw: Any) -> Any:
        for comments in self.comments.values():
            for comment in comments:
                if comment["id"] == id:
                    comment["body"] = input["body"]
                    comment["updatedAt"] = self._tick()
                    self.writes += 1
                    return {"success": True, "lastSyncId": 1.0, "comment": comment}
        raise LookupError("Entity not found: Comment")

    # -- one request ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "x-ratelimit-requests-limit": str(self.limit),
            "x-ratelimit-requests-remaining": str(max(0, self.remaining)),
            "x-ratelimit-requests-reset": str(self.reset_ms),
            "x-ratelimit-complexity-limit": "3000000",
            "x-ratelimit-complexity-remaining": "2999000",
            "x-ratelimit-complexity-reset": str(self.reset_ms),
        }

    def answer(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], Any]:
        from graphql import build_schema, graphql_sync

        with self._lock:
            self.requests += 1
            if headers.get("authorization") != KEY:
                return (
                    400,
                    self._headers(),
                    _error(
                        "Authentication required, not authenticated",
                        "AUTHENTICATION_ERROR",
                        "authentication error",
                    ),
                )
            if self.fail_next:
                return self.fail_next.pop(0), {}, {"message": "Bad gateway"}
            if self.rate_limited or self.remaining <= 0:
                self.rate_limited = max(0, self.rate_limited - 1)
                return (
                    400,
                    self._headers(),
                    _error("Rate limit exceeded", "RATELIMITED", "ratelimited"),
                )
            self.remaining -= 1
            if self._schema is None:
                here = __file__.rsplit("/", 1)[0]
                with open(f"{here}/linear_graphql.graphql", encoding="utf-8") as handle:
                    self._schema = build_schema(handle.read())
            request = json.loads(body)
            document = str(request["query"])
            lost = False
            mutation = document.lstrip().startswith("mutation")
            if mutation and self.write_failure and self._rng.random() < self.write_failure:
                if self._rng.random() < 0.5:
                    return 502, {}, {"message": "Bad gateway"}
                lost = True  # made, and its answer lost
            root = {
                "teams": self._teams,
                "issues": self._issues,
                "issue": self._issue,
                "issueUpdate": self._issue_update,
                "commentCreate": self._comment_create,
                "commentUpdate": self._comment_update,
            }
            result = graphql_sync(
                self._schema, document, root, variable_values=request.get("variables")
            )
            if lost:
                return 502, {}, {"message": "Bad gateway"}
            out: dict[str, Any] = {"data": result.data}
            if result.errors:
                out["errors"] = [
                    {
                        "message": error.message,
                        "path": error.path,
                        "extensions": {
                            "type": "invalid input" if error.path else "graphql error",
                            "userError": True,
                        },
                    }
                    for error in result.errors
                ]
                # A document the schema refuses is Linear's 400; a resolver's error is 200.
                return (200 if result.data else 400), self._headers(), out
            return 200, self._headers(), out


def _error(message: str, code: str, kind: str) -> dict[str, Any]:
    return {
        "errors": [
            {
                "message": message,
                "extensions": {
                    "code": code,
                    "type": kind,
                    "userError": True,
                    "userPresentableMessage": message,
                },
            }
        ]
    }


def _page(nodes: list[Any], first: int, after: str | None) -> dict[str, Any]:
    start = int(after) if after else 0
    chunk = nodes[start : start + first]
    more = start + first < len(nodes)
    return {
        "nodes": chunk,
        "pageInfo": {"hasNextPage": more, "endCursor": str(start + first) if chunk else None},
    }


def _handler(fake: FakeLinear) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, out, data = fake.answer(headers, body)
            raw = json.dumps(data).encode()
            self.send_response(status)
            for key, value in out.items():
                self.send_header(key, value)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet

    return Handler
