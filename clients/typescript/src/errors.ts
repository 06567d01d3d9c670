// Typed errors: every failure the service answers, with its error code and field.

/** A request the service refused or failed: its HTTP `status`, the error `code`
 * (`invalid_argument`, `unknown_queue`, `lease_lost`, ...), the `field` at fault (`key`,
 * `limits[1].policy`, `lease`, ...) and the service's `message`. */
export class PacelineError extends Error {
  readonly status: number;
  readonly code: string;
  readonly field: string;
  constructor(status: number, code: string, field: string, message: string) {
    super(`${status} ${code} (${field}): ${message}`);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.field = field;
    this.detail = message;
  }
  /** The service's own message. */
  readonly detail: string;
}

/** `400 invalid_argument`: a field, or the body, is not what the endpoint takes. */
export class InvalidArgument extends PacelineError {}
/** `401 unauthenticated`: the service's token is missing or wrong. */
export class Unauthenticated extends PacelineError {}
/** `403 inline_policies_disabled`: the service takes configured policy names only. */
export class InlinePoliciesDisabled extends PacelineError {}
/** `404`: no such endpoint, policy, lease, queue, job or schedule (see `code`). */
export class NotFound extends PacelineError {}
/** `404 unknown_policy`. */
export class UnknownPolicy extends NotFound {}
/** `404 unknown_lease`: given back, reclaimed, or never taken. */
export class UnknownLease extends NotFound {}
/** `404 unknown_queue`. */
export class UnknownQueue extends NotFound {}
/** `404 unknown_job`: acknowledged, cancelled, purged or never enqueued. */
export class UnknownJob extends NotFound {}
/** `404 unknown_schedule`. */
export class UnknownSchedule extends NotFound {}
/** `409 conflict`: the job's state does not allow the call, or a `cost` is more than its
 * policy can ever admit (`field` names it; nothing was counted or added). */
export class Conflict extends PacelineError {}
/** `409 lease_lost`: the job's lease is no longer this one: stop working on the job. */
export class LeaseLost extends Conflict {}
/** `413 payload_too_large`. */
export class PayloadTooLarge extends PacelineError {}
/** `503 store_unavailable` or `store_full`: the service's store failed. */
export class ServiceUnavailable extends PacelineError {}

/** `429`: a concurrency lease refused, its limit's leases all live; `retryAfterMs` says
 * when to ask again. */
export class RateLimited extends PacelineError {
  readonly retryAfterMs: number;
  constructor(policy: string, retryAfterMs: number) {
    super(429, "rate_limited", "policy", `\`${policy}\` is at its limit; retry after ${retryAfterMs} ms`);
    this.retryAfterMs = retryAfterMs;
  }
}

const BY_CODE: Record<string, new (s: number, c: string, f: string, m: string) => PacelineError> = {
  invalid_argument: InvalidArgument,
  unauthenticated: Unauthenticated,
  inline_policies_disabled: InlinePoliciesDisabled,
  not_found: NotFound,
  unknown_policy: UnknownPolicy,
  unknown_lease: UnknownLease,
  unknown_queue: UnknownQueue,
  unknown_job: UnknownJob,
  unknown_schedule: UnknownSchedule,
  conflict: Conflict,
  lease_lost: LeaseLost,
  payload_too_large: PayloadTooLarge,
  store_unavailable: ServiceUnavailable,
  store_full: ServiceUnavailable,
};

/** The typed error of an `{"error": {"code", "field", "message"}}` answer. */
export function errorFrom(status: number, body: unknown): PacelineError {
  const error = (body as { error?: unknown } | null)?.error;
  if (error !== null && typeof error === "object") {
    const e = error as { code?: unknown; field?: unknown; message?: unknown };
    const code = String(e.code ?? "unknown");
    const Kind = BY_CODE[code] ?? PacelineError;
    return new Kind(status, code, String(e.field ?? ""), String(e.message ?? ""));
  }
  return new PacelineError(status, "unknown", "", `unexpected answer: ${JSON.stringify(body)}`.slice(0, 500));
}
