"""GitHub Issues as a board (issue #47), one file behind the board protocol.

The dispatcher never names GitHub: it sees a `Board` (`list_candidates`, `list_issues`,
`move`, `give_up`) that also shows its work (`ReportingBoard`: `report`, `catch_up`). The
issues of one repository are the cards; labels are the columns (every name configurable,
`GitHubConfig`):

    state     what the issue carries                    eligible  terminal
    todo      open, labelled `execkit`                  yes       no
    done      `execkit:done` (closing it is the PR's)   no        yes
    blocked   `execkit:blocked` (given up)              no        yes
    closed    closed, neither of the two                no        yes

While an agent works on an issue, `execkit:running` is on it too and one status comment
(found again by its hidden marker, edited in place) names the host and the attempt. Pull
requests are not issues. An operator puts an issue back by labelling it `execkit` again.

The ledger is the claim authority: the dispatcher admits a run under its task's lease
first, and only then does the board show the claim. A label never decides anything.

Reads: the board keeps a copy of the repository's open issues, read once (paginated), then
kept current by one conditional request per poll: the issues updated since the newest one
seen, with `If-None-Match` (the ETag of the last answer to that very request), so an
unchanged repository answers `304 Not Modified`, which GitHub does not count against the
rate limit. REST, not GraphQL, for exactly that reason.

Writes: `move` and `report` record what the issue must show in the ledger's outbox
(`Ledger.outbox_put`) and return; `catch_up` claims the due entries and sends them, label
moves first (one request: add, remove or set the labels as the difference needs), then the
status comment (edited by its id once known; created once; a retried create looks for its
marker first, so a write that landed before its answer was lost is found, not doubled), and
settles each entry with what came of it. Nothing is lost when GitHub is down: the entry
stays in the ledger until a send settles it.

Rate limits are a lane of their own (`github/<fingerprint of the token>`, the same lane
machinery as a vendor's): every answer is read for `x-ratelimit-remaining` and
`x-ratelimit-reset` (a spent primary limit parks the lane until its reset), a secondary
limit (403 or 429 with `retry-after`) parks it for that long, 5xx and a dropped connection
count toward its breaker, and a refused token (401) stops it with the fix named (only
`execkit lane resume` opens it). While the lane does not admit, `list_candidates` and
`catch_up` raise `LaneWaiting` or `LaneStopped`: no new issue is claimed and nothing is
written, while the agents already running go on.

The client (`GitHubClient`) is githubkit (typed models generated from GitHub's OpenAPI
description), the extra `execkit-runner[github]`, loaded only when a board is opened; it
never retries or sleeps on its own (the lane does), and tests hand it a loopback fake.
"""

from __future__ import annotations

import email.utils
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Unpack

import attrs

from execkit._errors import InvalidInput
from execkit._validate import checked, non_blank
from execkit.dispatch._board import BoardIssue, BoardState
from execkit.dispatch._tracker import (
    CONFIG_KEYS,
    STATUS_MARKER,
    TrackerBoard,
    TrackerOptions,
    _Answer,
    _header_time,
    _iso,
    _Refusal,
    _settings,
    render_status,
    tracker_lane,
    wanted_labels,
)

if TYPE_CHECKING:
    import httpx

    from execkit.ledger import Ledger

__all__ = [
    "GITHUB_API_URL",
    "STATUS_MARKER",
    "GitHubBoard",
    "GitHubClient",
    "GitHubConfig",
    "github_lane",
    "read_board_config",
]

GITHUB_API_URL = "https://api.github.com"

_TOKEN_VARS = ("GITHUB_TOKEN", "GH_TOKEN")
_REPO = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}\Z")
_PER_PAGE = 100
# A first read of more open issues than this stops with an error naming the bound: a board
# is read into memory.
_MAX_PAGES = 500


def _label_name(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > 50 or "," in value:
        raise InvalidInput(
            f"{attribute.name} must be a GitHub label name (1..50 characters, no comma), "
            f"got {value!r}",
            field=attribute.name,
        )


def _repo_name(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or _REPO.match(value) is None:
        raise InvalidInput(f"repo must be OWNER/NAME, got {value!r}", field="repo")


_COMMENTS_MAX_CHARS = 20_000
"""The most text of an issue's comments a prompt carries by default (the newest kept)."""
_COMMENTS_LIMIT = 200_000


def _comment_chars(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or not 1 <= value <= _COMMENTS_LIMIT:
        raise InvalidInput(
            f"comments_max_chars must be an integer in 1..{_COMMENTS_LIMIT}, got {value!r}",
            field="comments_max_chars",
        )


@attrs.frozen(kw_only=True)
class GitHubConfig:
    """A GitHub Issues board: the repository (`OWNER/NAME`), the API (GitHub Enterprise's
    `https://HOST/api/v3` works the same way), the label of each state, whether a done
    issue is closed (off: closing is its pull request's job), and whether the prompt
    carries the issue's comments (`comments`, at most `comments_max_chars` of them, the
    newest kept; off by default: each eligible issue then costs one more request)."""

    repo: str = attrs.field(validator=_repo_name)
    api_url: str = attrs.field(default=GITHUB_API_URL, validator=checked("a URL", non_blank))
    label: str = attrs.field(default="execkit", validator=_label_name)
    running_label: str = attrs.field(default="execkit:running", validator=_label_name)
    done_label: str = attrs.field(default="execkit:done", validator=_label_name)
    blocked_label: str = attrs.field(default="execkit:blocked", validator=_label_name)
    close_on_done: bool = False
    comments: bool = False
    comments_max_chars: int = attrs.field(default=_COMMENTS_MAX_CHARS, validator=_comment_chars)

    def __attrs_post_init__(self) -> None:
        names = [self.label, self.running_label, self.done_label, self.blocked_label]
        if len(set(names)) != len(names):
            raise InvalidInput(
                f"github.labels: the four labels must differ, got {names}",
                field="github.labels",
            )

    @property
    def name(self) -> str:
        """The board's name in the ledger's outbox and on the command line."""
        return f"github:{self.repo}"

    @property
    def ours(self) -> frozenset[str]:
        return frozenset({self.label, self.running_label, self.done_label, self.blocked_label})

    @classmethod
    def from_mapping(
        cls, repo: str, raw: Mapping[str, Any], env: Mapping[str, str]
    ) -> GitHubConfig:
        """The `github` object of a board configuration file (docs/formats.md) for `repo`;
        the API from `api_url`, else `GITHUB_API_URL`, else api.github.com. InvalidInput
        naming the key (`github.labels.done`, ...) for anything else."""
        if not isinstance(raw, Mapping):
            raise InvalidInput("github must be an object", field="github")
        allowed = {"api_url", "labels", "close_on_done", "comments", "comments_max_chars"}
        unknown = set(raw) - allowed
        if unknown:
            raise InvalidInput(
                f"github: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}",
                field="github",
            )
        labels = raw.get("labels", {})
        if not isinstance(labels, Mapping):
            raise InvalidInput("github.labels must be an object", field="github.labels")
        names = {"eligible": "label", "running": "running_label", "done": "done_label"}
        names["blocked"] = "blocked_label"
        unknown = set(labels) - set(names)
        if unknown:
            raise InvalidInput(
                f"github.labels: unknown keys {sorted(unknown)}; allowed: {sorted(names)}",
                field="github.labels",
            )
        for key, value in labels.items():
            try:
                _label_name(None, attrs.fields_dict(cls)[names[key]], value)
            except InvalidInput as exc:
                raise InvalidInput(
                    f"github.labels.{key} must be a GitHub label name (1..50 characters, "
                    f"no comma), got {value!r}",
                    field=f"github.labels.{key}",
                ) from exc
        for key in ("close_on_done", "comments"):
            if not isinstance(raw.get(key, False), bool):
                raise InvalidInput(f"github.{key} must be true or false", field=f"github.{key}")
        most = raw.get("comments_max_chars", _COMMENTS_MAX_CHARS)
        if type(most) is not int or not 1 <= most <= _COMMENTS_LIMIT:
            raise InvalidInput(
                f"github.comments_max_chars must be an integer in 1..{_COMMENTS_LIMIT}, "
                f"got {most!r}",
                field="github.comments_max_chars",
            )
        api = raw.get("api_url") or env.get("GITHUB_API_URL") or GITHUB_API_URL
        if not isinstance(api, str) or not api.startswith(("https://", "http://")):
            raise InvalidInput(
                f"github.api_url must be an http(s) URL, got {api!r}", field="github.api_url"
            )
        return cls(
            repo=repo,
            api_url=api,
            close_on_done=raw.get("close_on_done", False),
            comments=raw.get("comments", False),
            comments_max_chars=most,
            **{names[key]: value for key, value in labels.items()},
        )


_CONFIG_KEYS = (*dict.fromkeys(CONFIG_KEYS.values()), "dispatch")


def read_board_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A board configuration file (docs/formats.md, "A GitHub board"): a JSON object with
    a `github` object (`GitHubConfig.from_mapping`), a `github_project` object
    (`GitHubProjectConfig.parse`) and a `dispatch` object (the board file's,
    `DispatchConfig.from_mapping`), each optional. InvalidInput naming the file
    or the key for a file that cannot be read, is not JSON or has other keys."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except OSError as exc:
        raise InvalidInput(
            f"board config {os.fspath(path)!r} cannot be read: {exc.strerror}",
            field="board_config",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(
            f"board config {os.fspath(path)!r} is not JSON: {exc}", field="board_config"
        ) from None
    if not isinstance(raw, dict):
        raise InvalidInput(
            f"board config {os.fspath(path)!r} must be a JSON object", field="board_config"
        )
    unknown = set(raw) - set(_CONFIG_KEYS)
    if unknown:
        raise InvalidInput(
            f"board config: unknown keys {sorted(unknown)}; allowed: {list(_CONFIG_KEYS)}",
            field="board_config",
        )
    for key in _CONFIG_KEYS:
        if not isinstance(raw.get(key, {}), dict):
            raise InvalidInput(f"board config: {key} must be an object", field=key)
    return raw


def token_from(env: Mapping[str, str]) -> str:
    """The token from `GITHUB_TOKEN`, else `GH_TOKEN`; InvalidInput naming both when
    neither is set (nothing is sent without one)."""
    for name in _TOKEN_VARS:
        value = env.get(name)
        if value:
            return value
    raise InvalidInput(
        "a GitHub board needs a token: set GITHUB_TOKEN (or GH_TOKEN) to a token that may "
        "read and write the repository's issues",
        field="GITHUB_TOKEN",
    )


def github_lane(token: str, ledger_id: str) -> str:
    """The tracker lane of `token` on the ledger `ledger_id`: `github/<fingerprint>`, the
    fingerprint an HMAC keyed by the ledger's identity (the token never leaves it)."""
    return tracker_lane("github", "GITHUB_TOKEN", token, ledger_id)


# -- the client ---------------------------------------------------------------------------


def _refusal(status: int, headers: Mapping[str, str], message: str, now: float) -> _Refusal:
    """What an error answer means (GitHub's documented rate-limit rules)."""
    what = f"GitHub answered {status}" + (f" ({message})" if message else "")
    retry_after = _header_time(headers.get("retry-after"))
    remaining = headers.get("x-ratelimit-remaining")
    reset = _header_time(headers.get("x-ratelimit-reset"))
    if status in (403, 429):
        if retry_after is not None:
            return _Refusal("reset", f"{what}: secondary rate limit", status, now + retry_after)
        if remaining == "0" and reset is not None:
            return _Refusal("reset", f"{what}: rate limit spent", status, reset)
        if status == 429:
            # No header said when: GitHub's documentation says to wait at least a minute.
            return _Refusal("reset", f"{what}: rate limited", status, now + 60)
        return _Refusal(
            "stop",
            f"{what}: the token may not write this repository's issues; give it issues "
            "read and write, then `execkit lane resume` this lane",
            status,
        )
    if status == 401:
        return _Refusal(
            "stop",
            f"{what}: GitHub refused the token (expired or revoked); set GITHUB_TOKEN (or "
            "GH_TOKEN) to a valid one, then `execkit lane resume` this lane",
            status,
        )
    if status >= 500:
        return _Refusal("upstream", what, status)
    return _Refusal("item", what, status)


class GitHubClient:
    """The one client the board speaks to GitHub through: githubkit's typed REST API (the
    extra `execkit-runner[github]`), with no cache, no retry and no sleep of its own.
    `requests` counts what it sent. `transport` is the test seam (an httpx transport);
    tests usually point `api_url` at a loopback fake instead. Every error becomes a
    `_Refusal` saying what it means for the lane."""

    def __init__(
        self,
        token: str,
        api_url: str = GITHUB_API_URL,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        try:
            from githubkit import GitHub
        except ImportError:
            raise InvalidInput(
                "a GitHub board needs githubkit: pip install 'execkit-runner[github]'",
                field="board",
            ) from None
        self._gh = GitHub(
            token,
            base_url=api_url.rstrip("/") + "/",
            http_cache=False,
            auto_retry=False,
            timeout=timeout_s,
            transport=transport,
            user_agent="execkit",
        )
        base = api_url.rstrip("/")
        # githubkit's own rule: Enterprise's REST root `/api/v3` has GraphQL at `/api/graphql`.
        enterprise = base.endswith("/api/v3")
        self._graphql_url = base[: -len("/v3")] + "/graphql" if enterprise else "/graphql"
        self._clock = clock
        self._lock = threading.Lock()
        self.requests = 0

    @property
    def rest(self) -> Any:
        return self._gh.rest

    def call(self, send: Callable[[], Any]) -> _Answer:
        """Run one githubkit call; its answer (a 304 included), or `_Refusal`."""
        from githubkit.exception import RequestError, RequestFailed

        with self._lock:
            self.requests += 1
        try:
            response = send()
        except RequestFailed as exc:
            raw = exc.response.raw_response
            message = ""
            try:
                body = raw.json()
                message = str(body.get("message", "")) if isinstance(body, dict) else ""
            except ValueError:
                pass
            raise _refusal(raw.status_code, raw.headers, message[:200], self._clock()) from None
        except RequestError as exc:
            raise _Refusal("upstream", f"GitHub did not answer: {type(exc.exc).__name__}") from None
        return _Answer(response.status_code, response.headers, response)

    def graphql_request(self, query: str, variables: Mapping[str, Any]) -> Any:
        """Send one GraphQL document (a `send` for `call`): GitHub's GraphQL endpoint next
        to the REST API's root (`/api/graphql` on GitHub Enterprise's `/api/v3`)."""
        from githubkit.graphql import GraphQLNamespace, GraphQLResponse

        return self._gh.request(
            "POST",
            self._graphql_url,
            json=GraphQLNamespace.build_graphql_request(query, dict(variables)),
            response_model=GraphQLResponse,
        )


def graphql_data(answer: _Answer, now: float) -> dict[str, Any]:
    """The `data` of a GraphQL answer, or `_Refusal`: a rate limit GitHub names in its
    errors (`RATE_LIMITED`, answered 200) parks the lane until the stated reset; any
    other error is this request's alone (`item`: a project or field not found)."""
    parsed = answer.data.parsed_data
    if parsed.errors:
        if any(error.type in ("RATE_LIMIT", "RATE_LIMITED") for error in parsed.errors):
            reset = _header_time(answer.headers.get("x-ratelimit-reset"))
            until = reset if reset is not None and reset > now else now + 60
            raise _Refusal("reset", "GitHub's GraphQL rate limit is spent", 200, until)
        said = "; ".join(str(error.message) for error in parsed.errors)[:300]
        raise _Refusal("item", f"GitHub's GraphQL API answered: {said}", 200)
    data = parsed.data
    return data if isinstance(data, dict) else {}


# -- the board ----------------------------------------------------------------------------


@attrs.define
class _Seen:
    """One issue as the last answer about it showed it."""

    number: int
    title: str
    body: str
    labels: frozenset[str]
    open: bool
    updated_at: str
    comments_text: str | None = None  # the prompt's comments part, as of `comments_at`
    comments_at: str = ""


class GitHubBoard(TrackerBoard):
    """The issues of one GitHub repository as a board (see the module docstring).

    `ledger` holds the outbox and the lane; `token` authenticates (never stored or shown:
    the lane is named by its keyed fingerprint); `client` is the seam (default: a
    `GitHubClient` on `config.api_url`); `owner` names this process's claims on outbox
    entries; `clock` gives POSIX seconds; a write that failed for its issue alone is
    retried after `retry_base_s`, doubling per failure in a row up to ten minutes.
    `read_only` (what `execkit status` opens): the board reads GitHub and the tracker's
    lane and writes nothing, to GitHub or to the ledger (`move` and `report` refuse).
    """

    def __init__(
        self,
        config: GitHubConfig,
        ledger: Ledger,
        token: str,
        *,
        client: GitHubClient | None = None,
        **options: Unpack[TrackerOptions],
    ) -> None:
        self.config = config
        super().__init__(
            what=f"GitHub board {config.repo}",
            lane=github_lane(token, ledger.ledger_id()),
            ledger=ledger,
            **options,
        )
        self.client = client if client is not None else GitHubClient(token, config.api_url)
        self._owner_repo = tuple(config.repo.split("/", 1))
        self._issues: dict[int, _Seen] = {}
        self._loaded = False
        self._since: str | None = None
        self._etags: dict[str, str] = {}

    @classmethod
    def from_env(
        cls,
        repo: str,
        ledger: Ledger,
        env: Mapping[str, str],
        settings: Mapping[str, Any] | None = None,
        *,
        read_only: bool = False,
    ) -> GitHubBoard:
        """The board `github:REPO` as `execkit dispatch` opens it: the token from
        `GITHUB_TOKEN` (else `GH_TOKEN`), the API from `GITHUB_API_URL`, the rest from
        `settings` (a board configuration file's `github` object). InvalidInput naming
        what is missing or wrong, before anything is sent."""
        config = GitHubConfig.from_mapping(repo, settings or {}, env)
        return cls(config, ledger, token_from(env), read_only=read_only)

    # -- the board protocol -----------------------------------------------------------

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
        """The open issues labelled eligible (a conditional poll first: one request,
        answered 304 when nothing changed). LaneWaiting or LaneStopped while the tracker's
        lane does not admit."""
        return [issue for issue in self.list_issues() if issue.state == "todo"]

    def list_issues(self) -> list[BoardIssue]:
        """Every issue carrying one of the board's labels, by number."""
        with self._lock:
            self._refreshing()
            try:
                return [
                    issue
                    for number in sorted(self._issues)
                    if (issue := self._issue(self._issues[number])) is not None
                ]
            except _Refusal as refused:  # reading an issue's comments
                self._refused(refused)

    def move(self, issue_id: str, state: str) -> bool:
        """Record the move in the ledger's outbox (sent by `catch_up`); False for a state
        the board does not have or an issue it has never listed. An issue closed by a
        person (while its run was in flight, say) is left alone: the move is taken (True,
        so a give-up is recorded and a reopened issue labelled eligible again gets its one
        forced retry) and nothing is recorded for it; the run's report still takes the
        running label off."""
        if state not in {s.name for s in self.states} or state == "closed":
            return False
        if self.read_only:
            return False
        with self._lock:
            seen = self._issues.get(self._number(issue_id))
            if seen is None:
                return False
            return self._record_move(issue_id, state, open_=seen.open)

    # -- reading --------------------------------------------------------------------------

    def _number(self, issue_id: str) -> int:
        prefix = f"{self.config.repo}#"
        if not issue_id.startswith(prefix) or not issue_id[len(prefix) :].isdigit():
            return -1
        return int(issue_id[len(prefix) :])

    def _state(self, seen: _Seen) -> str | None:
        labels = seen.labels
        config = self.config
        if seen.open and config.label in labels:
            return "todo"
        if config.done_label in labels:
            return "done"
        if config.blocked_label in labels:
            return "blocked"
        if labels & self.config.ours:
            return "closed" if not seen.open else None
        return None

    def _issue(self, seen: _Seen) -> BoardIssue | None:
        issue_id = f"{self.config.repo}#{seen.number}"
        state = self._moved.get(issue_id) or self._state(seen)
        if state is None:
            return None
        settings = _settings(seen.body, seen.labels, self.config.label)
        prompt = seen.title + ("\n\n" + seen.body if seen.body else "")
        if self.config.comments and state == "todo":
            prompt += self._comments_of(seen)
        return BoardIssue(
            id=issue_id,
            title=seen.title[:10_000],
            state=state,
            prompt=prompt,
            adapter=settings.get("adapter"),
            model=settings.get("model"),
            given_up_from="todo" if state == "blocked" else None,
        )

    def _comments_of(self, seen: _Seen) -> str:
        """The issue's comments as the prompt's tail (`GitHubConfig.comments`): each as
        `<login> wrote:` and its text, oldest first, the status comment left out, every
        credential masked (the prompt reaches an agent and its logs: a sink like every
        other), at most `comments_max_chars` of text (the newest whole comments that fit,
        the newest one cut to fit when it alone does not; how many were left out said).
        Read again only when the issue changed (a comment changes its `updated_at`);
        `_Refusal` as every call."""
        if seen.comments_at == seen.updated_at and seen.comments_text is not None:
            return seen.comments_text
        from execkit._mask import mask_text

        owner, repo = self._owner_repo
        found: list[str] = []
        for page in range(1, _MAX_PAGES + 1):
            answer = self._call(
                functools.partial(
                    self.client.rest.issues.list_comments,
                    owner,
                    repo,
                    seen.number,
                    per_page=_PER_PAGE,
                    page=page,
                )
            )
            comments = answer.data.parsed_data
            for comment in comments:
                body = str(comment.body or "")
                if body.startswith(STATUS_MARKER):
                    continue
                who = str(comment.user.login) if comment.user is not None else "someone"
                found.append(f"{who} wrote:\n{body.strip()}")
            if len(comments) < _PER_PAGE:
                break
        most = self.config.comments_max_chars
        kept: list[str] = []
        size = 0
        for text in reversed(found):
            if size + len(text) > most:
                if kept:
                    break  # whole comments only, but for the newest, cut to fit
                text = text[:most]
            kept.append(text)
            size += len(text)
        kept.reverse()
        left = len(found) - len(kept)
        head = f"({left} older comments left out)\n\n" if left else ""
        text = mask_text("\n\n## Comments\n\n" + head + "\n\n".join(kept)) if found else ""
        seen.comments_text, seen.comments_at = text, seen.updated_at
        return text

    def _call(self, send: Callable[[], Any]) -> _Answer:
        """One request through the client, its rate-limit headers read: a spent primary
        limit parks the lane until its reset even on a success."""
        answer = self.client.call(send)
        if answer.headers.get("x-ratelimit-remaining") == "0":
            reset = _header_time(answer.headers.get("x-ratelimit-reset"))
            if reset is not None and reset > self.clock():
                self._lane_call(_Refusal("reset", "GitHub's rate limit is spent", until=reset))
                return answer
        self._answered()
        return answer

    def _refresh(self) -> None:
        if not self._loaded:
            self._load()
        else:
            self._poll()

    def _page(self, page: int, **query: Any) -> _Answer:
        owner, repo = self._owner_repo
        return self._call(
            lambda: self.client.rest.issues.list_for_repo(
                owner, repo, per_page=_PER_PAGE, page=page, **query
            )
        )

    def _load(self) -> None:
        """The first read: every open issue, page by page."""
        newest = ""
        date = None
        for page in range(1, _MAX_PAGES + 1):
            answer = self._page(page, state="open", sort="updated", direction="asc")
            date = date or answer.headers.get("date")
            items = answer.data.parsed_data
            for item in items:
                newest = max(newest, self._merge(item))
            if len(items) < _PER_PAGE or 'rel="next"' not in answer.headers.get("link", ""):
                break
        else:
            raise InvalidInput(
                f"GitHub board {self.config.repo}: more than {_MAX_PAGES * _PER_PAGE} open "
                "issues; a board is read into memory",
                field="board",
            )
        self._since = newest or _http_date(date) or _iso(self.clock())
        self._loaded = True

    def _poll(self) -> None:
        """The issues updated since the newest seen: one conditional request (304 when
        nothing changed), more pages only when more than a page changed."""
        since = self._since
        assert since is not None
        newest = since
        for page in range(1, _MAX_PAGES + 1):
            key = f"{since}|{page}"
            headers = {"If-None-Match": self._etags[key]} if key in self._etags else {}
            owner, repo = self._owner_repo
            answer = self._call(
                functools.partial(
                    self.client.rest.issues.list_for_repo,
                    owner,
                    repo,
                    state="all",
                    since=datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC),
                    sort="updated",
                    direction="asc",
                    per_page=_PER_PAGE,
                    page=page,
                    headers=headers,
                )
            )
            if answer.status == 304:
                return
            if "etag" in answer.headers:
                self._etags = {k: v for k, v in self._etags.items() if k.startswith(since)}
                self._etags[key] = answer.headers["etag"]
            items = answer.data.parsed_data
            for item in items:
                newest = max(newest, self._merge(item))
            if len(items) < _PER_PAGE or 'rel="next"' not in answer.headers.get("link", ""):
                break
        self._since = newest

    def _merge(self, item: Any) -> str:
        """Keep what an answer says of one issue (a pull request is not one); its
        `updated_at` as text."""
        updated = _iso(item.updated_at.timestamp())
        if getattr(item, "pull_request", None):
            return updated
        labels = frozenset(
            label if isinstance(label, str) else str(label.name) for label in item.labels
        )
        before = self._issues.get(int(item.number))
        self._issues[int(item.number)] = seen = _Seen(
            number=int(item.number),
            title=str(item.title),
            body=str(item.body or ""),
            labels=labels,
            open=item.state == "open",
            updated_at=updated,
        )
        if before is not None and before.comments_at == updated:
            seen.comments_text, seen.comments_at = before.comments_text, before.comments_at
        return updated

    # -- writing --------------------------------------------------------------------------

    def _wanted(self, seen: _Seen, payload: Mapping[str, Any]) -> frozenset[str]:
        return wanted_labels(self.config, seen.labels, seen.open, payload)

    def _seen(self, number: int) -> _Seen:
        seen = self._issues.get(number)
        if seen is None:
            owner, repo = self._owner_repo
            answer = self._call(lambda: self.client.rest.issues.get(owner, repo, number))
            self._merge(answer.data.parsed_data)
            seen = self._issues[number]
        return seen

    def _send(self, item: str, payload: dict[str, Any], ref: str | None, sends: int) -> str | None:
        """Make the issue show `payload`: labels, state, status comment. The comment's id."""
        number = self._number(item)
        if number < 0:
            raise _Refusal("item", f"{item!r} is not an issue of {self.config.repo}")
        owner, repo = self._owner_repo
        seen = self._seen(number)
        target = self._wanted(seen, payload)
        added, removed = target - seen.labels, seen.labels - target
        answer: _Answer | None = None
        if added and not removed:
            answer = self._call(
                lambda: self.client.rest.issues.add_labels(
                    owner, repo, number, data={"labels": sorted(added)}
                )
            )
        elif removed and not added and len(removed) == 1:
            (name,) = removed
            try:
                answer = self._call(
                    lambda: self.client.rest.issues.remove_label(owner, repo, number, name)
                )
            except _Refusal as refused:
                if refused.status != 404:  # not there: removed already
                    raise
        elif added or removed:
            answer = self._call(
                lambda: self.client.rest.issues.set_labels(
                    owner, repo, number, data={"labels": sorted(target)}
                )
            )
        if answer is not None:
            seen.labels = frozenset(str(label.name) for label in answer.data.parsed_data)
        elif removed:
            seen.labels = target
        if payload.get("state") == "done" and self.config.close_on_done and seen.open:
            self._call(
                lambda: self.client.rest.issues.update(
                    owner, repo, number, data={"state": "closed"}
                )
            )
            seen.open = False
        if payload.get("attempt") is None:
            return ref
        return self._comment(item, number, render_status(payload), ref, sends)

    def _repo_of(self, item: str) -> tuple[str, str]:
        """The repository (owner, name) issue `item` (`OWNER/REPO#N`) is in."""
        owner, _, rest = item.partition("/")
        return owner, rest.rpartition("#")[0]

    def _comment(self, item: str, number: int, text: str, ref: str | None, sends: int) -> str:
        """Make the issue's one status comment say `text` (edited by its id `ref`, found
        by its marker, or created once); its id."""
        owner, repo = self._repo_of(item)
        if ref is not None and self._comments.get(item) == text:
            return ref
        if ref is None and sends > 1:
            # An earlier send may have made it before its answer was lost: find it first.
            ref = self._find_comment(item, number)
        if ref is not None:
            comment_id = int(ref)
            try:
                self._call(
                    lambda: self.client.rest.issues.update_comment(
                        owner, repo, comment_id, data={"body": text}
                    )
                )
            except _Refusal as refused:
                if refused.status != 404:
                    raise
                ref = None  # deleted by someone: made again below
        if ref is None:
            answer = self._call(
                lambda: self.client.rest.issues.create_comment(
                    owner, repo, number, data={"body": text}
                )
            )
            ref = str(answer.data.parsed_data.id)
        self._comments[item] = text
        return ref

    def _find_comment(self, item: str, number: int) -> str | None:
        owner, repo = self._repo_of(item)
        for page in range(1, _MAX_PAGES + 1):
            answer = self._call(
                lambda: self.client.rest.issues.list_comments(
                    owner,
                    repo,
                    number,
                    per_page=_PER_PAGE,
                    page=page,  # noqa: B023
                )
            )
            comments = answer.data.parsed_data
            for comment in comments:
                if (comment.body or "").startswith(STATUS_MARKER):
                    return str(comment.id)
            if len(comments) < _PER_PAGE:
                return None
        return None


def _http_date(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return _iso(email.utils.parsedate_to_datetime(value).timestamp())
    except (TypeError, ValueError):
        return None
