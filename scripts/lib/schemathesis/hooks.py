"""schemathesis hooks for scripts/schemathesis (SCHEMATHESIS_HOOKS=hooks).

Everything else schemathesis sends as generated. Of the requests meant to be taken (its
positive cases), these fields are adjusted, because what the service takes there depends on
its clock or a rule across items, which no JSON Schema can say (the service's answers to
them are clear `400`s naming the field). A `cost` more than its policy can ever admit is sent
as generated: the service answers it `409 conflict` (the request conflicts with the policy
as configured), which the positive-data check takes:

- A lease call may wait for a job up to `wait_ms` (at most 5 minutes, by design: a worker's
  long poll). On a queue with nothing to lease, a generated wait near that bound would hold
  the run for minutes and end in schemathesis's own request timeout, so the waits it sends
  are capped at a second.
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


def _within_rules(item: Any) -> None:
    if not isinstance(item, dict):
        return
    not_before = item.get("not_before_ms")
    if isinstance(not_before, (int, float)) and not isinstance(not_before, bool):
        soon = time.time() * 1000 + 86_400_000
        if soon < not_before <= 9_007_199_254_740:
            item["not_before_ms"] = soon
    limits = item.get("limits")
    if isinstance(limits, list):
        seen = set()
        kept = []
        for limit in limits:
            _within_rules(limit)
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
    if path in ("/v1/decisions", "/v1/leases", "/v1/queues/{queue}/jobs"):
        _within_rules(body)
    elif path in ("/v1/decisions/batch", "/v1/queues/{queue}/jobs/batch") and isinstance(body, list):
        for item in body:
            _within_rules(item)
