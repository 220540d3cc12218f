"""The ledger's wire shapes and the `Ledger` interface every backend implements.

The dispatcher, the CLI and the HTTP remote code against this module only; a backend
(SQLite, PostgreSQL) implements the storage beneath `LedgerCore` (`_core`), and the
remote client implements `Ledger` over HTTP.

The ledger's words are enums that compare equal to the strings stored and sent: a task's
`TaskStatus` and `TaskState`, a `Role` granted in the ledger, and the `AuditAction` of every
audit record it writes (an `AuditEntry`, read back with its number as an `AuditEvent`).
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import attrs
from attrs.validators import ge, instance_of, max_len, optional

from execkit._backoff import Backoff
from execkit._budget import (
    EXPLICIT_LIMIT_MAX,
    Attempt,
    AttemptStatus,
    BlockedOn,
    DispatchCap,
    TaskState,
    WorkBudget,
)
from execkit._classify import FailureClass
from execkit._json import to_json
from execkit._lanes import LaneConfig, LaneEvent, LaneView
from execkit._usage import Usage, UsdSource
from execkit._validate import checked, fields_in_order, finite, integer, non_blank
from execkit.ledger._spend import (
    SPEND_CAPABILITY,
    SPEND_ROOM_CAPABILITY,
    SpendCap,
    SpendConfig,
    SpendRoom,
    SpendRow,
    SpendWindow,
    TaskBudget,
    WindowUse,
)

__all__ = [
    "ADMIN_ROLE",
    "CAPABILITIES",
    "DEFAULT_LEASE_S",
    "KNOWN_ROLES",
    "LANES_CAPABILITY",
    "LIST_PAGE",
    "MAX_ATTEMPT_LIMIT",
    "MAX_LEASE_S",
    "MAX_UNCHARGED_LIMIT",
    "NOTIFY_CAPABILITY",
    "NOTIFY_ENABLE_CAPABILITY",
    "OPERATE_ROLE",
    "OUTBOX_CAPABILITY",
    "WAKE_CAPABILITY",
    "Actor",
    "AuditAction",
    "AuditEntry",
    "AuditEvent",
    "Grant",
    "LastOutcome",
    "Ledger",
    "NotifyEndpoint",
    "NotifyEvent",
    "NotifyKind",
    "OutboxEntry",
    "Role",
    "Run",
    "RunOwner",
    "Task",
    "TaskState",
    "TaskStatus",
    "TaskValues",
    "last_outcome",
    "task_values",
    "user_name",
]

WAKE_CAPABILITY = "ledger.wake"
"""Wake-ups (issue #51): `wake_seq` and `wait_for_wake`, which a dispatcher waits on to run
a pass at once when an operator lets work run again. A client of a server that does not
advertise it keeps to its pass interval."""

OUTBOX_CAPABILITY = "boards.outbox"
"""Board write-back (issue #47): the outbox a tracker board records its writes in
(`outbox_put`, drained with `outbox_claim` and `outbox_settle`), the calls a tracker makes
on its own lane (`record_lane_call`) and its webhook deliveries (`note_delivery`)."""

LANES_CAPABILITY = "vendor.lanes"
"""Vendor lanes (issue #28): admission consults a run's lane, results feed it, operators
park and resume it. A client sends a lane only to a server that advertises it."""

SESSIONS_CAPABILITY = "runs.sessions"
"""Vendor sessions kept (issue #46): `finish_run(session_id=...)` stores the vendor session a
run's agent ran in (`Run.session_id`), which the task's next attempt resumes after an
upstream refusal. A client sends a session only to a server that advertises it."""

NOTIFY_CAPABILITY = "notify.endpoints"
"""Being told (issue #49): notification endpoints stored in the ledger (`notify add`,
`list`, `test`, `remove`) and the event outbox they are sent from."""

NOTIFY_ENABLE_CAPABILITY = "notify.enable"
"""An endpoint a refusal stopped is sent to again without being removed (`notify enable`,
`enable_notify_endpoint`), its waiting events in order."""

CAPABILITIES = frozenset(
    {
        NOTIFY_CAPABILITY,
        NOTIFY_ENABLE_CAPABILITY,
        "tasks.attempt_limits",
        "runs.leases",
        "tasks.retry",
        "roles.grants",
        LANES_CAPABILITY,
        "runs.owners",
        WAKE_CAPABILITY,
        OUTBOX_CAPABILITY,
        SPEND_CAPABILITY,
        SPEND_ROOM_CAPABILITY,
        SESSIONS_CAPABILITY,
    }
)
"""What this ledger enforces; a client must see `tasks.attempt_limits` before relying on a
limit (ADR 0033: an older server must not be assumed to enforce an unknown field), and
`vendor.lanes` before sending a lane."""

# ADR 0033: an explicit limit is 1..10000 total task-bound runs; 0 means "no explicit limit".
MAX_ATTEMPT_LIMIT = EXPLICIT_LIMIT_MAX

# ADR 0046: a per-item ceiling on consecutive upstream attempts; None = the ledger's budget.
MAX_UNCHARGED_LIMIT = 1000


class Role(enum.StrEnum):
    """A role granted in the ledger (`Ledger.grant_role`); the ledger's owner holds every one.

    Stored and sent as its string; a grant read back keeps the string it was stored with.
    """

    # ADR 0033: after the first run, changing a task's limit (or retrying it past the
    # limit, which raises it) needs this role.
    OPERATE = "agent.operate"
    # Granting and revoking roles needs this role (or owning the ledger).
    ADMIN = "ledger.admin"


# The names other packages (the server, the CLI) have always used: the members themselves,
# so they compare and hash equal to the strings they were.
OPERATE_ROLE = Role.OPERATE
ADMIN_ROLE = Role.ADMIN
KNOWN_ROLES: frozenset[Role] = frozenset(Role)

DEFAULT_LEASE_S = 300.0
"""How long a running run's lease lasts unless its runner renews it (`heartbeat`). A run
whose lease has expired is abandoned by the next admission on its task, on any host."""
MAX_LEASE_S = 7 * 24 * 3600.0

_NAME = checked("a non-empty string of at most 200 characters", non_blank, max_len(200))


@attrs.frozen
class Actor:
    """Who acts: an identity the caller has established (the operating-system user, a
    token's owner), optionally acting for someone else.

    Roles are always those of `name`; the audit records `"X on behalf of Y"`, never Y.
    """

    name: str = attrs.field(validator=_NAME)
    on_behalf_of: str | None = attrs.field(
        default=None, validator=checked("a name or None", optional(instance_of(str)))
    )

    def __str__(self) -> str:
        if self.on_behalf_of:
            return f"{self.name} on behalf of {self.on_behalf_of}"
        return self.name

    @classmethod
    def of(cls, value: Actor | str) -> Actor:
        """`value` as an Actor (a bare string is an identity acting for itself)."""
        return value if isinstance(value, Actor) else cls(value)


@attrs.frozen
class Grant:
    """A role held by a principal, and who granted it when."""

    principal: str
    role: str
    granted_by: str
    granted_at: float

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class TaskStatus(enum.StrEnum):
    """What is stored about a task itself: open until a run succeeds or it is cancelled."""

    OPEN = "open"
    DONE = "done"
    CANCELLED = "cancelled"


_OWNER_TEXT = 256


def _owner_text() -> Any:
    return checked(
        f"a non-blank string of at most {_OWNER_TEXT} characters", non_blank, max_len(_OWNER_TEXT)
    )


@attrs.frozen
class RunOwner:
    """Who runs a run: the process (usually a dispatcher) that asked for its admission.

    `host` is the host name; `boot_id` the kernel's boot id and `pid_namespace` the pid
    namespace's inode, which together say where `pid` means something (after a reboot, or
    in another container, the same pid is another process); `pid_started_at` the process's
    start time (a reused pid has another); `instance` a random id the owner drew when it
    started (two dispatchers of one process differ). Read from the OS by
    `current_owner()` (`_owner.py`), never from a flag. Carried by `start_run` locally, on
    PostgreSQL and through the HTTP remote, so a run's owner is its dispatcher and never
    the process that wrote the row.
    """

    host: str = attrs.field(validator=_owner_text())
    boot_id: str = attrs.field(validator=_owner_text())
    pid_namespace: int = attrs.field(validator=checked("an integer >= 0", integer, ge(0)))
    pid: int = attrs.field(validator=checked("an integer >= 1", integer, ge(1)))
    pid_started_at: float = attrs.field(
        validator=checked("a finite number of POSIX seconds", finite)
    )
    instance: str = attrs.field(validator=_owner_text())

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


@attrs.frozen
class Run:
    """One admitted run: a row of the immutable history.

    A running run holds a lease until `lease_expires_at`, which its runner renews while
    the child lives (`Ledger.heartbeat`); once it has expired the next admission on the
    task abandons the run, on any host. `owner_host`/`owner_pid` say which process admitted
    it; the other `owner_` fields (None on runs older than schema 4, or admitted without
    one) complete its `RunOwner`: a dispatcher recognises its own runs by `owner_instance`
    and, on its host, finds the runs whose process is gone. `not_before` is the vendor's
    reset time recorded with a failure: the next attempt waits for it. `stopped`: an
    abandoned run its own runner stopped on purpose (uncharged; `_budget`). `lane_held`: an
    upstream failure its vendor lane absorbed (it met the lane closed, or was the probe that
    found it closed still), set by the ledger: it moves no streak (`_budget`). `workspace`:
    where its agent worked (`start_run(workspace=...)`: a dispatcher's workspace of the
    issue, issue #46), None when it was not said. `resumed_session`: the vendor session its
    agent was asked to continue (`start_run(resumed_session=...)`: the previous attempt
    ended on an upstream refusal in it, issue #46), None for a fresh start. `fell_back`:
    the dispatcher's announcement that the run went to a later adapter of its issue's order
    because the earlier ones' lanes were closed ("fell back from claude/x (parked until
    ...) to codex/y"; issue #46), None otherwise. `session_id`: the vendor session its agent
    ran in, as its result said it (`finish_run(session_id=...)`, issue #46): what the task's
    next attempt resumes after an upstream refusal, from any dispatcher; None when the run
    said none (and on runs from before the column).
    """

    id: str
    task_id: str
    attempt: int  # gapless 1..N per task
    status: AttemptStatus
    failure_class: FailureClass | None
    reason: str | None
    request_key: str
    actor: str
    forced: bool
    started_at: float
    ended_at: float | None
    owner_host: str = ""
    owner_pid: int = 0
    lease_expires_at: float | None = None
    not_before: float | None = None
    owner_boot_id: str | None = None
    owner_pid_namespace: int | None = None
    owner_pid_started_at: float | None = None
    owner_instance: str | None = None
    stopped: bool = False
    lane_held: bool = False
    workspace: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    usd: float | None = None
    usd_source: UsdSource = UsdSource.UNKNOWN
    model: str | None = None
    resumed_session: str | None = None
    fell_back: str | None = None
    session_id: str | None = None

    @property
    def usage(self) -> Usage:
        """What the run cost, as one `Usage` (unknown until its result reports it)."""
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cache_read_tokens=self.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens,
            usd=self.usd,
            usd_source=self.usd_source,
            model=self.model,
        )

    @property
    def owner(self) -> RunOwner | None:
        """The whole `RunOwner`, when the run carries one."""
        if (
            self.owner_boot_id is None
            or self.owner_pid_namespace is None
            or self.owner_pid_started_at is None
            or self.owner_instance is None
        ):
            return None
        return RunOwner(
            host=self.owner_host,
            boot_id=self.owner_boot_id,
            pid_namespace=self.owner_pid_namespace,
            pid=self.owner_pid,
            pid_started_at=self.owner_pid_started_at,
            instance=self.owner_instance,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe wire shape (`failure_class` as its string value or None)."""
        return to_json(self)


@attrs.frozen
class Task:
    """The Task wire shape (ADR 0033), with the budget projection of its history."""

    id: str
    title: str
    status: TaskStatus  # stored
    state: TaskState  # derived: the policies' decision, or done/cancelled from the status
    blocked_on: BlockedOn | None
    reason: str | None
    ready: bool  # state == ready, including that an attempt is still available
    max_attempts: int  # 0 = no explicit limit
    attempts_started: int
    charged_attempts: int
    uncharged_streak: int
    remaining: int | None
    next_attempt_at: float | None
    created_by: str
    created_at: float
    max_uncharged_attempts: int  # the ceiling in force: the task's own, else the ledger's
    retry_pending: bool = False  # an operator asked for one forced retry (`retry_task`)
    gave_up_at_attempt: int | None = None  # a dispatcher gave its issue up at this count

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe wire shape (every field is a str, int, float, bool or None)."""
        return to_json(self)


class TaskValues(NamedTuple):
    """A `Task`'s fields as a tuple, in `Task`'s order (checked at import): what a local
    ledger's listing shows each task from (`iter_task_values`) without building the Task,
    since a listing of 100,000 tasks made 100,000 of them to write each once.
    `Task(*values)` is the Task; `task_values(task)` gives a Task's."""

    id: str
    title: str
    status: TaskStatus
    state: TaskState
    blocked_on: BlockedOn | None
    reason: str | None
    ready: bool
    max_attempts: int
    attempts_started: int
    charged_attempts: int
    uncharged_streak: int
    remaining: int | None
    next_attempt_at: float | None
    created_by: str
    created_at: float
    max_uncharged_attempts: int
    retry_pending: bool
    gave_up_at_attempt: int | None


fields_in_order(Task, TaskValues._fields, "TaskValues holds them so")
_task_getter = operator.attrgetter(*TaskValues._fields)


def task_values(task: Task) -> TaskValues:
    """`task`'s fields as `TaskValues` (what a listing reads of a Task from elsewhere: a
    server's answer)."""
    return TaskValues._make(_task_getter(task))


class LastOutcome(NamedTuple):
    """How a task's last attempt stands, as a dashboard row shows it: its status, failure
    class and reason (read from the task's summary columns; `last_outcome(attempt)` gives
    an `Attempt`'s)."""

    status: AttemptStatus
    failure_class: FailureClass | None
    reason: str | None


def last_outcome(attempt: Attempt | None) -> LastOutcome | None:
    """`attempt`'s `LastOutcome` (None for None)."""
    if attempt is None:
        return None
    return LastOutcome(attempt.status, attempt.failure_class, attempt.reason)


class AuditAction(enum.StrEnum):
    """What an audit record says was done; stored as its string (the column `action`)."""

    TASK_CREATE = "task.create"
    TASK_SET_ATTEMPT_LIMIT = "task.set_attempt_limit"
    TASK_RETRY = "task.retry"
    TASK_GIVE_UP = "task.give_up"
    TASK_CANCEL = "task.cancel"
    TASK_REPAIR_SUMMARY = "task.repair_summary"
    RUN_START = "run.start"
    RUN_FINISH = "run.finish"
    RUN_ABANDON = "run.abandon"
    ROLE_GRANT = "role.grant"
    ROLE_REVOKE = "role.revoke"
    LANE_PARK = "lane.park"
    LANE_RESUME = "lane.resume"
    LANE_CONFIG = "lane.config"
    SPEND_CAPS = "spend.caps"
    SPEND_WARNING = "spend.warning"
    SPEND_OVERRIDE = "spend.override"
    TASK_SET_BUDGET = "task.set_budget"
    NOTIFY_ADD = "notify.add"
    NOTIFY_REMOVE = "notify.remove"
    NOTIFY_ENABLE = "notify.enable"


def _copied(detail: Mapping[str, Any]) -> dict[str, Any]:
    return dict(detail)


@attrs.frozen(kw_only=True)
class AuditEntry:
    """One audit record as the ledger writes it (`Tx.audit`): who did what, when, to which
    task and run. The store numbers it; it is read back as an `AuditEvent`.

    Keywords only, and the action must be an `AuditAction` member: an entry is never six
    positional values that a reordering could swap unnoticed. `detail` (JSON-safe) is
    copied, so the caller's dict cannot change the entry after it was made.
    """

    at: float = attrs.field(validator=checked("a finite number of POSIX seconds", finite))
    actor: str = attrs.field(validator=checked("a non-empty string", non_blank))
    action: AuditAction = attrs.field(validator=checked("an AuditAction", instance_of(AuditAction)))
    task_id: str | None = None
    run_id: str | None = None
    detail: dict[str, Any] = attrs.field(factory=dict, converter=_copied)


@attrs.frozen
class AuditEvent:
    """One audit record read back: an `AuditEntry` and its number (`id`, in write order).

    `action` is the stored string: one of `AuditAction`'s values for every record this
    execkit writes (compare with the members), kept as it is for one a newer one wrote.
    """

    id: int
    at: float
    actor: str
    action: str
    task_id: str | None
    run_id: str | None
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)  # `detail` is copied: the event stays immutable


LIST_PAGE = 1000
"""Tasks `iter_tasks` reads a page at a time (one read each): a listing of any length holds
one page in memory."""


@attrs.frozen(kw_only=True)
class OutboxEntry:
    """What a tracker board still owes its tracker for one item (issue #47): the state it
    must show, kept in the ledger until it is sent.

    One row per (`board`, `item`): `payload` is the JSON object the board wants the item
    to show (each `outbox_put` merges its keys over the last ones, so the latest move and
    the latest status both stand), `seq` counts the puts and `sent_seq` is the last one
    delivered, so the entry is `pending` while `seq > sent_seq` and a put made while a
    send is in flight stays pending after it. `ref` is the tracker's own handle the board
    keeps for the item (a status comment's id); `sends` counts the claims ever made (a
    first send knows no earlier one can have landed); `tries` the failed sends since the
    last success, `next_at` when the next may go and `last_error` why the last failed;
    `claimed_by`/`claimed_until` the drainer sending it now.
    """

    board: str
    item: str
    seq: int
    sent_seq: int
    payload: dict[str, Any]
    ref: str | None = None
    sends: int = 0
    tries: int = 0
    next_at: float | None = None
    claimed_by: str | None = None
    claimed_until: float | None = None
    last_error: str | None = None
    updated_at: float = 0.0

    @property
    def pending(self) -> bool:
        """Whether the tracker does not show the latest put yet."""
        return self.seq > self.sent_seq

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class NotifyKind(enum.StrEnum):
    """What a notification event reports (issue #49); stored as its string."""

    ISSUE_BLOCKED = "issue.blocked"
    LANE_STOPPED = "lane.stopped"
    LANE_PARKED = "lane.parked"
    LANE_RESUMED = "lane.resumed"
    DISPATCHER_STOPPED = "dispatcher.stopped"
    RUN_STALLED = "run.stalled"
    SPEND_WARNING = "spend.warning"
    SPEND_CAPPED = "spend.capped"
    TEST = "notify.test"


@attrs.frozen(kw_only=True)
class NotifyEvent:
    """One event a person must act on (issue #49), written in the transaction of the change
    it reports. `id` is stable (a receiver de-duplicates on it); `seq` orders the outbox;
    `subject` is what it is about (a task id, a lane name, a dispatcher); `payload` the
    JSON object the receiver gets under `data`."""

    seq: int
    id: str
    kind: str
    subject: str
    payload: dict[str, Any]
    at: float

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


@attrs.frozen(kw_only=True)
class NotifyEndpoint:
    """Where events are sent (issue #49): a URL the operator gave, the event kinds it wants
    (`("*",)`: all), its `format` (`json`: a signed webhook; `slack`: an incoming-webhook
    message), and whether it holds a signing secret (the secret itself is never part of
    this value). `from_seq`: events up to it were written before it existed and are not
    sent. `stopped_reason`: it refused for good (a 4xx other than 408/429) and is sent
    nothing until an admin enables it (`enable_notify_endpoint`). `delivered`/`failed`
    count events; `last_error` the last failure; `backlog` the events waiting for it (a
    listing fills it in)."""

    id: str
    url: str
    format: str
    events: tuple[str, ...]
    has_secret: bool
    from_seq: int
    created_by: str
    created_at: float
    stopped_reason: str | None = None
    delivered: int = 0
    failed: int = 0
    last_error: str | None = None
    last_at: float | None = None
    claimed_by: str | None = None
    claimed_until: float | None = None
    backlog: int = 0

    def wants(self, kind: str) -> bool:
        return kind == NotifyKind.TEST or "*" in self.events or kind in self.events

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class Ledger(Protocol):
    """Durable tasks and runs. Every method is one transaction; errors are ExecKitError.

    `actor` is an identity the caller established (see `Actor`); roles come from the grants
    stored in the ledger, never from the caller.
    """

    budget: WorkBudget
    backoff: Backoff

    def capabilities(self) -> frozenset[str]: ...
    def schema_version(self) -> int: ...
    def ledger_id(self) -> str: ...
    def location(self) -> str: ...

    def create_task(
        self,
        title: str,
        *,
        max_attempts: int = 0,
        max_uncharged_attempts: int | None = None,
        idempotency_key: str | None = None,
        actor: Actor | str,
        now: float | None = None,
    ) -> Task: ...

    def get_task(
        self,
        task_id: str,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        force: bool = False,
    ) -> Task: ...
    def list_tasks(
        self,
        *,
        now: float | None = None,
        state: TaskState | str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[Task]: ...
    def iter_tasks(
        self,
        *,
        now: float | None = None,
        state: TaskState | str | None = None,
        after: str | None = None,
    ) -> Iterator[Task]: ...
    def list_tasks_with_last(
        self,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        title_prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[tuple[Task, Attempt | None]]: ...
    def iter_tasks_with_last(
        self,
        *,
        now: float | None = None,
        cap: DispatchCap | None = None,
        title_prefix: str | None = None,
    ) -> Iterator[tuple[Task, Attempt | None]]: ...
    def runs(self, task_id: str) -> list[Run]: ...
    def announced_runs(self, task_ids: Sequence[str]) -> dict[str, list[Run]]: ...
    def run(self, run_id: str) -> Run: ...
    def history(self, task_id: str) -> list[Attempt]: ...

    def start_run(
        self,
        task_id: str,
        *,
        request_key: str,
        actor: Actor | str,
        forced: bool = False,
        ignore_backoff: bool = False,
        lease_s: float = DEFAULT_LEASE_S,
        now: float | None = None,
        cap: DispatchCap | None = None,
        owner: RunOwner | None = None,
        lane: str | None = None,
        workspace: str | None = None,
        resumed_session: str | None = None,
        fell_back: str | None = None,
    ) -> Run: ...

    def heartbeat(
        self, run_id: str, *, lease_s: float | None = None, now: float | None = None
    ) -> Run: ...

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        not_before: float | None = None,
        now: float | None = None,
        stopped: bool = False,
        lane_cause: str | None = None,
        usage: Usage | None = None,
        session_id: str | None = None,
    ) -> Run: ...

    def abandon_expired_runs(self, *, now: float | None = None) -> list[Run]: ...

    def running_runs(self) -> list[Run]: ...

    def abandon_run(
        self, run_id: str, *, reason: str, actor: Actor | str, now: float | None = None
    ) -> Run: ...

    def retry_task(
        self,
        task_id: str,
        *,
        actor: Actor | str,
        reason: str | None = None,
        force: bool = False,
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Task: ...

    def record_give_up(
        self, task_id: str, *, state: str, actor: Actor | str, now: float | None = None
    ) -> Task: ...

    def set_attempt_limit(
        self,
        task_id: str,
        max_attempts: int,
        *,
        expected_max_attempts: int,
        actor: Actor | str,
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Task: ...

    def cancel_task(
        self, task_id: str, *, actor: Actor | str, now: float | None = None
    ) -> Task: ...

    def grant_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> Grant: ...
    def revoke_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> bool: ...
    def grants(self, principal: str | None = None) -> list[Grant]: ...

    def add_notify_endpoint(
        self,
        url: str,
        *,
        events: Sequence[str],
        format: str = "json",
        secret: str | None = None,
        actor: Actor | str,
        now: float | None = None,
    ) -> NotifyEndpoint: ...
    def remove_notify_endpoint(
        self, endpoint_id: str, *, actor: Actor | str, now: float | None = None
    ) -> bool: ...
    def enable_notify_endpoint(
        self, endpoint_id: str, *, actor: Actor | str, now: float | None = None
    ) -> NotifyEndpoint: ...
    def notify_endpoints(self) -> list[NotifyEndpoint]: ...
    def notify_test(
        self, endpoint_id: str, *, actor: Actor | str, now: float | None = None
    ) -> NotifyEvent: ...

    def list_lanes(self, *, now: float | None = None) -> list[LaneView]: ...
    def get_lane(self, lane: str, *, now: float | None = None) -> LaneView: ...
    def lane_history(self, lane: str) -> list[LaneEvent]: ...
    def task_lane(self, task_id: str, *, now: float | None = None) -> LaneView | None: ...
    def task_lanes(
        self, task_ids: Sequence[str], *, now: float | None = None
    ) -> dict[str, LaneView]: ...
    def park_lane(
        self,
        lane: str,
        *,
        until: float,
        actor: Actor | str,
        reason: str | None = None,
        now: float | None = None,
    ) -> LaneView: ...
    def resume_lane(
        self,
        lane: str,
        *,
        actor: Actor | str,
        reason: str | None = None,
        now: float | None = None,
    ) -> LaneView: ...

    def record_lane_call(
        self,
        lane: str,
        outcome: str,
        *,
        until: float | None = None,
        reason: str | None = None,
        actor: Actor | str = "execkit",
        now: float | None = None,
    ) -> LaneView: ...

    def outbox_put(
        self, board: str, item: str, fields: Mapping[str, Any], *, now: float | None = None
    ) -> OutboxEntry: ...
    def outbox_claim(
        self,
        board: str,
        *,
        owner: str,
        lease_s: float = 60.0,
        limit: int = 50,
        now: float | None = None,
    ) -> list[OutboxEntry]: ...
    def outbox_settle(
        self,
        board: str,
        item: str,
        seq: int,
        *,
        owner: str,
        ref: str | None = None,
        error: str | None = None,
        retry_at: float | None = None,
        now: float | None = None,
    ) -> OutboxEntry: ...
    def outbox_entries(self, board: str, *, pending: bool = False) -> list[OutboxEntry]: ...
    def note_delivery(self, source: str, delivery: str, *, now: float | None = None) -> bool: ...

    def lane_config(self) -> LaneConfig: ...
    def wake_seq(self) -> int: ...
    def wait_for_wake(self, seen: int, timeout_s: float) -> int: ...
    def set_lane_config(
        self,
        *,
        actor: Actor | str,
        breaker_k: int | None = None,
        breaker_window_s: float | None = None,
        cool_base_s: float | None = None,
        cool_max_s: float | None = None,
        max_park_s: float | None = None,
        reset_margin_s: float | None = None,
        recheck_s: float | None = None,
        max_trips: int | None = None,
        now: float | None = None,
    ) -> LaneConfig: ...

    # Spend caps (issue #45; `spend.caps`).
    def spend_config(self) -> SpendConfig: ...
    def spend_windows(self, *, now: float | None = None) -> list[WindowUse]: ...
    def spend_rows(self, *, since: float = 0.0) -> list[SpendRow]: ...
    def set_spend_cap(
        self,
        cap: SpendCap | None = None,
        *,
        actor: Actor | str,
        floor_usd: float | None = None,
        floor_tokens: int | None = None,
        now: float | None = None,
    ) -> SpendConfig: ...
    def set_subscription_lane(
        self, lane: str, subscription: bool, *, actor: Actor | str, now: float | None = None
    ) -> SpendConfig: ...
    def override_spend_cap(
        self,
        window: SpendWindow | str,
        *,
        lane: str | None = None,
        actor: Actor | str,
        now: float | None = None,
    ) -> SpendConfig: ...
    def spend_room(
        self, run_id: str, *, spent: Usage | None = None, now: float | None = None
    ) -> SpendRoom: ...
    def task_budget(self, task_id: str) -> TaskBudget: ...
    def set_task_budget(
        self,
        task_id: str,
        *,
        usd: float | None,
        tokens: int | None,
        expected_usd: float | None,
        expected_tokens: int | None,
        actor: Actor | str,
        now: float | None = None,
    ) -> TaskBudget: ...

    def audit_events(self, task_id: str | None = None) -> list[AuditEvent]: ...
    def validate(self, *, now: float | None = None) -> list[str]: ...
    def repair(self, *, now: float | None = None) -> list[str]: ...
    def close(self) -> None: ...


def user_name(uid: int) -> str:
    """The operating-system user `uid` names (its passwd entry), or `uid-N` for a uid with
    no entry (some containers). The one spelling of a local identity: the CLI's actor, the
    SQLite file's owner and the PostgreSQL ledger's creator all read it, so the owner's
    rights match its actor wherever the ledger lives, and no environment variable
    ($USER, $LOGNAME) can choose it."""
    import pwd  # POSIX only; only the code that names a local user needs it

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"
