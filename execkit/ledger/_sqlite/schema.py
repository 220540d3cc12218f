"""The SQLite ledger's schema: the statements of each version, numbered and applied in
order (`migrate.py` applies them), and `SCHEMA_VERSION`, the one this code writes.

A fresh database is built by the same steps an old one goes through, and every step is
additive: new facts go into new tables keyed by the old rows, so every object an older
version defined (and every row it stored) stays exactly as it was; step 14 alone replaces
objects (step 13's triggers, and the buckets they kept, summed again from the runs:
derived data) and moves rows (a running run's reservation, to its `run_extras` row). The
steps' data (a summary built for every task, the ledger's identity) is written by
`migrate.py`.
"""

from __future__ import annotations

__all__ = ["SCHEMA_STEPS", "SCHEMA_VERSION"]

# Version 1: the legacy store (no attempt limits). Version 2 (ADR 0033): attempt limits
# keyed by task id and the run-history index by task and creation order. Version 3: run
# leases and reset times, per-task uncharged ceilings and pending operator retries, the
# per-task summary that admission reads instead of the whole history, role grants and
# the ledger's identity. Version 4 (runs.owners): who runs each run (the dispatcher's
# identity: boot, pid namespace, pid start time, instance) and which abandoned runs their
# own runner stopped on purpose (uncharged), plus the summary's copy of that flag for its
# last attempt. Every step is additive; version 4 adds one column, with its default, to a
# table version 3 made (an older execkit refuses a version-4 file: its backup, written
# before the step, is the way back). Version 5 (issue #28): vendor lanes, their
# history, their stored state (the fold of that history) and the lane each run used.
# Version 6: the upstream failures a lane absorbed. Version 7 (issue #47): the board
# outbox, what a tracker board owes its tracker until it is sent. Version 8 (issue #45):
# spend. What each run cost (tokens by kind, USD and its source, the model) and what its
# admission reserved, with its lane and start (the windows' sums read them); a task's own
# caps; and which cap's 80% warning each window has had. Version 9 (issue #46): the
# workspace each run's agent worked in, a column of `run_extras`. Version 10 (issue #46):
# the vendor session a run resumed and a fallback's announcement, columns of `run_extras`.
# Version 11 (issue #49): the notification outbox, its endpoints and their deliveries.
# Version 12 (issue #46): the vendor session each run's agent ran in, a column of
# `run_extras` (runs from before it: none), so a restarted dispatcher resumes it.
# The spend buckets' triggers (step 13). A run's effective cost in a window: its
# reservation while it runs, or when its result reported no USD (no tokens either, for the
# tokens), else what it reported; `_effective` says it of the run_costs row `c` whose run
# has status `status`, as (USD, tokens) expressions.
_HOUR = 3600
_BUCKET_OF = f"CAST(c.started_at / {_HOUR} AS INTEGER) * {_HOUR}"
_BOTH = "(SELECT 0 AS star UNION ALL SELECT 1 AS star) k"  # its lane's row and the '*' row
_BUCKET_LANE = "CASE k.star WHEN 1 THEN '*' ELSE COALESCE(c.lane, '') END"
_STATUS_OF_C = "(SELECT status FROM runs WHERE id = c.run_id)"


def _effective(c: str, status: str | None) -> tuple[str, str]:
    """(USD, tokens) expressions of what run_costs row `c` holds; `status` None: an ended
    run's row (step 14: only those have one)."""
    tokens = (
        f"({c}.input_tokens + {c}.output_tokens + {c}.cache_read_tokens + {c}.cache_write_tokens)"
    )
    running = "" if status is None else f"{status} = 'running' OR "
    return (
        f"(CASE WHEN {running}{c}.usd IS NULL THEN {c}.reserved_usd ELSE {c}.usd END)",
        f"(CASE WHEN {running}({c}.usd IS NULL AND {tokens} = 0) "
        f"THEN {c}.reserved_tokens ELSE {tokens} END)",
    )


def _cost_triggers(new: tuple[str, str], old: tuple[str, str]) -> tuple[str, str]:
    """The triggers adding to the buckets what a run_costs row's insert and update change:
    `new` and `old`, what the row `c` (after) and `OLD` (before) hold."""
    return (
        _bucket_trigger(
            "spend_buckets_on_cost_insert",
            "AFTER INSERT ON run_costs",
            "run_costs c",
            "c.run_id = NEW.run_id",
            new,
            ("0", "0"),
        ),
        _bucket_trigger(
            "spend_buckets_on_cost_update",
            "AFTER UPDATE ON run_costs",
            "run_costs c",
            "c.run_id = NEW.run_id",
            new,
            old,
        ),
    )


# What an ended run's `run_costs` row `c` holds (step 14: only ended runs have one).
_ENDED = _effective("c", None)


def _bucket_trigger(
    name: str,
    when: str,
    source: str,
    where: str,
    after: tuple[str, str],
    before: tuple[str, str],
) -> str:
    """A trigger adding to the run's hour (its lane's row and the '*' row) what its
    effective cost became (`after`) less what it was (`before`)."""
    usd = f"{after[0]} - {before[0]}"
    tokens = f"{after[1]} - {before[1]}"
    return (
        f"CREATE TRIGGER {name} {when} BEGIN "
        "INSERT INTO spend_buckets (lane, bucket, usd, tokens) "
        f"SELECT {_BUCKET_LANE}, {_BUCKET_OF}, {usd}, {tokens} FROM {source}, {_BOTH} "
        f"WHERE {where} AND ({usd} <> 0 OR {tokens} <> 0) "
        "ON CONFLICT (lane, bucket) DO UPDATE SET usd = usd + excluded.usd, "
        "tokens = tokens + excluded.tokens; END"
    )


SCHEMA_STEPS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE schema_version (
            version INTEGER PRIMARY KEY,
            applied_at REAL NOT NULL
        )""",
        """CREATE TABLE tasks (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('open', 'done', 'cancelled')),
            created_by TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        """CREATE TABLE runs (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            task_id TEXT NOT NULL REFERENCES tasks (id),
            attempt INTEGER NOT NULL CHECK (attempt >= 1),
            status TEXT NOT NULL
                CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned')),
            failure_class TEXT
                CHECK (failure_class IS NULL
                       OR failure_class IN ('work', 'environment', 'upstream')),
            reason TEXT,
            request_key TEXT NOT NULL,
            actor TEXT NOT NULL,
            forced INTEGER NOT NULL DEFAULT 0 CHECK (forced IN (0, 1)),
            owner_host TEXT NOT NULL,
            owner_pid INTEGER NOT NULL,
            owner_started_at REAL,
            started_at REAL NOT NULL,
            ended_at REAL,
            UNIQUE (task_id, attempt)
        )""",
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            task_id TEXT,
            run_id TEXT,
            detail TEXT NOT NULL
        )""",
        """CREATE TABLE idempotency (
            scope TEXT NOT NULL,
            key TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            response TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (scope, key)
        )""",
    ),
    2: (
        """CREATE TABLE task_attempt_limits (
            task_id TEXT PRIMARY KEY REFERENCES tasks (id),
            max_attempts INTEGER NOT NULL CHECK (max_attempts BETWEEN 0 AND 10000),
            updated_by TEXT NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX runs_by_task_creation ON runs (task_id, seq)",
    ),
    3: (
        # New facts go into new tables keyed by the old rows, so every version-2 object
        # stays defined (and every row stored) exactly as before.
        """CREATE TABLE run_extras (
            run_id TEXT PRIMARY KEY REFERENCES runs (id),
            lease_expires_at REAL,
            lease_s REAL CHECK (lease_s IS NULL OR lease_s > 0),
            not_before REAL
        )""",
        """CREATE TABLE task_extras (
            task_id TEXT PRIMARY KEY REFERENCES tasks (id),
            max_uncharged_attempts INTEGER
                CHECK (max_uncharged_attempts IS NULL
                       OR max_uncharged_attempts BETWEEN 1 AND 1000),
            retry_requested_by TEXT,
            retry_requested_at REAL,
            gave_up_at_attempt INTEGER
        )""",
        """CREATE TABLE task_summaries (
            task_id TEXT PRIMARY KEY REFERENCES tasks (id),
            attempts_used INTEGER NOT NULL CHECK (attempts_used >= 0),
            charged_attempts INTEGER NOT NULL CHECK (charged_attempts >= 0),
            uncharged_streak INTEGER NOT NULL CHECK (uncharged_streak >= 0),
            streak_reason TEXT,
            running INTEGER,
            last_number INTEGER,
            last_status TEXT
                CHECK (last_status IS NULL
                       OR last_status IN ('running', 'succeeded', 'failed', 'abandoned')),
            last_class TEXT
                CHECK (last_class IS NULL OR last_class IN ('work', 'environment', 'upstream')),
            last_reason TEXT,
            last_started_at REAL,
            last_ended_at REAL,
            last_forced INTEGER NOT NULL DEFAULT 0 CHECK (last_forced IN (0, 1)),
            last_not_before REAL
        )""",
        """CREATE TABLE ledger_meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )""",
        """CREATE TABLE role_grants (
            principal TEXT NOT NULL,
            role TEXT NOT NULL,
            granted_by TEXT NOT NULL,
            granted_at REAL NOT NULL,
            PRIMARY KEY (principal, role)
        )""",
        "CREATE UNIQUE INDEX runs_by_task_request_key ON runs (task_id, request_key)",
        "CREATE INDEX run_extras_by_lease ON run_extras (lease_expires_at)",
    ),
    4: (
        """CREATE TABLE run_owners (
            run_id TEXT PRIMARY KEY REFERENCES runs (id),
            boot_id TEXT NOT NULL,
            pid_namespace INTEGER NOT NULL CHECK (pid_namespace >= 0),
            pid_started_at REAL NOT NULL,
            instance TEXT NOT NULL
        )""",
        """CREATE TABLE run_stops (
            run_id TEXT PRIMARY KEY REFERENCES runs (id)
        )""",
        "ALTER TABLE task_summaries ADD COLUMN last_stopped INTEGER NOT NULL DEFAULT 0"
        " CHECK (last_stopped IN (0, 1))",
    ),
    5: (
        """CREATE TABLE lane_events (
            seq INTEGER PRIMARY KEY,
            lane TEXT NOT NULL,
            kind TEXT NOT NULL
                CHECK (kind IN ('success', 'upstream', 'reset', 'stop', 'probe', 'abandon',
                                'park', 'resume')),
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            run_id TEXT,
            task_id TEXT,
            until_at REAL,
            reason TEXT
        )""",
        "CREATE INDEX lane_events_by_lane ON lane_events (lane, seq)",
        """CREATE TABLE lane_summaries (
            lane TEXT PRIMARY KEY,
            state TEXT NOT NULL
                CHECK (state IN ('open', 'parked', 'cooling', 'half_open', 'stopped')),
            until_at REAL,
            reason TEXT,
            trips INTEGER NOT NULL CHECK (trips >= 0),
            failures TEXT NOT NULL,
            probe_run TEXT,
            stopped_task TEXT,
            capped INTEGER NOT NULL CHECK (capped IN (0, 1)),
            events INTEGER NOT NULL CHECK (events >= 0),
            updated_at REAL
        )""",
        """CREATE TABLE run_lanes (
            run_id TEXT PRIMARY KEY REFERENCES runs (id),
            lane TEXT NOT NULL
        )""",
    ),
    6: (
        # An upstream failure its vendor lane absorbed (it closed the lane, met it closed,
        # or was the probe that found it closed still): it moves no streak. A row a run,
        # as `run_stops`; the summary keeps its last attempt's flag. The data step keeps
        # the lane events so far folding with the lanes' rules of version 1.
        """CREATE TABLE run_lane_holds (
            run_id TEXT PRIMARY KEY REFERENCES runs (id)
        )""",
        "ALTER TABLE task_summaries ADD COLUMN last_lane_held INTEGER NOT NULL DEFAULT 0"
        " CHECK (last_lane_held IN (0, 1))",
    ),
    7: (
        # Issue #47: what a tracker board still owes its tracker, one row per item (the
        # state it must show, a JSON object), recorded in the ledger before it is sent.
        # A table of its own, nothing else touched: the step stands alone.
        """CREATE TABLE board_outbox (
            board TEXT NOT NULL,
            item TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            sent_seq INTEGER NOT NULL DEFAULT 0 CHECK (sent_seq >= 0 AND sent_seq <= seq),
            payload TEXT NOT NULL,
            ref TEXT,
            sends INTEGER NOT NULL DEFAULT 0 CHECK (sends >= 0),
            tries INTEGER NOT NULL DEFAULT 0 CHECK (tries >= 0),
            next_at REAL,
            claimed_by TEXT,
            claimed_until REAL,
            last_error TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (board, item)
        )""",
    ),
    8: (
        # Issue #45: a run's cost, a row a run written when it is admitted (its
        # reservation) and completed when it ends (what it cost). A run with no row (every
        # run older than this step) cost an unknown amount and reserved nothing.
        """CREATE TABLE run_costs (
            run_id TEXT PRIMARY KEY REFERENCES runs (id),
            task_id TEXT NOT NULL REFERENCES tasks (id),
            lane TEXT,
            started_at REAL NOT NULL,
            reserved_usd REAL NOT NULL DEFAULT 0 CHECK (reserved_usd >= 0),
            reserved_tokens INTEGER NOT NULL DEFAULT 0 CHECK (reserved_tokens >= 0),
            input_tokens INTEGER NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
            output_tokens INTEGER NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
            cache_read_tokens INTEGER NOT NULL DEFAULT 0 CHECK (cache_read_tokens >= 0),
            cache_write_tokens INTEGER NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
            usd REAL CHECK (usd IS NULL OR usd >= 0),
            usd_source TEXT NOT NULL DEFAULT 'unknown'
                CHECK (usd_source IN ('reported', 'priced', 'unknown')),
            model TEXT
        )""",
        "CREATE INDEX run_costs_by_start ON run_costs (started_at)",
        "CREATE INDEX run_costs_by_task ON run_costs (task_id)",
        """CREATE TABLE task_budgets (
            task_id TEXT PRIMARY KEY REFERENCES tasks (id),
            budget_usd REAL CHECK (budget_usd IS NULL OR budget_usd > 0),
            budget_tokens INTEGER CHECK (budget_tokens IS NULL OR budget_tokens > 0),
            updated_by TEXT NOT NULL,
            updated_at REAL NOT NULL
        )""",
        """CREATE TABLE spend_warnings (
            cap TEXT NOT NULL,
            window_start REAL NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (cap, window_start)
        )""",
    ),
    # Issue #46: where each run's agent worked (a dispatcher's workspace of the issue).
    9: ("ALTER TABLE run_extras ADD COLUMN workspace TEXT",),
    # Issue #46: the vendor session each run resumed (after an upstream refusal).
    # and the announcement of a run that fell back to a later adapter of its issue's order.
    10: (
        "ALTER TABLE run_extras ADD COLUMN resumed_session TEXT",
        "ALTER TABLE run_extras ADD COLUMN fell_back TEXT",
    ),
    # Issue #49: events a person must act on, written in the transaction of the change
    # they report; the endpoints they are sent to; and what came of each send. Tables of
    # their own, nothing else touched: the step stands alone.
    11: (
        """CREATE TABLE notify_events (
            seq INTEGER PRIMARY KEY,  -- never deleted: a number is never reused
            id TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            subject TEXT NOT NULL,
            payload TEXT NOT NULL,
            at REAL NOT NULL
        )""",
        """CREATE TABLE notify_endpoints (
            id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            format TEXT NOT NULL CHECK (format IN ('json', 'slack')),
            events TEXT NOT NULL,
            secret TEXT,
            from_seq INTEGER NOT NULL CHECK (from_seq >= 0),
            created_by TEXT NOT NULL,
            created_at REAL NOT NULL,
            stopped_reason TEXT,
            delivered INTEGER NOT NULL DEFAULT 0 CHECK (delivered >= 0),
            failed INTEGER NOT NULL DEFAULT 0 CHECK (failed >= 0),
            last_error TEXT,
            last_at REAL,
            claimed_by TEXT,
            claimed_until REAL
        )""",
        """CREATE TABLE notify_deliveries (
            endpoint_id TEXT NOT NULL,
            event_seq INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('retrying', 'delivered', 'failed')),
            tries INTEGER NOT NULL CHECK (tries >= 0),
            first_at REAL NOT NULL,
            next_at REAL,
            last_error TEXT,
            PRIMARY KEY (endpoint_id, event_seq)
        )""",
    ),
    # Issue #46: the vendor session each run's agent ran in, written with its result: the
    # task's next attempt resumes it after an upstream refusal, whichever process runs it.
    12: ("ALTER TABLE run_extras ADD COLUMN session_id TEXT",),
    # Issue #45: what each hour's runs hold of the spend windows (each run's effective cost:
    # its reservation while it runs or when its cost is unknown, else what it cost), per
    # lane ('' for runs with none) and for every lane together ('*'), kept by triggers on
    # whatever changes a run's effective cost. A window's sum reads its whole hours here and
    # only the runs of a partial first hour one by one: admission with caps costs the same
    # whatever the day's volume.
    13: (
        """CREATE TABLE spend_buckets (
            lane TEXT NOT NULL,
            bucket INTEGER NOT NULL,
            usd REAL NOT NULL,
            tokens INTEGER NOT NULL,
            PRIMARY KEY (lane, bucket)
        ) WITHOUT ROWID""",
        "CREATE INDEX run_costs_by_lane ON run_costs (lane, started_at)",
        *_cost_triggers(_effective("c", _STATUS_OF_C), _effective("OLD", _STATUS_OF_C)),
        _bucket_trigger(
            "spend_buckets_on_status",
            "AFTER UPDATE OF status ON runs WHEN OLD.status <> NEW.status",
            "run_costs c",
            "c.run_id = NEW.id",
            _effective("c", "NEW.status"),
            _effective("c", "OLD.status"),
        ),
        # What the runs already held, hour by hour.
        "INSERT INTO spend_buckets (lane, bucket, usd, tokens) "
        f"SELECT {_BUCKET_LANE}, {_BUCKET_OF}, SUM(u), SUM(t) FROM ("
        "SELECT c.lane AS lane, c.started_at AS started_at, "
        f"{_effective('c', 'r.status')[0]} AS u, {_effective('c', 'r.status')[1]} AS t "
        "FROM run_costs c JOIN runs r ON r.id = c.run_id"
        f") c, {_BOTH} GROUP BY 1, 2",
    ),
    # Issue #45: a running run's reservation moves to its `run_extras` row (written at its
    # admission anyway: a capped admission writes no row of its own), and `run_costs`
    # holds ended runs only: a run's row is made when it ends (by a trigger, from that
    # reservation) or when its result reports a cost. The buckets hold what ended runs
    # hold; a window reads its running runs' reservations from their `run_extras` rows,
    # found by the index of running runs (a handful, whatever the volume). Step 13's
    # triggers are replaced, the running runs' rows moved, the buckets summed again.
    14: (
        "DROP TRIGGER spend_buckets_on_cost_insert",
        "DROP TRIGGER spend_buckets_on_cost_update",
        "DROP TRIGGER spend_buckets_on_status",
        "ALTER TABLE run_extras ADD COLUMN reserved_usd REAL"
        " CHECK (reserved_usd IS NULL OR reserved_usd >= 0)",
        "ALTER TABLE run_extras ADD COLUMN reserved_tokens INTEGER"
        " CHECK (reserved_tokens IS NULL OR reserved_tokens >= 0)",
        "CREATE INDEX runs_running ON runs (started_at) WHERE status = 'running'",
        "INSERT INTO run_extras (run_id, reserved_usd, reserved_tokens) "
        "SELECT c.run_id, c.reserved_usd, c.reserved_tokens FROM run_costs c "
        "JOIN runs r ON r.id = c.run_id WHERE r.status = 'running' "
        "ON CONFLICT (run_id) DO UPDATE SET reserved_usd = excluded.reserved_usd, "
        "reserved_tokens = excluded.reserved_tokens",
        "DELETE FROM run_costs WHERE run_id IN (SELECT id FROM runs WHERE status = 'running')",
        *_cost_triggers(_ENDED, _effective("OLD", None)),
        # A capped run's row, when it ends: its reservation, which it holds until (and
        # unless) its result reports a cost. Its cost is recorded after its status.
        "CREATE TRIGGER run_costs_on_end AFTER UPDATE OF status ON runs "
        "WHEN OLD.status = 'running' AND NEW.status <> 'running' BEGIN "
        "INSERT INTO run_costs (run_id, task_id, lane, started_at, reserved_usd, "
        "reserved_tokens) SELECT NEW.id, NEW.task_id, (SELECT lane FROM run_lanes WHERE "
        "run_id = NEW.id), NEW.started_at, x.reserved_usd, COALESCE(x.reserved_tokens, 0) "
        "FROM run_extras x WHERE x.run_id = NEW.id AND x.reserved_usd IS NOT NULL "
        "ON CONFLICT (run_id) DO NOTHING; END",
        "DELETE FROM spend_buckets",
        "INSERT INTO spend_buckets (lane, bucket, usd, tokens) "
        f"SELECT {_BUCKET_LANE}, {_BUCKET_OF}, SUM(u), SUM(t) FROM ("
        "SELECT c.lane AS lane, c.started_at AS started_at, "
        f"{_ENDED[0]} AS u, {_ENDED[1]} AS t FROM run_costs c) c, {_BOTH} GROUP BY 1, 2",
    ),
}
SCHEMA_VERSION = max(SCHEMA_STEPS)
