// The service's bodies, as its OpenAPI document (docs/openapi.json) describes them.

import type { components } from "./openapi.js";

type Schemas = components["schemas"];

/** One limit's answer (`allowed`, `delay_ms`, `remaining`, ...). */
export type Decision = Schemas["Decision"];
/** A set of limits decided as one, with each limit's own answer in `limits`. */
export type SetDecision = Schemas["SetDecision"];
/** A single-limit decision request. */
export type DecisionRequest = Schemas["DecisionRequest"];
/** One limit of a set. */
export type Limit = Schemas["DecisionLimit"];
/** A lease of a concurrency policy, as taken. */
export type LeaseBody = Schemas["Lease"];
/** The service's error body. */
export type ErrorAnswer = Schemas["ErrorAnswer"];
/** A job to enqueue. */
export type NewJob = Schemas["EnqueueRequest"];
/** A job enqueued (`created`: new, not found under its id already). */
export type Enqueued = Schemas["Enqueued"] & { created: boolean };
/** A leased job: work on it while its `lease` lives. */
export type Job = Schemas["LeasedJob"];
/** A job as `GET .../jobs/{id}` shows it. */
export type JobInfo = Schemas["Job"];
/** A queue's counts, and each group's. */
export type QueueStats = Schemas["QueueStats"];
/** A pause or a resume's answer. */
export type Paused = Schemas["Paused"];
/** A group's policy and where it comes from. */
export type GroupPolicy = Schemas["GroupPolicy"];
/** The configured policies. */
export type Policies = Schemas["Policies"];
/** A lease call's options. */
export type LeaseRequest = Schemas["QueueLeaseRequest"];
/** A failure's report. */
export type FailRequest = Schemas["FailRequest"];
/** A schedule: a job enqueued at each tick of its cron expression. */
export type Schedule = Schemas["Schedule"];
/** A schedule as put: `cron`, `group`, and optionally `payload` and `timezone` (an IANA
 * time zone's name, e.g. `Europe/Paris`; the document lists them). */
export type ScheduleRequest = Omit<Schemas["ScheduleRequest"], "timezone"> & { timezone?: string | null };
/** The states jobs are listed by. */
export type JobState = "scheduled" | "waiting" | "active" | "dead" | "completed";
