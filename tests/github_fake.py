"""A loopback fake of the part of GitHub's REST API a GitHub board uses (issue #47).

Its answers follow GitHub's published REST description (github/rest-api-description,
`api.github.com.2026-03-10`), as the typed models githubkit generates from it require
them: an issue (`issue` schema: id, node_id, the url fields, number, state, title, body,
user as a `simple-user`, labels as `label` objects, milestone, locked, comments,
closed_at, created_at, updated_at, and `pull_request` on a pull request), a label (id,
node_id, url, name, description, color, default, archived_at, archived_by), an issue
comment (`issue-comment`). The shapes are written here from that description, not copied:
`test_github_board.py` checks every shape the fake sends against githubkit's models.

The endpoints: `GET /repos/{o}/{r}/issues` (state, since, sort, direction, per_page, page;
an `ETag` on every answer and `304 Not Modified` for a matching `If-None-Match`, which
spends no rate limit; a `Link` header to the next page), `GET|PATCH .../issues/{n}`,
`POST|PUT .../issues/{n}/labels`, `DELETE .../issues/{n}/labels/{name}`,
`GET|POST .../issues/{n}/comments`, `PATCH .../issues/comments/{id}`.

GraphQL (`POST /graphql`): the documents a GitHub Project (v2) board sends are executed
against `github_graphql.graphql`, a part of GitHub's published GraphQL schema written from
it (graphql-core runs them: a document asking for a field the schema does not have in that
shape is refused, as GitHub would); `add_project` and `add_project_item` make a project
whose single-select `Status` field, items (issues of this repository, draft issues) and
Status values the board reads and the `updateProjectV2ItemFieldValue` mutation sets. An
unknown project is GitHub's `NOT_FOUND` error beside a null `projectV2`.

Every answer carries the primary rate-limit headers (`x-ratelimit-limit`, `-remaining`,
`-used`, `-reset`, `-resource`). What it can be made to do, for the tests: spend its limit
(`remaining`), answer the next requests with a secondary limit (403 with `retry-after`),
with 429, or with 502 (`fail_next`), answer a share of the writes with 502 (`write_failure`,
seeded; half of them after the write was made, as a gateway that lost the answer would),
and refuse every token but its own with 401 ("Bad credentials"). It listens on 127.0.0.1
only, answers at most `max_requests` requests, and stops with `close()` (the fixtures do).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "ghp_fake_token_for_tests_0123456789abcd"
_USER = {
    "login": "octocat",
    "id": 1,
    "node_id": "MDQ6VXNlcjE=",
    "avatar_url": "https://github.com/images/error/octocat_happy.gif",
    "gravatar_id": "",
    "url": "https://api.github.com/users/octocat",
    "html_url": "https://github.com/octocat",
    "followers_url": "https://api.github.com/users/octocat/followers",
    "following_url": "https://api.github.com/users/octocat/following{/other_user}",
    "gists_url": "https://api.github.com/users/octocat/gists{/gist_id}",
    "starred_url": "https://api.github.com/users/octocat/starred{/owner}{/repo}",
    "subscriptions_url": "https://api.github.com/users/octocat/subscriptions",
    "organizations_url": "https://api.github.com/users/octocat/orgs",
    "repos_url": "https://api.github.com/users/octocat/repos",
    "events_url": "https://api.github.com/users/octocat/events{/privacy}",
    "received_events_url": "https://api.github.com/users/octocat/received_events",
    "type": "User",
    "site_admin": False,
}


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeGitHub:
    """The fake's state and its server (see the module docstring). `requests` counts
    every request answered, `counted` those that spent the rate limit, `writes` the
    writes made; `comments` holds each issue's comments."""

    def __init__(
        self,
        repo: str = "acme/widgets",
        *,
        limit: int = 5000,
        write_failure: float = 0.0,
        seed: int = 47,
        max_requests: int = 200_000,
    ) -> None:
        self.repo = repo
        self.limit = limit
        self.remaining = limit
        self.reset_at = int(time.time()) + 3600
        self.issues: dict[int, dict[str, Any]] = {}
        self.comments: dict[int, list[dict[str, Any]]] = {}
        self.requests = 0
        self.counted = 0
        self.writes = 0
        self.log: list[tuple[str, str, int]] = []
        self.fail_next: list[tuple[int, dict[str, str]]] = []
        self.write_failure = write_failure
        self.fail_writes = 0  # the next this many writes answer 502, not made
        self.projects: dict[tuple[str, int], dict[str, Any]] = {}
        self.graphql_requests = 0
        self.graphql_rate_limited = 0  # the next this many GraphQL requests: RATE_LIMITED
        self._schema: Any = None
        self._rng = random.Random(seed)
        self._max_requests = max_requests
        self._next_id = 1000
        self._clock = 1_800_000_000  # updated_at of each change: one second later
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the state --------------------------------------------------------------------

    def _tick(self) -> str:
        self._clock += 1
        return _iso(self._clock)

    def label(self, name: str) -> dict[str, Any]:
        digest = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
        return {
            "id": digest,
            "node_id": f"LA_{digest}",
            "url": f"https://api.github.com/repos/{self.repo}/labels/{name}",
            "name": name,
            "description": None,
            "color": "ededed",
            "default": False,
            "archived_at": None,
            "archived_by": None,
        }

    def add_issue(
        self,
        title: str,
        body: str = "",
        labels: tuple[str, ...] = ("execkit",),
        *,
        pull_request: bool = False,
    ) -> int:
        with self._lock:
            number = len(self.issues) + 1
            self._next_id += 1
            at = self._tick()
            issue: dict[str, Any] = {
                "id": self._next_id,
                "node_id": f"I_{self._next_id}",
                "url": f"https://api.github.com/repos/{self.repo}/issues/{number}",
                "repository_url": f"https://api.github.com/repos/{self.repo}",
                "labels_url": f"https://api.github.com/repos/{self.repo}/issues/{number}/labels{{/name}}",
                "comments_url": f"https://api.github.com/repos/{self.repo}/issues/{number}/comments",
                "events_url": f"https://api.github.com/repos/{self.repo}/issues/{number}/events",
                "html_url": f"https://github.com/{self.repo}/issues/{number}",
                "number": number,
                "state": "open",
                "title": title,
                "body": body,
                "user": _USER,
                "labels": [self.label(name) for name in labels],
                "milestone": None,
                "locked": False,
                "comments": 0,
                "closed_at": None,
                "created_at": at,
                "updated_at": at,
            }
            if pull_request:
                issue["pull_request"] = {
                    "url": f"https://api.github.com/repos/{self.repo}/pulls/{number}",
                    "html_url": f"https://github.com/{self.repo}/pull/{number}",
                    "diff_url": f"https://github.com/{self.repo}/pull/{number}.diff",
                    "patch_url": f"https://github.com/{self.repo}/pull/{number}.patch",
                }
            self.issues[number] = issue
            self.comments[number] = []
            return number

    def labels_of(self, number: int) -> set[str]:
        return {label["name"] for label in self.issues[number]["labels"]}

    def set_labels_by_hand(self, number: int, names: set[str]) -> None:
        """An operator's edit on github.com."""
        with self._lock:
            issue = self.issues[number]
            issue["labels"] = [self.label(name) for name in sorted(names)]
            issue["updated_at"] = self._tick()

    def close_by_hand(self, number: int) -> None:
        with self._lock:
            issue = self.issues[number]
            issue["state"], issue["closed_at"] = "closed", self._tick()
            issue["updated_at"] = issue["closed_at"]

    def reopen_by_hand(self, number: int, labels: set[str] | None = None) -> None:
        """An operator reopens the issue (and sets its labels, when given)."""
        with self._lock:
            issue = self.issues[number]
            issue["state"], issue["closed_at"] = "open", None
            if labels is not None:
                issue["labels"] = [self.label(name) for name in sorted(labels)]
            issue["updated_at"] = self._tick()

    def comment_by_hand(self, number: int, body: str) -> None:
        """A person's comment on the issue (it changes the issue's `updated_at`)."""
        with self._lock:
            self._next_id += 1
            at = self._tick()
            self.comments[number].append(self._comment(number, body, at))
            self.issues[number]["comments"] += 1
            self.issues[number]["updated_at"] = at

    def _comment(self, number: int, body: str, at: str) -> dict[str, Any]:
        return {
            "id": self._next_id,
            "node_id": f"IC_{self._next_id}",
            "url": f"https://api.github.com/repos/{self.repo}/issues/comments/{self._next_id}",
            "html_url": f"https://github.com/{self.repo}/issues/{number}#issuecomment-{self._next_id}",
            "body": body,
            "user": _USER,
            "created_at": at,
            "updated_at": at,
            "issue_url": self.issues[number]["url"],
            "author_association": "OWNER",
        }

    # -- Projects (v2) -------------------------------------------------------------------

    def add_project(
        self,
        owner: str = "acme",
        number: int = 1,
        options: tuple[str, ...] = ("Todo", "In Progress", "Done", "Blocked"),
        *,
        field: str = "Status",
    ) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            project: dict[str, Any] = {
                "id": f"PVT_{self._next_id}",
                "number": number,
                "title": f"{owner} project {number}",
                "closed": False,
                "owner": owner,
                "field": {
                    "__typename": "ProjectV2SingleSelectField",
                    "id": f"PVTSSF_{self._next_id}",
                    "name": field,
                    "options": [
                        {"id": hashlib.sha256(name.encode()).hexdigest()[:8], "name": name}
                        for name in options
                    ],
                },
                "items": [],
            }
            self.projects[owner, number] = project
            return project

    def add_project_item(
        self,
        project: dict[str, Any],
        issue: int | None = None,
        *,
        draft: str | None = None,
        status: str | None = "Todo",
    ) -> str:
        """An issue of this repository (its number), or a draft issue, on the project."""
        with self._lock:
            self._next_id += 1
            item = {
                "id": f"PVTI_{self._next_id}",
                "issue": issue,
                "draft": draft,
                "status": status,
                "archived": False,
            }
            project["items"].append(item)
            return str(item["id"])

    def status_of(self, project: dict[str, Any], issue: int) -> str | None:
        for item in project["items"]:
            if item["issue"] == issue:
                return str(item["status"]) if item["status"] is not None else None
        raise KeyError(issue)

    def set_status_by_hand(self, project: dict[str, Any], issue: int, status: str) -> None:
        with self._lock:
            for item in project["items"]:
                if item["issue"] == issue:
                    item["status"] = status

    def _graphql(self, body: bytes) -> tuple[int, dict[str, str], Any]:
        from graphql import build_schema, graphql_sync

        if self._schema is None:
            here = __file__.rsplit("/", 1)[0]
            with open(f"{here}/github_graphql.graphql", encoding="utf-8") as handle:
                self._schema = build_schema(handle.read())
        request = json.loads(body)
        self.graphql_requests += 1
        if self.graphql_rate_limited:
            # GitHub's answer to a spent GraphQL limit: 200, the error typed RATE_LIMITED.
            self.graphql_rate_limited -= 1
            message = "API rate limit already exceeded for user ID 1."
            return 200, {}, {"errors": [{"type": "RATE_LIMITED", "message": message}]}
        self.remaining -= 1
        self.counted += 1
        root = {
            "repositoryOwner": lambda _info, login: self._owner(login),
            "updateProjectV2ItemFieldValue": lambda _info, input: self._set_status(input),
        }
        result = graphql_sync(
            self._schema, request["query"], root, variable_values=request.get("variables")
        )
        out: dict[str, Any] = {"data": result.data}
        if result.errors:
            out["errors"] = [
                {
                    "type": "NOT_FOUND" if "Could not resolve" in error.message else None,
                    "message": error.message,
                    "path": error.path,
                    "locations": [
                        {"line": where.line, "column": where.column}
                        for where in error.locations or []
                    ],
                }
                for error in result.errors
            ]
        return 200, {"x-ratelimit-resource": "graphql"}, out

    def _owner(self, login: str) -> dict[str, Any] | None:
        if not any(owner == login for owner, _ in self.projects) and login != "octocat":
            return None
        kind = "User" if login == "octocat" else "Organization"

        def project(_info: Any, number: int) -> dict[str, Any]:
            found = self.projects.get((login, number))
            if found is None:
                raise LookupError(f"Could not resolve to a ProjectV2 with the number {number}.")
            return self._project_node(found)

        return {"__typename": kind, "id": f"O_{login}", "login": login, "projectV2": project}

    def _project_node(self, project: dict[str, Any]) -> dict[str, Any]:
        def items(_info: Any, first: int = 100, after: str | None = None, **_: Any) -> Any:
            start = int(after) if after else 0
            chunk = project["items"][start : start + first]
            return {
                "totalCount": len(project["items"]),
                "pageInfo": {
                    "hasNextPage": start + first < len(project["items"]),
                    "hasPreviousPage": start > 0,
                    "startCursor": str(start),
                    "endCursor": str(start + len(chunk)),
                },
                "nodes": [self._item_node(project, item) for item in chunk],
            }

        def field(_info: Any, name: str) -> Any:
            return project["field"] if project["field"]["name"] == name else None

        return {**project, "field": field, "items": items}

    def _item_node(self, project: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
        content: dict[str, Any]
        if item["issue"] is not None:
            issue = self.issues[item["issue"]]
            content = {
                "__typename": "PullRequest" if "pull_request" in issue else "Issue",
                "id": issue["node_id"],
                "number": issue["number"],
                "title": issue["title"],
                "body": issue["body"] or "",
                "state": issue["state"].upper(),
                "updatedAt": issue["updated_at"],
                "repository": {"id": "R_1", "nameWithOwner": self.repo},
                "labels": lambda _info, **_: {
                    "totalCount": len(issue["labels"]),
                    "nodes": [
                        {"id": lab["node_id"], "name": lab["name"]} for lab in issue["labels"]
                    ],
                },
            }
        else:
            content = {
                "__typename": "DraftIssue",
                "id": f"DI_{item['id']}",
                "title": item["draft"],
                "body": "",
            }
        option = {o["name"]: o["id"] for o in project["field"]["options"]}

        def value(_info: Any, name: str) -> Any:
            if name != project["field"]["name"] or item["status"] is None:
                return None
            return {
                "__typename": "ProjectV2ItemFieldSingleSelectValue",
                "id": f"PVTFSV_{item['id']}",
                "name": item["status"],
                "optionId": option[item["status"]],
            }

        return {
            "id": item["id"],
            "isArchived": item["archived"],
            "type": "ISSUE"
            if content["__typename"] == "Issue"
            else ("DRAFT_ISSUE" if content["__typename"] == "DraftIssue" else "PULL_REQUEST"),
            "updatedAt": _iso(self._clock),
            "content": content,
            "fieldValueByName": value,
        }

    def _set_status(self, given: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        for project in self.projects.values():
            if project["id"] != given["projectId"]:
                continue
            if project["field"]["id"] != given["fieldId"]:
                raise LookupError("Could not resolve to a node with the global id of the field")
            names = {o["id"]: o["name"] for o in project["field"]["options"]}
            option = given["value"].get("singleSelectOptionId")
            if option not in names:
                raise ValueError("The single select option Id does not belong to the field")
            for item in project["items"]:
                if item["id"] == given["itemId"]:
                    item["status"] = names[option]
                    return {
                        "clientMutationId": None,
                        "projectV2Item": self._item_node(project, item),
                    }
        raise LookupError("Could not resolve to a node with the global id of the item")

    def status_comments(self, number: int) -> list[dict[str, Any]]:
        return [c for c in self.comments[number] if c["body"].startswith("<!-- execkit:status")]

    # -- answering --------------------------------------------------------------------

    def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.requests += 1
            if self.requests > self._max_requests:
                return 503, {}, b'{"message": "the fake answered its last request"}'
            status, extra, payload = self._answer(method, target, headers, body)
            self.log.append((method, urlsplit(target).path, status))
        out = {
            "content-type": "application/json; charset=utf-8",
            "x-ratelimit-limit": str(self.limit),
            "x-ratelimit-remaining": str(self.remaining),
            "x-ratelimit-used": str(self.limit - self.remaining),
            "x-ratelimit-reset": str(self.reset_at),
            "x-ratelimit-resource": "core",
            "date": datetime.now(UTC).strftime("%a, %d %b %Y %H:%M:%S GMT"),
            **extra,
        }
        data = b"" if payload is None else json.dumps(payload).encode()
        return status, out, data

    def _answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        auth = headers.get("authorization", "")
        if auth not in (f"token {TOKEN}", f"Bearer {TOKEN}", f"bearer {TOKEN}"):
            return (
                401,
                {},
                {
                    "message": "Bad credentials",
                    "documentation_url": "https://docs.github.com/rest",
                    "status": "401",
                },
            )
        if self.fail_next:
            status, extra = self.fail_next.pop(0)
            if status in (403, 429):
                return (
                    status,
                    extra,
                    {
                        "message": "You have exceeded a secondary rate limit. Please wait a few "
                        "minutes before you try again.",
                        "documentation_url": "https://docs.github.com/rest/overview/rate-limits",
                    },
                )
            return status, extra, {"message": "Server Error"}
        if self.remaining <= 0:
            return (
                403,
                {},
                {
                    "message": "API rate limit exceeded for user ID 1.",
                    "documentation_url": "https://docs.github.com/rest/overview/rate-limits",
                },
            )
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = unquote(parts.path)
        base = f"/repos/{self.repo}/issues"
        if method == "POST" and path == "/graphql":
            return self._graphql(body)
        write = method in ("POST", "PUT", "PATCH", "DELETE")
        fail_after = False
        if write and self.fail_writes > 0:
            self.fail_writes -= 1
            return 502, {}, {"message": "Server Error"}
        if write and self.write_failure and self._rng.random() < self.write_failure:
            if self._rng.random() < 0.5:
                self.remaining -= 1
                return 502, {}, {"message": "Server Error"}
            fail_after = True  # made, and its answer lost
        data = json.loads(body) if body else None
        if method == "GET" and path == base:
            return self._list(query, headers)
        self.remaining -= 1
        self.counted += 1
        if write:
            self.writes += 1
        result = self._route(method, path, base, data, query)
        if fail_after:
            return 502, {}, {"message": "Server Error"}
        return result

    def _list(
        self, query: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        state = query.get("state", "open")
        items = [
            issue for issue in self.issues.values() if state == "all" or issue["state"] == state
        ]
        since = query.get("since")
        if since:
            items = [
                issue for issue in items if issue["updated_at"] >= since.replace("+00:00", "Z")
            ]
        if query.get("sort", "created") == "updated":
            items.sort(key=lambda issue: (issue["updated_at"], issue["number"]))
        else:
            items.sort(key=lambda issue: issue["number"])
        if query.get("direction", "desc") == "desc":
            items.reverse()
        per_page = min(int(query.get("per_page", "30")), 100)
        page = int(query.get("page", "1"))
        chunk = items[(page - 1) * per_page : page * per_page]
        payload = json.dumps(chunk, sort_keys=True).encode()
        etag = f'W/"{hashlib.sha256(payload).hexdigest()}"'
        if headers.get("if-none-match") == etag:
            return 304, {"etag": etag}, None  # not counted against the limit
        self.remaining -= 1
        self.counted += 1
        extra = {"etag": etag}
        if page * per_page < len(items):
            extra["link"] = (
                f'<https://api.github.com/repos/{self.repo}/issues?page={page + 1}>; rel="next"'
            )
        return 200, extra, chunk

    def _route(
        self, method: str, path: str, base: str, data: Any, query: dict[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        not_found: tuple[int, dict[str, str], Any] = (
            404,
            {},
            {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"},
        )
        found = re.fullmatch(re.escape(base) + r"/comments/(\d+)", path)
        if found and method == "PATCH":
            for comments in self.comments.values():
                for comment in comments:
                    if comment["id"] == int(found.group(1)):
                        comment["body"] = data["body"]
                        comment["updated_at"] = self._tick()
                        return 200, {}, comment
            return not_found
        found = re.fullmatch(re.escape(base) + r"/(\d+)(/labels(?:/(.+))?|/comments)?", path)
        if not found or int(found.group(1)) not in self.issues:
            return not_found
        number, tail, name = int(found.group(1)), found.group(2), found.group(3)
        issue = self.issues[number]
        if tail is None:
            if method == "GET":
                return 200, {}, issue
            if method == "PATCH":
                if data.get("state") in ("open", "closed"):
                    issue["state"] = data["state"]
                    issue["closed_at"] = self._tick() if data["state"] == "closed" else None
                issue["updated_at"] = self._tick()
                return 200, {}, issue
        elif tail.startswith("/labels"):
            names = self.labels_of(number)
            if method == "POST" and name is None:
                names |= set(data["labels"])
            elif method == "PUT" and name is None:
                names = set(data["labels"])
            elif method == "DELETE" and name is not None:
                if name not in names:
                    return 404, {}, {"message": "Label does not exist"}
                names.discard(name)
            else:
                return not_found
            issue["labels"] = [self.label(label) for label in sorted(names)]
            issue["updated_at"] = self._tick()
            return 200, {}, issue["labels"]
        elif tail == "/comments":
            if method == "GET":
                per_page = min(int(query.get("per_page", "30")), 100)
                page = int(query.get("page", "1"))
                return 200, {}, self.comments[number][(page - 1) * per_page : page * per_page]
            if method == "POST":
                self._next_id += 1
                at = self._tick()
                comment = self._comment(number, data["body"], at)
                self.comments[number].append(comment)
                issue["comments"] += 1
                issue["updated_at"] = at
                return 201, {}, comment
        return not_found


def _handler(fake: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, out, data = fake.answer(self.command, self.path, headers, body)
            self.send_response(status)
            for key, value in out.items():
                self.send_header(key, value)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if data:
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet

    return Handler


@contextmanager
def running(**options: Any) -> Iterator[FakeGitHub]:
    fake = FakeGitHub(**options)
    try:
        yield fake
    finally:
        fake.close()
