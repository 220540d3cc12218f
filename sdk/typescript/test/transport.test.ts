/**
 * Transport failures are their own type (`TransportError`), never an `ExeckitError`: a server
 * that was stopped, one that never answers, and, for contrast, an HTTP answer that is not
 * execkit's (an answer, so never retried).
 */

import assert from "node:assert/strict";
import { createServer, type Server as HttpServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { ExeckitClient, ExeckitError, TransportError } from "../src/index.js";
import { recordingFetch, startServer, type Server } from "../testing/server.js";

let server: Server;
let token = "";
let url = "";

before(async () => {
  server = await startServer({ tokens: { worker: { actor: "worker" } } });
  token = server.tokens["worker"] ?? "";
  url = server.url;
});

after(async () => {
  await server?.stop();
});

async function listen(handler: Parameters<typeof createServer>[1]): Promise<[HttpServer, string]> {
  const http = createServer(handler);
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  const { port } = http.address() as AddressInfo;
  return [http, `http://127.0.0.1:${port}`];
}

async function close(http: HttpServer): Promise<void> {
  http.closeAllConnections();
  await new Promise<void>((resolve) => http.close(() => resolve()));
}

test("a stopped server: TransportError after bounded retries, one key for every try", async () => {
  const live = new ExeckitClient({ baseUrl: url, token });
  const task = await live.createTask({ title: "before the stop" });
  await server.stop();

  const { fetch, calls } = recordingFetch();
  const api = new ExeckitClient({ baseUrl: url, token, fetch, retries: 3, retryDelayMs: 5 });
  const error = await api.startRun(task.id).then(
    () => assert.fail("a stopped server answered"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof TransportError, String(error));
  assert.ok(!(error instanceof ExeckitError));
  assert.equal(error.attempts, 4);
  assert.equal(error.timedOut, false);
  assert.equal(error.request, `POST /v1/tasks/${task.id}/runs`);
  assert.match(error.message, /no answer from http:\/\/127\.0\.0\.1:\d+ after 4 tries/);
  assert.ok(!error.message.includes(token));
  assert.equal(calls.length, 4);
  const keys = new Set(calls.map((c) => c.headers["idempotency-key"]));
  assert.equal(keys.size, 1);
  assert.ok(!keys.has(undefined));

  const once = new ExeckitClient({ baseUrl: url, token, retries: 0 });
  const get = await once.listTasks().catch((e: unknown) => e);
  assert.ok(get instanceof TransportError);
  assert.equal(get.attempts, 1);
});

test("a server that never answers: TransportError with timedOut", async () => {
  const [http, where] = await listen(() => {
    // never answers
  });
  try {
    const api = new ExeckitClient({
      baseUrl: where,
      token,
      timeoutMs: 150,
      retries: 1,
      retryDelayMs: 1,
    });
    const started = Date.now();
    const error = await api.capabilities().catch((e: unknown) => e);
    assert.ok(error instanceof TransportError, String(error));
    assert.equal(error.timedOut, true);
    assert.equal(error.attempts, 2);
    assert.match(error.message, /within 150 ms/);
    assert.ok(Date.now() - started < 5000);
  } finally {
    await close(http);
  }
});

test("an HTTP answer that is not execkit's: ExeckitError, never retried", async () => {
  let hits = 0;
  const [http, where] = await listen((_request, response) => {
    hits += 1;
    response.writeHead(502, { "content-type": "text/html" });
    response.end("<html>bad gateway</html>");
  });
  try {
    const api = new ExeckitClient({ baseUrl: where, token, retries: 3, retryDelayMs: 1 });
    const error = await api.createTask({ title: "x" }).catch((e: unknown) => e);
    assert.ok(error instanceof ExeckitError, String(error));
    assert.ok(!(error instanceof TransportError));
    assert.equal(error.code, "error");
    assert.equal(error.httpStatus, 502);
    assert.equal(hits, 1);
  } finally {
    await close(http);
  }
});
