"""The service's operations, each as a request and the reading of its answer, shared by the
blocking and the asyncio clients (which only send them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from ._errors import PacelineError, RateLimited, decode, error_from, raise_for
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

NO_BODY: Any = object()


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how its answer is read."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    body: Any = NO_BODY
    # Seconds the service may take beyond the client's timeout (a lease call's wait).
    longer: float = 0.0


def seg(part: str) -> str:
    """A path segment, percent-encoded whole."""
    return quote(part, safe="")


def _json(response: httpx.Response) -> Any:
    raise_for(response)
    return decode(response)


def _nothing(response: httpx.Response) -> None:
    raise_for(response)


def _decision_body(response: httpx.Response) -> dict[str, Any]:
    if response.status_code in (200, 429):
        body: dict[str, Any] = decode(response)
        return body
    raise_for(response)
    raise PacelineError(response.status_code, "unknown", "", response.text[:500])


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def decide(policy: str, key: str, op: str, cost: int, max_wait: float | None) -> Call[Decision]:
    body: dict[str, Any] = {"policy": policy, "key": key, "op": op, "cost": cost}
    if max_wait is not None:
        body["max_wait_ms"] = max_wait * 1000.0
    return Call("POST", "/v1/decisions", lambda r: Decision.from_json(_decision_body(r)), body)


def decide_set(
    limits: Sequence[Limit | tuple[str, str]], op: str, cost: int, max_wait: float | None
) -> Call[SetDecision]:
    items = [x if isinstance(x, Limit) else Limit(x[0], x[1]) for x in limits]
    body: dict[str, Any] = {"limits": [x.to_json() for x in items], "op": op, "cost": cost}
    if max_wait is not None:
        body["max_wait_ms"] = max_wait * 1000.0
    return Call("POST", "/v1/decisions", lambda r: SetDecision.from_json(_decision_body(r)), body)


def _batch_answers(response: httpx.Response) -> list[Decision | PacelineError]:
    out: list[Decision | PacelineError] = []
    for item in _json(response):
        if "error" in item:
            out.append(error_from(int(item.get("status", 400)), item))
        else:
            out.append(Decision.from_json(item))
    return out


def decide_batch(requests: Iterable[Limit], op: str) -> Call[list[Decision | PacelineError]]:
    body = [{**r.to_json(), "op": op} for r in requests]
    return Call("POST", "/v1/decisions/batch", _batch_answers, body)


def take_lease(policy: str, key: str, cost: int) -> Call[Decision]:
    def read(response: httpx.Response) -> Decision:
        if response.status_code == 429:
            d = decode(response)
            raise RateLimited(str(d.get("policy", policy)), float(d.get("delay_ms", 0.0)) / 1000.0)
        d = _json(response)
        return Decision(
            allowed=True,
            delay=0.0,
            limit=int(d["limit"]),
            remaining=int(d["remaining"]),
            reset_after=float(d["expires_ms"]) / 1000.0,
            policy=str(d["policy"]),
            lease=d.get("lease"),
            fallback=d.get("fallback"),
        )

    return Call("POST", "/v1/leases", read, {"policy": policy, "key": key, "cost": cost})


def extend_lease(token: str) -> Call[float]:
    return Call("POST", f"/v1/leases/{seg(token)}/extend", lambda r: float(_json(r)["expires_ms"]) / 1000.0)


def release_lease(token: str) -> Call[None]:
    return Call("DELETE", f"/v1/leases/{seg(token)}", _nothing)


def policies() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/policies", _json)


# The queue's operations.


def _q(queue: str, rest: str = "") -> str:
    return f"/v1/queues/{seg(queue)}{rest}"


def enqueue(queue: str, job: NewJob) -> Call[Enqueued]:
    return Call(
        "POST",
        _q(queue, "/jobs"),
        lambda r: Enqueued.from_json(_json(r), created=r.status_code == 201),
        job.to_json(),
    )


def _enqueued_entries(response: httpx.Response) -> list[Enqueued | PacelineError]:
    out: list[Enqueued | PacelineError] = []
    for item in _json(response):
        status = int(item.get("status", 400))
        if "error" in item:
            out.append(error_from(status, item))
        else:
            out.append(Enqueued.from_json(item, created=status == 201))
    return out


def enqueue_batch(queue: str, jobs: Iterable[NewJob]) -> Call[list[Enqueued | PacelineError]]:
    return Call("POST", _q(queue, "/jobs/batch"), _enqueued_entries, [j.to_json() for j in jobs])


def lease_jobs(
    queue: str, worker: str, max_jobs: int, lease: float | None, wait: float | None, request_id: str | None
) -> Call[list[Job]]:
    body: dict[str, Any] = {"worker": worker, "max_jobs": max_jobs}
    if lease is not None:
        body["lease_ms"] = lease * 1000.0
    if wait is not None:
        body["wait_ms"] = wait * 1000.0
    if request_id is not None:
        body["request_id"] = request_id
    return Call(
        "POST",
        _q(queue, "/leases"),
        lambda r: [Job.from_json(j, queue) for j in _json(r)["jobs"]],
        body,
        longer=wait or 0.0,
    )


# No result given (``None`` is one: JSON's null).
NO_RESULT: Any = object()


def ack(queue: str, job_id: str, lease: str, result: Any = NO_RESULT) -> Call[None]:
    body: dict[str, Any] = {"lease": lease}
    if result is not NO_RESULT:
        body["result"] = result
    return Call("POST", _q(queue, f"/jobs/{seg(job_id)}/ack"), _nothing, body)


def progress(queue: str, job_id: str, lease: str, report: Any) -> Call[None]:
    body = {"lease": lease, "progress": report}
    return Call("POST", _q(queue, f"/jobs/{seg(job_id)}/progress"), _nothing, body)


def release(queue: str, job_id: str, lease: str) -> Call[None]:
    body = {"lease": lease, "release": True}
    return Call("POST", _q(queue, f"/jobs/{seg(job_id)}/fail"), _nothing, body)


def fail(
    queue: str,
    job_id: str,
    lease: str,
    error: str | None,
    retry_after: float | None,
    pause_group: float | None,
    fatal: bool,
) -> Call[None]:
    body: dict[str, Any] = {"lease": lease}
    if error is not None:
        body["error"] = error[:4096]
    if retry_after is not None:
        body["retry_after_ms"] = _ms(retry_after)
    if pause_group is not None:
        body["pause_group_ms"] = _ms(pause_group)
    if fatal:
        body["fatal"] = True
    return Call("POST", _q(queue, f"/jobs/{seg(job_id)}/fail"), _nothing, body)


def extend_job(queue: str, job_id: str, lease: str, length: float | None) -> Call[int]:
    body: dict[str, Any] = {"lease": lease}
    if length is not None:
        body["lease_ms"] = length * 1000.0
    return Call("POST", _q(queue, f"/jobs/{seg(job_id)}/extend"), lambda r: int(_json(r)["lease_expires_ms"]), body)


def job(queue: str, job_id: str) -> Call[JobInfo]:
    return Call("GET", _q(queue, f"/jobs/{seg(job_id)}"), lambda r: JobInfo.from_json(_json(r)))


def cancel(queue: str, job_id: str) -> Call[None]:
    return Call("DELETE", _q(queue, f"/jobs/{seg(job_id)}"), _nothing)


def stats(queue: str) -> Call[QueueStats]:
    return Call("GET", _q(queue), lambda r: QueueStats.from_json(_json(r)))


def pause(queue: str, group: str | None, seconds: float | None) -> Call[dict[str, Any]]:
    path = _q(queue, "/pause") if group is None else _q(queue, f"/groups/{seg(group)}/pause")
    body: Any = {} if seconds is None else {"ms": seconds * 1000.0}
    return Call("POST", path, _json, body)


def resume(queue: str, group: str | None) -> Call[dict[str, Any]]:
    path = _q(queue, "/resume") if group is None else _q(queue, f"/groups/{seg(group)}/resume")
    return Call("POST", path, _json)


def _group_policy(response: httpx.Response) -> GroupPolicy:
    return GroupPolicy.from_json(_json(response))


def group_policy(queue: str, group: str) -> Call[GroupPolicy]:
    return Call("GET", _q(queue, f"/groups/{seg(group)}/policy"), _group_policy)


def set_group_policy(queue: str, group: str, policy: str | None) -> Call[GroupPolicy]:
    path = _q(queue, f"/groups/{seg(group)}/policy")
    if policy is None:
        return Call("DELETE", path, _group_policy)
    return Call("PUT", path, _group_policy, {"policy": policy})


def dead(queue: str, offset: int, limit: int) -> Call[list[JobInfo]]:
    return Call(
        "GET",
        _q(queue, f"/dead?offset={offset}&limit={limit}"),
        lambda r: [JobInfo.from_json(j) for j in _json(r)["jobs"]],
    )


def jobs(queue: str, state: str, group: str | None, offset: int, limit: int) -> Call[list[JobInfo]]:
    query = f"state={quote(state, safe='')}&offset={offset}&limit={limit}"
    if group is not None:
        query += f"&group={quote(group, safe='')}"
    return Call(
        "GET",
        _q(queue, f"/jobs?{query}"),
        lambda r: [JobInfo.from_json(j) for j in _json(r)["jobs"]],
    )


def retry_dead(queue: str, ids: Sequence[str] | None) -> Call[int]:
    body: dict[str, Any] = {} if ids is None else {"ids": list(ids)}
    return Call("POST", _q(queue, "/dead/retry"), lambda r: int(_json(r)["retried"]), body)


def purge_dead(queue: str) -> Call[int]:
    return Call("DELETE", _q(queue, "/dead"), lambda r: int(_json(r)["purged"]))


def _schedule(response: httpx.Response) -> Schedule:
    return Schedule.from_json(_json(response))


def put_schedule(
    queue: str, name: str, cron: str, group: str, payload: Any, timezone: str | None
) -> Call[Schedule]:
    body: dict[str, Any] = {"cron": cron, "group": group, "payload": payload}
    if timezone is not None:
        body["timezone"] = timezone
    return Call("PUT", _q(queue, f"/schedules/{seg(name)}"), _schedule, body)


def schedule(queue: str, name: str) -> Call[Schedule]:
    return Call("GET", _q(queue, f"/schedules/{seg(name)}"), _schedule)


def delete_schedule(queue: str, name: str) -> Call[None]:
    return Call("DELETE", _q(queue, f"/schedules/{seg(name)}"), _nothing)


def schedules(queue: str) -> Call[list[Schedule]]:
    return Call(
        "GET",
        _q(queue, "/schedules"),
        lambda r: [Schedule.from_json(s) for s in _json(r)["schedules"]],
    )
