"""The worker against a real service: it acks what its handler finishes, fails what raises
(retried after the queue's backoff), pauses a group on an upstream's 429, stops working on
a job whose lease is lost, and hands back or finishes jobs when it shuts down.

The tests never sleep for time to pass: they poll the service until what they wait for is
true, with a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from paceline import AsyncClient, Client, Job, PauseGroup, Worker

DEADLINE = 20.0


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE} s: {what}")
        await asyncio.sleep(0.02)


async def drained(client: AsyncClient, queue: str) -> bool:
    s = await client.queue(queue).stats()
    return s.waiting + s.active + s.scheduled == 0


def test_a_worker_runs_every_job_and_acks_it(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("work")
            for i in range(20):
                await q.enqueue(f"{unique}-{i % 3}", {"n": i})
            seen: list[int] = []
            worker = Worker(client, "work", concurrency=4, wait=0.2)

            @worker.handler
            async def handle(job: Job) -> None:
                seen.append(job.payload["n"])

            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))
            await until(lambda: drained(client, "work"), "every job done")
            stop.set()
            report = await running
            assert sorted(seen) == list(range(20))
            assert report.acked == 20 and report.failed == 0

    asyncio.run(main())


def test_a_blocking_handler_runs_in_a_thread(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            await client.queue("work").enqueue(unique, "blocking")
            done: list[str] = []
            worker = Worker(client, "work", wait=0.2)

            @worker.handler
            def handle(job: Job) -> None:
                # A blocking client inside a blocking handler.
                with Client(url) as blocking:
                    assert blocking.limit("gcra:rate=1/m,burst=5", unique).allowed
                done.append(job.payload)

            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))
            await until(lambda: drained(client, "work"), "the job done")
            stop.set()
            assert (await running).acked == 1
            assert done == ["blocking"]

    asyncio.run(main())


def test_an_exception_fails_the_job_which_is_retried_after_the_backoff(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("failing")
            enqueued = await q.enqueue(unique, "flaky", max_attempts=3)
            attempts: list[int] = []
            worker = Worker(client, "failing", wait=0.2)

            @worker.handler
            async def handle(job: Job) -> None:
                attempts.append(job.attempt)
                if job.attempt < 2:
                    raise RuntimeError("the upstream broke")

            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))
            await until(lambda: drained(client, "failing"), "the job retried and done")
            stop.set()
            report = await running
            assert attempts == [1, 2]
            assert (report.failed, report.acked) == (1, 1)
            assert enqueued.id

    asyncio.run(main())


def test_an_upstream_429_pauses_the_group_and_costs_no_attempt(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("upstream")
            await q.enqueue(unique, "first")
            attempts: list[int] = []
            paused_seen: list[bool] = []
            worker = Worker(client, "upstream", wait=0.2)

            @worker.handler
            async def handle(job: Job) -> None:
                attempts.append(job.attempt)
                if len(attempts) == 1:
                    raise PauseGroup(0.3)

            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))

            async def paused_or_done() -> bool:
                s = await q.stats()
                group = s.groups.get(unique)
                if group is not None and group.paused:
                    paused_seen.append(True)
                return s.waiting + s.active == 0 and len(attempts) == 2

            await until(paused_or_done, "the group paused, then the job done")
            stop.set()
            report = await running
            # The same attempt twice: the pause cost the job nothing.
            assert attempts == [1, 1]
            assert (report.paused, report.acked) == (1, 1)

    asyncio.run(main())


def test_an_httpx_429_from_the_handler_pauses_the_group_for_its_retry_after(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("upstream-http")
            await q.enqueue(unique, "x")
            calls: list[int] = []
            worker = Worker(client, "upstream-http", wait=0.2)

            @worker.handler
            async def handle(job: Job) -> None:
                calls.append(job.attempt)
                if len(calls) == 1:
                    request = httpx.Request("PUT", "https://discord.example/roles")
                    response = httpx.Response(429, headers={"retry-after": "0.2"}, request=request)
                    response.raise_for_status()

            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))
            await until(
                lambda: _done_after(client, "upstream-http", calls, 2), "the job done after the pause"
            )
            stop.set()
            report = await running
            assert calls == [1, 1]
            assert (report.paused, report.acked) == (1, 1)

    asyncio.run(main())


async def _done_after(client: AsyncClient, queue: str, calls: list[int], n: int) -> bool:
    return len(calls) >= n and await drained(client, queue)


def test_a_lost_lease_stops_the_work_on_its_job(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("lost")
            await q.enqueue(unique, "slow")
            cancelled = asyncio.Event()
            worker = Worker(client, "lost", wait=0.2, extend_at=0.2)

            @worker.handler
            async def handle(job: Job) -> None:
                # Someone else finishes the job: this worker's lease is lost.
                await q.ack(job)
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))

            async def was_cancelled() -> bool:
                return cancelled.is_set()

            await until(was_cancelled, "the handler cancelled once the lease was lost")
            stop.set()
            report = await running
            assert report.lost == 1 and report.acked == 0

    asyncio.run(main())


def test_shutting_down_hands_back_the_jobs_still_running(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("shutdown")
            enqueued = await q.enqueue(unique, "long")
            started = asyncio.Event()
            worker = Worker(client, "shutdown", wait=0.2, shutdown_grace=0.0)

            @worker.handler
            async def handle(job: Job) -> None:
                started.set()
                await asyncio.Event().wait()

            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))
            await started.wait()
            stop.set()
            report = await running
            assert report.handed_back == 1
            info = await q.job(enqueued.id)
            # Back in its group, which it does not pause, and the attempt it had is not spent.
            assert info.state in ("waiting", "scheduled")
            assert not (await q.stats()).groups[unique].paused
            (again,) = await q.lease("next-worker", 1, wait=5.0)
            assert again.id == enqueued.id and again.attempt == 1
            await q.ack(again)

    asyncio.run(main())


def test_sigterm_lets_the_running_job_finish_then_the_worker_exits(url: str, unique: str) -> None:
    src = Path(__file__).resolve().parents[1] / "src"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from paceline import Worker
        worker = Worker({url!r}, "sigterm", wait=0.2, shutdown_grace=30)

        @worker.handler
        async def handle(job):
            print("started", flush=True)
            await asyncio.sleep(0.3)

        report = worker.run()
        print("acked", report.acked, flush=True)
        """
    )
    with Client(url) as client:
        client.queue("sigterm").enqueue(unique, "job")
        env = {**os.environ, "PYTHONPATH": str(src)}
        proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started"
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0
        assert out.strip() == "acked 1"
        stats = client.queue("sigterm").stats()
        assert stats.waiting + stats.active == 0


def test_a_handler_may_be_an_instance_of_a_class(url: str, unique: str) -> None:
    class Granter:
        def __init__(self) -> None:
            self.granted: list[object] = []

        async def __call__(self, job: Job) -> None:
            self.granted.append(job.payload)

    async def main() -> None:
        async with AsyncClient(url) as client:
            await client.queue("work").enqueue(unique, {"role": 3})
            granter = Granter()
            worker = Worker(client, "work", wait=0.2)
            worker.handler(granter)
            stop = asyncio.Event()
            running = asyncio.create_task(worker.serve(stop))
            await until(lambda: drained(client, "work"), "the job done")
            stop.set()
            assert (await running).acked == 1
            assert granter.granted == [{"role": 3}]

    asyncio.run(main())
