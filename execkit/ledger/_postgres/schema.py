"""The PostgreSQL ledger's schema: the statements of each version, numbered from 1 and
applied in order (`migrate.py` applies them), `SCHEMA_VERSION`, and the tables a current
schema has.

What the database itself enforces, whatever a client does:

- `UNIQUE (task_id, attempt)` and `UNIQUE (task_id, request_key)` on runs, and at most one
  running run per task (a partial unique index);
- every run row carries the explicit limit in force when it was admitted
  (`limit_at_admission`, read from the locked task row by the INSERT itself) and
  `CHECK (limit_at_admission = 0 OR attempt <= limit_at_admission)`: no run passes the limit;
- run and task statuses, failure classes and limits inside their domains, and a finished
  run always has an end time.

These versions are this backend's own, not the SQLite ledger's numbers; every step after
the first must be additive, but for step 12, which replaces step 11's trigger and sums its
buckets again (derived data, rebuilt from the runs), and step 13, which states two checks
again in a form that is cheaper to enforce (the same conditions).
"""

from __future__ import annotations

__all__ = ["SCHEMA_STEPS", "SCHEMA_VERSION", "TABLES"]

# Version 1: tasks (with their limit, operator state and history summary in the row that
# admission locks), runs (with their lease and the limit in force at admission), audit,
# idempotency keys, role grants and the ledger's identity and owner. Version 2
# (runs.owners): who runs each run (the dispatcher's boot, pid namespace, pid start time
# and instance) and whether its own runner stopped it on purpose (uncharged), with the
# summary's copy of that flag for the task's last attempt: new nullable or defaulted
# columns, so every row stored before reads the same.
# Version 3 (issue #28): vendor lanes, their history, their stored state (the fold of that
# history, a row locked FOR UPDATE by whoever changes it) and the lane each run used.
# Version 6 (issue #45): spend. What each run cost and what its admission reserved (new
# defaulted columns of runs: a run stored before cost an unknown amount, reserved
# nothing), a task's own caps, and which cap's 80% warning each window has had.
# Version 10 (issue #46): the vendor session each run's agent ran in (`runs.session_id`,
# NULL on the runs before it), so the resume survives a restart.
# The hours `spend_buckets` keeps the spend windows in (step 11), and a run's tokens.
_HOUR = 3600


def _effective_tokens(r: str) -> str:
    """The tokens run row `r` holds of its windows: its reservation while it runs or when
    its result reported neither USD nor tokens, else its tokens."""
    tokens = (
        f"({r}.input_tokens + {r}.output_tokens + {r}.cache_read_tokens + {r}.cache_write_tokens)"
    )
    return (
        f"CASE WHEN {r}.status = 'running' OR ({r}.usd IS NULL AND {tokens} = 0) "
        f"THEN {r}.reserved_tokens ELSE {tokens} END"
    )


# The end of the buckets' trigger function: the change (`d_usd`, `d_tokens`) added to the
# run's hour, its lane's row and the '*' row.
_ADD_TO_BUCKETS = f"""            IF d_usd = 0 AND d_tokens = 0 THEN
                RETURN NULL;
            END IF;
            SELECT l.lane INTO lane_name FROM run_lanes l WHERE l.run_id = NEW.id;
            hour := floor(NEW.started_at / {_HOUR})::bigint * {_HOUR};
            INSERT INTO spend_buckets AS b (lane, bucket, usd, tokens)
            VALUES (coalesce(lane_name, ''), hour, d_usd, d_tokens), ('*', hour, d_usd, d_tokens)
            ON CONFLICT (lane, bucket) DO UPDATE
            SET usd = b.usd + excluded.usd, tokens = b.tokens + excluded.tokens;
            RETURN NULL;
        END $$ LANGUAGE plpgsql"""

SCHEMA_STEPS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE schema_version (
            version integer PRIMARY KEY CHECK (version >= 1),
            applied_at double precision NOT NULL
        )""",
        """CREATE TABLE ledger_meta (
            key text PRIMARY KEY,
            value text NOT NULL
        )""",
        "CREATE SEQUENCE task_numbers AS bigint",
        "CREATE SEQUENCE run_numbers AS bigint",
        """CREATE TABLE tasks (
            seq bigint PRIMARY KEY,
            id text NOT NULL UNIQUE CHECK (id = 't-' || seq),
            title text NOT NULL,
            status text NOT NULL CHECK (status IN ('open', 'done', 'cancelled')),
            created_by text NOT NULL,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            max_attempts integer NOT NULL DEFAULT 0
                CHECK (max_attempts BETWEEN 0 AND 10000),
            limit_updated_by text,
            limit_updated_at double precision,
            max_uncharged_attempts integer
                CHECK (max_uncharged_attempts IS NULL
                       OR max_uncharged_attempts BETWEEN 1 AND 1000),
            retry_requested_by text,
            retry_requested_at double precision,
            gave_up_at_attempt integer CHECK (gave_up_at_attempt >= 0),
            attempts_used integer NOT NULL DEFAULT 0 CHECK (attempts_used >= 0),
            charged_attempts integer NOT NULL DEFAULT 0 CHECK (charged_attempts >= 0),
            uncharged_streak integer NOT NULL DEFAULT 0 CHECK (uncharged_streak >= 0),
            streak_reason text,
            running integer CHECK (running >= 1),
            last_number integer CHECK (last_number >= 1),
            last_status text
                CHECK (last_status IN ('running', 'succeeded', 'failed', 'abandoned')),
            last_class text CHECK (last_class IN ('work', 'environment', 'upstream')),
            last_reason text,
            last_started_at double precision,
            last_ended_at double precision,
            last_forced boolean NOT NULL DEFAULT false,
            last_not_before double precision
        )""",
        """CREATE TABLE runs (
            seq bigint PRIMARY KEY,
            id text NOT NULL UNIQUE CHECK (id = 'r-' || seq),
            task_id text NOT NULL REFERENCES tasks (id),
            attempt integer NOT NULL CHECK (attempt >= 1),
            limit_at_admission integer NOT NULL
                CHECK (limit_at_admission BETWEEN 0 AND 10000),
            status text NOT NULL
                CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned')),
            failure_class text CHECK (failure_class IN ('work', 'environment', 'upstream')),
            reason text,
            request_key text NOT NULL,
            actor text NOT NULL,
            forced boolean NOT NULL DEFAULT false,
            owner_host text NOT NULL,
            owner_pid integer NOT NULL,
            started_at double precision NOT NULL,
            ended_at double precision,
            lease_expires_at double precision,
            lease_s double precision CHECK (lease_s > 0),
            not_before double precision,
            CONSTRAINT runs_attempt_unique UNIQUE (task_id, attempt),
            CONSTRAINT runs_request_key_unique UNIQUE (task_id, request_key),
            CONSTRAINT runs_attempt_within_limit
                CHECK (limit_at_admission = 0 OR attempt <= limit_at_admission),
            CONSTRAINT runs_ended_when_final CHECK ((status = 'running') = (ended_at IS NULL)),
            CONSTRAINT runs_success_unclassed
                CHECK (status <> 'succeeded' OR failure_class IS NULL)
        )""",
        "CREATE UNIQUE INDEX runs_one_running_per_task ON runs (task_id) WHERE status = 'running'",
        "CREATE INDEX runs_running_by_lease ON runs (lease_expires_at) WHERE status = 'running'",
        "CREATE INDEX runs_by_task ON runs (task_id, seq)",
        """CREATE TABLE audit (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            at double precision NOT NULL,
            actor text NOT NULL,
            action text NOT NULL,
            task_id text,
            run_id text,
            detail jsonb NOT NULL
        )""",
        "CREATE INDEX audit_by_task ON audit (task_id, seq)",
        """CREATE TABLE idempotency (
            scope text NOT NULL,
            key text NOT NULL,
            fingerprint text NOT NULL,
            response jsonb NOT NULL,
            created_at double precision NOT NULL,
            PRIMARY KEY (scope, key)
        )""",
        """CREATE TABLE role_grants (
            principal text NOT NULL,
            role text NOT NULL,
            granted_by text NOT NULL,
            granted_at double precision NOT NULL,
            PRIMARY KEY (principal, role)
        )""",
    ),
    2: (
        "ALTER TABLE runs ADD COLUMN owner_boot_id text, "
        "ADD COLUMN owner_pid_namespace bigint CHECK (owner_pid_namespace >= 0), "
        "ADD COLUMN owner_pid_started_at double precision, "
        "ADD COLUMN owner_instance text, "
        "ADD COLUMN stopped boolean NOT NULL DEFAULT false, "
        "ADD CONSTRAINT runs_stopped_abandoned CHECK (NOT stopped OR status = 'abandoned')",
        "ALTER TABLE tasks ADD COLUMN last_stopped boolean NOT NULL DEFAULT false",
    ),
    3: (
        """CREATE TABLE lane_events (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            lane text NOT NULL,
            kind text NOT NULL
                CHECK (kind IN ('success', 'upstream', 'reset', 'stop', 'probe', 'abandon',
                                'park', 'resume')),
            at double precision NOT NULL,
            actor text NOT NULL,
            run_id text,
            task_id text,
            until_at double precision,
            reason text
        )""",
        "CREATE INDEX lane_events_by_lane ON lane_events (lane, seq)",
        """CREATE TABLE lane_summaries (
            lane text PRIMARY KEY,
            state text NOT NULL
                CHECK (state IN ('open', 'parked', 'cooling', 'half_open', 'stopped')),
            until_at double precision,
            reason text,
            trips integer NOT NULL CHECK (trips >= 0),
            failures text NOT NULL,
            probe_run text,
            stopped_task text,
            capped boolean NOT NULL,
            events integer NOT NULL CHECK (events >= 0),
            updated_at double precision
        )""",
        """CREATE TABLE run_lanes (
            run_id text PRIMARY KEY REFERENCES runs (id),
            lane text NOT NULL
        )""",
    ),
    4: (
        # An upstream failure its vendor lane absorbed: it moves no streak (the summary
        # keeps its last attempt's flag). The data step keeps the lane events so far
        # folding with the lanes' rules of version 1.
        "ALTER TABLE runs ADD COLUMN lane_held boolean NOT NULL DEFAULT false, "
        "ADD CONSTRAINT runs_lane_held_upstream "
        "CHECK (NOT lane_held OR (status = 'failed' AND failure_class = 'upstream'))",
        "ALTER TABLE tasks ADD COLUMN last_lane_held boolean NOT NULL DEFAULT false",
    ),
    5: (
        # Issue #47: what a tracker board still owes its tracker, one row per item (the
        # state it must show, a JSON object), recorded in the ledger before it is sent.
        # A table of its own, nothing else touched: the step stands alone.
        """CREATE TABLE board_outbox (
            board text NOT NULL,
            item text NOT NULL,
            seq bigint NOT NULL CHECK (seq >= 1),
            sent_seq bigint NOT NULL DEFAULT 0 CHECK (sent_seq >= 0 AND sent_seq <= seq),
            payload text NOT NULL,
            ref text,
            sends bigint NOT NULL DEFAULT 0 CHECK (sends >= 0),
            tries integer NOT NULL DEFAULT 0 CHECK (tries >= 0),
            next_at double precision,
            claimed_by text,
            claimed_until double precision,
            last_error text,
            updated_at double precision NOT NULL,
            PRIMARY KEY (board, item)
        )""",
    ),
    6: (
        "ALTER TABLE runs "
        "ADD COLUMN reserved_usd double precision NOT NULL DEFAULT 0 CHECK (reserved_usd >= 0), "
        "ADD COLUMN reserved_tokens bigint NOT NULL DEFAULT 0 CHECK (reserved_tokens >= 0), "
        "ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0 CHECK (input_tokens >= 0), "
        "ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0 CHECK (output_tokens >= 0), "
        "ADD COLUMN cache_read_tokens bigint NOT NULL DEFAULT 0 CHECK (cache_read_tokens >= 0), "
        "ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0 "
        "CHECK (cache_write_tokens >= 0), "
        "ADD COLUMN usd double precision CHECK (usd IS NULL OR usd >= 0), "
        "ADD COLUMN usd_source text NOT NULL DEFAULT 'unknown' "
        "CHECK (usd_source IN ('reported', 'priced', 'unknown')), "
        "ADD COLUMN model text",
        "CREATE INDEX runs_by_start ON runs (started_at)",
        """CREATE TABLE task_budgets (
            task_id text PRIMARY KEY REFERENCES tasks (id),
            budget_usd double precision CHECK (budget_usd IS NULL OR budget_usd > 0),
            budget_tokens bigint CHECK (budget_tokens IS NULL OR budget_tokens > 0),
            updated_by text NOT NULL,
            updated_at double precision NOT NULL
        )""",
        """CREATE TABLE spend_warnings (
            cap text NOT NULL,
            window_start double precision NOT NULL,
            at double precision NOT NULL,
            PRIMARY KEY (cap, window_start)
        )""",
    ),
    # Issue #46: where each run's agent worked (a dispatcher's workspace of the issue).
    7: ("ALTER TABLE runs ADD COLUMN workspace text",),
    # Issue #46: the vendor session each run resumed (after an upstream refusal).
    # and the announcement of a run that fell back to a later adapter of its issue's order.
    8: (
        "ALTER TABLE runs ADD COLUMN resumed_session text",
        "ALTER TABLE runs ADD COLUMN fell_back text",
    ),
    # Issue #49: events a person must act on, written in the transaction of the change
    # they report; the endpoints they are sent to; and what came of each send.
    9: (
        """CREATE TABLE notify_events (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id text NOT NULL UNIQUE,
            kind text NOT NULL,
            subject text NOT NULL,
            payload text NOT NULL,
            at double precision NOT NULL
        )""",
        """CREATE TABLE notify_endpoints (
            id text PRIMARY KEY,
            url text NOT NULL,
            format text NOT NULL CHECK (format IN ('json', 'slack')),
            events text NOT NULL,
            secret text,
            from_seq bigint NOT NULL CHECK (from_seq >= 0),
            created_by text NOT NULL,
            created_at double precision NOT NULL,
            stopped_reason text,
            delivered bigint NOT NULL DEFAULT 0 CHECK (delivered >= 0),
            failed bigint NOT NULL DEFAULT 0 CHECK (failed >= 0),
            last_error text,
            last_at double precision,
            claimed_by text,
            claimed_until double precision
        )""",
        """CREATE TABLE notify_deliveries (
            endpoint_id text NOT NULL,
            event_seq bigint NOT NULL,
            status text NOT NULL CHECK (status IN ('retrying', 'delivered', 'failed')),
            tries integer NOT NULL CHECK (tries >= 0),
            first_at double precision NOT NULL,
            next_at double precision,
            last_error text,
            PRIMARY KEY (endpoint_id, event_seq)
        )""",
    ),
    # Issue #46: the vendor session each run's agent ran in, written with its result: the
    # task's next attempt resumes it after an upstream refusal, whichever process runs it.
    10: ("ALTER TABLE runs ADD COLUMN session_id text",),
    # Issue #45: what each hour's runs hold of the spend windows, per lane ('' for runs
    # with none) and for every lane together ('*'), kept by a trigger on whatever changes a
    # run's effective cost (its reservation while it runs or when its cost is unknown, else
    # what it cost). A run's lane is written at its admission before anything it holds
    # (`_lane_admitted` before `_spend_admitted`), in that statement or an earlier one,
    # and an AFTER trigger sees its whole statement: the trigger reads the lane there. A
    # window's sum reads its whole hours here and only the runs of a partial first hour one
    # by one: admission with caps costs the same whatever the day's volume.
    11: (
        """CREATE TABLE spend_buckets (
            lane text NOT NULL,
            bucket bigint NOT NULL,
            usd double precision NOT NULL,
            tokens bigint NOT NULL,
            PRIMARY KEY (lane, bucket)
        )""",
        # PL/pgSQL throughout: its statements' plans are kept across calls (an SQL function
        # called from it would be planned again at every row).
        f"""CREATE FUNCTION execkit_runs_spend() RETURNS trigger AS $$
        DECLARE
            d_usd double precision;
            d_tokens bigint;
            hour bigint;
            lane_name text;
        BEGIN
            d_usd := CASE WHEN NEW.status = 'running' OR NEW.usd IS NULL
                          THEN NEW.reserved_usd ELSE NEW.usd END;
            d_tokens := {_effective_tokens("NEW")};
            IF TG_OP = 'UPDATE' THEN
                d_usd := d_usd - CASE WHEN OLD.status = 'running' OR OLD.usd IS NULL
                                      THEN OLD.reserved_usd ELSE OLD.usd END;
                d_tokens := d_tokens - {_effective_tokens("OLD")};
            END IF;
{_ADD_TO_BUCKETS}""",
        "CREATE TRIGGER runs_spend AFTER INSERT OR UPDATE OF status, reserved_usd, "
        "reserved_tokens, usd, input_tokens, output_tokens, cache_read_tokens, "
        "cache_write_tokens ON runs FOR EACH ROW EXECUTE FUNCTION execkit_runs_spend()",
        # What the runs already held, hour by hour.
        f"""INSERT INTO spend_buckets (lane, bucket, usd, tokens)
        SELECT CASE k.star WHEN 1 THEN '*' ELSE coalesce(l.lane, '') END,
               floor(r.started_at / {_HOUR})::bigint * {_HOUR},
               sum(CASE WHEN r.status = 'running' OR r.usd IS NULL THEN r.reserved_usd
                   ELSE r.usd END),
               sum({_effective_tokens("r")})
        FROM runs r LEFT JOIN run_lanes l ON l.run_id = r.id
        CROSS JOIN (VALUES (0), (1)) AS k (star)
        GROUP BY 1, 2""",
    ),
    # Issue #45: the buckets hold what ended runs hold, no longer what running ones
    # reserve: admitting a run, and growing its reservation while it runs, then call no
    # trigger (step 11's ran at every capped admission). A window reads its running runs'
    # reservations from the runs themselves (`runs_running_by_lease`: a handful, whatever
    # the volume). The function holds nothing for a running run; the triggers' WHEN skips
    # a row that is running before and after; the buckets are summed again.
    12: (
        f"""CREATE OR REPLACE FUNCTION execkit_runs_spend() RETURNS trigger AS $$
        DECLARE
            d_usd double precision := 0;
            d_tokens bigint := 0;
            hour bigint;
            lane_name text;
        BEGIN
            IF NEW.status <> 'running' THEN
                d_usd := CASE WHEN NEW.usd IS NULL THEN NEW.reserved_usd ELSE NEW.usd END;
                d_tokens := {_effective_tokens("NEW")};
            END IF;
            IF TG_OP = 'UPDATE' AND OLD.status <> 'running' THEN
                d_usd := d_usd - CASE WHEN OLD.usd IS NULL THEN OLD.reserved_usd
                                      ELSE OLD.usd END;
                d_tokens := d_tokens - {_effective_tokens("OLD")};
            END IF;
{_ADD_TO_BUCKETS}""",
        "DROP TRIGGER runs_spend ON runs",
        "CREATE TRIGGER runs_spend AFTER UPDATE OF status, reserved_usd, reserved_tokens, usd, "
        "input_tokens, output_tokens, cache_read_tokens, cache_write_tokens ON runs "
        "FOR EACH ROW WHEN (OLD.status <> 'running' OR NEW.status <> 'running') "
        "EXECUTE FUNCTION execkit_runs_spend()",
        "CREATE TRIGGER runs_spend_ended AFTER INSERT ON runs FOR EACH ROW "
        "WHEN (NEW.status <> 'running') EXECUTE FUNCTION execkit_runs_spend()",
        "DELETE FROM spend_buckets",
        f"""INSERT INTO spend_buckets (lane, bucket, usd, tokens)
        SELECT CASE k.star WHEN 1 THEN '*' ELSE coalesce(l.lane, '') END,
               floor(r.started_at / {_HOUR})::bigint * {_HOUR},
               sum(CASE WHEN r.usd IS NULL THEN r.reserved_usd ELSE r.usd END),
               sum({_effective_tokens("r")})
        FROM runs r LEFT JOIN run_lanes l ON l.run_id = r.id
        CROSS JOIN (VALUES (0), (1)) AS k (star)
        WHERE r.status <> 'running'
        GROUP BY 1, 2""",
    ),
    # The checks that a task's and a run's id is its number compared with `'t-' || seq`:
    # text || bigint is `textanycat`, an SQL function, and PostgreSQL prepares a table's
    # checks at each statement that writes it, so it parsed and inlined that function at
    # every INSERT and UPDATE of either table: four times an admission and its result, 6-7%
    # of their time. `seq::text` makes it text || text, a built-in. The same condition, in
    # one statement a table (one scan of its rows), applied again as it stands.
    13: tuple(
        f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_check, "
        f"DROP CONSTRAINT IF EXISTS {table}_id_is_its_number, "
        f"ADD CONSTRAINT {table}_id_is_its_number CHECK (id = '{prefix}-' || seq::text)"
        for table, prefix in (("tasks", "t"), ("runs", "r"))
    ),
}
SCHEMA_VERSION = max(SCHEMA_STEPS)

# Every table a current schema has (`storage_problems` names the missing ones).
TABLES = (
    "schema_version",
    "ledger_meta",
    "tasks",
    "runs",
    "audit",
    "idempotency",
    "role_grants",
    "lane_events",
    "lane_summaries",
    "run_lanes",
    "board_outbox",
    "task_budgets",
    "spend_warnings",
    "notify_events",
    "notify_endpoints",
    "notify_deliveries",
    "spend_buckets",
)
