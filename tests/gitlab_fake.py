"""A loopback fake of the part of GitLab's REST API v4 a GitLab board uses (issue #48).

Its shapes follow GitLab's published JSON schemas of its REST v4 answers (gitlabhq,
spec/fixtures/api/schemas/public_api/v4/issue.json and notes.json, written out in
`gitlab_api_schemas.json`; `test_gitlab_board.py` checks the fake's answers against
them): an issue (`id`, `iid`, `project_id`, `title`, `description`, `state`
`opened`/`closed`, `labels` as names, `author`, `created_at`, `updated_at`, `closed_at`,
`web_url`, ...), a note (`id`, `body`, `author`, `system`,
`noteable_type`, `noteable_iid`, `created_at`, `updated_at`). Authentication is the
`PRIVATE-TOKEN` header (the description's `access_token_header`).

The endpoints: `GET /api/v4/projects/:id/issues` (`state`, `updated_after`, `order_by`,
`sort`, `per_page`, `page`; `X-Next-Page`, `X-Page`, `X-Per-Page`; an `ETag` on every answer
and 304 for a matching `If-None-Match`), `PUT .../issues/:iid` (`add_labels`,
`remove_labels`, `state_event`), `GET|POST .../issues/:iid/notes`, `PUT
.../issues/:iid/notes/:note_id`. Every answer carries `RateLimit-Limit`,
`RateLimit-Remaining`, `RateLimit-Reset` (epoch seconds); a spent limit (`remaining`, or
`rate_limited`) answers 429 with `Retry-After`; a token that is not the fake's 401
`{"message": "401 Unauthorized"}`; `fail_next` the next requests with a status. It listens on
127.0.0.1 only and stops with `close()`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "glpat-fake0123456789abcdefghij"
PROJECT = "acme/widgets"
_AUTHOR = {
    "id": 1,
    "username": "root",
    "name": "Administrator",
    "state": "active",
    "avatar_url": "https://gitlab.example.com/uploads/-/system/user/avatar/1/avatar.png",
    "web_url": "https://gitlab.example.com/root",
}


def _iso(moment: int) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class FakeGitLab:
    """The fake's state and server (see the module docstring)."""

    def __init__(self) -> None:
        self.issues: dict[int, dict[str, Any]] = {}
        self.notes: dict[int, list[dict[str, Any]]] = {}
        self.requests = 0
        self.writes = 0
        self.not_modified = 0
        self.rate_limited = 0
        self.fail_next: list[int] = []
        self.limit = 2000
        self.remaining = 2000
        self.reset_at = int(time.time()) + 60
        self._clock = 1_800_000_000
        self._next_id = 500
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
        self._clock += 1
        return _iso(self._clock)

    def add_issue(
        self, title: str, description: str = "", *, labels: tuple[str, ...] = ("execkit",)
    ) -> int:
        with self._lock:
            iid = len(self.issues) + 1
            self._next_id += 1
            at = self._tick()
            self.issues[iid] = {
                "id": self._next_id,
                "iid": iid,
                "project_id": 7,
                "title": title,
                "description": description,
                "state": "opened",
                "labels": list(labels),
                "author": _AUTHOR,
                "created_at": at,
                "updated_at": at,
                "closed_at": None,
                "milestone": None,
                "assignees": [],
                "user_notes_count": 0,
                "upvotes": 0,
                "downvotes": 0,
                "due_date": None,
                "confidential": False,
                "web_url": f"https://gitlab.example.com/{PROJECT}/-/issues/{iid}",
            }
            self.notes[iid] = []
            return iid

    def set_labels_by_hand(self, iid: int, names: set[str]) -> None:
        """A person's edit on the issue's page."""
        with self._lock:
            self.issues[iid]["labels"] = sorted(names)
            self.issues[iid]["updated_at"] = self._tick()

    def labels_of(self, iid: int) -> set[str]:
        return set(self.issues[iid]["labels"])

    def status_notes(self, iid: int) -> list[dict[str, Any]]:
        return [n for n in self.notes[iid] if n["body"].startswith("<!-- execkit:status -->")]

    # -- one request ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "ratelimit-limit": str(self.limit),
            "ratelimit-remaining": str(max(0, self.remaining)),
            "ratelimit-reset": str(self.reset_at),
        }

    def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            self.requests += 1
            if headers.get("private-token") != TOKEN:
                return 401, {}, {"message": "401 Unauthorized"}
            if self.fail_next:
                return self.fail_next.pop(0), {}, {"message": "502 Bad Gateway"}
            if self.rate_limited or self.remaining <= 0:
                self.rate_limited = max(0, self.rate_limited - 1)
                extra = {**self._headers(), "retry-after": "60", "ratelimit-remaining": "0"}
                return 429, extra, {"message": "Retry later"}
            self.remaining -= 1
            parts = urlsplit(target)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            path = unquote(parts.path)
            base = f"/api/v4/projects/{PROJECT}/issues"
            data = json.loads(body) if body else {}
            if method == "GET" and path == base:
                return self._list(query, headers)
            rest = path[len(base) :].strip("/").split("/") if path.startswith(base) else []
            if not rest or not rest[0].isdigit() or int(rest[0]) not in self.issues:
                return 404, self._headers(), {"message": "404 Not found"}
            iid = int(rest[0])
            issue = self.issues[iid]
            if method == "PUT" and len(rest) == 1:
                labels = [
                    n
                    for n in issue["labels"]
                    if n not in (data.get("remove_labels") or "").split(",")
                ]
                for name in (data.get("add_labels") or "").split(","):
                    if name and name not in labels:
                        labels.append(name)
                issue["labels"] = labels
                if data.get("state_event") == "close":
                    issue["state"], issue["closed_at"] = "closed", self._tick()
                issue["updated_at"] = self._tick()
                self.writes += 1
                return 200, self._headers(), issue
            if len(rest) >= 2 and rest[1] == "notes":
                return self._notes(method, iid, rest[2:], query, data)
            return 404, self._headers(), {"message": "404 Not found"}

    def _list(
        self, query: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        state = query.get("state", "all")
        after = query.get("updated_after")
        found = [
            issue
            for issue in self.issues.values()
            if state in ("all", issue["state"]) and (after is None or issue["updated_at"] >= after)
        ]
        found.sort(key=lambda i: str(i["updated_at"]))
        per_page, page = int(query.get("per_page", 20)), int(query.get("page", 1))
        chunk = found[(page - 1) * per_page : page * per_page]
        raw = json.dumps(chunk).encode()
        etag = 'W/"' + hashlib.sha256(raw).hexdigest()[:32] + '"'
        out = {
            **self._headers(),
            "etag": etag,
            "x-page": str(page),
            "x-per-page": str(per_page),
            "x-next-page": str(page + 1) if page * per_page < len(found) else "",
        }
        if headers.get("if-none-match") == etag:
            self.not_modified += 1
            return 304, out, None
        return 200, out, chunk

    def _notes(
        self, method: str, iid: int, rest: list[str], query: dict[str, str], data: dict[str, Any]
    ) -> tuple[int, dict[str, str], Any]:
        notes = self.notes[iid]
        if method == "GET" and not rest:
            per_page, page = int(query.get("per_page", 20)), int(query.get("page", 1))
            return 200, self._headers(), notes[(page - 1) * per_page : page * per_page]
        if method == "POST" and not rest:
            self._next_id += 1
            at = self._tick()
            note = {
                "id": self._next_id,
                "type": None,
                "body": data["body"],
                "attachment": None,
                "author": _AUTHOR,
                "system": False,
                "noteable_id": self.issues[iid]["id"],
                "noteable_type": "Issue",
                "noteable_iid": iid,
                "created_at": at,
                "updated_at": at,
            }
            notes.append(note)
            self.issues[iid]["updated_at"] = at
            self.writes += 1
            return 201, self._headers(), note
        if method == "PUT" and len(rest) == 1:
            for note in notes:
                if str(note["id"]) == rest[0]:
                    note["body"], note["updated_at"] = data["body"], self._tick()
                    self.writes += 1
                    return 200, self._headers(), note
        return 404, self._headers(), {"message": "404 Not found"}


def _handler(fake: FakeGitLab) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, out, data = fake.answer(self.command, self.path, headers, body)
            raw = b"" if status == 304 or data is None else json.dumps(data).encode()
            self.send_response(status)
            for key, value in out.items():
                self.send_header(key, value)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            if raw:
                self.wfile.write(raw)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet

    return Handler
