"""Decisions, sets, batches and concurrency leases, blocking and asyncio."""

from __future__ import annotations

import asyncio

import pytest

from paceline import (
    AsyncClient,
    Client,
    Conflict,
    InvalidArgument,
    Limit,
    PacelineError,
    RateLimited,
    Unauthenticated,
    UnknownPolicy,
)

from .conftest import TOKEN


def test_limit_admits_the_burst_then_refuses_with_a_delay(url: str, unique: str) -> None:
    with Client(url) as client:
        first = client.limit("gcra:rate=1/m,burst=2", unique)
        second = client.limit("gcra:rate=1/m,burst=2", unique)
        third = client.limit("gcra:rate=1/m,burst=2", unique)
    assert (first.allowed, second.allowed, third.allowed) == (True, True, False)
    assert (first.remaining, second.remaining) == (1, 0)
    assert first.policy == "inline" and first.limit == 2
    # Refused: about a minute to wait, and nothing counted.
    assert 30.0 < third.delay <= 60.0
    assert third.remaining == 0


def test_a_configured_policy_is_asked_by_name_and_peek_changes_nothing(url: str, unique: str) -> None:
    with Client(url) as client:
        peeked = [client.peek("api", unique) for _ in range(3)]
        taken = client.limit("api", unique)
    assert all(p.allowed for p in peeked)
    assert len({p.remaining for p in peeked}) == 1
    # Peeks took nothing: the first decision that counts has the whole burst but one left.
    assert taken.policy == "api" and taken.remaining == 1


def test_pace_books_a_slot_each_and_a_wait_over_max_wait_is_refused(url: str, unique: str) -> None:
    with Client(url) as client:
        booked = [client.pace("pacer:rate=1000/s", unique) for _ in range(3)]
        assert all(d.allowed for d in booked)
        slow = "pacer:rate=1/m"
        assert client.pace(slow, unique).allowed
        refused = client.pace(slow, unique, max_wait=0.5)
    assert not refused.allowed
    assert refused.delay > 0.5


def test_a_set_of_limits_is_admitted_only_if_every_limit_admits(url: str, unique: str) -> None:
    with Client(url) as client:
        limits: list[Limit | tuple[str, str]] = [
            Limit("gcra:rate=1/m,burst=1", f"{unique}:a"),
            ("gcra:rate=1/m,burst=5", f"{unique}:b"),
        ]
        first = client.limits(limits)
        second = client.limits(limits)
        # The second limit counted once only: the refused set changed nothing.
        alone = client.peek("gcra:rate=1/m,burst=5", f"{unique}:b")
    assert first.allowed and not second.allowed
    assert [d.key for d in first.limits] == [f"{unique}:a", f"{unique}:b"]
    assert [d.allowed for d in second.limits] == [False, True]
    assert alone.remaining == 4


def test_a_batch_answers_each_request_in_order_and_an_error_in_its_place(url: str, unique: str) -> None:
    with Client(url) as client:
        answers = client.batch(
            [
                Limit("gcra:rate=1/m,burst=1", unique),
                Limit("no-such-policy", unique),
                Limit("gcra:rate=1/m,burst=1", unique),
            ]
        )
    assert len(answers) == 3
    first, missing, again = answers
    assert not isinstance(first, PacelineError) and first.allowed
    assert isinstance(missing, UnknownPolicy) and missing.field == "policy"
    assert not isinstance(again, PacelineError) and not again.allowed


def test_errors_carry_the_service_s_code_and_field(url: str, unique: str) -> None:
    with Client(url) as client:
        with pytest.raises(UnknownPolicy) as unknown:
            client.limit("uploads", unique)
        with pytest.raises(InvalidArgument) as bad:
            client.limit("api", "")
        with pytest.raises(InvalidArgument) as cost:
            client.limit("api", unique, cost=0)
        # More than `api` (a burst of 2) can ever admit: a conflict with the policy.
        with pytest.raises(Conflict) as beyond:
            client.limit("api", unique, cost=3)
        whole = client.limit("api", unique, cost=2)
    assert (unknown.value.status, unknown.value.code, unknown.value.field) == (404, "unknown_policy", "policy")
    assert (bad.value.code, bad.value.field) == ("invalid_argument", "key")
    assert cost.value.field == "cost"
    assert (beyond.value.status, beyond.value.code, beyond.value.field) == (409, "conflict", "cost")
    assert "at most 2" in beyond.value.message
    assert whole.allowed, "nothing was counted for the conflict"
    assert "uploads" in unknown.value.message


def test_a_lease_is_held_in_its_block_and_given_back_after_it(url: str, unique: str) -> None:
    policy = "concurrency:limit=1,lease=30s"
    with Client(url) as client:
        with client.lease(policy, unique) as lease:
            assert lease.token is not None and lease.decision.remaining == 0
            assert 0 < lease.extend() <= 30
            with pytest.raises(RateLimited) as refused:
                client.lease(policy, unique)
            assert refused.value.retry_after > 0
        # Given back: the next one is taken.
        with client.lease(policy, unique) as again:
            assert again.token is not None


def test_the_asyncio_client_decides_and_leases_as_the_blocking_one(url: str, unique: str) -> None:
    async def main() -> None:
        async with AsyncClient(url) as client:
            decisions = await asyncio.gather(
                *(client.limit("gcra:rate=1/m,burst=3", unique) for _ in range(4))
            )
            assert sorted(d.allowed for d in decisions) == [False, True, True, True]
            paced = await client.pace("pacer:rate=1000/s", unique)
            assert paced.allowed
            both = await client.limits([("gcra:rate=1/m,burst=1", f"{unique}:x")], op="peek")
            assert both.allowed and both.limits[0].remaining == 1
            policy = "concurrency:limit=1,lease=30s"
            async with client.lease(policy, unique) as lease:
                assert lease.token is not None
                with pytest.raises(RateLimited):
                    await client.lease(policy, unique)
            taken = await client.lease(policy, unique)
            await taken.release()
            with pytest.raises(UnknownPolicy):
                await client.limit("uploads", unique)

    asyncio.run(main())


def test_the_token_is_sent_and_a_wrong_one_is_a_typed_error(token_url: str, unique: str) -> None:
    with Client(token_url, token=TOKEN) as client:
        assert client.limit("api", unique).allowed
    with Client(token_url, token="wrong") as client:
        with pytest.raises(Unauthenticated) as e:
            client.limit("api", unique)
    assert (e.value.status, e.value.code, e.value.field) == (401, "unauthenticated", "authorization")
