// The rest of the queue's surface a producer or a worker needs, against a real service:
// priorities, costs and deduplication on enqueue; progress reports, results and the
// completed jobs; a job handed back; schedules; a group's policy; the queue's own pause;
// and a job whose payload nests 1,500 deep.

import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidArgument, UnknownSchedule } from "../dist/index.js";
import { describeEachStore, unique } from "./service.mjs";

/** How deep `value` nests arrays, each holding the next as its first item. */
function depthOf(value) {
  let levels = 0;
  while (Array.isArray(value) && value.length > 0) {
    value = value[0];
    levels += 1;
  }
  return levels;
}

describeEachStore("the queue's surface", (client, service) => {
  test("priority, cost and dedup on enqueue", async () => {
    const group = unique("dedup");
    const jobs = client.queue("jobs");
    const dedup = { key: group, ttl_ms: 60_000 };
    const first = await jobs.enqueue(group, "a", { priority: 5, cost: 2, dedup });
    const again = await jobs.enqueue({ group, payload: "b", dedup });
    assert.ok(first.created && !first.deduplicated);
    assert.equal(again.deduplicated, true);
    assert.equal(again.id, first.id);
    const info = await jobs.job(first.id);
    assert.deepEqual([info.priority, info.cost, info.payload], [5, 2, "a"]);
    await assert.rejects(jobs.enqueue(group, "c", { priority: 10 }), (e) => e instanceof InvalidArgument && e.field === "priority");
  });

  test("progress, then a result read back from the completed jobs", async () => {
    const group = unique("results");
    const q = client.queue("results");
    const enqueued = await q.enqueue(group, { n: 1 });
    const [job] = await q.lease("tester");
    await q.progress(job, { done: 40 });
    assert.deepEqual((await q.job(job.id)).progress, { done: 40 });
    await q.ack(job, { result: { total: 3, ok: true } });
    const info = await q.job(enqueued.id);
    assert.equal(info.state, "completed");
    assert.deepEqual(info.result, { total: 3, ok: true });
    assert.ok(info.finished_ms >= info.enqueued_ms);
    const completed = await q.jobs("completed", { limit: 1000 });
    assert.ok(completed.some((j) => j.id === enqueued.id));
    assert.ok((await q.stats()).completed >= 1);
  });

  test("a released job keeps its place and its attempt, and pauses nothing", async () => {
    const group = unique("release");
    const q = client.queue("release");
    await q.enqueue(group, "first");
    await q.enqueue(group, "second");
    const [job] = await q.lease("tester");
    await q.release(job);
    const counts = (await q.stats()).groups[group];
    assert.equal(counts.paused, false);
    assert.equal(counts.waiting, 2);
    const [again] = await q.lease("tester");
    assert.deepEqual([again.id, again.attempt, again.payload], [job.id, 1, "first"]);
    await q.ack(again);
    const [second] = await q.lease("tester");
    assert.equal(second.payload, "second");
    await q.ack(second);
  });

  test("schedules: put, read, listed, deleted", async () => {
    const group = unique("cron");
    const name = `nightly-${group.replace(/[^A-Za-z0-9._:-]/g, "")}`.slice(0, 120);
    const q = client.queue("jobs");
    const put = await q.putSchedule(name, { cron: "0 3 * * *", group, payload: { report: "daily" }, timezone: "Europe/Paris" });
    assert.deepEqual([put.cron, put.group, put.timezone], ["0 3 * * *", group, "Europe/Paris"]);
    assert.deepEqual(put.payload, { report: "daily" });
    assert.ok(put.next_ms > Date.now());
    assert.deepEqual(await q.schedule(name), put);
    assert.ok((await q.schedules()).some((s) => s.name === name));
    await assert.rejects(q.putSchedule(name, { cron: "not cron", group }), (e) => e instanceof InvalidArgument && e.field === "cron");
    await q.deleteSchedule(name);
    await assert.rejects(q.schedule(name), (e) => e instanceof UnknownSchedule);
    await assert.rejects(q.deleteSchedule(name), (e) => e instanceof UnknownSchedule);
  });

  test("a group's policy set, read and unset", async () => {
    const group = unique("policy");
    const spec = "fixed_window:limit=10,window=10s";
    const q = client.queue("jobs");
    const set = await q.setGroupPolicy(group, spec);
    assert.deepEqual(await q.groupPolicy(group), set);
    assert.deepEqual([set.policy, set.source, set.group], [spec, "run_time", group]);
    const unset = await q.setGroupPolicy(group, null);
    assert.notEqual(unset.source, "run_time");
    await assert.rejects(q.setGroupPolicy(group, "gcra:rate=0/s"), (e) => e instanceof InvalidArgument && e.field.startsWith("policy"));
  });

  test("the queue paused and resumed", async () => {
    const group = unique("paused");
    const q = client.queue("paused");
    const paused = await q.pause({ ms: 60_000 });
    assert.equal(paused.paused, true);
    assert.equal((await q.stats()).paused, true);
    await q.enqueue(group, 1);
    assert.deepEqual(await q.lease("tester"), []);
    assert.equal((await q.resume()).paused, false);
    const [job] = await q.lease("tester", { waitMs: 5000 });
    await q.ack(job, { result: null });
  });

  test("a payload nested 1,500 deep reads back", async () => {
    const group = unique("deep");
    const depth = 1500;
    const body = `{"group": "${group}", "payload": ${"[".repeat(depth)}${"]".repeat(depth)}}`;
    const raw = await fetch(`${service.url}/v1/queues/deep/jobs`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    assert.equal(raw.status, 201);
    const { id } = await raw.json();
    const q = client.queue("deep");
    const info = await q.job(id);
    const [waiting] = await q.jobs("waiting", { group });
    const [leased] = await q.lease("tester");
    await q.ack(leased);
    for (const payload of [info.payload, waiting.payload, leased.payload]) assert.equal(depthOf(payload), depth - 1);
  });
});
