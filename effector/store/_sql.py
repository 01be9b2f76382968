"""The SQL logic both backends share: one schema, one set of transactions, two dialects.

Each store operation is one transaction, written once here as a plain function over a DB-API
style connection and run on a worker thread by the backend, which supplies the connection,
the transaction boundaries and the few dialect differences (column types, row locks). The
SQLite and PostgreSQL stores therefore cannot drift apart in what they record.

Lock order, to keep concurrent PostgreSQL transactions from deadlocking: a transaction that
changes existing rows locks a key's row before that key's intent rows and takes keys in key
order (a claim takes key rows with SKIP LOCKED, so it never waits for one); a submit inserts
its new intent rows in id order and then upserts key rows in key order; the log head row
always comes last.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from beam_agents._protos import AgentEnvelope, Approval, IntentState, ToolIntent, ToolResult
from effector.errors import StoreSchemaError
from effector.group_commit import GroupCommit
from effector.intents import (
    approval_envelope,
    decision_result,
    expired_result,
    expiry_deadline_ms,
    intent_digest,
    rejected_result,
    result_envelope,
    serialize_intent,
)
from effector.store.base import (
    Claim,
    ClaimBatch,
    Completion,
    Decision,
    EffectorStore,
    IntentRecord,
    LogRecord,
    NewIntent,
    StoreCounts,
    SubmitOutcome,
    SubmitResult,
)

SCHEMA_VERSION = 2
"""Bumped (with a migration) whenever a table changes incompatibly.

Version 2 added ``published_envelope`` (the bytes of the envelope that published an intent's
terminal result, kept for redelivery) and indexed intents by ``(state, received_at_ms)``.
"""

_PENDING = IntentState.PENDING
_RUNNING = IntentState.RUNNING
_AWAITING = IntentState.AWAITING_DECISION
_DONE = IntentState.DONE

_PRUNE_BATCH = 10_000
"""Rows deleted per table per prune call, so one prune never holds the store for long."""

_T = TypeVar("_T")

_log = logging.getLogger(__name__)


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

    def schema(self) -> list[str]:
        """Return the DDL that creates every table and index, idempotently."""
        blob, bigint = self.blob, self.bigint
        return [
            "CREATE TABLE IF NOT EXISTS effector_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
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
                published_envelope {blob})""",
            # The queue of each key: TOOL intents not yet DONE (only they are PENDING/RUNNING).
            """CREATE INDEX IF NOT EXISTS effector_intents_queue
                ON effector_intents (entity_key, seq, step_index) WHERE state IN (1, 2)""",
            """CREATE INDEX IF NOT EXISTS effector_intents_awaiting
                ON effector_intents (deadline_ms) WHERE state = 3 AND deadline_ms > 0""",
            """CREATE INDEX IF NOT EXISTS effector_intents_done
                ON effector_intents (completed_at_ms) WHERE state = 4""",
            # Counts by state, and ListIntents (oldest first within a state).
            """CREATE INDEX IF NOT EXISTS effector_intents_by_state
                ON effector_intents (state, received_at_ms, intent_id)""",
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
            f"""INSERT INTO effector_meta (name, value)
                VALUES ('schema_version', '{SCHEMA_VERSION}') ON CONFLICT (name) DO NOTHING""",
        ]


def create_schema(tx: Tx, dialect: Dialect) -> int:
    """Create the schema if it is missing and check its version; returns the log head."""
    for statement in dialect.schema():
        tx.execute(statement)
    (version,) = tx.execute(
        "SELECT value FROM effector_meta WHERE name = 'schema_version'"
    ).fetchone()
    if version == "1":
        _migrate_from_version_1(tx, dialect)
    elif version != str(SCHEMA_VERSION):
        raise StoreSchemaError(
            f"the store has schema version {version}; this effector understands {SCHEMA_VERSION}"
        )
    return _head(tx)


_MIGRATION_BATCH = 1_000


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
    tx.execute(
        "UPDATE effector_meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),)
    )


def _version_1_envelope(intent: ToolIntent, result: ToolResult) -> AgentEnvelope:
    if intent.kind == ToolIntent.APPROVAL and result.status == ToolResult.OK:
        decision = json.loads(result.payload)
        approval = Approval(
            intent_id=intent.intent_id,
            approved=decision["approved"],
            approver=decision["approver"],
            decided_at_ms=decision["decided_at_ms"],
            reason=decision["reason"],
        )
        return approval_envelope(approval, intent.entity_key)
    return result_envelope(result)


def _head(tx: Tx) -> int:
    (head,) = tx.execute("SELECT head FROM effector_log_head WHERE id = 1").fetchone()
    return int(head)


def _marks(count: int) -> str:
    return ", ".join("?" * count)


def _append(tx: Tx, envelopes: Sequence[bytes], now_ms: int) -> list[int]:
    """Append serialized envelopes to the log; the head row lock orders offsets by commit."""
    if not envelopes:
        return []
    (head,) = tx.execute(
        "UPDATE effector_log_head SET head = head + ? WHERE id = 1 RETURNING head",
        (len(envelopes),),
    ).fetchone()
    first = int(head) - len(envelopes) + 1
    offsets = list(range(first, int(head) + 1))
    tx.executemany(
        "INSERT INTO effector_envelopes (log_offset, envelope, appended_at_ms) VALUES (?, ?, ?)",
        [(offset, envelope, now_ms) for offset, envelope in zip(offsets, envelopes, strict=True)],
    )
    return offsets


def _head_after(offsets: Sequence[int]) -> int:
    """The log head after an append (0 when nothing was appended)."""
    return offsets[-1] if offsets else 0


def _optional_bytes(blob: bytes | None) -> bytes | None:
    # PostgreSQL hands BYTEA back as memoryview.
    return None if blob is None else bytes(blob)


def _parse_result(blob: bytes | None) -> ToolResult | None:
    return None if blob is None else ToolResult.FromString(bytes(blob))


@dataclass(frozen=True, slots=True)
class _Recorded:
    digest: bytes
    state: IntentState
    result: ToolResult | None
    published_envelope: bytes | None


_ROWS_PER_STATEMENT = 200
"""Rows per multi-row statement, well under every backend's limit on bound parameters."""


def _chunks(items: Sequence[_T], size: int = _ROWS_PER_STATEMENT) -> Iterable[Sequence[_T]]:
    return (items[start : start + size] for start in range(0, len(items), size))


def _row_marks(count: int, width: int) -> str:
    """Placeholders for ``count`` rows of ``width`` values: ``(?, ?), (?, ?)``."""
    row = f"({_marks(width)})"
    return ", ".join([row] * count)


def _flatten(rows: Sequence[Sequence[Any]]) -> list[Any]:
    return [value for row in rows for value in row]


def _insert_intents(tx: Tx, rows: Sequence[Sequence[Any]]) -> set[str]:
    """Insert intent rows (in the given order) that are not recorded yet; returns their ids."""
    inserted: set[str] = set()
    for chunk in _chunks(rows):
        inserted.update(
            row[0]
            for row in tx.execute(
                f"""INSERT INTO effector_intents (intent_id, entity_key, seq, step_index, kind,
                    digest, intent, state, received_at_ms, deadline_ms, attempts, result,
                    completed_at_ms, published_envelope)
                   VALUES {_row_marks(len(chunk), 14)}
                   ON CONFLICT (intent_id) DO NOTHING RETURNING intent_id""",
                _flatten(chunk),
            ).fetchall()
        )
    return inserted


def _recorded_intents(tx: Tx, intent_ids: Sequence[str]) -> dict[str, _Recorded]:
    recorded: dict[str, _Recorded] = {}
    for chunk in _chunks(intent_ids):
        for intent_id, digest, state, result, published in tx.execute(
            f"""SELECT intent_id, digest, state, result, published_envelope
                FROM effector_intents WHERE intent_id IN ({_marks(len(chunk))})""",
            chunk,
        ).fetchall():
            recorded[intent_id] = _Recorded(
                bytes(digest), state, _parse_result(result), _optional_bytes(published)
            )
    return recorded


def _add_pending(tx: Tx, new_work: dict[bytes, int], now_ms: int) -> None:
    """Count new PENDING intents on their keys' rows, creating rows in key order as needed."""
    rows = [(key, new_work[key], now_ms) for key in sorted(new_work)]
    for chunk in _chunks(rows):
        tx.execute(
            f"""INSERT INTO effector_keys (entity_key, pending, ready_at_ms)
                VALUES {_row_marks(len(chunk), 3)}
                ON CONFLICT (entity_key) DO UPDATE SET
                 ready_at_ms = CASE WHEN effector_keys.pending = 0 THEN excluded.ready_at_ms
                                    ELSE effector_keys.ready_at_ms END,
                 pending = effector_keys.pending + excluded.pending""",
            _flatten(chunk),
        )


def _submit(
    tx: Tx, intents: Sequence[NewIntent], now_ms: int, redeliver: Sequence[bool]
) -> tuple[list[SubmitResult], int]:
    """Record ``intents``; ``redeliver[i]`` says whether intent ``i`` asked for redelivery."""
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
            )
        )
    inserted = _insert_intents(tx, rows)
    recorded = _recorded_intents(tx, [i for i in first_of if i not in inserted])
    recorded.update((intent_id, candidates[intent_id]) for intent_id in inserted)
    answers: list[SubmitResult | None] = [None] * len(intents)
    # The log gets what this submit appends in request order.
    envelopes: dict[int, bytes] = {}
    new_work: dict[bytes, int] = {}
    for index in order:
        intent = intents[index].intent
        first = recorded[intent.intent_id]
        if intent.intent_id in inserted and first_of[intent.intent_id] == index:
            answers[index] = SubmitResult(SubmitOutcome.ACCEPTED, first.state, first.result)
            if first.published_envelope is not None:
                envelopes[index] = first.published_envelope
            elif first.state == _PENDING:
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
    _add_pending(tx, new_work, now_ms)
    offsets = _append(tx, [envelopes[index] for index in sorted(envelopes)], now_ms)
    return [answer for answer in answers if answer is not None], _head_after(offsets)


def _initial_state(new: NewIntent, now_ms: int) -> tuple[IntentState, ToolResult | None]:
    if new.rejection is not None:
        return _DONE, rejected_result(new.intent, new.rejection, now_ms=now_ms)
    if new.intent.kind == ToolIntent.APPROVAL:
        return _AWAITING, None
    return _PENDING, None


def _claim(
    tx: Tx, dialect: Dialect, owner: str, limit: int, now_ms: int, lease_ms: int
) -> tuple[ClaimBatch, int]:
    keys = [
        bytes(row[0])
        for row in tx.execute(
            """SELECT entity_key FROM effector_keys
               WHERE pending > 0 AND (claim_token IS NULL OR lease_expires_at_ms < ?)
               ORDER BY ready_at_ms LIMIT ?"""
            + dialect.skip_locked,
            (now_ms, limit),
        ).fetchall()
    ]
    if not keys:
        return ClaimBatch([], 0), 0
    heads = _queue_heads(tx, dialect, keys)
    candidates: list[Claim] = []
    expired: list[bytes] = []
    for intent_id, blob, state, attempts, deadline_ms in heads:
        intent = ToolIntent.FromString(bytes(blob))
        if deadline_ms and now_ms > deadline_ms:
            result = expired_result(intent, now_ms=now_ms, attempts=attempts)
            published = _finish(tx, intent_id, result, result_envelope(result), now_ms, state)
            if published is not None:
                tx.execute(
                    f"""UPDATE effector_keys SET pending = pending - 1, {_NO_CLAIM}
                        WHERE entity_key = ?""",
                    (intent.entity_key,),
                )
                expired.append(published)
            continue
        candidates.append(Claim(token=uuid.uuid4().hex, intent=intent, attempt=attempts + 1))
    claims = _start_running(tx, candidates)
    # The keys are locked (or, on SQLite, the whole store is), so the heads cannot change.
    tx.executemany(
        """UPDATE effector_keys SET claim_token = ?, claimed_intent_id = ?, lease_owner = ?,
             lease_expires_at_ms = ? WHERE entity_key = ?""",
        [
            (claim.token, claim.intent.intent_id, owner, now_ms + lease_ms, claim.intent.entity_key)
            for claim in claims
        ],
    )
    offsets = _append(tx, expired, now_ms)
    return ClaimBatch(claims, len(expired)), _head_after(offsets)


_HEAD_COLUMNS = ("intent_id", "intent", "state", "attempts", "deadline_ms")


def _queue_heads(tx: Tx, dialect: Dialect, keys: Sequence[bytes]) -> list[Any]:
    """The head of each key's queue (its first PENDING or RUNNING intent), in id order.

    Each head is one ordered probe of the queue index. (Numbering every queued row of the keys
    with a window function read all of them, blobs included: 6x slower on PostgreSQL and 40x
    on SQLite with 20 intents queued per key.) Each backend is given the join its planner
    turns into one probe per key.
    """

    def probe(columns: Sequence[str]) -> str:
        return f"""SELECT {", ".join(f"queued.{column}" for column in columns)}
                   FROM effector_intents AS queued
                   WHERE queued.entity_key = effector_keys.entity_key AND queued.state IN (1, 2)
                   ORDER BY queued.seq, queued.step_index LIMIT 1"""

    join = (
        f"CROSS JOIN LATERAL ({probe(_HEAD_COLUMNS)}) AS head"
        if dialect.lateral
        else f"JOIN effector_intents AS head ON head.intent_id = ({probe(['intent_id'])})"
    )
    return tx.execute(
        f"""SELECT {", ".join(f"head.{column}" for column in _HEAD_COLUMNS)}
            FROM effector_keys {join}
            WHERE effector_keys.entity_key IN ({_marks(len(keys))})
            ORDER BY head.intent_id""",
        keys,
    ).fetchall()


def _start_running(tx: Tx, candidates: Sequence[Claim]) -> list[Claim]:
    """Mark the candidates' intents RUNNING, counting the attempt; returns those it marked."""
    started: set[str] = set()
    for chunk in _chunks(candidates):
        started.update(
            row[0]
            for row in tx.execute(
                f"""UPDATE effector_intents SET state = ?, attempts = attempts + 1
                    WHERE intent_id IN ({_marks(len(chunk))}) AND state IN (?, ?)
                    RETURNING intent_id""",
                [
                    _RUNNING,
                    *(claim.intent.intent_id for claim in chunk),
                    _PENDING,
                    _RUNNING,
                ],
            ).fetchall()
        )
    return [claim for claim in candidates if claim.intent.intent_id in started]


def _finish(
    tx: Tx,
    intent_id: str,
    result: ToolResult,
    envelope: AgentEnvelope,
    now_ms: int,
    from_state: int,
) -> bytes | None:
    """Record ``result``, and the ``envelope`` that publishes it, if still in ``from_state``.

    Returns the envelope's bytes for the caller to append to the log, or ``None`` if the
    intent had left ``from_state``: the condition makes the first terminal result win when two
    transactions race for one intent (a claim whose lease ran out finishing beside its
    successor). The same bytes are kept for redelivery, so a redelivered envelope is
    byte-identical to the one first published.
    """
    published = envelope.SerializeToString()
    recorded = tx.execute(
        """UPDATE effector_intents SET state = ?, result = ?, completed_at_ms = ?,
             published_envelope = ?
           WHERE intent_id = ? AND state = ?""",
        (_DONE, result.SerializeToString(), now_ms, published, intent_id, from_state),
    ).rowcount
    return published if recorded else None


def _complete(tx: Tx, completions: Sequence[Completion], now_ms: int) -> tuple[list[bool], int]:
    def lock_order(index: int) -> tuple[bytes, str]:
        intent = completions[index].claim.intent
        return intent.entity_key, intent.intent_id

    order = sorted(range(len(completions)), key=lock_order)
    claims = [completions[index].claim for index in order]
    keys = sorted({claim.intent.entity_key for claim in claims})
    held = {
        (bytes(key), token)
        for chunk in _chunks(keys)
        for key, token in tx.execute(
            f"""SELECT entity_key, claim_token FROM effector_keys
                WHERE entity_key IN ({_marks(len(chunk))})""",
            chunk,
        ).fetchall()
    }
    tx.executemany(
        f"""UPDATE effector_keys SET ready_at_ms = ?, {_NO_CLAIM}
            WHERE entity_key = ? AND claim_token = ?""",
        [(now_ms, claim.intent.entity_key, claim.token) for claim in claims],
    )
    # First result wins: a claim whose lease ran out may finish after a later claim did, or
    # beside it in one batch, where the first in lock order is the one tried.
    tried: dict[str, int] = {}
    for index, claim in zip(order, claims, strict=True):
        tried.setdefault(claim.intent.intent_id, index)
    published = _finish_running(
        tx, [(intent_id, completions[index].result) for intent_id, index in tried.items()], now_ms
    )
    recorded = [False] * len(completions)
    envelopes: list[bytes] = []
    finished_keys: list[tuple[bytes]] = []
    for index, claim in zip(order, claims, strict=True):
        envelope = published.get(claim.intent.intent_id)
        if envelope is None or tried[claim.intent.intent_id] != index:
            continue
        recorded[index] = True
        envelopes.append(envelope)
        finished_keys.append((claim.intent.entity_key,))
        if (claim.intent.entity_key, claim.token) not in held:
            _log.warning(
                "recorded intent %s from a claim that had lost its lease", claim.intent.intent_id
            )
    tx.executemany(
        "UPDATE effector_keys SET pending = pending - 1 WHERE entity_key = ?", finished_keys
    )
    offsets = _append(tx, envelopes, now_ms)
    return recorded, _head_after(offsets)


def _finish_running(
    tx: Tx, results: Sequence[tuple[str, ToolResult]], now_ms: int
) -> dict[str, bytes]:
    """Record results of intents still RUNNING; returns the envelopes it published, by id.

    The set-based twin of :func:`_finish` for the worker's batches (each id at most once): the
    same condition makes the first terminal result win, and the returned bytes are the ones
    kept for redelivery.
    """
    rows = [
        (intent_id, result.SerializeToString(), result_envelope(result).SerializeToString())
        for intent_id, result in results
    ]
    envelopes = {intent_id: envelope for intent_id, _, envelope in rows}
    finished: dict[str, bytes] = {}
    for chunk in _chunks(rows):
        for (intent_id,) in tx.execute(
            f"""WITH finished (intent_id, result, envelope) AS (VALUES {_row_marks(len(chunk), 3)})
                UPDATE effector_intents SET state = ?, result = finished.result,
                  completed_at_ms = ?, published_envelope = finished.envelope
                FROM finished
                WHERE effector_intents.intent_id = finished.intent_id
                  AND effector_intents.state = ?
                RETURNING effector_intents.intent_id""",
            [*_flatten(chunk), _DONE, now_ms, _RUNNING],
        ).fetchall():
            finished[intent_id] = envelopes[intent_id]
    return finished


_NO_CLAIM = (
    "claim_token = NULL, claimed_intent_id = NULL, lease_owner = NULL, lease_expires_at_ms = NULL"
)


def _renew(tx: Tx, claims: Sequence[Claim], now_ms: int, lease_ms: int) -> set[str]:
    held: set[str] = set()
    for claim in sorted(claims, key=lambda c: c.intent.entity_key):
        if tx.execute(
            """UPDATE effector_keys SET lease_expires_at_ms = ?
               WHERE entity_key = ? AND claim_token = ?""",
            (now_ms + lease_ms, claim.intent.entity_key, claim.token),
        ).rowcount:
            held.add(claim.token)
    return held


def _release(tx: Tx, claims: Sequence[Claim]) -> None:
    for claim in sorted(claims, key=lambda c: c.intent.entity_key):
        if tx.execute(
            f"UPDATE effector_keys SET {_NO_CLAIM} WHERE entity_key = ? AND claim_token = ?",
            (claim.intent.entity_key, claim.token),
        ).rowcount:
            tx.execute(
                "UPDATE effector_intents SET state = ? WHERE intent_id = ? AND state = ?",
                (_PENDING, claim.intent.intent_id, _RUNNING),
            )


def release_all_claims(tx: Tx) -> None:
    """Give back every claim: for a store only one process may open, all of them are stale."""
    tx.execute(f"UPDATE effector_keys SET {_NO_CLAIM} WHERE claim_token IS NOT NULL")
    tx.execute("UPDATE effector_intents SET state = ? WHERE state = ?", (_PENDING, _RUNNING))


def _expire_approvals(tx: Tx, dialect: Dialect, now_ms: int, limit: int) -> tuple[int, int]:
    rows = tx.execute(
        """SELECT intent_id, intent FROM effector_intents
           WHERE state = 3 AND deadline_ms > 0 AND deadline_ms < ?
           ORDER BY deadline_ms LIMIT ?"""
        + dialect.skip_locked,
        (now_ms, limit),
    ).fetchall()
    envelopes = []
    for intent_id, blob in rows:
        result = expired_result(ToolIntent.FromString(bytes(blob)), now_ms=now_ms, attempts=0)
        published = _finish(tx, intent_id, result, result_envelope(result), now_ms, _AWAITING)
        if published is not None:
            envelopes.append(published)
    offsets = _append(tx, envelopes, now_ms)
    return len(envelopes), _head_after(offsets)


def _decide(
    tx: Tx,
    dialect: Dialect,
    intent_id: str,
    approval: Approval,
) -> tuple[Decision, int]:
    now_ms = approval.decided_at_ms
    row = tx.execute(
        "SELECT intent, state, deadline_ms, result FROM effector_intents WHERE intent_id = ?"
        + dialect.for_update,
        (intent_id,),
    ).fetchone()
    if row is None:
        return Decision(False, IntentState.INTENT_STATE_UNSPECIFIED, "unknown intent", None), 0
    intent = ToolIntent.FromString(bytes(row[0]))
    state, deadline_ms, result = row[1], row[2], _parse_result(row[3])
    if intent.kind != ToolIntent.APPROVAL:
        return Decision(False, state, "not an approval intent", result), 0
    if state == _DONE:
        assert result is not None
        already = "already expired" if result.status == ToolResult.EXPIRED else "already decided"
        return Decision(False, state, already, result), 0
    if deadline_ms and now_ms > deadline_ms:
        result = expired_result(intent, now_ms=now_ms, attempts=0)
        envelope, applied, reason = result_envelope(result), False, "expired before the decision"
    else:
        result = decision_result(intent, approval)
        envelope, applied, reason = approval_envelope(approval, intent.entity_key), True, ""
    published = _finish(tx, intent_id, result, envelope, now_ms, _AWAITING)
    offsets = _append(tx, [] if published is None else [published], now_ms)
    return Decision(applied, _DONE, reason, result), _head_after(offsets)


def _read(tx: Tx, from_offset: int, max_records: int) -> list[LogRecord]:
    rows = tx.execute(
        """SELECT log_offset, envelope FROM effector_envelopes
           WHERE log_offset >= ? ORDER BY log_offset LIMIT ?""",
        (from_offset, max_records),
    ).fetchall()
    return [LogRecord(int(offset), AgentEnvelope.FromString(bytes(blob))) for offset, blob in rows]


def _get_intent(tx: Tx, intent_id: str) -> IntentRecord | None:
    row = tx.execute(
        "SELECT intent, state, result, attempts FROM effector_intents WHERE intent_id = ?",
        (intent_id,),
    ).fetchone()
    if row is None:
        return None
    return IntentRecord(ToolIntent.FromString(bytes(row[0])), row[1], _parse_result(row[2]), row[3])


def _list_intents(tx: Tx, state: IntentState, limit: int) -> list[ToolIntent]:
    rows = tx.execute(
        """SELECT intent FROM effector_intents WHERE state = ?
           ORDER BY received_at_ms, intent_id LIMIT ?""",
        (state, limit),
    ).fetchall()
    return [ToolIntent.FromString(bytes(blob)) for (blob,) in rows]


def _counts(tx: Tx) -> StoreCounts:
    by_state = dict(
        tx.execute("SELECT state, COUNT(*) FROM effector_intents GROUP BY state").fetchall()
    )
    return StoreCounts(
        pending=int(by_state.get(_PENDING, 0)),
        running=int(by_state.get(_RUNNING, 0)),
        awaiting_decision=int(by_state.get(_AWAITING, 0)),
        done=int(by_state.get(_DONE, 0)),
        head_offset=_head(tx),
    )


def _prune(tx: Tx, now_ms: int, retention_ms: int) -> int:
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


@dataclass(frozen=True, slots=True)
class _Submission:
    """One caller's submit, waiting to be recorded together with its concurrent neighbours."""

    intents: Sequence[NewIntent]
    now_ms: int
    redeliver_results: bool


class SqlStore(EffectorStore):
    """An :class:`EffectorStore` over SQL; backends provide connections and transactions.

    Transactions run on the backend's executor threads, so the event loop never waits on a
    database; a backend may give read-only transactions executor threads of their own. After
    a transaction that appended envelopes commits, local waiters in :meth:`wait_for_offset`
    are woken; a backend shared by several processes also polls. Concurrent submits are
    group-committed (:mod:`effector.group_commit`).
    """

    def __init__(
        self,
        dialect: Dialect,
        executor: Executor,
        head: int,
        poll_interval_s: float | None,
        read_executor: Executor | None = None,
    ) -> None:
        self._dialect = dialect
        self._executor = executor
        self._read_executor = executor if read_executor is None else read_executor
        self._known_head = head
        self._poll_interval_s = poll_interval_s
        self._appended = asyncio.Event()
        self._submissions: GroupCommit[_Submission, list[SubmitResult]] = GroupCommit(
            self._record_submissions
        )

    @abc.abstractmethod
    def _transaction(self, work: Callable[[Tx], _T], *, write: bool) -> _T:
        """Run ``work`` in one transaction on the calling (executor) thread."""

    async def _run(self, work: Callable[[Tx], _T], *, write: bool = True) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor if write else self._read_executor,
            functools.partial(self._transaction, work, write=write),
        )

    def _announce(self, head: int) -> None:
        if head > self._known_head:
            self._known_head = head
            woken, self._appended = self._appended, asyncio.Event()
            woken.set()

    async def submit(
        self, intents: Sequence[NewIntent], now_ms: int, *, redeliver_results: bool = False
    ) -> list[SubmitResult]:
        """See :meth:`EffectorStore.submit`; concurrent submits share one transaction."""
        return await self._submissions(_Submission(intents, now_ms, redeliver_results))

    async def _record_submissions(
        self, submissions: Sequence[_Submission]
    ) -> list[list[SubmitResult]]:
        """Record a group of submits as one, in arrival order, and split the answers back.

        One combined submit keeps the lock order of a single one. The group is stamped with
        its latest ``now_ms``: the time the last of them arrived, still before any commits.
        """
        intents = [new for submission in submissions for new in submission.intents]
        redeliver = [
            submission.redeliver_results for submission in submissions for _ in submission.intents
        ]
        now_ms = max(submission.now_ms for submission in submissions)
        answers, head = await self._run(lambda tx: _submit(tx, intents, now_ms, redeliver))
        self._announce(head)
        split, start = [], 0
        for submission in submissions:
            split.append(answers[start : start + len(submission.intents)])
            start += len(submission.intents)
        return split

    async def claim(self, owner: str, limit: int, now_ms: int, lease_ms: int) -> ClaimBatch:
        """See :meth:`EffectorStore.claim`."""
        batch, head = await self._run(
            lambda tx: _claim(tx, self._dialect, owner, limit, now_ms, lease_ms)
        )
        self._announce(head)
        return batch

    async def complete(self, completions: Sequence[Completion], now_ms: int) -> list[bool]:
        """See :meth:`EffectorStore.complete`."""
        recorded, head = await self._run(lambda tx: _complete(tx, completions, now_ms))
        self._announce(head)
        return recorded

    async def renew(self, claims: Sequence[Claim], now_ms: int, lease_ms: int) -> set[str]:
        """See :meth:`EffectorStore.renew`."""
        return await self._run(lambda tx: _renew(tx, claims, now_ms, lease_ms))

    async def release(self, claims: Sequence[Claim]) -> None:
        """See :meth:`EffectorStore.release`."""
        await self._run(lambda tx: _release(tx, claims))

    async def expire_approvals(self, now_ms: int, limit: int) -> int:
        """See :meth:`EffectorStore.expire_approvals`."""
        expired, head = await self._run(
            lambda tx: _expire_approvals(tx, self._dialect, now_ms, limit)
        )
        self._announce(head)
        return expired

    async def decide(
        self, intent_id: str, *, approved: bool, approver: str, reason: str, now_ms: int
    ) -> Decision:
        """See :meth:`EffectorStore.decide`."""
        approval = Approval(
            intent_id=intent_id,
            approved=approved,
            approver=approver,
            decided_at_ms=now_ms,
            reason=reason,
        )
        decision, head = await self._run(lambda tx: _decide(tx, self._dialect, intent_id, approval))
        self._announce(head)
        return decision

    async def publish(self, envelopes: Sequence[AgentEnvelope], now_ms: int) -> list[int]:
        """See :meth:`EffectorStore.publish`."""
        serialized = [envelope.SerializeToString() for envelope in envelopes]
        offsets = await self._run(lambda tx: _append(tx, serialized, now_ms))
        self._announce(_head_after(offsets))
        return offsets

    async def read(self, from_offset: int, max_records: int) -> list[LogRecord]:
        """See :meth:`EffectorStore.read`."""
        return await self._run(lambda tx: _read(tx, from_offset, max_records), write=False)

    async def wait_for_offset(self, offset: int, timeout_s: float) -> None:
        """See :meth:`EffectorStore.wait_for_offset`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._known_head < offset:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            appended = self._appended
            if self._poll_interval_s is None:
                wait_s = remaining
            else:
                wait_s = min(remaining, self._poll_interval_s)
            try:
                await asyncio.wait_for(appended.wait(), wait_s)
            except TimeoutError:
                if self._poll_interval_s is not None:
                    self._announce(await self._run(_head, write=False))

    async def get_intent(self, intent_id: str) -> IntentRecord | None:
        """See :meth:`EffectorStore.get_intent`."""
        return await self._run(lambda tx: _get_intent(tx, intent_id), write=False)

    async def list_intents(self, state: IntentState, limit: int) -> list[ToolIntent]:
        """See :meth:`EffectorStore.list_intents`."""
        return await self._run(lambda tx: _list_intents(tx, state, limit), write=False)

    async def counts(self) -> StoreCounts:
        """See :meth:`EffectorStore.counts`."""
        counts = await self._run(_counts, write=False)
        self._announce(counts.head_offset)
        return counts

    async def prune(self, now_ms: int, retention_ms: int) -> int:
        """See :meth:`EffectorStore.prune`."""
        return await self._run(lambda tx: _prune(tx, now_ms, retention_ms))
