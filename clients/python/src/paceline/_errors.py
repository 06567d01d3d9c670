"""Typed exceptions: every failure the service answers, with its error code and field."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import httpx


class PacelineError(Exception):
    """A request the service refused or failed: its HTTP ``status``, the error ``code``
    (``invalid_argument``, ``unknown_queue``, ``lease_lost``, ...), the ``field`` at fault
    (``key``, ``limits[1].policy``, ``lease``, ...) and the service's ``message``."""

    def __init__(self, status: int, code: str, field: str, message: str) -> None:
        super().__init__(f"{status} {code} ({field}): {message}")
        self.status = status
        self.code = code
        self.field = field
        self.message = message


class InvalidArgument(PacelineError):
    """``400 invalid_argument``: a field, or the body, is not what the endpoint takes."""


class Unauthenticated(PacelineError):
    """``401 unauthenticated``: the service's token is missing or wrong."""


class InlinePoliciesDisabled(PacelineError):
    """``403 inline_policies_disabled``: the service takes configured policy names only."""


class NotFound(PacelineError):
    """``404``: no such endpoint, policy, lease, queue, job or schedule (see ``code``)."""


class UnknownPolicy(NotFound):
    """``404 unknown_policy``."""


class UnknownLease(NotFound):
    """``404 unknown_lease``: the concurrency lease was given back, reclaimed, or never
    taken."""


class UnknownQueue(NotFound):
    """``404 unknown_queue``."""


class UnknownJob(NotFound):
    """``404 unknown_job``: acknowledged, cancelled, purged or never enqueued."""


class UnknownSchedule(NotFound):
    """``404 unknown_schedule``."""


class Conflict(PacelineError):
    """``409 conflict``: the job's state does not allow the call, or a ``cost`` is more
    than its policy can ever admit (``field`` names it; nothing was counted or added)."""


class LeaseLost(Conflict):
    """``409 lease_lost``: the job's lease is no longer this one (it expired, or the job
    was acknowledged or failed): stop working on the job."""


class PayloadTooLarge(PacelineError):
    """``413 payload_too_large``."""


class ServiceUnavailable(PacelineError):
    """``503 store_unavailable`` or ``store_full``: the service's store failed."""


class AnswerTooDeep(PacelineError):
    """An answer whose JSON nests deeper than ``MAX_DEPTH`` levels (a job's payload,
    result or progress as a producer sent it: the service keeps any depth). Python's
    ``json`` reads about 1,000 levels on its own; this client reads up to ``MAX_DEPTH``,
    past which it refuses rather than overflow the interpreter's stack. ``status`` is
    the answer's HTTP status, ``code`` ``answer_too_deep``."""


class RateLimited(PacelineError):
    """``429``: a concurrency lease refused because its limit's leases are all live.
    ``retry_after`` is the seconds to wait before asking again."""

    def __init__(self, policy: str, retry_after: float) -> None:
        super().__init__(
            429, "rate_limited", "policy", f"`{policy}` is at its limit; retry after {retry_after:.3f} s"
        )
        self.retry_after = retry_after


_BY_CODE: dict[str, type[PacelineError]] = {
    "invalid_argument": InvalidArgument,
    "unauthenticated": Unauthenticated,
    "inline_policies_disabled": InlinePoliciesDisabled,
    "not_found": NotFound,
    "unknown_policy": UnknownPolicy,
    "unknown_lease": UnknownLease,
    "unknown_queue": UnknownQueue,
    "unknown_job": UnknownJob,
    "unknown_schedule": UnknownSchedule,
    "conflict": Conflict,
    "lease_lost": LeaseLost,
    "payload_too_large": PayloadTooLarge,
    "store_unavailable": ServiceUnavailable,
    "store_full": ServiceUnavailable,
}


# The deepest JSON this client reads: a decoder thread with a stack of its own holds it
# whatever the caller's thread stack is.
MAX_DEPTH = 20_000
_DEEP_STACK = 64 * 1024 * 1024
_deep = threading.Lock()


def decode(response: httpx.Response) -> Any:
    """The answer's JSON. Nested past the interpreter's recursion limit (a deep payload),
    it is read again in a thread of its own with room for ``MAX_DEPTH`` levels; deeper,
    ``AnswerTooDeep``."""
    try:
        return json.loads(response.content)
    except RecursionError:
        pass
    with _deep:
        out: list[Any] = []
        failed: list[BaseException] = []

        def read() -> None:
            try:
                out.append(json.loads(response.content))
            except BaseException as e:  # handed to the caller's thread
                failed.append(e)

        limit = sys.getrecursionlimit()
        stack = threading.stack_size()
        sys.setrecursionlimit(max(limit, MAX_DEPTH + 1_000))
        reader = threading.Thread(target=read, name="paceline-deep-json")
        try:
            # The size applies to the threads started while it is set: this one.
            threading.stack_size(_DEEP_STACK)
            try:
                reader.start()
            finally:
                threading.stack_size(stack)
            reader.join()
        finally:
            sys.setrecursionlimit(limit)
    if out:
        return out[0]
    if failed and not isinstance(failed[0], RecursionError):
        raise failed[0]
    raise AnswerTooDeep(
        response.status_code,
        "answer_too_deep",
        "body",
        "the answer's JSON nests too deep for this interpreter's json module (this client "
        f"reads up to {MAX_DEPTH} levels where the interpreter allows it): a payload, result "
        "or progress report was sent that deep",
    )


def error_from(status: int, body: Any) -> PacelineError:
    """The typed exception of an ``{"error": {"code", "field", "message"}}`` answer (or of
    any other failed answer, as a plain ``PacelineError``)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code", "unknown"))
        field = str(error.get("field", ""))
        message = str(error.get("message", ""))
        return _BY_CODE.get(code, PacelineError)(status, code, field, message)
    return PacelineError(status, "unknown", "", f"unexpected answer: {body!r}"[:500])


def raise_for(response: httpx.Response) -> None:
    """Raises the typed exception of a failed answer (any status from 400 up)."""
    if response.status_code < 400:
        return
    try:
        body: Any = decode(response)
    except ValueError:
        body = response.text
    raise error_from(response.status_code, body)
