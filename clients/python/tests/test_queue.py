"""The queue's producer calls and a worker's own calls, and their errors."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from paceline import (
    AsyncClient,
    Client,
    Enqueued,
    InvalidArgument,
    LeaseLost,
    NewJob,
    PacelineError,
    UnknownJob,
    UnknownQueue,
)


def test_enqueue_answers_the_estimated_start_and_an_id_enqueued_once(url: str, unique: str) -> None:
    with Client(url) as client:
        jobs = client.queue("jobs")
        before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
        first = jobs.enqueue(unique, {"user": 7, "role": 3}, id=f"{unique}-1")
        again = jobs.enqueue(NewJob(unique, {"user": 7}, id=f"{unique}-1"))
        later = jobs.enqueue(unique, None, delay=3600)
        info = jobs.job(first.id)
    assert first.created and not again.created and again.id == first.id
    assert first.state == "waiting"
    start = first.estimated_start
    assert start is not None and start >= before
    assert later.state == "scheduled"
    assert later.estimated_start is not None and later.estimated_start > start + dt.timedelta(minutes=30)
    assert info.payload == {"user": 7, "role": 3} and info.group == unique


def test_a_batch_enqueues_each_job_on_its_own(url: str, unique: str) -> None:
    with Client(url) as client:
        answers = client.queue("jobs").enqueue_batch(
            [NewJob(unique, 1), NewJob("", 2), NewJob(unique, 3, max_attempts=2)]
        )
    ok1, bad, ok2 = answers
    assert isinstance(ok1, Enqueued) and ok1.created
    assert isinstance(bad, InvalidArgument) and bad.field == "group"
    assert isinstance(ok2, Enqueued)


def test_lease_ack_fail_and_extend_by_hand_and_a_lost_lease(url: str, unique: str) -> None:
    with Client(url) as client:
        jobs = client.queue("manual")
        jobs.enqueue(unique, "a", id=f"{unique}-a")
        (job,) = jobs.lease("tester", 10)
        assert (job.id, job.group, job.attempt, job.payload) == (f"{unique}-a", unique, 1, "a")
        assert job.queue == "manual"
        assert jobs.extend(job, 60) > job.lease_expires_ms
        # Failed with a pause of its group: back at its group's head, no attempt spent.
        jobs.fail(job, "upstream 429", pause_group=0.001)
        (again,) = jobs.lease("tester", 10)
        assert again.id == job.id and again.attempt == 1
        jobs.ack(again)
        # Acknowledged: the lease is no longer the job's.
        with pytest.raises((LeaseLost, UnknownJob)):
            jobs.extend(again)
        with pytest.raises(UnknownJob) as gone:
            jobs.job(job.id)
        with pytest.raises(InvalidArgument) as bad:
            jobs.ack(job.__class__(**{**job.__dict__, "lease": "not-a-token"}))
    assert gone.value.field == "id"
    assert bad.value.field == "lease"


def test_an_unknown_queue_is_a_typed_error(url: str) -> None:
    with Client(url) as client:
        with pytest.raises(UnknownQueue) as e:
            client.queue("nope").stats()
    assert (e.value.status, e.value.field) == (404, "queue")


def test_the_asyncio_producer(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("async-producer")
            enqueued = await asyncio.gather(*(q.enqueue(unique, i) for i in range(5)))
            assert all(e.created for e in enqueued)
            stats = await q.stats()
            assert stats.groups[unique].waiting == 5
            waiting = await q.jobs("waiting", group=unique)
            assert sorted(j.id for j in waiting) == sorted(e.id for e in enqueued)
            await q.pause(60, group=unique)
            assert (await q.stats()).groups[unique].paused
            await q.resume(group=unique)
            assert not (await q.stats()).groups[unique].paused
            for e in enqueued:
                await q.cancel(e.id)
            with pytest.raises(PacelineError):
                await q.job(enqueued[0].id)

    asyncio.run(main())
