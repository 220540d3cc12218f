"""A Linear team's issues as a board (issue #48): `--board linear:TEAM` (the team's key,
`ENG`), the key from `LINEAR_API_KEY`, Linear's GraphQL API over urllib (no SDK, no new
dependency), behind the tracker contract (execkit/dispatch/_tracker.py).

States: a Linear issue stands in one of its team's workflow states, each of a type
(`triage`, `backlog`, `unstarted`, `started`, `completed`, `canceled`, `duplicate`). The
board configuration (`LinearConfig`) names states by name or by type: which are eligible
(default: type `unstarted`), where a claimed issue goes (`running`, default: the team's first
`started` state), where a done one goes (`done`, default: the first `completed` state) and a
given-up one (`failed`, default: the first `canceled` state; None: no give-up move). A card's
state is its workflow state's name where the configuration names that state, else its type;
`completed`, `canceled` and `duplicate` are terminal. With `label` set (default `execkit`)
only issues carrying that label are the board's.

A claim shows as the move to the running state (after the ledger's lease decided it, as on
every tracker); a run that ends without a move (a retry is due) puts the issue back in the
eligible state it came from, so the dispatcher sees it again.

Reads: the team and its states once, then the team's issues ordered by `updatedAt`, pages of
50; every later poll asks only for the issues updated since the newest seen (an `updatedAt`
filter): an idle poll is one request. Writes go through the outbox: a move is one
`issueUpdate` (the state's id), the status comment one `commentCreate`, then `commentUpdate`
in place (found again by its marker when a create's answer was lost).

The tracker's lane is `linear/<fingerprint of the key>`: an answer `RATELIMITED` (429, or
an error whose `extensions` say so) parks it until the reset Linear's headers state
(`X-RateLimit-Requests-Reset`, `X-RateLimit-Complexity-Reset`, epoch milliseconds), a spent
request budget (`X-RateLimit-Requests-Remaining: 0`) parks it even on a success, 5xx and a
dropped connection count to its breaker, and a refused key (401, or an `authentication
error`) stops it with the fix named.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Unpack

import attrs

from execkit._errors import InvalidInput
from execkit.dispatch._board import BoardIssue, BoardState
from execkit.dispatch._tracker import (
    STATUS_MARKER,
    TrackerBoard,
    TrackerOptions,
    _Answer,
    _Refusal,
    _settings,
    render_status,
    tracker_lane,
)

if TYPE_CHECKING:
    from execkit.ledger import Ledger

__all__ = ["LINEAR_API_URL", "LinearBoard", "LinearClient", "LinearConfig", "linear_lane"]

LINEAR_API_URL = "https://api.linear.app/graphql"
_TEAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,19}\Z")
TYPES = ("triage", "backlog", "unstarted", "started", "completed", "canceled", "duplicate")
_TERMINAL_TYPES = frozenset({"completed", "canceled", "duplicate"})
_PAGE = 50
_MAX_PAGES = 400

TEAM_QUERY = """
query ExeckitLinearTeam($key: String!) {
  teams(filter: {key: {eq: $key}}, first: 1) {
    nodes { id key name states(first: 100) { nodes { id name type position } } }
  }
}
"""
"""The team and its workflow states (Linear's `Query.teams`, `Team.states`)."""

ISSUES_QUERY = """
query ExeckitLinearIssues($filter: IssueFilter!, $after: String) {
  issues(filter: $filter, first: 50, after: $after, orderBy: updatedAt) {
    pageInfo { hasNextPage endCursor }
    nodes {
      id identifier title description updatedAt
      state { id name type }
      labels(first: 50) { nodes { name } }
    }
  }
}
"""
"""A page of 50 of the team's issues (`Query.issues`, an `IssueFilter` on the team's key and,
after the first read, `updatedAt`)."""

MOVE_MUTATION = """
mutation ExeckitLinearMove($id: String!, $state: String!) {
  issueUpdate(id: $id, input: {stateId: $state}) {
    success
    issue { id updatedAt state { id name type } }
  }
}
"""

COMMENTS_QUERY = """
query ExeckitLinearComments($id: String!, $after: String) {
  issue(id: $id) {
    comments(first: 50, after: $after) { pageInfo { hasNextPage endCursor } nodes { id body } }
  }
}
"""

COMMENT_CREATE = """
mutation ExeckitLinearComment($issue: String!, $body: String!) {
  commentCreate(input: {issueId: $issue, body: $body}) { success comment { id } }
}
"""

COMMENT_UPDATE = """
mutation ExeckitLinearCommentEdit($id: String!, $body: String!) {
  commentUpdate(id: $id, input: {body: $body}) { success comment { id } }
}
"""


def _state_ref(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise InvalidInput(
            f"linear.{key} must be a workflow state's name or one of the types "
            f"{', '.join(TYPES)}, got {value!r}",
            field=f"linear.{key}",
        )
    return value


@attrs.frozen(kw_only=True)
class LinearConfig:
    """A Linear board: the team's key, the API, the label that makes an issue the board's
    (None: every issue of the team), and the states (each a name or a type) that are
    eligible, where a claim moves an issue (`running`), where a done one goes and where a
    given-up one goes (`failed`, None: no give-up move)."""

    team: str
    api_url: str = LINEAR_API_URL
    label: str | None = "execkit"
    eligible: tuple[str, ...] = ("unstarted",)
    running: str = "started"
    done: str = "completed"
    failed: str | None = "canceled"

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.team, str) or _TEAM.match(self.team) is None:
            raise InvalidInput(
                f"a Linear board is linear:TEAM (the team's key, as ENG), got {self.team!r}",
                field="board",
            )
        named = [*self.eligible, self.running, self.done]
        if self.failed is not None:
            named.append(self.failed)
        if len(set(named)) != len(named):
            raise InvalidInput(
                f"linear: eligible, running, done and failed must differ, got {named}",
                field="linear.eligible",
            )
        for name in self.eligible:
            if name in _TERMINAL_TYPES:
                raise InvalidInput(
                    f"linear.eligible: {name!r} is a terminal type", field="linear.eligible"
                )

    @property
    def name(self) -> str:
        return f"linear:{self.team}"

    @classmethod
    def parse(cls, team: str, raw: Mapping[str, Any], env: Mapping[str, str]) -> LinearConfig:
        """`TEAM` (of `linear:TEAM`) and the `linear` object of a board configuration file
        (docs/formats.md); the API from `api_url`, else `LINEAR_API_URL`, else Linear's.
        InvalidInput naming the key."""
        if not isinstance(raw, Mapping):
            raise InvalidInput("linear must be an object", field="linear")
        allowed = {"api_url", "label", "eligible", "running", "done", "failed"}
        unknown = set(raw) - allowed
        if unknown:
            raise InvalidInput(
                f"linear: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}",
                field="linear",
            )
        values: dict[str, Any] = {}
        if "eligible" in raw:
            eligible = raw["eligible"]
            if not isinstance(eligible, list) or not eligible:
                raise InvalidInput(
                    "linear.eligible must be a non-empty list of state names or types",
                    field="linear.eligible",
                )
            values["eligible"] = tuple(_state_ref("eligible", name) for name in eligible)
        for key in ("running", "done"):
            if key in raw:
                values[key] = _state_ref(key, raw[key])
        if "failed" in raw:
            values["failed"] = (
                None if raw["failed"] is None else _state_ref("failed", raw["failed"])
            )
        if "label" in raw:
            label = raw["label"]
            if label is not None and (not isinstance(label, str) or not 1 <= len(label) <= 80):
                raise InvalidInput(
                    f"linear.label must be a label name (1..80 characters) or null, got {label!r}",
                    field="linear.label",
                )
            values["label"] = label
        api = raw.get("api_url") or env.get("LINEAR_API_URL") or LINEAR_API_URL
        if not isinstance(api, str) or not api.startswith(("https://", "http://")):
            raise InvalidInput(
                f"linear.api_url must be an http(s) URL, got {api!r}", field="linear.api_url"
            )
        return cls(team=team, api_url=api, **values)

    def dispatch_states(self) -> dict[str, Any]:
        """The dispatch settings this board implies: `done_state`, `failed_state`."""
        return {"done_state": self.done, "failed_state": self.failed or "none"}


def linear_lane(key: str, ledger_id: str) -> str:
    """The tracker lane of a Linear key on the ledger `ledger_id` (`linear/<fingerprint>`)."""
    return tracker_lane("linear", "LINEAR_API_KEY", key, ledger_id)


def key_from(env: Mapping[str, str]) -> str:
    """The key from `LINEAR_API_KEY`; InvalidInput naming it when unset."""
    key = env.get("LINEAR_API_KEY")
    if not key:
        raise InvalidInput(
            "a Linear board needs a key: set LINEAR_API_KEY to a personal API key (or an "
            "OAuth token) that may read and update the team's issues",
            field="LINEAR_API_KEY",
        )
    return key


def _ms_time(value: str | None) -> float | None:
    try:
        return float(value) / 1000 if value else None
    except ValueError:
        return None


class LinearClient:
    """Linear's GraphQL endpoint through urllib: one POST per document, no retry and no
    sleep of its own (the lane does). `requests` counts what it sent. Every failure is a
    `_Refusal` saying what it means for the lane."""

    def __init__(
        self,
        key: str,
        api_url: str = LINEAR_API_URL,
        *,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = key
        self._url = api_url
        self._timeout = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self.requests = 0

    def execute(self, document: str, variables: Mapping[str, Any]) -> _Answer:
        """The answer's `data` (in `_Answer.data`), or `_Refusal`."""
        with self._lock:
            self.requests += 1
        # A personal key goes as is; an OAuth token would carry `Bearer ` already.
        request = urllib.request.Request(
            self._url,
            data=json.dumps({"query": document, "variables": dict(variables)}).encode(),
            headers={
                "Authorization": self._key,
                "Content-Type": "application/json",
                "User-Agent": "execkit",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                status, headers, raw = response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            status, headers, raw = exc.code, dict(exc.headers or {}), exc.read()
        except (OSError, ValueError) as exc:
            raise _Refusal("upstream", f"Linear did not answer: {type(exc).__name__}") from None
        headers = {name.lower(): value for name, value in headers.items()}
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        errors = body.get("errors") or []
        if status >= 400 or errors:
            raise _linear_refusal(status, headers, errors, self._clock())
        return _Answer(status, headers, body.get("data") or {})


def _linear_refusal(
    status: int, headers: Mapping[str, str], errors: list[Any], now: float
) -> _Refusal:
    """What a refused answer means (Linear's error types, as its SDK reads them)."""
    kinds = set()
    said = []
    for error in errors if isinstance(errors, list) else []:
        if isinstance(error, dict):
            extensions = error.get("extensions") or {}
            if isinstance(extensions, dict):
                kinds.add(str(extensions.get("code") or "").upper())
                kinds.add(str(extensions.get("type") or "").lower())
            said.append(str(error.get("message") or "")[:200])
    what = f"Linear answered {status}" + (f" ({'; '.join(said)[:300]})" if said else "")
    if status == 429 or "RATELIMITED" in kinds or "ratelimited" in kinds:
        resets = [
            moment
            for name in ("x-ratelimit-requests-reset", "x-ratelimit-complexity-reset")
            if (moment := _ms_time(headers.get(name))) is not None and moment > now
        ]
        return _Refusal("reset", f"{what}: rate limited", status, max(resets, default=now + 60))
    if status == 401 or "authentication error" in kinds or "AUTHENTICATION_ERROR" in kinds:
        return _Refusal(
            "stop",
            f"{what}: Linear refused the key (expired or revoked); set LINEAR_API_KEY to a "
            "valid one, then `execkit lane resume` this lane",
            status,
        )
    if status == 403 or "forbidden" in kinds:
        return _Refusal(
            "stop",
            f"{what}: the key may not read or update this team's issues; give it access, "
            "then `execkit lane resume` this lane",
            status,
        )
    if status >= 500 or "internal error" in kinds:
        return _Refusal("upstream", what, status)
    return _Refusal("item", what, status)


@attrs.define
class _Issue:
    """One Linear issue as the last answer about it showed it."""

    uuid: str
    identifier: str
    title: str
    body: str
    state_id: str
    state_name: str
    state_type: str
    labels: frozenset[str]
    updated_at: str


@attrs.frozen
class _State:
    id: str
    name: str
    type: str
    position: float


class LinearBoard(TrackerBoard):
    """A Linear team's issues as a board (see the module docstring). `ledger`, `owner`,
    `clock`, `outbox_lease_s`, `retry_base_s` and `read_only` as `TrackerBoard`'s; `client`
    is the seam (default: a `LinearClient` on `config.api_url`)."""

    def __init__(
        self,
        config: LinearConfig,
        ledger: Ledger,
        key: str,
        *,
        client: LinearClient | None = None,
        **options: Unpack[TrackerOptions],
    ) -> None:
        self.config = config
        super().__init__(
            what=f"Linear board {config.team}",
            lane=linear_lane(key, ledger.ledger_id()),
            ledger=ledger,
            **options,
        )
        self.client = client if client is not None else LinearClient(key, config.api_url)
        self._states: list[_State] = []
        self._issues: dict[str, _Issue] = {}  # by identifier
        self._since: str | None = None
        self._came_from: dict[str, str] = {}  # the state id a claimed issue was taken from

    @classmethod
    def from_env(
        cls,
        team: str,
        ledger: Ledger,
        env: Mapping[str, str],
        settings: Mapping[str, Any] | None = None,
        *,
        read_only: bool = False,
    ) -> LinearBoard:
        """The board `linear:TEAM` as `execkit dispatch` opens it: the key from
        `LINEAR_API_KEY`, the rest from `settings` (a configuration file's `linear`
        object). InvalidInput naming what is wrong, before anything is sent."""
        config = LinearConfig.parse(team, settings or {}, env)
        return cls(config, ledger, key_from(env), read_only=read_only)

    @classmethod
    def implied_dispatch(
        cls, team: str, settings: Mapping[str, Any], env: Mapping[str, str]
    ) -> dict[str, Any]:
        """The dispatch settings the configuration implies (`done_state`, `failed_state`)."""
        return LinearConfig.parse(team, settings, env).dispatch_states()

    # -- the board protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def states(self) -> tuple[BoardState, ...]:
        """The configured names and every type (eligible and terminal as configured)."""
        config = self.config
        terminal = (
            set(_TERMINAL_TYPES) | {config.done} | ({config.failed} if config.failed else set())
        )
        names = list(dict.fromkeys([*config.eligible, config.running, config.done, *TYPES]))
        if config.failed:
            names.insert(len(config.eligible) + 2, config.failed)
        return tuple(
            BoardState(name, eligible=name in config.eligible, terminal=name in terminal)
            for name in dict.fromkeys(names)
        )

    def list_candidates(self) -> list[BoardIssue]:
        """The board's issues in an eligible state (one request on an idle board)."""
        eligible = set(self.config.eligible)
        return [issue for issue in self.list_issues() if issue.state in eligible]

    def list_issues(self) -> list[BoardIssue]:
        """Every issue of the board, by identifier."""
        with self._lock:
            self._refreshing()
            return [
                card
                for key in sorted(self._issues, key=_order)
                if (card := self._card(self._issues[key])) is not None
            ]

    def move(self, issue_id: str, state: str) -> bool:
        """Record the move (sent by `catch_up`); False for a state the board does not know
        or an issue it has not listed."""
        if self.read_only or state not in {s.name for s in self.states}:
            return False
        with self._lock:
            if issue_id not in self._issues:
                return False
            return self._record_move(issue_id, state, open_=True)

    # -- reading ------------------------------------------------------------------------------

    def _card_state(self, issue: _Issue) -> str:
        named = {*self.config.eligible, self.config.running, self.config.done}
        if self.config.failed:
            named.add(self.config.failed)
        return issue.state_name if issue.state_name in named else issue.state_type

    def _card(self, issue: _Issue) -> BoardIssue | None:
        label = self.config.label
        if label is not None and label not in issue.labels:
            return None
        state = self._moved.get(issue.identifier) or self._card_state(issue)
        settings = _settings(issue.body, issue.labels, label or "execkit")
        failed = self.config.failed
        return BoardIssue(
            id=issue.identifier,
            title=issue.title[:10_000],
            state=state,
            prompt=issue.title + ("\n\n" + issue.body if issue.body else ""),
            adapter=settings.get("adapter"),
            model=settings.get("model"),
            given_up_from=self.config.eligible[0] if failed and state == failed else None,
        )

    def _call(self, document: str, variables: Mapping[str, Any]) -> _Answer:
        answer = self.client.execute(document, variables)
        if answer.headers.get("x-ratelimit-requests-remaining") == "0":
            reset = _ms_time(answer.headers.get("x-ratelimit-requests-reset"))
            if reset is not None and reset > self.clock():
                self._lane_call(_Refusal("reset", "Linear's request budget is spent", until=reset))
                return answer
        self._answered()
        return answer

    def _refresh(self) -> None:
        if not self._states:
            self._read_team()
        since = self._since
        team_filter: dict[str, Any] = {"team": {"key": {"eq": self.config.team}}}
        if since is not None:
            team_filter["updatedAt"] = {"gte": since}
        newest = since or ""
        after: str | None = None
        for _ in range(_MAX_PAGES):
            answer = self._call(ISSUES_QUERY, {"filter": team_filter, "after": after})
            page = answer.data.get("issues") or {}
            for node in page.get("nodes") or []:
                newest = max(newest, self._merge(node))
            info = page.get("pageInfo") or {}
            if not info.get("hasNextPage"):
                break
            after = info.get("endCursor")
        else:
            raise InvalidInput(
                f"{self._what}: more than {_MAX_PAGES * _PAGE} issues changed; a board is read "
                "into memory",
                field="board",
            )
        self._since = newest or since

    def _read_team(self) -> None:
        answer = self._call(TEAM_QUERY, {"key": self.config.team})
        teams = (answer.data.get("teams") or {}).get("nodes") or []
        if not teams:
            raise _Refusal(
                "item", f"no team with the key {self.config.team!r}, or the key may not read it"
            )
        states = [
            _State(str(s["id"]), str(s["name"]), str(s["type"]), float(s.get("position") or 0))
            for s in (teams[0].get("states") or {}).get("nodes") or []
        ]
        self._states = sorted(
            states, key=lambda s: (TYPES.index(s.type) if s.type in TYPES else 9, s.position)
        )
        for key, ref in [
            *(("eligible", name) for name in self.config.eligible),
            ("running", self.config.running),
            ("done", self.config.done),
            ("failed", self.config.failed),
        ]:
            if ref is not None and self._resolve(ref) is None:
                raise InvalidInput(
                    f"{self._what}: linear.{key} {ref!r} is neither a workflow state of the "
                    f"team ({sorted(s.name for s in self._states)}) nor a type it has",
                    field=f"linear.{key}",
                )

    def _resolve(self, ref: str) -> _State | None:
        """The workflow state `ref` names: by name, else the team's first of that type."""
        for state in self._states:
            if state.name == ref:
                return state
        for state in self._states:
            if state.type == ref:
                return state
        return None

    def _merge(self, node: Mapping[str, Any]) -> str:
        state = node.get("state") or {}
        labels = frozenset(
            str(label["name"]) for label in (node.get("labels") or {}).get("nodes") or []
        )
        issue = _Issue(
            uuid=str(node["id"]),
            identifier=str(node["identifier"]),
            title=str(node.get("title") or ""),
            body=str(node.get("description") or ""),
            state_id=str(state.get("id") or ""),
            state_name=str(state.get("name") or ""),
            state_type=str(state.get("type") or ""),
            labels=labels,
            updated_at=str(node.get("updatedAt") or ""),
        )
        self._issues[issue.identifier] = issue
        return issue.updated_at

    # -- writing ------------------------------------------------------------------------------

    def _target(self, issue: _Issue, payload: Mapping[str, Any]) -> _State | None:
        """The workflow state the issue must stand in for `payload`, or None (left as is)."""
        eligible = set(self.config.eligible)
        state = payload.get("state")
        current = self._card_state(issue)
        running = self._resolve(self.config.running)
        if payload.get("running"):
            # A claim shows from where the card stands: a `state` still in the entry is an
            # earlier run's move, shown already or undone by the person who put it back.
            if current in eligible and running is not None:
                self._came_from[issue.identifier] = issue.state_id
                return running
            return None
        if state is not None and state not in eligible:
            return self._resolve(state)
        if running is not None and issue.state_id == running.id:
            # The run ended without a move: back where it was taken from, eligible again.
            back = self._came_from.pop(issue.identifier, None)
            for known in self._states:
                if known.id == back:
                    return known
            return self._resolve(state or self.config.eligible[0])
        if state is not None and current not in eligible:
            return self._resolve(state)
        return None

    def _send(self, item: str, payload: dict[str, Any], ref: str | None, sends: int) -> str | None:
        """Make the issue show `payload`: its workflow state (one `issueUpdate` when it
        differs), then its status comment. The comment's id."""
        issue = self._issues.get(item)
        if issue is None:
            raise _Refusal("item", f"{item!r} is not an issue of {self._what}")
        target = self._target(issue, payload)
        if target is not None and target.id != issue.state_id:
            answer = self._call(MOVE_MUTATION, {"id": issue.uuid, "state": target.id})
            moved = (answer.data.get("issueUpdate") or {}).get("issue") or {}
            if moved:
                self._merge({**moved, "identifier": issue.identifier, "title": issue.title,
                             "description": issue.body,
                             "labels": {"nodes": [{"name": n} for n in issue.labels]}})  # fmt: skip
        if payload.get("attempt") is None:
            return ref
        return self._comment(issue, render_status(payload), ref, sends)

    def _comment(self, issue: _Issue, text: str, ref: str | None, sends: int) -> str:
        if ref is not None and self._comments.get(issue.identifier) == text:
            return ref
        if ref is None and sends > 1:
            ref = self._find_comment(issue)
        if ref is not None:
            try:
                self._call(COMMENT_UPDATE, {"id": ref, "body": text})
            except _Refusal as refused:
                if refused.outcome != "item":
                    raise
                ref = None  # deleted by someone: made again below
        if ref is None:
            answer = self._call(COMMENT_CREATE, {"issue": issue.uuid, "body": text})
            ref = str(((answer.data.get("commentCreate") or {}).get("comment") or {})["id"])
        self._comments[issue.identifier] = text
        return ref

    def _find_comment(self, issue: _Issue) -> str | None:
        after: str | None = None
        for _ in range(_MAX_PAGES):
            answer = self._call(COMMENTS_QUERY, {"id": issue.uuid, "after": after})
            comments = (answer.data.get("issue") or {}).get("comments") or {}
            for comment in comments.get("nodes") or []:
                if str(comment.get("body") or "").startswith(STATUS_MARKER):
                    return str(comment["id"])
            info = comments.get("pageInfo") or {}
            if not info.get("hasNextPage"):
                return None
            after = info.get("endCursor")
        return None


def _order(identifier: str) -> tuple[str, int]:
    team, _, number = identifier.rpartition("-")
    return (team, int(number) if number.isdigit() else 0)
