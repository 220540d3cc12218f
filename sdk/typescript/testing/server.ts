/**
 * A real `execkit serve` for the tests: a temporary folder with a SQLite ledger and a
 * tokens file minted with the server's own `--add-token`, a server on 127.0.0.1 port 0
 * (the port it got is read from its `--json` line), and `stop()` that ends it.
 *
 * The Python is `$EXECKIT_PYTHON` (default `python3`), with the caller's environment (the
 * repository on PYTHONPATH when execkit is not installed). Every wait is bounded; a server
 * still running when the test process exits is killed then.
 */

import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir, userInfo } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

const PYTHON = process.env["EXECKIT_PYTHON"] ?? "python3";
const START_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 10_000;
const TOKEN_TIMEOUT_MS = 30_000;

/** The ledger's owner holds every role in it: the operating-system user running the tests. */
export const OWNER = userInfo().username;

export interface TokenSpec {
  actor: string;
  roles?: readonly string[];
}

export interface StartOptions {
  /** Tokens to mint, by a name the test uses (`server.tokens[name]`). */
  tokens: Readonly<Record<string, TokenSpec>>;
  /** Capabilities not to advertise (`--without-capability`). */
  without?: readonly string[];
}

export interface Server {
  readonly url: string;
  readonly tokens: Readonly<Record<string, string>>;
  readonly dir: string;
  /** End the server (SIGTERM, then SIGKILL) and remove its folder; safe to call twice. */
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of running) {
    child.kill("SIGKILL");
  }
});

function mint(tokensFile: string, spec: TokenSpec): Promise<string> {
  const args = ["-m", "execkit", "serve", "--add-token", tokensFile, "--actor", spec.actor];
  for (const role of spec.roles ?? []) {
    args.push("--role", role);
  }
  args.push("--json");
  return new Promise((resolve, reject) => {
    execFile(PYTHON, args, { timeout: TOKEN_TIMEOUT_MS }, (error, stdout, stderr) => {
      if (error !== null) {
        reject(new Error(`execkit serve --add-token failed: ${error.message}\n${stderr}`));
        return;
      }
      const doc: unknown = JSON.parse(stdout);
      if (typeof doc !== "object" || doc === null || !("token" in doc)) {
        reject(new Error(`execkit serve --add-token printed no token: ${stdout}`));
        return;
      }
      resolve(String(doc.token));
    });
  });
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve();
  }
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill("SIGTERM");
    const done = await Promise.race([
      exited(child).then(() => true),
      sleep(STOP_TIMEOUT_MS, false, { ref: false }),
    ]);
    if (!done) {
      child.kill("SIGKILL");
      await Promise.race([exited(child), sleep(STOP_TIMEOUT_MS, undefined, { ref: false })]);
    }
  }
  running.delete(child);
}

function readyLine(child: ChildProcess, stderr: () => string): Promise<string> {
  return new Promise((resolve, reject) => {
    let buffer = "";
    const timer = setTimeout(() => {
      finish(new Error(`execkit serve did not start within ${START_TIMEOUT_MS} ms\n${stderr()}`));
    }, START_TIMEOUT_MS);
    const onData = (chunk: Buffer): void => {
      buffer += chunk.toString("utf8");
      const end = buffer.indexOf("\n");
      if (end < 0) {
        return;
      }
      try {
        const doc: unknown = JSON.parse(buffer.slice(0, end));
        if (typeof doc === "object" && doc !== null && "url" in doc) {
          finish(null, String(doc.url));
          return;
        }
      } catch {
        // fall through: not the JSON line
      }
      finish(new Error(`execkit serve printed no URL: ${buffer}\n${stderr()}`));
    };
    const onExit = (code: number | null): void => {
      finish(new Error(`execkit serve exited (${code}) before listening\n${stderr()}`));
    };
    const finish = (error: Error | null, url?: string): void => {
      clearTimeout(timer);
      child.stdout?.off("data", onData);
      child.off("exit", onExit);
      if (error !== null) {
        reject(error);
      } else {
        resolve(url ?? "");
      }
    };
    child.stdout?.on("data", onData);
    child.once("exit", onExit);
  });
}

async function answers(url: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS;
  for (;;) {
    try {
      const response = await fetch(`${url}/openapi.json`, { signal: AbortSignal.timeout(2000) });
      await response.text();
      if (response.ok) {
        return;
      }
    } catch {
      // not yet
    }
    if (Date.now() > deadline) {
      throw new Error(`execkit serve at ${url} did not answer within ${START_TIMEOUT_MS} ms`);
    }
    await sleep(50);
  }
}

/** Start a server with a fresh ledger and the tokens asked for. */
export async function startServer(options: StartOptions): Promise<Server> {
  const dir = await mkdtemp(join(tmpdir(), "execkit-sdk-ts-"));
  const tokensFile = join(dir, "tokens.json");
  const tokens: Record<string, string> = {};
  // One at a time: each rewrite of the tokens file is atomic, but in order is simpler to read.
  for (const [key, spec] of Object.entries(options.tokens)) {
    tokens[key] = await mint(tokensFile, spec);
  }
  const args = [
    "-m",
    "execkit",
    "serve",
    "--db",
    join(dir, "ledger.db"),
    "--tokens",
    tokensFile,
    "--listen",
    "127.0.0.1:0",
    "--json",
  ];
  for (const name of options.without ?? []) {
    args.push("--without-capability", name);
  }
  const child = spawn(PYTHON, args, { stdio: ["ignore", "pipe", "pipe"] });
  running.add(child);
  let errors = "";
  child.stderr?.on("data", (chunk: Buffer) => {
    errors = (errors + chunk.toString("utf8")).slice(-8000);
  });
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) {
      return;
    }
    stopped = true;
    await stopChild(child);
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const url = await readyLine(child, () => errors);
    await answers(url);
    return { url, tokens, dir, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** A fetch that records what it was asked, then does it (or what `intercept` says). */
export interface Recorded {
  method: string;
  url: string;
  headers: Record<string, string>;
  body: string | null;
}

export type Intercept = (
  call: Recorded,
  index: number,
  forward: () => Promise<Response>,
) => Promise<Response>;

export function recordingFetch(
  intercept?: Intercept,
): { fetch: (input: string, init: RequestInit) => Promise<Response>; calls: Recorded[] } {
  const calls: Recorded[] = [];
  const recorder = async (input: string, init: RequestInit): Promise<Response> => {
    const headers: Record<string, string> = {};
    new Headers(init.headers).forEach((value, key) => {
      headers[key] = value;
    });
    const call: Recorded = {
      method: init.method ?? "GET",
      url: input,
      headers,
      body: typeof init.body === "string" ? init.body : null,
    };
    calls.push(call);
    if (intercept !== undefined) {
      return intercept(call, calls.length - 1, () => fetch(input, init));
    }
    return fetch(input, init);
  };
  return { fetch: recorder, calls };
}
