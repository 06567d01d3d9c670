"""A queue worker: leases jobs as their groups' limits allow, runs a handler on each, keeps
each lease alive in the background, and acks, fails, pauses or hands back each job."""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, Union

import httpx

from ._async import AsyncClient, AsyncQueue
from ._errors import LeaseLost, PacelineError
from ._models import Job

log = logging.getLogger("paceline.worker")

Handler = Callable[[Job], Union[Awaitable[None], None]]
H = TypeVar("H", bound=Handler)


class PauseGroup(Exception):
    """Raise it from a handler when the upstream refused with a 429: the job's whole group
    starts nothing for ``retry_after`` seconds, and the job keeps its place at the group's
    head, costing no attempt."""

    def __init__(self, retry_after: float, error: str | None = None) -> None:
        super().__init__(error or f"upstream rate limit: retry after {retry_after} s")
        self.retry_after = retry_after


class Retry(Exception):
    """Raise it from a handler to retry the job after ``retry_after`` seconds (in place of
    the queue's backoff)."""

    def __init__(self, retry_after: float, error: str | None = None) -> None:
        super().__init__(error or f"retry after {retry_after} s")
        self.retry_after = retry_after


class Fatal(Exception):
    """Raise it from a handler when retrying cannot help: the job is dead at once."""


@dataclass
class Report:
    """What a worker did: jobs acknowledged, failed (to be retried, or dead), put back
    after an upstream's 429 (``paused``), whose lease was lost, and handed back at
    shutdown."""

    acked: int = 0
    failed: int = 0
    paused: int = 0
    lost: int = 0
    handed_back: int = 0


def retry_after_of(error: BaseException) -> float | None:
    """The seconds an upstream's ``429`` asks to wait, for an ``httpx.HTTPStatusError``
    (``Retry-After`` in seconds or as a date; 1 s without one), else ``None``."""
    if not isinstance(error, httpx.HTTPStatusError) or error.response.status_code != 429:
        return None
    value = error.response.headers.get("retry-after", "").strip()
    if not value:
        return 1.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 1.0
    return max(0.0, when.timestamp() - time.time())


class Worker:
    """Runs ``@worker.handler`` on the jobs of ``queue``, ``concurrency`` at a time.

    ``client`` is an ``AsyncClient`` or the service's URL. Each job's lease is extended in
    the background every ``extend_at`` of its length (``lease`` seconds, or the queue's);
    a lease found lost stops the job's handler (an async one is cancelled; a blocking one,
    run in a thread, has its result ignored). A handler that returns acks its job; one
    that raises fails it (retried after the queue's backoff), except ``PauseGroup`` or an
    ``httpx.HTTPStatusError`` for a 429, which pause the job's group for the upstream's
    retry-after, ``Retry`` and ``Fatal``. ``run()`` stops on SIGTERM or SIGINT: no more
    leases, the jobs running get ``shutdown_grace`` seconds to finish, then are cancelled
    and handed back to their groups (costing no attempt)."""

    def __init__(
        self,
        client: AsyncClient | str,
        queue: str,
        *,
        name: str | None = None,
        concurrency: int = 1,
        lease: float | None = None,
        extend_at: float = 0.5,
        wait: float = 5.0,
        shutdown_grace: float = 30.0,
        token: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0.0 < extend_at < 1.0:
            raise ValueError("extend_at is a fraction of the lease, between 0 and 1")
        self._own_client = isinstance(client, str)
        self.client = AsyncClient(client, token=token) if isinstance(client, str) else client
        self.queue: AsyncQueue = self.client.queue(queue)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.concurrency = concurrency
        self.lease = lease
        self.extend_at = extend_at
        self.wait = wait
        self.shutdown_grace = shutdown_grace
        self.report = Report()
        self._handler: Handler | None = None
        self._stop: asyncio.Event | None = None

    def handler(self, fn: H) -> H:
        """Decorates the function (async or blocking) that works on one job; any callable
        does, an instance of a class with ``__call__`` too."""
        self._handler = fn
        return fn

    def stop(self) -> None:
        """Stops leasing; the jobs running finish (or are handed back after the grace)."""
        if self._stop is not None:
            self._stop.set()

    def run(self) -> Report:
        """Runs until SIGTERM or SIGINT, then shuts down gracefully."""
        return asyncio.run(self._main())

    async def _main(self) -> Report:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            return await self.serve()
        finally:
            if self._own_client:
                await self.client.aclose()

    async def serve(self, stop: asyncio.Event | None = None) -> Report:
        """Works until ``stop`` is set (or ``stop()`` is called)."""
        if self._handler is None:
            raise RuntimeError("no handler: decorate one with @worker.handler")
        self._stop = stop or asyncio.Event()
        running: set[asyncio.Task[None]] = set()
        stopping = asyncio.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                free = self.concurrency - len(running)
                if free == 0:
                    await asyncio.wait({stopping, *running}, return_when=asyncio.FIRST_COMPLETED)
                    running = {t for t in running if not t.done()}
                    continue
                leasing = asyncio.create_task(
                    self.queue.lease(self.name, free, lease=self.lease, wait=self.wait)
                )
                await asyncio.wait({stopping, leasing}, return_when=asyncio.FIRST_COMPLETED)
                if not leasing.done():
                    # The service puts back whatever it leased for a call given up.
                    leasing.cancel()
                    await asyncio.gather(leasing, return_exceptions=True)
                    break
                try:
                    jobs = leasing.result()
                except (PacelineError, httpx.HTTPError) as e:
                    log.warning("leasing from %s failed: %s", self.queue.name, e)
                    await asyncio.wait({stopping}, timeout=1.0)
                    continue
                for job in jobs:
                    running.add(asyncio.create_task(self._work(job)))
                running = {t for t in running if not t.done()}
            await self._shut_down(running)
        finally:
            stopping.cancel()
        return self.report

    async def _shut_down(self, running: set[asyncio.Task[None]]) -> None:
        if not running:
            return
        _, late = await asyncio.wait(running, timeout=self.shutdown_grace)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _call_handler(self, job: Job) -> None:
        handler = self._handler
        assert handler is not None
        call = getattr(handler, "__call__", None)
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
            result = handler(job)
        else:
            # A blocking handler runs in a thread, so that it holds up no other job.
            result = await asyncio.to_thread(handler, job)
        if inspect.isawaitable(result):
            await result

    async def _extend(self, job: Job, lost: asyncio.Event) -> None:
        length = self.lease or max(0.001, (job.lease_expires_ms - job.started_ms) / 1000.0)
        while True:
            await asyncio.sleep(length * self.extend_at)
            try:
                await self.queue.extend(job, self.lease)
            except LeaseLost:
                lost.set()
                return
            except (PacelineError, httpx.HTTPError) as e:
                log.warning("extending job %s's lease failed: %s", job.id, e)

    async def _work(self, job: Job) -> None:
        lost = asyncio.Event()
        extender = asyncio.create_task(self._extend(job, lost))
        work = asyncio.create_task(self._call_handler(job))
        losing = asyncio.create_task(lost.wait())
        try:
            await asyncio.wait({work, losing}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Shutting down past the grace: the job goes back to its group.
            work.cancel()
            extender.cancel()
            losing.cancel()
            await asyncio.gather(work, extender, losing, return_exceptions=True)
            await self._settle(job, "handed_back")
            return
        extender.cancel()
        losing.cancel()
        if lost.is_set() and not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            log.warning("job %s: its lease was lost; stopped working on it", job.id)
            self.report.lost += 1
            return
        error = work.exception()
        if error is None:
            await self._settle(job, "acked")
        elif isinstance(error, PauseGroup):
            await self._settle(job, "paused", pause_group=error.retry_after, error=str(error))
        elif isinstance(error, Retry):
            await self._settle(job, "failed", retry_after=error.retry_after, error=str(error))
        elif isinstance(error, Fatal):
            await self._settle(job, "failed", fatal=True, error=str(error) or "fatal")
        elif (after := retry_after_of(error)) is not None:
            await self._settle(job, "paused", pause_group=after, error=f"upstream 429: {error}")
        else:
            log.warning("job %s failed: %r", job.id, error)
            await self._settle(job, "failed", error=f"{type(error).__name__}: {error}")

    async def _settle(self, job: Job, outcome: str, **failure: Any) -> None:
        try:
            if outcome == "acked":
                await self.queue.ack(job)
            elif outcome == "handed_back":
                await self.queue.release(job)
            else:
                await self.queue.fail(job, **failure)
        except LeaseLost:
            log.warning("job %s: its lease was lost before it was %s", job.id, outcome)
            self.report.lost += 1
            return
        except (PacelineError, httpx.HTTPError) as e:
            log.warning("job %s: could not be %s: %s", job.id, outcome, e)
            return
        setattr(self.report, outcome, getattr(self.report, outcome) + 1)
