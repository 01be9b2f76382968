"""The coroutine bridge: inline first step, the owned loop only when needed, the timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from beam_agents.core.agent import ActivationTimeoutError, CoroutineDriver, enter_task


@pytest.fixture
def driver() -> Iterator[CoroutineDriver]:
    owned = CoroutineDriver()
    yield owned
    owned.close()


async def finishes_at_once() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


async def sleeps(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


async def gathers() -> list[int]:
    async def one(value: int) -> int:
        await asyncio.sleep(0)
        return value

    return list(await asyncio.gather(one(1), one(2), one(3)))


async def raises() -> None:
    raise LookupError("inside")


def test_a_coroutine_that_never_waits_sees_the_owned_loop_as_running(
    driver: CoroutineDriver,
) -> None:
    loop = driver.run(finishes_at_once(), 1.0)
    assert isinstance(loop, asyncio.AbstractEventLoop)
    assert not loop.is_running()
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # nothing is left installed on this thread


def test_a_coroutine_that_waits_is_finished_on_the_owned_loop(driver: CoroutineDriver) -> None:
    assert driver.run(sleeps(0.01), 1.0) == "slept"
    assert driver.run(gathers(), 1.0) == [1, 2, 3]


def test_exceptions_propagate(driver: CoroutineDriver) -> None:
    with pytest.raises(LookupError, match="inside"):
        driver.run(raises(), 1.0)


def test_a_slow_coroutine_times_out_and_is_cancelled(driver: CoroutineDriver) -> None:
    cancelled = []

    async def watched() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(ActivationTimeoutError, match=r"within 0\.05s"):
        driver.run(watched(), 0.05)
    assert cancelled == [True]
    assert driver.run(sleeps(0), 1.0) == "slept"  # the loop is still usable


def test_close_is_idempotent() -> None:
    owned = CoroutineDriver()
    owned.close()
    owned.close()


async def needs_a_task() -> tuple[bool, bool]:
    inline_has_task = asyncio.current_task() is not None
    await enter_task()
    async with asyncio.timeout(1.0):
        await asyncio.sleep(0)
    return inline_has_task, asyncio.current_task() is not None


def test_enter_task_moves_the_rest_of_the_coroutine_into_a_task(driver: CoroutineDriver) -> None:
    assert driver.run(needs_a_task(), 5.0) == (False, True)


def test_the_timeout_covers_what_runs_after_enter_task(driver: CoroutineDriver) -> None:
    async def enters_then_hangs() -> None:
        await enter_task()
        await asyncio.sleep(5)

    with pytest.raises(ActivationTimeoutError):
        driver.run(enters_then_hangs(), 0.05)
    assert driver.run(needs_a_task(), 5.0) == (False, True)


def test_time_left_counts_down_from_the_timeout(driver: CoroutineDriver) -> None:
    async def measure() -> float:
        await asyncio.sleep(0.05)
        return driver.time_left_s()

    left = driver.run(measure(), 2.0)
    assert 1.0 < left <= 1.95
