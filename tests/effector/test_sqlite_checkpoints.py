"""The SQLite store checkpoints its write-ahead log on a thread of its own, not in the writer."""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sqlite_url
from effector_harness import make_intent

import effector.store.sqlite as checkpoints
from effector.store import open_store
from effector.store.intents import NewIntent
from effector.store.schema import Tx
from effector.store.sqlite import FRAME_BYTES, GATHER_S, Checkpointer, SqliteStore

_THREAD = "effector-sqlite-checkpoint"


def _checkpoint_threads() -> int:
    return sum(thread.name == _THREAD for thread in threading.enumerate())


async def _wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_commits_reach_the_database_file_through_the_checkpoint_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    threads_before = _checkpoint_threads()
    store = await open_store(sqlite_url(path))
    try:
        assert _checkpoint_threads() == threads_before + 1
        size_after_open = path.stat().st_size
        for n in range(20):
            intent = make_intent("record", {"event": f"e{n}"}, seq=n)
            await store.submit([NewIntent(intent, None)], now_ms=1_000 + n)
        # Far below the writer's own checkpoint (the backstop): in WAL mode only a checkpoint
        # writes the database file, and nothing here asks for one.
        await _wait_for(lambda: path.stat().st_size > size_after_open)
        counts = await store.counts()
    finally:
        await store.close()
    assert counts.pending == 20
    assert _checkpoint_threads() == threads_before
    reopened = sqlite3.connect(path)
    try:
        (stored,) = reopened.execute("SELECT count(*) FROM effector_intents").fetchone()
    finally:
        reopened.close()
    assert stored == 20


@pytest.mark.asyncio
async def test_the_log_stays_bounded_while_commits_never_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PASSIVE checkpoint beside a writer that never pauses cannot let the log start over:
    # the writer's own backstop checkpoint must. Shrunk here so that a test can pass it often.
    monkeypatch.setattr(checkpoints, "BACKSTOP_PAGES", 64)
    path = tmp_path / "b.db"
    wal = Path(f"{path}-wal")
    store = await open_store(sqlite_url(path))
    largest = 0

    def write(tx: Tx, n: int) -> None:
        nonlocal largest
        value = f"{n:08d}" * 2_048  # 16 KiB: four pages and more a commit
        tx.execute("INSERT INTO effector_meta (name, value) VALUES (?, ?)", (f"t{n}", value))
        largest = max(largest, wal.stat().st_size)

    try:
        settings = await store._run(  # type: ignore[attr-defined]
            lambda tx: [
                tx.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("wal_autocheckpoint", "journal_size_limit")
            ]
        )
        # Queued together, the writes run back to back on the writer's thread.
        await asyncio.gather(
            *(store._run(functools.partial(write, n=n)) for n in range(600))  # type: ignore[attr-defined]
        )
    finally:
        await store.close()
    assert settings == [64, 2 * 64 * FRAME_BYTES]
    # About 10 MiB went through the log; it never held much more than the backstop.
    assert largest < 4 * 64 * FRAME_BYTES, f"the log grew to {largest} bytes"


def _log_with_pages(path: Path, pages: int) -> None:
    """A WAL-mode database whose log holds about ``pages`` pages no checkpoint has copied."""
    setup = sqlite3.connect(path, isolation_level=None)
    try:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("PRAGMA wal_autocheckpoint=0")
        setup.execute("CREATE TABLE IF NOT EXISTS filler (value BLOB)")
        setup.executemany("INSERT INTO filler VALUES (?)", [(bytes(4_000),) for _ in range(pages)])
    finally:
        setup.close()


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
    _log_with_pages(path, 1)
    checkpointer = Checkpointer(path, "full")
    failing = _FailingOnce(checkpointer._connection)
    checkpointer._connection = failing  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING, logger="effector.store.sqlite"):
            checkpointer.committed()
            await _wait_for(lambda: failing.calls == 1)
            await _wait_for(lambda: "checkpoint" in caplog.text)
            checkpointer.committed()
            await _wait_for(lambda: failing.calls == 2)
    finally:
        checkpointer.close()
    assert "a WAL checkpoint of the SQLite store failed: disk I/O error" in caplog.text


def test_closing_at_any_point_after_a_commit_returns(tmp_path: Path) -> None:
    # Before the thread wakes, while commits gather, as a checkpoint of a few MiB runs, after.
    for attempt, delay_s in enumerate((0.0, GATHER_S / 4, GATHER_S / 2, 1.2 * GATHER_S, 0.2)):
        path = tmp_path / f"g{attempt}.db"
        _log_with_pages(path, 1_000)
        checkpointer = Checkpointer(path, "full")
        checkpointer.committed()
        time.sleep(delay_s)
        closing = threading.Thread(target=checkpointer.close)
        closing.start()
        closing.join(10)
        assert not closing.is_alive(), f"close() {delay_s} s after a commit never returned"


@pytest.mark.asyncio
async def test_a_store_that_fails_to_open_leaves_no_thread_and_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = sqlite_url(tmp_path / "f.db")
    threads_before = _checkpoint_threads()

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the store could not be built")

    with monkeypatch.context() as patched:
        patched.setattr(SqliteStore, "__init__", refuse)
        with pytest.raises(RuntimeError, match="could not be built"):
            await open_store(url)
    assert _checkpoint_threads() == threads_before
    store = await open_store(url)  # the lock file was let go
    await store.close()
