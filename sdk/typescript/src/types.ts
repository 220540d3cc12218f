/**
 * The wire shapes of docs/remote.md, as the server sends them: the ledger's `to_dict()`,
 * byte for byte, so every field keeps its snake_case wire name. Times are POSIX seconds
 * (the server's clock). Options a caller passes are camelCase; what comes back is the wire.
 *
 * The shapes themselves are generated from the server's OpenAPI document (wire.ts); this
 * module gives them the SDK's names.
 */

import type * as wire from "./wire.js";

/** What is stored about a task itself: open until a run succeeds or it is cancelled. */
export type TaskStatus = wire.TaskStatus;

/** A task's state as derived from its status and its run history. */
export type TaskState = wire.TaskState;

/** Which bound stopped a blocked task, most specific first. */
export type BlockedOn = wire.BlockedOn;

/** How one run stands (the ledger's `AttemptStatus`). */
export type RunStatus = wire.AttemptStatus;

/** How a finished run may end (`finishRun`). */
export type FinalRunStatus = Exclude<RunStatus, "running">;

/** Did a failed run tell something about the work (`work`, charged) or not? */
export type FailureClass = wire.FailureClass;

/** A task and the budget projection of its history (`Task.to_dict()`). */
export type Task = wire.Task;

/** One admitted run: a row of the immutable history (`Run.to_dict()`). */
export type Run = wire.Run;

/** A run as the budget reads it (`Attempt`): a task's last, as its summary holds it. */
export type Attempt = wire.Attempt;

/** `GET /v1/tasks-with-last`: a task beside its last attempt (null before its first run). */
export type TaskWithLast = wire.TaskWithLast;

/** A role held by a principal (`Grant.to_dict()`). */
export type Grant = wire.Grant;

/** One audit record (`AuditEvent.to_dict()`). */
export type AuditEvent = wire.AuditEvent;

/**
 * `GET /v1/capabilities`: what the server's ledger enforces (e.g. "tasks.attempt_limits",
 * "runs.leases"), its schema version and id, and its backoff policy and work budget.
 */
export type Capabilities = wire.Capabilities;

/** `GET /v1/tasks/{id}/runs`. */
export type RunList = Required<wire.RunList>;

/** A vendor lane as it stands now (`LaneView.to_dict()`, issue #28). */
export type Lane = wire.Lane;

/** What a run cost (issue #45), the ledger's spend caps and a task's own budget. */
export type Usage = wire.Usage;
export type SpendCap = wire.SpendCap;
export type SpendConfig = wire.SpendConfig;
export type TaskBudget = wire.TaskBudget;
export type WindowUse = wire.WindowUse;
export type SpendRow = wire.SpendRow;

/** The lanes' configuration: the breaker and the bounds of every wait (`LaneConfig`). */
export type LaneConfig = wire.LaneConfig;

/** One row of a vendor lane's history (`LaneEvent.to_dict()`). */
export type LaneEvent = wire.LaneEvent;

/** A notification endpoint and its health (issue #49; `NotifyEndpoint.to_dict()`): the URL as
 * its scheme and host only, whether it signs, never its secret. */
export type NotifyEndpoint = wire.NotifyEndpoint;

/** One notification event (`NotifyEvent.to_dict()`). */
export type NotifyEvent = wire.NotifyEvent;

/** The capability of notification endpoints (issue #49). */
export const NOTIFY = "notify.endpoints";

/** The capability of enabling a stopped notification endpoint again (issue #49). */
export const NOTIFY_ENABLE = "notify.enable";

/** The capability vendor lanes need: the client sends a lane only to a server with it. */
export const LANES = "vendor.lanes";

/** The capability of spend caps (issue #45): `spendConfig`, `setSpendCap`, `taskBudget`,
 * `setTaskBudget`; admission against them. */
export const SPEND = "spend.caps";

/** The capability of caps held while a run goes (issue #45): `spendRoom`. */
export const SPEND_ROOM = "spend.room";
/** The capability of kept vendor sessions (issue #46): `finishRun({ sessionId })`. */
export const SESSIONS = "runs.sessions";

/** The capability of wake-ups: `wakeSeq` and `waitForWake` (issue #51). */
export const WAKE = "ledger.wake";


/** The capability a limit needs (docs/remote.md, "Capabilities"; ADR 0033). */
export const ATTEMPT_LIMITS = "tasks.attempt_limits";

/** The capability of run owners: stopped runs, `runningRuns` and `abandonRun`. */
export const RUN_OWNERS = "runs.owners";

/** ADR 0033: an explicit limit is 1..10000 runs; 0 means "no explicit limit". */
export const MAX_ATTEMPT_LIMIT = 10000;

/** ADR 0046: the per-task ceiling on consecutive upstream attempts. */
export const MAX_UNCHARGED_LIMIT = 1000;

/** The longest lease a run may hold (seven days), in seconds. */
export const MAX_LEASE_S = 7 * 24 * 3600;
