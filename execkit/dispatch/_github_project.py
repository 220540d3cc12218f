"""A GitHub Project (v2) as a board (issue #47): `--board github-project:OWNER/NUMBER`, an
organization's or a user's project, read and moved through GitHub's GraphQL API (Projects v2
has no REST API).

The project's single-select field `Status` (its name configurable) is the board's columns:
each of its options is a state, and the board configuration says which are eligible, which
are terminal, where a succeeded issue goes (`done`) and where a given-up one goes
(`failed`). Items are issues (in any repository); a draft item is skipped (said once, at
WARNING, per item), a pull request and an archived item are not cards. An issue closed while
its status is not terminal stands in the pseudo-state `closed` (terminal): the board leaves
it alone, as a `github:` board does.

What is shared with `GitHubBoard` (its subclass here): the tracker's lane and its rate
limits, the outbox (`move` and `report` record, `catch_up` sends), the status comment on
the issue (REST, edited in place, found again by its marker). A move is one GraphQL
mutation (`updateProjectV2ItemFieldValue`, the Status option's id). A poll is one GraphQL
query per 100 items: GraphQL has no conditional request, so a project board's idle poll
costs what GitHub's GraphQL rate limit counts for it (a point per query), unlike the issues
board's free 304.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

import attrs

from execkit._errors import ExecKitError, InvalidInput
from execkit.dispatch._board import BoardIssue, BoardState
from execkit.dispatch._github import (
    GITHUB_API_URL,
    GitHubBoard,
    GitHubClient,
    GitHubConfig,
    graphql_data,
    token_from,
)
from execkit.dispatch._tracker import TrackerOptions, _Refusal, _settings, render_status

if TYPE_CHECKING:
    from execkit.ledger import Ledger

__all__ = [
    "PROJECT_ITEMS_QUERY",
    "SET_STATUS_MUTATION",
    "GitHubProjectBoard",
    "GitHubProjectConfig",
]

_log = logging.getLogger("execkit.dispatch")
_LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})\Z")
_MAX_PAGES = 500
_CLOSED = "closed"

PROJECT_ITEMS_QUERY = """
query ExeckitProjectItems($owner: String!, $number: Int!, $status: String!, $after: String) {
  repositoryOwner(login: $owner) {
    __typename
    ... on ProjectV2Owner {
      projectV2(number: $number) {
        id
        title
        field(name: $status) {
          __typename
          ... on ProjectV2SingleSelectField { id name options { id name } }
        }
        items(first: 100, after: $after) {
          pageInfo { hasNextPage endCursor }
          nodes {
            id
            isArchived
            type
            fieldValueByName(name: $status) {
              __typename
              ... on ProjectV2ItemFieldSingleSelectValue { name optionId }
            }
            content {
              __typename
              ... on Issue {
                id
                number
                title
                body
                state
                repository { nameWithOwner }
                labels(first: 100) { nodes { name } }
              }
              ... on DraftIssue { id title }
            }
          }
        }
      }
    }
  }
}
"""
"""The one read of a project board, a page of 100 items at a time (GitHub's GraphQL schema:
`ProjectV2Owner.projectV2`, `ProjectV2.field`, `ProjectV2.items`, `ProjectV2Item`)."""

SET_STATUS_MUTATION = """
mutation ExeckitSetStatus($project: ID!, $item: ID!, $field: ID!, $option: String!) {
  updateProjectV2ItemFieldValue(
    input: {
      projectId: $project
      itemId: $item
      fieldId: $field
      value: {singleSelectOptionId: $option}
    }
  ) {
    projectV2Item { id }
  }
}
"""
"""A move: the item's Status set to one option (GitHub's `updateProjectV2ItemFieldValue`)."""


def _names(key: str, value: object) -> tuple[str, ...]:
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(name, str) and name.strip() and len(name) <= 200 for name in value)
    ):
        raise InvalidInput(
            f"github_project.{key} must be a non-empty list of Status option names "
            f"(1..200 characters each), got {value!r}",
            field=f"github_project.{key}",
        )
    return tuple(value)


@attrs.frozen(kw_only=True)
class GitHubProjectConfig:
    """A GitHub Project (v2) board: its owner's login and number, the API, the name of its
    single-select Status field, and which Status options are eligible, terminal, done and
    failed (`failed` None: no give-up move; the dispatcher then retries past its bounds,
    loudly). `done` and `failed` are terminal whether listed or not."""

    owner: str
    number: int
    api_url: str = GITHUB_API_URL
    status_field: str = "Status"
    eligible: tuple[str, ...] = ("Todo",)
    terminal: tuple[str, ...] = ("Done",)
    done: str = "Done"
    failed: str | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.owner, str) or _LOGIN.match(self.owner) is None:
            raise InvalidInput(
                f"a project's owner must be a GitHub login, got {self.owner!r}", field="board"
            )
        if type(self.number) is not int or not 1 <= self.number <= 2**31 - 1:
            raise InvalidInput(
                f"a project's number must be a positive integer, got {self.number!r}",
                field="board",
            )
        both = set(self.eligible) & self.terminal_names
        if both:
            raise InvalidInput(
                f"github_project: {sorted(both)} cannot be both eligible and terminal",
                field="github_project.eligible",
            )

    @property
    def terminal_names(self) -> frozenset[str]:
        return frozenset(self.terminal) | {self.done} | ({self.failed} if self.failed else set())

    @property
    def name(self) -> str:
        return f"github-project:{self.owner}/{self.number}"

    @classmethod
    def parse(
        cls, spec: str, raw: Mapping[str, Any], env: Mapping[str, str]
    ) -> GitHubProjectConfig:
        """`OWNER/NUMBER` (of `github-project:OWNER/NUMBER`) and the `github_project` object
        of a board configuration file (docs/formats.md); InvalidInput naming the key."""
        owner, slash, number = spec.partition("/")
        if not slash or not number.isdigit() or _LOGIN.match(owner) is None:
            raise InvalidInput(
                f"a project board is github-project:OWNER/NUMBER, got {spec!r}", field="board"
            )
        if not isinstance(raw, Mapping):
            raise InvalidInput("github_project must be an object", field="github_project")
        allowed = {"api_url", "status_field", "eligible", "terminal", "done", "failed"}
        unknown = set(raw) - allowed
        if unknown:
            raise InvalidInput(
                f"github_project: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}",
                field="github_project",
            )
        values: dict[str, Any] = {}
        for key in ("eligible", "terminal"):
            if key in raw:
                values[key] = _names(key, raw[key])
        for key in ("status_field", "done"):
            if key in raw:
                values[key] = _names(key, [raw[key]])[0]
        if raw.get("failed") is not None:
            values["failed"] = _names("failed", [raw["failed"]])[0]
        if values.get("failed") is not None and values["failed"] == values.get("done", "Done"):
            raise InvalidInput(
                "github_project.failed and github_project.done must differ",
                field="github_project.failed",
            )
        api = raw.get("api_url") or env.get("GITHUB_API_URL") or GITHUB_API_URL
        if not isinstance(api, str) or not api.startswith(("https://", "http://")):
            raise InvalidInput(
                f"github_project.api_url must be an http(s) URL, got {api!r}",
                field="github_project.api_url",
            )
        return cls(owner=owner, number=int(number), api_url=api, **values)

    def dispatch_states(self) -> dict[str, Any]:
        """The dispatch settings this board implies: `done_state`, `failed_state`."""
        return {"done_state": self.done, "failed_state": self.failed or "none"}


@attrs.define
class _Item:
    """One project item that is an issue, as the last read showed it."""

    item_id: str  # the ProjectV2Item's node id
    issue_id: str  # OWNER/REPO#NUMBER
    number: int
    title: str
    body: str
    labels: frozenset[str]
    open: bool
    status: str | None


class GitHubProjectBoard(GitHubBoard):
    """A GitHub Project (v2) as a board (see the module docstring). The arguments are
    `GitHubBoard`'s, with a `GitHubProjectConfig`."""

    def __init__(
        self,
        project: GitHubProjectConfig,
        ledger: Ledger,
        token: str,
        *,
        client: GitHubClient | None = None,
        **options: Unpack[TrackerOptions],
    ) -> None:
        # The issues board's settings that still apply (the API; no labels are moved).
        base = GitHubConfig(
            repo=f"{project.owner}/project-{project.number}", api_url=project.api_url
        )
        super().__init__(
            base,
            ledger,
            token,
            client=client,
            **options,
        )
        self.project = project
        self._what = f"GitHub project {project.owner}/{project.number}"
        self._items: dict[str, _Item] = {}
        self._project_id: str | None = None
        self._field_id: str | None = None
        self._options: dict[str, str] = {}  # Status option name -> its id
        self._drafts_said: set[str] = set()

    @classmethod
    def from_env(
        cls,
        spec: str,
        ledger: Ledger,
        env: Mapping[str, str],
        settings: Mapping[str, Any] | None = None,
        *,
        read_only: bool = False,
    ) -> GitHubProjectBoard:
        """The board `github-project:SPEC` as `execkit dispatch` opens it (the token from
        `GITHUB_TOKEN`, else `GH_TOKEN`; `settings`, a configuration file's
        `github_project` object). InvalidInput naming what is wrong, before anything is sent."""
        project = GitHubProjectConfig.parse(spec, settings or {}, env)
        return cls(project, ledger, token_from(env), read_only=read_only)

    @classmethod
    def implied_dispatch(
        cls, spec: str, settings: Mapping[str, Any], env: Mapping[str, str]
    ) -> dict[str, Any]:
        """The dispatch settings the configuration implies (`done_state`, `failed_state`)."""
        return GitHubProjectConfig.parse(spec, settings, env).dispatch_states()

    # -- the board protocol ---------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.project.name

    @property
    def states(self) -> tuple[BoardState, ...]:
        """The Status options as last read (eligible and terminal as configured), and
        `closed` (an issue closed outside a terminal status)."""
        terminal = self.project.terminal_names
        names = list(self._options) or [*self.project.eligible, *sorted(terminal)]
        shown = [
            BoardState(name, eligible=name in self.project.eligible, terminal=name in terminal)
            for name in names
        ]
        if _CLOSED not in names:
            shown.append(BoardState(_CLOSED, terminal=True))
        return tuple(shown)

    def list_candidates(self) -> list[BoardIssue]:
        """The open issues whose Status is eligible (one GraphQL query per 100 items)."""
        eligible = set(self.project.eligible)
        return [issue for issue in self.list_issues() if issue.state in eligible]

    def list_issues(self) -> list[BoardIssue]:
        """Every issue on the project that has a Status, by id."""
        with self._lock:
            self._refreshing()
            return [
                issue
                for key in sorted(self._items)
                if (issue := self._card(self._items[key])) is not None
            ]

    def move(self, issue_id: str, state: str) -> bool:
        """Record the move (sent by `catch_up`); False for a Status the project does not
        have or an issue it does not hold; a closed issue is left alone (True, nothing
        recorded), as on a `github:` board."""
        if self.read_only or state == _CLOSED or state not in self._options:
            return False
        with self._lock:
            item = self._items.get(issue_id)
            if item is None:
                return False
            return self._record_move(issue_id, state, open_=item.open)

    # -- reading ----------------------------------------------------------------------------

    def _card(self, item: _Item) -> BoardIssue | None:
        state = self._moved.get(item.issue_id) or item.status
        if state is None:
            return None
        if not item.open and state not in self.project.terminal_names:
            state = _CLOSED
        settings = _settings(item.body, item.labels, "execkit")
        failed = self.project.failed
        return BoardIssue(
            id=item.issue_id,
            title=item.title[:10_000],
            state=state,
            prompt=item.title + ("\n\n" + item.body if item.body else ""),
            adapter=settings.get("adapter"),
            model=settings.get("model"),
            given_up_from=self.project.eligible[0] if failed and state == failed else None,
        )

    def _refresh(self) -> None:
        self._read()

    def _read(self) -> None:
        project = self.project
        items: dict[str, _Item] = {}
        after: str | None = None
        for _ in range(_MAX_PAGES):
            variables = {
                "owner": project.owner,
                "number": project.number,
                "status": project.status_field,
                "after": after,
            }
            answer = self._call(
                lambda: self.client.graphql_request(PROJECT_ITEMS_QUERY, variables)  # noqa: B023
            )
            data = graphql_data(answer, self.clock())
            found = (data.get("repositoryOwner") or {}).get("projectV2")
            if not found:
                raise ExecKitError(
                    f"{self._what}: no such project, or the token may not read it (it needs "
                    "the project scope: read:project, or project to move items)"
                )
            self._project_id = str(found["id"])
            self._learn_field(found.get("field"))
            page = found["items"]
            for node in page.get("nodes") or []:
                item = self._item(node)
                if item is not None:
                    items[item.issue_id] = item
            info = page["pageInfo"]
            if not info.get("hasNextPage"):
                break
            after = info.get("endCursor")
        else:
            raise InvalidInput(
                f"{self._what}: more than {_MAX_PAGES * 100} items; a board is read into memory",
                field="board",
            )
        self._items = items

    def _learn_field(self, field: Any) -> None:
        project = self.project
        if not field or field.get("__typename") != "ProjectV2SingleSelectField":
            raise InvalidInput(
                f"{self._what} has no single-select field {project.status_field!r} "
                "(github_project.status_field names it)",
                field="github_project.status_field",
            )
        self._field_id = str(field["id"])
        self._options = {str(option["name"]): str(option["id"]) for option in field["options"]}
        for key, names in (("eligible", project.eligible), ("terminal", project.terminal)):
            missing = [name for name in names if name not in self._options]
            if missing:
                raise InvalidInput(
                    f"{self._what}: github_project.{key} names {missing}, not options of "
                    f"{project.status_field!r} ({sorted(self._options)})",
                    field=f"github_project.{key}",
                )
        for key, name in (("done", project.done), ("failed", project.failed)):
            if name is not None and name not in self._options:
                raise InvalidInput(
                    f"{self._what}: github_project.{key} {name!r} is not an option of "
                    f"{project.status_field!r} ({sorted(self._options)})",
                    field=f"github_project.{key}",
                )

    def _item(self, node: Mapping[str, Any]) -> _Item | None:
        """What one item of the project is for the board: an issue, or None (a draft,
        said once; a pull request; an archived or redacted item)."""
        content = node.get("content") or {}
        kind = content.get("__typename")
        if kind == "DraftIssue":
            if node["id"] not in self._drafts_said:
                self._drafts_said.add(node["id"])
                _log.warning(
                    "%s: draft item %r is skipped (only issues are dispatched; convert it "
                    "to an issue)",
                    self._what,
                    str(content.get("title") or "")[:100],
                )
            return None
        if kind != "Issue" or node.get("isArchived"):
            return None
        value = node.get("fieldValueByName") or {}
        status = (
            value.get("name")
            if value.get("__typename") == "ProjectV2ItemFieldSingleSelectValue"
            else None
        )
        repo = str(content["repository"]["nameWithOwner"])
        labels = frozenset(
            str(label["name"]) for label in (content.get("labels") or {}).get("nodes") or []
        )
        return _Item(
            item_id=str(node["id"]),
            issue_id=f"{repo}#{int(content['number'])}",
            number=int(content["number"]),
            title=str(content.get("title") or ""),
            body=str(content.get("body") or ""),
            labels=labels,
            open=content.get("state") == "OPEN",
            status=None if status is None else str(status),
        )

    # -- writing ----------------------------------------------------------------------------

    def _send(self, item: str, payload: dict[str, Any], ref: str | None, sends: int) -> str | None:
        """Make the item show `payload`: its Status (one mutation, when it differs), then
        the issue's status comment. The comment's id."""
        found = self._items.get(item)
        if found is None:
            raise _Refusal("item", f"{item!r} is not an issue of {self._what}")
        state = payload.get("state")
        if state is not None and found.open and found.status != state:
            option = self._options.get(state)
            if option is None:
                raise _Refusal("item", f"{state!r} is not a Status option of {self._what}")
            variables = {
                "project": self._project_id,
                "item": found.item_id,
                "field": self._field_id,
                "option": option,
            }
            answer = self._call(lambda: self.client.graphql_request(SET_STATUS_MUTATION, variables))
            graphql_data(answer, self.clock())
            found.status = state
        if payload.get("attempt") is None:
            return ref
        return self._comment(item, found.number, render_status(payload), ref, sends)
