/**
 * The errors of the execkit client, caught by type (`instanceof`).
 *
 * Two families that never mix:
 *
 *   ExeckitError                 an answer: the server's (`{"error": {"code", "message"}}`)
 *   │                            or the client's own refusal before anything was sent
 *   ├── InvalidInput             "invalid"            400   `.field` names the bad value
 *   │   └── InvalidHistory       "invalid_history"    422
 *   ├── Forbidden                "forbidden"          403
 *   │   └── Unauthenticated      "unauthenticated"    401
 *   ├── NotFound                 "not_found"          404
 *   ├── Conflict                 "conflict"           409
 *   ├── AdmissionRefused         (a run was not admitted; never thrown itself)
 *   │   ├── AttemptLimitReached  "attempt_limit"      422
 *   │   ├── TaskBlocked          "blocked"            409
 *   │   ├── TaskFinished         "finished"           409
 *   │   ├── TaskBackingOff       "backoff"            409   `.readyAt` says when
 *   │   └── SpendCapReached      "spend_cap"          409   `.cap`, `.reopensAt`
 *   ├── UnsupportedMove          "unsupported_move"   409
 *   └── StorageError             "storage"            503
 *       ├── SchemaTooNew         "schema_too_new"     503
 *       └── CapabilityMissing    "storage"            -     `.capability`; nothing was sent
 *                                (the Python SDK's StorageError for the same refusal)
 *
 *   TransportError               no answer at all: connection refused or reset, timeout,
 *                                DNS; `.attempts` says how many tries were made
 *
 * A code the client does not know (a newer server) and the server's "error" (500) are an
 * `ExeckitError` itself, with the code as sent. `httpStatus` is the HTTP status of the
 * answer, or null for a refusal the client made itself (nothing was sent).
 */

import type { ErrorCode } from "./wire.js";

/** The stable machine-readable error codes of docs/remote.md (generated: wire.ts). */
export type { ErrorCode } from "./wire.js";

/** Base of every answer that is an error (the server's or the client's own refusal). */
export class ExeckitError extends Error {
  /** The code an error of this class stands for (a class attribute, as in Python). */
  static readonly code: string = "error";
  /** The error code as the server sent it (a string: a newer server may send new ones). */
  readonly code: string;
  /** The HTTP status of the answer; null when the client refused before sending. */
  readonly httpStatus: number | null;

  constructor(message: string, options: { code?: string; httpStatus?: number | null } = {}) {
    super(message);
    this.name = new.target.name;
    this.code = options.code ?? (new.target as typeof ExeckitError).code;
    this.httpStatus = options.httpStatus ?? null;
  }
}

/** A value is outside its allowed range or of the wrong shape; nothing was changed. */
export class InvalidInput extends ExeckitError {
  static override readonly code: string = "invalid";
  /** The offending argument (the client's name for it), or null where none is to blame. */
  readonly field: string | null;

  constructor(
    message: string,
    options: { code?: string; httpStatus?: number | null; field?: string | null } = {},
  ) {
    super(message, options);
    this.field = options.field ?? null;
  }
}

/** An attempt history breaks an invariant (gapless 1..N, one running, nothing after success). */
export class InvalidHistory extends InvalidInput {
  static override readonly code: string = "invalid_history";
}

/** The token (or the ledger's grants) lack the role the operation needs (403). */
export class Forbidden extends ExeckitError {
  static override readonly code: string = "forbidden";
}

/** No token, or a token the server does not know (401); a `Forbidden`, as in the Python
 * SDK. Nothing was changed. */
export class Unauthenticated extends Forbidden {
  static override readonly code: string = "unauthenticated";
}

/** The task, run or endpoint does not exist (404). */
export class NotFound extends ExeckitError {
  static override readonly code: string = "not_found";
}

/** An idempotency key reused for a different request, or a compare-and-set lost (409). */
export class Conflict extends ExeckitError {
  static override readonly code: string = "conflict";
}

/** A run was not admitted: catch this for any refusal, or one subclass for one reason. */
export class AdmissionRefused extends ExeckitError {}

/** The task's explicit attempt limit is used up; an operator can raise it. */
export class AttemptLimitReached extends AdmissionRefused {
  static override readonly code: string = "attempt_limit";
}

/** The budgets say stop, or another run of the task is still running. */
export class TaskBlocked extends AdmissionRefused {
  static override readonly code: string = "blocked";
}

/** The task is done or cancelled; it admits no more runs. */
export class TaskFinished extends AdmissionRefused {
  static override readonly code: string = "finished";
}

/** The task is backing off: no run is admitted before `readyAt` (POSIX seconds). */
export class TaskBackingOff extends AdmissionRefused {
  static override readonly code: string = "backoff";
  /** When the task is ready again, in POSIX seconds (the server's clock); null if unsent. */
  readonly readyAt: number | null;

  constructor(
    message: string,
    options: { code?: string; httpStatus?: number | null; readyAt?: number | null } = {},
  ) {
    super(message, options);
    this.readyAt = options.readyAt ?? null;
  }
}

/** The task's vendor lane is parked, cooling, or half-open with its probe in flight: no run
 * was admitted and nothing was charged. `opensAt` is when it opens (null: the probe's result
 * decides). */
export class LaneWaiting extends AdmissionRefused {
  static override readonly code: string = "lane_waiting";
  /** The lane, e.g. "claude/default". */
  readonly lane: string | null;
  /** When the lane opens, in POSIX seconds; null when only a result or an operator opens it. */
  readonly opensAt: number | null;

  constructor(message: string, options: Partial<ErrorOptions> = {}) {
    super(message, options);
    this.lane = options.lane ?? null;
    this.opensAt = options.opensAt ?? null;
  }
}

/** A spend cap on a window (the day's, the week's, a rolling 5 hours'; ledger-wide or a
 * lane's) has no room for the run's reservation: no run was admitted and nothing was
 * charged. `cap` names it; `reopensAt` is when its window reopens (issue #45). */
export class SpendCapReached extends AdmissionRefused {
  static override readonly code: string = "spend_cap";
  /** The cap, e.g. "the day's budget". */
  readonly cap: string | null;
  /** When its window reopens, in POSIX seconds. */
  readonly reopensAt: number | null;

  constructor(message: string, options: Partial<ErrorOptions> = {}) {
    super(message, options);
    this.cap = options.cap ?? null;
    this.reopensAt = options.reopensAt ?? null;
  }
}

/** The task's vendor lane is stopped on environment that belongs to it (credentials,
 * billing, a missing binary): `fix` says what to do, then an operator resumes the lane. */
export class LaneStopped extends AdmissionRefused {
  static override readonly code: string = "lane_stopped";
  readonly lane: string | null;
  readonly fix: string | null;

  constructor(message: string, options: Partial<ErrorOptions> = {}) {
    super(message, options);
    this.lane = options.lane ?? null;
    this.fix = options.fix ?? null;
  }
}

/** The board has no such state or refuses the transition. */
export class UnsupportedMove extends ExeckitError {
  static override readonly code: string = "unsupported_move";
}

/** The ledger could not be read or written, or the outcome is unknown (503). */
export class StorageError extends ExeckitError {
  static override readonly code: string = "storage";
}

/** The ledger was written by a newer execkit; nothing was written to it. */
export class SchemaTooNew extends StorageError {
  static override readonly code: string = "schema_too_new";
}

/**
 * The server does not advertise a capability the operation relies on (docs/remote.md,
 * "Capabilities"): the client refused, and sent nothing for the operation.
 */
export class CapabilityMissing extends StorageError {
  static override readonly code: string = "storage";
  /** The capability that was not advertised, e.g. "tasks.attempt_limits". */
  readonly capability: string;

  constructor(message: string, capability: string) {
    super(message, { httpStatus: null });
    this.capability = capability;
  }
}

/**
 * No answer came back: the connection was refused or broken, or the request timed out.
 * Not an `ExeckitError`: a transport failure is never confused with a server answer. The
 * outcome of a POST is unknown; repeating it with the same idempotency key is safe.
 */
export class TransportError extends Error {
  /** The method and path that failed, e.g. "POST /v1/tasks". */
  readonly request: string;
  /** How many times the request was tried (1 + the client's own retries). */
  readonly attempts: number;
  /** True when the last try ran past the client's `timeoutMs`. */
  readonly timedOut: boolean;

  constructor(
    message: string,
    options: { request: string; attempts: number; timedOut: boolean; cause?: unknown },
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.request = options.request;
    this.attempts = options.attempts;
    this.timedOut = options.timedOut;
  }
}

type ErrorOptions = {
  code: string;
  httpStatus: number;
  readyAt: number | null;
  lane?: string | null;
  opensAt?: number | null;
  fix?: string | null;
  field?: string | null;
  cap?: string | null;
  reopensAt?: number | null;
};
type Factory = (message: string, options: ErrorOptions) => ExeckitError;

// One class per code the server sends ("error", the 500, is the base class itself): a code
// added to the OpenAPI document fails to compile here until it has its class.
const FACTORIES = {
  invalid: (m, o) => new InvalidInput(m, o),
  invalid_history: (m, o) => new InvalidHistory(m, o),
  unauthenticated: (m, o) => new Unauthenticated(m, o),
  forbidden: (m, o) => new Forbidden(m, o),
  not_found: (m, o) => new NotFound(m, o),
  conflict: (m, o) => new Conflict(m, o),
  attempt_limit: (m, o) => new AttemptLimitReached(m, o),
  blocked: (m, o) => new TaskBlocked(m, o),
  finished: (m, o) => new TaskFinished(m, o),
  backoff: (m, o) => new TaskBackingOff(m, o),
  lane_waiting: (m, o) => new LaneWaiting(m, o),
  lane_stopped: (m, o) => new LaneStopped(m, o),
  spend_cap: (m, o) => new SpendCapReached(m, o),
  unsupported_move: (m, o) => new UnsupportedMove(m, o),
  storage: (m, o) => new StorageError(m, o),
  schema_too_new: (m, o) => new SchemaTooNew(m, o),
} as const satisfies Readonly<Record<Exclude<ErrorCode, "error">, Factory>>;

function isKnown(code: string): code is keyof typeof FACTORIES {
  return Object.prototype.hasOwnProperty.call(FACTORIES, code);
}

/** The error type for a server's answer with `code` (unknown codes: `ExeckitError`). */
export function errorFromAnswer(
  code: string,
  message: string,
  httpStatus: number,
  readyAt: number | null = null,
  lane: {
    lane?: string | null;
    opensAt?: number | null;
    fix?: string | null;
    field?: string | null;
    cap?: string | null;
    reopensAt?: number | null;
  } = {},
): ExeckitError {
  const options: ErrorOptions = { code, httpStatus, readyAt, ...lane };
  return isKnown(code) ? FACTORIES[code](message, options) : new ExeckitError(message, options);
}
