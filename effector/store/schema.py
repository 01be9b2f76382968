"""The SQL store's tables and the few pieces every transaction shares.

A backend supplies the connection and its :class:`Dialect`. Transactions take row locks in one
order (``docs/effector.md``, "Stores"), so concurrent PostgreSQL transactions never deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from beam_agents._protos import IntentState, ToolResult
from effector.store.errors import StoreSchemaError

SCHEMA_VERSION = 1
"""The version of the tables below; a store of another version is refused."""

PENDING = IntentState.PENDING
RUNNING = IntentState.RUNNING
AWAITING = IntentState.AWAITING_DECISION
DONE = IntentState.DONE
IN_DOUBT = IntentState.IN_DOUBT
WITHDRAWN = IntentState.WITHDRAWN
QUEUED_STATES = "(1, 2, 5)"
"""A key's queue (PENDING, RUNNING, IN_DOUBT) in SQL."""
_QUEUE_CONDITION = "{row}kind = 1 AND {row}completed_at_ms IS NULL"
QUEUE_INDEX_CONDITION = _QUEUE_CONDITION.format(row="")
"""The queue index's condition, verbatim: TOOL intents without a result, the same rows as
:data:`QUEUED_STATES`. Claims, releases and reconciliation change none of its columns, so they
leave the index alone; SQLite rewrites a partial index's entry whenever a column its condition
reads changes, as a condition on the state would at every claim."""


def queued(alias: str, *, check_state: bool = True) -> str:
    """``alias``'s row is in its key's queue, said so the queue index serves the query."""
    condition = _QUEUE_CONDITION.format(row=f"{alias}.")
    return f"{condition} AND {alias}.state IN {QUEUED_STATES}" if check_state else condition


ROWS_PER_STATEMENT = 200
"""Rows per multi-row statement, well under every backend's limit on bound parameters."""
PRUNE_BATCH = 10_000
"""Rows deleted per table per transaction when old rows are forgotten."""

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
    bigint: str
    skip_locked: str
    """Appended to a SELECT that picks work: row locks other claimers skip over."""
    for_update: str
    """Appended to a SELECT that reads a row it is about to change."""
    lateral: bool
    """Whether the backend joins LATERAL subqueries (PostgreSQL does, SQLite does not)."""
    contains_bytes: str
    """A condition true when bytes ``{haystack}`` contain bytes ``{needle}`` (SQL templates)."""


def text(value: str) -> str:
    """``value`` as a TEXT column holds it: NUL, which PostgreSQL refuses, becomes U+FFFD.

    Only columns that index or search carry it; the record's own bytes keep the original.
    """
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


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
    rows = [
        (offset, envelope, len(envelope), now_ms)
        for offset, envelope in zip(offsets, envelopes, strict=True)
    ]
    for chunk in chunks(rows):
        tx.execute(
            "INSERT INTO effector_envelopes (log_offset, envelope, size_bytes, appended_at_ms)"
            " VALUES " + row_marks(len(chunk), 4),
            flatten(chunk),
        )
    return offsets


def head_after(offsets: Sequence[int]) -> int:
    """The log head after an append (0 when nothing was appended)."""
    return offsets[-1] if offsets else 0


def delete_oldest(
    tx: Tx, table: str, key: Sequence[str], time: str, cutoff_ms: int, limit: int, where: str = ""
) -> int:
    """Delete up to ``limit`` rows of ``table`` (``where``), oldest before ``cutoff_ms``; count."""
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


_META_TABLE = (
    "CREATE TABLE IF NOT EXISTS effector_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
)


def schema_statements(dialect: Dialect) -> list[str]:
    """Return the DDL that creates every table and index, idempotently."""
    blob, bigint = dialect.blob, dialect.bigint
    return [
        _META_TABLE,
        f"""CREATE TABLE IF NOT EXISTS effector_intents (
            intent_id TEXT PRIMARY KEY,
            entity_key {blob} NOT NULL,
            seq {bigint} NOT NULL,
            step_index {bigint} NOT NULL,
            kind INTEGER NOT NULL,
            digest {blob} NOT NULL,
            intent {blob} NOT NULL,
            state INTEGER NOT NULL,
            received_at_ms {bigint} NOT NULL,
            deadline_ms {bigint} NOT NULL,
            attempts INTEGER NOT NULL,
            result {blob},
            completed_at_ms {bigint},
            published_envelope {blob},
            started_at_ms {bigint},
            tool_name TEXT NOT NULL DEFAULT '',
            in_doubt_reason TEXT,
            retry_at_ms {bigint},
            reconcile_failures INTEGER NOT NULL DEFAULT 0,
            withdraws_intent_id TEXT)""",
        # The queue of each key: TOOL intents not yet DONE (only they are PENDING, RUNNING or
        # IN_DOUBT). The condition's columns close the key: counting a queue reads no row.
        f"""CREATE INDEX IF NOT EXISTS effector_intents_queue
            ON effector_intents (entity_key, seq, step_index, kind, completed_at_ms)
            WHERE {QUEUE_INDEX_CONDITION}""",
        # WITHDRAWAL intents by the intent each withdraws: a Submit finds what came first.
        """CREATE INDEX IF NOT EXISTS effector_intents_withdrawals
            ON effector_intents (withdraws_intent_id) WHERE kind = 3""",
        """CREATE INDEX IF NOT EXISTS effector_intents_awaiting
            ON effector_intents (deadline_ms) WHERE state = 3 AND deadline_ms > 0""",
        # A key's approvals awaiting a decision (the console's keys page); the constant state
        # column makes it cover the count, and beat the state indexes for it without statistics.
        """CREATE INDEX IF NOT EXISTS effector_intents_awaiting_by_key
            ON effector_intents (entity_key, state) WHERE state = 3""",
        # DONE intents by completion (retention; the overview's window, covering latency).
        # Partial: claiming and starting an intent (PENDING -> RUNNING) never writes it.
        """CREATE INDEX IF NOT EXISTS effector_intents_completed
            ON effector_intents (state, completed_at_ms, started_at_ms) WHERE state = 4""",
        # WITHDRAWN intents by completion (retention).
        """CREATE INDEX IF NOT EXISTS effector_intents_withdrawn
            ON effector_intents (state, completed_at_ms) WHERE state = 6""",
        # The console's search by tool, newest first within a state.
        """CREATE INDEX IF NOT EXISTS effector_intents_by_tool
            ON effector_intents (tool_name, state, received_at_ms, intent_id)""",
        # Counts by state, and ListIntents (oldest first within a state).
        """CREATE INDEX IF NOT EXISTS effector_intents_by_state
            ON effector_intents (state, received_at_ms, intent_id)""",
        # A key's intents, newest first (the console's key and intent pages).
        """CREATE INDEX IF NOT EXISTS effector_intents_by_key
            ON effector_intents (entity_key, received_at_ms, intent_id)""",
        # One row per key with work: the per-key execution slot and its lease.
        f"""CREATE TABLE IF NOT EXISTS effector_keys (
            entity_key {blob} PRIMARY KEY,
            pending INTEGER NOT NULL,
            ready_at_ms {bigint} NOT NULL,
            claim_token TEXT,
            claimed_intent_id TEXT,
            lease_owner TEXT,
            lease_expires_at_ms {bigint})""",
        """CREATE INDEX IF NOT EXISTS effector_keys_ready
            ON effector_keys (ready_at_ms) WHERE pending > 0""",
        f"""CREATE TABLE IF NOT EXISTS effector_envelopes (
            log_offset {bigint} PRIMARY KEY,
            envelope {blob} NOT NULL,
            size_bytes {bigint} NOT NULL,
            appended_at_ms {bigint} NOT NULL)""",
        """CREATE INDEX IF NOT EXISTS effector_envelopes_age
            ON effector_envelopes (appended_at_ms)""",
        f"""CREATE TABLE IF NOT EXISTS effector_log_head (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            head {bigint} NOT NULL)""",
        "INSERT INTO effector_log_head (id, head) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
        f"""CREATE TABLE IF NOT EXISTS effector_traces (
            trace_id TEXT NOT NULL,
            span_id TEXT NOT NULL,
            entity_key {blob} NOT NULL,
            seq {bigint} NOT NULL,
            sequence INTEGER NOT NULL,
            event_type INTEGER NOT NULL,
            wall_start_ms {bigint} NOT NULL,
            tokens {bigint} NOT NULL,
            event {blob} NOT NULL,
            recorded_at_ms {bigint} NOT NULL,
            PRIMARY KEY (trace_id, span_id))""",
        # A key's runs, newest first, each in event order.
        """CREATE INDEX IF NOT EXISTS effector_traces_by_key
            ON effector_traces (entity_key, seq, sequence)""",
        """CREATE INDEX IF NOT EXISTS effector_traces_age ON effector_traces (recorded_at_ms)""",
        """CREATE INDEX IF NOT EXISTS effector_traces_llm
            ON effector_traces (wall_start_ms) WHERE event_type = 2""",
        f"""CREATE TABLE IF NOT EXISTS effector_errors (
            error_id TEXT PRIMARY KEY,
            entity_key {blob} NOT NULL,
            reason TEXT NOT NULL,
            error {blob} NOT NULL,
            recorded_at_ms {bigint} NOT NULL,
            redriven_at_ms {bigint})""",
        """CREATE INDEX IF NOT EXISTS effector_errors_by_key
            ON effector_errors (entity_key, recorded_at_ms, error_id)""",
        """CREATE INDEX IF NOT EXISTS effector_errors_age
            ON effector_errors (recorded_at_ms, error_id)""",
        # One row per key seen: the keys page, most recently seen first.
        f"""CREATE TABLE IF NOT EXISTS effector_key_activity (
            entity_key {blob} PRIMARY KEY,
            last_seen_ms {bigint} NOT NULL,
            runs {bigint} NOT NULL)""",
        """CREATE INDEX IF NOT EXISTS effector_key_activity_seen
            ON effector_key_activity (last_seen_ms, entity_key)""",
        f"""CREATE TABLE IF NOT EXISTS effector_records (
            entity_key {blob} NOT NULL,
            seq {bigint} NOT NULL,
            intent_namespace TEXT NOT NULL,
            trace_sequence INTEGER NOT NULL,
            record {blob} NOT NULL,
            recorded_at_ms {bigint} NOT NULL,
            PRIMARY KEY (entity_key, seq, intent_namespace, trace_sequence))""",
        """CREATE INDEX IF NOT EXISTS effector_records_age
            ON effector_records (recorded_at_ms)""",
        f"""CREATE TABLE IF NOT EXISTS effector_approval_votes (
            intent_id TEXT NOT NULL,
            approver TEXT NOT NULL,
            position INTEGER NOT NULL,
            vote {blob} NOT NULL,
            recorded_at_ms {bigint} NOT NULL,
            PRIMARY KEY (intent_id, approver))""",
        f"""CREATE TABLE IF NOT EXISTS effector_compensations (
            original_intent_id TEXT PRIMARY KEY,
            compensation_intent_id TEXT NOT NULL,
            original_was_unknown INTEGER NOT NULL,
            recorded_at_ms {bigint} NOT NULL)""",
        """CREATE INDEX IF NOT EXISTS effector_compensations_age
            ON effector_compensations (recorded_at_ms)""",
        f"""INSERT INTO effector_meta (name, value)
            VALUES ('schema_version', '{SCHEMA_VERSION}') ON CONFLICT (name) DO NOTHING""",
    ]


def create_schema(tx: Tx, dialect: Dialect) -> int:
    """Create the schema if it is missing and check its version; returns the log head."""
    tx.execute(_META_TABLE)
    row = tx.execute("SELECT value FROM effector_meta WHERE name = 'schema_version'").fetchone()
    if row is not None and row[0] != str(SCHEMA_VERSION):
        raise StoreSchemaError(
            f"the store has schema version {row[0]}; this effector understands {SCHEMA_VERSION}"
        )
    for statement in schema_statements(dialect):
        tx.execute(statement)
    return read_head(tx)
