"""A loopback fake of the part of Jira Cloud's REST API v3 a Jira board uses (issue #48).

Its shapes are written from Atlassian's published REST v3 description (the OpenAPI document
behind developer.atlassian.com/cloud/jira/platform/rest/v3), not copied, and checked against
it: `test_jira_board.py` validates what the fake sends against the part of that description
in `jira_openapi_part.json` (`IssueBean`, `StatusDetails`, `IssueLinkType`, `LinkedIssue`,
`Transitions`, `PageOfComments`, `Comment`). The endpoints: `POST
/rest/api/3/search/jql` (`jql`, `maxResults`, `fields`, `nextPageToken`; answers `issues`,
`nextPageToken`, `isLast`), an issue (`id`, `key`, `self`, `fields`: `summary`,
`description` in Atlassian Document Format, `status` with its `statusCategory`, `labels`,
`issuelinks` with `type` and `inwardIssue`/`outwardIssue`, `updated`), `GET|POST
/rest/api/3/issue/{key}/transitions` (`transitions` with `id`, `name`, `to`), `GET|POST
/rest/api/3/issue/{key}/comment` (`startAt`, `maxResults`, `total`, `comments`) and `PUT
.../comment/{id}`, a comment's `body` in ADF. Its JQL understands what the board sends:
`(project = "KEY" AND labels = "execkit") AND updated >= "yyyy-MM-dd HH:mm" ORDER BY
updated ASC`, and refuses anything else with Jira's 400 `errorMessages`.

Errors have Jira's shapes: a wrong credential 401 (`errorMessages`), a spent limit
(`rate_limited`) 429 with `Retry-After` and `X-RateLimit-Reset`, `fail_next` the next
requests with a status. It listens on 127.0.0.1 only and stops with `close()`.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

EMAIL = "bot@example.com"
TOKEN = "ATATT3xFfGF0fake0123456789abcdefghij"
PROJECT = "ENG"
_STATUSES = {
    "To Do": ("10000", "new"),
    "In Progress": ("3", "indeterminate"),
    "Done": ("10001", "done"),
    "Won't Do": ("10002", "done"),
}
# The workflow: from each status, the statuses a transition leads to.
_WORKFLOW = {
    "To Do": ["In Progress", "Done", "Won't Do"],
    "In Progress": ["To Do", "Done", "Won't Do"],
    "Done": ["To Do"],
    "Won't Do": ["To Do"],
}
_JQL = re.compile(
    r'\(project = "(?P<project>[A-Z0-9_]+)" AND labels = "(?P<label>[^"]+)"\)'
    r'(?: AND updated >= "(?P<since>\d{4}-\d\d-\d\d \d\d:\d\d)")? ORDER BY updated ASC\Z'
)


def _status(name: str) -> dict[str, Any]:
    status_id, category = _STATUSES[name]
    return {
        "id": status_id,
        "name": name,
        "statusCategory": {
            "id": {"new": 2, "indeterminate": 4, "done": 3}[category],
            "key": category,
        },
    }


def _adf(text: str) -> dict[str, Any]:
    return {
        "type": "doc",
        "version": 1,
        "content": [{"type": "paragraph", "content": [{"type": "text", "text": text}]}],
    }


class FakeJira:
    """The fake's state and server (see the module docstring)."""

    def __init__(self) -> None:
        self.issues: dict[str, dict[str, Any]] = {}
        self.comments: dict[str, list[dict[str, Any]]] = {}
        self.links: list[tuple[str, str]] = []  # (blocker, blocked)
        self.requests = 0
        self.writes = 0
        self.rate_limited = 0
        self.fail_next: list[int] = []
        self._seconds = 1_800_000_000
        self._next_id = 10_000
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _tick(self) -> str:
        self._seconds += 1
        moment = datetime.fromtimestamp(self._seconds, UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.000+0000")

    def add_issue(
        self,
        summary: str,
        description: str = "",
        *,
        labels: tuple[str, ...] = ("execkit",),
        status: str = "To Do",
    ) -> str:
        with self._lock:
            self._next_id += 1
            key = f"{PROJECT}-{len(self.issues) + 1}"
            self.issues[key] = {
                "id": str(self._next_id),
                "key": key,
                "summary": summary,
                "description": _adf(description) if description else None,
                "status": status,
                "labels": list(labels),
                "updated": self._tick(),
            }
            self.comments[key] = []
            return key

    def block(self, blocker: str, blocked: str) -> None:
        """A `Blocks` link: `blocker` blocks `blocked`."""
        with self._lock:
            self.links.append((blocker, blocked))
            self.issues[blocked]["updated"] = self._tick()

    def set_status(self, key: str, status: str) -> None:
        with self._lock:
            self.issues[key]["status"] = status
            self.issues[key]["updated"] = self._tick()
            for blocker, blocked in self.links:  # a link shows the other issue's status
                if blocker == key:
                    self.issues[blocked]["updated"] = self.issues[key]["updated"]

    def status_of(self, key: str) -> str:
        return str(self.issues[key]["status"])

    def status_comments(self, key: str) -> list[str]:
        texts = [_text(c["body"]) for c in self.comments[key]]
        return [t for t in texts if t.startswith("execkit status")]

    # -- one request ----------------------------------------------------------------------

    def _view(self, issue: dict[str, Any]) -> dict[str, Any]:
        key = issue["key"]
        links = []
        for n, (blocker, blocked) in enumerate(self.links):
            other = blocker if blocked == key else blocked if blocker == key else None
            if other is None:
                continue
            side = "inwardIssue" if blocked == key else "outwardIssue"
            links.append(
                {
                    "id": str(20_000 + n),
                    "type": {"id": "10000", "name": "Blocks", "inward": "is blocked by",
                             "outward": "blocks"},
                    side: {
                        "id": self.issues[other]["id"],
                        "key": other,
                        "fields": {
                            "summary": self.issues[other]["summary"],
                            "status": _status(self.issues[other]["status"]),
                        },
                    },
                }
            )  # fmt: skip
        return {
            "id": issue["id"],
            "key": key,
            "self": f"{self.url}/rest/api/3/issue/{issue['id']}",
            "fields": {
                "summary": issue["summary"],
                "description": issue["description"],
                "status": _status(issue["status"]),
                "labels": issue["labels"],
                "issuelinks": links,
                "updated": issue["updated"],
            },
        }

    def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            self.requests += 1
            basic = "Basic " + base64.b64encode(f"{EMAIL}:{TOKEN}".encode()).decode()
            if headers.get("authorization") not in (basic, f"Bearer {TOKEN}"):
                return 401, {}, {"errorMessages": ["You are not authenticated."], "errors": {}}
            if self.fail_next:
                return self.fail_next.pop(0), {}, None
            if self.rate_limited:
                self.rate_limited -= 1
                reset = datetime.fromtimestamp(self._seconds + 3600, UTC).isoformat()
                extra = {"retry-after": "30", "x-ratelimit-reset": reset}
                return 429, extra, {"errorMessages": ["Rate limit exceeded."], "errors": {}}
            parts = urlsplit(target)
            path = unquote(parts.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            data = json.loads(body) if body else {}
            if method == "POST" and path == "/rest/api/3/search/jql":
                return self._search(data)
            match = re.fullmatch(r"/rest/api/3/issue/([A-Z0-9_]+-\d+)(/.*)?", path)
            if match is None or match.group(1) not in self.issues:
                return 404, {}, {"errorMessages": ["Issue does not exist"], "errors": {}}
            key, rest = match.group(1), match.group(2) or ""
            issue = self.issues[key]
            if rest == "/transitions" and method == "GET":
                return 200, {}, {
                    "transitions": [
                        {"id": _STATUSES[to][0] + "1", "name": f"Move to {to}", "to": _status(to)}
                        for to in _WORKFLOW[issue["status"]]
                    ]
                }  # fmt: skip
            if rest == "/transitions" and method == "POST":
                wanted = str((data.get("transition") or {}).get("id"))
                for to in _WORKFLOW[issue["status"]]:
                    if _STATUSES[to][0] + "1" == wanted:
                        issue["status"], issue["updated"] = to, self._tick()
                        self.writes += 1
                        return 204, {}, None
                return 400, {}, {"errorMessages": ["Transition id is not valid"], "errors": {}}
            if rest == "/comment" and method == "GET":
                comments = self.comments[key]
                start, most = int(query.get("startAt", 0)), int(query.get("maxResults", 50))
                page = comments[start : start + most]
                return 200, {}, {
                    "startAt": start, "maxResults": most, "total": len(comments),
                    "comments": page,
                }  # fmt: skip
            if rest == "/comment" and method == "POST":
                self._next_id += 1
                at = self._tick()
                comment = {"id": str(self._next_id), "body": data["body"], "created": at,
                           "updated": at}  # fmt: skip
                self.comments[key].append(comment)
                issue["updated"] = at
                self.writes += 1
                return 201, {}, comment
            found = re.fullmatch(r"/comment/(\d+)", rest)
            if found and method == "PUT":
                for comment in self.comments[key]:
                    if comment["id"] == found.group(1):
                        comment["body"], comment["updated"] = data["body"], self._tick()
                        self.writes += 1
                        return 200, {}, comment
            return 404, {}, {"errorMessages": ["Not found"], "errors": {}}

    def _search(self, data: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        match = _JQL.match(str(data.get("jql") or ""))
        if match is None:
            return 400, {}, {"errorMessages": ["Error in the JQL Query"], "errors": {}}
        since = match.group("since")
        found = [
            issue
            for key, issue in self.issues.items()
            if key.startswith(match.group("project") + "-")
            and match.group("label") in issue["labels"]
            and (since is None or issue["updated"][:16].replace("T", " ") >= since)
        ]
        found.sort(key=lambda i: str(i["updated"]))
        start = int(data.get("nextPageToken") or 0)
        most = int(data.get("maxResults") or 50)
        page = found[start : start + most]
        last = start + most >= len(found)
        out: dict[str, Any] = {"issues": [self._view(i) for i in page], "isLast": last}
        if not last:
            out["nextPageToken"] = str(start + most)
        return 200, {}, out


def _text(node: Any) -> str:
    if not isinstance(node, dict):
        return ""
    if node.get("type") == "text":
        return str(node.get("text") or "")
    parts = [_text(child) for child in node.get("content") or []]
    return ("\n" if node.get("type") == "doc" else "").join(p for p in parts if p)


def _handler(fake: FakeJira) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, out, data = fake.answer(self.command, self.path, headers, body)
            raw = b"" if data is None else json.dumps(data).encode()
            self.send_response(status)
            for key, value in out.items():
                self.send_header(key, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            if raw:
                self.wfile.write(raw)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet

    return Handler
