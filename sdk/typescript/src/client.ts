/**
 * `ExeckitClient`: the ledger's operations over the HTTP remote of docs/remote.md, with the
 * global `fetch` and nothing else.
 *
 * Every call checks its arguments first (`InvalidInput` naming the option, nothing sent),
 * then, for an operation that relies on a capability, reads `/v1/capabilities` once per
 * client (`CapabilityMissing`, nothing sent for the operation), then sends one request. Every
 * POST carries an `Idempotency-Key` (the caller's, else a random UUID) that stays the same
 * when the client repeats the request itself after a transport failure (`retries` times at
 * most, never after an HTTP answer), so a repeat never does the work twice. The token goes
 * into the Authorization header only: never into a message, an error or a log.
 */

import {
  CapabilityMissing,
  ExeckitError,
  InvalidInput,
  TransportError,
  errorFromAnswer,
} from "./errors.js";
import {
  ATTEMPT_LIMITS,
  RUN_OWNERS,
  LANES,
  SPEND,
  SPEND_ROOM,
  SESSIONS,
  NOTIFY,
  NOTIFY_ENABLE,
  WAKE,
  MAX_ATTEMPT_LIMIT,
  MAX_LEASE_S,
  MAX_UNCHARGED_LIMIT,
  type AuditEvent,
  type Capabilities,
  type FailureClass,
  type FinalRunStatus,
  type Grant,
  type Lane,
  type LaneConfig,
  type LaneEvent,
  type NotifyEndpoint,
  type NotifyEvent,
  type Run,
  type Task,
  type TaskState,
  type TaskWithLast,
} from "./types.js";
import {
  AttemptStatusValues,
  FailureClassValues,
  OPERATIONS,
  TaskStateValues,
  type AbandonRunBody,
  type AddNotifyEndpointBody,
  type EnableNotifyEndpointBody,
  type NotifyTestBody,
  type RemoveNotifyEndpointBody,
  type AuditQuery,
  type Bodies,
  type CreateTaskBody,
  type FinishRunBody,
  type GetTaskQuery,
  type GrantRoleBody,
  type GrantsQuery,
  type HeartbeatBody,
  type ListTasksQuery,
  type ListTasksWithLastQuery,
  type OperationId,
  type ParkLaneBody,
  type ResumeLaneBody,
  type Queries,
  type RetryTaskBody,
  type RevokeRoleBody,
  type SetAttemptLimitBody,
  type SetLaneConfigBody,
  type OverrideSpendCapBody,
  type SetSpendCapBody,
  type SetSubscriptionLaneBody,
  type SetTaskBudgetBody,
  type SpendCap,
  type SpendConfig,
  type SpendRoom,
  type SpendRoomBody,
  type SpendRow,
  type StartRunBody,
  type TaskBudget,
  type Usage,
  type WindowUse,
} from "./wire.js";

/** The `fetch` the client calls (the global one unless `ClientOptions.fetch` says). */
export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface ClientOptions {
  /** Where the server listens, e.g. "http://127.0.0.1:8750" (a path prefix is kept). */
  baseUrl: string;
  /** The bearer token (`execkit serve --add-token`). Sent in the Authorization header only. */
  token: string;
  /** Records "ACTOR on behalf of NAME" in the ledger (X-On-Behalf-Of); roles stay the token's. */
  onBehalfOf?: string | undefined;
  /** A fetch to use instead of the global one (a proxy agent, a test's recorder). */
  fetch?: FetchLike | undefined;
  /** How long one try may take, in milliseconds (default 30 000). */
  timeoutMs?: number | undefined;
  /** How many times a request is repeated after a transport failure (default 2, at most 10). */
  retries?: number | undefined;
  /** The wait before the first repeat, doubled for each next one (default 100 ms). */
  retryDelayMs?: number | undefined;
}

/** Given to every POST: the key the server stores its answer under. */
export interface IdempotentOptions {
  /** 1..200 visible ASCII characters; default: a random UUID per call. */
  idempotencyKey?: string | undefined;
}

export interface AddNotifyEndpointOptions extends IdempotentOptions {
  /** "json" (default: a webhook, signed when a secret is given) or "slack". */
  format?: "json" | "slack" | undefined;
  /** The HMAC-SHA256 signing secret of a JSON endpoint; never shown back. */
  secret?: string | undefined;
}

export interface CreateTaskOptions extends IdempotentOptions {
  title: string;
  /** An explicit attempt limit, 1..10000 runs (0 or absent: none). Needs the capability. */
  maxAttempts?: number | undefined;
  /** A ceiling on consecutive upstream attempts, 1..1000 (absent or null: the ledger's). */
  maxUnchargedAttempts?: number | null | undefined;
}

export interface GetTaskOptions {
  /** A dispatch cap to add to the bounds (a whole number). */
  cap?: number | undefined;
  /** What a forced admission would meet. */
  force?: boolean | undefined;
}

export interface ListTasksOptions {
  /** Only tasks in this state. */
  state?: TaskState | undefined;
  /** At most this many, 1..MAX_ATTEMPT_LIMIT (a page). */
  limit?: number | undefined;
  /** Start after this task id (the previous page's last). */
  after?: string | undefined;
}

export interface ListTasksWithLastOptions {
  /** A dispatch cap to add to the bounds (a whole number, 0 or more). */
  cap?: number | undefined;
  /** Only tasks whose title starts with this (e.g. "board:", a dispatcher's tasks). */
  titlePrefix?: string | undefined;
  /** At most this many, 1..MAX_ATTEMPT_LIMIT (a page). */
  limit?: number | undefined;
  /** Start after this task id (the previous page's last). */
  after?: string | undefined;
}

export interface StartRunOptions extends IdempotentOptions {
  /** The run's request key: the same key replays the same run (default: the idempotency key). */
  requestKey?: string | undefined;
  forced?: boolean | undefined;
  ignoreBackoff?: boolean | undefined;
  /** The run's lease in seconds, (0, 604800] (default: the ledger's, 300). */
  leaseS?: number | undefined;
  /** A dispatch cap to admit under (a whole number). */
  cap?: number | null | undefined;
  /** The vendor lane ADAPTER/CREDENTIAL the run uses (needs `vendor.lanes`). */
  lane?: string | null | undefined;
  /** Where the run's agent works (a path of at most 4096 characters), kept on the run. */
  workspace?: string | null | undefined;
  /** The vendor session the run's agent continues (at most 200 characters), kept on the run. */
  resumedSession?: string | null | undefined;
  /** A dispatcher's announcement that the run fell back to a later adapter (at most 2000). */
  fellBack?: string | null | undefined;
}

export interface ResumeLaneOptions extends IdempotentOptions {
  reason?: string | null | undefined;
}

/** One spend cap to set (neither usd nor tokens: remove it) and/or the reservation's floor. */
export interface SetSpendCapOptions extends IdempotentOptions {
  cap?: SpendCap | null | undefined;
  floorUsd?: number | null | undefined;
  floorTokens?: number | null | undefined;
}

/** A task's own spend cap, compare-and-set: the expected values are the current ones. */
export interface SetTaskBudgetOptions extends IdempotentOptions {
  usd: number | null;
  tokens: number | null;
  expectedUsd: number | null;
  expectedTokens: number | null;
}

/** The fields of the lanes' configuration to change; the others stay as they are. */
export interface SetLaneConfigOptions extends IdempotentOptions {
  /** K: upstream failures on a lane within the window that cool it (1..1000). */
  breakerK?: number | undefined;
  /** W: the breaker's window in seconds (1..86400). */
  breakerWindowS?: number | undefined;
  /** The first cooling's length in seconds (1..3600). */
  coolBaseS?: number | undefined;
  /** The longest cooling in seconds (coolBaseS..86400). */
  coolMaxS?: number | undefined;
  /** A stated reset further away is capped here, in seconds (60..2592000). */
  maxParkS?: number | undefined;
  /** How far past a stated reset the probe goes, plus a jitter of up to as much again (0..300). */
  resetMarginS?: number | undefined;
  /** The first wait after a probe meets the vendor's limit again, doubling (1..3600). */
  recheckS?: number | undefined;
  /** Closings in a row with no answer before the lane stops for a person (1..1000). */
  maxTrips?: number | undefined;
}

export interface ParkLaneOptions extends IdempotentOptions {
  /** Until when, in POSIX seconds (the server's clock; within its cap). */
  until: number;
  reason?: string | null | undefined;
}

export interface FinishRunOptions extends IdempotentOptions {
  status: FinalRunStatus;
  /** For a failed run: null or absent is "work" (charged). */
  failureClass?: FailureClass | null | undefined;
  reason?: string | null | undefined;
  /** The vendor's reset time (POSIX seconds): the next attempt waits for it. */
  notBefore?: number | null | undefined;
  /** What the vendor's structure said about the run's lane: "reset" (with notBefore),
   * "credentials", "billing" or "binary_missing" (needs `vendor.lanes`). */
  laneCause?: "reset" | "credentials" | "billing" | "binary_missing" | null | undefined;
  /** An abandoned run its own runner stopped on purpose: uncharged (needs `runs.owners`). */
  stopped?: boolean | undefined;
  /** What the run cost, read from the CLI's structure (issue #45): the server checks it. */
  usage?: Usage | null | undefined;
  /** The vendor session the run's agent ran in (at most 200 characters, no control
   * character; needs `runs.sessions`): the task's next attempt resumes it after an
   * upstream refusal. */
  sessionId?: string | null | undefined;
}

export interface AbandonRunOptions extends IdempotentOptions {
  /** How it is known that the run's owner is gone (stored, redacted). */
  reason: string;
}

export interface HeartbeatOptions extends IdempotentOptions {
  /** The renewed lease in seconds (default: the lease the run was started with). */
  leaseS?: number | null | undefined;
}

export interface SetAttemptLimitOptions extends IdempotentOptions {
  /** The new limit, 1..10000 runs. */
  maxAttempts: number;
  /** The limit the caller last saw (0 = none): anything else is `Conflict`. */
  expectedMaxAttempts: number;
}

export interface RetryTaskOptions extends IdempotentOptions {
  reason?: string | null | undefined;
  /** Past an explicit limit or a budget (needs agent.operate). */
  force?: boolean | undefined;
}

const DEFAULT_TIMEOUT_MS = 30_000;
const DEFAULT_RETRIES = 2;
const DEFAULT_RETRY_DELAY_MS = 100;
const MAX_RETRIES = 10;
const MAX_TOKEN = 512;
const MAX_NAME = 200;
const MAX_TITLE = 1000;
const MAX_REASON = 4000;
const MAX_ID = 1000;
const KEY = /^[\x21-\x7e]{1,200}$/;
const TOKEN = /^[\x21-\x7e]+$/;
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const FINAL_STATUSES: readonly string[] = AttemptStatusValues.filter((s) => s !== "running");
const FAILURE_CLASSES: readonly string[] = FailureClassValues;
const LANE_CAUSES: readonly string[] = ["reset", "credentials", "billing", "binary_missing"];

type Json = Record<string, unknown>;

/** The parameter names of a path template: "/v1/tasks/{task_id}/runs" has "task_id". */
type PathParams<P extends string> = P extends `${string}{${infer Name}}${infer Rest}`
  ? Name | PathParams<Rest>
  : never;

type ParamsOf<K extends OperationId> = PathParams<(typeof OPERATIONS)[K]["path"]>;

/** One request of operation K (wire.ts): its path parameters (required when its path has
 * some), its query and body as the OpenAPI document types them, and its idempotency key. */
type Call<K extends OperationId> = {
  query?: Queries[K];
  body?: Bodies[K];
  idempotencyKey?: string | undefined;
} & ([ParamsOf<K>] extends [never]
  ? { params?: undefined }
  : { params: Readonly<Record<ParamsOf<K>, string>> });

// -- argument checks (InvalidInput naming the option, before anything is sent) ----------

function invalid(field: string, message: string): InvalidInput {
  return new InvalidInput(`${field} ${message}`, { field });
}

function describe(value: unknown): string {
  if (typeof value === "string") {
    return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}...` : value);
  }
  if (typeof value === "number" || typeof value === "boolean" || value === null) {
    return String(value);
  }
  return value === undefined ? "undefined" : typeof value;
}

function optionsOf<T extends object>(
  what: string,
  value: T | undefined,
  allowed: readonly string[],
  required = false,
): Partial<T> {
  if (value === undefined && !required) {
    return {};
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new InvalidInput(`${what} needs an options object, got ${describe(value)}`, {
      field: null,
    });
  }
  for (const name of Object.keys(value)) {
    if (!allowed.includes(name)) {
      throw invalid(name, `is not an option of ${what} (options: ${allowed.join(", ")})`);
    }
  }
  return value;
}

function integerIn(field: string, value: unknown, low: number, high: number): number {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw invalid(field, `must be a whole number in ${low}..${high}, got ${describe(value)}`);
  }
  if (value < low || value > high) {
    throw invalid(field, `must be in ${low}..${high}, got ${value}`);
  }
  return value;
}

function wholeNumber(field: string, value: unknown): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    throw invalid(field, `must be a whole number, got ${describe(value)}`);
  }
  return value;
}

function finite(field: string, value: unknown): number {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw invalid(field, `must be a finite number, got ${describe(value)}`);
  }
  return value;
}

function lease(field: string, value: unknown): number {
  const seconds = finite(field, value);
  if (!(seconds > 0 && seconds <= MAX_LEASE_S)) {
    throw invalid(field, `must be a number of seconds in (0, ${MAX_LEASE_S}], got ${seconds}`);
  }
  return seconds;
}

function bool(field: string, value: unknown): boolean {
  if (typeof value !== "boolean") {
    throw invalid(field, `must be true or false, got ${describe(value)}`);
  }
  return value;
}

function text(field: string, value: unknown, maxLength: number): string {
  if (typeof value !== "string" || value.trim() === "") {
    throw invalid(field, `must be a non-empty string, got ${describe(value)}`);
  }
  if (value.length > maxLength) {
    throw invalid(field, `must be at most ${maxLength} characters, got ${value.length}`);
  }
  if (value.includes("\u0000")) {
    throw invalid(field, "must not contain NUL characters");
  }
  return value;
}

function name(field: string, value: unknown): string {
  const checked = text(field, value, MAX_NAME);
  if (CONTROL.test(checked)) {
    throw invalid(field, "must not contain control characters");
  }
  return checked;
}

function identifier(field: string, value: unknown): string {
  const checked = text(field, value, MAX_ID);
  if (CONTROL.test(checked)) {
    throw invalid(field, "must not contain control characters");
  }
  return checked;
}

function idempotencyKey(value: unknown): string {
  if (value === undefined) {
    return globalThis.crypto.randomUUID();
  }
  if (typeof value !== "string" || !KEY.test(value)) {
    throw invalid(
      "idempotencyKey",
      `must be 1..200 visible ASCII characters, got ${describe(value)}`,
    );
  }
  return value;
}

function oneOf(field: string, value: unknown, allowed: readonly string[]): string {
  if (typeof value !== "string" || !allowed.includes(value)) {
    throw invalid(field, `must be one of ${allowed.join(", ")}, got ${describe(value)}`);
  }
  return value;
}

// -- answers -----------------------------------------------------------------------------

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function unexpected(what: string, status = 200): ExeckitError {
  return new ExeckitError(`the server's answer is not ${what} (HTTP ${status})`, {
    code: "error",
    httpStatus: status,
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function causeText(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; depth < 4 && current instanceof Error; depth += 1) {
    if (current.message && !parts.includes(current.message)) {
      parts.push(current.message);
    }
    current = current.cause;
  }
  return parts.join(": ") || String(error);
}

/** A client of one `execkit serve`. Safe to share: calls may run concurrently. */
export class ExeckitClient {
  /** The server's address as given, without a trailing slash. */
  readonly baseUrl: string;
  readonly onBehalfOf: string | null;
  readonly timeoutMs: number;
  readonly retries: number;
  readonly retryDelayMs: number;
  readonly #token: string;
  readonly #fetch: FetchLike;
  #capabilities: Promise<Capabilities> | null = null;

  constructor(options: ClientOptions) {
    if (!isObject(options)) {
      throw new InvalidInput("ExeckitClient needs an options object", { field: null });
    }
    const allowed = [
      "baseUrl",
      "token",
      "onBehalfOf",
      "fetch",
      "timeoutMs",
      "retries",
      "retryDelayMs",
    ];
    for (const key of Object.keys(options)) {
      if (!allowed.includes(key)) {
        throw invalid(key, `is not an option of ExeckitClient (options: ${allowed.join(", ")})`);
      }
    }
    this.baseUrl = checkedBaseUrl(options.baseUrl);
    const token: unknown = options.token;
    if (typeof token !== "string" || !TOKEN.test(token) || token.length > MAX_TOKEN) {
      // The value is never shown: it is a secret, even when malformed.
      throw invalid(
        "token",
        `must be a non-empty string of at most ${MAX_TOKEN} visible ASCII characters ` +
          "(the value is not shown)",
      );
    }
    this.#token = token;
    this.onBehalfOf =
      options.onBehalfOf === undefined ? null : name("onBehalfOf", options.onBehalfOf);
    if (options.fetch !== undefined && typeof options.fetch !== "function") {
      throw invalid("fetch", `must be a function, got ${describe(options.fetch)}`);
    }
    const found = options.fetch ?? (globalThis.fetch as FetchLike | undefined);
    if (found === undefined) {
      throw invalid("fetch", "is needed: this runtime has no global fetch");
    }
    this.#fetch = found;
    this.timeoutMs =
      options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : finite("timeoutMs", options.timeoutMs);
    if (this.timeoutMs <= 0) {
      throw invalid("timeoutMs", `must be more than 0, got ${this.timeoutMs}`);
    }
    this.retries =
      options.retries === undefined
        ? DEFAULT_RETRIES
        : integerIn("retries", options.retries, 0, MAX_RETRIES);
    this.retryDelayMs =
      options.retryDelayMs === undefined
        ? DEFAULT_RETRY_DELAY_MS
        : integerIn("retryDelayMs", options.retryDelayMs, 0, 60_000);
  }

  // -- the operations ------------------------------------------------------------------

  /** What the server's ledger enforces (`GET /v1/capabilities`); refreshes the cache. */
  async capabilities(): Promise<Capabilities> {
    const answer = this.#readCapabilities();
    this.#capabilities = answer;
    answer.catch(() => {
      if (this.#capabilities === answer) {
        this.#capabilities = null;
      }
    });
    return answer;
  }

  /** Create a task, with an optional explicit attempt limit (needs `tasks.attempt_limits`). */
  async createTask(options: CreateTaskOptions): Promise<Task> {
    const given = optionsOf(
      "createTask",
      options,
      ["title", "maxAttempts", "maxUnchargedAttempts", "idempotencyKey"],
      true,
    );
    const body: CreateTaskBody = { title: text("title", given.title, MAX_TITLE) };
    if (given.maxAttempts !== undefined) {
      const limit = integerIn("maxAttempts", given.maxAttempts, 0, MAX_ATTEMPT_LIMIT);
      if (limit !== 0) {
        body.max_attempts = limit;
      }
    }
    if (given.maxUnchargedAttempts !== undefined && given.maxUnchargedAttempts !== null) {
      body.max_uncharged_attempts = integerIn(
        "maxUnchargedAttempts",
        given.maxUnchargedAttempts,
        1,
        MAX_UNCHARGED_LIMIT,
      );
    }
    const key = idempotencyKey(given.idempotencyKey);
    if (body.max_attempts !== undefined) {
      await this.#require(ATTEMPT_LIMITS, "create a task with an attempt limit");
    }
    return this.#task(await this.#send("createTask", { body, idempotencyKey: key }));
  }

  /** One task and the budget projection of its history. */
  async getTask(taskId: string, options?: GetTaskOptions): Promise<Task> {
    const id = identifier("taskId", taskId);
    const given = options === undefined ? {} : optionsOf("getTask", options, ["cap", "force"]);
    const query: GetTaskQuery = {};
    if (given.cap !== undefined) {
      query.cap = wholeNumber("cap", given.cap);
    }
    if (given.force !== undefined) {
      query.force = bool("force", given.force);
    }
    return this.#task(await this.#send("getTask", { params: { task_id: id }, query }));
  }

  /** Tasks in creation order: every one, or a page (`limit`, continued with `after`: the
   * last id of the page before), or those in one `state`. */
  async listTasks(options?: ListTasksOptions): Promise<Task[]> {
    const given =
      options === undefined ? {} : optionsOf("listTasks", options, ["state", "limit", "after"]);
    const query: ListTasksQuery = {};
    if (given.state !== undefined) {
      query.state = oneOf("state", given.state, TaskStateValues);
    }
    if (given.limit !== undefined) {
      query.limit = integerIn("limit", given.limit, 1, MAX_ATTEMPT_LIMIT);
    }
    if (given.after !== undefined) {
      query.after = identifier("after", given.after);
    }
    const doc = await this.#send("listTasks", { query });
    return this.#list(doc, "tasks").map((task) => this.#task(task));
  }

  /** Tasks in creation order, each beside its last attempt (null before its first run),
   * read from the task's summary, no history: what `execkit status` shows. Every one, or a
   * page (`limit`, continued with `after`: the last task id of the page before), or those
   * whose title starts with `titlePrefix`. */
  async listTasksWithLast(options?: ListTasksWithLastOptions): Promise<TaskWithLast[]> {
    const given =
      options === undefined
        ? {}
        : optionsOf("listTasksWithLast", options, ["cap", "titlePrefix", "limit", "after"]);
    const query: ListTasksWithLastQuery = {};
    if (given.cap !== undefined) {
      query.cap = wholeNumber("cap", given.cap);
    }
    if (given.titlePrefix !== undefined) {
      query.title_prefix = text("titlePrefix", given.titlePrefix, MAX_TITLE);
    }
    if (given.limit !== undefined) {
      query.limit = integerIn("limit", given.limit, 1, MAX_ATTEMPT_LIMIT);
    }
    if (given.after !== undefined) {
      query.after = identifier("after", given.after);
    }
    const doc = await this.#send("listTasksWithLast", { query });
    return this.#list(doc, "tasks").map((item) => this.#taskWithLast(item));
  }

  /** A task's runs, attempt 1 first. */
  async runs(taskId: string): Promise<Run[]> {
    const id = identifier("taskId", taskId);
    const doc = await this.#send("taskRuns", { params: { task_id: id } });
    return this.#list(doc, "runs").map((run) => this.#run(run));
  }

  /** One run. */
  async getRun(runId: string): Promise<Run> {
    const id = identifier("runId", runId);
    return this.#run(await this.#send("getRun", { params: { run_id: id } }));
  }

  /** Admit one run of the task, or refuse (`AdmissionRefused` and its subclasses). */
  async startRun(taskId: string, options?: StartRunOptions): Promise<Run> {
    const id = identifier("taskId", taskId);
    const given =
      options === undefined
        ? {}
        : optionsOf("startRun", options, [
            "requestKey",
            "forced",
            "ignoreBackoff",
            "leaseS",
            "cap",
            "lane",
            "workspace",
            "resumedSession",
            "fellBack",
            "idempotencyKey",
          ]);
    const body: StartRunBody = {};
    if (given.requestKey !== undefined) {
      body.request_key = identifier("requestKey", given.requestKey);
    }
    if (given.forced !== undefined) {
      body.forced = bool("forced", given.forced);
    }
    if (given.ignoreBackoff !== undefined) {
      body.ignore_backoff = bool("ignoreBackoff", given.ignoreBackoff);
    }
    if (given.leaseS !== undefined) {
      body.lease_s = lease("leaseS", given.leaseS);
    }
    if (given.cap !== undefined && given.cap !== null) {
      body.cap = wholeNumber("cap", given.cap);
    }
    if (given.lane !== undefined && given.lane !== null) {
      body.lane = text("lane", given.lane, 400);
    }
    if (given.workspace !== undefined && given.workspace !== null) {
      body.workspace = text("workspace", given.workspace, 4096);
    }
    if (given.resumedSession !== undefined && given.resumedSession !== null) {
      body.resumed_session = text("resumedSession", given.resumedSession, 200);
    }
    if (given.fellBack !== undefined && given.fellBack !== null) {
      body.fell_back = text("fellBack", given.fellBack, 2000);
    }
    const key = idempotencyKey(given.idempotencyKey);
    if (body.lane !== undefined) {
      await this.#require(LANES, "start a run on a vendor lane", "a vendor lane");
    }
    return this.#run(
      await this.#send("startRun", { params: { task_id: id }, body, idempotencyKey: key }),
    );
  }

  /** Record how a running run ended. */
  async finishRun(runId: string, options: FinishRunOptions): Promise<Run> {
    const id = identifier("runId", runId);
    const given = optionsOf(
      "finishRun",
      options,
      [
        "status",
        "failureClass",
        "reason",
        "notBefore",
        "stopped",
        "laneCause",
        "usage",
        "sessionId",
        "idempotencyKey",
      ],
      true,
    );
    const body: FinishRunBody = { status: oneOf("status", given.status, FINAL_STATUSES) };
    if (given.failureClass !== undefined && given.failureClass !== null) {
      body.failure_class = oneOf("failureClass", given.failureClass, FAILURE_CLASSES);
    }
    if (given.reason !== undefined && given.reason !== null) {
      body.reason = text("reason", given.reason, MAX_REASON);
    }
    if (given.notBefore !== undefined && given.notBefore !== null) {
      body.not_before = finite("notBefore", given.notBefore);
    }
    if (given.laneCause !== undefined && given.laneCause !== null) {
      body.lane_cause = oneOf("laneCause", given.laneCause, LANE_CAUSES);
    }
    if (given.stopped !== undefined && bool("stopped", given.stopped)) {
      body.stopped = true;
    }
    if (given.usage !== undefined && given.usage !== null) {
      if (typeof given.usage !== "object") {
        throw invalid("usage", "must be an object (tokens by kind, usd, usd_source, model)");
      }
      body.usage = given.usage;
    }
    if (given.sessionId !== undefined && given.sessionId !== null) {
      const session = text("sessionId", given.sessionId, 200);
      // eslint-disable-next-line no-control-regex
      if (/[\u0000-\u001f\u007f-\u009f]/.test(session)) {
        throw invalid("sessionId", "must be a session id without control characters");
      }
      body.session_id = session;
    }
    const key = idempotencyKey(given.idempotencyKey);
    if (body.stopped === true) {
      await this.#require(RUN_OWNERS, "record a stopped run");
    }
    if (body.lane_cause !== undefined) {
      await this.#require(LANES, "feed a vendor lane", "a vendor lane");
    }
    if (body.usage !== undefined) {
      await this.#require(SPEND, "record a run's cost", "a run's cost");
    }
    if (body.session_id !== undefined) {
      await this.#require(SESSIONS, "keep a run's vendor session", "a run's vendor session");
    }
    return this.#run(
      await this.#send("finishRun", { params: { run_id: id }, body, idempotencyKey: key }),
    );
  }

  /** Renew a running run's lease. */
  async heartbeat(runId: string, options?: HeartbeatOptions): Promise<Run> {
    const id = identifier("runId", runId);
    const given =
      options === undefined ? {} : optionsOf("heartbeat", options, ["leaseS", "idempotencyKey"]);
    const body: HeartbeatBody = {};
    if (given.leaseS !== undefined && given.leaseS !== null) {
      body.lease_s = lease("leaseS", given.leaseS);
    }
    const key = idempotencyKey(given.idempotencyKey);
    return this.#run(
      await this.#send("heartbeat", { params: { run_id: id }, body, idempotencyKey: key }),
    );
  }

  /** Compare-and-set a task's explicit attempt limit (needs `tasks.attempt_limits`). */
  async setAttemptLimit(taskId: string, options: SetAttemptLimitOptions): Promise<Task> {
    const id = identifier("taskId", taskId);
    const given = optionsOf(
      "setAttemptLimit",
      options,
      ["maxAttempts", "expectedMaxAttempts", "idempotencyKey"],
      true,
    );
    const body: SetAttemptLimitBody = {
      max_attempts: integerIn("maxAttempts", given.maxAttempts, 1, MAX_ATTEMPT_LIMIT),
      expected_max_attempts: integerIn(
        "expectedMaxAttempts",
        given.expectedMaxAttempts,
        0,
        MAX_ATTEMPT_LIMIT,
      ),
    };
    const key = idempotencyKey(given.idempotencyKey);
    await this.#require(ATTEMPT_LIMITS, "change an attempt limit");
    return this.#task(
      await this.#send("setAttemptLimit", { params: { task_id: id }, body, idempotencyKey: key }),
    );
  }

  /** Ask for one forced retry of a stopped task. */
  async retryTask(taskId: string, options?: RetryTaskOptions): Promise<Task> {
    const id = identifier("taskId", taskId);
    const given =
      options === undefined
        ? {}
        : optionsOf("retryTask", options, ["reason", "force", "idempotencyKey"]);
    const body: RetryTaskBody = {};
    if (given.reason !== undefined && given.reason !== null) {
      body.reason = text("reason", given.reason, MAX_REASON);
    }
    if (given.force !== undefined) {
      body.force = bool("force", given.force);
    }
    const key = idempotencyKey(given.idempotencyKey);
    return this.#task(
      await this.#send("retryTask", { params: { task_id: id }, body, idempotencyKey: key }),
    );
  }

  /** Cancel an open task. */
  async cancelTask(taskId: string, options?: IdempotentOptions): Promise<Task> {
    const id = identifier("taskId", taskId);
    const given = options === undefined ? {} : optionsOf("cancelTask", options, ["idempotencyKey"]);
    const key = idempotencyKey(given.idempotencyKey);
    return this.#task(
      await this.#send("cancelTask", { params: { task_id: id }, body: {}, idempotencyKey: key }),
    );
  }

  /** Abandon every running run whose lease expired; the runs it abandoned. */
  async abandonExpiredRuns(options?: IdempotentOptions): Promise<Run[]> {
    const given =
      options === undefined ? {} : optionsOf("abandonExpiredRuns", options, ["idempotencyKey"]);
    const key = idempotencyKey(given.idempotencyKey);
    const doc = await this.#send("abandonExpired", { body: {}, idempotencyKey: key });
    return this.#list(doc, "runs").map((run) => this.#run(run));
  }

  /** Every running run: where it runs (its owner), since when, until when its lease holds. */
  async runningRuns(): Promise<Run[]> {
    await this.#require(RUN_OWNERS, "list the running runs");
    const doc = await this.#send("runningRuns", {});
    return this.#list(doc, "runs").map((run) => this.#run(run));
  }

  /** Abandon a running run whose owner is known to be gone (audited, charged). */
  async abandonRun(runId: string, options: AbandonRunOptions): Promise<Run> {
    const id = identifier("runId", runId);
    const given = optionsOf("abandonRun", options, ["reason", "idempotencyKey"], true);
    const body: AbandonRunBody = { reason: text("reason", given.reason, MAX_REASON) };
    const key = idempotencyKey(given.idempotencyKey);
    await this.#require(RUN_OWNERS, "abandon a run");
    return this.#run(
      await this.#send("abandonRun", { params: { run_id: id }, body, idempotencyKey: key }),
    );
  }

  /** Audit records, all or one task's. */
  async auditEvents(taskId?: string): Promise<AuditEvent[]> {
    const query: AuditQuery = {};
    if (taskId !== undefined) {
      query.task_id = identifier("taskId", taskId);
    }
    const doc = await this.#send("audit", { query });
    return this.#list(doc, "events") as unknown as AuditEvent[];
  }

  /** Every grant, or one principal's. */
  async grants(principal?: string): Promise<Grant[]> {
    const query: GrantsQuery = {};
    if (principal !== undefined) {
      query.principal = name("principal", principal);
    }
    const doc = await this.#send("grants", { query });
    return this.#list(doc, "grants") as unknown as Grant[];
  }

  /** Grant a role (needs ledger.admin). */
  async grantRole(principal: string, role: string, options?: IdempotentOptions): Promise<Grant> {
    const body: GrantRoleBody = {
      principal: name("principal", principal),
      role: name("role", role),
    };
    const given = options === undefined ? {} : optionsOf("grantRole", options, ["idempotencyKey"]);
    const key = idempotencyKey(given.idempotencyKey);
    const doc = await this.#send("grantRole", { body, idempotencyKey: key });
    return doc as unknown as Grant;
  }

  /** Revoke a role (needs ledger.admin); whether the principal held it. */
  async revokeRole(principal: string, role: string, options?: IdempotentOptions): Promise<boolean> {
    const body: RevokeRoleBody = {
      principal: name("principal", principal),
      role: name("role", role),
    };
    const given = options === undefined ? {} : optionsOf("revokeRole", options, ["idempotencyKey"]);
    const key = idempotencyKey(given.idempotencyKey);
    const doc = await this.#send("revokeRole", { body, idempotencyKey: key });
    const revoked = doc["revoked"];
    if (typeof revoked !== "boolean") {
      throw unexpected("a revocation");
    }
    return revoked;
  }

  /** Send the ledger's notification events of `events` (kinds, or "*") to `url` (needs
   * ledger.admin and `notify.endpoints`; audited). */
  async addNotifyEndpoint(
    url: string,
    events: readonly string[],
    options?: AddNotifyEndpointOptions,
  ): Promise<NotifyEndpoint> {
    if (!Array.isArray(events) || events.length === 0) {
      throw invalid("events", `must be a non-empty list of event kinds, got ${describe(events)}`);
    }
    const given =
      options === undefined
        ? {}
        : optionsOf("addNotifyEndpoint", options, ["format", "secret", "idempotencyKey"]);
    const body: AddNotifyEndpointBody = {
      url: text("url", url, 2000),
      events: events.map((kind) => text("events", kind, 100)).join(","),
    };
    if (given.format !== undefined) {
      body.format = given.format;
    }
    if (given.secret !== undefined) {
      body.secret = text("secret", given.secret, 512);
    }
    await this.#require(NOTIFY, "add a notification endpoint", "notification endpoints");
    const key = idempotencyKey(given.idempotencyKey);
    const doc = await this.#send("addNotifyEndpoint", { body, idempotencyKey: key });
    return doc as unknown as NotifyEndpoint;
  }

  /** Every notification endpoint with its health (needs `notify.endpoints`). */
  async notifyEndpoints(): Promise<NotifyEndpoint[]> {
    await this.#require(NOTIFY, "list notification endpoints", "notification endpoints");
    const doc = await this.#send("notifyEndpoints", {});
    return this.#list(doc, "endpoints") as unknown as NotifyEndpoint[];
  }

  /** A `notify.test` event for one endpoint only (needs ledger.admin). */
  async notifyTest(endpointId: string): Promise<NotifyEvent> {
    const body: NotifyTestBody = { endpoint_id: name("endpointId", endpointId) };
    await this.#require(NOTIFY, "test a notification endpoint", "notification endpoints");
    const doc = await this.#send("notifyTest", { body, idempotencyKey: idempotencyKey(undefined) });
    return doc as unknown as NotifyEvent;
  }

  /** Send again to an endpoint a refusal stopped (a 4xx, a redirect), without removing it:
   * its waiting events go in order at the next sender round (needs ledger.admin and
   * `notify.enable`; audited). One not stopped is returned as it is. */
  async enableNotifyEndpoint(endpointId: string): Promise<NotifyEndpoint> {
    const body: EnableNotifyEndpointBody = { endpoint_id: name("endpointId", endpointId) };
    await this.#require(
      NOTIFY_ENABLE,
      "enable a notification endpoint",
      "enabling a stopped notification endpoint",
    );
    const doc = await this.#send("enableNotifyEndpoint", {
      body,
      idempotencyKey: idempotencyKey(undefined),
    });
    return doc as unknown as NotifyEndpoint;
  }

  /** Remove a notification endpoint (needs ledger.admin; audited); whether there was one. */
  async removeNotifyEndpoint(endpointId: string): Promise<boolean> {
    const body: RemoveNotifyEndpointBody = { endpoint_id: name("endpointId", endpointId) };
    await this.#require(NOTIFY, "remove a notification endpoint", "notification endpoints");
    const doc = await this.#send("removeNotifyEndpoint", {
      body,
      idempotencyKey: idempotencyKey(undefined),
    });
    const removed = doc["removed"];
    if (typeof removed !== "boolean") {
      throw unexpected("a removal");
    }
    return removed;
  }

  /** Every vendor lane the server's ledger has seen, as it stands now (needs `vendor.lanes`). */
  async listLanes(): Promise<Lane[]> {
    await this.#require(LANES, "list vendor lanes", "vendor lanes");
    const doc = await this.#send("listLanes", {});
    return this.#list(doc, "lanes") as unknown as Lane[];
  }

  /** One vendor lane as it stands now; `NotFound` for a lane never seen. */
  async getLane(lane: string): Promise<Lane> {
    const query = { lane: text("lane", lane, 400) };
    await this.#require(LANES, "read a vendor lane", "vendor lanes");
    return this.#lane(await this.#send("getLane", { query }));
  }

  /** A vendor lane's events, in order. */
  async laneHistory(lane: string): Promise<LaneEvent[]> {
    const query = { lane: text("lane", lane, 400) };
    await this.#require(LANES, "read a vendor lane", "vendor lanes");
    const doc = await this.#send("laneHistory", { query });
    return this.#list(doc, "events") as unknown as LaneEvent[];
  }

  /** The vendor lane of the task's last run, as it stands now (null: it used none). */
  async taskLane(taskId: string): Promise<Lane | null> {
    const id = identifier("taskId", taskId);
    await this.#require(LANES, "read a vendor lane", "vendor lanes");
    const doc = await this.#send("taskLane", { params: { task_id: id } });
    return doc["lane"] === null || doc["lane"] === undefined ? null : this.#lane(doc["lane"]);
  }

  /** Park a vendor lane until a time (needs agent.operate; audited). */
  async parkLane(lane: string, options: ParkLaneOptions): Promise<Lane> {
    const given = optionsOf("parkLane", options, ["until", "reason", "idempotencyKey"], true);
    const body: ParkLaneBody = {
      lane: text("lane", lane, 400),
      until: finite("until", given.until),
    };
    if (given.reason !== undefined && given.reason !== null) {
      body.reason = text("reason", given.reason, MAX_REASON);
    }
    const key = idempotencyKey(given.idempotencyKey);
    await this.#require(LANES, "park a vendor lane", "vendor lanes");
    return this.#lane(await this.#send("parkLane", { body, idempotencyKey: key }));
  }

  /** Re-open a vendor lane; the task whose run stopped it gets one forced retry (needs
   * agent.operate; audited). On an open lane it changes nothing. */
  async resumeLane(lane: string, options?: ResumeLaneOptions): Promise<Lane> {
    const given =
      options === undefined ? {} : optionsOf("resumeLane", options, ["reason", "idempotencyKey"]);
    const body: ResumeLaneBody = { lane: text("lane", lane, 400) };
    if (given.reason !== undefined && given.reason !== null) {
      body.reason = text("reason", given.reason, MAX_REASON);
    }
    const key = idempotencyKey(given.idempotencyKey);
    await this.#require(LANES, "resume a vendor lane", "vendor lanes");
    return this.#lane(await this.#send("resumeLane", { body, idempotencyKey: key }));
  }

  /** The ledger's wake number: it grows when an operator lets work run again (a lane
   * resume, a task retry, a raised limit, a lane configuration change; needs `ledger.wake`). */
  async wakeSeq(): Promise<number> {
    await this.#require(WAKE, "read the wake number", "wake-ups");
    return this.#wake(await this.#send("wakeSeq", {}));
  }

  /** The wake number once it differs from `seen`, or after `timeoutS` seconds (0..300; the
   * server waits at most 25 s): a runner's loop waits on it to act at once on an operator's
   * resume instead of at its next pass. */
  async waitForWake(seen: number, timeoutS: number): Promise<number> {
    const query = { seen: wholeNumber("seen", seen), timeout_s: finite("timeoutS", timeoutS) };
    await this.#require(WAKE, "wait for a wake-up", "wake-ups");
    return this.#wake(await this.#send("waitForWake", { query }));
  }

  /** The lanes' configuration in force, the same for every host (needs `vendor.lanes`). */
  async laneConfig(): Promise<LaneConfig> {
    await this.#require(LANES, "read the lanes' configuration", "vendor lanes");
    return this.#laneConfig(await this.#send("laneConfig", {}));
  }

  /** Change the fields given of the lanes' configuration, for every host, from the next
   * lane event on (needs agent.operate; audited). The server checks the ranges. */
  async setLaneConfig(options: SetLaneConfigOptions): Promise<LaneConfig> {
    const given = optionsOf(
      "setLaneConfig",
      options,
      [
        "breakerK",
        "breakerWindowS",
        "coolBaseS",
        "coolMaxS",
        "maxParkS",
        "resetMarginS",
        "recheckS",
        "maxTrips",
        "idempotencyKey",
      ],
      true,
    );
    const body: SetLaneConfigBody = {};
    if (given.breakerK !== undefined) {
      body.breaker_k = wholeNumber("breakerK", given.breakerK);
    }
    if (given.breakerWindowS !== undefined) {
      body.breaker_window_s = finite("breakerWindowS", given.breakerWindowS);
    }
    if (given.coolBaseS !== undefined) {
      body.cool_base_s = finite("coolBaseS", given.coolBaseS);
    }
    if (given.coolMaxS !== undefined) {
      body.cool_max_s = finite("coolMaxS", given.coolMaxS);
    }
    if (given.maxParkS !== undefined) {
      body.max_park_s = finite("maxParkS", given.maxParkS);
    }
    if (given.resetMarginS !== undefined) {
      body.reset_margin_s = finite("resetMarginS", given.resetMarginS);
    }
    if (given.recheckS !== undefined) {
      body.recheck_s = finite("recheckS", given.recheckS);
    }
    if (given.maxTrips !== undefined) {
      body.max_trips = wholeNumber("maxTrips", given.maxTrips);
    }
    const key = idempotencyKey(given.idempotencyKey);
    await this.#require(LANES, "change the lanes' configuration", "vendor lanes");
    return this.#laneConfig(await this.#send("setLaneConfig", { body, idempotencyKey: key }));
  }

  // -- spend caps (issue #45) -----------------------------------------------------------

  /** The ledger's spend caps and the floor of a run's reservation (needs `spend.caps`). */
  async spendConfig(): Promise<SpendConfig> {
    await this.#require(SPEND, "read the spend caps", "spend caps");
    return this.#spendConfig(await this.#send("spendConfig", {}));
  }

  /** Set one spend cap (neither usd nor tokens: remove it) and/or the floor of a run's
   * reservation, for every host (needs agent.operate; audited). The server checks them. */
  async setSpendCap(options: SetSpendCapOptions): Promise<SpendConfig> {
    const given = optionsOf(
      "setSpendCap",
      options,
      ["cap", "floorUsd", "floorTokens", "idempotencyKey"],
      true,
    );
    const body: SetSpendCapBody = {};
    if (given.cap !== undefined && given.cap !== null) {
      if (typeof given.cap !== "object") {
        throw invalid("cap", "must be an object: window, lane, usd, tokens, tz");
      }
      body.cap = given.cap;
    }
    if (given.floorUsd !== undefined && given.floorUsd !== null) {
      body.floor_usd = finite("floorUsd", given.floorUsd);
    }
    if (given.floorTokens !== undefined && given.floorTokens !== null) {
      body.floor_tokens = wholeNumber("floorTokens", given.floorTokens);
    }
    const key = idempotencyKey(given.idempotencyKey);
    await this.#require(SPEND, "set a spend cap", "spend caps");
    return this.#spendConfig(await this.#send("setSpendCap", { body, idempotencyKey: key }));
  }

  /** Mark vendor lane `lane` as a subscription (`on`) or not: its runs' USD is recorded but
   * held to no window's USD cap, only to tokens. Needs agent.operate; audited. */
  async setSubscriptionLane(lane: string, on: boolean): Promise<SpendConfig> {
    if (typeof on !== "boolean") {
      throw invalid("on", "must be true or false");
    }
    const body: SetSubscriptionLaneBody = { lane: text("lane", lane, 400), subscription: on };
    await this.#require(SPEND_ROOM, "mark a subscription lane", "a subscription lane");
    return this.#spendConfig(await this.#send("setSubscriptionLane", { body }));
  }

  /** Lift the cap of `window` (ledger-wide, or `lane`'s) until the window that holds now
   * ends (a rolling 5h window: for five hours), on every host. Needs agent.operate; audited. */
  async overrideSpendCap(window: "day" | "5h" | "week", lane?: string | null): Promise<SpendConfig> {
    if (!["day", "5h", "week"].includes(window)) {
      throw invalid("window", "must be day, 5h or week");
    }
    const body: OverrideSpendCapBody = { window };
    if (lane !== undefined && lane !== null) {
      body.lane = text("lane", lane, 400);
    }
    await this.#require(SPEND_ROOM, "override a spend cap", "a spend cap's override");
    return this.#spendConfig(await this.#send("overrideSpendCap", { body }));
  }

  /** What each spend cap's window holds now, and when it reopens (`full`: no room left for
   * the least reservation). */
  async spendWindows(): Promise<WindowUse[]> {
    await this.#require(SPEND, "read the spend windows", "spend caps");
    const doc = await this.#send("spendWindows", {});
    return this.#list(doc, "windows") as WindowUse[];
  }

  /** Every run started since `since` (POSIX seconds; default: all), with its task, lane
   * and cost: what a spend report groups. */
  async spendRows(since?: number): Promise<SpendRow[]> {
    const query: { since?: number } = {};
    if (since !== undefined) {
      query.since = finite("since", since);
    }
    await this.#require(SPEND, "read the runs' spend", "spend caps");
    const doc = await this.#send("spendRows", { query });
    return this.#list(doc, "runs") as SpendRow[];
  }

  /** What running run `runId` may spend before it asks again, given what it `spent` so far
   * (issue #45): its reservation, grown while every cap has room, or `stop` naming the cap
   * that ends it (`byTask`: the task's own budget, charged; else a window's, uncharged). */
  async spendRoom(runId: string, spent?: Usage | null): Promise<SpendRoom> {
    const id = identifier("runId", runId);
    const body: SpendRoomBody = {};
    if (spent !== undefined && spent !== null) {
      if (typeof spent !== "object" || Array.isArray(spent)) {
        throw invalid("spent", "must be an object (tokens by kind, usd, usd_source, model)");
      }
      body.spent = spent;
    }
    await this.#require(SPEND_ROOM, "hold a run to its spend caps", "a running run's spend");
    return (await this.#send("spendRoom", { params: { run_id: id }, body })) as unknown as SpendRoom;
  }

  /** The task's own spend cap (usd and tokens null: none). */
  async taskBudget(taskId: string): Promise<TaskBudget> {
    const id = identifier("taskId", taskId);
    await this.#require(SPEND, "read a task's budget", "spend caps");
    return (await this.#send("taskBudget", { params: { task_id: id } })) as unknown as TaskBudget;
  }

  /** Compare-and-set the task's own spend cap: `expectedUsd`/`expectedTokens` are the
   * current ones (null: none). After its first run this needs agent.operate; audited. */
  async setTaskBudget(taskId: string, options: SetTaskBudgetOptions): Promise<TaskBudget> {
    const id = identifier("taskId", taskId);
    const given = optionsOf(
      "setTaskBudget",
      options,
      ["usd", "tokens", "expectedUsd", "expectedTokens", "idempotencyKey"],
      true,
    );
    const orNull = (field: string, value: unknown, whole: boolean): number | null =>
      value === undefined || value === null
        ? null
        : whole
          ? wholeNumber(field, value)
          : finite(field, value);
    const body: SetTaskBudgetBody = {
      usd: orNull("usd", given.usd, false),
      tokens: orNull("tokens", given.tokens, true),
      expected_usd: orNull("expectedUsd", given.expectedUsd, false),
      expected_tokens: orNull("expectedTokens", given.expectedTokens, true),
    };
    const key = idempotencyKey(given.idempotencyKey);
    await this.#require(SPEND, "set a task's budget", "spend caps");
    const doc = await this.#send("setTaskBudget", {
      params: { task_id: id },
      body,
      idempotencyKey: key,
    });
    return doc as unknown as TaskBudget;
  }

  // -- plumbing --------------------------------------------------------------------------

  async #readCapabilities(): Promise<Capabilities> {
    const doc = await this.#send("capabilities", {});
    const list = doc["capabilities"];
    if (!Array.isArray(list) || !list.every((item) => typeof item === "string")) {
      throw unexpected("a capabilities document");
    }
    return doc as unknown as Capabilities;
  }

  async #require(
    capability: string,
    purpose: string,
    what: string = "an attempt limit",
  ): Promise<void> {
    let cached = this.#capabilities;
    if (cached === null) {
      cached = this.capabilities();
    }
    const found = await cached;
    if (!found.capabilities.includes(capability)) {
      throw new CapabilityMissing(
        `the server at ${this.baseUrl} does not advertise ${capability}: it might not enforce ` +
          `${what}, so the client refuses to ${purpose} (nothing was sent; upgrade ` +
          "the server)",
        capability,
      );
    }
  }

  #task(doc: unknown): Task {
    if (!isObject(doc) || typeof doc["id"] !== "string" || typeof doc["state"] !== "string") {
      throw unexpected("a task");
    }
    return doc as unknown as Task;
  }

  #taskWithLast(doc: unknown): TaskWithLast {
    if (!isObject(doc)) {
      throw unexpected("a task with its last attempt");
    }
    this.#task(doc["task"]);
    const last = doc["last_attempt"];
    if (last !== null && (!isObject(last) || typeof last["number"] !== "number")) {
      throw unexpected("a task's last attempt");
    }
    return doc as unknown as TaskWithLast;
  }

  #lane(doc: unknown): Lane {
    if (!isObject(doc) || typeof doc["lane"] !== "string" || typeof doc["state"] !== "string") {
      throw unexpected("a vendor lane");
    }
    return doc as unknown as Lane;
  }

  #wake(doc: unknown): number {
    if (!isObject(doc) || typeof doc["wake"] !== "number" || !Number.isInteger(doc["wake"])) {
      throw unexpected("a wake number");
    }
    return doc["wake"];
  }

  #spendConfig(doc: unknown): SpendConfig {
    if (!isObject(doc) || !Array.isArray(doc["caps"])) {
      throw unexpected("a spend configuration");
    }
    return doc as unknown as SpendConfig;
  }

  #laneConfig(doc: unknown): LaneConfig {
    if (!isObject(doc) || typeof doc["breaker_k"] !== "number") {
      throw unexpected("a lane configuration");
    }
    return doc as unknown as LaneConfig;
  }

  #run(doc: unknown): Run {
    if (!isObject(doc) || typeof doc["id"] !== "string" || typeof doc["attempt"] !== "number") {
      throw unexpected("a run");
    }
    return doc as unknown as Run;
  }

  #list(doc: Json, member: string): unknown[] {
    const list = doc[member];
    if (!Array.isArray(list)) {
      throw unexpected(`a document with a list "${member}"`);
    }
    return list as unknown[];
  }

  /** Scrub the token from a text that is about to leave the client (belt and braces). */
  #scrub(message: string): string {
    return message.split(this.#token).join("[redacted]");
  }

  async #send<K extends OperationId>(operation: K, request: Call<K>): Promise<Json> {
    const { method, path: template } = OPERATIONS[operation];
    const params: Readonly<Record<string, string>> = request.params ?? {};
    const path = template.replace(/\{([^}]+)\}/g, (_whole, param: string) => {
      const value = params[param];
      if (value === undefined) {
        throw new InvalidInput(`${operation} needs its ${param}`, { field: param });
      }
      return encodeURIComponent(value);
    });
    let url = this.baseUrl + path;
    const query: [string, string][] = Object.entries(request.query ?? {}).map(([key, value]) => [
      key,
      String(value),
    ]);
    if (query.length > 0) {
      url += `?${new URLSearchParams(query).toString()}`;
    }
    const headers: Record<string, string> = {
      Accept: "application/json",
      Authorization: `Bearer ${this.#token}`,
    };
    if (this.onBehalfOf !== null) {
      headers["X-On-Behalf-Of"] = encodeURIComponent(this.onBehalfOf);
    }
    let body: string | undefined;
    if (method === "POST") {
      headers["Content-Type"] = "application/json";
      // Every POST is keyed; one key for every try of this one call.
      headers["Idempotency-Key"] = request.idempotencyKey ?? globalThis.crypto.randomUUID();
      body = JSON.stringify(request.body ?? {});
    }
    const what = `${method} ${path}`;
    let attempt = 0;
    for (;;) {
      attempt += 1;
      const signal = AbortSignal.timeout(this.timeoutMs);
      let status: number;
      let raw: string;
      try {
        const init: RequestInit = { method, headers, signal, redirect: "error" };
        if (body !== undefined) {
          init.body = body;
        }
        const response = await this.#fetch(url, init);
        status = response.status;
        raw = await response.text();
      } catch (error: unknown) {
        const timedOut =
          signal.aborted ||
          (error instanceof Error &&
            (error.name === "TimeoutError" || error.name === "AbortError"));
        if (attempt <= this.retries) {
          await sleep(this.retryDelayMs * 2 ** (attempt - 1));
          continue;
        }
        const why = timedOut ? `no answer within ${this.timeoutMs} ms` : causeText(error);
        throw new TransportError(
          this.#scrub(
            `${what}: no answer from ${this.baseUrl} after ${attempt} ` +
              `${attempt === 1 ? "try" : "tries"}: ${why}`,
          ),
          { request: what, attempts: attempt, timedOut, cause: error },
        );
      }
      return this.#answer(status, raw);
    }
  }

  #answer(status: number, raw: string): Json {
    let doc: unknown;
    try {
      doc = raw.trim() === "" ? undefined : JSON.parse(raw);
    } catch {
      doc = undefined;
    }
    if (status >= 200 && status < 300) {
      if (!isObject(doc)) {
        throw unexpected("a JSON object", status);
      }
      return doc;
    }
    const error = isObject(doc) ? doc["error"] : undefined;
    if (!isObject(error) || typeof error["code"] !== "string") {
      throw new ExeckitError(
        `HTTP ${status} without an execkit error document (is ${this.baseUrl} an execkit server?)`,
        { code: "error", httpStatus: status },
      );
    }
    const message = typeof error["message"] === "string" ? error["message"] : error["code"];
    const readyAt = typeof error["ready_at"] === "number" ? error["ready_at"] : null;
    const lane = {
      lane: typeof error["lane"] === "string" ? error["lane"] : null,
      opensAt: typeof error["opens_at"] === "number" ? error["opens_at"] : null,
      fix: typeof error["fix"] === "string" ? this.#scrub(error["fix"]) : null,
      field: typeof error["field"] === "string" ? error["field"] : null,
      cap: typeof error["cap"] === "string" ? error["cap"] : null,
      reopensAt: typeof error["reopens_at"] === "number" ? error["reopens_at"] : null,
    };
    throw errorFromAnswer(error["code"], this.#scrub(message), status, readyAt, lane);
  }
}

function checkedBaseUrl(value: unknown): string {
  if (typeof value !== "string" || value.trim() === "") {
    throw invalid("baseUrl", `must be a URL such as http://127.0.0.1:8750, got ${describe(value)}`);
  }
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw invalid("baseUrl", `is not a URL: ${describe(value)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw invalid("baseUrl", `must be an http:// or https:// URL, got ${url.protocol}`);
  }
  if (url.username !== "" || url.password !== "") {
    throw invalid("baseUrl", "must not hold credentials: give the token as `token`");
  }
  if (url.search !== "" || url.hash !== "") {
    throw invalid("baseUrl", "must not hold a query or a fragment");
  }
  return `${url.origin}${url.pathname.replace(/\/+$/, "")}`;
}
