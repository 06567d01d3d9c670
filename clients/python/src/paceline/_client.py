"""The blocking client: ``Client``, its concurrency ``Lease`` and a ``Queue``'s producer and
worker calls."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _api
from ._api import Call
from ._errors import PacelineError, UnknownLease
from ._models import (
    Decision,
    Enqueued,
    GroupPolicy,
    Job,
    JobInfo,
    Limit,
    NewJob,
    QueueStats,
    Schedule,
    SetDecision,
)

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:7373"


def headers(token: str | None) -> dict[str, str]:
    h = {"user-agent": "paceline-client-python/0.1.0"}
    if token:
        h["authorization"] = f"Bearer {token}"
    return h


class Client:
    """A blocking client of ``paceline serve`` at ``url`` (with its ``token``, if it has
    one). Use it as a context manager, or ``close()`` it."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        self._timeout = timeout
        self._http = http or httpx.Client(base_url=url, headers=headers(token), timeout=timeout)

    def _run(self, call: Call[T]) -> T:
        extra: dict[str, Any] = {}
        if call.body is not _api.NO_BODY:
            extra["json"] = call.body
        if call.longer > 0:
            extra["timeout"] = self._timeout + call.longer
        response = self._http.request(call.method, call.path, **extra)
        return call.read(response)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # Decisions.

    def limit(self, policy: str, key: str, cost: int = 1) -> Decision:
        """Admit or refuse now: refused, nothing is counted and ``delay`` says when to ask
        again."""
        return self._run(_api.decide(policy, key, "limit", cost, None))

    def peek(self, policy: str, key: str, cost: int = 1) -> Decision:
        """What ``limit`` would answer, changing nothing."""
        return self._run(_api.decide(policy, key, "peek", cost, None))

    def pace(
        self, policy: str, key: str, cost: int = 1, *, max_wait: float | None = None, sleep: bool = True
    ) -> Decision:
        """Books the earliest slot the limit allows and (unless ``sleep=False``) sleeps until
        it. With ``max_wait`` (seconds), a longer wait is refused (``allowed`` false)
        without booking."""
        d = self._run(_api.decide(policy, key, "pace", cost, max_wait))
        if sleep and d.allowed and d.delay > 0:
            time.sleep(d.delay)
        return d

    def limits(
        self,
        limits: Sequence[Limit | tuple[str, str]],
        *,
        op: str = "limit",
        cost: int = 1,
        max_wait: float | None = None,
        sleep: bool = True,
    ) -> SetDecision:
        """Several limits decided as one: admitted only if every limit admits (each counts
        it); refused, none changes. ``op="pace"`` books the earliest time every limit
        admits and sleeps until it."""
        d = self._run(_api.decide_set(limits, op, cost, max_wait))
        if op == "pace" and sleep and d.allowed and d.delay > 0:
            time.sleep(d.delay)
        return d

    def batch(self, requests: Iterable[Limit], *, op: str = "limit") -> list[Decision | PacelineError]:
        """Up to 1000 single decisions in one call, answered in order (an entry that failed
        is its typed exception, not raised)."""
        return self._run(_api.decide_batch(requests, op))

    def lease(self, policy: str, key: str, cost: int = 1) -> Lease:
        """Takes a lease of a ``concurrency`` policy now (``RateLimited`` when its limit's
        leases are all live). Use it as a context manager to give it back."""
        return Lease(self, self._run(_api.take_lease(policy, key, cost)))

    def policies(self) -> dict[str, Any]:
        """The configured policies."""
        return self._run(_api.policies())

    def queue(self, name: str) -> Queue:
        """The queue ``name`` of the service's config."""
        return Queue(self, name)


class Lease:
    """A concurrency lease: ``extend()`` it while the work goes on, ``release()`` it (or
    leave the ``with`` block) when it ends."""

    def __init__(self, client: Client, decision: Decision) -> None:
        self._client = client
        self.decision = decision
        self.token = decision.lease
        self.released = False

    def extend(self) -> float:
        """The lease lives its policy's ``lease`` from now; the seconds it has left."""
        if self.token is None:
            return self.decision.reset_after
        return self._client._run(_api.extend_lease(self.token))

    def release(self) -> None:
        """Gives the lease back (once; a lease reclaimed already is no error)."""
        if self.released or self.token is None:
            return
        self.released = True
        try:
            self._client._run(_api.release_lease(self.token))
        except UnknownLease:
            pass

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Queue:
    """A queue of the service: the producer's calls, and the worker's (which
    ``paceline.Worker`` makes for you)."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    def enqueue(self, job: NewJob | str, payload: Any = None, **options: Any) -> Enqueued:
        """Enqueues ``job`` (a ``NewJob``, or a group with ``payload`` and ``NewJob``'s
        options); ``estimated_start`` says when it should start."""
        new = job if isinstance(job, NewJob) else NewJob(job, payload, **options)
        return self._client._run(_api.enqueue(self.name, new))

    def enqueue_batch(self, jobs: Iterable[NewJob]) -> list[Enqueued | PacelineError]:
        """Up to 1000 jobs, each enqueued on its own (a refused one is its typed exception,
        not raised)."""
        return self._client._run(_api.enqueue_batch(self.name, jobs))

    def lease(
        self,
        worker: str,
        max_jobs: int = 1,
        *,
        lease: float | None = None,
        wait: float | None = None,
        request_id: str | None = None,
    ) -> list[Job]:
        """The jobs that may start now, waiting up to ``wait`` seconds for one."""
        return self._client._run(_api.lease_jobs(self.name, worker, max_jobs, lease, wait, request_id))

    def ack(self, job: Job, result: Any = _api.NO_RESULT) -> None:
        """The job is done (``LeaseLost`` if its lease is no longer this one). ``result``
        (any JSON) is kept with it while the queue keeps completed jobs
        (``keep_completed``), shown as its ``result``."""
        self._client._run(_api.ack(self.name, job.id, job.lease, result))

    def progress(self, job: Job, report: Any) -> None:
        """Reports how far the job has got (any JSON), shown as its ``progress``
        (``LeaseLost`` if its lease is no longer this one)."""
        self._client._run(_api.progress(self.name, job.id, job.lease, report))

    def release(self, job: Job) -> None:
        """Hands the job back before working on it: it keeps its place at its group's
        head and costs no attempt (a worker shutting down)."""
        self._client._run(_api.release(self.name, job.id, job.lease))

    def fail(
        self,
        job: Job,
        error: str | None = None,
        *,
        retry_after: float | None = None,
        pause_group: float | None = None,
        fatal: bool = False,
    ) -> None:
        """The job failed: retried after the queue's backoff (or ``retry_after``), dead if
        ``fatal`` or out of attempts; ``pause_group`` (an upstream's 429) puts it back at
        its group's head, costing no attempt, and pauses the group that long."""
        self._client._run(_api.fail(self.name, job.id, job.lease, error, retry_after, pause_group, fatal))

    def extend(self, job: Job, lease: float | None = None) -> int:
        """The job's lease lives ``lease`` seconds (the queue's lease by default) from now;
        its new expiry in Unix ms."""
        return self._client._run(_api.extend_job(self.name, job.id, job.lease, lease))

    def job(self, job_id: str) -> JobInfo:
        return self._client._run(_api.job(self.name, job_id))

    def cancel(self, job_id: str) -> None:
        self._client._run(_api.cancel(self.name, job_id))

    def stats(self) -> QueueStats:
        return self._client._run(_api.stats(self.name))

    def pause(self, seconds: float | None = None, *, group: str | None = None) -> dict[str, Any]:
        """The queue (or one group) starts nothing for ``seconds``, or until resumed."""
        return self._client._run(_api.pause(self.name, group, seconds))

    def resume(self, *, group: str | None = None) -> dict[str, Any]:
        return self._client._run(_api.resume(self.name, group))

    def group_policy(self, group: str) -> GroupPolicy:
        """The group's policy, and where it comes from."""
        return self._client._run(_api.group_policy(self.name, group))

    def set_group_policy(self, group: str, policy: str | None) -> GroupPolicy:
        """The group's policy from now on, kept by the service's store (``None``: the
        config's again)."""
        return self._client._run(_api.set_group_policy(self.name, group, policy))

    def jobs(
        self, state: str, *, group: str | None = None, offset: int = 0, limit: int = 100
    ) -> list[JobInfo]:
        """The jobs in ``state`` (``scheduled``, ``waiting``, ``active``, ``dead`` or
        ``completed``), in the order the queue keeps them; ``group``: one group's waiting
        line; ``offset`` and ``limit`` (1 to 1000) page them."""
        return self._client._run(_api.jobs(self.name, state, group, offset, limit))

    def dead(self, offset: int = 0, limit: int = 100) -> list[JobInfo]:
        return self._client._run(_api.dead(self.name, offset, limit))

    def retry_dead(self, ids: Sequence[str] | None = None) -> int:
        return self._client._run(_api.retry_dead(self.name, ids))

    def purge_dead(self) -> int:
        return self._client._run(_api.purge_dead(self.name))

    # Schedules.

    def put_schedule(
        self, name: str, cron: str, group: str, payload: Any = None, *, timezone: str | None = None
    ) -> Schedule:
        """A job enqueued into ``group`` with ``payload`` at each tick of ``cron`` (five
        fields, or six with seconds first; in ``timezone``, UTC by default), once per
        tick across every instance. Put again, the same schedule keeps its next tick."""
        return self._client._run(_api.put_schedule(self.name, name, cron, group, payload, timezone))

    def schedule(self, name: str) -> Schedule:
        """The schedule ``name`` (``UnknownSchedule`` if there is none)."""
        return self._client._run(_api.schedule(self.name, name))

    def schedules(self) -> list[Schedule]:
        """Every schedule of the queue, with its next tick."""
        return self._client._run(_api.schedules(self.name))

    def delete_schedule(self, name: str) -> None:
        """Removes the schedule ``name`` (``UnknownSchedule`` if there is none)."""
        self._client._run(_api.delete_schedule(self.name, name))
