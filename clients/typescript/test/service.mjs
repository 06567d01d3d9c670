// A real `paceline serve` for the tests: on the memory store, or on a Redis the tests start
// themselves; each on a free port, stopped when the tests end (also on failure).

import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createConnection, createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, describe } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "../dist/index.js";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

export const QUEUES = [
  "jobs",
  "manual",
  "work",
  "failing",
  "upstream",
  "lost",
  "shutdown",
  "sigterm",
  "results",
  "release",
  "paused",
  "deep",
];

const CONFIG =
  `allow_inline_policies = true\n\n[policies]\napi = "gcra:rate=1/m,burst=2"\n` +
  QUEUES.map(
    (name) =>
      `\n[queues.${name}]\ngroup_policy = "gcra:rate=1000/s,burst=100"\n` +
      `lease = "${name === "lost" ? "1s" : "30s"}"\nretry_backoff = "10ms"\nretry_backoff_max = "20ms"\n` +
      // Its acknowledged jobs stay readable, with their results.
      (name === "results" ? "keep_completed = 1000\n" : ""),
  ).join("");

export function freePort() {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
  });
}

async function waitPort(port, child, what) {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${what} exited with ${child.exitCode}`);
    const open = await new Promise((done) => {
      const socket = createConnection({ port, host: "127.0.0.1" });
      socket.once("connect", () => {
        socket.destroy();
        done(true);
      });
      socket.once("error", () => done(false));
    });
    if (open) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} never listened on ${port}`);
}

function paceline() {
  if (process.env.PACELINE_BIN) return process.env.PACELINE_BIN;
  const built = join(root, "target", "debug", "paceline");
  if (!existsSync(built)) {
    const made = spawnSync("cargo", ["build", "--locked", "-q", "-p", "paceline-cli"], { cwd: root, stdio: "inherit" });
    if (made.status !== 0) throw new Error("cargo build failed");
  }
  return built;
}

function stop(child) {
  return new Promise((done) => {
    if (child.exitCode !== null || child.signalCode !== null) return done();
    const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
    child.once("exit", () => {
      clearTimeout(timer);
      done();
    });
    child.kill("SIGTERM");
  });
}

/** Starts the service on `store` ("memory" or "redis"), with more `flags`; answers its URL
 * and a stop(). */
export async function startService(store, flags = []) {
  const children = [];
  const folder = mkdtempSync(join(tmpdir(), "paceline-ts-"));
  const stopAll = async () => {
    for (const child of children.reverse()) await stop(child);
    rmSync(folder, { recursive: true, force: true });
  };
  try {
    let storeUrl = "memory";
    if (store === "redis") {
      const port = await freePort();
      const redis = spawn(
        "redis-server",
        ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        { stdio: "ignore" },
      );
      children.push(redis);
      await waitPort(port, redis, "redis-server");
      storeUrl = `redis://127.0.0.1:${port}`;
    }
    const config = join(folder, "paceline.toml");
    writeFileSync(config, CONFIG);
    const port = await freePort();
    const serve = spawn(
      paceline(),
      ["serve", "--listen", `127.0.0.1:${port}`, "--store", storeUrl, "--config", config, ...flags],
      { stdio: "ignore" },
    );
    children.push(serve);
    await waitPort(port, serve, "paceline serve");
    return { url: `http://127.0.0.1:${port}`, stop: stopAll };
  } catch (e) {
    await stopAll();
    throw e;
  }
}

let counter = 0;
/** A name no other test uses: keys, groups, job ids. */
export function unique(label) {
  counter += 1;
  return `${label}-${process.pid}-${Date.now()}-${counter}`;
}

/** Polls `check` until it is true, or fails after a deadline. */
export async function until(check, what, deadlineMs = 20_000) {
  const deadline = Date.now() + deadlineMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${deadlineMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const STORES = ["memory", "redis"];

/** Declares `body`'s tests once for each of the STORES, in a `describe` titled `title` on the
 * store: `body(client, service)` gets a Client of a service started on that store before
 * the tests and stopped after them, and the service (`url`); both usable inside tests, once
 * the service is up. */
export function describeEachStore(title, body) {
  for (const store of STORES) {
    describe(`${title} on the ${store} store`, () => {
      let service;
      let client;
      before(async () => {
        service = await startService(store);
        client = new Client(service.url);
      });
      after(async () => service?.stop());
      // The tests are declared now and the service started later: they reach both through
      // stand-ins that forward to them.
      body(late(() => client), late(() => service));
    });
  }
}

/** A stand-in for the object `current()` answers when it is used. */
function late(current) {
  return new Proxy(
    {},
    {
      get(_, name) {
        const target = current();
        const value = target[name];
        return typeof value === "function" ? value.bind(target) : value;
      },
    },
  );
}
