"""Execution and leases: claiming work, recording results, and the approvals' decisions.

A claim takes idle keys with work (``SKIP LOCKED``), refuses their expired heads and marks the
rest RUNNING under a lease; a completion records the result and appends its envelope in the
same transaction, the first terminal result winning any race. Leases are renewed or released
here, and undecided approvals are decided or expired. Key rows are locked in key order.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import effector.store._tx as sql
from beam_agents._protos import AgentEnvelope, Approval, IntentState, ToolIntent, ToolResult
from effector.intents import approval_envelope, decision_result, expired_result, result_envelope
from effector.store.base import Claim, ClaimBatch, ClaimRequest, Completion, Decision

_log = logging.getLogger(__name__)

_NO_CLAIM = (
    "claim_token = NULL, claimed_intent_id = NULL, lease_owner = NULL, lease_expires_at_ms = NULL"
)
"""Assignments that free a key row of its claim and lease."""
_TOKEN_PREFIX = os.urandom(8).hex()
_token_numbers = itertools.count()


def _new_token_prefix() -> None:
    """Draw this process's token prefix afresh (a forked child must not repeat its parent's)."""
    global _TOKEN_PREFIX, _token_numbers
    _TOKEN_PREFIX = os.urandom(8).hex()
    _token_numbers = itertools.count()


os.register_at_fork(after_in_child=_new_token_prefix)


def new_token() -> str:
    """A claim token no other claim has: this process's random prefix and a counter.

    As unique as a random UUID across processes, forks and restarts, without a system call each.
    """
    return f"{_TOKEN_PREFIX}{next(_token_numbers):016x}"


_HEAD_COLUMNS = ("intent_id", "intent", "state", "attempts", "deadline_ms", "reconcile_failures")
"""What a claim reads of each key's head intent."""


def claim_work(
    tx: sql.Tx, dialect: sql.Dialect, owner: str, limit: int, now_ms: int, lease_ms: int
) -> tuple[ClaimBatch, list[ToolIntent], int]:
    """Claim the heads of up to ``limit`` idle keys; refuse expired heads instead.

    An IN_DOUBT head is claimed whatever its deadline (its key's lease ran out at its retry
    time): its effect may have happened, so only its reconciler may settle it. Returns the
    batch, the intents it refused as expired, and the log head after the EXPIRED envelopes it
    appended (0 if none).
    """
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
        return ClaimBatch([], 0), [], 0
    heads = _queue_heads(tx, dialect, keys)
    candidates: list[Claim] = []
    expired: list[bytes] = []
    refused: list[ToolIntent] = []
    for intent_id, blob, state, attempts, deadline_ms, failures in heads:
        intent = ToolIntent.FromString(bytes(blob))
        # A head that was started (or is in doubt) is claimed even past its deadline: its
        # effect may have happened, so the worker asks its reconciler before calling it EXPIRED.
        if deadline_ms and now_ms > deadline_ms and state != sql.IN_DOUBT and not attempts:
            result = expired_result(intent, now_ms=now_ms, attempts=attempts)
            published = finish(tx, intent_id, result, result_envelope(result), now_ms, state)
            if published is not None:
                tx.execute(
                    f"""UPDATE effector_keys SET pending = pending - 1, {_NO_CLAIM}
                        WHERE entity_key = ?""",
                    (intent.entity_key,),
                )
                expired.append(published)
                refused.append(intent)
            continue
        candidates.append(Claim(new_token(), intent, attempts + 1, deadline_ms or 0, failures or 0))
    claims = _start_running(tx, candidates, now_ms)
    # The keys are locked (or, on SQLite, the whole store is), so the heads cannot change.
    for chunk in sql.chunks(claims):
        tx.execute(
            f"""WITH claimed (entity_key, token, intent_id) AS
                  (VALUES {sql.row_marks(len(chunk), 3)})
                UPDATE effector_keys SET claim_token = claimed.token,
                  claimed_intent_id = claimed.intent_id, lease_owner = ?,
                  lease_expires_at_ms = ?
                FROM claimed WHERE effector_keys.entity_key = claimed.entity_key""",
            [
                *sql.flatten([(c.intent.entity_key, c.token, c.intent.intent_id) for c in chunk]),
                owner,
                now_ms + lease_ms,
            ],
        )
    offsets = sql.append(tx, expired, now_ms)
    return ClaimBatch(claims, len(expired)), refused, sql.head_after(offsets)


def _queue_heads(tx: sql.Tx, dialect: sql.Dialect, keys: Sequence[bytes]) -> list[Any]:
    """The head of each key's queue (its first PENDING or RUNNING intent), in id order.

    Each head is one ordered probe of the queue index, never a scan of every queued row (see
    BENCHMARKS.md); each backend is given the join its planner turns into one probe per key.
    """

    def probe(columns: Sequence[str]) -> str:
        return f"""SELECT {", ".join(f"queued.{column}" for column in columns)}
                   FROM effector_intents AS queued
                   WHERE queued.entity_key = effector_keys.entity_key
                     AND {sql.queued("queued")}
                   ORDER BY queued.seq, queued.step_index LIMIT 1"""

    join = (
        f"CROSS JOIN LATERAL ({probe(_HEAD_COLUMNS)}) AS head"
        if dialect.lateral
        else f"JOIN effector_intents AS head ON head.intent_id = ({probe(['intent_id'])})"
    )
    return tx.execute(
        f"""SELECT {", ".join(f"head.{column}" for column in _HEAD_COLUMNS)}
            FROM effector_keys {join}
            WHERE effector_keys.entity_key IN ({sql.marks(len(keys))})
            ORDER BY head.intent_id""",
        keys,
    ).fetchall()


def _start_running(tx: sql.Tx, candidates: Sequence[Claim], now_ms: int) -> list[Claim]:
    """Mark the candidates' intents RUNNING (started now), counting the attempt; returns them."""
    started: set[str] = set()
    for chunk in sql.chunks(candidates):
        # ``+state``: the state is checked on the rows the id finds, never searched. With many
        # ids SQLite's planner otherwise walks the by-state index through every queued intent
        # instead (a claim then cost O(backlog): 100 µs a row with 60,000 intents queued).
        started.update(
            row[0]
            for row in tx.execute(
                f"""UPDATE effector_intents SET state = ?, attempts = attempts + 1,
                      started_at_ms = ?
                    WHERE intent_id IN ({sql.marks(len(chunk))}) AND +state IN (?, ?, ?)
                    RETURNING intent_id""",
                [
                    sql.RUNNING,
                    now_ms,
                    *(claim.intent.intent_id for claim in chunk),
                    sql.PENDING,
                    sql.RUNNING,
                    sql.IN_DOUBT,
                ],
            ).fetchall()
        )
    return [claim for claim in candidates if claim.intent.intent_id in started]


def finish(
    tx: sql.Tx,
    intent_id: str,
    result: ToolResult,
    envelope: AgentEnvelope,
    now_ms: int,
    from_state: int,
) -> bytes | None:
    """Record ``result``, and the ``envelope`` that publishes it, if still in ``from_state``.

    Returns the envelope's bytes for the caller to sql.append to the log, or ``None`` if the
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
        (sql.DONE, result.SerializeToString(), now_ms, published, intent_id, from_state),
    ).rowcount
    return published if recorded else None


def record_completions(
    tx: sql.Tx, dialect: sql.Dialect, completions: Sequence[Completion], now_ms: int
) -> tuple[list[bool], int]:
    """Record results, release their keys and publish; ``False`` where another result won.

    Returns, besides, the log head after the envelopes it appended (0 if none).
    """

    def lock_order(index: int) -> tuple[bytes, str]:
        intent = completions[index].claim.intent
        return intent.entity_key, intent.intent_id

    order = sorted(range(len(completions)), key=lock_order)
    claims = [completions[index].claim for index in order]
    keys = sorted({claim.intent.entity_key for claim in claims})
    # Locks the key rows in key order; the set-based UPDATEs below then wait for nothing.
    held = {
        (bytes(key), token)
        for chunk in sql.chunks(keys)
        for key, token in tx.execute(
            f"""SELECT entity_key, claim_token FROM effector_keys
                WHERE entity_key IN ({sql.marks(len(chunk))})
                ORDER BY entity_key{dialect.for_update}""",
            chunk,
        ).fetchall()
    }
    for chunk in sql.chunks(claims):
        tx.execute(
            f"""WITH released (entity_key, token) AS (VALUES {sql.row_marks(len(chunk), 2)})
                UPDATE effector_keys SET ready_at_ms = ?, {_NO_CLAIM}
                FROM released
                WHERE effector_keys.entity_key = released.entity_key
                  AND effector_keys.claim_token = released.token""",
            [*sql.flatten([(c.intent.entity_key, c.token) for c in chunk]), now_ms],
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
    finished_keys: Counter[bytes] = Counter()
    for index, claim in zip(order, claims, strict=True):
        envelope = published.get(claim.intent.intent_id)
        if envelope is None or tried[claim.intent.intent_id] != index:
            continue
        recorded[index] = True
        envelopes.append(envelope)
        finished_keys[claim.intent.entity_key] += 1
        if (claim.intent.entity_key, claim.token) not in held:
            _log.warning(
                "recorded intent %s from a claim that had lost its lease", claim.intent.intent_id
            )
    _count_down(tx, list(finished_keys.items()))
    offsets = sql.append(tx, envelopes, now_ms)
    return recorded, sql.head_after(offsets)


def _count_down(tx: sql.Tx, finished: Sequence[tuple[bytes, int]]) -> None:
    """Take the intents just finished off their keys' ``pending`` counts (keys locked)."""
    for chunk in sql.chunks(finished):
        tx.execute(
            f"""WITH finished (entity_key, done) AS (VALUES {sql.row_marks(len(chunk), 2)})
                UPDATE effector_keys SET pending = pending - finished.done
                FROM finished WHERE effector_keys.entity_key = finished.entity_key""",
            sql.flatten(chunk),
        )


def _finish_running(
    tx: sql.Tx, results: Sequence[tuple[str, ToolResult]], now_ms: int
) -> dict[str, bytes]:
    """Record results of intents still RUNNING; returns the envelopes it published, by id.

    The set-based twin of :func:`finish` for the worker's batches (each id at most once): the
    same condition makes the first terminal result win, and the returned bytes are the ones
    kept for redelivery.
    """
    rows = [
        (intent_id, result.SerializeToString(), result_envelope(result).SerializeToString())
        for intent_id, result in results
    ]
    envelopes = {intent_id: envelope for intent_id, _, envelope in rows}
    finished: dict[str, bytes] = {}
    for chunk in sql.chunks(rows):
        values = sql.row_marks(len(chunk), 3)
        for (intent_id,) in tx.execute(
            f"""WITH finished (intent_id, result, envelope) AS (VALUES {values})
                UPDATE effector_intents SET state = ?, result = finished.result,
                  completed_at_ms = ?, published_envelope = finished.envelope
                FROM finished
                WHERE effector_intents.intent_id = finished.intent_id
                  AND effector_intents.state = ?
                RETURNING effector_intents.intent_id""",
            [*sql.flatten(chunk), sql.DONE, now_ms, sql.RUNNING],
        ).fetchall():
            finished[intent_id] = envelopes[intent_id]
    return finished


def record_and_claim(
    tx: sql.Tx,
    dialect: sql.Dialect,
    completions: Sequence[Completion],
    now_ms: int,
    request: ClaimRequest,
) -> tuple[list[bool], ClaimBatch, list[ToolIntent], int]:
    """:func:`record_completions`, then :func:`claim_work` in the same transaction.

    The released keys go to the back of the queue (their ``ready_at_ms`` is now), so the claim
    prefers keys that waited longer; a key's next intent is claimed only here, after the row
    recording its previous result, and executes only once this transaction has committed.
    Returns what both return, with the later log head. A claim that fails is undone alone (a
    savepoint): the results still commit, and the claim loop claims once woken.
    """
    recorded, head = record_completions(tx, dialect, completions, now_ms)
    if request.limit <= 0:
        return recorded, ClaimBatch([], 0), [], head
    tx.execute("SAVEPOINT claim_after_results")
    try:
        batch, refused, claim_head = claim_work(
            tx, dialect, request.owner, request.limit, now_ms, request.lease_ms
        )
    except Exception as exc:
        try:
            tx.execute("ROLLBACK TO SAVEPOINT claim_after_results")
        except Exception:
            # SQLite rolled the whole transaction back (an I/O error, a full disk): the
            # results are not recorded either, and the claim's error is the one to report.
            raise exc from None
        _log.warning(
            "claiming after recording results failed (the claim is undone, the results are "
            "kept): %r",
            exc,
            exc_info=exc,
        )
        return recorded, ClaimBatch([], 0), [], head
    tx.execute("RELEASE SAVEPOINT claim_after_results")
    return recorded, batch, refused, max(head, claim_head)


def renew_leases(tx: sql.Tx, claims: Sequence[Claim], now_ms: int, lease_ms: int) -> set[str]:
    """Extend the leases of ``claims`` still held; returns their tokens."""
    held: set[str] = set()
    for claim in sorted(claims, key=lambda c: c.intent.entity_key):
        if tx.execute(
            """UPDATE effector_keys SET lease_expires_at_ms = ?
               WHERE entity_key = ? AND claim_token = ?""",
            (now_ms + lease_ms, claim.intent.entity_key, claim.token),
        ).rowcount:
            held.add(claim.token)
    return held


def mark_in_doubt(tx: sql.Tx, claim: Claim, reason: str, now_ms: int, retry_at_ms: int) -> bool:
    """Leave the claim's intent IN_DOUBT until ``retry_at_ms``, still holding its key.

    The key keeps the claim's token, with a lease that runs out at ``retry_at_ms`` (renewed by
    nobody), so nothing after the intent in its key runs and a claim takes it again then.
    ``False`` if the claim lost its key or the intent is not RUNNING (another result won).
    """
    held = tx.execute(
        """UPDATE effector_keys SET lease_expires_at_ms = ?
           WHERE entity_key = ? AND claim_token = ?""",
        (retry_at_ms, claim.intent.entity_key, claim.token),
    ).rowcount
    if not held:
        return False
    return bool(
        tx.execute(
            """UPDATE effector_intents SET state = ?, in_doubt_reason = ?, retry_at_ms = ?,
                 reconcile_failures = reconcile_failures + 1
               WHERE intent_id = ? AND state = ?""",
            (sql.IN_DOUBT, reason, retry_at_ms, claim.intent.intent_id, sql.RUNNING),
        ).rowcount
    )


def release_claims(tx: sql.Tx, claims: Sequence[Claim], *, started: bool = True) -> None:
    """Give claims back unfinished: their keys are free and their intents PENDING again.

    ``started=False``: the claims never ran, so their attempt is not counted (a later claim
    then does not take them for possibly started and ask their reconcilers).
    """
    uncount = "" if started else ", attempts = attempts - 1"
    for claim in sorted(claims, key=lambda c: c.intent.entity_key):
        if tx.execute(
            f"UPDATE effector_keys SET {_NO_CLAIM} WHERE entity_key = ? AND claim_token = ?",
            (claim.intent.entity_key, claim.token),
        ).rowcount:
            tx.execute(
                f"UPDATE effector_intents SET state = ?{uncount} WHERE intent_id = ? AND state = ?",
                (sql.PENDING, claim.intent.intent_id, sql.RUNNING),
            )


def release_all_claims(tx: sql.Tx) -> None:
    """Give back every claim: for a store only one process may open, all of them are stale."""
    tx.execute(f"UPDATE effector_keys SET {_NO_CLAIM} WHERE claim_token IS NOT NULL")
    tx.execute("UPDATE effector_intents SET state = ? WHERE state = ?", (sql.PENDING, sql.RUNNING))


def expire_approvals(
    tx: sql.Tx, dialect: sql.Dialect, now_ms: int, limit: int
) -> tuple[list[ToolIntent], int]:
    """Refuse up to ``limit`` undecided approvals past their deadline; returns them and the head."""
    rows = tx.execute(
        """SELECT intent_id, intent FROM effector_intents
           WHERE state = 3 AND deadline_ms > 0 AND deadline_ms < ?
           ORDER BY deadline_ms LIMIT ?"""
        + dialect.skip_locked,
        (now_ms, limit),
    ).fetchall()
    envelopes = []
    refused: list[ToolIntent] = []
    for intent_id, blob in rows:
        intent = ToolIntent.FromString(bytes(blob))
        result = expired_result(intent, now_ms=now_ms, attempts=0)
        published = finish(tx, intent_id, result, result_envelope(result), now_ms, sql.AWAITING)
        if published is not None:
            envelopes.append(published)
            refused.append(intent)
    offsets = sql.append(tx, envelopes, now_ms)
    return refused, sql.head_after(offsets)


def decide(
    tx: sql.Tx,
    dialect: sql.Dialect,
    intent_id: str,
    approval: Approval,
) -> tuple[Decision, ToolIntent | None, int]:
    """Record ``approval`` on an undecided approval intent (EXPIRED if past its deadline).

    Returns the decision, the intent if this call refused it as expired, and the log head.
    """
    now_ms = approval.decided_at_ms
    row = tx.execute(
        "SELECT intent, state, deadline_ms, result FROM effector_intents WHERE intent_id = ?"
        + dialect.for_update,
        (intent_id,),
    ).fetchone()
    if row is None:
        unknown = Decision(False, IntentState.INTENT_STATE_UNSPECIFIED, "unknown intent", None)
        return unknown, None, 0
    intent = ToolIntent.FromString(bytes(row[0]))
    state, deadline_ms, result = row[1], row[2], sql.parse_result(row[3])
    if intent.kind != ToolIntent.APPROVAL:
        return Decision(False, state, "not an approval intent", result), None, 0
    if state == sql.DONE:
        assert result is not None
        already = "already expired" if result.status == ToolResult.EXPIRED else "already decided"
        return Decision(False, state, already, result), None, 0
    if deadline_ms and now_ms > deadline_ms:
        result = expired_result(intent, now_ms=now_ms, attempts=0)
        envelope, applied, reason = result_envelope(result), False, "expired before the decision"
    else:
        result = decision_result(intent, approval)
        envelope, applied, reason = approval_envelope(approval, intent.entity_key), True, ""
    published = finish(tx, intent_id, result, envelope, now_ms, sql.AWAITING)
    offsets = sql.append(tx, [] if published is None else [published], now_ms)
    refused = intent if published is not None and not applied else None
    return Decision(applied, sql.DONE, reason, result), refused, sql.head_after(offsets)
