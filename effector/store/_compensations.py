"""Compensations in the store: which compensation settled each original, and the checks on it.

``effector_compensations`` holds one row per original: the compensation that executes for it
(one undo per effect), or the one refused because the original was unknown when it was
claimed (``original_was_unknown``), so that original is refused at Submit if it arrives later.
An original and its compensation share their entity key: settling locks the key row, and
Submit locks (creating it if missing) the key row of every linked intent before looking the
table up, so on PostgreSQL either the settle sees the original or the Submit sees the row
(SQLite runs one write transaction at a time). See "Compensation" in ``effector/README.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

import effector.store._execution as execution
import effector.store._reads as reads
import effector.store._tx as sql
from beam_agents._protos import ToolIntent
from effector.compensation import arrived_late, late_original_reason, verdict
from effector.intents import rejected_result, result_envelope
from effector.store.base import Claim, CompensationSettlement, Completion, NewIntent

_PRUNE_BATCH = 10_000


def compensation_statements(dialect: sql.Dialect) -> list[str]:
    """The DDL of the compensations table (schema version 5), idempotently."""
    return [
        f"""CREATE TABLE IF NOT EXISTS effector_compensations (
            original_intent_id TEXT PRIMARY KEY,
            compensation_intent_id TEXT NOT NULL,
            original_was_unknown INTEGER NOT NULL,
            recorded_at_ms {dialect.bigint} NOT NULL)""",
        """CREATE INDEX IF NOT EXISTS effector_compensations_age
            ON effector_compensations (recorded_at_ms)""",
    ]


def refused_originals(tx: sql.Tx, intents: Sequence[NewIntent], now_ms: int) -> dict[str, str]:
    """Intents of a Submit compensated before they arrived, each with why it is refused.

    Only an intent that declares an undo can have one (``ctx.compensate`` refuses any other),
    so only those are looked up: a Submit of plain intents costs nothing here. Locks their key
    rows first (in key order, creating missing ones with no work), the lock a settling
    compensation takes on the same key.
    """
    linked = [new for new in intents if new.intent.compensate_tool and new.rejection is None]
    keys = sorted({new.intent.entity_key for new in linked})
    for keys_chunk in sql.chunks(keys):
        tx.execute(
            f"""INSERT INTO effector_keys (entity_key, pending, ready_at_ms)
                VALUES {sql.row_marks(len(keys_chunk), 3)}
                ON CONFLICT (entity_key) DO UPDATE SET pending = effector_keys.pending""",
            sql.flatten([(key, 0, now_ms) for key in keys_chunk]),
        )
    ids = sorted({new.intent.intent_id for new in linked if new.intent.kind == ToolIntent.TOOL})
    refused: dict[str, str] = {}
    for chunk in sql.chunks(ids):
        for original, compensation in tx.execute(
            f"""SELECT original_intent_id, compensation_intent_id FROM effector_compensations
                WHERE original_intent_id IN ({sql.marks(len(chunk))})
                  AND original_was_unknown = 1""",
            chunk,
        ).fetchall():
            refused[original] = late_original_reason(compensation)
    return refused


def settle(
    tx: sql.Tx, dialect: sql.Dialect, claim: Claim, now_ms: int
) -> tuple[CompensationSettlement, int]:
    """See :meth:`EffectorStore.settle_compensation`; returns, besides, the log head (0: none)."""
    compensation = claim.intent
    target = compensation.compensates_intent_id
    held = tx.execute(
        "SELECT claim_token FROM effector_keys WHERE entity_key = ?" + dialect.for_update,
        (compensation.entity_key,),
    ).fetchone()
    if held is None or held[0] != claim.token:
        return CompensationSettlement(execute=False), 0
    envelopes: list[bytes] = []
    original = reads.get_intent(tx, target)
    refused_original = None
    if original is not None and arrived_late(original, compensation):
        refusal = rejected_result(
            original.intent, late_original_reason(compensation.intent_id), now_ms=now_ms
        )
        published = execution.finish(
            tx, target, refusal, result_envelope(refusal), now_ms, sql.PENDING
        )
        if published is not None:
            tx.execute(
                "UPDATE effector_keys SET pending = pending - 1 WHERE entity_key = ?",
                (compensation.entity_key,),
            )
            envelopes.append(published)
            refused_original = original.intent
        original = reads.get_intent(tx, target)
    row = tx.execute(
        """SELECT compensation_intent_id FROM effector_compensations
           WHERE original_intent_id = ?""",
        (target,),
    ).fetchone()
    compensated_by = None if row is None else str(row[0])
    result = verdict(
        original, compensation, now_ms=now_ms, attempt=claim.attempt, compensated_by=compensated_by
    )
    if result is None or original is None:
        tx.execute(
            """INSERT INTO effector_compensations (original_intent_id, compensation_intent_id,
                 original_was_unknown, recorded_at_ms)
               VALUES (?, ?, ?, ?) ON CONFLICT (original_intent_id) DO NOTHING""",
            (target, compensation.intent_id, int(original is None), now_ms),
        )
    head = sql.head_after(sql.append(tx, envelopes, now_ms))
    if result is None:
        return CompensationSettlement(execute=True, refused_original=refused_original), head
    [recorded], completed_head = execution.record_completions(
        tx, dialect, [Completion(claim, result)], now_ms
    )
    settlement = CompensationSettlement(False, result, recorded, refused_original)
    return settlement, max(head, completed_head)


def prune(tx: sql.Tx, now_ms: int, retention_ms: int) -> int:
    """Forget compensation rows older than the result retention (as intents are forgotten)."""
    return sql.delete_oldest(
        tx,
        "effector_compensations",
        ["original_intent_id"],
        "recorded_at_ms",
        now_ms - retention_ms,
        _PRUNE_BATCH,
    )
