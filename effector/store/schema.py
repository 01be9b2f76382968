"""The SQL store's tables and the few pieces every transaction shares.

A backend supplies the connection and its :class:`Dialect`. Transactions take row locks in one
order (``docs/effector.md``, "Stores"), so concurrent PostgreSQL transactions never deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from beam_agents._protos import AgentEnvelope, IntentState, ToolIntent, ToolResult
from effector.store.errors import StoreSchemaError
from effector.store.intents import decision_result

SCHEMA_VERSION = 3
"""The version of the tables below; a store of another version is refused."""

PENDING = IntentState.PENDING
RUNNING = IntentState.RUNNING
AWAITING = IntentState.AWAITING_DECISION
DONE = IntentState.DONE
IN_DOUBT = IntentState.IN_DOUBT
WITHDRAWN = IntentState.WITHDRAWN
OPEN_STATES = (PENDING, RUNNING, AWAITING, IN_DOUBT)
"""The states of an intent without a result (``completed_at_ms IS NULL``)."""
OPEN = "completed_at_ms IS NULL"
"""The open index's condition: intents without a result (queued TOOL intents, approvals
awaiting a decision). No index holds ``state``, ``attempts`` or ``started_at_ms``, so claims,
releases and reconciliation move no index entry (on PostgreSQL they are HOT updates); a result
moves an intent from the open index to the settled one."""
SETTLED = "completed_at_ms IS NOT NULL"
"""The settled index's condition: intents with a result (DONE or WITHDRAWN)."""


def queued(alias: str) -> str:
    """``alias``'s row is in its key's queue (a TOOL intent without a result): the open index."""
    return f"{alias}.{OPEN} AND {alias}.kind = {int(ToolIntent.TOOL)}"


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


def outcome_result(outcome: bytes | None, intent: ToolIntent) -> ToolResult | None:
    """The result of ``intent`` held in its stored outcome envelope (``None``: it has none).

    The outcome is the envelope as published (or, for a withdrawal and a withdrawn intent, as it
    would be): a result's, or a decided approval's, whose result the decision determines.
    """
    if outcome is None:
        return None
    envelope = AgentEnvelope.FromString(bytes(outcome))
    if envelope.HasField("approval"):
        return decision_result(intent, envelope.approval)
    return envelope.tool_result


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
        # ``outcome``: the result's envelope, the bytes published (redelivered byte for byte);
        # the log's row is the only other copy. ``settled_state`` and ``run_ms`` are written
        # with it, once, for the settled index; ``state`` changes on claims and is not indexed.
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
            outcome {blob},
            completed_at_ms {bigint},
            settled_state INTEGER,
            run_ms {bigint},
            started_at_ms {bigint},
            tool_name TEXT NOT NULL DEFAULT '',
            in_doubt_reason TEXT,
            retry_at_ms {bigint},
            reconcile_failures INTEGER NOT NULL DEFAULT 0,
            withdraws_intent_id TEXT,
            refused INTEGER NOT NULL DEFAULT 0,
            policy_rule TEXT,
            policy_outcome TEXT,
            gates_intent_id TEXT)""",
        # Each key's open intents: its queue (TOOL intents, in order) and its approvals awaiting
        # a decision. The condition's column closes the key: counting them reads no row.
        f"""CREATE INDEX IF NOT EXISTS effector_intents_open
            ON effector_intents (entity_key, kind, seq, step_index, completed_at_ms)
            WHERE {OPEN}""",
        # WITHDRAWAL intents by the intent each withdraws: a Submit finds what came first.
        """CREATE INDEX IF NOT EXISTS effector_intents_withdrawals
            ON effector_intents (withdraws_intent_id) WHERE kind = 3""",
        f"""CREATE INDEX IF NOT EXISTS effector_intents_awaiting
            ON effector_intents (deadline_ms) WHERE kind = 2 AND {OPEN} AND deadline_ms > 0""",
        # Settled intents by completion (retention; the overview's window, covering latency;
        # the settled counts).
        f"""CREATE INDEX IF NOT EXISTS effector_intents_settled
            ON effector_intents (completed_at_ms, settled_state, run_ms) WHERE {SETTLED}""",
        # Every intent by receipt (ListIntents, the console's search by state).
        """CREATE INDEX IF NOT EXISTS effector_intents_arrival
            ON effector_intents (received_at_ms, intent_id)""",
        # The console's search by tool, newest first.
        """CREATE INDEX IF NOT EXISTS effector_intents_by_tool
            ON effector_intents (tool_name, received_at_ms, intent_id)""",
        # A key's intents, newest first (the console's key and intent pages).
        """CREATE INDEX IF NOT EXISTS effector_intents_by_key
            ON effector_intents (entity_key, received_at_ms, intent_id)""",
        # The intents an effect policy rule decided, newest first (the console's decisions).
        """CREATE INDEX IF NOT EXISTS effector_intents_policy
            ON effector_intents (received_at_ms, intent_id) WHERE policy_rule IS NOT NULL""",
        # One row per key: the per-key execution slot and its lease, the intent it holds and
        # that intent's attempts, since when it is ready (NULL: no queued work). PostgreSQL's;
        # SQLite holds claims in memory.
        f"""CREATE TABLE IF NOT EXISTS effector_keys (
            entity_key {blob} PRIMARY KEY,
            ready_at_ms {bigint},
            claim_token TEXT,
            claimed_intent_id TEXT,
            attempts INTEGER NOT NULL,
            started_at_ms {bigint},
            lease_owner TEXT,
            lease_expires_at_ms {bigint})""",
        """CREATE INDEX IF NOT EXISTS effector_keys_ready
            ON effector_keys (ready_at_ms, entity_key) WHERE ready_at_ms IS NOT NULL""",
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
        # Fleet budgets (effector.store.budgets): one row per ledger window, one per lease.
        f"""CREATE TABLE IF NOT EXISTS effector_budget_windows (
            ledger TEXT NOT NULL,
            window_start_ms {bigint} NOT NULL,
            window_ms {bigint} NOT NULL,
            cap_tokens {bigint} NOT NULL,
            cap_cost_micros {bigint} NOT NULL,
            cap_requests {bigint} NOT NULL,
            debited_tokens {bigint} NOT NULL,
            debited_cost_micros {bigint} NOT NULL,
            debited_requests {bigint} NOT NULL,
            debits {bigint} NOT NULL,
            updated_at_ms {bigint} NOT NULL,
            PRIMARY KEY (ledger, window_start_ms))""",
        """CREATE INDEX IF NOT EXISTS effector_budget_windows_newest
            ON effector_budget_windows (window_start_ms)""",
        f"""CREATE TABLE IF NOT EXISTS effector_budget_leases (
            lease_id TEXT PRIMARY KEY,
            ledger TEXT NOT NULL,
            window_start_ms {bigint} NOT NULL,
            owner TEXT NOT NULL,
            granted_tokens {bigint} NOT NULL,
            granted_cost_micros {bigint} NOT NULL,
            granted_requests {bigint} NOT NULL,
            debited_tokens {bigint} NOT NULL,
            debited_cost_micros {bigint} NOT NULL,
            debited_requests {bigint} NOT NULL,
            granted_at_ms {bigint} NOT NULL,
            expires_at_ms {bigint} NOT NULL)""",
        """CREATE INDEX IF NOT EXISTS effector_budget_leases_live
            ON effector_budget_leases (ledger, window_start_ms, expires_at_ms)""",
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
