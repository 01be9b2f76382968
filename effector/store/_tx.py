"""What every phase of the SQL store shares: the transaction, the dialect and the log append.

Each store operation is one transaction, written once as a plain function over :class:`Tx`
(SQL with ``?`` placeholders); the backend supplies the connection and the few differences of
its :class:`Dialect`. Transactions take row locks in one order (see ``effector/README.md``,
"Store layout") so that concurrent PostgreSQL transactions never deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from beam_agents._protos import IntentState, ToolResult

PENDING = IntentState.PENDING
RUNNING = IntentState.RUNNING
AWAITING = IntentState.AWAITING_DECISION
DONE = IntentState.DONE
IN_DOUBT = IntentState.IN_DOUBT
QUEUED_STATES = "(1, 2, 5)"
"""A key's queue (PENDING, RUNNING, IN_DOUBT) in SQL."""
_QUEUE_CONDITION = "{row}kind = 1 AND {row}completed_at_ms IS NULL"
QUEUE_INDEX_CONDITION = _QUEUE_CONDITION.format(row="")
"""The queue index's condition, verbatim: TOOL intents without a result, the same rows as
:data:`QUEUED_STATES`. Claims, releases and reconciliation change none of its columns, so they
leave the index alone; SQLite rewrites a partial index's entry whenever a column its condition
reads changes, as a condition on the state would at every claim."""


def queued(alias: str, *, check_state: bool = True) -> str:
    """``alias``'s row is in its key's queue, said so the queue index serves the query.

    ``check_state=False`` leaves out the state, which the index's condition implies: a count
    then reads the index alone, not each row.
    """
    condition = _QUEUE_CONDITION.format(row=f"{alias}.")
    return f"{condition} AND {alias}.state IN {QUEUED_STATES}" if check_state else condition


ROWS_PER_STATEMENT = 200
"""Rows per multi-row statement, well under every backend's limit on bound parameters."""

_T = TypeVar("_T")


class Cursor(Protocol):
    """The part of a DB-API cursor the transactions use."""

    @property
    def rowcount(self) -> int:
        """Rows changed by the last statement."""

    def fetchone(self) -> Any:
        """Return the next row, or ``None``."""

    def fetchall(self) -> list[Any]:
        """Return every remaining row."""


class Tx(Protocol):
    """One open transaction; SQL is written with ``?`` placeholders in every dialect."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement."""

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per row."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between SQL backends."""

    blob: str
    """The column type for bytes."""
    bigint: str
    """The column type for 64-bit integers."""
    skip_locked: str
    """Appended to a SELECT that picks work: row locks other claimers skip over."""
    for_update: str
    """Appended to a SELECT that reads a row it is about to change."""
    lateral: bool
    """Whether the backend joins LATERAL subqueries (PostgreSQL does, SQLite does not)."""
    contains_bytes: str
    """A condition true when bytes ``{haystack}`` contain bytes ``{needle}`` (SQL templates)."""


def marks(count: int) -> str:
    """``count`` placeholders: ``?, ?, ?``."""
    return ", ".join("?" * count)


def row_marks(count: int, width: int) -> str:
    """Placeholders for ``count`` rows of ``width`` values: ``(?, ?), (?, ?)``."""
    row = f"({marks(width)})"
    return ", ".join([row] * count)


def chunks(items: Sequence[_T], size: int = ROWS_PER_STATEMENT) -> Iterable[Sequence[_T]]:
    """``items`` in slices of at most ``size``, one multi-row statement each."""
    return (items[start : start + size] for start in range(0, len(items), size))


def flatten(rows: Sequence[Sequence[Any]]) -> list[Any]:
    """The values of ``rows``, row after row, as one parameter list."""
    return [value for row in rows for value in row]


def optional_bytes(blob: bytes | None) -> bytes | None:
    """A nullable BLOB as bytes (PostgreSQL hands BYTEA back as memoryview)."""
    return None if blob is None else bytes(blob)


def parse_result(blob: bytes | None) -> ToolResult | None:
    """A nullable serialized ``ToolResult``."""
    return None if blob is None else ToolResult.FromString(bytes(blob))


def read_head(tx: Tx) -> int:
    """The newest offset of the envelope log (0 when it is empty)."""
    (head,) = tx.execute("SELECT head FROM effector_log_head WHERE id = 1").fetchone()
    return int(head)


def append(tx: Tx, envelopes: Sequence[bytes], now_ms: int) -> list[int]:
    """Append serialized envelopes to the log; the head row lock orders offsets by commit."""
    if not envelopes:
        return []
    (head,) = tx.execute(
        "UPDATE effector_log_head SET head = head + ? WHERE id = 1 RETURNING head",
        (len(envelopes),),
    ).fetchone()
    first = int(head) - len(envelopes) + 1
    offsets = list(range(first, int(head) + 1))
    rows = [(offset, envelope, now_ms) for offset, envelope in zip(offsets, envelopes, strict=True)]
    for chunk in chunks(rows):
        tx.execute(
            "INSERT INTO effector_envelopes (log_offset, envelope, appended_at_ms) VALUES "
            + row_marks(len(chunk), 3),
            flatten(chunk),
        )
    return offsets


def head_after(offsets: Sequence[int]) -> int:
    """The log head after an append (0 when nothing was appended)."""
    return offsets[-1] if offsets else 0


def delete_oldest(
    tx: Tx, table: str, key: Sequence[str], time: str, cutoff_ms: int, limit: int, where: str = ""
) -> int:
    """Delete up to ``limit`` rows of ``table`` (``where``) whose ``time`` is before ``cutoff_ms``.

    Oldest first, each row named by its ``key`` columns; returns how many were deleted.
    """
    columns = ", ".join(key)
    named = f"({columns})" if len(key) > 1 else columns
    condition = f"{where} AND " if where else ""
    deleted: int = tx.execute(
        f"""DELETE FROM {table} WHERE {named} IN (
              SELECT {columns} FROM {table} WHERE {condition}{time} < ?
              ORDER BY {time} LIMIT ?)""",
        (cutoff_ms, limit),
    ).rowcount
    return deleted
