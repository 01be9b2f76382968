"""The PostgreSQL store: one database shared by several effector replicas.

Replicas coordinate only through the database (``SKIP LOCKED`` claims, leases, offsets assigned
under the log head's row lock). Transactions that lose a deadlock or serialization race retry.
"""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors

from effector.store.claims import KeyRowClaims
from effector.store.errors import StoreError
from effector.store.schema import Cursor, Dialect, Tx, create_schema
from effector.store.sql import SqlStore

_T = TypeVar("_T")

POSTGRES = Dialect(
    blob="BYTEA",
    bigint="BIGINT",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    for_update=" FOR UPDATE",
    lateral=True,
    contains_bytes="position({needle} in {haystack}) > 0",
)

_SCHEMA_LOCK = 0x6566_6665_6374_6F72
"""Advisory lock id that serializes schema creation between replicas starting together."""

_RACE_RETRIES = 8
_POLL_INTERVAL_S = 0.05


@functools.lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    """``?`` placeholders numbered as PostgreSQL's own ``$1, $2, ...`` (sent as written)."""
    parts = sql.split("?")
    return (
        "".join(f"{part}${number}" for number, part in enumerate(parts[:-1], start=1)) + parts[-1]
    )


class _PostgresTx:
    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        cursor: Cursor = self._connection.execute(_pg_sql(sql), params)
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._connection.cursor() as cursor:
            cursor.executemany(_pg_sql(sql), rows)


def _create_schema(tx: Tx) -> int:
    tx.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
    return create_schema(tx, POSTGRES)


class PostgresStore(SqlStore):
    """The store in one PostgreSQL database shared by replicas (see the module doc)."""

    def __init__(self, conninfo: str, pool_size: int) -> None:
        executor = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="effector-pg")
        super().__init__(
            POSTGRES,
            executor,
            head=0,
            poll_interval_s=_POLL_INTERVAL_S,
            claims=KeyRowClaims(POSTGRES),
        )
        self._conninfo = conninfo
        self._idle: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._thread_executor = executor

    @classmethod
    async def open(cls, url: str, *, pool_size: int = 4) -> PostgresStore:
        """Connect to the database at ``url`` (a libpq URL) and create the schema if needed."""
        store = cls(url, pool_size)
        try:
            store._announce(await store._run(_create_schema))
        except BaseException:
            await store.close()
            raise
        return store

    def _transaction(self, work: Callable[[Tx], _T], *, write: bool) -> _T:
        connection: psycopg.Connection[Any] | None = None
        try:
            try:
                connection = self._idle.get_nowait()
            except queue.Empty:
                connection = psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=10,
                    cursor_factory=psycopg.RawCursor,
                )
            attempt = 1
            while True:
                try:
                    with connection.transaction():
                        return work(_PostgresTx(connection))
                except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                    if attempt == _RACE_RETRIES:
                        raise
                    time.sleep(0.002 * attempt)
                    attempt += 1
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL store: {type(exc).__name__}: {exc}") from exc
        finally:
            if connection is not None:
                if connection.closed or connection.broken:
                    connection.close()
                else:
                    self._idle.put(connection)

    async def close(self) -> None:
        """Close every connection."""
        self._thread_executor.shutdown(wait=True)
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
