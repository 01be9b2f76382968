"""Intake: recording submitted intents, deduplicated by id, in one transaction per group.

The first request for an id records it (PENDING, AWAITING_DECISION for an approval, or DONE
with a REJECTED result); a later one is a DUPLICATE (same digest) or a CONFLICT (different
content, answered with the recorded intent), and a DUPLICATE of a DONE intent may ask for its
result envelope to be appended again.
The key rows of linked intents are locked first (see ``store/_compensations.py``), then new
intent rows are written in id order, then key rows in key order (the lock order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import effector.store._compensations as compensations
import effector.store._tx as sql
from beam_agents._protos import IntentState, ToolIntent, ToolResult
from effector.intents import (
    expiry_deadline_ms,
    intent_digest,
    rejected_result,
    result_envelope,
    serialize_intent,
)
from effector.store.base import NewIntent, SubmitOutcome, SubmitResult


@dataclass(frozen=True, slots=True)
class _Recorded:
    """What is recorded about an intent id, as far as a submit needs to answer for it."""

    digest: bytes
    state: IntentState
    result: ToolResult | None
    published_envelope: bytes | None


def submit(
    tx: sql.Tx, intents: Sequence[NewIntent], now_ms: int, redeliver: Sequence[bool]
) -> tuple[list[SubmitResult], int]:
    """Record ``intents``; ``redeliver[i]`` says whether intent ``i`` asked for redelivery.

    Returns one answer per intent, in request order, and the log head after the envelopes it
    appended (rejections and redeliveries, in request order; 0 if none). An original
    compensated before it arrived is recorded REJECTED (``store/_compensations.py``).
    """
    refused = compensations.refused_originals(tx, intents, now_ms)
    if refused:
        intents = [
            dataclasses.replace(new, rejection=refused[new.intent.intent_id])
            if new.intent.intent_id in refused
            else new
            for new in intents
        ]
    blobs = [serialize_intent(new.intent) for new in intents]
    digests = [intent_digest(blob) for blob in blobs]
    # Rows are written in id order (the lock order in the module docstring); the first of
    # several requests for one id in a batch is the one recorded, the rest answer against it.
    order = sorted(range(len(intents)), key=lambda i: (intents[i].intent.intent_id, i))
    first_of: dict[str, int] = {}
    for index in order:
        first_of.setdefault(intents[index].intent.intent_id, index)
    candidates: dict[str, _Recorded] = {}
    rows: list[tuple[Any, ...]] = []
    for intent_id, index in first_of.items():
        intent = intents[index].intent
        state, result = _initial_state(intents[index], now_ms)
        published = None if result is None else result_envelope(result).SerializeToString()
        candidates[intent_id] = _Recorded(digests[index], state, result, published)
        rows.append(
            (
                intent_id,
                intent.entity_key,
                intent.seq,
                intent.step_index,
                intent.kind,
                digests[index],
                blobs[index],
                state,
                now_ms,
                expiry_deadline_ms(intent, now_ms),
                0,
                None if result is None else result.SerializeToString(),
                None if result is None else now_ms,
                published,
                intent.tool_name,
            )
        )
    inserted = _insert_intents(tx, rows)
    recorded = _recorded_intents(tx, [i for i in first_of if i not in inserted])
    recorded.update((intent_id, candidates[intent_id]) for intent_id in inserted)
    answers: list[SubmitResult | None] = [None] * len(intents)
    conflicts: list[int] = []
    # The log gets what this submit appends in request order.
    envelopes: dict[int, bytes] = {}
    new_work: dict[bytes, int] = {}
    for index in order:
        intent = intents[index].intent
        first = recorded[intent.intent_id]
        if intent.intent_id in inserted and first_of[intent.intent_id] == index:
            answers[index] = SubmitResult(
                SubmitOutcome.ACCEPTED,
                first.state,
                first.result,
                rejection=refused.get(intent.intent_id),
            )
            if first.published_envelope is not None:
                envelopes[index] = first.published_envelope
            elif first.state == sql.PENDING:
                new_work[intent.entity_key] = new_work.get(intent.entity_key, 0) + 1
            continue
        outcome = (
            SubmitOutcome.DUPLICATE if first.digest == digests[index] else SubmitOutcome.CONFLICT
        )
        # Only a DONE intent has a published envelope; one not yet DONE publishes it later.
        redelivery = first.published_envelope if redeliver[index] else None
        if outcome is SubmitOutcome.DUPLICATE and redelivery is not None:
            envelopes[index] = redelivery
            answers[index] = SubmitResult(outcome, first.state, first.result, redelivered=True)
        else:
            answers[index] = SubmitResult(outcome, first.state, first.result)
            if outcome is SubmitOutcome.CONFLICT:
                conflicts.append(index)
    if conflicts:
        _explain_conflicts(tx, intents, first_of, inserted, conflicts, answers)
    _add_pending(tx, new_work, now_ms)
    offsets = sql.append(tx, [envelopes[index] for index in sorted(envelopes)], now_ms)
    return [answer for answer in answers if answer is not None], sql.head_after(offsets)


def _explain_conflicts(
    tx: sql.Tx,
    intents: Sequence[NewIntent],
    first_of: dict[str, int],
    inserted: set[str],
    conflicts: Sequence[int],
    answers: list[SubmitResult | None],
) -> None:
    """Attach the recorded intent to each CONFLICT answer (conflicts are rare: read only then)."""
    earlier = sorted({intents[i].intent.intent_id for i in conflicts} - inserted)
    recorded: dict[str, ToolIntent] = {}
    for chunk in sql.chunks(earlier):
        for intent_id, blob in tx.execute(
            f"""SELECT intent_id, intent FROM effector_intents
                WHERE intent_id IN ({sql.marks(len(chunk))})""",
            chunk,
        ).fetchall():
            recorded[intent_id] = ToolIntent.FromString(bytes(blob))
    for index in conflicts:
        intent_id = intents[index].intent.intent_id
        kept = recorded[intent_id] if intent_id in recorded else intents[first_of[intent_id]].intent
        answer = answers[index]
        assert answer is not None
        answers[index] = dataclasses.replace(answer, recorded=kept)


def _initial_state(new: NewIntent, now_ms: int) -> tuple[IntentState, ToolResult | None]:
    if new.rejection is not None:
        return sql.DONE, rejected_result(new.intent, new.rejection, now_ms=now_ms)
    if new.intent.kind == ToolIntent.APPROVAL:
        return sql.AWAITING, None
    return sql.PENDING, None


def _insert_intents(tx: sql.Tx, rows: Sequence[Sequence[Any]]) -> set[str]:
    """Insert intent rows (in the given order) that are not recorded yet; returns their ids."""
    inserted: set[str] = set()
    for chunk in sql.chunks(rows):
        inserted.update(
            row[0]
            for row in tx.execute(
                f"""INSERT INTO effector_intents (intent_id, entity_key, seq, step_index, kind,
                    digest, intent, state, received_at_ms, deadline_ms, attempts, result,
                    completed_at_ms, published_envelope, tool_name)
                   VALUES {sql.row_marks(len(chunk), 15)}
                   ON CONFLICT (intent_id) DO NOTHING RETURNING intent_id""",
                sql.flatten(chunk),
            ).fetchall()
        )
    return inserted


def _recorded_intents(tx: sql.Tx, intent_ids: Sequence[str]) -> dict[str, _Recorded]:
    recorded: dict[str, _Recorded] = {}
    for chunk in sql.chunks(intent_ids):
        for intent_id, digest, state, result, published in tx.execute(
            f"""SELECT intent_id, digest, state, result, published_envelope
                FROM effector_intents WHERE intent_id IN ({sql.marks(len(chunk))})""",
            chunk,
        ).fetchall():
            recorded[intent_id] = _Recorded(
                bytes(digest), state, sql.parse_result(result), sql.optional_bytes(published)
            )
    return recorded


def _add_pending(tx: sql.Tx, new_work: dict[bytes, int], now_ms: int) -> None:
    """Count new PENDING intents on their keys' rows, creating rows in key order as needed."""
    rows = [(key, new_work[key], now_ms) for key in sorted(new_work)]
    for chunk in sql.chunks(rows):
        tx.execute(
            f"""INSERT INTO effector_keys (entity_key, pending, ready_at_ms)
                VALUES {sql.row_marks(len(chunk), 3)}
                ON CONFLICT (entity_key) DO UPDATE SET
                 ready_at_ms = CASE WHEN effector_keys.pending = 0 THEN excluded.ready_at_ms
                                    ELSE effector_keys.ready_at_ms END,
                 pending = effector_keys.pending + excluded.pending""",
            sql.flatten(chunk),
        )
