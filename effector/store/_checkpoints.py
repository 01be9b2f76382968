"""WAL checkpoints of the SQLite store, on a thread and connection of their own.

A checkpoint copies committed pages from the write-ahead log into the database file and syncs
it. Left to SQLite, the connection that commits runs it inside its commit once the log passes
``wal_autocheckpoint`` pages, so every few group commits the one writer (the store's serial
path) stops to copy and sync. :class:`Checkpointer` runs ``PASSIVE`` checkpoints instead, soon
after commits, beside the writer: they never wait for the writer lock, so writes go on during
them. The writer keeps a high ``wal_autocheckpoint`` as a backstop, in case this thread falls
behind or a checkpoint fails.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

_log = logging.getLogger(__name__)

BACKSTOP_PAGES = 16_384
"""The writer's own ``wal_autocheckpoint`` (64 MiB of 4 KiB pages): only if this thread lags."""

GATHER_S = 0.02
"""After a commit, how long commits gather before one checkpoint takes them all."""


class Checkpointer:
    """Runs ``PASSIVE`` checkpoints of the store at ``path`` after commits are announced."""

    def __init__(self, path: Path, synchronous: str) -> None:
        # Autocommit, like the writer; its own syncs follow the store's synchronous mode.
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._connection.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._committed = threading.Event()
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, name="effector-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def committed(self) -> None:
        """Called by the writer after each commit: a checkpoint is due soon."""
        self._committed.set()

    def close(self) -> None:
        """Stop the thread (after the checkpoint in progress, if any) and close its connection."""
        self._closing = True
        self._committed.set()
        self._thread.join()
        self._connection.close()

    def _run(self) -> None:
        # ``_closing`` is read after every clear: a close that set the event just before it
        # is then seen, and one after it leaves the event set for the next wait.
        while True:
            self._committed.wait()
            self._committed.clear()
            if self._closing:
                return
            # Commits arriving meanwhile join this checkpoint instead of each waking the thread.
            time.sleep(GATHER_S)
            self._committed.clear()
            if self._closing:
                return
            try:
                self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as exc:  # the writer's backstop still bounds the log
                _log.warning("a WAL checkpoint of the SQLite store failed: %s", exc)
