"""The SQLite store checkpoints its write-ahead log on a thread of its own, not in the writer."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sqlite_url
from effector_harness import make_intent

from effector.store import open_store
from effector.store._checkpoints import BACKSTOP_PAGES, GATHER_S, Checkpointer
from effector.store.base import NewIntent

_THREAD = "effector-sqlite-checkpoint"


def _checkpoint_threads() -> int:
    return sum(thread.name == _THREAD for thread in threading.enumerate())


async def _wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_few_commits_reach_the_database_file_without_the_writer_checkpointing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    threads_before = _checkpoint_threads()
    store = await open_store(sqlite_url(path))
    try:
        assert _checkpoint_threads() == threads_before + 1
        # The writer checkpoints only as a backstop, far beyond what these commits write.
        (autocheckpoint,) = await store._run(  # type: ignore[attr-defined]
            lambda tx: tx.execute("PRAGMA wal_autocheckpoint").fetchone(), write=True
        )
        assert autocheckpoint == BACKSTOP_PAGES
        size_after_open = path.stat().st_size
        for n in range(20):
            intent = make_intent("record", {"event": f"e{n}"}, seq=n)
            await store.submit([NewIntent(intent, None)], now_ms=1_000 + n)
        # In WAL mode only a checkpoint writes the database file; nothing here asks for one.
        await _wait_for(lambda: path.stat().st_size > size_after_open)
        counts = await store.counts()
    finally:
        await store.close()
    assert counts.pending == 20
    assert _checkpoint_threads() == threads_before
    with sqlite3.connect(path) as reopened:
        (stored,) = reopened.execute("SELECT count(*) FROM effector_intents").fetchone()
    assert stored == 20


class _FailingOnce:
    """Stands in for the checkpointer's connection: the first checkpoint raises."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self.calls = 0

    def execute(self, sql: str) -> sqlite3.Cursor:
        self.calls += 1
        if self.calls == 1:
            raise sqlite3.OperationalError("disk I/O error")
        return self._connection.execute(sql)

    def close(self) -> None:
        self._connection.close()


@pytest.mark.asyncio
async def test_a_failed_checkpoint_is_logged_and_the_next_commit_checkpoints_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
    checkpointer = Checkpointer(path, "full")
    failing = _FailingOnce(checkpointer._connection)
    checkpointer._connection = failing  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING, logger="effector.store._checkpoints"):
            checkpointer.committed()
            await _wait_for(lambda: failing.calls == 1)
            await _wait_for(lambda: "checkpoint" in caplog.text)
            checkpointer.committed()
            await _wait_for(lambda: failing.calls == 2)
    finally:
        checkpointer.close()
    assert "a WAL checkpoint of the SQLite store failed: disk I/O error" in caplog.text


def test_closing_while_commits_gather_returns_at_once(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
    for _ in range(5):
        checkpointer = Checkpointer(path, "full")
        checkpointer.committed()
        time.sleep(GATHER_S / 4)  # the thread is now gathering commits
        closing = threading.Thread(target=checkpointer.close)
        closing.start()
        closing.join(5)
        assert not closing.is_alive(), "close() waited for a commit that never came"
