"""A Jira project's issues as a board (issue #48): `--board jira:PROJECT` (the project's
key), Jira Cloud or Data Center through the REST API v3 over urllib, behind the tracker
contract (execkit/dispatch/_tracker.py). The site from `JIRA_URL`; `JIRA_EMAIL` with
`JIRA_API_TOKEN` (Basic, Jira Cloud), or `JIRA_API_TOKEN` alone as a personal access token
(Bearer, Data Center).

States: an issue's status, named by the status's name or by its category's key (`new`,
`indeterminate`, `done`). The board configuration (`JiraConfig`) says which are eligible
(default: category `new`), where a claim moves the issue (`running`, default: a status of
category `indeterminate`), where a done one goes (`done`, default: category `done`) and a
given-up one (`failed`, default none: retried past its bounds, loudly). Issues move by
transition, never by writing their status: the board asks for the issue's transitions and
takes the one that leads to the wanted status. A JQL filter chooses the board's issues
(default: the project's issues labelled `execkit`); an issue with a `Blocks` link from an
issue not done yet ("is blocked by") is held: not eligible until its blockers are done.

Reads: `POST /rest/api/3/search/jql` pages of 100 (`nextPageToken`), at every later poll
only the issues updated since the newest seen (`updated >= "yyyy-MM-dd HH:mm"`; JQL counts in
minutes, so the newest minute is read again): an idle poll is one request. Writes go
through the outbox: a move is the issue's transitions then one transition; the status
comment is in Atlassian Document Format, created once and edited in place (found again by
its first paragraph, `execkit status`).

The tracker's lane is `jira/<fingerprint of the token>`: a 429 parks it for `Retry-After`
(or until `X-RateLimit-Reset`), 5xx and dropped connections count to its breaker, a 401
(and a 403) stops it with the fix named.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Unpack

import attrs

from execkit._errors import InvalidInput
from execkit.dispatch._board import BoardIssue, BoardState
from execkit.dispatch._tracker import (
    TrackerBoard,
    TrackerOptions,
    _Answer,
    _header_time,
    _Refusal,
    _settings,
    render_status,
    tracker_lane,
)

if TYPE_CHECKING:
    from execkit.ledger import Ledger

__all__ = ["JIRA_MARKER", "JiraBoard", "JiraClient", "JiraConfig", "jira_lane"]

JIRA_MARKER = "execkit status"
"""The first paragraph of the one status comment execkit keeps on a Jira issue (ADF has no
hidden text)."""

_KEY = re.compile(r"[A-Z][A-Z0-9_]{0,49}\Z")
CATEGORIES = ("new", "indeterminate", "done")
HELD = "held"
"""The state of an eligible issue with a `Blocks` link from an issue not done yet."""
_PAGE = 100
_MAX_PAGES = 500
_FIELDS = ["summary", "description", "status", "labels", "issuelinks", "updated"]


def _ref(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise InvalidInput(
            f"jira.{key} must be a status name or a category key (new, indeterminate, done), "
            f"got {value!r}",
            field=f"jira.{key}",
        )
    return value


@attrs.frozen(kw_only=True)
class JiraConfig:
    """A Jira board: the project's key, the site, the JQL that chooses its issues (None:
    the project's issues labelled `execkit`), and the statuses (each a name or a category
    key) that are eligible, where a claim moves an issue, where a done one goes and where a
    given-up one goes (None: no give-up move)."""

    project: str
    url: str
    jql: str | None = None
    eligible: tuple[str, ...] = ("new",)
    running: str = "indeterminate"
    done: str = "done"
    failed: str | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.project, str) or _KEY.match(self.project) is None:
            raise InvalidInput(
                f"a Jira board is jira:PROJECT (the project's key, as ENG), got {self.project!r}",
                field="board",
            )
        named = [*self.eligible, self.running, self.done]
        named += [self.failed] if self.failed else []
        if len(set(named)) != len(named):
            raise InvalidInput(
                f"jira: eligible, running, done and failed must differ, got {named}",
                field="jira.eligible",
            )

    @property
    def name(self) -> str:
        return f"jira:{self.project}"

    @property
    def query(self) -> str:
        """The JQL of the board's issues."""
        return self.jql or f'project = "{self.project}" AND labels = "execkit"'

    @classmethod
    def parse(cls, project: str, raw: Mapping[str, Any], env: Mapping[str, str]) -> JiraConfig:
        """`PROJECT` and the `jira` object of a board configuration file; the site from
        `url`, else `JIRA_URL` (required). InvalidInput naming the key."""
        if not isinstance(raw, Mapping):
            raise InvalidInput("jira must be an object", field="jira")
        allowed = {"url", "jql", "eligible", "running", "done", "failed"}
        unknown = set(raw) - allowed
        if unknown:
            raise InvalidInput(
                f"jira: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}", field="jira"
            )
        values: dict[str, Any] = {}
        if "eligible" in raw:
            eligible = raw["eligible"]
            if not isinstance(eligible, list) or not eligible:
                raise InvalidInput(
                    "jira.eligible must be a non-empty list of status names or category keys",
                    field="jira.eligible",
                )
            values["eligible"] = tuple(_ref("eligible", name) for name in eligible)
        for key in ("running", "done"):
            if key in raw:
                values[key] = _ref(key, raw[key])
        if raw.get("failed") is not None:
            values["failed"] = _ref("failed", raw["failed"])
        if "jql" in raw:
            jql = raw["jql"]
            if not isinstance(jql, str) or not jql.strip() or len(jql) > 2000:
                raise InvalidInput(
                    f"jira.jql must be a JQL query (1..2000 characters), got {jql!r}",
                    field="jira.jql",
                )
            values["jql"] = jql
        url = raw.get("url") or env.get("JIRA_URL")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise InvalidInput(
                f"a Jira board needs its site: set JIRA_URL (or jira.url) to an http(s) URL, "
                f"got {url!r}",
                field="jira.url",
            )
        return cls(project=project, url=url.rstrip("/"), **values)

    def dispatch_states(self) -> dict[str, Any]:
        return {"done_state": self.done, "failed_state": self.failed or "none"}


def jira_lane(token: str, ledger_id: str) -> str:
    """The tracker lane of a Jira token on the ledger `ledger_id` (`jira/<fingerprint>`)."""
    return tracker_lane("jira", "JIRA_API_TOKEN", token, ledger_id)


def credentials_from(env: Mapping[str, str]) -> tuple[str, str]:
    """(the token, the `Authorization` header); InvalidInput naming the variables."""
    token = env.get("JIRA_API_TOKEN")
    if not token:
        raise InvalidInput(
            "a Jira board needs credentials: set JIRA_EMAIL and JIRA_API_TOKEN (Jira Cloud), "
            "or JIRA_API_TOKEN alone to a personal access token (Data Center)",
            field="JIRA_API_TOKEN",
        )
    email = env.get("JIRA_EMAIL")
    if email:
        return token, "Basic " + base64.b64encode(f"{email}:{token}".encode()).decode()
    return token, f"Bearer {token}"


def _refusal(status: int, headers: Mapping[str, str], message: str, now: float) -> _Refusal:
    what = f"Jira answered {status}" + (f" ({message})" if message else "")
    if status == 429:
        after = _header_time(headers.get("retry-after"))
        reset = _iso_time(headers.get("x-ratelimit-reset"))
        until = now + after if after is not None else (reset if reset and reset > now else now + 60)
        return _Refusal("reset", f"{what}: rate limited", status, until)
    if status == 401:
        return _Refusal(
            "stop",
            f"{what}: Jira refused the credentials (expired or revoked); set JIRA_EMAIL and "
            "JIRA_API_TOKEN (or a personal access token in JIRA_API_TOKEN), then `execkit "
            "lane resume` this lane",
            status,
        )
    if status == 403:
        return _Refusal(
            "stop",
            f"{what}: the account may not browse or transition this project's issues; give it "
            "access, then `execkit lane resume` this lane",
            status,
        )
    if status >= 500:
        return _Refusal("upstream", what, status)
    return _Refusal("item", what, status)


def _iso_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class JiraClient:
    """Jira's REST API v3 through urllib: no retry, no sleep of its own. `requests` counts
    what it sent; every failure is a `_Refusal`."""

    def __init__(
        self,
        authorization: str,
        url: str,
        *,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._authorization = authorization
        self._root = url.rstrip("/") + "/rest/api/3"
        self._timeout = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self.requests = 0

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> _Answer:
        with self._lock:
            self.requests += 1
        request = urllib.request.Request(
            self._root + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Authorization": self._authorization,
                "Accept": "application/json",
                "Content-Type": "application/json",
                "User-Agent": "execkit",
            },
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                status, got, raw = response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            status, got, raw = exc.code, dict(exc.headers or {}), exc.read()
        except (OSError, ValueError) as exc:
            raise _Refusal("upstream", f"Jira did not answer: {type(exc).__name__}") from None
        got = {name.lower(): value for name, value in got.items()}
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        if status >= 400:
            message = ""
            if isinstance(data, dict):
                said = data.get("errorMessages") or []
                message = "; ".join(str(m) for m in said)[:200] if isinstance(said, list) else ""
            raise _refusal(status, got, message, self._clock())
        return _Answer(status, got, data)


def adf_text(node: Any) -> str:
    """The plain text of an Atlassian Document Format node (paragraphs on their own lines)."""
    if not isinstance(node, Mapping):
        return ""
    if node.get("type") == "text":
        return str(node.get("text") or "")
    parts = [adf_text(child) for child in node.get("content") or []]
    joiner = "\n" if node.get("type") in ("doc", "bulletList", "orderedList", "listItem") else ""
    return joiner.join(part for part in parts if part)


def status_adf(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The status comment as an ADF document: the marker paragraph, then one paragraph per
    line of the Markdown status (`render_status`), its Markdown marks left as text."""
    lines = render_status(payload).splitlines()[1:]  # the HTML marker means nothing in ADF
    paragraphs = [JIRA_MARKER, *(line.replace("**", "") for line in lines if line.strip())]
    return {
        "type": "doc",
        "version": 1,
        "content": [
            {"type": "paragraph", "content": [{"type": "text", "text": text}]}
            for text in paragraphs
        ],
    }


@attrs.define
class _Issue:
    key: str
    title: str
    body: str
    status: str
    category: str
    labels: frozenset[str]
    blockers: tuple[tuple[str, str], ...]  # (key, status category) of each "is blocked by"
    updated: str


def _jql_time(moment: str) -> str:
    """Jira's `updated` (`2027-01-15T08:00:01.000+0200`) as a JQL minute. Jira reads a JQL
    date in the account's own time zone, the zone it writes `updated` in: the wall-clock
    part is kept as written, not converted."""
    return moment[:16].replace("T", " ")


class JiraBoard(TrackerBoard):
    """A Jira project's issues as a board (see the module docstring); the arguments as
    `LinearBoard`'s, `authorization` the header value, `client` the seam."""

    def __init__(
        self,
        config: JiraConfig,
        ledger: Ledger,
        token: str,
        authorization: str,
        *,
        client: JiraClient | None = None,
        **options: Unpack[TrackerOptions],
    ) -> None:
        self.config = config
        super().__init__(
            what=f"Jira board {config.project}",
            lane=jira_lane(token, ledger.ledger_id()),
            ledger=ledger,
            **options,
        )
        self.client = client if client is not None else JiraClient(authorization, config.url)
        self._issues: dict[str, _Issue] = {}
        self._since: str | None = None
        self._came_from: dict[str, str] = {}

    @classmethod
    def from_env(
        cls,
        project: str,
        ledger: Ledger,
        env: Mapping[str, str],
        settings: Mapping[str, Any] | None = None,
        *,
        read_only: bool = False,
    ) -> JiraBoard:
        config = JiraConfig.parse(project, settings or {}, env)
        token, authorization = credentials_from(env)
        return cls(config, ledger, token, authorization, read_only=read_only)

    @classmethod
    def implied_dispatch(
        cls, project: str, settings: Mapping[str, Any], env: Mapping[str, str]
    ) -> dict[str, Any]:
        # The site is not needed for the states: a missing JIRA_URL is named by `from_env`.
        config = JiraConfig.parse(project, settings, {"JIRA_URL": "https://jira.invalid", **env})
        return config.dispatch_states()

    # -- the board protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def states(self) -> tuple[BoardState, ...]:
        config = self.config
        terminal = {"done", config.done, *([config.failed] if config.failed else [])}
        names = [*config.eligible, config.running, config.done]
        names += [config.failed] if config.failed else []
        names += [*CATEGORIES, HELD]
        return tuple(
            BoardState(name, eligible=name in config.eligible, terminal=name in terminal)
            for name in dict.fromkeys(names)
        )

    def list_candidates(self) -> list[BoardIssue]:
        """The board's issues in an eligible status whose blockers are all done."""
        eligible = set(self.config.eligible)
        return [issue for issue in self.list_issues() if issue.state in eligible]

    def list_issues(self) -> list[BoardIssue]:
        with self._lock:
            self._refreshing()
            return [self._card(self._issues[key]) for key in sorted(self._issues, key=_order)]

    def move(self, issue_id: str, state: str) -> bool:
        if self.read_only or state not in {s.name for s in self.states}:
            return False
        with self._lock:
            if issue_id not in self._issues:
                return False
            return self._record_move(issue_id, state, open_=True)

    # -- reading ------------------------------------------------------------------------------

    def _named(self) -> set[str]:
        config = self.config
        failed = [config.failed] if config.failed else []
        return {*config.eligible, config.running, config.done, *failed}

    def _card_state(self, issue: _Issue) -> str:
        return issue.status if issue.status in self._named() else issue.category

    def _card(self, issue: _Issue) -> BoardIssue:
        state = self._moved.get(issue.key) or self._card_state(issue)
        held = [key for key, category in issue.blockers if category != "done"]
        if held and state in self.config.eligible:
            state = HELD  # until its blockers are done

        settings = _settings(issue.body, issue.labels, "execkit")
        failed = self.config.failed
        return BoardIssue(
            id=issue.key,
            title=issue.title[:10_000],
            state=state,
            prompt=issue.title + ("\n\n" + issue.body if issue.body else ""),
            adapter=settings.get("adapter"),
            model=settings.get("model"),
            given_up_from=self.config.eligible[0] if failed and state == failed else None,
        )

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> _Answer:
        answer = self.client.call(method, path, body)
        self._answered()
        return answer

    def _refresh(self) -> None:
        jql = f"({self.config.query})"
        if self._since is not None:
            jql += f' AND updated >= "{_jql_time(self._since)}"'
        newest = self._since or ""
        token: str | None = None
        for _ in range(_MAX_PAGES):
            body: dict[str, Any] = {
                "jql": jql + " ORDER BY updated ASC",
                "maxResults": _PAGE,
                "fields": _FIELDS,
            }
            if token:
                body["nextPageToken"] = token
            answer = self._call("POST", "/search/jql", body)
            data = answer.data or {}
            for node in data.get("issues") or []:
                newest = max(newest, self._merge(node))
            token = data.get("nextPageToken")
            if not token or data.get("isLast", True):
                break
        else:
            raise InvalidInput(
                f"{self._what}: more than {_MAX_PAGES * _PAGE} issues changed; a board is read "
                "into memory",
                field="board",
            )
        self._since = newest or self._since

    def _merge(self, node: Mapping[str, Any]) -> str:
        fields = node.get("fields") or {}
        status = fields.get("status") or {}
        blockers = []
        for link in fields.get("issuelinks") or []:
            kind = (link.get("type") or {}).get("name")
            blocker = link.get("inwardIssue")
            if kind == "Blocks" and blocker:
                category = (((blocker.get("fields") or {}).get("status") or {}).get(
                    "statusCategory"
                ) or {}).get("key")  # fmt: skip
                blockers.append((str(blocker.get("key")), str(category or "")))
        issue = _Issue(
            key=str(node["key"]),
            title=str(fields.get("summary") or ""),
            body=adf_text(fields.get("description")),
            status=str(status.get("name") or ""),
            category=str((status.get("statusCategory") or {}).get("key") or ""),
            labels=frozenset(str(label) for label in fields.get("labels") or []),
            blockers=tuple(blockers),
            updated=str(fields.get("updated") or ""),
        )
        self._issues[issue.key] = issue
        return issue.updated

    # -- writing ------------------------------------------------------------------------------

    def _target(self, issue: _Issue, payload: Mapping[str, Any]) -> str | None:
        """The status name or category the issue must stand in for `payload`, or None."""
        eligible = set(self.config.eligible)
        state = payload.get("state")
        current = self._card_state(issue)
        if payload.get("running"):
            # A claim shows from where the card stands: a `state` still in the entry is an
            # earlier run's move, shown already or undone by the person who put it back.
            if current in eligible:
                self._came_from[issue.key] = issue.status
                return self.config.running
            return None
        if state is not None and state not in eligible:
            return str(state)
        if current == self.config.running or issue.category == self.config.running:
            return self._came_from.pop(issue.key, None) or str(state or self.config.eligible[0])
        return None

    def _matches(self, issue_status: str, category: str, wanted: str) -> bool:
        """Whether an issue in `issue_status` stands where `wanted` (a name or a category)
        says; a status the configuration names for itself (a `failed` of category `done`,
        say) never counts as its category's."""
        if issue_status == wanted:
            return True
        return wanted in CATEGORIES and category == wanted and issue_status not in self._named()

    def _send(self, item: str, payload: dict[str, Any], ref: str | None, sends: int) -> str | None:
        issue = self._issues.get(item)
        if issue is None:
            raise _Refusal("item", f"{item!r} is not an issue of {self._what}")
        wanted = self._target(issue, payload)
        if wanted is not None and not self._matches(issue.status, issue.category, wanted):
            self._transition(issue, wanted)
        if payload.get("attempt") is None:
            return ref
        return self._comment(issue, status_adf(payload), ref, sends)

    def _transition(self, issue: _Issue, wanted: str) -> None:
        key = urllib.parse.quote(issue.key)
        answer = self._call("GET", f"/issue/{key}/transitions")
        options = (answer.data or {}).get("transitions") or []
        chosen = None
        for by_name in (True, False):
            for option in options:
                to = option.get("to") or {}
                category = (to.get("statusCategory") or {}).get("key")
                if by_name:
                    found = to.get("name") == wanted
                else:  # a category: not into a status the configuration names otherwise
                    found = category == wanted and to.get("name") not in self._named()
                if found:
                    chosen = option
                    break
            if chosen is not None:
                break
        if chosen is None:
            raise _Refusal(
                "item",
                f"{issue.key} has no transition to {wanted!r} from {issue.status!r} (the "
                "project's workflow decides which moves exist)",
            )
        self._call("POST", f"/issue/{key}/transitions", {"transition": {"id": str(chosen["id"])}})
        to = chosen.get("to") or {}
        issue.status = str(to.get("name") or wanted)
        issue.category = str((to.get("statusCategory") or {}).get("key") or issue.category)

    def _comment(self, issue: _Issue, doc: dict[str, Any], ref: str | None, sends: int) -> str:
        text = json.dumps(doc, sort_keys=True)
        if ref is not None and self._comments.get(issue.key) == text:
            return ref
        key = urllib.parse.quote(issue.key)
        if ref is None and sends > 1:
            ref = self._find_comment(issue)
        if ref is not None:
            try:
                self._call("PUT", f"/issue/{key}/comment/{ref}", {"body": doc})
            except _Refusal as refused:
                if refused.status != 404:
                    raise
                ref = None
        if ref is None:
            answer = self._call("POST", f"/issue/{key}/comment", {"body": doc})
            ref = str((answer.data or {})["id"])
        self._comments[issue.key] = text
        return ref

    def _find_comment(self, issue: _Issue) -> str | None:
        key = urllib.parse.quote(issue.key)
        start = 0
        for _ in range(_MAX_PAGES):
            answer = self._call("GET", f"/issue/{key}/comment?startAt={start}&maxResults=100")
            data = answer.data or {}
            comments = data.get("comments") or []
            for comment in comments:
                if adf_text(comment.get("body")).startswith(JIRA_MARKER):
                    return str(comment["id"])
            start += len(comments)
            if not comments or start >= int(data.get("total") or 0):
                return None
        return None


def _order(key: str) -> tuple[str, int]:
    project, _, number = key.rpartition("-")
    return (project, int(number) if number.isdigit() else 0)
