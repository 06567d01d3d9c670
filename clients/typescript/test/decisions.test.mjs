// Decisions, sets, batches, concurrency leases and typed errors, against a real service.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, Conflict, InvalidArgument, PacelineError, RateLimited, Unauthenticated, UnknownPolicy } from "../dist/index.js";
import { describeEachStore, startService, unique } from "./service.mjs";

describeEachStore("decisions", (client) => {
  test("limit admits the burst, then refuses with a delay", async () => {
    const key = unique("limit");
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await client.limit("gcra:rate=1/m,burst=2", key));
    assert.deepEqual(
      answers.map((d) => d.allowed),
      [true, true, false],
    );
    assert.equal(answers[0].policy, "inline");
    assert.equal(answers[0].limit, 2);
    assert.ok(answers[2].delay_ms > 30_000 && answers[2].delay_ms <= 60_000);
  });

  test("a configured policy by name; peek changes nothing", async () => {
    const key = unique("peek");
    const peeks = [await client.peek("api", key), await client.peek("api", key)];
    assert.ok(peeks.every((d) => d.allowed));
    assert.equal(peeks[0].remaining, peeks[1].remaining);
    const taken = await client.limit("api", key);
    assert.equal(taken.policy, "api");
    assert.equal(taken.remaining, 1);
  });

  test("pace books a slot each; a wait over maxWaitMs is refused", async () => {
    const key = unique("pace");
    for (let i = 0; i < 3; i++) assert.ok((await client.pace("pacer:rate=1000/s", key)).allowed);
    assert.ok((await client.pace("pacer:rate=1/m", key)).allowed);
    const refused = await client.pace("pacer:rate=1/m", key, { maxWaitMs: 500 });
    assert.equal(refused.allowed, false);
    assert.ok(refused.delay_ms > 500);
  });

  test("a set of limits is admitted only if every limit admits", async () => {
    const key = unique("set");
    const limits = [
      { policy: "gcra:rate=1/m,burst=1", key: `${key}:a` },
      ["gcra:rate=1/m,burst=5", `${key}:b`],
    ];
    const first = await client.limits(limits);
    const second = await client.limits(limits);
    assert.ok(first.allowed);
    assert.equal(second.allowed, false);
    assert.deepEqual(
      second.limits.map((l) => l.allowed),
      [false, true],
    );
    assert.equal((await client.peek("gcra:rate=1/m,burst=5", `${key}:b`)).remaining, 4);
  });

  test("a batch answers in order, an error in its place", async () => {
    const key = unique("batch");
    const [first, missing, again] = await client.batch([
      { policy: "gcra:rate=1/m,burst=1", key },
      { policy: "no-such-policy", key },
      { policy: "gcra:rate=1/m,burst=1", key },
    ]);
    assert.ok(!(first instanceof PacelineError) && first.allowed);
    assert.ok(missing instanceof UnknownPolicy);
    assert.equal(missing.field, "policy");
    assert.ok(!(again instanceof PacelineError) && !again.allowed);
  });

  test("errors carry the service's code and field", async () => {
    await assert.rejects(client.limit("uploads", unique("e")), (e) => {
      assert.ok(e instanceof UnknownPolicy);
      assert.deepEqual([e.status, e.code, e.field], [404, "unknown_policy", "policy"]);
      return true;
    });
    await assert.rejects(client.limit("api", ""), (e) => e instanceof InvalidArgument && e.field === "key");
    await assert.rejects(client.limit("api", "k", 0), (e) => e instanceof InvalidArgument && e.field === "cost");
    // More than `api` (a burst of 2) can ever admit: a conflict with the policy, nothing counted.
    const key = unique("beyond");
    await assert.rejects(client.limit("api", key, 3), (e) => {
      assert.ok(e instanceof Conflict);
      assert.deepEqual([e.status, e.code, e.field], [409, "conflict", "cost"]);
      assert.match(e.detail, /at most 2/);
      return true;
    });
    assert.equal((await client.limit("api", key, 2)).allowed, true);
  });

  test("a lease is held while its work runs and given back after", async () => {
    const key = unique("lease");
    const policy = "concurrency:limit=1,lease=30s";
    await client.withLease(policy, key, async (lease) => {
      assert.ok(lease.token);
      const left = await lease.extend();
      assert.ok(left > 0 && left <= 30_000);
      await assert.rejects(client.lease(policy, key), (e) => e instanceof RateLimited && e.retryAfterMs > 0);
    });
    const again = await client.lease(policy, key);
    assert.ok(again.token);
    await again.release();
    await again.release();
  });
});

describe("a service with a token", () => {
  let service;
  before(async () => {
    service = await startService("memory", ["--auth-token", "s3cret-token"]);
  });
  after(async () => service?.stop());

  test("the token is sent, and a wrong one is a typed error", async () => {
    const key = unique("token");
    assert.ok((await new Client(service.url, { token: "s3cret-token" }).limit("api", key)).allowed);
    await assert.rejects(new Client(service.url, { token: "wrong" }).limit("api", key), (e) => {
      assert.ok(e instanceof Unauthenticated);
      assert.deepEqual([e.status, e.code, e.field], [401, "unauthenticated", "authorization"]);
      return true;
    });
  });
});
