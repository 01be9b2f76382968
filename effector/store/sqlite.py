"""The embedded SQLite store: the default, for one effector process.

WAL mode: writes on one connection and thread, reads on another, checkpoints on a third. A lock
file keeps a second process out, so claims live in memory (:class:`MemoryClaims`): a clean close
records the attempts they counted; after a crash each key's head counts as possibly started.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

from effector.store.claims import MemoryClaims
from effector.store.errors import ConfigurationError, StoreBusyError, StoreError
from effector.store.schema import OPEN, Cursor, Dialect, Tx, create_schema
from effector.store.sql import SqlStore

_T = TypeVar("_T")
_log = logging.getLogger(__name__)

_CACHED_STATEMENTS = 2_048
"""Prepared statements kept per connection: every batch size of every batched statement."""

SQLITE = Dialect(
    blob="BLOB",
    bigint="INTEGER",
    skip_locked="",
    for_update="",
    lateral=False,
    contains_bytes="instr({haystack}, {needle}) > 0",
)

_SYNCHRONOUS_MODES = ("full", "normal")


class _SqliteTx:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self._connection.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._connection.executemany(sql, rows)


def parse_sqlite_url(url: str) -> tuple[Path, str]:
    """The path and ``synchronous`` mode of ``sqlite:///relative.db`` or ``sqlite:////abs.db?...``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ConfigurationError(f"a SQLite store URL starts with {prefix!r}")
    location, _, query = url[len(prefix) :].partition("?")
    if not location or location == ":memory:":
        raise ConfigurationError(
            "a SQLite store needs a file path (an in-memory one is not durable)"
        )
    options = urllib.parse.parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"synchronous"})
    if unknown:
        raise ConfigurationError(f"unknown SQLite store option(s): {', '.join(unknown)}")
    synchronous = options.get("synchronous", ["full"])[-1].lower()
    if synchronous not in _SYNCHRONOUS_MODES:
        raise ConfigurationError(
            f"synchronous must be one of {', '.join(_SYNCHRONOUS_MODES)}, not {synchronous!r}"
        )
    return Path(urllib.parse.unquote(location)), synchronous


class SqliteStore(SqlStore):
    """The store in one SQLite file (see the module doc)."""

    def __init__(
        self,
        connections: tuple[sqlite3.Connection, sqlite3.Connection],
        lock_file: IO[bytes],
        path: Path,
        head: int,
        checkpointer: Checkpointer,
        claims: MemoryClaims,
    ) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="effector-sqlite")
        read_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="effector-sqlite-read")
        super().__init__(
            SQLITE,
            executor,
            head,
            poll_interval_s=None,
            claims=claims,
            read_executor=read_executor,
            claim_with_results=True,
        )
        self._connection, self._read_connection = connections
        self._lock_file = lock_file
        self._path = path
        self._thread_executors = (executor, read_executor)
        self._checkpointer = checkpointer
        self._memory_claims = claims

    @classmethod
    async def open(cls, url: str) -> SqliteStore:
        """Open (creating if needed) the store at ``url``; see :func:`parse_sqlite_url`."""
        path, synchronous = parse_sqlite_url(url)
        with contextlib.ExitStack() as undo:  # on failure, closes what was opened, in reverse
            lock_file = _lock_exclusively(path)
            undo.callback(lock_file.close)
            try:
                # Batched statements take one SQL text per batch size; a cache big enough for
                # all of them keeps every statement prepared once, not again after each eviction.
                connection = sqlite3.connect(
                    path,
                    isolation_level=None,
                    check_same_thread=False,
                    cached_statements=_CACHED_STATEMENTS,
                )
                undo.callback(connection.close)
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(f"PRAGMA synchronous={synchronous.upper()}")
                for pragma in backstop_pragmas():
                    connection.execute(pragma)
                claims = MemoryClaims()
                head = _in_transaction(
                    connection, path, functools.partial(_open_schema, claims), write=True
                )
                # Opened after the schema and WAL mode exist, which a read-only one cannot set.
                reader = sqlite3.connect(
                    path.resolve().as_uri() + "?mode=ro",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
                undo.callback(reader.close)
                checkpointer = Checkpointer(path, synchronous)
                undo.callback(checkpointer.close)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open SQLite store {path}: {exc}") from exc
            store = cls((connection, reader), lock_file, path, head, checkpointer, claims)
            undo.pop_all()
        return store

    def _transaction(self, work: Callable[[Tx], _T], *, write: bool) -> _T:
        if not write:
            return _in_transaction(self._read_connection, self._path, work, write=False)
        try:
            outcome = _in_transaction(self._connection, self._path, work, write=True)
        except BaseException:
            self._memory_claims.rollback()
            raise
        self._memory_claims.commit()
        self._checkpointer.committed()
        return outcome

    async def close(self) -> None:
        """Record the claims' attempts, close the connections (each on its thread), unlock."""
        try:
            await self._run(self._save_claims)
        except StoreError as exc:  # the next open counts every key's head as started
            _log.warning("recording the claims' attempts at close failed: %s", exc)
        await asyncio.get_running_loop().run_in_executor(None, self._checkpointer.close)
        for executor, connection in zip(
            self._thread_executors, (self._connection, self._read_connection), strict=True
        ):
            executor.submit(connection.close).result()
            executor.shutdown(wait=True)
        self._lock_file.close()

    def _save_claims(self, tx: Tx) -> None:
        """Record the attempts only the claims know, and that they are recorded."""
        tx.executemany(
            f"""UPDATE effector_intents SET attempts = ?, started_at_ms = ?
                WHERE intent_id = ? AND {OPEN}""",
            [
                (hold.attempts, hold.started_at_ms, hold.intent_id)
                for hold in self._memory_claims.unsaved()
            ],
        )
        tx.execute(
            f"INSERT INTO effector_meta (name, value) VALUES ('{_CLAIMS_SAVED}', '1')"
            " ON CONFLICT (name) DO NOTHING"
        )


_CLAIMS_SAVED = "claims_saved"
"""The meta row a clean close leaves: the attempts of every claim are in the intents' rows."""


def _open_schema(claims: MemoryClaims, tx: Tx) -> int:
    head = create_schema(tx, SQLITE)
    saved = tx.execute(
        "DELETE FROM effector_meta WHERE name = ? RETURNING name", (_CLAIMS_SAVED,)
    ).fetchone()
    claims.load(tx, crashed=saved is None)
    return head


def _in_transaction(
    connection: sqlite3.Connection, path: Path, work: Callable[[Tx], _T], *, write: bool
) -> _T:
    try:
        connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            outcome = work(_SqliteTx(connection))
        except BaseException:
            if connection.in_transaction:  # SQLite may have rolled back already (I/O errors)
                connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StoreError(f"SQLite store {path}: {exc}") from exc
    return outcome


def _lock_exclusively(path: Path) -> IO[bytes]:
    lock_path = path.with_name(path.name + "-effector.lock")
    try:
        lock_file = open(lock_path, "ab")  # noqa: SIM115 - held open for the store's lifetime
    except OSError as exc:
        raise ConfigurationError(f"cannot create the SQLite store's lock file: {exc}") from exc
    try:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        raise StoreBusyError(
            f"SQLite store {path} is in use by another effector process (it holds "
            f"{lock_path.name}); a SQLite store serves one process, use PostgreSQL for replicas"
        ) from None
    return lock_file


# -- WAL checkpoints ----------------------------------------------------------------------------
# Left to SQLite, the one writer would stop to checkpoint inside its commits. The Checkpointer
# runs PASSIVE checkpoints beside it instead; those cannot restart the log while commits keep
# coming, so the writer's own checkpoint at BACKSTOP_PAGES (64 MiB of log) is the backstop.

BACKSTOP_PAGES = 16_384
"""The writer's ``wal_autocheckpoint``: how long the log grows under sustained writes."""

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
