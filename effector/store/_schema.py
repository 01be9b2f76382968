"""The SQL store's schema: the tables and indexes, their version, and the migrations to it.

:func:`create_schema` creates whatever is missing, migrates a version 1 to 5 store in place
and refuses a version it does not know. The tables are described in ``effector/README.md``.
"""

from __future__ import annotations

import json

from beam_agents._protos import AgentEnvelope, Approval, ToolIntent, ToolResult, canonical_json
from effector.errors import StoreSchemaError
from effector.intents import approval_envelope, result_envelope
from effector.store._approvals import approval_statements
from effector.store._compensations import compensation_statements
from effector.store._records import records_statements
from effector.store._telemetry import fill_key_activity, telemetry_statements
from effector.store._tx import QUEUE_INDEX_CONDITION, Dialect, Tx, read_head

SCHEMA_VERSION = 6
"""Bumped (with a migration) whenever a table changes incompatibly.

Version 2 added ``published_envelope`` (the bytes of the envelope that published an intent's
terminal result, kept for redelivery) and indexed intents by ``(state, received_at_ms)``.
Version 3 added ``started_at_ms`` (when an intent's latest execution was claimed) and
``tool_name`` (filled in for the intents already stored), indexed intents by tool and DONE
intents by ``(state, completed_at_ms)`` (replacing ``effector_intents_done``), and filled
``effector_key_activity`` from the intents; the telemetry tables, the activation records
table and the intents' key index are new tables and indexes, created on any version (so the
migration from version 2 creates them too).
Version 4 added ``in_doubt_reason``, ``retry_at_ms`` and ``reconcile_failures`` (an intent
whose reconciler failed: why, when it is asked again, how often it failed in a row) and made
the key queue index cover IN_DOUBT intents too (state 5: they hold their key).
Version 5 added ``effector_compensations`` (which compensation settled each original; see
``store/_compensations.py``): an effector before it would run a compensating intent as an
ordinary one, so it must refuse a store that may hold them.
Version 6 keys the queue index on TOOL intents without a result instead of on their state
(the same rows), so claiming an intent no longer rewrites its queue entry. An effector before
it refuses the store: its queries name the state, which the new index cannot serve.
"""

_MIGRATION_BATCH = 1_000


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
            reconcile_failures INTEGER NOT NULL DEFAULT 0)""",
        # The queue of each key: TOOL intents not yet DONE (only they are PENDING, RUNNING or
        # IN_DOUBT). The condition's columns close the key: counting a queue reads no row.
        f"""CREATE INDEX IF NOT EXISTS effector_intents_queue
            ON effector_intents (entity_key, seq, step_index, kind, completed_at_ms)
            WHERE {QUEUE_INDEX_CONDITION}""",
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
            appended_at_ms {bigint} NOT NULL)""",
        """CREATE INDEX IF NOT EXISTS effector_envelopes_age
            ON effector_envelopes (appended_at_ms)""",
        f"""CREATE TABLE IF NOT EXISTS effector_log_head (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            head {bigint} NOT NULL)""",
        "INSERT INTO effector_log_head (id, head) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
        *telemetry_statements(dialect),
        *records_statements(dialect),
        *approval_statements(dialect),
        *compensation_statements(dialect),
        f"""INSERT INTO effector_meta (name, value)
            VALUES ('schema_version', '{SCHEMA_VERSION}') ON CONFLICT (name) DO NOTHING""",
    ]


def create_schema(tx: Tx, dialect: Dialect) -> int:
    """Create the schema if it is missing and check its version; returns the log head.

    An older store gets its new columns first, then whatever tables and indexes are missing
    (some index the new columns), then the data the new ones start from.
    """
    tx.execute(_META_TABLE)
    row = tx.execute("SELECT value FROM effector_meta WHERE name = 'schema_version'").fetchone()
    version = None if row is None else row[0]
    if version not in (None, "1", "2", "3", "4", "5", str(SCHEMA_VERSION)):
        raise StoreSchemaError(
            f"the store has schema version {version}; this effector understands {SCHEMA_VERSION}"
        )
    migrating = version in ("1", "2", "3", "4", "5")
    if version == "1":
        _migrate_from_version_1(tx, dialect)
    if version in ("1", "2"):
        _add_version_3_columns(tx, dialect)
    if version in ("1", "2", "3"):
        _add_version_4_columns(tx, dialect)
    # Version 5 only adds a table, which the statements below create; version 6 only
    # redefines the queue index, which they create again once the old one is gone.
    if migrating:
        tx.execute("DROP INDEX IF EXISTS effector_intents_queue")
    for statement in schema_statements(dialect):
        tx.execute(statement)
    if version in ("1", "2"):
        fill_key_activity(tx)
    if migrating:
        tx.execute(
            "UPDATE effector_meta SET value = ? WHERE name = 'schema_version'",
            (str(SCHEMA_VERSION),),
        )
    return read_head(tx)


def _add_version_4_columns(tx: Tx, dialect: Dialect) -> None:
    """Add the reconciliation columns; drop the queue index, recreated to cover IN_DOUBT."""
    tx.execute("ALTER TABLE effector_intents ADD COLUMN in_doubt_reason TEXT")
    tx.execute(f"ALTER TABLE effector_intents ADD COLUMN retry_at_ms {dialect.bigint}")
    tx.execute(
        "ALTER TABLE effector_intents ADD COLUMN reconcile_failures INTEGER NOT NULL DEFAULT 0"
    )
    tx.execute("DROP INDEX IF EXISTS effector_intents_queue")


def _add_version_3_columns(tx: Tx, dialect: Dialect) -> None:
    """Add ``started_at_ms`` and ``tool_name`` (filled in from each intent's bytes)."""
    tx.execute(f"ALTER TABLE effector_intents ADD COLUMN started_at_ms {dialect.bigint}")
    tx.execute("ALTER TABLE effector_intents ADD COLUMN tool_name TEXT NOT NULL DEFAULT ''")
    tx.execute("DROP INDEX IF EXISTS effector_intents_done")
    after = ""
    while True:
        rows = tx.execute(
            """SELECT intent_id, intent FROM effector_intents
               WHERE intent_id > ? ORDER BY intent_id LIMIT ?""",
            (after, _MIGRATION_BATCH),
        ).fetchall()
        if not rows:
            return
        named = [(ToolIntent.FromString(bytes(blob)).tool_name, i) for i, blob in rows]
        updates = [(name, intent_id) for name, intent_id in named if name]
        if updates:
            tx.executemany("UPDATE effector_intents SET tool_name = ? WHERE intent_id = ?", updates)
        after = rows[-1][0]


def _migrate_from_version_1(tx: Tx, dialect: Dialect) -> None:
    """Add ``published_envelope`` and fill it in for every intent already DONE.

    Version 1 kept only the result; the envelope that published it is rebuilt the way it was
    built then (an ``Approval`` from the decision recorded in an approval's OK payload, a
    ``tool_result`` envelope otherwise), which yields the same bytes.
    """
    tx.execute(f"ALTER TABLE effector_intents ADD COLUMN published_envelope {dialect.blob}")
    tx.execute("DROP INDEX IF EXISTS effector_intents_state")
    after = ""
    while True:
        rows = tx.execute(
            """SELECT intent_id, intent, result FROM effector_intents
               WHERE state = 4 AND intent_id > ? ORDER BY intent_id LIMIT ?""",
            (after, _MIGRATION_BATCH),
        ).fetchall()
        if not rows:
            break
        updates = []
        for intent_id, intent_blob, result_blob in rows:
            intent = ToolIntent.FromString(bytes(intent_blob))
            result = ToolResult.FromString(bytes(result_blob))
            updates.append((_version_1_envelope(intent, result).SerializeToString(), intent_id))
        tx.executemany(
            "UPDATE effector_intents SET published_envelope = ? WHERE intent_id = ?", updates
        )
        after = rows[-1][0]


def _version_1_envelope(intent: ToolIntent, result: ToolResult) -> AgentEnvelope:
    if intent.kind == ToolIntent.APPROVAL and result.status == ToolResult.OK:
        decision = json.loads(result.payload)
        approval = Approval(
            intent_id=intent.intent_id,
            approved=decision["approved"],
            approver=decision["approver"],
            decided_at_ms=decision["decided_at_ms"],
            reason=decision["reason"],
            args_digest=decision.get("args_digest", ""),
            approvers=decision.get("approvers", []),
        )
        if "edited_args" in decision:
            approval.edited_args_json = canonical_json(decision["edited_args"])
        return approval_envelope(approval, intent.entity_key)
    return result_envelope(result)
