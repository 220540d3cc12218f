/** Every code of docs/remote.md maps to its own error class (no server needed). */

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AdmissionRefused,
  AttemptLimitReached,
  CapabilityMissing,
  Conflict,
  ExeckitError,
  Forbidden,
  InvalidHistory,
  InvalidInput,
  LaneStopped,
  SpendCapReached,
  LaneWaiting,
  NotFound,
  SchemaTooNew,
  StorageError,
  TaskBackingOff,
  TaskBlocked,
  TaskFinished,
  TransportError,
  Unauthenticated,
  UnsupportedMove,
  errorFromAnswer,
} from "../src/index.js";

const TABLE: [string, number, abstract new (...args: never[]) => ExeckitError][] = [
  ["invalid", 400, InvalidInput],
  ["unauthenticated", 401, Unauthenticated],
  ["forbidden", 403, Forbidden],
  ["not_found", 404, NotFound],
  ["conflict", 409, Conflict],
  ["blocked", 409, TaskBlocked],
  ["finished", 409, TaskFinished],
  ["backoff", 409, TaskBackingOff],
  ["lane_waiting", 409, LaneWaiting],
  ["lane_stopped", 409, LaneStopped],
  ["spend_cap", 409, SpendCapReached],
  ["unsupported_move", 409, UnsupportedMove],
  ["attempt_limit", 422, AttemptLimitReached],
  ["invalid_history", 422, InvalidHistory],
  ["storage", 503, StorageError],
  ["schema_too_new", 503, SchemaTooNew],
];

test("each server code is its own class, with code, message and httpStatus", () => {
  for (const [code, status, type] of TABLE) {
    const error = errorFromAnswer(code, `a ${code} message`, status);
    assert.ok(error instanceof type, code);
    assert.ok(error instanceof ExeckitError);
    assert.ok(error instanceof Error);
    assert.equal(error.code, code);
    assert.equal(error.message, `a ${code} message`);
    assert.equal(error.httpStatus, status);
    assert.equal(error.name, type.name);
    assert.equal((type as unknown as typeof ExeckitError).code, code);
    // No leaf is another leaf.
    for (const [other, , otherType] of TABLE) {
      if (other !== code && !(type.prototype instanceof otherType)) {
        assert.ok(!(error instanceof otherType), `${code} is not ${other}`);
      }
    }
  }
});

test("the families: admission refusals, storage, input", () => {
  for (const type of [AttemptLimitReached, TaskBlocked, TaskFinished, TaskBackingOff]) {
    assert.ok(errorFromAnswer(type.code, "m", 409) instanceof AdmissionRefused);
  }
  assert.ok(errorFromAnswer("schema_too_new", "m", 503) instanceof StorageError);
  assert.ok(errorFromAnswer("invalid_history", "m", 422) instanceof InvalidInput);
  assert.ok(errorFromAnswer("unauthenticated", "m", 401) instanceof Forbidden); // as in Python
});

test("lane refusals carry their lane, when it opens and the fix", () => {
  const waiting = errorFromAnswer("lane_waiting", "wait", 409, null, {
    lane: "claude/default",
    opensAt: 1_700_000_060,
  });
  assert.ok(waiting instanceof LaneWaiting && waiting instanceof AdmissionRefused);
  assert.equal(waiting.lane, "claude/default");
  assert.equal(waiting.opensAt, 1_700_000_060);
  const stopped = errorFromAnswer("lane_stopped", "stop", 409, null, {
    lane: "claude/default",
    fix: "run `claude /login`",
  });
  assert.ok(stopped instanceof LaneStopped);
  assert.equal(stopped.fix, "run `claude /login`");
});

test("an invalid answer carries the field it names, as the local error does", () => {
  const refused = errorFromAnswer("invalid", "bad", 400, null, { field: "max_attempts" });
  assert.ok(refused instanceof InvalidInput);
  assert.equal(refused.field, "max_attempts");
  const unnamed = errorFromAnswer("invalid", "bad", 400);
  assert.ok(unnamed instanceof InvalidInput);
  assert.equal(unnamed.field, null);
});

test("backoff carries readyAt; unknown codes and 'error' are the base class", () => {
  const backoff = errorFromAnswer("backoff", "wait", 409, 1_700_000_000.5);
  assert.ok(backoff instanceof TaskBackingOff);
  assert.equal(backoff.readyAt, 1_700_000_000.5);
  for (const code of ["error", "a_code_from_the_future", "constructor", "__proto__"]) {
    const error = errorFromAnswer(code, "m", 500);
    assert.equal(Object.getPrototypeOf(error), ExeckitError.prototype, code);
    assert.equal(error.code, code);
  }
});

test("client-side errors: CapabilityMissing and TransportError", () => {
  const missing = new CapabilityMissing("no", "tasks.attempt_limits");
  assert.ok(missing instanceof ExeckitError);
  assert.ok(missing instanceof StorageError); // as the Python SDK refuses
  assert.equal(missing.code, "storage");
  assert.equal(missing.httpStatus, null);
  const transport = new TransportError("down", {
    request: "GET /v1/tasks",
    attempts: 3,
    timedOut: false,
  });
  assert.ok(!(transport instanceof ExeckitError));
  assert.equal(transport.name, "TransportError");
  const made = new Conflict("lost the race");
  assert.equal(made.code, "conflict");
});
