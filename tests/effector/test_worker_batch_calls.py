"""EffectorToolRunner.execute_batch: a claim batch's first attempts started in one pass.

Each call's first step runs in the pass; a call that finishes there is reported before the pass
returns, the rest run on under the batch's one deadline. Every outcome maps to the result
``execute`` gives for it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from effector_harness import make_intent
from effector_test_tools import make_registry

from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.tools import IntentInfo, ToolRegistry, tool
from effector.worker import (
    MAX_RESULT_PAYLOAD_BYTES,
    EffectorToolRunner,
    ToolCall,
    prepare_call,
)

Report = tuple[int, ToolResult | None, float]


class Batch:
    """One ``execute_batch`` pass and what it reported, and when."""

    def __init__(self, runner: EffectorToolRunner, calls: Sequence[ToolCall]) -> None:
        self.reports: list[Report] = []
        self.done = asyncio.Event()
        self._expected = len(calls)
        self.tasks = runner.execute_batch(calls, lambda: 1234, self._finished)
        self.in_pass = list(self.reports)

    def _finished(self, index: int, result: ToolResult | None, seconds: float) -> None:
        self.reports.append((index, result, seconds))
        if len(self.reports) == self._expected:
            self.done.set()

    async def results(self, timeout_s: float = 5.0) -> dict[int, ToolResult | None]:
        await asyncio.wait_for(self.done.wait(), timeout_s)
        return {index: result for index, result, _ in self.reports}


def calls_of(registry: ToolRegistry, intents: Sequence[ToolIntent]) -> list[ToolCall]:
    return [ToolCall(intent, *prepare_call(registry, intent), 1) for intent in intents]


def one(registry: ToolRegistry, tool_name: str, args: Any = "{}", seq: int = 0) -> ToolCall:
    return calls_of(registry, [make_intent(tool_name, args, seq=seq)])[0]


@tool(side_effect=True)
async def async_noop() -> None:
    """Return at once."""


@tool(side_effect=True)
async def sleeps(seconds: float) -> str:
    """Sleep on the loop."""
    await asyncio.sleep(seconds)
    return "slept"


@tool(side_effect=True)
async def yields_once() -> int:
    """Give the loop a turn (a bare yield), then return."""
    await asyncio.sleep(0)
    return 7


@tool(side_effect=True)
async def raises_after_awaiting() -> None:
    """Fail after a suspension."""
    await asyncio.sleep(0.01)
    raise ValueError("late failure")


@tool(side_effect=True)
async def exits_after_awaiting() -> None:
    """Call sys.exit() after a suspension."""
    await asyncio.sleep(0)
    sys.exit(4)


@tool(side_effect=True)
async def stops_iteration() -> None:
    """Raise StopIteration in a coroutine (Python turns it into a RuntimeError)."""
    raise StopIteration("escaped")


@tool(side_effect=True)
async def async_not_json() -> object:
    """Return what JSON cannot carry."""
    return {1, 2}


@tool(side_effect=True)
async def async_huge(size: int) -> str:
    """Return a string of ``size`` characters."""
    return "x" * size


@tool(side_effect=True)
async def swallows_cancellation() -> str:
    """Sleep past any deadline, ignoring the first cancellation."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        return "kept going"
    return "woke"


@tool(side_effect=True)
async def own_timeout(*, intent: IntentInfo) -> str:
    """Bound a wait of its own with asyncio.timeout, entered before its first suspension."""
    try:
        async with asyncio.timeout(0.05):
            await asyncio.sleep(10)
    except TimeoutError:
        return f"own timeout {intent.attempt}"
    return "no timeout"


@tool(side_effect=True)
async def names_its_task() -> bool:
    """Whether the task running it is the current task before and after a suspension."""
    before = asyncio.current_task()
    await asyncio.sleep(0)
    return before is not None and before is asyncio.current_task()


futures: list[asyncio.Future[int]] = []


@tool(side_effect=True)
async def awaits_a_future() -> int:
    """Wait for a future someone else settles."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    futures.append(future)
    return await future


@tool(side_effect=True)
def sync_thread_name() -> str:
    """Say which thread runs it."""
    return threading.current_thread().name


REGISTRY = ToolRegistry(
    [
        async_noop,
        sleeps,
        yields_once,
        raises_after_awaiting,
        exits_after_awaiting,
        stops_iteration,
        async_not_json,
        async_huge,
        swallows_cancellation,
        own_timeout,
        names_its_task,
        awaits_a_future,
        sync_thread_name,
    ]
)


@pytest.mark.asyncio
async def test_calls_that_do_not_suspend_finish_in_the_pass_without_tasks() -> None:
    calls = [one(REGISTRY, "async_noop", seq=seq) for seq in range(50)]
    batch = Batch(EffectorToolRunner(), calls)
    assert batch.tasks == []
    assert sorted(index for index, _, _ in batch.in_pass) == list(range(50))
    assert all(r is not None and r.status == ToolResult.OK for _, r, _ in batch.in_pass)
    assert all(r is not None and r.payload == b"null" for _, r, _ in batch.in_pass)


@pytest.mark.asyncio
async def test_calls_that_suspend_continue_from_where_they_stopped() -> None:
    futures.clear()
    calls = [
        one(REGISTRY, "async_noop"),
        one(REGISTRY, "yields_once", seq=1),
        one(REGISTRY, "sleeps", {"seconds": 0.02}, seq=2),
        one(REGISTRY, "awaits_a_future", seq=3),
        one(REGISTRY, "raises_after_awaiting", seq=4),
        one(REGISTRY, "names_its_task", seq=5),
        one(REGISTRY, "sync_thread_name", seq=6),
    ]
    batch = Batch(EffectorToolRunner(), calls)
    assert [index for index, _, _ in batch.in_pass] == [0]
    assert len(batch.tasks) == 6
    assert len(futures) == 1  # its first step ran in the pass
    asyncio.get_running_loop().call_later(0.05, futures[0].set_result, 41)
    results = await batch.results()
    payloads = {index: (r.status, r.payload) for index, r in results.items() if r is not None}
    assert payloads == {
        0: (ToolResult.OK, b"null"),
        1: (ToolResult.OK, b"7"),
        2: (ToolResult.OK, b'"slept"'),
        3: (ToolResult.OK, b"41"),
        4: (ToolResult.ERROR, b""),
        5: (ToolResult.OK, b"true"),
        6: (ToolResult.OK, payloads[6][1]),
    }
    failed = results[4]
    assert failed is not None and failed.error_message == "ValueError: late failure"
    assert payloads[6][1] == b'"effector-tool"'  # sync tools run on the pool's threads


@pytest.mark.asyncio
async def test_a_tool_bounding_its_own_wait_sees_its_own_task() -> None:
    """asyncio.timeout entered in the first step cancels the tool's task, nobody else's."""
    bystander = asyncio.current_task()
    assert bystander is not None
    batch = Batch(EffectorToolRunner(), calls_of(REGISTRY, [make_intent("own_timeout")]))
    results = await batch.results()
    result = results[0]
    assert result is not None and result.payload == b'"own timeout 1"'
    await asyncio.sleep(0.1)  # the bystander was not cancelled by the tool's timeout
    assert not bystander.cancelling()


@pytest.mark.asyncio
async def test_calls_still_running_at_the_batch_deadline_time_out() -> None:
    runner = EffectorToolRunner(tool_timeout_ms=100)
    calls = [
        one(REGISTRY, "sleeps", {"seconds": 5}),
        one(REGISTRY, "sleeps", {"seconds": 0.01}, seq=1),
        one(REGISTRY, "swallows_cancellation", seq=2),
        one(make_registry(), "slow", {"seconds": 2}, seq=3),
    ]
    started = time.monotonic()
    batch = Batch(runner, calls)
    results = await batch.results()
    assert time.monotonic() - started < 1.5
    timed_out, quick, swallowed, sync_slow = (results[i] for i in range(4))
    assert timed_out is not None and timed_out.status == ToolResult.ERROR
    assert timed_out.error_message == "tool 'sleeps' did not finish within 100 ms"
    assert quick is not None and quick.payload == b'"slept"'
    # Like asyncio.timeout today: a tool that swallows its cancellation returns its value.
    assert swallowed is not None and swallowed.payload == b'"kept going"'
    assert sync_slow is not None
    assert sync_slow.error_message == "tool 'slow' did not finish within 100 ms"


@pytest.mark.asyncio
async def test_a_call_cancelled_from_outside_reports_no_result() -> None:
    batch = Batch(EffectorToolRunner(), [one(REGISTRY, "sleeps", {"seconds": 5})])
    for task in batch.tasks:
        task.cancel()
    assert await batch.results() == {0: None}


OUTCOMES: dict[str, tuple[ToolRegistry, str, Any]] = {
    "sync ok": (make_registry(), "add", {"a": 2, "b": "3"}),
    "sync raises": (make_registry(), "fail", {"message": "boom"}),
    "sync exits": (make_registry(), "exits", "{}"),
    "sync not JSON": (make_registry(), "not_json", "{}"),
    "sync too big": (make_registry(), "huge", {"size": 9 * 1024 * 1024}),
    "sync largest": (make_registry(), "huge", {"size": MAX_RESULT_PAYLOAD_BYTES - 2}),
    "async raises late": (REGISTRY, "raises_after_awaiting", "{}"),
    "async exits": (REGISTRY, "exits_after_awaiting", "{}"),
    "async stop iteration": (REGISTRY, "stops_iteration", "{}"),
    "async not JSON": (REGISTRY, "async_not_json", "{}"),
    "async too big": (REGISTRY, "async_huge", {"size": 9 * 1024 * 1024}),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(OUTCOMES))
async def test_each_outcome_maps_to_the_result_execute_gives(case: str, ledger: object) -> None:
    registry, tool_name, args = OUTCOMES[case]
    intent = make_intent(tool_name, args)
    runner = EffectorToolRunner()
    expected = await runner.execute(registry, intent, attempt=1, clock=lambda: 1234)
    batch = Batch(runner, calls_of(registry, [intent]))
    assert (await batch.results()) == {0: expected}


@tool(side_effect=True)
async def cancels_itself() -> None:
    """Raise CancelledError of its own, before suspending."""
    raise asyncio.CancelledError


@pytest.mark.asyncio
async def test_a_call_cancelling_itself_fails_and_spares_the_rest() -> None:
    registry = ToolRegistry([cancels_itself, async_noop])
    calls = [one(registry, "cancels_itself"), one(registry, "async_noop", seq=1)]
    batch = Batch(EffectorToolRunner(), calls)
    results = await batch.results()
    failed = results[0]
    assert failed is not None and failed.status == ToolResult.ERROR
    assert failed.error_message.startswith("CancelledError")
    assert results[1] is not None and results[1].status == ToolResult.OK
