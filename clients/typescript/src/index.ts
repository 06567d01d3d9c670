// @paceline/client: the TypeScript client of `paceline serve`.

export { Client, Lease, DEFAULT_URL, sleep } from "./client.js";
export type { ClientOptions, Op } from "./client.js";
export { Queue } from "./queue.js";
export type { Failure } from "./queue.js";
export { Worker, PauseGroup, Retry, Fatal, retryAfterMs, upstreamPauseOf } from "./worker.js";
export type { Handler, JobOf, Report, WorkerOptions } from "./worker.js";
export {
  PacelineError,
  InvalidArgument,
  Unauthenticated,
  InlinePoliciesDisabled,
  NotFound,
  UnknownPolicy,
  UnknownLease,
  UnknownQueue,
  UnknownJob,
  UnknownSchedule,
  Conflict,
  LeaseLost,
  PayloadTooLarge,
  ServiceUnavailable,
  RateLimited,
  errorFrom,
} from "./errors.js";
export type * from "./types.js";
export type { components, paths } from "./openapi.js";
