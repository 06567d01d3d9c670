// A queue worker: leases jobs as their groups' limits allow, runs a handler on each, keeps
// each lease alive in the background, and acks, fails, pauses or hands back each job.

import { hostname } from "node:os";

import { Client } from "./client.js";
import { LeaseLost, PacelineError } from "./errors.js";
import type { Queue, Failure } from "./queue.js";
import type { Job } from "./types.js";

/** A leased job whose payload is of type `P` (the JSON its producer gave). */
export type JobOf<P> = Omit<Job, "payload"> & { payload: P };

/** Works on one job. `signal` aborts when the job's lease is lost, or when the worker shuts
 * down past its grace: stop working on the job then. */
export type Handler<P = unknown> = (job: JobOf<P>, signal: AbortSignal) => Promise<void> | void;

/** Throw it from a handler when the upstream refused with a 429: the job's whole group
 * starts nothing for `retryAfterMs`, and the job keeps its place at the group's head,
 * costing no attempt. */
export class PauseGroup extends Error {
  constructor(
    readonly retryAfterMs: number,
    message?: string,
  ) {
    super(message ?? `upstream rate limit: retry after ${retryAfterMs} ms`);
    this.name = "PauseGroup";
  }

  /** The pause a 429 `Response` asks for (its `Retry-After`, in seconds or as a date). */
  static fromResponse(response: Response): PauseGroup {
    return new PauseGroup(retryAfterMs(response.headers.get("retry-after")), `upstream ${response.status}`);
  }
}

/** Throw it from a handler to retry the job after `retryAfterMs` (in place of the queue's
 * backoff). */
export class Retry extends Error {
  constructor(
    readonly retryAfterMs: number,
    message?: string,
  ) {
    super(message ?? `retry after ${retryAfterMs} ms`);
    this.name = "Retry";
  }
}

/** Throw it from a handler when retrying cannot help: the job is dead at once. */
export class Fatal extends Error {
  constructor(message = "fatal") {
    super(message);
    this.name = "Fatal";
  }
}

/** A `Retry-After` header's value in ms (seconds, or an HTTP date); 1 s without one. */
export function retryAfterMs(value: string | null | undefined): number {
  const text = (value ?? "").trim();
  if (text === "") return 1000;
  const seconds = Number(text);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(text);
  return Number.isNaN(at) ? 1000 : Math.max(0, at - Date.now());
}

/** The pause an error thrown for an upstream's 429 asks for: an error carrying a 429
 * `response` (as thrown by most HTTP clients) or a `status` of 429 with `headers`. */
export function upstreamPauseOf(error: unknown): number | undefined {
  if (error === null || typeof error !== "object") return undefined;
  const e = error as { response?: unknown; status?: unknown; headers?: unknown };
  const response = (e.response ?? e) as { status?: unknown; headers?: unknown };
  if (response.status !== 429) return undefined;
  const headers = response.headers;
  let value: string | null | undefined;
  if (headers instanceof Headers) value = headers.get("retry-after");
  else if (headers !== null && typeof headers === "object") {
    const raw = (headers as Record<string, unknown>)["retry-after"];
    value = raw === undefined ? undefined : String(raw);
  }
  return retryAfterMs(value);
}

export interface WorkerOptions {
  /** The worker's name, as the service shows it (`host:pid` by default). */
  name?: string;
  /** How many jobs at once (1 by default). */
  concurrency?: number;
  /** The leases' length in ms (the queue's by default). */
  leaseMs?: number;
  /** Each lease is extended every `extendAt` of its length (0.5 by default). */
  extendAt?: number;
  /** How long a lease call waits for a job, in ms (5 s by default). */
  waitMs?: number;
  /** On shutdown, how long the jobs running may take to finish, in ms (30 s by default);
   * then they are handed back to their groups. */
  shutdownGraceMs?: number;
  /** The service's token, when the worker is given a URL. */
  token?: string;
}

/** What a worker did. */
export interface Report {
  acked: number;
  failed: number;
  paused: number;
  lost: number;
  handedBack: number;
}

class LostLease extends Error {}
class ShutDown extends Error {}

/** Runs a handler on the jobs of a queue, `concurrency` at a time: see the README. `P` is
 * the type of the jobs' payloads. */
export class Worker<P = unknown> {
  readonly client: Client;
  readonly queue: Queue;
  readonly name: string;
  readonly report: Report = { acked: 0, failed: 0, paused: 0, lost: 0, handedBack: 0 };
  private readonly concurrency: number;
  private readonly leaseMs: number | undefined;
  private readonly extendAt: number;
  private readonly waitMs: number;
  private readonly graceMs: number;
  private work?: Handler<P>;
  private stopping = new AbortController();
  private readonly jobs = new Set<AbortController>();

  constructor(client: Client | string, queue: string, options: WorkerOptions = {}) {
    this.client = typeof client === "string" ? new Client(client, { token: options.token }) : client;
    this.queue = this.client.queue(queue);
    this.name = options.name ?? `${hostname()}:${process.pid}`;
    this.concurrency = options.concurrency ?? 1;
    this.leaseMs = options.leaseMs;
    this.extendAt = options.extendAt ?? 0.5;
    this.waitMs = options.waitMs ?? 5000;
    this.graceMs = options.shutdownGraceMs ?? 30_000;
    if (!(this.concurrency >= 1)) throw new RangeError("concurrency must be at least 1");
    if (!(this.extendAt > 0 && this.extendAt < 1)) throw new RangeError("extendAt is a fraction between 0 and 1");
  }

  /** Sets the function that works on one job (async or not); answers it. */
  handler<H extends Handler<P>>(fn: H): H {
    this.work = fn;
    return fn;
  }

  /** Stops leasing; the jobs running finish (or are handed back after the grace). */
  stop(): void {
    this.stopping.abort(new ShutDown("the worker is stopping"));
  }

  /** Runs until SIGTERM or SIGINT, then shuts down gracefully. */
  async run(): Promise<Report> {
    const onSignal = () => this.stop();
    process.once("SIGTERM", onSignal);
    process.once("SIGINT", onSignal);
    try {
      return await this.serve();
    } finally {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    }
  }

  /** Works until `stop()`. */
  async serve(): Promise<Report> {
    if (this.work === undefined) throw new Error("no handler: set one with worker.handler(fn)");
    if (this.stopping.signal.aborted) this.stopping = new AbortController();
    const stopped = new Promise<void>((resolve) =>
      this.stopping.signal.addEventListener("abort", () => resolve(), { once: true }),
    );
    const running = new Set<Promise<void>>();
    while (!this.stopping.signal.aborted) {
      const free = this.concurrency - running.size;
      if (free <= 0) {
        await Promise.race([stopped, ...running]);
        continue;
      }
      let leased: Job[];
      try {
        leased = await this.queue.lease(this.name, {
          maxJobs: free,
          leaseMs: this.leaseMs,
          waitMs: this.waitMs,
          signal: this.stopping.signal,
        });
      } catch (e) {
        // A lease call given up at shutdown: the service puts back what it leased for it.
        if (this.stopping.signal.aborted) break;
        console.warn(`paceline: leasing from ${this.queue.name} failed: ${String(e)}`);
        await Promise.race([stopped, new Promise((r) => setTimeout(r, 1000))]);
        continue;
      }
      for (const job of leased) {
        const done: Promise<void> = this.runJob(job).finally(() => running.delete(done));
        running.add(done);
      }
    }
    await this.shutDown(running);
    return this.report;
  }

  private async shutDown(running: Set<Promise<void>>): Promise<void> {
    if (running.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const grace = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, this.graceMs);
    });
    await Promise.race([Promise.all(running), grace]);
    clearTimeout(timer);
    for (const job of this.jobs) job.abort(new ShutDown("the worker shut down"));
    await Promise.all(running);
  }

  private async runJob(job: Job): Promise<void> {
    const handler = this.work;
    if (handler === undefined) return;
    const control = new AbortController();
    this.jobs.add(control);
    const length = this.leaseMs ?? Math.max(1, job.lease_expires_ms - job.started_ms);
    const extender = setInterval(() => {
      this.queue.extend(job, this.leaseMs).catch((e: unknown) => {
        if (e instanceof LeaseLost) control.abort(new LostLease(`job ${job.id}: its lease was lost`));
        else console.warn(`paceline: extending job ${job.id}'s lease failed: ${String(e)}`);
      });
    }, Math.max(1, length * this.extendAt));
    const aborted = new Promise<never>((_, reject) =>
      control.signal.addEventListener("abort", () => reject(control.signal.reason), { once: true }),
    );
    // An abort after the handler is done (a late extension found the lease lost) is no
    // one's to catch.
    aborted.catch(() => undefined);
    let error: unknown = undefined;
    let failed = false;
    try {
      await Promise.race([Promise.resolve().then(() => handler(job as JobOf<P>, control.signal)), aborted]);
    } catch (e) {
      error = e;
      failed = true;
    } finally {
      clearInterval(extender);
      this.jobs.delete(control);
    }
    if (control.signal.reason instanceof LostLease) {
      console.warn(`paceline: job ${job.id}: its lease was lost; stopped working on it`);
      this.report.lost += 1;
      return;
    }
    if (control.signal.reason instanceof ShutDown) {
      await this.settle(job, "handedBack", { release: true });
      return;
    }
    if (!failed) {
      await this.settle(job, "acked");
    } else if (error instanceof PauseGroup) {
      await this.settle(job, "paused", { pauseGroupMs: error.retryAfterMs, error: error.message });
    } else if (error instanceof Retry) {
      await this.settle(job, "failed", { retryAfterMs: error.retryAfterMs, error: error.message });
    } else if (error instanceof Fatal) {
      await this.settle(job, "failed", { fatal: true, error: error.message });
    } else {
      const pause = upstreamPauseOf(error);
      if (pause !== undefined) {
        await this.settle(job, "paused", { pauseGroupMs: pause, error: `upstream 429: ${String(error)}` });
      } else {
        await this.settle(job, "failed", { error: String(error) });
      }
    }
  }

  private async settle(job: Job, outcome: keyof Report, failure?: Failure): Promise<void> {
    try {
      if (failure === undefined) await this.queue.ack(job);
      else await this.queue.fail(job, failure);
    } catch (e) {
      if (e instanceof LeaseLost) {
        console.warn(`paceline: job ${job.id}: its lease was lost before it was ${outcome}`);
        this.report.lost += 1;
        return;
      }
      if (e instanceof PacelineError || e instanceof Error) {
        console.warn(`paceline: job ${job.id} could not be ${outcome}: ${e.message}`);
        return;
      }
      throw e;
    }
    this.report[outcome] += 1;
  }
}
