// The worker against a real service: it acks what its handler finishes, fails what throws
// (retried after the queue's backoff), pauses a group on an upstream's 429, stops working
// on a job whose lease is lost, and hands back or finishes jobs when it shuts down. The
// tests never sleep for time to pass: they poll the service, with a deadline.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { PauseGroup, Worker } from "../dist/index.js";
import { describeEachStore, unique, until } from "./service.mjs";

const index = fileURLToPath(new URL("../dist/index.js", import.meta.url));

async function drained(client, queue) {
  const s = await client.queue(queue).stats();
  return s.waiting + s.active + s.scheduled === 0;
}

describeEachStore("the worker", (client, service) => {
  test("runs every job, concurrently, and acks it", async () => {
    const group = unique("work");
    for (let i = 0; i < 20; i++) await client.queue("work").enqueue(`${group}-${i % 3}`, { n: i });
    const seen = [];
    const worker = new Worker(client, "work", { concurrency: 4, waitMs: 200 });
    worker.handler(async (job) => {
      seen.push(job.payload.n);
    });
    const running = worker.serve();
    await until(() => drained(client, "work"), "every job done");
    worker.stop();
    const report = await running;
    assert.deepEqual(
      seen.sort((a, b) => a - b),
      [...Array(20).keys()],
    );
    assert.equal(report.acked, 20);
  });

  test("a thrown error fails the job, retried after the backoff", async () => {
    await client.queue("failing").enqueue(unique("failing"), "flaky", { max_attempts: 3 });
    const attempts = [];
    const worker = new Worker(client, "failing", { waitMs: 200 });
    worker.handler(async (job) => {
      attempts.push(job.attempt);
      if (job.attempt < 2) throw new Error("the upstream broke");
    });
    const running = worker.serve();
    await until(() => drained(client, "failing"), "the job retried and done");
    worker.stop();
    const report = await running;
    assert.deepEqual(attempts, [1, 2]);
    assert.deepEqual([report.failed, report.acked], [1, 1]);
  });

  test("an upstream 429 pauses the group and costs no attempt", async () => {
    await client.queue("upstream").enqueue(unique("upstream"), "x");
    const attempts = [];
    const worker = new Worker(client, "upstream", { waitMs: 200 });
    worker.handler(async (job) => {
      attempts.push(job.attempt);
      if (attempts.length === 1) throw PauseGroup.fromResponse(new Response(null, { status: 429, headers: { "retry-after": "0.2" } }));
      if (attempts.length === 2) {
        const error = new Error("429 from an HTTP client");
        error.response = { status: 429, headers: new Headers({ "retry-after": "0.1" }) };
        throw error;
      }
    });
    const running = worker.serve();
    await until(async () => attempts.length === 3 && (await drained(client, "upstream")), "done after two pauses");
    worker.stop();
    const report = await running;
    assert.deepEqual(attempts, [1, 1, 1]);
    assert.deepEqual([report.paused, report.acked], [2, 1]);
  });

  test("a lost lease stops the work on its job", async () => {
    await client.queue("lost").enqueue(unique("lost"), "slow");
    let abortedBy;
    const worker = new Worker(client, "lost", { waitMs: 200, extendAt: 0.2 });
    worker.handler(async (job, signal) => {
      await client.queue("lost").ack(job); // someone else finished it
      await new Promise((resolve) =>
        signal.addEventListener("abort", () => {
          abortedBy = signal.reason;
          resolve();
        }),
      );
    });
    const running = worker.serve();
    await until(async () => abortedBy !== undefined, "the handler told its lease was lost");
    worker.stop();
    const report = await running;
    assert.equal(report.lost, 1);
    assert.equal(report.acked, 0);
  });

  test("shutting down hands back the jobs still running", async () => {
    const group = unique("shutdown");
    const enqueued = await client.queue("shutdown").enqueue(group, "long");
    let started;
    const isStarted = new Promise((resolve) => (started = resolve));
    const worker = new Worker(client, "shutdown", { waitMs: 200, shutdownGraceMs: 0 });
    worker.handler((job, signal) => {
      started();
      return new Promise((resolve) => signal.addEventListener("abort", () => resolve()));
    });
    const running = worker.serve();
    await isStarted;
    worker.stop();
    const report = await running;
    assert.equal(report.handedBack, 1);
    // Back in its group, which it does not pause, and the attempt it had is not spent.
    assert.equal((await client.queue("shutdown").stats()).groups[group].paused, false);
    const [again] = await client.queue("shutdown").lease("next", { waitMs: 5000 });
    assert.equal(again.id, enqueued.id);
    assert.equal(again.attempt, 1);
    await client.queue("shutdown").ack(again);
  });

  test("SIGTERM lets the running job finish, then the worker exits", async () => {
    await client.queue("sigterm").enqueue(unique("sigterm"), "job");
    const script = `
      import { Worker } from ${JSON.stringify(index)};
      const worker = new Worker(${JSON.stringify(service.url)}, "sigterm", { waitMs: 200 });
      worker.handler(async () => {
        console.log("started");
        await new Promise((r) => setTimeout(r, 300));
      });
      const report = await worker.run();
      console.log("acked", report.acked);
    `;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      await new Promise((resolve) =>
        child.stdout.on("data", (chunk) => {
          out += chunk;
          if (out.includes("started")) resolve();
        }),
      );
      child.kill("SIGTERM");
      assert.equal(await exited, 0);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
    assert.match(out, /acked 1/);
    assert.ok(await drained(client, "sigterm"));
  });
});
