"""Reads and retention: the envelope log, one intent, the intents in a state, the counts.

Reads run in read-only transactions (on SQLite, on a connection of their own). :func:`prune`
forgets DONE intents and envelopes older than the retention, a bounded batch per call.
"""

from __future__ import annotations

from beam_agents._protos import AgentEnvelope, IntentState, ToolIntent, ToolResult
from effector.store._tx import AWAITING, DONE, PENDING, RUNNING, Tx, parse_result, read_head
from effector.store.base import IntentRecord, LogRecord, StoreCounts

_PRUNE_BATCH = 10_000
"""Rows deleted per table per prune call, so one prune never holds the store for long."""
_FAILED_SCAN_BATCH = 1_000
"""DONE intents read per query while looking for failed ones."""


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


def list_failed(tx: Tx, limit: int) -> list[tuple[ToolIntent, ToolResult]]:
    """At most ``limit`` DONE intents whose result is not OK, with it, oldest first (receipt, id).

    A result's status is inside its bytes, so DONE intents are read a batch at a time, in the
    order of the ``(state, received_at_ms, intent_id)`` index, until enough failed ones are found.
    """
    found: list[tuple[ToolIntent, ToolResult]] = []
    after: tuple[int, str] | None = None
    params: tuple[int, str] | tuple[()]
    while len(found) < limit:
        where, params = "", ()
        if after is not None:
            where, params = " AND (received_at_ms, intent_id) > (?, ?)", after
        rows = tx.execute(
            "SELECT intent, result, received_at_ms, intent_id FROM effector_intents"
            f" WHERE state = ?{where} ORDER BY received_at_ms, intent_id LIMIT ?",
            (DONE, *params, _FAILED_SCAN_BATCH),
        ).fetchall()
        for blob, result_blob, _, _ in rows:
            result = parse_result(result_blob)
            if result is not None and result.status != ToolResult.OK:
                found.append((ToolIntent.FromString(bytes(blob)), result))
        if len(rows) < _FAILED_SCAN_BATCH:
            break
        after = (rows[-1][2], rows[-1][3])
    return found[:limit]


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
