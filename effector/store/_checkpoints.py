"""WAL checkpoints of the SQLite store, on a thread and connection of their own.

A checkpoint copies committed pages from the write-ahead log into the database file and syncs
it. Left to SQLite, the connection that commits runs one inside its commit whenever the log
passes ``wal_autocheckpoint`` pages (1,000 by default), so every few group commits the one
writer (the store's serial path) stops to copy and sync, and a page rewritten by many commits
is copied again every time. :class:`Checkpointer` runs ``PASSIVE`` checkpoints soon after
commits, beside the writer: they never wait for the writer lock, so writes go on during them.

Such a checkpoint cannot let the log start over while commits keep coming (it never catches
the log's end), so the writer keeps ``wal_autocheckpoint`` at :data:`BACKSTOP_PAGES`: under
sustained writes the log grows to that size (64 MiB), then the writer's own checkpoint copies
what this thread has not yet, and the log starts over. A larger burst (one big transaction)
leaves the file cut back to twice that size (``journal_size_limit``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

_log = logging.getLogger(__name__)

BACKSTOP_PAGES = 16_384
"""The writer's ``wal_autocheckpoint``: how long the log grows under sustained writes.

In a tight loop of 128-row commits (fsynced), against SQLite's default of 1,000 pages with no
thread beside it: 40% more commits, p99 commit 3.3 ms instead of 12; the commit that runs the
writer's checkpoint, one in a few thousand, took up to 50 ms instead of 15.
"""

PAGE_BYTES = 4_096
"""SQLite's default page size, which the store keeps."""

FRAME_BYTES = PAGE_BYTES + 24
"""A page in the log: its frame header, then the page."""

GATHER_S = 0.02
"""After a commit, how long commits gather before one checkpoint takes them all."""


def backstop_pragmas() -> tuple[str, ...]:
    """The writer connection's settings that go with a :class:`Checkpointer` beside it."""
    return (
        f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}",
        f"PRAGMA journal_size_limit={2 * BACKSTOP_PAGES * FRAME_BYTES}",
    )


class Checkpointer:
    """Runs ``PASSIVE`` checkpoints of the store at ``path`` after commits are announced."""

    def __init__(self, path: Path, synchronous: str) -> None:
        # Autocommit, like the writer; its own syncs follow the store's synchronous mode.
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._connection.execute(f"PRAGMA synchronous={synchronous.upper()}")
        except BaseException:
            self._connection.close()
            raise
        self._committed = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="effector-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def committed(self) -> None:
        """Called by the writer after each commit: a checkpoint is due soon."""
        self._committed.set()

    def close(self) -> None:
        """Stop the thread (after the checkpoint in progress, if any) and close its connection."""
        self._closing.set()
        self._committed.set()
        self._thread.join()
        self._connection.close()

    def _run(self) -> None:
        while True:
            self._committed.wait()
            # Commits arriving meanwhile join this checkpoint; a close ends the wait at once.
            if self._closing.wait(GATHER_S):
                return
            # Cleared before closing is looked at: a close after this leaves the event set.
            self._committed.clear()
            if self._closing.is_set():
                return
            try:
                self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except Exception as exc:  # the writer's backstop still bounds the log
                _log.warning("a WAL checkpoint of the SQLite store failed: %s", exc, exc_info=exc)
