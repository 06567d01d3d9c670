"""The rest of the queue's surface a producer or a worker needs: priorities, costs and
deduplication on enqueue; progress reports, results and the completed jobs; a job handed
back; schedules; a group's policy; the queue's own pause; and jobs whose payload nests
deeper than Python's json module reads on its own."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from paceline import (
    AnswerTooDeep,
    AsyncClient,
    Client,
    GroupPolicy,
    InvalidArgument,
    NewJob,
    Schedule,
    UnknownSchedule,
)


def test_priority_cost_and_dedup_on_enqueue(url: str, unique: str) -> None:
    with Client(url) as client:
        jobs = client.queue("jobs")
        first = jobs.enqueue(NewJob(unique, "a", priority=5, cost=2, dedup_key=unique, dedup_ttl=60))
        again = jobs.enqueue(unique, "b", dedup_key=unique, dedup_ttl=60)
        info = jobs.job(first.id)
        with pytest.raises(InvalidArgument) as bad:
            jobs.enqueue(unique, "c", priority=10)
    assert first.created and not first.deduplicated
    assert again.deduplicated and again.id == first.id
    assert (info.priority, info.cost, info.payload) == (5, 2, "a")
    assert bad.value.field == "priority"


def test_progress_then_a_result_read_back_from_the_completed_jobs(url: str, unique: str) -> None:
    with Client(url) as client:
        results = client.queue("results")
        enqueued = results.enqueue(unique, {"n": 1})
        (job,) = results.lease("tester", 1)
        results.progress(job, {"done": 40})
        assert results.job(job.id).progress == {"done": 40}
        results.ack(job, {"total": 3, "ok": True})
        info = results.job(enqueued.id)
        completed = results.jobs("completed", limit=1000)
        stats = results.stats()
    assert info.state == "completed"
    assert info.result == {"total": 3, "ok": True}
    assert info.finished_ms is not None and info.finished_ms >= info.enqueued_ms
    assert enqueued.id in [j.id for j in completed]
    assert stats.completed >= 1


def test_a_released_job_keeps_its_place_and_its_attempt_and_pauses_nothing(url: str, unique: str) -> None:
    with Client(url) as client:
        jobs = client.queue("release")
        jobs.enqueue(unique, "first")
        jobs.enqueue(unique, "second")
        (job,) = jobs.lease("tester", 1)
        jobs.release(job)
        group = jobs.stats().groups[unique]
        (again,) = jobs.lease("tester", 1)
        jobs.ack(again)
        (second,) = jobs.lease("tester", 1)
        jobs.ack(second)
    assert not group.paused and group.waiting == 2
    assert (again.id, again.attempt, again.payload) == (job.id, 1, "first")
    assert second.payload == "second"


def test_schedules_put_read_listed_and_deleted(url: str, unique: str) -> None:
    name = f"nightly-{abs(hash(unique)) % 10**9}"
    with Client(url) as client:
        jobs = client.queue("jobs")
        put = jobs.put_schedule(name, "0 3 * * *", unique, {"report": "daily"}, timezone="Europe/Paris")
        read = jobs.schedule(name)
        listed = jobs.schedules()
        with pytest.raises(InvalidArgument) as bad:
            jobs.put_schedule(name, "not cron", unique)
        jobs.delete_schedule(name)
        with pytest.raises(UnknownSchedule):
            jobs.schedule(name)
        with pytest.raises(UnknownSchedule):
            jobs.delete_schedule(name)
    assert isinstance(put, Schedule) and put == read
    assert (put.cron, put.group, put.payload, put.timezone) == ("0 3 * * *", unique, {"report": "daily"}, "Europe/Paris")
    assert put.next is not None and put.next_ms > 0
    assert name in [s.name for s in listed]
    assert bad.value.field == "cron"


def test_a_group_policy_set_read_and_unset(url: str, unique: str) -> None:
    spec = "fixed_window:limit=10,window=10s"
    with Client(url) as client:
        jobs = client.queue("jobs")
        set_ = jobs.set_group_policy(unique, spec)
        read = jobs.group_policy(unique)
        unset = jobs.set_group_policy(unique, None)
        with pytest.raises(InvalidArgument) as bad:
            jobs.set_group_policy(unique, "gcra:rate=0/s")
    assert isinstance(set_, GroupPolicy) and set_ == read
    assert (read.policy, read.source, read.group) == (spec, "run_time", unique)
    assert unset.source != "run_time" and unset.policy != spec
    assert bad.value.field.startswith("policy")


def test_the_queue_paused_and_resumed_asyncio(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            q = client.queue("paused")
            paused = await q.pause(60)
            assert paused["paused"] and (await q.stats()).paused
            await q.enqueue(unique, 1)
            assert await q.lease("tester", 1) == []
            resumed = await q.resume()
            assert not resumed["paused"]
            (job,) = await q.lease("tester", 1, wait=5.0)
            await q.progress(job, "half")
            await q.release(job)
            (again,) = await q.lease("tester", 1, wait=5.0)
            await q.ack(again, None)
            assert again.id == job.id

    asyncio.run(main())


def nested(depth: int) -> bytes:
    return b'{"group": "deep", "payload": ' + b"[" * depth + b"]" * depth + b"}"


def test_a_payload_nested_1500_deep_reads_back(url: str, unique: str) -> None:
    depth = 1500
    with httpx.Client(base_url=url) as raw:
        body = nested(depth).replace(b'"deep"', f'"{unique}"'.encode())
        answer = raw.post("/v1/queues/deep/jobs", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
    with Client(url) as client:
        jobs = client.queue("deep")
        info = jobs.job(job_id)
        (waiting,) = jobs.jobs("waiting", group=unique)
        (leased,) = jobs.lease("tester", 1)
        jobs.ack(leased)
    for payload in (info.payload, waiting.payload, leased.payload):
        levels = 0
        while isinstance(payload, list) and payload:
            payload = payload[0]
            levels += 1
        assert levels == depth - 1 and payload == []


def test_a_payload_too_deep_for_python_is_a_typed_error(url: str, unique: str) -> None:
    with httpx.Client(base_url=url) as raw:
        body = nested(200_000).replace(b'"deep"', f'"{unique}"'.encode())
        answer = raw.post("/v1/queues/deep/jobs", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
    with Client(url) as client:
        jobs = client.queue("deep")
        with pytest.raises(AnswerTooDeep) as deep:
            jobs.job(job_id)
        jobs.cancel(job_id)
    assert (deep.value.status, deep.value.code, deep.value.field) == (200, "answer_too_deep", "body")
