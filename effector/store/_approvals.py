"""Approval decisions bound to their arguments, gathered into quorums.

:func:`vote` runs every decision: it refuses one made on other arguments (its digest is not
the intent's: a stale screen), records a vote while an approval needs more distinct approvers
(``ToolIntent.required_approvals``) and decides when the quorum is reached or anyone denies,
through :func:`effector.store._execution.decide`. Votes live in ``effector_approval_votes``
until the approval is decided, and are pruned with the intents after that.
"""

from __future__ import annotations

import effector.store._execution as execution
import effector.store._tx as sql
from beam_agents._protos import Approval, IntentState, ToolIntent, approval_digest
from effector.store.base import Decision


def approval_statements(dialect: sql.Dialect) -> list[str]:
    """The votes table: created on any schema version (a store without it has no quorums)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS effector_approval_votes (
            intent_id TEXT NOT NULL,
            approver TEXT NOT NULL,
            position INTEGER NOT NULL,
            vote {dialect.blob} NOT NULL,
            recorded_at_ms {dialect.bigint} NOT NULL,
            PRIMARY KEY (intent_id, approver))""",
    ]


def votes(tx: sql.Tx, intent_id: str) -> list[Approval]:
    """The votes recorded on an approval still gathering its quorum, in voting order."""
    rows = tx.execute(
        "SELECT vote FROM effector_approval_votes WHERE intent_id = ? ORDER BY position",
        (intent_id,),
    ).fetchall()
    return [Approval.FromString(bytes(row[0])) for row in rows]


def vote(
    tx: sql.Tx, dialect: sql.Dialect, intent_id: str, ballot: Approval
) -> tuple[Decision, ToolIntent | None, int]:
    """Record ``ballot`` on an approval; decide it if that completes its quorum or denies.

    Returns what :func:`effector.store._execution.decide` returns. A recorded vote that does
    not decide yet is applied with state AWAITING_DECISION and a reason counting the votes.
    Unknown, non-approval, decided and expired intents are left to ``decide`` to answer.
    """
    row = tx.execute(
        "SELECT intent, state, deadline_ms FROM effector_intents WHERE intent_id = ?"
        + dialect.for_update,
        (intent_id,),
    ).fetchone()
    if row is None or row[1] != sql.AWAITING:
        return execution.decide(tx, dialect, intent_id, ballot)
    intent = ToolIntent.FromString(bytes(row[0]))
    if row[2] and ballot.decided_at_ms > row[2]:
        return execution.decide(tx, dialect, intent_id, ballot)
    digest = approval_digest(intent.args_json)
    if ballot.args_digest and ballot.args_digest != digest:
        stale = (
            f"stale decision: it was made on arguments with digest {ballot.args_digest}, but "
            f"the approval asks about arguments with digest {digest}; look again and decide"
        )
        return Decision(False, IntentState.AWAITING_DECISION, stale, None), None, 0
    decision = Approval()
    decision.CopyFrom(ballot)
    decision.args_digest = digest
    required = max(intent.required_approvals, 1)
    if required == 1:
        return execution.decide(tx, dialect, intent_id, decision)
    earlier = votes(tx, intent_id)
    if any(earlier_vote.approver == ballot.approver for earlier_vote in earlier):
        again = (
            f"{ballot.approver!r} already voted on this approval; a quorum of {required} needs "
            "distinct approvers"
        )
        return Decision(False, IntentState.AWAITING_DECISION, again, None), None, 0
    if ballot.approved:
        agreeing = [
            earlier_vote.approver
            for earlier_vote in earlier
            if earlier_vote.approved and earlier_vote.edited_args_json == ballot.edited_args_json
        ]
        decision.approvers.extend([*agreeing, ballot.approver])
    else:
        decision.approvers.append(ballot.approver)
    if ballot.approved and len(decision.approvers) < required:
        recorded = Approval()
        recorded.CopyFrom(ballot)
        recorded.args_digest = digest
        tx.execute(
            """INSERT INTO effector_approval_votes
               (intent_id, approver, position, vote, recorded_at_ms) VALUES (?, ?, ?, ?, ?)""",
            (
                intent_id,
                ballot.approver,
                len(earlier),
                recorded.SerializeToString(),
                ballot.decided_at_ms,
            ),
        )
        counted = (
            f"vote recorded: {len(decision.approvers)} of {required} approvals "
            f"({', '.join(decision.approvers)}); waiting for more"
        )
        return Decision(True, IntentState.AWAITING_DECISION, counted, None), None, 0
    tx.execute("DELETE FROM effector_approval_votes WHERE intent_id = ?", (intent_id,))
    return execution.decide(tx, dialect, intent_id, decision)


def prune_votes(tx: sql.Tx, now_ms: int, retention_ms: int) -> int:
    """Forget votes past the retention on approvals no longer awaiting (expired ones)."""
    return int(
        tx.execute(
            """DELETE FROM effector_approval_votes WHERE recorded_at_ms < ? AND intent_id NOT IN
                 (SELECT intent_id FROM effector_intents WHERE state = ?)""",
            (now_ms - retention_ms, sql.AWAITING),
        ).rowcount
    )
