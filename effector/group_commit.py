"""Group commit: concurrent requests share one store transaction instead of one each.

A durable transaction costs an fsync however little it writes, so writing each request on its
own caps the request rate at the disk's sync rate. :class:`GroupCommit` queues requests; while
one batch is being committed the next ones gather, and they all go into the following commit.
An idle store therefore commits a lone request at once (no added latency), and a busy one
commits ever larger batches (throughput grows with load instead of latency).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

_Request = TypeVar("_Request")
_Answer = TypeVar("_Answer")


class GroupCommit(Generic[_Request, _Answer]):
    """Commits requests in batches through ``commit``, which answers each, in order.

    If a batch of several requests fails, each of its requests is committed again on its own,
    so one request the store cannot take fails alone rather than taking its neighbours down.
    """

    def __init__(
        self, commit: Callable[[Sequence[_Request]], Awaitable[Sequence[_Answer]]]
    ) -> None:
        self._commit = commit
        self._queue: list[tuple[_Request, asyncio.Future[_Answer]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def __call__(self, request: _Request) -> _Answer:
        """Queue ``request``, and return its answer once the batch it joined is committed."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_Answer] = loop.create_future()
        self._queue.append((request, answer))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="effector-group-commit")
        # Shielded: a caller that gives up must not pull its request out of a commit that has
        # begun; the request is committed all the same and the answer goes unread.
        return await asyncio.shield(answer)

    async def drain(self) -> None:
        """Wait until everything queued is committed (or has failed).

        Cancelling the wait abandons the commit in progress and everything queued: their
        callers see ``CancelledError``.
        """
        while self._flusher is not None:
            await self._flusher

    async def _flush(self) -> None:
        batch: list[tuple[_Request, asyncio.Future[_Answer]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._commit_batch(batch)
        finally:
            self._flusher = None
            # Only a cancelled flusher (the loop is closing) leaves answers unset.
            for _, answer in batch + self._queue:
                answer.cancel()

    async def _commit_batch(self, batch: list[tuple[_Request, asyncio.Future[_Answer]]]) -> None:
        try:
            answers = await self._commit([request for request, _ in batch])
        except Exception as exc:
            if len(batch) > 1:
                for single in batch:
                    await self._commit_batch([single])
            elif not batch[0][1].done():
                batch[0][1].set_exception(exc)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)
