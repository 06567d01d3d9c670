"""Typed exceptions: every failure the service answers, with its error code and field."""

from __future__ import annotations

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
    """``409 conflict``: the job's state does not allow the call."""


class LeaseLost(Conflict):
    """``409 lease_lost``: the job's lease is no longer this one (it expired, or the job
    was acknowledged or failed): stop working on the job."""


class PayloadTooLarge(PacelineError):
    """``413 payload_too_large``."""


class ServiceUnavailable(PacelineError):
    """``503 store_unavailable`` or ``store_full``: the service's store failed."""


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
        body: Any = response.json()
    except ValueError:
        body = response.text
    raise error_from(response.status_code, body)
