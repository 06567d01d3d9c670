// A queue's producer calls, and a worker's own (which `Worker` makes for you).

import type { Client } from "./client.js";
import { errorFrom, PacelineError } from "./errors.js";
import type {
  Enqueued,
  GroupPolicy,
  Job,
  JobInfo,
  JobState,
  NewJob,
  Paused,
  QueueStats,
  Schedule,
  ScheduleRequest,
} from "./types.js";

/** How a failed job is reported. */
export interface Failure {
  /** What went wrong, kept as the job's `last_error`. */
  error?: string;
  /** Retry after this many ms, in place of the queue's backoff. */
  retryAfterMs?: number;
  /** An upstream's 429: the job's group pauses this many ms, and the job goes back to its
   * head, costing no attempt. */
  pauseGroupMs?: number;
  /** Retrying cannot help: the job is dead at once. */
  fatal?: boolean;
  /** Hand the job back (a worker shutting down before it did the work): it keeps its place
   * at its group's head and costs no attempt. Nothing else goes with it. */
  release?: boolean;
}

const seg = encodeURIComponent;

export class Queue {
  constructor(
    private readonly client: Client,
    readonly name: string,
  ) {}

  private path(rest = ""): string {
    return `/v1/queues/${seg(this.name)}${rest}`;
  }

  /** Enqueues a job (`group` and any JSON `payload`, or a whole `NewJob`);
   * `estimated_start_ms` says when it should start. */
  async enqueue(job: NewJob | string, payload?: unknown, options: Omit<NewJob, "group" | "payload"> = {}): Promise<Enqueued> {
    const body: NewJob = typeof job === "string" ? { ...options, group: job, payload: payload ?? null } : job;
    const answer = await this.client.request("POST", this.path("/jobs"), body);
    if (answer.status >= 400) throw errorFrom(answer.status, answer.body);
    return { ...(answer.body as Omit<Enqueued, "created">), created: answer.status === 201 };
  }

  /** Up to 1000 jobs, each enqueued on its own (a refused one is its typed error, not
   * thrown). */
  async enqueueBatch(jobs: NewJob[]): Promise<Array<Enqueued | PacelineError>> {
    const answers = await this.client.call<Array<Record<string, unknown>>>("POST", this.path("/jobs/batch"), jobs);
    return answers.map((a) => {
      const status = Number(a["status"] ?? 400);
      if ("error" in a) return errorFrom(status, a);
      return { ...(a as unknown as Omit<Enqueued, "created">), created: status === 201 };
    });
  }

  /** The jobs that may start now, waiting up to `waitMs` for one. */
  async lease(
    worker: string,
    options: { maxJobs?: number; leaseMs?: number; waitMs?: number; requestId?: string; signal?: AbortSignal } = {},
  ): Promise<Job[]> {
    const body: Record<string, unknown> = { worker, max_jobs: options.maxJobs ?? 1 };
    if (options.leaseMs !== undefined) body["lease_ms"] = options.leaseMs;
    if (options.waitMs !== undefined) body["wait_ms"] = options.waitMs;
    if (options.requestId !== undefined) body["request_id"] = options.requestId;
    const answer = await this.client.call<{ jobs: Job[] }>("POST", this.path("/leases"), body, {
      signal: options.signal,
      extraMs: options.waitMs ?? 0,
    });
    return answer.jobs;
  }

  /** The job is done (`LeaseLost` if its lease is no longer this one). `result` (any JSON,
   * `null` included) is kept with it while the queue keeps completed jobs
   * (`keep_completed`), shown as its `result`. */
  async ack(job: Pick<Job, "id" | "lease">, options: { result?: unknown } = {}): Promise<void> {
    const body: Record<string, unknown> = { lease: job.lease };
    if ("result" in options) body["result"] = options.result ?? null;
    await this.client.call("POST", this.path(`/jobs/${seg(job.id)}/ack`), body);
  }

  /** Reports how far the job has got (any JSON but `null`), shown as its `progress`
   * (`LeaseLost` if its lease is no longer this one). */
  async progress(job: Pick<Job, "id" | "lease">, progress: unknown): Promise<void> {
    await this.client.call("POST", this.path(`/jobs/${seg(job.id)}/progress`), { lease: job.lease, progress });
  }

  /** Hands the job back before working on it: it keeps its place at its group's head and
   * costs no attempt. */
  async release(job: Pick<Job, "id" | "lease">): Promise<void> {
    await this.fail(job, { release: true });
  }

  /** The job failed: retried after the queue's backoff (or `retryAfterMs`), dead if
   * `fatal` or out of attempts; `pauseGroupMs` pauses its group instead, costing the job
   * no attempt. */
  async fail(job: Pick<Job, "id" | "lease">, failure: Failure = {}): Promise<void> {
    const body: Record<string, unknown> = { lease: job.lease };
    if (failure.release) {
      await this.client.call("POST", this.path(`/jobs/${seg(job.id)}/fail`), { ...body, release: true });
      return;
    }
    if (failure.error !== undefined) body["error"] = failure.error.slice(0, 4096);
    if (failure.retryAfterMs !== undefined) body["retry_after_ms"] = failure.retryAfterMs;
    if (failure.pauseGroupMs !== undefined) body["pause_group_ms"] = failure.pauseGroupMs;
    if (failure.fatal) body["fatal"] = true;
    await this.client.call("POST", this.path(`/jobs/${seg(job.id)}/fail`), body);
  }

  /** The job's lease lives `leaseMs` (the queue's lease by default) from now; its new
   * expiry, in Unix ms. */
  async extend(job: Pick<Job, "id" | "lease">, leaseMs?: number): Promise<number> {
    const body: Record<string, unknown> = { lease: job.lease };
    if (leaseMs !== undefined) body["lease_ms"] = leaseMs;
    const answer = await this.client.call<{ lease_expires_ms: number }>(
      "POST",
      this.path(`/jobs/${seg(job.id)}/extend`),
      body,
    );
    return answer.lease_expires_ms;
  }

  job(id: string): Promise<JobInfo> {
    return this.client.call("GET", this.path(`/jobs/${seg(id)}`));
  }

  async cancel(id: string): Promise<void> {
    await this.client.call("DELETE", this.path(`/jobs/${seg(id)}`));
  }

  stats(): Promise<QueueStats> {
    return this.client.call("GET", this.path());
  }

  /** The queue (or one `group`) starts nothing for `ms`, or until resumed. */
  pause(options: { ms?: number; group?: string } = {}): Promise<Paused> {
    const path = options.group === undefined ? this.path("/pause") : this.path(`/groups/${seg(options.group)}/pause`);
    return this.client.call("POST", path, options.ms === undefined ? {} : { ms: options.ms });
  }

  resume(options: { group?: string } = {}): Promise<Paused> {
    const path = options.group === undefined ? this.path("/resume") : this.path(`/groups/${seg(options.group)}/resume`);
    return this.client.call("POST", path);
  }

  /** The group's policy, and where it comes from (`run_time`: set through the API). */
  groupPolicy(group: string): Promise<GroupPolicy> {
    return this.client.call("GET", this.path(`/groups/${seg(group)}/policy`));
  }

  /** The group's policy from now on, kept by the service's store (`null`: the config's
   * again). */
  setGroupPolicy(group: string, policy: string | null): Promise<GroupPolicy> {
    const path = this.path(`/groups/${seg(group)}/policy`);
    return policy === null ? this.client.call("DELETE", path) : this.client.call("PUT", path, { policy });
  }

  /** The jobs in `state`, in the order the queue keeps them; `group`: one group's waiting
   * line; `offset` and `limit` (1 to 1000) page them. */
  async jobs(
    state: JobState,
    options: { group?: string; offset?: number; limit?: number } = {},
  ): Promise<JobInfo[]> {
    const query = new URLSearchParams({
      state,
      offset: String(options.offset ?? 0),
      limit: String(options.limit ?? 100),
    });
    if (options.group !== undefined) query.set("group", options.group);
    const answer = await this.client.call<{ jobs: JobInfo[] }>("GET", this.path(`/jobs?${query}`));
    return answer.jobs;
  }

  async dead(offset = 0, limit = 100): Promise<JobInfo[]> {
    const answer = await this.client.call<{ jobs: JobInfo[] }>("GET", this.path(`/dead?offset=${offset}&limit=${limit}`));
    return answer.jobs;
  }

  async retryDead(ids?: string[]): Promise<number> {
    const answer = await this.client.call<{ retried: number }>("POST", this.path("/dead/retry"), ids ? { ids } : {});
    return answer.retried;
  }

  async purgeDead(): Promise<number> {
    const answer = await this.client.call<{ purged: number }>("DELETE", this.path("/dead"));
    return answer.purged;
  }

  /** A job enqueued into `group` with `payload` at each tick of `cron` (five fields, or six
   * with seconds first; in `timezone`, UTC by default), once per tick across every
   * instance. Put again, the same schedule keeps its next tick. */
  putSchedule(name: string, schedule: ScheduleRequest): Promise<Schedule> {
    return this.client.call("PUT", this.path(`/schedules/${seg(name)}`), schedule);
  }

  /** The schedule `name` (`UnknownSchedule` if there is none). */
  schedule(name: string): Promise<Schedule> {
    return this.client.call("GET", this.path(`/schedules/${seg(name)}`));
  }

  /** Every schedule of the queue, with its next tick. */
  async schedules(): Promise<Schedule[]> {
    const answer = await this.client.call<{ schedules: Schedule[] }>("GET", this.path("/schedules"));
    return answer.schedules;
  }

  /** Removes the schedule `name` (`UnknownSchedule` if there is none). */
  async deleteSchedule(name: string): Promise<void> {
    await this.client.call("DELETE", this.path(`/schedules/${seg(name)}`));
  }
}
