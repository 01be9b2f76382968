"""Group commit: concurrent requests share commits, answer in order, and fail alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from effector.store.sql import GroupCommit

Waiter = asyncio.Future[str]


class Ledger:
    """A commit function that records every batch it was given and can be told to fail."""

    def __init__(self, poison: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.poison = poison
        self.gate = asyncio.Event()
        self.gate.set()

    async def commit(self, requests: Sequence[str]) -> list[str]:
        self.batches.append(list(requests))
        await self.gate.wait()
        if self.poison in requests:
            raise RuntimeError(f"cannot commit {self.poison}")
        return [request.upper() for request in requests]


@pytest.mark.asyncio
async def test_a_lone_request_is_committed_at_once() -> None:
    ledger = Ledger()
    group: GroupCommit[str, str] = GroupCommit(ledger.commit)
    assert await group("a") == "A"
    assert ledger.batches == [["a"]]


async def held_commit(ledger: Ledger, request: str) -> tuple[GroupCommit[str, str], Waiter]:
    """A group whose commit of ``request`` has begun and is held until ``ledger.gate`` opens."""
    ledger.gate.clear()
    group: GroupCommit[str, str] = GroupCommit(ledger.commit)
    waiter = asyncio.ensure_future(group(request))
    await asyncio.sleep(0)
    return group, waiter


async def one_then_the_rest(ledger: Ledger, first: str, *rest: str) -> list[object]:
    """Submit ``first``; while its commit is held, submit the ``rest``; release; gather all."""
    group, waiter = await held_commit(ledger, first)
    waiters = [waiter, *(asyncio.ensure_future(group(name)) for name in rest)]
    await asyncio.sleep(0)
    ledger.gate.set()
    return await asyncio.gather(*waiters, return_exceptions=True)


@pytest.mark.asyncio
async def test_requests_arriving_during_a_commit_share_the_next_one() -> None:
    ledger = Ledger()
    assert await one_then_the_rest(ledger, "a", "b", "c", "d") == ["A", "B", "C", "D"]
    assert ledger.batches == [["a"], ["b", "c", "d"]]


@pytest.mark.asyncio
async def test_a_failing_batch_is_retried_one_by_one_and_only_the_bad_request_fails() -> None:
    ledger = Ledger(poison="bad")
    outcomes = await one_then_the_rest(ledger, "a", "b", "bad", "c")
    assert outcomes[:2] == ["A", "B"] and outcomes[3] == "C"
    assert isinstance(outcomes[2], RuntimeError) and "bad" in str(outcomes[2])
    assert ledger.batches == [["a"], ["b", "bad", "c"], ["b"], ["bad"], ["c"]]


@pytest.mark.asyncio
async def test_a_caller_that_gives_up_does_not_take_its_request_out_of_the_commit() -> None:
    ledger = Ledger()
    group, waiter = await held_commit(ledger, "a")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    ledger.gate.set()
    await group.drain()
    assert ledger.batches == [["a"]]
    assert await group("b") == "B"


@pytest.mark.asyncio
async def test_cancelling_a_drain_abandons_what_is_queued() -> None:
    ledger = Ledger()
    group, waiter = await held_commit(ledger, "a")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(group.drain(), 0.01)
    with pytest.raises(asyncio.CancelledError):
        await waiter
    ledger.gate.set()
    assert await group("b") == "B"
