"""Driving an agent's coroutine from a synchronous ``DoFn``, cheaply.

:class:`CoroutineDriver` steps the coroutine inline first and continues it in an event loop it
owns only if it waits on something; code that needs an ``asyncio.Task`` first awaits
:func:`enter_task`. ``core/README.md`` ("Driving coroutines") explains why and the limits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

from beam_agents.core.errors import ActivationTimeoutError

T = TypeVar("T")


class _EnterTask:
    """Yielded by :func:`enter_task` outside a task: the driver continues in its task at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, Any, None]:
        yield self


_ENTER_TASK = _EnterTask()


async def enter_task() -> None:
    """Make sure what follows runs inside an ``asyncio.Task`` (see the module docstring)."""
    if asyncio.current_task() is None:
        await _ENTER_TASK


class _Continue(Generic[T]):
    """An awaitable that carries on a coroutine already stepped once outside the loop.

    ``yield from`` cannot be used: it would step the coroutine again before handing over the
    object it is already waiting on.
    """

    __slots__ = ("_coroutine", "_yielded")

    def __init__(self, coroutine: Coroutine[Any, Any, T], yielded: Any) -> None:
        self._coroutine = coroutine
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, T]:
        coroutine, yielded = self._coroutine, self._yielded
        while True:
            if yielded is _ENTER_TASK:
                sent = None  # now inside the task: nothing to wait for
            else:
                try:
                    sent = yield yielded
                except BaseException as exc:  # cancellation must reach the agent too
                    try:
                        yielded = coroutine.throw(exc)
                    except StopIteration as stop:
                        return stop.value  # type: ignore[no-any-return]
                    continue
            try:
                yielded = coroutine.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


class CoroutineDriver:
    """Runs coroutines to completion on an event loop it owns, stepping them inline first."""

    __slots__ = ("_deadline", "_loop")

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._deadline = 0.0

    def time_left_s(self) -> float:
        """Seconds left before the coroutine being run times out (negative once it has)."""
        return self._deadline - time.monotonic()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coroutine`` to completion; raise ``ActivationTimeoutError`` after ``timeout_s``."""
        started = time.monotonic()
        self._deadline = started + timeout_s
        previous_loop = asyncio._get_running_loop()
        asyncio._set_running_loop(self._loop)
        try:
            yielded = coroutine.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            asyncio._set_running_loop(previous_loop)
        remaining = timeout_s - (time.monotonic() - started)
        if remaining <= 0:
            coroutine.close()
            raise ActivationTimeoutError(f"the activation did not finish within {timeout_s}s")
        return self._loop.run_until_complete(self._finish(coroutine, yielded, remaining, timeout_s))

    @staticmethod
    async def _finish(
        coroutine: Coroutine[Any, Any, T], yielded: Any, remaining_s: float, timeout_s: float
    ) -> T:
        try:
            async with asyncio.timeout(remaining_s):
                return await _Continue(coroutine, yielded)
        except TimeoutError:
            raise ActivationTimeoutError(
                f"the activation did not finish within {timeout_s}s"
            ) from None

    def close(self) -> None:
        """Close the loop, cancelling anything still scheduled on it."""
        if self._loop.is_closed():
            return
        leftovers = asyncio.all_tasks(self._loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            self._loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()
