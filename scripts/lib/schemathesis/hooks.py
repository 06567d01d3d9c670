"""schemathesis hooks for scripts/schemathesis (SCHEMATHESIS_HOOKS=hooks).

Everything else schemathesis sends as generated. Of the requests meant to be taken (its
positive cases), these fields are adjusted, because what the service takes there depends on
its configuration, its clock or a rule across items, which no JSON Schema can say (the
service's answers to them are clear `400`s naming the field):

- A lease call may wait for a job up to `wait_ms` (at most 5 minutes, by design: a worker's
  long poll). On a queue with nothing to lease, a generated wait near that bound would hold
  the run for minutes and end in schemathesis's own request timeout, so the waits it sends
  are capped at a second.
- A `cost` is refused (`400` naming `cost`) when it is more than the policy it is counted
  against can ever admit (a decision's or a lease's policy, a job's group's and queue's
  policies): the bound is the policy's burst or limit, which the document cannot know. The
  costs sent are capped at 1, which every policy admits; a cost over the document's own
  maximum, or of the wrong type, is sent as generated (those are refused as the document
  says).
- A set of limits naming one policy on one key twice is refused (`400` naming the second,
  `limits[i]`): the document can say "no item twice" (`uniqueItems`), not "no two items
  with the same two fields". The second of such a pair is left out of what is sent.
- A job's `not_before_ms` is refused (`400` naming it) more than a year after the queue's
  clock: a bound that moves with the clock, where the document's maximum is the clock's
  last time. The times sent are capped at now plus a day."""

import time
from typing import Any

import schemathesis

MAX_WAIT_MS = 1000
# The document's largest cost: of a decision or a lease, and of a job.
MAX_COST = {"decision": 2**40, "job": 1_000_000}


def _within_policy(item: Any, kind: str) -> None:
    if not isinstance(item, dict):
        return
    not_before = item.get("not_before_ms")
    if isinstance(not_before, (int, float)) and not isinstance(not_before, bool):
        soon = time.time() * 1000 + 86_400_000
        if soon < not_before <= 9_007_199_254_740:
            item["not_before_ms"] = soon
    cost = item.get("cost")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and 1 < cost <= MAX_COST[kind]:
        item["cost"] = 1
    limits = item.get("limits")
    if isinstance(limits, list):
        seen = set()
        kept = []
        for limit in limits:
            _within_policy(limit, kind)
            if isinstance(limit, dict):
                named = (repr(limit.get("policy")), repr(limit.get("key")))
                if named in seen and len(limits) > 1:
                    continue
                seen.add(named)
            kept.append(limit)
        limits[:] = kept


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    body = case.body
    path = case.operation.path
    if path.endswith("/leases") and path.startswith("/v1/queues/") and isinstance(body, dict):
        wait = body.get("wait_ms")
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > MAX_WAIT_MS:
            body["wait_ms"] = MAX_WAIT_MS
    meta = getattr(case, "meta", None)
    if meta is not None and meta.generation.mode.is_negative:
        # Meant to be refused: sent as generated.
        return
    kind = "job" if path.startswith("/v1/queues/") else "decision"
    if path in ("/v1/decisions", "/v1/leases", "/v1/queues/{queue}/jobs"):
        _within_policy(body, kind)
    elif path in ("/v1/decisions/batch", "/v1/queues/{queue}/jobs/batch") and isinstance(body, list):
        for item in body:
            _within_policy(item, kind)
