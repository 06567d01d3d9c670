"""paceline's Python client: shared rate limits, pacing, concurrency leases and a
rate-limited job queue with a worker, from ``paceline serve``.

>>> from paceline import Client
>>> with Client("http://127.0.0.1:7373") as client:  # doctest: +SKIP
...     client.limit("gcra:rate=10/s,burst=5", "user:42").allowed
True
"""

from ._async import AsyncClient, AsyncLease, AsyncQueue
from ._client import Client, Lease, Queue
from ._errors import (
    AnswerTooDeep,
    Conflict,
    InlinePoliciesDisabled,
    InvalidArgument,
    LeaseLost,
    NotFound,
    PacelineError,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    Unauthenticated,
    UnknownJob,
    UnknownLease,
    UnknownPolicy,
    UnknownQueue,
    UnknownSchedule,
)
from ._models import (
    Decision,
    Enqueued,
    GroupPolicy,
    GroupStats,
    Job,
    JobInfo,
    Limit,
    LimitDecision,
    NewJob,
    QueueStats,
    Schedule,
    SetDecision,
)
from ._worker import Fatal, PauseGroup, Report, Retry, Worker

__version__ = "0.1.0"

__all__ = [
    "AnswerTooDeep",
    "AsyncClient",
    "AsyncLease",
    "AsyncQueue",
    "Client",
    "Conflict",
    "Decision",
    "Enqueued",
    "Fatal",
    "GroupPolicy",
    "GroupStats",
    "InlinePoliciesDisabled",
    "InvalidArgument",
    "Job",
    "JobInfo",
    "Lease",
    "LeaseLost",
    "Limit",
    "LimitDecision",
    "NewJob",
    "NotFound",
    "PacelineError",
    "PauseGroup",
    "PayloadTooLarge",
    "Queue",
    "QueueStats",
    "RateLimited",
    "Report",
    "Retry",
    "Schedule",
    "ServiceUnavailable",
    "SetDecision",
    "Unauthenticated",
    "UnknownJob",
    "UnknownLease",
    "UnknownPolicy",
    "UnknownQueue",
    "UnknownSchedule",
    "Worker",
]
