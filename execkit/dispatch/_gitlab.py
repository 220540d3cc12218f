"""A GitLab project's issues as a board (issue #48): `--board gitlab:GROUP/PROJECT` (any
depth of subgroups), the token from `GITLAB_TOKEN` (sent as `PRIVATE-TOKEN`), the instance
from `GITLAB_URL` (default `https://gitlab.com`; self-managed the same way), GitLab's REST
API v4 over urllib, behind the tracker contract (execkit/dispatch/_tracker.py).

Labels are the columns, GitLab's scoped labels for the board's own (every name
configurable, `GitLabConfig`):

    state     what the issue carries                       eligible  terminal
    todo      opened, labelled `execkit`                   yes       no
    done      `execkit::done` (closing it is the MR's)     no        yes
    blocked   `execkit::blocked` (given up)                no        yes
    closed    closed, neither of the two                   no        yes

While an agent works on an issue `execkit::running` is on it too, and one status note (found
again by its hidden marker, edited in place) names the host and the attempt. A move is one
`PUT .../issues/:iid` with `add_labels` and `remove_labels`.

Reads: the project's opened issues once (pages of 100, by `updated_at`), then at every poll
the issues updated since the newest seen (`updated_after`), sent with `If-None-Match` (the
ETag of the last answer to that very request) where GitLab offered one, so an unchanged
project answers 304: an idle poll is one request.

The tracker's lane is `gitlab/<fingerprint of the token>`: a 429 parks it until
`RateLimit-Reset` (or for `Retry-After`), `RateLimit-Remaining: 0` parks it even on a
success, 5xx and dropped connections count to its breaker, a 401 (and a 403: the token may
not write the issues) stops it with the fix named.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Unpack

import attrs

from execkit._errors import InvalidInput
from execkit.dispatch._board import BoardIssue, BoardState
from execkit.dispatch._tracker import (
    STATUS_MARKER,
    TrackerBoard,
    TrackerOptions,
    _Answer,
    _header_time,
    _Refusal,
    _settings,
    render_status,
    tracker_lane,
    wanted_labels,
)

if TYPE_CHECKING:
    from execkit.ledger import Ledger

__all__ = ["GITLAB_URL", "GitLabBoard", "GitLabClient", "GitLabConfig", "gitlab_lane"]

GITLAB_URL = "https://gitlab.com"
_PROJECT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_.][A-Za-z0-9_.-]*)+\Z")
_PER_PAGE = 100
_MAX_PAGES = 500


def _label(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255 or "," in value:
        raise InvalidInput(
            f"gitlab.labels.{key} must be a GitLab label name (1..255 characters, no comma), "
            f"got {value!r}",
            field=f"gitlab.labels.{key}",
        )
    return value


@attrs.frozen(kw_only=True)
class GitLabConfig:
    """A GitLab board: the project's path (`GROUP/PROJECT`), the instance, the label of each
    state, and whether a done issue is closed (off: closing is its merge request's job)."""

    project: str
    url: str = GITLAB_URL
    label: str = "execkit"
    running_label: str = "execkit::running"
    done_label: str = "execkit::done"
    blocked_label: str = "execkit::blocked"
    close_on_done: bool = False

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.project, str) or _PROJECT.match(self.project) is None:
            raise InvalidInput(
                f"a GitLab board is gitlab:GROUP/PROJECT, got {self.project!r}", field="board"
            )
        names = [self.label, self.running_label, self.done_label, self.blocked_label]
        if len(set(names)) != len(names):
            raise InvalidInput(
                f"gitlab.labels: the four labels must differ, got {names}", field="gitlab.labels"
            )

    @property
    def name(self) -> str:
        return f"gitlab:{self.project}"

    @property
    def ours(self) -> frozenset[str]:
        return frozenset({self.label, self.running_label, self.done_label, self.blocked_label})

    @classmethod
    def parse(cls, project: str, raw: Mapping[str, Any], env: Mapping[str, str]) -> GitLabConfig:
        """`GROUP/PROJECT` and the `gitlab` object of a board configuration file
        (docs/formats.md); the instance from `url`, else `GITLAB_URL`, else gitlab.com.
        InvalidInput naming the key."""
        if not isinstance(raw, Mapping):
            raise InvalidInput("gitlab must be an object", field="gitlab")
        allowed = {"url", "labels", "close_on_done"}
        unknown = set(raw) - allowed
        if unknown:
            raise InvalidInput(
                f"gitlab: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}",
                field="gitlab",
            )
        labels = raw.get("labels", {})
        if not isinstance(labels, Mapping):
            raise InvalidInput("gitlab.labels must be an object", field="gitlab.labels")
        names = {
            "eligible": "label",
            "running": "running_label",
            "done": "done_label",
            "blocked": "blocked_label",
        }
        unknown = set(labels) - set(names)
        if unknown:
            raise InvalidInput(
                f"gitlab.labels: unknown keys {sorted(unknown)}; allowed: {sorted(names)}",
                field="gitlab.labels",
            )
        if not isinstance(raw.get("close_on_done", False), bool):
            raise InvalidInput(
                "gitlab.close_on_done must be true or false", field="gitlab.close_on_done"
            )
        url = raw.get("url") or env.get("GITLAB_URL") or GITLAB_URL
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise InvalidInput(
                f"gitlab.url must be an http(s) URL, got {url!r}", field="gitlab.url"
            )
        return cls(
            project=project,
            url=url.rstrip("/"),
            close_on_done=raw.get("close_on_done", False),
            **{names[key]: _label(key, value) for key, value in labels.items()},
        )


def gitlab_lane(token: str, ledger_id: str) -> str:
    """The tracker lane of a GitLab token on the ledger `ledger_id` (`gitlab/<fingerprint>`)."""
    return tracker_lane("gitlab", "GITLAB_TOKEN", token, ledger_id)


def token_from(env: Mapping[str, str]) -> str:
    token = env.get("GITLAB_TOKEN")
    if not token:
        raise InvalidInput(
            "a GitLab board needs a token: set GITLAB_TOKEN to a token with the api scope "
            "on the project",
            field="GITLAB_TOKEN",
        )
    return token


def _refusal(status: int, headers: Mapping[str, str], message: str, now: float) -> _Refusal:
    """What an error answer means (GitLab's documented rate-limit headers)."""
    what = f"GitLab answered {status}" + (f" ({message})" if message else "")
    if status == 429:
        reset = _header_time(headers.get("ratelimit-reset"))
        after = _header_time(headers.get("retry-after"))
        until = reset if reset is not None and reset > now else now + (after or 60)
        return _Refusal("reset", f"{what}: rate limited", status, until)
    if status == 401:
        return _Refusal(
            "stop",
            f"{what}: GitLab refused the token (expired or revoked); set GITLAB_TOKEN to a "
            "valid one, then `execkit lane resume` this lane",
            status,
        )
    if status == 403:
        return _Refusal(
            "stop",
            f"{what}: the token may not read or write this project's issues; give it the api "
            "scope and the Reporter role or more, then `execkit lane resume` this lane",
            status,
        )
    if status >= 500:
        return _Refusal("upstream", what, status)
    return _Refusal("item", what, status)


class GitLabClient:
    """GitLab's REST API v4 through urllib: no cache, no retry, no sleep of its own.
    `requests` counts what it sent; every failure is a `_Refusal`."""

    def __init__(
        self,
        token: str,
        url: str = GITLAB_URL,
        *,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._token = token
        self._root = url.rstrip("/") + "/api/v4"
        self._timeout = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self.requests = 0

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> _Answer:
        with self._lock:
            self.requests += 1
        target = self._root + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(
            target,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "PRIVATE-TOKEN": self._token,
                "Content-Type": "application/json",
                "User-Agent": "execkit",
                **(headers or {}),
            },
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                status, got, raw = response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            status, got, raw = exc.code, dict(exc.headers or {}), exc.read()
        except (OSError, ValueError) as exc:
            raise _Refusal("upstream", f"GitLab did not answer: {type(exc).__name__}") from None
        got = {name.lower(): value for name, value in got.items()}
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        if status == 304:
            return _Answer(status, got, None)
        if status >= 400:
            message = ""
            if isinstance(data, dict):
                message = str(data.get("message") or data.get("error") or "")[:200]
            raise _refusal(status, got, message, self._clock())
        return _Answer(status, got, data)


@attrs.define
class _Seen:
    iid: int
    title: str
    body: str
    labels: frozenset[str]
    open: bool
    updated_at: str


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GitLabBoard(TrackerBoard):
    """A GitLab project's issues as a board (see the module docstring); the arguments as
    `LinearBoard`'s, `client` the seam (default: a `GitLabClient` on `config.url`)."""

    def __init__(
        self,
        config: GitLabConfig,
        ledger: Ledger,
        token: str,
        *,
        client: GitLabClient | None = None,
        **options: Unpack[TrackerOptions],
    ) -> None:
        self.config = config
        super().__init__(
            what=f"GitLab board {config.project}",
            lane=gitlab_lane(token, ledger.ledger_id()),
            ledger=ledger,
            **options,
        )
        self.client = client if client is not None else GitLabClient(token, config.url)
        self._base = "/projects/" + urllib.parse.quote(config.project, safe="")
        self._issues: dict[int, _Seen] = {}
        self._loaded = False
        self._since: str | None = None
        self._etags: dict[str, str] = {}

    @classmethod
    def from_env(
        cls,
        project: str,
        ledger: Ledger,
        env: Mapping[str, str],
        settings: Mapping[str, Any] | None = None,
        *,
        read_only: bool = False,
    ) -> GitLabBoard:
        """The board `gitlab:GROUP/PROJECT` as `execkit dispatch` opens it: the token from
        `GITLAB_TOKEN`, the instance from `GITLAB_URL`, the rest from `settings` (a
        configuration file's `gitlab` object). InvalidInput before anything is sent."""
        config = GitLabConfig.parse(project, settings or {}, env)
        return cls(config, ledger, token_from(env), read_only=read_only)

    # -- the board protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def states(self) -> tuple[BoardState, ...]:
        return (
            BoardState("todo", eligible=True),
            BoardState("done", terminal=True),
            BoardState("blocked", terminal=True),
            BoardState("closed", terminal=True),
        )

    def list_candidates(self) -> list[BoardIssue]:
        """The opened issues labelled eligible (one conditional request on an idle board)."""
        return [issue for issue in self.list_issues() if issue.state == "todo"]

    def list_issues(self) -> list[BoardIssue]:
        """Every issue carrying one of the board's labels, by iid."""
        with self._lock:
            self._refreshing()
            return [
                card
                for iid in sorted(self._issues)
                if (card := self._card(self._issues[iid])) is not None
            ]

    def move(self, issue_id: str, state: str) -> bool:
        """Record the move (sent by `catch_up`); False for a state the board does not have
        or an issue it has not listed; a closed issue is left alone (True, nothing
        recorded)."""
        if self.read_only or state == "closed" or state not in {s.name for s in self.states}:
            return False
        with self._lock:
            seen = self._issues.get(self._iid(issue_id))
            if seen is None:
                return False
            return self._record_move(issue_id, state, open_=seen.open)

    # -- reading ------------------------------------------------------------------------------

    def _iid(self, issue_id: str) -> int:
        prefix = f"{self.config.project}#"
        rest = issue_id[len(prefix) :] if issue_id.startswith(prefix) else ""
        return int(rest) if rest.isdigit() else -1

    def _state(self, seen: _Seen) -> str | None:
        config = self.config
        if seen.open and config.label in seen.labels:
            return "todo"
        if config.done_label in seen.labels:
            return "done"
        if config.blocked_label in seen.labels:
            return "blocked"
        if seen.labels & config.ours:
            return "closed" if not seen.open else None
        return None

    def _card(self, seen: _Seen) -> BoardIssue | None:
        issue_id = f"{self.config.project}#{seen.iid}"
        state = self._moved.get(issue_id) or self._state(seen)
        if state is None:
            return None
        settings = _settings(seen.body, seen.labels, self.config.label)
        return BoardIssue(
            id=issue_id,
            title=seen.title[:10_000],
            state=state,
            prompt=seen.title + ("\n\n" + seen.body if seen.body else ""),
            adapter=settings.get("adapter"),
            model=settings.get("model"),
            given_up_from="todo" if state == "blocked" else None,
        )

    def _call(self, method: str, path: str, **options: Any) -> _Answer:
        answer = self.client.call(method, path, **options)
        if answer.headers.get("ratelimit-remaining") == "0":
            reset = _header_time(answer.headers.get("ratelimit-reset"))
            if reset is not None and reset > self.clock():
                self._lane_call(_Refusal("reset", "GitLab's rate limit is spent", until=reset))
                return answer
        self._answered()
        return answer

    def _refresh(self) -> None:
        if not self._loaded:
            self._load()
        else:
            self._poll()

    def _load(self) -> None:
        newest = ""
        for page in range(1, _MAX_PAGES + 1):
            answer = self._call(
                "GET",
                self._base + "/issues",
                query={
                    "state": "opened",
                    "order_by": "updated_at",
                    "sort": "asc",
                    "per_page": _PER_PAGE,
                    "page": page,
                },
            )
            items = answer.data or []
            for item in items:
                newest = max(newest, self._merge(item))
            if len(items) < _PER_PAGE or not answer.headers.get("x-next-page"):
                break
        else:
            raise InvalidInput(
                f"{self._what}: more than {_MAX_PAGES * _PER_PAGE} opened issues; a board is "
                "read into memory",
                field="board",
            )
        self._since = newest or _iso(self.clock())
        self._loaded = True

    def _poll(self) -> None:
        since = self._since
        assert since is not None
        newest = since
        for page in range(1, _MAX_PAGES + 1):
            key = f"{since}|{page}"
            headers = {"If-None-Match": self._etags[key]} if key in self._etags else {}
            answer = self._call(
                "GET",
                self._base + "/issues",
                query={
                    "state": "all",
                    "updated_after": since,
                    "order_by": "updated_at",
                    "sort": "asc",
                    "per_page": _PER_PAGE,
                    "page": page,
                },
                headers=headers,
            )
            if answer.status == 304:
                return
            if "etag" in answer.headers:
                self._etags = {k: v for k, v in self._etags.items() if k.startswith(since)}
                self._etags[key] = answer.headers["etag"]
            items = answer.data or []
            for item in items:
                newest = max(newest, self._merge(item))
            if len(items) < _PER_PAGE or not answer.headers.get("x-next-page"):
                break
        self._since = newest

    def _merge(self, item: Mapping[str, Any]) -> str:
        updated = str(item.get("updated_at") or "")
        iid = int(item["iid"])
        self._issues[iid] = _Seen(
            iid=iid,
            title=str(item.get("title") or ""),
            body=str(item.get("description") or ""),
            labels=frozenset(str(label) for label in item.get("labels") or []),
            open=item.get("state") == "opened",
            updated_at=updated,
        )
        return updated

    # -- writing ------------------------------------------------------------------------------

    def _wanted(self, seen: _Seen, payload: Mapping[str, Any]) -> frozenset[str]:
        return wanted_labels(self.config, seen.labels, seen.open, payload)

    def _send(self, item: str, payload: dict[str, Any], ref: str | None, sends: int) -> str | None:
        """Make the issue show `payload`: labels (and closed, with `close_on_done`) in one
        `PUT`, then the status note. The note's id."""
        iid = self._iid(item)
        seen = self._issues.get(iid)
        if seen is None:
            raise _Refusal("item", f"{item!r} is not an issue of {self._what}")
        target = self._wanted(seen, payload)
        update: dict[str, Any] = {}
        if target - seen.labels:
            update["add_labels"] = ",".join(sorted(target - seen.labels))
        if seen.labels - target:
            # Every label of ours the target lacks, not only those last seen: another
            # dispatcher's write (a claim shown) may have landed since this copy was read,
            # and removing a label an issue does not carry is a no-op on GitLab.
            update["remove_labels"] = ",".join(sorted((seen.labels | self.config.ours) - target))
        if payload.get("state") == "done" and self.config.close_on_done and seen.open:
            update["state_event"] = "close"
        if update:
            answer = self._call("PUT", f"{self._base}/issues/{iid}", body=update)
            if isinstance(answer.data, dict):
                self._merge(answer.data)
            seen = self._issues[iid]
        if payload.get("attempt") is None:
            return ref
        return self._note(item, iid, render_status(payload), ref, sends)

    def _note(self, item: str, iid: int, text: str, ref: str | None, sends: int) -> str:
        if ref is not None and self._comments.get(item) == text:
            return ref
        if ref is None and sends > 1:
            ref = self._find_note(iid)
        if ref is not None:
            try:
                self._call("PUT", f"{self._base}/issues/{iid}/notes/{ref}", body={"body": text})
            except _Refusal as refused:
                if refused.status != 404:
                    raise
                ref = None  # deleted by someone: made again below
        if ref is None:
            answer = self._call("POST", f"{self._base}/issues/{iid}/notes", body={"body": text})
            ref = str((answer.data or {})["id"])
        self._comments[item] = text
        return ref

    def _find_note(self, iid: int) -> str | None:
        for page in range(1, _MAX_PAGES + 1):
            answer = self._call(
                "GET",
                f"{self._base}/issues/{iid}/notes",
                query={
                    "sort": "asc",
                    "order_by": "created_at",
                    "per_page": _PER_PAGE,
                    "page": page,
                },
            )
            notes = answer.data or []
            for note in notes:
                if str(note.get("body") or "").startswith(STATUS_MARKER):
                    return str(note["id"])
            if len(notes) < _PER_PAGE:
                return None
        return None
