/**
 * The client against a real `execkit serve` (SQLite ledger, tokens minted by the server's own
 * `--add-token`): every operation, every error type the server answers with, idempotent
 * replays, and a race on one task's attempt limit.
 */

import assert from "node:assert/strict";
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { inspect } from "node:util";

import {
  AdmissionRefused,
  AttemptLimitReached,
  Conflict,
  ExeckitClient,
  ExeckitError,
  Forbidden,
  InvalidInput,
  NotFound,
  SpendCapReached,
  TaskBackingOff,
  TaskBlocked,
  TaskFinished,
  TransportError,
  Unauthenticated,
  type Run,
} from "../src/index.js";
import { OWNER, recordingFetch, startServer, type Server } from "../testing/server.js";

let server: Server;
let owner: ExeckitClient; // the ledger's owner: every role, in the token and the ledger
let operator: ExeckitClient; // agent.operate in the token, granted in the ledger by the owner
let worker: ExeckitClient; // a token without roles

function client(token: string, extra: { onBehalfOf?: string } = {}): ExeckitClient {
  return new ExeckitClient({ baseUrl: server.url, token, timeoutMs: 20_000, ...extra });
}

before(async () => {
  server = await startServer({
    tokens: {
      owner: { actor: OWNER, roles: ["agent.operate", "ledger.admin"] },
      operator: { actor: "operator", roles: ["agent.operate"] },
      worker: { actor: "worker" },
    },
  });
  owner = client(server.tokens["owner"] ?? "");
  operator = client(server.tokens["operator"] ?? "");
  worker = client(server.tokens["worker"] ?? "");
  await owner.grantRole("operator", "agent.operate");
});

after(async () => {
  await server?.stop();
});

/** The URL of a loopback port nothing listens on (it was free a moment ago). */
async function closedPort(): Promise<string> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

/** Start and fail one run (work, charged), past any backoff. */
async function failOnce(api: ExeckitClient, taskId: string): Promise<Run> {
  const run = await api.startRun(taskId, { ignoreBackoff: true });
  return api.finishRun(run.id, { status: "failed", reason: "tests failed" });
}

async function rejects<E extends Error>(
  promise: Promise<unknown>,
  type: abstract new (...args: never[]) => E,
): Promise<E> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof type, `expected ${type.name}, got ${String(error)}`);
    return error;
  }
  assert.fail(`expected ${type.name}, nothing was thrown`);
}

describe("tasks", () => {
  test("create, get and list round trip the wire shape", async () => {
    const caps = await worker.capabilities();
    assert.ok(caps.capabilities.includes("tasks.attempt_limits"));
    assert.equal(typeof caps.schema_version, "number");
    assert.equal(typeof caps.ledger_id, "string");

    const task = await worker.createTask({ title: "port the parser", maxAttempts: 4 });
    assert.match(task.id, /\S/);
    assert.equal(task.title, "port the parser");
    assert.equal(task.status, "open");
    assert.equal(task.state, "ready");
    assert.equal(task.ready, true);
    assert.equal(task.max_attempts, 4);
    assert.equal(task.attempts_started, 0);
    assert.equal(task.created_by, "worker");
    assert.equal(task.blocked_on, null);
    assert.equal(task.retry_pending, false);

    assert.deepEqual(await worker.getTask(task.id), task);
    const listed = await worker.listTasks();
    assert.deepEqual(
      listed.find((t) => t.id === task.id),
      task,
    );
    const plain = await worker.createTask({ title: "no limit", maxUnchargedAttempts: 5 });
    assert.equal(plain.max_attempts, 0);
    assert.equal(plain.max_uncharged_attempts, 5);
    const forced = await worker.getTask(task.id, { force: true, cap: 10 });
    assert.equal(forced.id, task.id);
  });

  test("listTasks pages in creation order and filters by state", async () => {
    const every = await worker.listTasks();
    assert.ok(every.length >= 2);
    const first = await worker.listTasks({ limit: 1 });
    assert.deepEqual(first, every.slice(0, 1));
    const next = await worker.listTasks({ limit: 1, after: first[0]!.id });
    assert.deepEqual(next, every.slice(1, 2));
    const ready = await worker.listTasks({ state: "ready" });
    assert.deepEqual(
      ready.map((t) => t.id),
      every.filter((t) => t.state === "ready").map((t) => t.id),
    );
    await rejects(worker.listTasks({ limit: 0 }), InvalidInput);
    await rejects(worker.listTasks({ state: "sleeping" as never }), InvalidInput);
    await rejects(worker.listTasks({ after: "t-does-not-exist" }), NotFound);
  });

  test("listTasksWithLast: each task with its last attempt, a page a request", async () => {
    const fresh = await worker.createTask({ title: "wl:fresh" });
    await worker.createTask({ title: "not wl" });
    const failed = await worker.createTask({ title: "wl:failed" });
    const run = await failOnce(worker, failed.id);
    const every = await worker.listTasksWithLast();
    assert.deepEqual(
      every.map((item) => item.task.id),
      (await worker.listTasks()).map((task) => task.id),
    );
    const { fetch, calls } = recordingFetch();
    const recorded = new ExeckitClient({
      baseUrl: server.url,
      token: server.tokens["worker"] ?? "",
      fetch,
    });
    const mine = await recorded.listTasksWithLast({ titlePrefix: "wl:", cap: 5 });
    assert.deepEqual(
      mine.map((item) => item.task.id),
      [fresh.id, failed.id],
    );
    assert.equal(calls.length, 1);
    assert.equal(
      new URL(calls[0]!.url).pathname + new URL(calls[0]!.url).search,
      "/v1/tasks-with-last?cap=5&title_prefix=wl%3A",
    );
    assert.equal(mine[0]!.last_attempt, null);
    assert.deepEqual(mine[1]!.task, await worker.getTask(failed.id, { cap: 5 }));
    assert.deepEqual(mine[1]!.last_attempt, {
      number: run.attempt,
      status: run.status,
      failure_class: run.failure_class,
      reason: run.reason,
      started_at: run.started_at,
      ended_at: run.ended_at,
      forced: run.forced,
      not_before: run.not_before,
      stopped: run.stopped,
      lane_held: run.lane_held,
    });
    const first = await worker.listTasksWithLast({ titlePrefix: "wl:", limit: 1 });
    assert.deepEqual(first, mine.slice(0, 1));
    const next = await worker.listTasksWithLast({
      titlePrefix: "wl:",
      limit: 1,
      after: first[0]!.task.id,
    });
    assert.deepEqual(next, mine.slice(1, 2));
    const limit = await rejects(worker.listTasksWithLast({ limit: 0 }), InvalidInput);
    assert.equal(limit.field, "limit");
    await rejects(worker.listTasksWithLast({ titlePrefix: " " }), InvalidInput);
    await rejects(worker.listTasksWithLast({ cap: 1.5 }), InvalidInput);
    await rejects(worker.listTasksWithLast({ after: "t-does-not-exist" }), NotFound);
    const negative = await rejects(worker.listTasksWithLast({ cap: -1 }), InvalidInput);
    assert.equal(negative.httpStatus, 400);
  });

  test("an unknown task is NotFound (404)", async () => {
    const error = await rejects(worker.getTask("t-does-not-exist"), NotFound);
    assert.equal(error.code, "not_found");
    assert.equal(error.httpStatus, 404);
    await rejects(worker.startRun("t-does-not-exist"), NotFound);
  });

  test("on behalf of: the ledger records who acted for whom", async () => {
    const delegate = client(server.tokens["worker"] ?? "", { onBehalfOf: "alice é" });
    const task = await delegate.createTask({ title: "delegated" });
    assert.equal(task.created_by, "worker on behalf of alice é");
    const events = await worker.auditEvents(task.id);
    assert.deepEqual(
      events.map((e) => [e.action, e.actor]),
      [["task.create", "worker on behalf of alice é"]],
    );
  });

  test("cancel: a cancelled task admits no run", async () => {
    const task = await worker.createTask({ title: "to cancel" });
    const cancelled = await worker.cancelTask(task.id);
    assert.equal(cancelled.status, "cancelled");
    const error = await rejects(worker.startRun(task.id), TaskFinished);
    assert.ok(error instanceof AdmissionRefused);
    assert.equal(error.code, "finished");
    assert.equal(error.httpStatus, 409);
  });
});

describe("runs", () => {
  test("a stopped run is uncharged; runningRuns lists what runs; abandonRun ends a lost one", async () => {
    const task = await worker.createTask({ title: "stopped, then lost" });
    const first = await worker.startRun(task.id, { requestKey: "stop-1" });
    const running = await worker.runningRuns();
    const listed = running.find((run) => run.id === first.id);
    assert.ok(listed !== undefined);
    assert.equal(listed.owner_host.length > 0, true);
    const stopped = await worker.finishRun(first.id, {
      status: "abandoned",
      reason: "dispatcher stopped",
      stopped: true,
    });
    assert.equal(stopped.stopped, true);
    const after = await worker.getTask(task.id);
    assert.equal(after.charged_attempts, 0);
    assert.equal(after.state, "ready");

    const second = await worker.startRun(task.id, { requestKey: "stop-2" });
    const lost = await worker.abandonRun(second.id, { reason: "its owner is gone" });
    assert.equal(lost.status, "abandoned");
    assert.equal(lost.stopped, false);
    assert.equal((await worker.getTask(task.id)).charged_attempts, 1);
    assert.equal((await worker.runningRuns()).some((run) => run.task_id === task.id), false);
  });

  test("startRun, heartbeat and finishRun round trip", async () => {
    const task = await worker.createTask({ title: "one run" });
    const run = await worker.startRun(task.id, { leaseS: 60, requestKey: "first-try" });
    assert.equal(run.task_id, task.id);
    assert.equal(run.attempt, 1);
    assert.equal(run.status, "running");
    assert.equal(run.request_key, "first-try");
    assert.equal(run.actor, "worker");
    assert.equal(run.ended_at, null);
    assert.ok(run.lease_expires_at !== null);
    assert.ok(Math.abs(run.lease_expires_at - (run.started_at + 60)) < 5);
    assert.equal((await worker.getTask(task.id)).state, "running");

    const renewed = await worker.heartbeat(run.id, { leaseS: 600 });
    assert.equal(renewed.id, run.id);
    assert.ok(renewed.lease_expires_at !== null && renewed.lease_expires_at > run.lease_expires_at);
    await worker.heartbeat(run.id); // the lease it was started with
    const latest = await worker.heartbeat(run.id, {});
    assert.deepEqual(await worker.getRun(run.id), latest);

    // Another run of the task while this one runs: blocked.
    const blocked = await rejects(worker.startRun(task.id), TaskBlocked);
    assert.equal(blocked.code, "blocked");

    const done = await worker.finishRun(run.id, { status: "succeeded", reason: "all green" });
    assert.equal(done.status, "succeeded");
    assert.equal(done.reason, "all green");
    assert.ok(done.ended_at !== null);
    const after = await worker.getTask(task.id);
    assert.equal(after.status, "done");
    assert.equal(after.state, "done");
    assert.deepEqual(
      (await worker.runs(task.id)).map((r) => [r.attempt, r.status]),
      [[1, "succeeded"]],
    );
    await rejects(worker.startRun(task.id), TaskFinished);
  });

  test("an expired lease: abandonExpiredRuns abandons the run, and it counts", async () => {
    const task = await worker.createTask({ title: "runner died" });
    const run = await worker.startRun(task.id, { leaseS: 0.2 });
    await sleep(400);
    const abandoned = await worker.abandonExpiredRuns();
    const mine = abandoned.find((r) => r.id === run.id);
    assert.equal(mine?.status, "abandoned");
    assert.equal((await worker.getRun(run.id)).status, "abandoned");
    assert.equal((await worker.getTask(task.id)).attempts_started, 1);
  });

  test("a failure backs the task off: TaskBackingOff with readyAt", async () => {
    const task = await worker.createTask({ title: "flaky" });
    const run = await worker.startRun(task.id);
    const failed = await worker.finishRun(run.id, {
      status: "failed",
      failureClass: "work",
      reason: "assertion failed",
    });
    assert.equal(failed.failure_class, "work");
    const error = await rejects(worker.startRun(task.id), TaskBackingOff);
    assert.equal(error.code, "backoff");
    assert.equal(error.httpStatus, 409);
    assert.ok(error.readyAt !== null && error.readyAt > run.started_at);
    // The caller may override the backoff (audited).
    const next = await worker.startRun(task.id, { ignoreBackoff: true });
    assert.equal(next.attempt, 2);
  });

  test("an idempotent POST replay returns the same run and admits nothing new", async () => {
    const task = await worker.createTask({ title: "replayed", idempotencyKey: "create-once" });
    const again = await worker.createTask({ title: "replayed", idempotencyKey: "create-once" });
    assert.equal(again.id, task.id);

    const first = await worker.startRun(task.id, { idempotencyKey: "start-once" });
    const second = await worker.startRun(task.id, { idempotencyKey: "start-once" });
    assert.deepEqual(second, first);
    assert.equal(first.request_key, "start-once"); // the key is the run's request key too
    assert.equal((await worker.runs(task.id)).length, 1);

    // The same key for a different request (another task) is a Conflict, and changes nothing.
    const other = await worker.createTask({ title: "another" });
    const error = await rejects(
      worker.startRun(other.id, { idempotencyKey: "start-once" }),
      Conflict,
    );
    assert.equal(error.httpStatus, 409);
    assert.equal((await worker.runs(task.id)).length, 1);
    assert.equal((await worker.runs(other.id)).length, 0);
  });

  test("an answer lost on the way back: the client repeats with the same key, once", async () => {
    const task = await worker.createTask({ title: "lost answer" });
    // The first POST reaches the server and is served; its answer is then "lost".
    const { fetch, calls } = recordingFetch(async (call, index, forward) => {
      const response = await forward();
      if (call.method === "POST" && index === 0) {
        await response.text();
        throw new TypeError("fetch failed", { cause: new Error("socket hang up") });
      }
      return response;
    });
    const flaky = new ExeckitClient({
      baseUrl: server.url,
      token: server.tokens["worker"] ?? "",
      fetch,
      retryDelayMs: 1,
    });
    const run = await flaky.startRun(task.id);
    assert.equal(calls.length, 2);
    const keys = calls.map((c) => c.headers["idempotency-key"]);
    assert.ok(keys[0] !== undefined && keys[0].length > 0);
    assert.equal(keys[1], keys[0]);
    assert.match(keys[0], /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.equal(run.attempt, 1);
    assert.deepEqual(
      (await worker.runs(task.id)).map((r) => r.id),
      [run.id],
    );
  });

  test("every POST carries an Idempotency-Key, a new one per call", async () => {
    const { fetch, calls } = recordingFetch();
    const recorded = new ExeckitClient({
      baseUrl: server.url,
      token: server.tokens["worker"] ?? "",
      fetch,
    });
    const task = await recorded.createTask({ title: "keys" });
    const run = await recorded.startRun(task.id);
    await recorded.heartbeat(run.id);
    await recorded.finishRun(run.id, { status: "abandoned" });
    await recorded.listTasks();
    const posts = calls.filter((c) => c.method === "POST");
    assert.equal(posts.length, 4);
    const keys = new Set(posts.map((c) => c.headers["idempotency-key"]));
    assert.equal(keys.size, 4);
    assert.ok(!keys.has(undefined));
    const get = calls.find((c) => c.method === "GET");
    assert.equal(get?.headers["idempotency-key"], undefined);
    assert.equal(get?.headers["authorization"], `Bearer ${server.tokens["worker"]}`);
  });
});

describe("attempt limits", () => {
  test("a task at its limit refuses: AttemptLimitReached; an operator raises it", async () => {
    const task = await worker.createTask({ title: "limited", maxAttempts: 2 });
    await failOnce(worker, task.id);
    await failOnce(worker, task.id);
    const error = await rejects(
      worker.startRun(task.id, { ignoreBackoff: true }),
      AttemptLimitReached,
    );
    assert.ok(error instanceof AdmissionRefused);
    assert.equal(error.code, "attempt_limit");
    assert.equal(error.httpStatus, 422);
    const stopped = await worker.getTask(task.id);
    assert.equal(stopped.state, "blocked");
    assert.equal(stopped.blocked_on, "attempt_limit");
    assert.equal(stopped.attempts_started, 2);

    const raised = await operator.setAttemptLimit(task.id, {
      maxAttempts: 3,
      expectedMaxAttempts: 2,
    });
    assert.equal(raised.max_attempts, 3);
    const third = await worker.startRun(task.id, { ignoreBackoff: true });
    assert.equal(third.attempt, 3);
  });

  test("setAttemptLimit with a stale expected value: Conflict, nothing changed", async () => {
    const task = await operator.createTask({ title: "cas", maxAttempts: 5 });
    const error = await rejects(
      operator.setAttemptLimit(task.id, { maxAttempts: 7, expectedMaxAttempts: 4 }),
      Conflict,
    );
    assert.equal(error.code, "conflict");
    assert.equal(error.httpStatus, 409);
    assert.match(error.message, /5/); // names the current limit
    assert.equal((await operator.getTask(task.id)).max_attempts, 5);
    const updated = await operator.setAttemptLimit(task.id, {
      maxAttempts: 7,
      expectedMaxAttempts: 5,
    });
    assert.equal(updated.max_attempts, 7);
  });

  test("a token without agent.operate is Forbidden, and nothing changes", async () => {
    const task = await worker.createTask({ title: "not yours to change", maxAttempts: 3 });
    const error = await rejects(
      worker.setAttemptLimit(task.id, { maxAttempts: 9, expectedMaxAttempts: 3 }),
      Forbidden,
    );
    assert.equal(error.code, "forbidden");
    assert.equal(error.httpStatus, 403);
    await rejects(worker.retryTask(task.id, { force: true }), Forbidden);
    const unchanged = await worker.getTask(task.id);
    assert.equal(unchanged.max_attempts, 3);
    assert.equal(unchanged.retry_pending, false);
    // Granting roles needs ledger.admin in the token.
    await rejects(worker.grantRole("worker", "agent.operate"), Forbidden);
    assert.deepEqual(await worker.grants("worker"), []);
  });

  test("grants: the owner grants and revokes a role", async () => {
    const grant = await owner.grantRole("someone", "agent.operate");
    assert.deepEqual(
      [grant.principal, grant.role, grant.granted_by],
      ["someone", "agent.operate", OWNER],
    );
    assert.deepEqual(
      (await owner.grants("someone")).map((g) => g.role),
      ["agent.operate"],
    );
    assert.equal(await owner.revokeRole("someone", "agent.operate"), true);
    assert.equal(await owner.revokeRole("someone", "agent.operate"), false);
    assert.deepEqual(await owner.grants("someone"), []);
  });

  test("notify endpoints: the owner adds, lists, tests and removes one", async () => {
    const hook = "https://hooks.slack.test/services/T0/B0/sEcReTpAtH";
    const added = await owner.addNotifyEndpoint(hook, ["lane.stopped", "issue.blocked"], {
      secret: "s3cret",
    });
    assert.equal(added.url, "https://hooks.slack.test/…");
    assert.equal(added.has_secret, true);
    assert.deepEqual(added.events, ["lane.stopped", "issue.blocked"]);
    assert.ok(!JSON.stringify(await owner.notifyEndpoints()).includes("sEcReTpAtH"));
    const event = await owner.notifyTest(added.id);
    assert.equal(event.kind, "notify.test");
    // Enabling one that runs returns it as it is; only the admin may, and only a known one.
    const enabled = await owner.enableNotifyEndpoint(added.id);
    assert.equal(enabled.stopped_reason, null);
    assert.equal(enabled.backlog, 1);
    await rejects(worker.enableNotifyEndpoint(added.id), Forbidden);
    await rejects(owner.enableNotifyEndpoint("ep_nope"), NotFound);
    await rejects(worker.addNotifyEndpoint(hook, ["*"]), Forbidden);
    await rejects(owner.addNotifyEndpoint("ftp://x.test/", ["*"]), InvalidInput);
    assert.equal(await owner.removeNotifyEndpoint(added.id), true);
    assert.equal(await owner.removeNotifyEndpoint(added.id), false);
    assert.deepEqual(await owner.notifyEndpoints(), []);
  });

  test("retryTask: an operator asks for one forced retry past the limit", async () => {
    const task = await worker.createTask({ title: "one more", maxAttempts: 1 });
    await failOnce(worker, task.id);
    await rejects(worker.startRun(task.id, { ignoreBackoff: true }), AttemptLimitReached);
    const pending = await operator.retryTask(task.id, { reason: "flake", force: true });
    assert.equal(pending.retry_pending, true);
    const forced = await worker.startRun(task.id, { ignoreBackoff: true });
    assert.equal(forced.attempt, 2);
    assert.equal(forced.forced, true);
  });

  test("8 concurrent start/finish loops, limit 12: exactly runs 1..12", async () => {
    const task = await owner.createTask({ title: "race", maxAttempts: 12 });
    const clients = Array.from({ length: 8 }, () => client(server.tokens["worker"] ?? ""));
    const deadline = Date.now() + 30_000;
    const loop = async (api: ExeckitClient): Promise<number> => {
      let admitted = 0;
      for (let round = 0; round < 1000 && Date.now() < deadline; round += 1) {
        let run: Run;
        try {
          run = await api.startRun(task.id, { ignoreBackoff: true });
        } catch (error) {
          if (error instanceof AttemptLimitReached) {
            return admitted;
          }
          if (error instanceof TaskBlocked) {
            await sleep(1 + Math.random() * 5); // another loop's run is still running
            continue;
          }
          throw error;
        }
        admitted += 1;
        await api.finishRun(run.id, { status: "failed", reason: `round ${round}` });
      }
      throw new Error("a loop ran out of rounds or time");
    };
    const counts = await Promise.all(clients.map(loop));
    assert.equal(
      counts.reduce((a, b) => a + b, 0),
      12,
    );
    const runs = await owner.runs(task.id);
    assert.deepEqual(
      runs.map((r) => r.attempt),
      Array.from({ length: 12 }, (_, i) => i + 1),
    );
    assert.ok(runs.every((r) => r.status === "failed"));
    assert.equal(new Set(runs.map((r) => r.id)).size, 12);
    const final = await owner.getTask(task.id);
    assert.equal(final.attempts_started, 12);
    assert.equal(final.blocked_on, "attempt_limit");
  });
});

describe("vendor lanes", () => {
  test("the lanes' configuration: read, changed by an operator, refused out of range", async () => {
    const before = await worker.laneConfig();
    assert.equal(before.breaker_k, 3);
    await rejects(worker.setLaneConfig({ breakerK: 5 }), Forbidden);
    const bad = await rejects(operator.setLaneConfig({ breakerK: 0 }), InvalidInput);
    assert.match(bad.message, /breaker_k must be an integer in 1\.\.1000/);
    await rejects(operator.setLaneConfig({ breakerK: 2.5 }), InvalidInput); // checked here
    assert.deepEqual(await worker.laneConfig(), before);
    const changed = await operator.setLaneConfig({ breakerK: 5, coolMaxS: 900 });
    assert.equal(changed.breaker_k, 5);
    assert.equal(changed.cool_max_s, 900);
    assert.equal(changed.cool_base_s, before.cool_base_s);
    assert.deepEqual(await worker.laneConfig(), changed);
  });

  test("waitForWake returns once an operator lets work run again", async () => {
    const seen = await worker.wakeSeq();
    assert.equal(await worker.waitForWake(seen, 0), seen); // nothing new: what it was given
    const waiting = worker.waitForWake(seen, 15);
    await operator.setLaneConfig({ recheckS: 7, maxTrips: 25, resetMarginS: 1 });
    assert.equal(await waiting, seen + 1); // a wait not woken would have returned `seen`
    const config = await worker.laneConfig();
    assert.deepEqual([config.recheck_s, config.max_trips, config.reset_margin_s], [7, 25, 1]);
    await rejects(worker.waitForWake(1.5, 1), InvalidInput);
  });
});

describe("authentication", () => {
  test("no or unknown token: Unauthenticated, and nothing changed", async () => {
    const before = await owner.listTasks();
    const events = await owner.auditEvents();
    const stranger = client("ekt_not-a-token-the-server-knows");
    const error = await rejects(stranger.createTask({ title: "intruder" }), Unauthenticated);
    assert.equal(error.code, "unauthenticated");
    assert.equal(error.httpStatus, 401);
    assert.ok(!error.message.includes("ekt_not-a-token"));
    await rejects(stranger.listTasks(), Unauthenticated);
    const victim = before[0];
    assert.ok(victim !== undefined);
    await rejects(stranger.cancelTask(victim.id), Unauthenticated);
    assert.deepEqual(await owner.listTasks(), before);
    assert.equal((await owner.auditEvents()).length, events.length);
  });

  test("the token appears in no error message", async () => {
    const token = server.tokens["worker"] ?? "";
    const failures: unknown[] = [];
    const closed = await closedPort();
    for (const attempt of [
      () => worker.getTask("t-missing"),
      () => worker.setAttemptLimit("t-missing", { maxAttempts: 2, expectedMaxAttempts: 0 }),
      () => new ExeckitClient({ baseUrl: closed, token, retries: 0 }).listTasks(),
    ]) {
      try {
        await attempt();
      } catch (error) {
        failures.push(error);
      }
    }
    assert.equal(failures.length, 3);
    assert.ok(!inspect(worker, { showHidden: true, depth: 5 }).includes(token));
    assert.ok(!JSON.stringify(worker).includes(token));
    for (const error of failures) {
      assert.ok(error instanceof ExeckitError || error instanceof TransportError);
      assert.ok(!error.message.includes(token));
      assert.ok(!String(error.stack).includes(token));
      assert.ok(!JSON.stringify(error).includes(token));
    }
  });
});

describe("arguments", () => {
  test("bad arguments throw InvalidInput naming the field, and send nothing", async () => {
    const { fetch, calls } = recordingFetch();
    const token = server.tokens["worker"] ?? "";
    const api = new ExeckitClient({ baseUrl: server.url, token, fetch });
    const cases: [() => Promise<unknown>, string | null][] = [
      [() => api.createTask({ title: "" }), "title"],
      [() => api.createTask({ title: "x", maxAttempts: 1.5 }), "maxAttempts"],
      [() => api.createTask({ title: "x", maxAttempts: 10_001 }), "maxAttempts"],
      [() => api.createTask({ title: "x", maxAttempts: -1 }), "maxAttempts"],
      [() => api.createTask({ title: "x", maxAttempts: "3" as unknown as number }), "maxAttempts"],
      [() => api.createTask({ title: "x", maxAttempts: Number.NaN }), "maxAttempts"],
      [() => api.createTask({ title: "x", maxUnchargedAttempts: 0 }), "maxUnchargedAttempts"],
      [() => api.createTask({ title: "x", idempotencyKey: "has space" }), "idempotencyKey"],
      [() => api.createTask({ title: "x", maxAttemps: 3 } as never), "maxAttemps"],
      [() => api.createTask(undefined as never), null],
      [() => api.setAttemptLimit("t-1", { maxAttempts: 0, expectedMaxAttempts: 0 }), "maxAttempts"],
      [
        () => api.setAttemptLimit("t-1", { maxAttempts: 3, expectedMaxAttempts: -1 }),
        "expectedMaxAttempts",
      ],
      [() => api.getTask(""), "taskId"],
      [() => api.getTask("t-1", { cap: 1.5 }), "cap"],
      [() => api.startRun("t-1", { leaseS: -1 }), "leaseS"],
      [() => api.startRun("t-1", { leaseS: Number.POSITIVE_INFINITY }), "leaseS"],
      [() => api.startRun("t-1", { forced: "yes" as unknown as boolean }), "forced"],
      [() => api.finishRun("r-1", { status: "done" as never }), "status"],
      [
        () => api.finishRun("r-1", { status: "failed", failureClass: "bug" as never }),
        "failureClass",
      ],
      [() => api.heartbeat("r-1", { leaseS: 0 }), "leaseS"],
      [() => api.retryTask("t-1", { force: 1 as unknown as boolean }), "force"],
    ];
    for (const [call, field] of cases) {
      const error = await rejects(call(), InvalidInput);
      assert.equal(error.field, field, error.message);
      assert.equal(error.code, "invalid");
      assert.equal(error.httpStatus, null);
      if (field !== null) {
        assert.ok(error.message.includes(field), error.message);
      }
    }
    assert.equal(calls.length, 0, "nothing was sent");
  });

  test("bad client options throw InvalidInput, never showing the token", () => {
    const good = { baseUrl: "http://127.0.0.1:8750", token: "ekt_x" };
    const cases: [Record<string, unknown>, string][] = [
      [{ ...good, baseUrl: "ftp://127.0.0.1" }, "baseUrl"],
      [{ ...good, baseUrl: "not a url" }, "baseUrl"],
      [{ ...good, baseUrl: "http://user:pw@127.0.0.1" }, "baseUrl"],
      [{ ...good, token: "" }, "token"],
      [{ ...good, token: "ekt_secret with space" }, "token"],
      [{ ...good, token: "ekt_secret\r\nX-Evil: 1" }, "token"],
      [{ ...good, timeoutMs: 0 }, "timeoutMs"],
      [{ ...good, retries: 11 }, "retries"],
      [{ ...good, onBehalfOf: "" }, "onBehalfOf"],
      [{ ...good, onBehalfOf: "a\nb" }, "onBehalfOf"],
      [{ ...good, tokn: "x" }, "tokn"],
    ];
    for (const [options, field] of cases) {
      assert.throws(
        () => new ExeckitClient(options as never),
        (error: unknown) =>
          error instanceof InvalidInput &&
          error.field === field &&
          !error.message.includes("ekt_secret"),
        field,
      );
    }
    const trimmed = new ExeckitClient({ ...good, baseUrl: "http://127.0.0.1:8750/" });
    assert.equal(trimmed.baseUrl, "http://127.0.0.1:8750");
  });

  test("the server's own check answers InvalidInput too (400)", async () => {
    const task = await worker.createTask({ title: "bounds" });
    const run = await worker.startRun(task.id);
    const refused = await rejects(
      worker.finishRun(run.id, { status: "succeeded", failureClass: "upstream" }),
      InvalidInput,
    );
    assert.equal(refused.httpStatus, 400);
    // The server names the value to blame, as the local ledger does.
    assert.equal(refused.field, "failure_class");
  });
});

describe("sessions (issue #46)", () => {
  test("a run keeps the vendor session its result named; a control character is refused unsent", async () => {
    const task = await worker.createTask({ title: "session: kept" });
    const run = await worker.startRun(task.id);
    assert.equal(run.session_id, null);
    const session = "7fe4ecce-cba9-4182-98c6-ce5bbc5450ae";
    await rejects(
      worker.finishRun(run.id, { status: "failed", failureClass: "upstream", sessionId: "a\nb" }),
      InvalidInput,
    );
    const ended = await worker.finishRun(run.id, {
      status: "failed",
      failureClass: "upstream",
      sessionId: session,
    });
    assert.equal(ended.session_id, session);
    assert.equal((await worker.getRun(run.id)).session_id, session);
  });
});

describe("spend (issue #45)", () => {
  test("a run's cost is recorded, a day's cap refuses typed, a task's budget is compare-and-set", async () => {
    const task = await worker.createTask({ title: "spend: costed" });
    const run = await worker.startRun(task.id);
    const usage = {
      input_tokens: 1200,
      output_tokens: 300,
      cache_read_tokens: 0,
      cache_write_tokens: 0,
      usd: 0.42,
      usd_source: "reported" as const,
      model: "claude-sonnet-4",
      premium_requests: 0,
    };
    const ended = await worker.finishRun(run.id, { status: "succeeded", usage });
    assert.deepEqual(
      [ended.usd, ended.usd_source, ended.input_tokens, ended.model],
      [0.42, "reported", 1200, "claude-sonnet-4"],
    );
    await rejects(worker.finishRun(run.id, { status: "succeeded", usage: 5 as never }), InvalidInput);

    await rejects(worker.setSpendCap({ floorUsd: 1 }), Forbidden);
    const config = await operator.setSpendCap({
      cap: { window: "day", lane: null, usd: 0.5, tokens: null, tz: "UTC" },
      floorUsd: 0.6,
    });
    assert.equal(config.caps.length, 1);
    assert.deepEqual(await worker.spendConfig(), config);
    const held = await worker.createTask({ title: "spend: held" });
    const refused = await rejects(worker.startRun(held.id), SpendCapReached);
    assert.equal(refused.cap, "the day's budget");
    assert.ok(refused instanceof AdmissionRefused && refused.reopensAt !== null);
    const rows = await worker.spendRows();
    assert.ok(rows.some((row) => row.run_id === run.id && row.usd === 0.42));
    assert.deepEqual(await worker.spendRows(ended.started_at + 1e6), []);
    const [use] = await worker.spendWindows();
    assert.deepEqual([use?.full, use?.name, use?.reopens_at], [true, "the day's budget", refused.reopensAt]);
    await operator.setSpendCap({ cap: { window: "day", lane: null, usd: null, tokens: null, tz: "UTC" } });
    assert.deepEqual((await worker.spendConfig()).caps, []);

    const budget = await worker.setTaskBudget(held.id, {
      usd: 2,
      tokens: null,
      expectedUsd: null,
      expectedTokens: null,
    });
    assert.deepEqual(budget, { task_id: held.id, usd: 2, tokens: null });
    assert.deepEqual(await worker.taskBudget(held.id), budget);
    await rejects(
      worker.setTaskBudget(held.id, { usd: 3, tokens: null, expectedUsd: null, expectedTokens: null }),
      Conflict,
    );
  });

  test("a running run's room grows as it spends, and names the cap that stops it", async () => {
    await operator.setSpendCap({
      cap: { window: "week", lane: null, usd: 2, tokens: null, tz: "UTC" },
      floorUsd: 0.25,
    });
    const task = await worker.createTask({ title: "spend: metered" });
    const run = await worker.startRun(task.id);
    const spent = (usd: number) => ({
      input_tokens: 0,
      output_tokens: 10,
      cache_read_tokens: 0,
      cache_write_tokens: 0,
      usd,
      usd_source: "reported" as const,
      model: null,
      premium_requests: 0,
    });
    // It reserved the p90 of the recent costs ($0.42 above), and grows by the floor.
    assert.equal((await worker.spendRoom(run.id)).usd, 0.42);
    assert.equal((await worker.spendRoom(run.id, spent(0.5))).usd, 0.75);
    const stop = await worker.spendRoom(run.id, spent(1.7));
    assert.deepEqual([stop.cap, stop.by_task], ["the week's budget", false]);
    assert.ok(stop.stop?.includes("is spent") && stop.reopens_at !== null);
    await rejects(worker.spendRoom(run.id, 3 as never), InvalidInput);
    await worker.finishRun(run.id, { status: "abandoned", stopped: true, usage: spent(1.7) });
    // An operator lifts the week's cap for this week: the next run is admitted.
    const held = await worker.createTask({ title: "spend: held by the week" });
    await rejects(worker.startRun(held.id), SpendCapReached);
    await rejects(worker.overrideSpendCap("week"), Forbidden);
    const lifted = await operator.overrideSpendCap("week");
    assert.ok(typeof lifted.overrides["*|week"] === "number");
    const admitted = await worker.startRun(held.id);
    await worker.finishRun(admitted.id, { status: "succeeded" });
    await rejects(operator.overrideSpendCap("day"), InvalidInput);
    const marked = await operator.setSubscriptionLane("claude/default", true);
    assert.deepEqual(marked.subscription_lanes, ["claude/default"]);
    await rejects(worker.setSubscriptionLane("claude/default", false), Forbidden);
    await rejects(operator.setSubscriptionLane("no-slash", true), InvalidInput);
    assert.deepEqual((await operator.setSubscriptionLane("claude/default", false)).subscription_lanes, []);
    await operator.setSpendCap({ cap: { window: "week", lane: null, usd: null, tokens: null, tz: "UTC" } });
  });
});
