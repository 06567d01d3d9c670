// The queue's producer calls and a worker's own calls, against a real service.

import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidArgument, LeaseLost, PacelineError, UnknownJob, UnknownQueue } from "../dist/index.js";
import { describeEachStore, unique } from "./service.mjs";

describeEachStore("the queue", (client) => {
  test("enqueue answers the estimated start; an id is enqueued once", async () => {
    const group = unique("g");
    const jobs = client.queue("jobs");
    const before = Date.now() - 5000;
    const first = await jobs.enqueue(group, { user: 7, role: 3 }, { id: `${group}-1` });
    const again = await jobs.enqueue({ group, payload: 1, id: `${group}-1` });
    const later = await jobs.enqueue(group, null, { delay_ms: 3_600_000 });
    assert.ok(first.created);
    assert.equal(again.created, false);
    assert.equal(again.id, first.id);
    assert.equal(first.state, "waiting");
    assert.ok(first.estimated_start_ms >= before);
    assert.equal(later.state, "scheduled");
    assert.ok(later.estimated_start_ms > first.estimated_start_ms + 1_800_000);
    const info = await jobs.job(first.id);
    assert.deepEqual(info.payload, { user: 7, role: 3 });
  });

  test("a batch enqueues each job on its own", async () => {
    const group = unique("batch");
    const [ok, bad, ok2] = await client
      .queue("jobs")
      .enqueueBatch([{ group, payload: 1 }, { group: "", payload: 2 }, { group, payload: 3, max_attempts: 2 }]);
    assert.ok(!(ok instanceof PacelineError) && ok.created);
    assert.ok(bad instanceof InvalidArgument);
    assert.equal(bad.field, "group");
    assert.ok(!(ok2 instanceof PacelineError));
  });

  test("lease, extend, pause-fail, ack by hand, and a lost lease", async () => {
    const group = unique("manual");
    const q = client.queue("manual");
    await q.enqueue(group, "a", { id: `${group}-a` });
    const [job] = await q.lease("tester", { maxJobs: 10 });
    assert.equal(job.id, `${group}-a`);
    assert.equal(job.attempt, 1);
    assert.ok((await q.extend(job, 60_000)) > job.lease_expires_ms);
    await q.fail(job, { error: "upstream 429", pauseGroupMs: 1 });
    const [again] = await q.lease("tester", { maxJobs: 10, waitMs: 5000 });
    assert.equal(again.id, job.id);
    assert.equal(again.attempt, 1);
    await q.ack(again);
    await assert.rejects(q.extend(again), (e) => e instanceof LeaseLost || e instanceof UnknownJob);
    await assert.rejects(q.job(job.id), (e) => e instanceof UnknownJob && e.field === "id");
    await assert.rejects(q.ack({ id: job.id, lease: "nope" }), (e) => e instanceof InvalidArgument && e.field === "lease");
  });

  test("an unknown queue is a typed error", async () => {
    await assert.rejects(client.queue("nope").stats(), (e) => e instanceof UnknownQueue && e.status === 404);
  });

  test("pause and resume a group", async () => {
    const group = unique("pause");
    const q = client.queue("jobs");
    await q.enqueue(group, 1);
    const waiting = await q.jobs("waiting", { group });
    assert.equal(waiting.length, 1);
    assert.equal(waiting[0].group, group);
    await q.pause({ group, ms: 60_000 });
    assert.equal((await q.stats()).groups[group].paused, true);
    await q.resume({ group });
    assert.equal((await q.stats()).groups[group].paused, false);
  });
});
