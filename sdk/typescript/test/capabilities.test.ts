/**
 * The capability rule (docs/remote.md, "Capabilities"; ADR 0033) against a real server that
 * stands in for an older one (`--without-capability tasks.attempt_limits`): a limit is never
 * sent to a server that does not say it enforces one.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { ATTEMPT_LIMITS, CapabilityMissing, ExeckitClient, StorageError } from "../src/index.js";
import { recordingFetch, startServer, type Server } from "../testing/server.js";

let server: Server;

before(async () => {
  server = await startServer({
    tokens: { operator: { actor: "operator", roles: ["agent.operate"] } },
    without: [ATTEMPT_LIMITS],
  });
});

after(async () => {
  await server?.stop();
});

function recorded(): { api: ExeckitClient; calls: ReturnType<typeof recordingFetch>["calls"] } {
  const { fetch, calls } = recordingFetch();
  const token = server.tokens["operator"] ?? "";
  const api = new ExeckitClient({ baseUrl: server.url, token, fetch });
  return { api, calls };
}

function paths(calls: { method: string; url: string }[]): string[] {
  return calls.map((c) => `${c.method} ${new URL(c.url).pathname}`);
}

test("the server does not advertise tasks.attempt_limits", async () => {
  const { api } = recorded();
  const caps = await api.capabilities();
  assert.ok(!caps.capabilities.includes(ATTEMPT_LIMITS));
  assert.ok(caps.capabilities.includes("runs.leases"));
});

test("setAttemptLimit: CapabilityMissing, and no request is made for the update", async () => {
  const { api, calls } = recorded();
  const task = await api.createTask({ title: "no limits here" });
  calls.length = 0;
  const error = await api
    .setAttemptLimit(task.id, { maxAttempts: 5, expectedMaxAttempts: 0 })
    .then(
      () => assert.fail("the update was sent"),
      (e: unknown) => e,
    );
  assert.ok(error instanceof CapabilityMissing);
  assert.ok(error instanceof StorageError); // the Python SDK's refusal, code and all
  assert.equal(error.code, "storage");
  assert.equal(error.capability, ATTEMPT_LIMITS);
  assert.equal(error.httpStatus, null);
  assert.match(error.message, /tasks\.attempt_limits/);
  assert.deepEqual(paths(calls), ["GET /v1/capabilities"]);
  assert.equal((await api.getTask(task.id)).max_attempts, 0);
});

test("createTask with maxAttempts: CapabilityMissing, nothing created", async () => {
  const { api, calls } = recorded();
  const before = await api.listTasks();
  await assert.rejects(api.createTask({ title: "limited", maxAttempts: 3 }), CapabilityMissing);
  // The capabilities are read once per client, then the cache answers.
  await assert.rejects(api.createTask({ title: "limited", maxAttempts: 3 }), CapabilityMissing);
  await assert.rejects(
    api.setAttemptLimit("t-1", { maxAttempts: 3, expectedMaxAttempts: 0 }),
    CapabilityMissing,
  );
  assert.deepEqual(paths(calls), ["GET /v1/tasks", "GET /v1/capabilities"]);
  assert.deepEqual(await api.listTasks(), before);
  // Without a limit nothing relies on the capability: no check, the task is created.
  calls.length = 0;
  const plain = await api.createTask({ title: "plain", maxAttempts: 0 });
  assert.equal(plain.max_attempts, 0);
  assert.deepEqual(paths(calls), ["POST /v1/tasks"]);
  assert.equal(calls[0]?.body, JSON.stringify({ title: "plain" }));
});
