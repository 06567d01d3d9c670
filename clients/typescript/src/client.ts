// The client: decisions, sets, batches, concurrency leases, and the queues.

import { errorFrom, PacelineError, RateLimited, UnknownLease } from "./errors.js";
import { Queue } from "./queue.js";
import type { Decision, LeaseBody, Limit, Policies, SetDecision } from "./types.js";

export const DEFAULT_URL = "http://127.0.0.1:7373";

export interface ClientOptions {
  /** The service's token, when it has one (`Authorization: Bearer TOKEN`). */
  token?: string;
  /** How long a call may take, in ms (30 s by default; a queue lease's wait is added). */
  timeoutMs?: number;
  /** The `fetch` to call the service with (the global one by default). */
  fetch?: typeof fetch;
}

/** What a decision does. */
export type Op = "limit" | "pace" | "peek";

/** Resolves after `ms` (at once for 0), or rejects when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A client of `paceline serve` at `url`. */
export class Client {
  readonly url: string;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  private readonly fetcher: typeof fetch;

  constructor(url: string = DEFAULT_URL, options: ClientOptions = {}) {
    this.url = url.replace(/\/+$/, "");
    this.headers = { "content-type": "application/json", "user-agent": "paceline-client-ts/0.1.0" };
    if (options.token) this.headers["authorization"] = `Bearer ${options.token}`;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetcher = options.fetch ?? globalThis.fetch;
  }

  /** Sends one request; answers its status and JSON body (`undefined` when empty). */
  async request(
    method: string,
    path: string,
    body?: unknown,
    options: { signal?: AbortSignal; extraMs?: number } = {},
  ): Promise<{ status: number; body: unknown }> {
    const timeout = AbortSignal.timeout(this.timeoutMs + (options.extraMs ?? 0));
    const signal = options.signal ? AbortSignal.any([timeout, options.signal]) : timeout;
    const init: RequestInit = { method, headers: this.headers, signal };
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await this.fetcher(`${this.url}${path}`, init);
    const text = await response.text();
    let parsed: unknown = undefined;
    if (text.length > 0) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = text;
      }
    }
    return { status: response.status, body: parsed };
  }

  /** Sends one request and answers its body, or throws the typed error of a failure. */
  async call<T>(
    method: string,
    path: string,
    body?: unknown,
    options?: { signal?: AbortSignal; extraMs?: number },
  ): Promise<T> {
    const answer = await this.request(method, path, body, options);
    if (answer.status >= 400) throw errorFrom(answer.status, answer.body);
    return answer.body as T;
  }

  private async decision<T>(body: Record<string, unknown>): Promise<T> {
    const answer = await this.request("POST", "/v1/decisions", body);
    if (answer.status === 200 || answer.status === 429) return answer.body as T;
    throw errorFrom(answer.status, answer.body);
  }

  /** Admits or refuses now: refused (`allowed` false), nothing is counted and `delay_ms`
   * says when to ask again. */
  limit(policy: string, key: string, cost = 1): Promise<Decision> {
    return this.decision({ policy, key, op: "limit", cost });
  }

  /** What `limit` would answer, changing nothing. */
  peek(policy: string, key: string, cost = 1): Promise<Decision> {
    return this.decision({ policy, key, op: "peek", cost });
  }

  /** Books the earliest slot the limit allows and (unless `sleep: false`) waits until it.
   * With `maxWaitMs`, a longer wait is refused (`allowed` false) without booking. */
  async pace(
    policy: string,
    key: string,
    options: { cost?: number; maxWaitMs?: number; sleep?: boolean; signal?: AbortSignal } = {},
  ): Promise<Decision> {
    const body: Record<string, unknown> = { policy, key, op: "pace", cost: options.cost ?? 1 };
    if (options.maxWaitMs !== undefined) body["max_wait_ms"] = options.maxWaitMs;
    const d = await this.decision<Decision>(body);
    if (d.allowed && d.delay_ms > 0 && options.sleep !== false) await sleep(d.delay_ms, options.signal);
    return d;
  }

  /** Several limits decided as one: admitted only if every limit admits (each counts it);
   * refused, none changes. `op: "pace"` books the earliest time every limit admits and
   * waits until it. */
  async limits(
    limits: Array<Limit | [string, string]>,
    options: { op?: Op; cost?: number; maxWaitMs?: number; sleep?: boolean } = {},
  ): Promise<SetDecision> {
    const op = options.op ?? "limit";
    const body: Record<string, unknown> = {
      limits: limits.map((l) => (Array.isArray(l) ? { policy: l[0], key: l[1] } : l)),
      op,
      cost: options.cost ?? 1,
    };
    if (options.maxWaitMs !== undefined) body["max_wait_ms"] = options.maxWaitMs;
    const d = await this.decision<SetDecision>(body);
    if (op === "pace" && d.allowed && d.delay_ms > 0 && options.sleep !== false) await sleep(d.delay_ms);
    return d;
  }

  /** Up to 1000 single decisions in one call, answered in order; an entry that failed is
   * its typed error (not thrown). */
  async batch(requests: Limit[], op: Op = "limit"): Promise<Array<Decision | PacelineError>> {
    const answers = await this.call<Array<Record<string, unknown>>>(
      "POST",
      "/v1/decisions/batch",
      requests.map((r) => ({ ...r, op })),
    );
    return answers.map((a) =>
      "error" in a ? errorFrom(Number(a["status"] ?? 400), a) : (a as unknown as Decision),
    );
  }

  /** Takes a lease of a `concurrency` policy now (`RateLimited` when its limit's leases
   * are all live); give it back with `release()`, or use `withLease`. */
  async lease(policy: string, key: string, cost = 1): Promise<Lease> {
    const answer = await this.request("POST", "/v1/leases", { policy, key, cost });
    if (answer.status === 429) {
      const d = answer.body as Decision;
      throw new RateLimited(d.policy ?? policy, d.delay_ms ?? 0);
    }
    if (answer.status >= 400) throw errorFrom(answer.status, answer.body);
    return new Lease(this, answer.body as LeaseBody);
  }

  /** Runs `work` holding a lease of a `concurrency` policy, and gives it back after,
   * whatever `work` does. */
  async withLease<T>(policy: string, key: string, work: (lease: Lease) => Promise<T>, cost = 1): Promise<T> {
    const lease = await this.lease(policy, key, cost);
    try {
      return await work(lease);
    } finally {
      await lease.release();
    }
  }

  /** The configured policies. */
  policies(): Promise<Policies> {
    return this.call("GET", "/v1/policies");
  }

  /** The queue `name` of the service's config. */
  queue(name: string): Queue {
    return new Queue(this, name);
  }
}

/** A concurrency lease: `extend()` it while the work goes on, `release()` it when it ends. */
export class Lease {
  readonly token: string | null;
  released = false;
  constructor(
    private readonly client: Client,
    readonly body: LeaseBody,
  ) {
    this.token = body.lease ?? null;
  }

  /** The lease lives its policy's `lease` from now; the ms it has left. */
  async extend(): Promise<number> {
    if (this.token === null) return this.body.expires_ms;
    const answer = await this.client.call<{ expires_ms: number }>(
      "POST",
      `/v1/leases/${encodeURIComponent(this.token)}/extend`,
    );
    return answer.expires_ms;
  }

  /** Gives the lease back (once; a lease reclaimed already is no error). */
  async release(): Promise<void> {
    if (this.released || this.token === null) return;
    this.released = true;
    try {
      await this.client.call("DELETE", `/v1/leases/${encodeURIComponent(this.token)}`);
    } catch (e) {
      if (!(e instanceof UnknownLease)) throw e;
    }
  }
}
