/**
 * The wire shapes of docs/remote.md, as the server sends them: the ledger's `to_dict()`,
 * byte for byte, so every field keeps its snake_case wire name. Times are POSIX seconds
 * (the server's clock). Options a caller passes are camelCase; what comes back is the wire.
 */

/** What is stored about a task itself: open until a run succeeds or it is cancelled. */
export type TaskStatus = "open" | "done" | "cancelled";

/** A task's state as derived from its status and its run history. */
export type TaskState = "ready" | "running" | "backoff" | "done" | "blocked" | "cancelled";

/** Which bound stopped a blocked task, most specific first. */
export type BlockedOn = "environment" | "attempt_limit" | "upstream" | "work" | "dispatch_cap";

/** How one run stands. */
export type RunStatus = "running" | "succeeded" | "failed" | "abandoned";

/** How a finished run may end (`finishRun`). */
export type FinalRunStatus = Exclude<RunStatus, "running">;

/** Did a failed run tell something about the work (`work`, charged) or not? */
export type FailureClass = "work" | "environment" | "upstream";

/** A task and the budget projection of its history (`Task.to_dict()`). */
export interface Task {
  readonly id: string;
  readonly title: string;
  readonly status: TaskStatus;
  readonly state: TaskState;
  readonly blocked_on: BlockedOn | null;
  readonly reason: string | null;
  /** state is "ready", including that an attempt is still available. */
  readonly ready: boolean;
  /** The explicit attempt limit; 0 = none. */
  readonly max_attempts: number;
  readonly attempts_started: number;
  readonly charged_attempts: number;
  readonly uncharged_streak: number;
  readonly remaining: number | null;
  readonly next_attempt_at: number | null;
  readonly created_by: string;
  readonly created_at: number;
  /** The ceiling on consecutive upstream attempts in force (the task's, else the ledger's). */
  readonly max_uncharged_attempts: number;
  /** An operator asked for one forced retry. */
  readonly retry_pending: boolean;
  readonly gave_up_at_attempt: number | null;
}

/** One admitted run: a row of the immutable history (`Run.to_dict()`). */
export interface Run {
  readonly id: string;
  readonly task_id: string;
  /** Gapless 1..N per task. */
  readonly attempt: number;
  readonly status: RunStatus;
  readonly failure_class: FailureClass | null;
  readonly reason: string | null;
  readonly request_key: string;
  readonly actor: string;
  readonly forced: boolean;
  readonly started_at: number;
  readonly ended_at: number | null;
  readonly owner_host: string;
  readonly owner_pid: number;
  readonly lease_expires_at: number | null;
  readonly not_before: number | null;
}

/** A role held by a principal (`Grant.to_dict()`). */
export interface Grant {
  readonly principal: string;
  readonly role: string;
  readonly granted_by: string;
  readonly granted_at: number;
}

/** One audit record (`AuditEvent.to_dict()`). */
export interface AuditEvent {
  readonly id: number;
  readonly at: number;
  readonly actor: string;
  readonly action: string;
  readonly task_id: string | null;
  readonly run_id: string | null;
  readonly detail: Readonly<Record<string, unknown>>;
}

/** `GET /v1/capabilities`. */
export interface Capabilities {
  /** What the server's ledger enforces, e.g. "tasks.attempt_limits", "runs.leases". */
  readonly capabilities: readonly string[];
  readonly schema_version: number;
  readonly ledger_id: string;
  /** The server's backoff policy and work budget, where it says (beyond docs/remote.md). */
  readonly backoff?: Readonly<Record<string, number>>;
  readonly budget?: Readonly<Record<string, number>>;
}

/** `GET /v1/tasks/{id}/runs`. */
export interface RunList {
  readonly task_id: string;
  readonly runs: readonly Run[];
}

/** The capability a limit needs (docs/remote.md, "Capabilities"; ADR 0033). */
export const ATTEMPT_LIMITS = "tasks.attempt_limits";

/** ADR 0033: an explicit limit is 1..10000 runs; 0 means "no explicit limit". */
export const MAX_ATTEMPT_LIMIT = 10000;

/** ADR 0046: the per-task ceiling on consecutive upstream attempts. */
export const MAX_UNCHARGED_LIMIT = 1000;

/** The longest lease a run may hold (seven days), in seconds. */
export const MAX_LEASE_S = 7 * 24 * 3600;
