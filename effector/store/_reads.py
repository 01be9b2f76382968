"""Reads and retention: the envelope log, one intent, the intents in a state, the counts.

Reads run in read-only transactions (on SQLite, on a connection of their own). :func:`prune`
forgets DONE intents and envelopes older than the retention, a bounded batch per call.
"""

from __future__ import annotations

from beam_agents._protos import AgentEnvelope, IntentState, ToolIntent
from effector.store._tx import AWAITING, DONE, PENDING, RUNNING, Tx, parse_result, read_head
from effector.store.base import IntentRecord, LogRecord, StoreCounts

_PRUNE_BATCH = 10_000
"""Rows deleted per table per prune call, so one prune never holds the store for long."""


def read_log(tx: Tx, from_offset: int, max_records: int) -> list[LogRecord]:
    """Envelopes from ``from_offset`` on, in offset order, at most ``max_records``."""
    rows = tx.execute(
        """SELECT log_offset, envelope FROM effector_envelopes
           WHERE log_offset >= ? ORDER BY log_offset LIMIT ?""",
        (from_offset, max_records),
    ).fetchall()
    return [LogRecord(int(offset), AgentEnvelope.FromString(bytes(blob))) for offset, blob in rows]


def get_intent(tx: Tx, intent_id: str) -> IntentRecord | None:
    """Everything recorded about one intent, or ``None``."""
    row = tx.execute(
        "SELECT intent, state, result, attempts FROM effector_intents WHERE intent_id = ?",
        (intent_id,),
    ).fetchone()
    if row is None:
        return None
    return IntentRecord(ToolIntent.FromString(bytes(row[0])), row[1], parse_result(row[2]), row[3])


def list_intents(tx: Tx, state: IntentState, limit: int) -> list[ToolIntent]:
    """At most ``limit`` intents in ``state``, oldest first (by first receipt, then id)."""
    rows = tx.execute(
        """SELECT intent FROM effector_intents WHERE state = ?
           ORDER BY received_at_ms, intent_id LIMIT ?""",
        (state, limit),
    ).fetchall()
    return [ToolIntent.FromString(bytes(blob)) for (blob,) in rows]


def counts(tx: Tx) -> StoreCounts:
    """How many intents are in each state, and the log head."""
    by_state = dict(
        tx.execute("SELECT state, COUNT(*) FROM effector_intents GROUP BY state").fetchall()
    )
    return StoreCounts(
        pending=int(by_state.get(PENDING, 0)),
        running=int(by_state.get(RUNNING, 0)),
        awaiting_decision=int(by_state.get(AWAITING, 0)),
        done=int(by_state.get(DONE, 0)),
        head_offset=read_head(tx),
    )


def prune(tx: Tx, now_ms: int, retention_ms: int) -> int:
    """Forget DONE intents, envelopes and idle keys past the retention; returns rows removed."""
    cutoff = now_ms - retention_ms
    removed = tx.execute(
        """DELETE FROM effector_intents WHERE intent_id IN (
             SELECT intent_id FROM effector_intents WHERE state = 4 AND completed_at_ms < ?
             ORDER BY completed_at_ms LIMIT ?)""",
        (cutoff, _PRUNE_BATCH),
    ).rowcount
    removed += tx.execute(
        """DELETE FROM effector_envelopes WHERE log_offset IN (
             SELECT log_offset FROM effector_envelopes WHERE appended_at_ms < ?
             ORDER BY appended_at_ms LIMIT ?)""",
        (cutoff, _PRUNE_BATCH),
    ).rowcount
    removed += tx.execute(
        "DELETE FROM effector_keys WHERE pending = 0 AND claim_token IS NULL"
    ).rowcount
    return removed
