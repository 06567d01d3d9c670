"""schemathesis hooks for scripts/schemathesis (SCHEMATHESIS_HOOKS=hooks).

A lease call may wait for a job up to `wait_ms` (at most 5 minutes, by design: a worker's
long poll). On a queue with nothing to lease, a generated wait near that bound would hold
the run for minutes and end in schemathesis's own request timeout, so the waits it sends
are capped at a second; every other field is sent as generated."""

from typing import Any

import schemathesis

MAX_WAIT_MS = 1000


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    body = case.body
    if not case.operation.path.endswith("/leases") or not isinstance(body, dict):
        return
    wait = body.get("wait_ms")
    if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > MAX_WAIT_MS:
        body["wait_ms"] = MAX_WAIT_MS
