"""What the service answers, as typed values (times in seconds unless named ``*_ms``)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any


def _seconds(ms: Any) -> float:
    return float(ms) / 1000.0


def _datetime(ms: int | None) -> _dt.datetime | None:
    if ms is None:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000.0, tz=_dt.timezone.utc)


@dataclass(frozen=True)
class Decision:
    """One limit's answer. ``allowed``: admitted (for ``pace``: the slot is booked, act
    after ``delay``). ``delay``: seconds to wait (before acting, or before asking again).
    ``lease``: the token of the lease a ``concurrency`` decision took."""

    allowed: bool
    delay: float
    limit: int
    remaining: int
    reset_after: float
    policy: str
    lease: str | None = None
    fallback: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Decision:
        return cls(
            allowed=bool(d["allowed"]),
            delay=_seconds(d["delay_ms"]),
            limit=int(d["limit"]),
            remaining=int(d["remaining"]),
            reset_after=_seconds(d["reset_after_ms"]),
            policy=str(d["policy"]),
            lease=d.get("lease"),
            fallback=d.get("fallback"),
        )


@dataclass(frozen=True)
class Limit:
    """One limit of a set decided as one: a policy (configured name or spec), a key, and
    optionally this limit's own cost."""

    policy: str
    key: str
    cost: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"policy": self.policy, "key": self.key}
        if self.cost is not None:
            body["cost"] = self.cost
        return body


@dataclass(frozen=True)
class LimitDecision(Decision):
    """One limit's part of a set's answer, with its key."""

    key: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LimitDecision:
        base = Decision.from_json(d)
        return cls(**{**base.__dict__, "key": str(d["key"])})


@dataclass(frozen=True)
class SetDecision:
    """A set of limits decided as one: ``allowed`` only if every limit admitted (and each
    counted it); refused, none changed. ``limits``: each limit's own answer."""

    allowed: bool
    delay: float
    limit: int
    remaining: int
    reset_after: float
    limits: list[LimitDecision]
    fallback: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SetDecision:
        return cls(
            allowed=bool(d["allowed"]),
            delay=_seconds(d["delay_ms"]),
            limit=int(d["limit"]),
            remaining=int(d["remaining"]),
            reset_after=_seconds(d["reset_after_ms"]),
            limits=[LimitDecision.from_json(x) for x in d["limits"]],
            fallback=d.get("fallback"),
        )


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue: its ``group`` (whose policy limits when it starts) and any JSON
    ``payload``. ``delay`` (seconds) or ``not_before`` hold it back; ``dedup_key`` with
    ``dedup_ttl`` (seconds) deduplicates it (``debounce``: a new job replaces the waiting
    one). ``priority``: 0 (the default) starts first, 9 last, within its group's limit;
    ``cost``: what each start counts against its group's and the queue's policies (1 by
    default)."""

    group: str
    payload: Any = None
    id: str | None = None
    delay: float | None = None
    not_before: _dt.datetime | None = None
    max_attempts: int | None = None
    dedup_key: str | None = None
    dedup_ttl: float | None = None
    debounce: bool = False
    priority: int | None = None
    cost: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"group": self.group, "payload": self.payload}
        if self.id is not None:
            body["id"] = self.id
        if self.delay is not None:
            body["delay_ms"] = self.delay * 1000.0
        if self.not_before is not None:
            body["not_before_ms"] = self.not_before.timestamp() * 1000.0
        if self.max_attempts is not None:
            body["max_attempts"] = self.max_attempts
        if self.dedup_key is not None:
            body["dedup"] = {
                "key": self.dedup_key,
                "ttl_ms": (self.dedup_ttl if self.dedup_ttl is not None else 60.0) * 1000.0,
                "replace": self.debounce,
            }
        if self.priority is not None:
            body["priority"] = self.priority
        if self.cost is not None:
            body["cost"] = self.cost
        return body


@dataclass(frozen=True)
class Enqueued:
    """A job enqueued (``created``), or found enqueued already under its id; its state and
    when it is estimated to start (``None`` while its group or queue is paused until
    resumed)."""

    id: str
    state: str
    estimated_start_ms: int | None
    created: bool = True
    deduplicated: bool = False

    @property
    def estimated_start(self) -> _dt.datetime | None:
        return _datetime(self.estimated_start_ms)

    @classmethod
    def from_json(cls, d: dict[str, Any], created: bool) -> Enqueued:
        return cls(
            id=str(d["id"]),
            state=str(d["state"]),
            estimated_start_ms=d.get("estimated_start_ms"),
            created=created,
            deduplicated=bool(d.get("deduplicated", False)),
        )


@dataclass(frozen=True)
class Job:
    """A leased job: work on it while its lease lives, then ack or fail it with
    ``lease``."""

    id: str
    group: str
    payload: Any
    attempt: int
    lease: str
    fence: int
    started_ms: int
    lease_expires_ms: int
    queue: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any], queue: str) -> Job:
        return cls(
            id=str(d["id"]),
            group=str(d["group"]),
            payload=d.get("payload"),
            attempt=int(d["attempt"]),
            lease=str(d["lease"]),
            fence=int(d["fence"]),
            started_ms=int(d["started_ms"]),
            lease_expires_ms=int(d["lease_expires_ms"]),
            queue=queue,
        )


@dataclass(frozen=True)
class JobInfo:
    """A job as ``GET .../jobs/{id}``, the listings and the dead list show it: its
    ``priority`` and ``cost``, its worker's last ``progress`` report and (completed) the
    ``result`` it was acknowledged with, ``None`` when there is none."""

    id: str
    group: str
    state: str
    attempts: int
    max_attempts: int
    last_error: str | None
    enqueued_ms: int
    payload: Any
    not_before_ms: int | None = None
    started_ms: int | None = None
    lease_expires_ms: int | None = None
    worker: str | None = None
    priority: int = 0
    cost: int = 1
    progress: Any = None
    result: Any = None
    finished_ms: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobInfo:
        return cls(
            id=str(d["id"]),
            group=str(d["group"]),
            state=str(d["state"]),
            attempts=int(d["attempts"]),
            max_attempts=int(d["max_attempts"]),
            last_error=d.get("last_error"),
            enqueued_ms=int(d["enqueued_ms"]),
            payload=d.get("payload"),
            not_before_ms=d.get("not_before_ms"),
            started_ms=d.get("started_ms"),
            lease_expires_ms=d.get("lease_expires_ms"),
            worker=d.get("worker"),
            priority=int(d.get("priority", 0)),
            cost=int(d.get("cost", 1)),
            progress=d.get("progress"),
            result=d.get("result"),
            finished_ms=d.get("finished_ms"),
        )


@dataclass(frozen=True)
class GroupStats:
    waiting: int
    active: int
    paused: bool
    paused_until_ms: int | None
    next_eligible_ms: int | None


@dataclass(frozen=True)
class QueueStats:
    """A queue's counts, and each group's."""

    queue: str
    waiting: int
    active: int
    scheduled: int
    dead: int
    paused: bool
    paused_until_ms: int | None
    groups: dict[str, GroupStats] = field(default_factory=dict)
    completed: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueueStats:
        groups = {
            name: GroupStats(
                waiting=int(g["waiting"]),
                active=int(g["active"]),
                paused=bool(g["paused"]),
                paused_until_ms=g.get("paused_until_ms"),
                next_eligible_ms=g.get("next_eligible_ms"),
            )
            for name, g in d.get("groups", {}).items()
        }
        return cls(
            queue=str(d["queue"]),
            waiting=int(d["waiting"]),
            active=int(d["active"]),
            scheduled=int(d["scheduled"]),
            dead=int(d["dead"]),
            paused=bool(d["paused"]),
            paused_until_ms=d.get("paused_until_ms"),
            groups=groups,
            completed=int(d.get("completed", 0)),
        )


@dataclass(frozen=True)
class Schedule:
    """A schedule: a job enqueued into ``group`` with ``payload`` at each tick of ``cron``
    (in ``timezone``), once per tick across every instance; ``next_ms``: its next tick, in
    Unix ms."""

    name: str
    cron: str
    group: str
    payload: Any
    timezone: str
    next_ms: int

    @property
    def next(self) -> _dt.datetime | None:
        return _datetime(self.next_ms)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Schedule:
        return cls(
            name=str(d["name"]),
            cron=str(d["cron"]),
            group=str(d["group"]),
            payload=d.get("payload"),
            timezone=str(d.get("timezone", "UTC")),
            next_ms=int(d["next_ms"]),
        )


@dataclass(frozen=True)
class GroupPolicy:
    """A group's policy spec, and where it comes from (``run_time``: set through the API;
    else the config's)."""

    queue: str
    group: str
    policy: str
    source: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroupPolicy:
        return cls(
            queue=str(d["queue"]),
            group=str(d["group"]),
            policy=str(d["policy"]),
            source=str(d["source"]),
        )
