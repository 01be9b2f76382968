"""``SqlStore``: the durable record both SQL backends share, one method per store verb.

Each verb runs one transaction on the backend's executor threads (its SQL is the ``_verb``
method beside it); the telemetry verbs are inherited from
:class:`~effector.store.telemetry.TelemetryTables`. Time is always passed in (``now_ms``): the
store never reads a clock.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import functools
import hashlib
import itertools
import logging
import math
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import effector.store.schema as sql
from beam_agents._protos import (
    AgentEnvelope,
    Approval,
    ApprovalEdit,
    IntentState,
    PolicyDecision,
    ToolIntent,
    ToolResult,
    approval_digest,
)
from effector.store.budgets import BudgetLedger, apply_debits, parse_debit
from effector.store.claims import ClaimLedger, Hold, Release, prune_idle_keys
from effector.store.intents import (
    Claim,
    ClaimBatch,
    ClaimRequest,
    CompensationSettlement,
    Completion,
    Decision,
    IntentRecord,
    LogRecord,
    NewIntent,
    Overview,
    StoreCounts,
    SubmitOutcome,
    SubmitResult,
    approval_envelope,
    args_diff,
    conflict_result,
    decision_result,
    expired_result,
    expiry_deadline_ms,
    gate_id_for,
    gate_refusal,
    late_original_reason,
    new_result,
    rejected_result,
    result_envelope,
    withdrawn_result,
)
from effector.store.telemetry import TelemetryTables

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_FAILED_SCAN_BATCH = 1_000
_SEARCH_SCAN_BATCH = 500
MINUTE_MS = 60_000
_WITHDRAWABLE = frozenset({ToolIntent.TOOL, ToolIntent.APPROVAL})
"""The kinds of intent a WITHDRAWAL withdraws."""
REQUIRE_APPROVAL = "require_approval"
"""The policy outcome stored on a TOOL intent a policy held for its approval."""
_UNPUBLISHED_KINDS = frozenset({ToolIntent.WITHDRAWAL, ToolIntent.BUDGET_DEBIT})
"""Kinds recorded DONE and never published: no run waits for them."""
_SUCCEEDED = frozenset({ToolResult.OK, ToolResult.NOT_NEEDED})
"""Results that are not failures: OK, and a compensation that had nothing to undo."""
_RAN = frozenset({ToolResult.OK, ToolResult.ERROR})
"""Results of an original that ran (or may have made part of its effect): compensate it."""
_HEAD_COLUMNS = ("intent_id", "intent", "state", "attempts", "deadline_ms", "reconcile_failures")
"""What a claim reads of each key's head intent."""
RECORD_COLUMNS = (
    "intent, state, outcome, attempts, received_at_ms, started_at_ms, completed_at_ms, "
    "in_doubt_reason, retry_at_ms, policy_rule, policy_outcome"
)
"""The columns :func:`intent_record` reads, in order."""
_EXECUTED = f"{sql.SETTLED} AND settled_state = 4 AND run_ms IS NOT NULL"
"""DONE intents that were executed (not decided, rejected or expired without a claim)."""

_TOKEN_PREFIX = os.urandom(8).hex()
_token_numbers = itertools.count()


def _new_token_prefix() -> None:
    """Draw this process's token prefix afresh (a forked child must not repeat its parent's)."""
    global _TOKEN_PREFIX, _token_numbers
    _TOKEN_PREFIX = os.urandom(8).hex()
    _token_numbers = itertools.count()


os.register_at_fork(after_in_child=_new_token_prefix)


def new_token() -> str:
    """A claim token no other claim has: this process's random prefix and a counter."""
    return f"{_TOKEN_PREFIX}{next(_token_numbers):016x}"


def intent_record(row: Sequence[Any]) -> IntentRecord:
    """The :class:`IntentRecord` of a row holding :data:`RECORD_COLUMNS`."""
    blob, state, outcome, attempts, received_at_ms, started_at_ms, completed_at_ms = row[:7]
    in_doubt_reason, retry_at_ms, policy_rule, policy_outcome = row[7:11]
    intent = ToolIntent.FromString(bytes(blob))
    return IntentRecord(
        intent,
        state,
        sql.outcome_result(outcome, intent),
        attempts,
        received_at_ms=received_at_ms,
        started_at_ms=started_at_ms,
        completed_at_ms=completed_at_ms,
        in_doubt_reason=in_doubt_reason or "",
        retry_at_ms=retry_at_ms,
        policy_rule=policy_rule or "",
        policy_outcome=policy_outcome or "",
    )


# -- compensation verdicts ----------------------------------------------------------------------


def verdict(
    original: IntentRecord | None,
    compensation: ToolIntent,
    *,
    now_ms: int,
    attempt: int,
    compensated_by: str | None = None,
) -> ToolResult | None:
    """What a claimed compensating intent records instead of executing; ``None``: execute it.

    An unknown ``original`` makes it REJECTED, one that never ran NOT_NEEDED, and one that ran
    is undone once: a compensation other than ``compensated_by`` is REJECTED.
    """
    target = compensation.compensates_intent_id
    if original is None:
        return rejected_result(
            compensation,
            f"compensated intent {target} is unknown to this effector (never submitted, or "
            "pruned after the result retention): a compensation runs only after its original; "
            "it will be refused if it arrives later",
            now_ms=now_ms,
        )
    problem = _mismatch(original.intent, compensation)
    if problem is None and original.state == IntentState.WITHDRAWN:
        return new_result(
            compensation,
            ToolResult.NOT_NEEDED,
            completed_at_ms=now_ms,
            attempt=attempt,
            error_message=f"compensated intent {target} was withdrawn, so it never ran: "
            "nothing to undo",
        )
    if problem is None and (original.state != IntentState.DONE or original.result is None):
        state = IntentState.Name(original.state)
        problem = f"compensated intent {target} is {state}, not DONE, when its compensation ran"
    if problem is not None:
        return rejected_result(compensation, problem, now_ms=now_ms)
    assert original.result is not None
    if original.result.status in _RAN:
        if compensated_by is None or compensated_by == compensation.intent_id:
            return None
        return rejected_result(
            compensation,
            f"compensated intent {target} is already compensated by {compensated_by}",
            now_ms=now_ms,
        )
    status = ToolResult.Status.Name(original.result.status)
    return new_result(
        compensation,
        ToolResult.NOT_NEEDED,
        completed_at_ms=now_ms,
        attempt=attempt,
        error_message=f"compensated intent {target} never ran ({status}): nothing to undo",
    )


def arrived_late(original: IntentRecord | None, compensation: ToolIntent) -> bool:
    """Whether ``original`` was submitted after ``compensation`` was claimed (refuse it)."""
    return (
        original is not None
        and original.state == IntentState.PENDING
        and original.attempts == 0
        and _mismatch(original.intent, compensation) is None
    )


def _mismatch(original: ToolIntent, compensation: ToolIntent) -> str | None:
    """Why ``compensation`` is not the compensation ``original`` declared, if it is not."""
    target = original.intent_id
    if original.kind != ToolIntent.TOOL:
        return f"compensated intent {target} is not a TOOL intent"
    if original.entity_key != compensation.entity_key:
        return f"compensated intent {target} belongs to another entity key"
    if (original.seq, original.step_index) >= (compensation.seq, compensation.step_index):
        return f"compensated intent {target} is not at an earlier position of its key"
    if not original.compensate_tool:
        return f"compensated intent {target} declared no compensation"
    if (original.compensate_tool, original.compensate_args_json) != (
        compensation.tool_name,
        compensation.args_json,
    ):
        return (
            f"compensation does not match the one intent {target} declared "
            f"({original.compensate_tool!r} with {original.compensate_args_json})"
        )
    return None


# -- group commit -------------------------------------------------------------------------------

_Request = TypeVar("_Request")
_Answer = TypeVar("_Answer")


class GroupCommit(Generic[_Request, _Answer]):
    """Commits concurrent requests in batches through ``commit``, which answers each, in order.

    While one batch commits, the next requests gather for the following commit. If a batch
    fails, each of its requests is committed again on its own, so one bad request fails alone.
    """

    def __init__(
        self, commit: Callable[[Sequence[_Request]], Awaitable[Sequence[_Answer]]]
    ) -> None:
        self._commit = commit
        self._queue: list[tuple[_Request, asyncio.Future[_Answer]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def __call__(self, request: _Request) -> _Answer:
        """Queue ``request``, and return its answer once the batch it joined is committed."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_Answer] = loop.create_future()
        self._queue.append((request, answer))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="effector-group-commit")
        # Shielded: a caller that gives up must not pull its request out of a commit that has
        # begun; the request is committed all the same and the answer goes unread.
        return await asyncio.shield(answer)

    async def drain(self) -> None:
        """Wait until everything queued is committed (or has failed)."""
        while self._flusher is not None:
            await self._flusher

    async def _flush(self) -> None:
        batch: list[tuple[_Request, asyncio.Future[_Answer]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._commit_batch(batch)
        finally:
            self._flusher = None
            # Only a cancelled flusher (the loop is closing) leaves answers unset.
            for _, answer in batch + self._queue:
                answer.cancel()

    async def _commit_batch(self, batch: list[tuple[_Request, asyncio.Future[_Answer]]]) -> None:
        try:
            answers = await self._commit([request for request, _ in batch])
        except Exception as exc:
            if len(batch) > 1:
                for single in batch:
                    await self._commit_batch([single])
            elif not batch[0][1].done():
                batch[0][1].set_exception(exc)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)


@dataclass(frozen=True, slots=True)
class _Submission:
    """One caller's submit, waiting to be recorded together with its concurrent neighbours."""

    intents: Sequence[NewIntent]
    now_ms: int
    redeliver_results: bool


@dataclass(frozen=True, slots=True)
class _Known:
    """What is recorded about an intent id, as far as a submit needs to answer for it."""

    digest: bytes
    state: IntentState
    result: ToolResult | None
    outcome: bytes | None
    """The result's envelope as stored: published unless withdrawn or a withdrawal's."""
    entity_key: bytes
    seq: int
    kind: ToolIntent.Kind = ToolIntent.TOOL
    withdrawal: ToolIntent | None = None
    """A recorded valid WITHDRAWAL intent itself (to withdraw its target if it comes later)."""
    retry_at_ms: int | None = None

    @property
    def published_envelope(self) -> bytes | None:
        """The envelope published for its result (redelivered as is); ``None`` if none was."""
        published = self.state == sql.DONE and self.kind not in _UNPUBLISHED_KINDS
        return self.outcome if published else None


class SqlStore(TelemetryTables, BudgetLedger, abc.ABC):
    """The store over SQL; each backend supplies its connections and transactions.

    Guarantees on every backend: one record per intent id (a second submit of the id never
    creates a second record); a result is recorded in the transaction that appends its
    envelope, whose bytes are kept for redelivery; log offsets start at 1, increase by one and
    become visible in offset order; at most one live claim per key, a key's intents claimed in
    ``(seq, step_index)`` order, each only after the one before it is DONE or WITHDRAWN; a
    claim whose lease ran out may be claimed again; an IN_DOUBT intent holds its key until its
    retry time; a WITHDRAWN intent never runs and its result is never published.

    Claims live in ``claims`` (:mod:`effector.store.claims`): an intent's row is written when it
    is submitted and when its result (or doubt) is recorded, never to claim it.

    ``claim_with_results``: :meth:`complete_and_claim` runs in one transaction (SQLite, whose
    writes are serialized anyway, saves a commit); otherwise in two, so the key rows the
    results lock are not held through the claim (PostgreSQL).
    """

    def __init__(
        self,
        dialect: sql.Dialect,
        executor: Executor,
        head: int,
        poll_interval_s: float | None,
        claims: ClaimLedger,
        read_executor: Executor | None = None,
        *,
        claim_with_results: bool = False,
    ) -> None:
        self._dialect = dialect
        self._claims = claims
        self._claim_with_results = claim_with_results
        self._executor = executor
        self._read_executor = executor if read_executor is None else read_executor
        self._known_head = head
        self._poll_interval_s = poll_interval_s
        self._appended = asyncio.Event()
        self._submissions: GroupCommit[_Submission, list[SubmitResult]] = GroupCommit(
            self._record_submissions
        )

    @abc.abstractmethod
    def _transaction(self, work: Callable[[sql.Tx], _T], *, write: bool) -> _T:
        """Run ``work`` in one transaction on the calling (executor) thread."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release every resource the store holds; the store is unusable afterwards."""

    async def _run(self, work: Callable[[sql.Tx], _T], *, write: bool = True) -> _T:
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

    # -- intake: recording submitted intents ------------------------------------------------

    async def submit(
        self, intents: Sequence[NewIntent], now_ms: int, *, redeliver_results: bool = False
    ) -> list[SubmitResult]:
        """Record new intents (deduplicated by id) and answer for each, in request order.

        A later request for a recorded id is a DUPLICATE (same digest) or a CONFLICT; each
        CONFLICT appends a REJECTED result for the refused submission. With
        ``redeliver_results``, every DUPLICATE already DONE appends its result's envelope again,
        byte for byte. A WITHDRAWAL is recorded DONE, unpublished, and withdraws its target
        (AWAITING_DECISION, or PENDING and never started) now or when it arrives. Concurrent
        submits share one transaction.
        """
        return await self._submissions(_Submission(intents, now_ms, redeliver_results))

    async def _record_submissions(
        self, submissions: Sequence[_Submission]
    ) -> list[list[SubmitResult]]:
        """Record a group of submits as one, at its latest ``now_ms``, and split the answers."""
        intents = [new for submission in submissions for new in submission.intents]
        redeliver = [
            submission.redeliver_results for submission in submissions for _ in submission.intents
        ]
        now_ms = max(submission.now_ms for submission in submissions)
        answers, head = await self._run(lambda tx: self._submit(tx, intents, now_ms, redeliver))
        self._announce(head)
        split, start = [], 0
        for submission in submissions:
            split.append(answers[start : start + len(submission.intents)])
            start += len(submission.intents)
        return split

    def _submit(
        self, tx: sql.Tx, intents: Sequence[NewIntent], now_ms: int, redeliver: Sequence[bool]
    ) -> tuple[list[SubmitResult], int]:
        """Record ``intents``; returns the answers and the log head after what it appended.

        With row locks (PostgreSQL), an intent and its withdrawal submitted at once through two
        connections must see each other: both lock their key row before looking for the other.
        A batch holding approvals or withdrawals locks its keys first; a batch of TOOL intents
        only (the bulk of the traffic) locks them as it counts their work, and looks again.
        """
        lock_first = bool(self._dialect.for_update) and any(
            new.intent.kind != ToolIntent.TOOL for new in intents
        )
        refused = self._refused_originals(tx, intents, now_ms, lock_all=lock_first)
        if refused:
            intents = [
                dataclasses.replace(new, rejection=refused[new.intent.intent_id])
                if new.intent.intent_id in refused
                else new
                for new in intents
            ]
        # The first of several requests for one id in a batch is the one recorded.
        order = sorted(range(len(intents)), key=lambda i: (intents[i].intent.intent_id, i))
        first_of: dict[str, int] = {}
        for index in order:
            first_of.setdefault(intents[index].intent.intent_id, index)
        # One lookup per batch: the withdrawal recorded for each intent (it may come first; found
        # by the target it names, on the small index of withdrawals), and each withdrawal with its
        # target. The ids recorded already are read after the insert (duplicates are rare).
        withdrawable = [
            intent_id
            for intent_id, index in first_of.items()
            if intents[index].intent.kind in _WITHDRAWABLE
        ]
        withdrawing = {
            identity
            for index in first_of.values()
            if _is_withdrawal(intents[index])
            for identity in (
                intents[index].intent.intent_id,
                intents[index].intent.withdraws_intent_id,
            )
        }
        known = _known_intents(tx, sorted(withdrawing), withdrawn=withdrawable)
        foreign = _foreign_withdrawals(intents, first_of, known)
        if foreign:
            refused.update(foreign)
            intents = [
                dataclasses.replace(new, rejection=foreign[new.intent.intent_id])
                if new.intent.intent_id in foreign and new.rejection is None
                else new
                for new in intents
            ]
        blobs = [new.intent.SerializeToString(deterministic=True) for new in intents]
        digests = [hashlib.sha256(blob).digest() for blob in blobs]
        withdrawals = _withdrawals_by_target(intents, first_of, known)
        candidates: dict[str, _Known] = {}
        rows: list[tuple[Any, ...]] = []
        # Rows go in by id where inserts take row locks (concurrent submits of one id never
        # deadlock), else in arrival order, the order claims take them: a result batch then
        # rewrites neighbouring rows.
        inserting: Iterable[tuple[str, int]] = first_of.items()
        if not self._dialect.for_update:
            inserting = sorted(first_of.items(), key=lambda item: item[1])
        for intent_id, index in inserting:
            if intent_id in known:
                continue
            intent = intents[index].intent
            state, result = _initial_state(intents[index], withdrawals.get(intent_id), now_ms)
            stored = None if result is None else result_envelope(result).SerializeToString()
            candidates[intent_id] = _Known(
                digests[index], state, result, stored, intent.entity_key, intent.seq, intent.kind
            )
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
                    stored,
                    None if result is None else now_ms,
                    None if result is None else state,
                    sql.text(intent.tool_name),
                    intent.withdraws_intent_id if _is_withdrawal(intents[index]) else None,
                    int(intents[index].rejection is not None),
                    intents[index].policy_rule or None,
                    intents[index].policy_outcome or None,
                    None,
                )
            )
        inserted = _insert_intents(tx, rows)
        gates = [
            intents[first_of[intent_id]].gate
            for intent_id in inserted
            if candidates[intent_id].state == sql.AWAITING
            and candidates[intent_id].kind == ToolIntent.TOOL
        ]
        opened = _insert_intents(
            tx, [_gate_row(gate, now_ms) for gate in gates if gate is not None]
        )
        taken = [gate for gate in gates if gate is not None and gate.intent_id not in opened]
        for gate in taken:  # its approval's id is recorded already: hold nothing, refuse it
            intent_id = gate.policy_gate_for
            refusal = rejected_result(
                intents[first_of[intent_id]].intent,
                f"denied by effect policy: rule {gate.policy_rule!r} requires approval, but its "
                f"approval id {gate.intent_id} is recorded already; refused closed",
                now_ms=now_ms,
            )
            published = _finish(
                tx, intent_id, refusal, result_envelope(refusal), now_ms, sql.AWAITING
            )
            candidates[intent_id] = dataclasses.replace(
                candidates[intent_id], state=sql.DONE, result=refusal, outcome=published
            )
        debits = [
            parse_debit(intents[first_of[intent_id]].intent)
            for intent_id in inserted
            if candidates[intent_id].kind == ToolIntent.BUDGET_DEBIT
            and intents[first_of[intent_id]].rejection is None
        ]
        if debits:
            apply_debits(tx, debits, now_ms)
        known.update(_known_intents(tx, [i for i in candidates if i not in inserted]))
        known.update((intent_id, candidates[intent_id]) for intent_id in inserted)
        targets = [
            (target, known[target].entity_key, known[target].seq, withdrawal)
            for target, withdrawal in withdrawals.items()
            if withdrawal.intent_id in inserted and target in known and target not in inserted
        ]
        for target, result in self._withdraw(tx, targets, now_ms).items():
            known[target] = dataclasses.replace(known[target], state=sql.WITHDRAWN, result=result)
        self._mark_running(tx, known, inserted)
        answers: list[SubmitResult | None] = [None] * len(intents)
        conflicts: list[int] = []
        envelopes: dict[int, bytes] = {}  # appended in request order
        new_work: dict[int, bytes] = {}  # by request index
        for index in order:
            intent = intents[index].intent
            first = known[intent.intent_id]
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
                    new_work[index] = intent.entity_key
                continue
            same = first.digest == digests[index]
            outcome = SubmitOutcome.DUPLICATE if same else SubmitOutcome.CONFLICT
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
            envelopes.update(_publish_conflicts(intents, conflicts, answers, now_ms))
        held = {
            known[i].entity_key
            for i in inserted
            if known[i].state == sql.AWAITING and known[i].kind == ToolIntent.TOOL
        }
        if held:  # a policy holds them: they wait, but a withdrawal must still meet them
            self._claims.lock(tx, held | set(new_work.values()), now_ms)  # one key order
        self._claims.queued(tx, [new_work[index] for index in sorted(new_work)], now_ms)
        if self._dialect.for_update and not lock_first and (new_work or held):
            # The key rows are locked now: a withdrawal committed meanwhile is visible.
            fresh = [
                i
                for i in inserted
                if known[i].kind == ToolIntent.TOOL
                and known[i].state in (sql.PENDING, sql.AWAITING)
            ]
            late = _known_intents(tx, (), withdrawn=fresh)
            found = {
                k.withdrawal.withdraws_intent_id: k.withdrawal
                for k in late.values()
                if k.withdrawal
            }
            targets = [
                (i, known[i].entity_key, known[i].seq, found[i]) for i in fresh if i in found
            ]
            for target, result in self._withdraw(tx, targets, now_ms).items():
                index = first_of[target]
                answer = answers[index]
                assert answer is not None
                answers[index] = dataclasses.replace(answer, state=sql.WITHDRAWN, result=result)
        offsets = sql.append(tx, [envelopes[index] for index in sorted(envelopes)], now_ms)
        return [answer for answer in answers if answer is not None], sql.head_after(offsets)

    def _mark_running(self, tx: sql.Tx, known: dict[str, _Known], inserted: set[str]) -> None:
        """Say RUNNING for the recorded intents (not ``inserted`` now) their keys hold."""
        waiting = {i: k for i, k in known.items() if i not in inserted and k.outcome is None}
        if not waiting:
            return
        holds = self._claims.holds(tx, sorted({k.entity_key for k in waiting.values()}))
        for intent_id, recorded in waiting.items():
            hold = holds.get(recorded.entity_key)
            if (
                hold is not None
                and hold.token is not None
                and hold.intent_id == intent_id
                and not _waits_out_doubt(recorded.state, recorded.retry_at_ms, hold)
            ):
                known[intent_id] = dataclasses.replace(recorded, state=sql.RUNNING)

    def _refused_originals(
        self, tx: sql.Tx, intents: Sequence[NewIntent], now_ms: int, *, lock_all: bool
    ) -> dict[str, str]:
        """Intents of a Submit compensated before they arrived, each with why it is refused.

        Locks their key rows first, as a settling compensation does (``lock_all``: the key rows
        of the whole batch).
        """
        linked = [new for new in intents if new.intent.compensate_tool and new.rejection is None]
        locked = intents if lock_all else linked
        self._claims.lock(tx, {new.intent.entity_key for new in locked}, now_ms)
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

    def _withdraw(
        self,
        tx: sql.Tx,
        targets: Sequence[tuple[str, bytes, int, ToolIntent]],
        now_ms: int,
    ) -> dict[str, ToolResult]:
        """Withdraw recorded intents ``(id, key, seq, withdrawal)`` that have not started.

        An intent AWAITING_DECISION, or PENDING and never started, of the withdrawal's key is
        WITHDRAWN (leaving its key's queue); one RUNNING, IN_DOUBT or DONE is left as it is.
        Returns the WITHDRAWN results recorded, by intent id.
        """
        holds = self._claims.holds(tx, sorted({target[1] for target in targets}))
        started = {hold.intent_id for hold in holds.values() if hold.attempts > 0}
        targets = [target for target in targets if target[0] not in started]
        results = {
            target: withdrawn_result(
                ToolIntent(intent_id=target, entity_key=entity_key, seq=seq),
                withdrawal,
                now_ms=now_ms,
            )
            for target, entity_key, seq, withdrawal in targets
        }
        rows = sorted(
            (target, withdrawal.entity_key, result_envelope(results[target]).SerializeToString())
            for target, _, _, withdrawal in targets
        )
        recorded: dict[str, ToolResult] = {}
        withdrawn: set[bytes] = set()
        held: set[str] = set()
        for chunk in sql.chunks(rows):
            for intent_id, kind, entity_key, policy_outcome in tx.execute(
                f"""WITH withdrawn (intent_id, entity_key, outcome) AS
                      (VALUES {sql.row_marks(len(chunk), 3)})
                    UPDATE effector_intents SET state = ?, outcome = withdrawn.outcome,
                      completed_at_ms = ?, settled_state = ?
                    FROM withdrawn
                    WHERE effector_intents.intent_id = withdrawn.intent_id
                      AND effector_intents.entity_key = withdrawn.entity_key
                      AND effector_intents.gates_intent_id IS NULL
                      AND (effector_intents.state = ? OR (effector_intents.state = ?
                           AND effector_intents.attempts = 0))
                    RETURNING effector_intents.intent_id, effector_intents.kind,
                      effector_intents.entity_key, effector_intents.policy_outcome""",
                [
                    *sql.flatten(chunk),
                    sql.WITHDRAWN,
                    now_ms,
                    sql.WITHDRAWN,
                    sql.AWAITING,
                    sql.PENDING,
                ],
            ).fetchall():
                recorded[intent_id] = results[intent_id]
                if kind == ToolIntent.TOOL:
                    withdrawn.add(bytes(entity_key))
                    if policy_outcome == REQUIRE_APPROVAL:
                        held.add(intent_id)
        gates = []  # the approvals a policy opened to hold the withdrawn intents
        for target, entity_key, _, _ in targets:
            if target in held:
                gate_result = ToolResult()
                gate_result.CopyFrom(results[target])
                gate_result.intent_id = gate_id_for(target)
                envelope = result_envelope(gate_result).SerializeToString()
                gates.append((gate_result.intent_id, entity_key, envelope))
        for chunk in sql.chunks(sorted(gates)):
            tx.execute(
                f"""WITH gate (intent_id, entity_key, outcome) AS
                      (VALUES {sql.row_marks(len(chunk), 3)})
                    UPDATE effector_intents SET state = ?, outcome = gate.outcome,
                      completed_at_ms = ?, settled_state = ?
                    FROM gate
                    WHERE effector_intents.intent_id = gate.intent_id
                      AND effector_intents.entity_key = gate.entity_key
                      AND effector_intents.state = {int(sql.AWAITING)}
                      AND effector_intents.gates_intent_id IS NOT NULL""",
                [*sql.flatten(chunk), sql.WITHDRAWN, now_ms, sql.WITHDRAWN],
            )
        # A key a policy's approval parked wakes for the work behind the withdrawn intent.
        self._claims.queued(tx, sorted(withdrawn), now_ms)
        self._claims.settled(tx, withdrawn)
        return recorded

    # -- execution: claims, results, leases ---------------------------------------------------

    async def claim(self, owner: str, limit: int, now_ms: int, lease_ms: int) -> ClaimBatch:
        """Claim up to ``limit`` runnable intents, each the head of an idle key."""
        batch, head = await self._run(
            lambda tx: self._claim_work(tx, owner, limit, now_ms, lease_ms)
        )
        self._announce(head)
        return batch

    def _claim_work(
        self, tx: sql.Tx, owner: str, limit: int, now_ms: int, lease_ms: int
    ) -> tuple[ClaimBatch, int]:
        """Claim the heads of idle keys; returns the batch and the log head.

        A head past its deadline that never started is recorded EXPIRED instead. The attempt of
        a claim counts every earlier claim of the intent (its key's hold remembers one whose
        lease ran out or that was given back after it started).
        """
        offered = self._claims.claimable(tx, limit, now_ms)
        if not offered:
            return ClaimBatch([]), 0
        holds = {key: hold for key, hold in offered if hold is not None}
        taken: list[Hold] = []
        claims: list[Claim] = []
        expired: list[bytes] = []
        refused: list[ToolIntent] = []
        untaken: list[bytes] = []
        heads = self._queue_heads(tx, [key for key, _ in offered])
        parked: list[bytes] = []
        for intent_id, blob, state, attempts, deadline_ms, failures in heads:
            intent = ToolIntent.FromString(bytes(blob))
            if state == sql.AWAITING:  # held by a policy's approval: its decision wakes the key
                parked.append(intent.entity_key)
                continue
            hold = holds.get(intent.entity_key)
            if hold is not None and hold.intent_id == intent_id:
                attempts = max(attempts, hold.attempts)
            if deadline_ms and now_ms > deadline_ms and state != sql.IN_DOUBT and not attempts:
                result = expired_result(intent, now_ms=now_ms, attempts=attempts)
                published = _finish(tx, intent_id, result, result_envelope(result), now_ms, state)
                if published is not None:
                    expired.append(published)
                    refused.append(intent)
                untaken.append(intent.entity_key)
                continue
            claim = Claim(new_token(), intent, attempts + 1, deadline_ms or 0, failures or 0)
            claims.append(claim)
            taken.append(
                Hold(
                    intent.entity_key,
                    intent_id,
                    claim.token,
                    claim.attempt,
                    now_ms,
                    now_ms + lease_ms,
                    owner,
                )
            )
        headed = {hold.entity_key for hold in taken} | set(untaken) | set(parked)
        untaken += [key for key, _ in offered if key not in headed]  # none on one writer
        self._claims.park(tx, parked)
        self._claims.take(tx, taken)
        self._claims.queued(tx, untaken, now_ms)
        self._claims.settled(tx, untaken)
        offsets = sql.append(tx, expired, now_ms)
        return ClaimBatch(claims, refused), sql.head_after(offsets)

    def _queue_heads(self, tx: sql.Tx, keys: Sequence[bytes]) -> list[Any]:
        """The head of each key's queue (its first intent without a result), in id order."""

        def probe(columns: Sequence[str]) -> str:
            return f"""SELECT {", ".join(f"queued.{column}" for column in columns)}
                       FROM effector_intents AS queued
                       WHERE queued.entity_key = claimed.entity_key
                         AND {sql.queued("queued")}
                       ORDER BY queued.seq, queued.step_index LIMIT 1"""

        join = (
            f"CROSS JOIN LATERAL ({probe(_HEAD_COLUMNS)}) AS head"
            if self._dialect.lateral
            else f"JOIN effector_intents AS head ON head.intent_id = ({probe(['intent_id'])})"
        )
        rows: list[Any] = []
        for chunk in sql.chunks(keys):
            rows += tx.execute(
                f"""WITH claimed (entity_key) AS (VALUES {sql.row_marks(len(chunk), 1)})
                    SELECT {", ".join(f"head.{column}" for column in _HEAD_COLUMNS)}
                    FROM claimed {join}
                    ORDER BY head.intent_id""",
                chunk,
            ).fetchall()
        return rows

    async def complete(self, completions: Sequence[Completion], now_ms: int) -> list[bool]:
        """Record results and publish their envelopes; ``False`` where another result won."""
        recorded, head = await self._run(
            lambda tx: self._record_completions(tx, completions, now_ms)
        )
        self._announce(head)
        return recorded

    def _record_completions(
        self, tx: sql.Tx, completions: Sequence[Completion], now_ms: int
    ) -> tuple[list[bool], int]:
        """Record results, release their keys, publish; :meth:`complete`'s answer and the head.

        A result is recorded while its intent is RUNNING: its key holds it, by this claim's
        token or by a later one's (a claim whose lease ran out may finish after a later claim
        did, or beside it in one batch, where the first in key order is the one tried).
        """

        def lock_order(index: int) -> tuple[bytes, str]:
            intent = completions[index].claim.intent
            return intent.entity_key, intent.intent_id

        order = sorted(range(len(completions)), key=lock_order)
        claims = [completions[index].claim for index in order]
        holds = self._claims.holds(
            tx, sorted({claim.intent.entity_key for claim in claims}), lock=True
        )
        tried: dict[str, tuple[int, Hold]] = {}
        for index, claim in zip(order, claims, strict=True):
            hold = holds.get(claim.intent.entity_key)
            if hold and hold.token is not None and hold.intent_id == claim.intent.intent_id:
                tried.setdefault(claim.intent.intent_id, (index, hold))
        published = _finish_running(
            tx,
            [
                (intent_id, completions[index].result, hold)
                for intent_id, (index, hold) in tried.items()
            ],
            now_ms,
        )
        # After the results: a key whose queue they emptied is released idle.
        self._claims.release(
            tx,
            [
                holds[claim.intent.entity_key]
                for claim in claims
                if claim.intent.entity_key in holds
                and holds[claim.intent.entity_key].token == claim.token
            ],
            now_ms,
            Release.FINISHED,
        )
        recorded = [False] * len(completions)
        envelopes: list[bytes] = []
        for index, claim in zip(order, claims, strict=True):
            envelope = published.get(claim.intent.intent_id)
            if envelope is None or tried[claim.intent.intent_id][0] != index:
                continue
            recorded[index] = True
            envelopes.append(envelope)
            if tried[claim.intent.intent_id][1].token != claim.token:
                _log.warning(
                    "recorded intent %s from a claim that had lost its lease",
                    claim.intent.intent_id,
                )
        offsets = sql.append(tx, envelopes, now_ms)
        return recorded, sql.head_after(offsets)

    async def complete_and_claim(
        self, completions: Sequence[Completion], now_ms: int, request: ClaimRequest
    ) -> tuple[list[bool], ClaimBatch]:
        """:meth:`complete`, then :meth:`claim` as ``request`` says (nothing if its limit is 0).

        The claims start only after the results are durable. A claim that fails is logged and
        claims nothing: the results are recorded all the same.
        """
        if self._claim_with_results:
            recorded, batch, head = await self._run(
                lambda tx: self._record_and_claim(tx, completions, now_ms, request)
            )
            self._announce(head)
            return recorded, batch
        recorded = await self.complete(completions, now_ms)
        if request.limit <= 0:
            return recorded, ClaimBatch([])
        try:
            batch = await self.claim(request.owner, request.limit, now_ms, request.lease_ms)
        except Exception as exc:
            # The results are durable: the claim loop claims once woken.
            _log.warning("claiming after recording results failed: %r", exc, exc_info=exc)
            return recorded, ClaimBatch([])
        return recorded, batch

    def _record_and_claim(
        self, tx: sql.Tx, completions: Sequence[Completion], now_ms: int, request: ClaimRequest
    ) -> tuple[list[bool], ClaimBatch, int]:
        """:meth:`_record_completions`, then :meth:`_claim_work` in a savepoint: one transaction."""
        recorded, head = self._record_completions(tx, completions, now_ms)
        if request.limit <= 0:
            return recorded, ClaimBatch([]), head
        tx.execute("SAVEPOINT claim_after_results")
        point = self._claims.savepoint()
        try:
            batch, claim_head = self._claim_work(
                tx, request.owner, request.limit, now_ms, request.lease_ms
            )
        except Exception as exc:
            try:
                tx.execute("ROLLBACK TO SAVEPOINT claim_after_results")
                self._claims.rollback(point)
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
            return recorded, ClaimBatch([]), head
        tx.execute("RELEASE SAVEPOINT claim_after_results")
        return recorded, batch, max(head, claim_head)

    def _holds_of(self, tx: sql.Tx, claims: Sequence[Claim]) -> list[Hold]:
        """The holds ``claims`` still have (locked), in key order."""
        holds = self._claims.holds(
            tx, sorted({claim.intent.entity_key for claim in claims}), lock=True
        )
        tokens = {claim.token for claim in claims}
        return [hold for hold in holds.values() if hold.token in tokens]

    async def renew(self, claims: Sequence[Claim], now_ms: int, lease_ms: int) -> set[str]:
        """Extend the leases of ``claims``; returns the tokens that are still held."""

        def renew_leases(tx: sql.Tx) -> set[str]:
            held = self._holds_of(tx, claims)
            self._claims.extend(tx, held, now_ms + lease_ms)
            return {hold.token for hold in held if hold.token is not None}

        return await self._run(renew_leases)

    async def release(self, claims: Sequence[Claim], *, started: bool = True) -> None:
        """Give claims back unfinished: their keys are free and their intents PENDING again.

        ``started=False`` says they never ran: their attempt is not counted.
        """
        how = Release.STARTED if started else Release.UNSTARTED
        await self._run(lambda tx: self._claims.release(tx, self._holds_of(tx, claims), 0, how))

    async def mark_in_doubt(self, claim: Claim, reason: str, now_ms: int, retry_at_ms: int) -> bool:
        """Leave a claimed intent IN_DOUBT, its key held, until ``retry_at_ms``; whether it did."""

        def in_doubt(tx: sql.Tx) -> bool:
            held = self._holds_of(tx, [claim])
            if not held:
                return False
            [hold] = held
            self._claims.extend(tx, held, retry_at_ms)
            return bool(
                tx.execute(
                    f"""UPDATE effector_intents SET state = ?, in_doubt_reason = ?,
                          retry_at_ms = ?, reconcile_failures = reconcile_failures + 1,
                          attempts = ?, started_at_ms = ?
                        WHERE intent_id = ? AND {sql.OPEN}""",
                    (
                        sql.IN_DOUBT,
                        sql.text(reason),
                        retry_at_ms,
                        hold.attempts,
                        hold.started_at_ms,
                        claim.intent.intent_id,
                    ),
                ).rowcount
            )

        return await self._run(in_doubt)

    # -- approvals: votes, decisions, expiry --------------------------------------------------

    async def expire_approvals(self, now_ms: int, limit: int) -> list[ToolIntent]:
        """Refuse undecided approvals past their deadline (EXPIRED result envelopes)."""

        def expire(tx: sql.Tx) -> tuple[list[ToolIntent], int]:
            due = tx.execute(
                f"""SELECT intent_id FROM effector_intents
                    WHERE kind = 2 AND {sql.OPEN} AND deadline_ms > 0 AND deadline_ms < ?
                      AND gates_intent_id IS NOT NULL
                    ORDER BY deadline_ms LIMIT ?""",
                (now_ms, limit),
            ).fetchall()
            self._lock_gated_keys(tx, [row[0] for row in due], now_ms)
            rows = tx.execute(
                f"""SELECT intent_id, intent FROM effector_intents
                    WHERE kind = 2 AND {sql.OPEN} AND deadline_ms > 0 AND deadline_ms < ?
                    ORDER BY deadline_ms LIMIT ?"""
                + self._dialect.skip_locked,
                (now_ms, limit),
            ).fetchall()
            envelopes, refused = [], []
            for intent_id, blob in rows:
                intent = ToolIntent.FromString(bytes(blob))
                result = expired_result(intent, now_ms=now_ms, attempts=0)
                envelope = result_envelope(result)
                published = _finish(tx, intent_id, result, envelope, now_ms, sql.AWAITING)
                if published is not None and intent.policy_gate_for:
                    gated = self._release_gated(tx, intent, None, now_ms)
                    published = None if gated is None else gated[1]
                    intent = intent if gated is None else gated[0]
                if published is not None:
                    envelopes.append(published)
                    refused.append(intent)
            return refused, sql.head_after(sql.append(tx, envelopes, now_ms))

        refused, head = await self._run(expire)
        self._announce(head)
        return refused

    def _lock_gated_keys(self, tx: sql.Tx, gate_ids: Sequence[str], now_ms: int) -> None:
        """Lock the key rows of those ``gate_ids`` that a policy opened, before their rows.

        Deciding or expiring a policy's approval releases the intent it holds and wakes its key;
        taking the key first keeps the order a withdrawal takes (key, intent, approval).
        """
        if not self._dialect.for_update or not gate_ids:
            return
        keys = {
            bytes(row[0])
            for chunk in sql.chunks(sorted(set(gate_ids)))
            for row in tx.execute(
                f"""SELECT entity_key FROM effector_intents
                    WHERE intent_id IN ({sql.marks(len(chunk))}) AND gates_intent_id IS NOT NULL""",
                chunk,
            ).fetchall()
        }
        if keys:
            self._claims.lock(tx, keys, now_ms)

    async def record_vote(
        self,
        intent_id: str,
        *,
        approved: bool,
        approver: str,
        reason: str,
        now_ms: int,
        args_digest: str = "",
        edited_args_json: str = "",
    ) -> Decision:
        """Record a decision (or a quorum's vote) on an approval; publish it once decided.

        A non-empty ``args_digest`` that is not the intent's refuses it (stale). A quorum
        (``ToolIntent.required_approvals``) is decided when enough distinct approvers approve
        the same arguments, or at the first deny. ``edited_args_json`` (canonical, already
        validated) is approved in place of the asked arguments.
        """
        ballot = Approval(
            intent_id=intent_id,
            approved=approved,
            approver=approver,
            decided_at_ms=now_ms,
            reason=reason,
            args_digest=args_digest,
            edited_args_json=edited_args_json,
        )
        decision, head = await self._run(lambda tx: self._vote(tx, intent_id, ballot))
        self._announce(head)
        return decision

    def _vote(self, tx: sql.Tx, intent_id: str, ballot: Approval) -> tuple[Decision, int]:
        """Record ``ballot``; apply the decision if it completes the quorum or denies."""
        self._lock_gated_keys(tx, [intent_id], ballot.decided_at_ms)
        row = tx.execute(
            "SELECT intent, state, deadline_ms FROM effector_intents WHERE intent_id = ?"
            + self._dialect.for_update,
            (intent_id,),
        ).fetchone()
        if row is None or row[1] != sql.AWAITING:
            return self._apply_decision(tx, intent_id, ballot)
        intent = ToolIntent.FromString(bytes(row[0]))
        if row[2] and ballot.decided_at_ms > row[2]:
            return self._apply_decision(tx, intent_id, ballot)
        digest = approval_digest(intent.args_json)
        if ballot.args_digest and ballot.args_digest != digest:
            stale = (
                f"stale decision: it was made on arguments with digest {ballot.args_digest}, "
                f"but the approval asks about arguments with digest {digest}; look again and "
                "decide"
            )
            return Decision(False, IntentState.AWAITING_DECISION, stale, None), 0
        decision = Approval()
        decision.CopyFrom(ballot)
        decision.args_digest = digest
        required = max(intent.required_approvals, 1)
        if required == 1:
            return self._apply_decision(tx, intent_id, decision)
        earlier = _votes(tx, intent_id)
        voter = sql.text(ballot.approver)
        if any(sql.text(earlier_vote.approver) == voter for earlier_vote in earlier):
            again = (
                f"{ballot.approver!r} already voted on this approval; a quorum of {required} "
                "needs distinct approvers"
            )
            return Decision(False, IntentState.AWAITING_DECISION, again, None), 0
        if ballot.approved:
            agreeing = [
                earlier_vote.approver
                for earlier_vote in earlier
                if earlier_vote.approved
                and earlier_vote.edited_args_json == ballot.edited_args_json
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
                    voter,
                    len(earlier),
                    recorded.SerializeToString(),
                    ballot.decided_at_ms,
                ),
            )
            counted = (
                f"vote recorded: {len(decision.approvers)} of {required} approvals "
                f"({', '.join(decision.approvers)}); waiting for more"
            )
            return Decision(True, IntentState.AWAITING_DECISION, counted, None), 0
        tx.execute("DELETE FROM effector_approval_votes WHERE intent_id = ?", (intent_id,))
        return self._apply_decision(tx, intent_id, decision)

    def _apply_decision(
        self, tx: sql.Tx, intent_id: str, approval: Approval
    ) -> tuple[Decision, int]:
        """Record ``approval`` on an undecided approval intent (EXPIRED if past its deadline)."""
        now_ms = approval.decided_at_ms
        row = tx.execute(
            "SELECT intent, state, deadline_ms, outcome FROM effector_intents WHERE intent_id = ?"
            + self._dialect.for_update,
            (intent_id,),
        ).fetchone()
        if row is None:
            return Decision(False, IntentState.INTENT_STATE_UNSPECIFIED, "unknown intent", None), 0
        intent = ToolIntent.FromString(bytes(row[0]))
        state, deadline_ms, result = row[1], row[2], sql.outcome_result(row[3], intent)
        if intent.kind != ToolIntent.APPROVAL:
            return Decision(False, state, "not an approval intent", result), 0
        if state == sql.WITHDRAWN:
            why = "" if result is None else f" ({result.error_message})"
            withdrawn = (
                f"withdrawn: the run that asked for this approval no longer waits for it{why}; "
                "the decision is not recorded and the gated tool will not run"
            )
            return Decision(False, state, withdrawn, result), 0
        if state == sql.DONE:
            assert result is not None
            expired = result.status == ToolResult.EXPIRED
            return Decision(
                False, state, "already expired" if expired else "already decided", result
            ), 0
        expired = bool(deadline_ms and now_ms > deadline_ms)
        if expired:
            result = expired_result(intent, now_ms=now_ms, attempts=0)
            envelope, applied, reason = (
                result_envelope(result),
                False,
                "expired before the decision",
            )
        else:
            result = decision_result(intent, approval)
            envelope, applied, reason = approval_envelope(approval, intent.entity_key), True, ""
        published = _finish(tx, intent_id, result, envelope, now_ms, sql.AWAITING)
        if published is not None and intent.policy_gate_for:
            # The run waits for the gated intent, not for this approval: publish its outcome.
            gated = self._release_gated(tx, intent, None if expired else approval, now_ms)
            published = None if gated is None else gated[1]
        offsets = sql.append(tx, [] if published is None else [published], now_ms)
        refused = intent if published is not None and not applied else None
        return Decision(applied, sql.DONE, reason, result, refused), sql.head_after(offsets)

    def _release_gated(
        self, tx: sql.Tx, gate: ToolIntent, approval: Approval | None, now_ms: int
    ) -> tuple[ToolIntent, bytes | None] | None:
        """Settle the TOOL intent a policy's approval ``gate`` held, once the gate is decided.

        Approved, it joins its key's queue (with the approver's edited arguments, if any);
        denied or expired (``approval`` ``None``), it gets a published REJECTED or EXPIRED result.
        Returns the gated intent and the envelope to publish; ``None`` if it is no longer held
        (withdrawn meanwhile).
        """
        if gate.intent_id != gate_id_for(gate.policy_gate_for):
            return None  # not an approval this effector opened (clients cannot set the link)
        row = tx.execute(
            "SELECT intent FROM effector_intents WHERE intent_id = ? AND entity_key = ?"
            " AND state = ?" + self._dialect.for_update,
            (gate.policy_gate_for, gate.entity_key, sql.AWAITING),
        ).fetchone()
        if row is None:
            return None
        gated = ToolIntent.FromString(bytes(row[0]))
        key = gated.entity_key
        published: bytes | None = None
        if approval is not None and approval.approved:
            if approval.edited_args_json:
                gated.edited_from.CopyFrom(
                    ApprovalEdit(
                        approval_intent_id=gate.intent_id,
                        edited_by=approval.approver,
                        diff_json=args_diff(gated.args_json, approval.edited_args_json),
                    )
                )
                gated.args_json = approval.edited_args_json
            tx.execute(
                "UPDATE effector_intents SET state = ?, intent = ? WHERE intent_id = ?",
                (sql.PENDING, gated.SerializeToString(deterministic=True), gated.intent_id),
            )
        else:
            if approval is None:
                result = expired_result(gated, now_ms=now_ms, attempts=0)
            else:
                result = rejected_result(gated, gate_refusal(gate, approval), now_ms=now_ms)
            published = _finish(
                tx, gated.intent_id, result, result_envelope(result), now_ms, sql.AWAITING
            )
        self._claims.queued(tx, [key], now_ms)
        self._claims.settled(tx, [key])
        return gated, published

    async def approval_votes(self, intent_id: str) -> list[Approval]:
        """The votes recorded so far on an approval gathering its quorum, in voting order."""
        return await self._run(lambda tx: _votes(tx, intent_id), write=False)

    # -- compensations ------------------------------------------------------------------------

    async def settle_compensation(self, claim: Claim, now_ms: int) -> CompensationSettlement:
        """Decide a claimed compensating intent (:func:`verdict`), atomically, its key locked.

        An unknown original is noted so that it is refused at Submit if it arrives.
        """
        settled, head = await self._run(lambda tx: self._settle(tx, claim, now_ms))
        self._announce(head)
        return settled

    def _settle(self, tx: sql.Tx, claim: Claim, now_ms: int) -> tuple[CompensationSettlement, int]:
        compensation = claim.intent
        target = compensation.compensates_intent_id
        if not self._holds_of(tx, [claim]):
            return CompensationSettlement(execute=False), 0
        envelopes: list[bytes] = []
        original = self._get_intent(tx, target)
        refused_original = None
        if original is not None and arrived_late(original, compensation):
            refusal = rejected_result(
                original.intent, late_original_reason(compensation.intent_id), now_ms=now_ms
            )
            published = _finish(tx, target, refusal, result_envelope(refusal), now_ms, sql.PENDING)
            if published is not None:
                envelopes.append(published)
                refused_original = original.intent
            original = self._get_intent(tx, target)
        row = tx.execute(
            """SELECT compensation_intent_id FROM effector_compensations
               WHERE original_intent_id = ?""",
            (target,),
        ).fetchone()
        compensated_by = None if row is None else str(row[0])
        result = verdict(
            original,
            compensation,
            now_ms=now_ms,
            attempt=claim.attempt,
            compensated_by=compensated_by,
        )
        if result is None or original is None:
            tx.execute(
                """INSERT INTO effector_compensations (original_intent_id,
                     compensation_intent_id, original_was_unknown, recorded_at_ms)
                   VALUES (?, ?, ?, ?) ON CONFLICT (original_intent_id) DO NOTHING""",
                (target, compensation.intent_id, int(original is None), now_ms),
            )
        head = sql.head_after(sql.append(tx, envelopes, now_ms))
        if result is None:
            return CompensationSettlement(execute=True, refused_original=refused_original), head
        [recorded], completed_head = self._record_completions(
            tx, [Completion(claim, result)], now_ms
        )
        settlement = CompensationSettlement(False, result, recorded, refused_original)
        return settlement, max(head, completed_head)

    # -- the envelope log and the intents' reads ----------------------------------------------

    async def publish(self, envelopes: Sequence[AgentEnvelope], now_ms: int) -> list[int]:
        """Append external envelopes to the log; returns their offsets in order."""
        serialized = [envelope.SerializeToString() for envelope in envelopes]
        offsets = await self._run(lambda tx: sql.append(tx, serialized, now_ms))
        self._announce(sql.head_after(offsets))
        return offsets

    async def read(
        self, from_offset: int, max_records: int, max_bytes: int | None = None
    ) -> list[LogRecord]:
        """Envelopes with offset ``>= from_offset``, in offset order, at most ``max_records``.

        With ``max_bytes``, also at most that many bytes of serialized envelopes, except that the
        first envelope available is always returned, however large: a reader always progresses.
        """

        def read_log(tx: sql.Tx) -> list[LogRecord]:
            last: int | None = None
            if max_bytes is not None:
                total = 0
                for offset, size in tx.execute(
                    """SELECT log_offset, size_bytes FROM effector_envelopes
                       WHERE log_offset >= ? ORDER BY log_offset LIMIT ?""",
                    (from_offset, max_records),
                ).fetchall():
                    total += int(size)
                    if last is not None and total > max_bytes:
                        break
                    last = int(offset)
                if last is None:
                    return []
            bound, params = ("", ()) if last is None else (" AND log_offset <= ?", (last,))
            rows = tx.execute(
                f"""SELECT log_offset, envelope FROM effector_envelopes
                    WHERE log_offset >= ?{bound} ORDER BY log_offset LIMIT ?""",
                (from_offset, *params, max_records),
            ).fetchall()
            return [
                LogRecord(int(offset), AgentEnvelope.FromString(bytes(blob)))
                for offset, blob in rows
            ]

        return await self._run(read_log, write=False)

    async def wait_for_offset(self, offset: int, timeout_s: float) -> None:
        """Return once the log's head reaches ``offset`` or ``timeout_s`` has passed."""
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
                    self._announce(await self._run(sql.read_head, write=False))

    async def get_intent(self, intent_id: str) -> IntentRecord | None:
        """Everything recorded about one intent, or ``None`` if it is unknown."""
        return await self._run(lambda tx: self._get_intent(tx, intent_id), write=False)

    def _get_intent(self, tx: sql.Tx, intent_id: str) -> IntentRecord | None:
        row = tx.execute(
            f"SELECT {RECORD_COLUMNS} FROM effector_intents WHERE intent_id = ?", (intent_id,)
        ).fetchone()
        return None if row is None else self._records(tx, [row])[0]

    def _records(self, tx: sql.Tx, rows: Sequence[Sequence[Any]]) -> list[IntentRecord]:
        """The records of rows holding :data:`RECORD_COLUMNS`, each as its key's hold says."""
        records = [intent_record(row) for row in rows]
        keys = sorted({r.intent.entity_key for r in records if r.completed_at_ms is None})
        if not keys:
            return records
        holds = self._claims.holds(tx, keys)
        return [held_record(record, holds.get(record.intent.entity_key)) for record in records]

    def _running(self, tx: sql.Tx) -> dict[str, IntentState]:
        """The RUNNING intents, each with the state its row records (PENDING or IN_DOUBT)."""
        holds = {hold.intent_id: hold for hold in self._claims.held(tx)}
        running: dict[str, IntentState] = {}
        for chunk in sql.chunks(sorted(holds)):
            for intent_id, state, retry_at_ms in tx.execute(
                f"""SELECT intent_id, state, retry_at_ms FROM effector_intents
                    WHERE intent_id IN ({sql.marks(len(chunk))}) AND {sql.OPEN}""",
                chunk,
            ).fetchall():
                if not _waits_out_doubt(state, retry_at_ms, holds[intent_id]):
                    running[intent_id] = state
        return running

    def _running_records(self, tx: sql.Tx) -> list[Any]:
        """The rows (:data:`RECORD_COLUMNS`, then the id) of the RUNNING intents."""
        ids = sorted(self._running(tx))
        return [
            row
            for chunk in sql.chunks(ids)
            for row in tx.execute(
                f"""SELECT {RECORD_COLUMNS}, intent_id FROM effector_intents
                    WHERE intent_id IN ({sql.marks(len(chunk))})""",
                chunk,
            ).fetchall()
        ]

    async def list_intents(self, state: IntentState, limit: int) -> list[ToolIntent]:
        """At most ``limit`` intents in ``state``, oldest first (by first receipt, then id)."""

        def listed(tx: sql.Tx) -> list[ToolIntent]:
            if state == sql.RUNNING:
                rows = sorted(self._running_records(tx), key=lambda row: (row[4], row[-1]))
            else:
                # RUNNING intents keep PENDING or IN_DOUBT in their rows: skip them.
                rows = tx.execute(
                    f"""SELECT {RECORD_COLUMNS}, intent_id FROM effector_intents
                        WHERE {_scope(state)} AND state = ?{_approvals_only(state)}
                        ORDER BY received_at_ms{_sorted(state)}, intent_id LIMIT ?""",
                    (state, limit + len(self._claims.held(tx))),
                ).fetchall()
            records = self._records(tx, [row[:-1] for row in rows])
            return [record.intent for record in records if record.state == state][:limit]

        return await self._run(listed, write=False)

    async def list_failed(self, limit: int) -> list[tuple[ToolIntent, ToolResult]]:
        """At most ``limit`` DONE intents whose result is not OK, each with it, oldest first."""

        def failed(tx: sql.Tx) -> list[tuple[ToolIntent, ToolResult]]:
            found: list[tuple[ToolIntent, ToolResult]] = []
            after: tuple[int, str] | None = None
            params: tuple[int, str] | tuple[()]
            while len(found) < limit:
                where, params = "", ()
                if after is not None:
                    where, params = " AND (received_at_ms, intent_id) > (?, ?)", after
                rows = tx.execute(
                    "SELECT intent, outcome, received_at_ms, intent_id FROM effector_intents"
                    f" WHERE {sql.SETTLED} AND state = ?{where}"
                    " ORDER BY received_at_ms, intent_id LIMIT ?",
                    (sql.DONE, *params, _FAILED_SCAN_BATCH),
                ).fetchall()
                for blob, outcome, _, _ in rows:
                    intent = ToolIntent.FromString(bytes(blob))
                    result = sql.outcome_result(outcome, intent)
                    if result is not None and result.status not in _SUCCEEDED:
                        found.append((intent, result))
                if len(rows) < _FAILED_SCAN_BATCH:
                    break
                after = (rows[-1][2], rows[-1][3])
            return found[:limit]

        return await self._run(failed, write=False)

    async def search_intents(
        self,
        *,
        state: IntentState | None,
        tool_name: str | None,
        entity_key: bytes | None,
        limit: int,
    ) -> list[IntentRecord]:
        """Intents matching every filter given, newest first by receipt, at most ``limit``."""
        return await self._run(
            lambda tx: self._search_intents(tx, state, tool_name, entity_key, limit), write=False
        )

    def _search_intents(
        self,
        tx: sql.Tx,
        state: IntentState | None,
        tool_name: str | None,
        entity_key: bytes | None,
        limit: int,
    ) -> list[IntentRecord]:
        """Scan the key's index with a key, else the tool's, else every intent's by receipt.

        An open state without a key is found on the open index, sorted: open intents are few.
        """
        conditions: list[tuple[str, Any]] = []
        if entity_key is not None:
            conditions.append(("entity_key = ?", entity_key))
        if tool_name is not None:
            conditions.append(("tool_name = ?", sql.text(tool_name)))
        batches: Iterable[list[Any]]
        if state == sql.RUNNING:
            running = self._running_records(tx)
            batches = [sorted(running, key=lambda row: (row[4], row[-1]), reverse=True)]
        else:
            if state is not None:
                conditions.append((f"{_scope(state)} AND state = ?", state))
            narrowed = entity_key is not None or tool_name is not None
            batches = _newest_first(tx, conditions, sort=bool(_sorted(state)) and not narrowed)
        found = (
            record
            for batch in batches
            for record in self._records(tx, [row[:-1] for row in batch])
            if (state is None or record.state == state)
            and (entity_key is None or record.intent.entity_key == entity_key)
            and (tool_name is None or sql.text(record.intent.tool_name) == sql.text(tool_name))
        )
        return list(itertools.islice(found, max(limit, 0)))

    # -- effect policies: counters and decisions ------------------------------------------------

    async def count_effects(
        self, tool: str, groups: Sequence[bytes], since_ms: int, *, exact: bool
    ) -> dict[bytes, int]:
        """TOOL intents of ``tool`` recorded since ``since_ms`` and not refused, per group.

        A group is a key (``exact``), else a key prefix (empty: every key). One transaction.
        """
        counted = f"""SELECT COUNT(*) FROM effector_intents
            WHERE tool_name = ? AND received_at_ms >= ? AND kind = {int(ToolIntent.TOOL)}
              AND refused = 0"""

        def count(tx: sql.Tx) -> dict[bytes, int]:
            found = dict.fromkeys(groups, 0)
            if exact:
                for chunk in sql.chunks(sorted(set(groups))):
                    for key, number in tx.execute(
                        f"""SELECT entity_key, COUNT(*) FROM effector_intents
                            WHERE entity_key IN ({sql.marks(len(chunk))}) AND tool_name = ?
                              AND received_at_ms >= ? AND kind = {int(ToolIntent.TOOL)}
                              AND refused = 0 GROUP BY entity_key""",
                        [*chunk, sql.text(tool), since_ms],
                    ).fetchall():
                        found[bytes(key)] = int(number)
                return found
            for group in found:
                condition, params = "", [sql.text(tool), since_ms]
                if group:
                    upper = _prefix_end(group)
                    condition = " AND entity_key >= ?" + (" AND entity_key < ?" if upper else "")
                    params += [group] if upper is None else [group, upper]
                (number,) = tx.execute(counted + condition, params).fetchone()
                found[group] = int(number)
            return found

        return await self._run(count, write=False)

    async def recorded_ids(self, intent_ids: Sequence[str]) -> set[str]:
        """Those of ``intent_ids`` that are recorded."""

        def recorded(tx: sql.Tx) -> set[str]:
            return {
                str(row[0])
                for chunk in sql.chunks(sorted(set(intent_ids)))
                for row in tx.execute(
                    f"""SELECT intent_id FROM effector_intents
                        WHERE intent_id IN ({sql.marks(len(chunk))})""",
                    chunk,
                ).fetchall()
            }

        return await self._run(recorded, write=False)

    async def policy_decisions(self, limit: int) -> list[PolicyDecision]:
        """The newest intents an effect policy rule decided (at most ``limit``), newest first."""

        def decisions(tx: sql.Tx) -> list[PolicyDecision]:
            rows = tx.execute(
                """SELECT intent_id, entity_key, tool_name, policy_rule, policy_outcome,
                     received_at_ms, state FROM effector_intents
                   WHERE policy_rule IS NOT NULL
                   ORDER BY received_at_ms DESC, intent_id DESC LIMIT ?""",
                (limit,),
            ).fetchall()
            return [
                PolicyDecision(
                    intent_id=row[0],
                    entity_key=bytes(row[1]),
                    tool_name=row[2],
                    rule=row[3],
                    outcome=row[4] or "",
                    decided_at_ms=row[5],
                    state=row[6],
                )
                for row in rows
            ]

        return await self._run(decisions, write=False)

    async def policy_rule_counts(self) -> dict[str, int]:
        """How many recorded intents each effect policy rule decided."""

        def counted(tx: sql.Tx) -> dict[str, int]:
            rows = tx.execute(
                """SELECT policy_rule, COUNT(*) FROM effector_intents
                   WHERE policy_rule IS NOT NULL GROUP BY policy_rule"""
            ).fetchall()
            return {str(rule): int(count) for rule, count in rows}

        return await self._run(counted, write=False)

    async def counts(self, *, done: bool = True) -> StoreCounts:
        """How many intents are in each state, and the head offset.

        ``done=False`` leaves DONE intents uncounted (``done`` reads 0): cheap enough to poll.
        """
        counts = await self._run(lambda tx: _counts(tx, self._running(tx), done=done), write=False)
        self._announce(counts.head_offset)
        return counts

    async def prune(self, now_ms: int, retention_ms: int) -> int:
        """Forget DONE and WITHDRAWN intents, envelopes and idle keys older than the retention."""
        return await self._run(lambda tx: _prune(tx, now_ms - retention_ms))

    # -- the console ----------------------------------------------------------------------------

    async def overview(self, now_ms: int, window_ms: int) -> Overview:
        """The figures of the console's overview page, over whole minutes up to now."""
        return await self._run(lambda tx: self._overview(tx, now_ms, window_ms), write=False)

    def _overview(self, tx: sql.Tx, now_ms: int, window_ms: int) -> Overview:
        oldest = _oldest_open(tx)
        counts = _counts(tx, self._running(tx))
        oldest_open = None if oldest is None else self._records(tx, [oldest])[0]
        return _overview(tx, counts, oldest_open, now_ms, window_ms)


# -- transaction steps shared by several verbs --------------------------------------------------


def _approvals_only(state: IntentState) -> str:
    """An inbox of AWAITING_DECISION lists approvals, not the TOOL intents they hold."""
    return f" AND kind = {int(ToolIntent.APPROVAL)}" if state == sql.AWAITING else ""


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest bytes above every bytes starting with ``prefix`` (``None``: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _sorted(state: IntentState | None) -> str:
    """``" + 0"`` for an open state: sort its few rows found on the open index, walk no other."""
    return " + 0" if state in sql.OPEN_STATES else ""


def _scope(state: IntentState) -> str:
    """The index condition that narrows a search for ``state``: open or settled intents."""
    return sql.OPEN if state in sql.OPEN_STATES else sql.SETTLED


def _initial_state(
    new: NewIntent, withdrawal: ToolIntent | None, now_ms: int
) -> tuple[IntentState, ToolResult | None]:
    """The state and result a new intent is recorded with (``withdrawal``: it came first)."""
    if new.rejection is not None:
        return sql.DONE, rejected_result(new.intent, new.rejection, now_ms=now_ms)
    if new.intent.kind in _UNPUBLISHED_KINDS:
        return sql.DONE, new_result(new.intent, ToolResult.OK, completed_at_ms=now_ms, attempt=0)
    if withdrawal is not None and withdrawal.entity_key == new.intent.entity_key:
        return sql.WITHDRAWN, withdrawn_result(new.intent, withdrawal, now_ms=now_ms)
    if new.intent.kind == ToolIntent.APPROVAL or new.gate is not None:
        return sql.AWAITING, None
    return sql.PENDING, None


def _is_withdrawal(new: NewIntent) -> bool:
    """Whether ``new`` is a WITHDRAWAL that passed intake (its target id is a canonical UUID)."""
    return new.intent.kind == ToolIntent.WITHDRAWAL and new.rejection is None


def _new_withdrawals(
    intents: Sequence[NewIntent], first_of: dict[str, int], known: dict[str, _Known]
) -> Iterator[tuple[str, ToolIntent]]:
    """Each valid WITHDRAWAL of the batch not yet recorded, with its id, in batch order."""
    for intent_id, index in first_of.items():
        new = intents[index]
        if _is_withdrawal(new) and intent_id not in known:
            yield intent_id, new.intent


def _foreign_withdrawals(
    intents: Sequence[NewIntent], first_of: dict[str, int], known: dict[str, _Known]
) -> dict[str, str]:
    """New WITHDRAWAL intents whose known target is of another key or kind, each with why."""
    refused: dict[str, str] = {}
    for intent_id, withdrawal in _new_withdrawals(intents, first_of, known):
        target_id = withdrawal.withdraws_intent_id
        target: tuple[bytes, int] | None = None
        if target_id in known:
            target = known[target_id].entity_key, known[target_id].kind
        elif target_id in first_of:
            intent = intents[first_of[target_id]].intent
            target = intent.entity_key, intent.kind
        if target is None:
            continue
        if target[0] != withdrawal.entity_key:
            refused[intent_id] = (
                f"withdraws intent {target_id}, which belongs to another entity key: a run "
                "withdraws only its own intents"
            )
        elif target[1] not in _WITHDRAWABLE:
            refused[intent_id] = (
                f"withdraws intent {target_id}, which is a withdrawal itself: only TOOL and "
                "APPROVAL intents are withdrawn"
            )
    return refused


def _withdrawals_by_target(
    intents: Sequence[NewIntent], first_of: dict[str, int], known: dict[str, _Known]
) -> dict[str, ToolIntent]:
    """The valid withdrawal of each target it names: the recorded one, else the batch's."""
    withdrawals = {
        withdrawal.withdraws_intent_id: withdrawal
        for _, withdrawal in _new_withdrawals(intents, first_of, known)
    }
    for recorded in known.values():
        if recorded.withdrawal is not None:
            withdrawals[recorded.withdrawal.withdraws_intent_id] = recorded.withdrawal
    return withdrawals


def _publish_conflicts(
    intents: Sequence[NewIntent],
    conflicts: Sequence[int],
    answers: list[SubmitResult | None],
    now_ms: int,
) -> dict[int, bytes]:
    """The REJECTED result envelope of each conflicting submission, by request index.

    Published every time a conflicting submission arrives, a repeated one included: a retried
    submit may be the only one whose answer reaches the run, and a run ignores a result it has
    already applied. A WITHDRAWAL's conflict publishes nothing (no run waits for it).
    """
    envelopes: dict[int, bytes] = {}
    for index in conflicts:
        answer = answers[index]
        refused = intents[index].intent
        assert answer is not None and answer.recorded is not None
        if refused.kind in _UNPUBLISHED_KINDS:
            continue
        result = conflict_result(refused, answer.recorded, now_ms=now_ms)
        envelopes[index] = result_envelope(result).SerializeToString()
        answers[index] = dataclasses.replace(answer, refusal=result)
    return envelopes


def _gate_row(gate: ToolIntent, now_ms: int) -> tuple[Any, ...]:
    """The row of the APPROVAL intent a policy opened (AWAITING_DECISION, as the rule said)."""
    blob = gate.SerializeToString(deterministic=True)
    return (
        gate.intent_id,
        gate.entity_key,
        gate.seq,
        gate.step_index,
        gate.kind,
        hashlib.sha256(blob).digest(),
        blob,
        sql.AWAITING,
        now_ms,
        expiry_deadline_ms(gate, now_ms),
        0,
        None,
        None,
        None,
        "",
        None,
        0,
        None,
        None,
        gate.policy_gate_for,
    )


def _insert_intents(tx: sql.Tx, rows: Sequence[Sequence[Any]]) -> set[str]:
    """Insert intent rows (in the given order) that are not recorded yet; returns their ids."""
    inserted: set[str] = set()
    for chunk in sql.chunks(rows):
        inserted.update(
            row[0]
            for row in tx.execute(
                f"""INSERT INTO effector_intents (intent_id, entity_key, seq, step_index, kind,
                    digest, intent, state, received_at_ms, deadline_ms, attempts, outcome,
                    completed_at_ms, settled_state, tool_name, withdraws_intent_id, refused,
                    policy_rule, policy_outcome, gates_intent_id)
                   VALUES {sql.row_marks(len(chunk), 20)}
                   ON CONFLICT (intent_id) DO NOTHING RETURNING intent_id""",
                sql.flatten(chunk),
            ).fetchall()
        )
    return inserted


_KNOWN_COLUMNS = f"""intent_id, digest, state, outcome, entity_key, seq, kind,
    CASE WHEN kind = {int(ToolIntent.WITHDRAWAL)} THEN intent END, retry_at_ms"""
"""What :func:`_known_intents` reads of each row (a withdrawal's intent too)."""


def _known_intents(
    tx: sql.Tx, intent_ids: Sequence[str], *, withdrawn: Sequence[str] = ()
) -> dict[str, _Known]:
    """What is recorded under ``intent_ids``, and the withdrawals naming ``withdrawn``, by id."""
    rows = [
        row
        for chunk in sql.chunks(intent_ids)
        for row in tx.execute(
            f"""SELECT {_KNOWN_COLUMNS} FROM effector_intents
                WHERE intent_id IN ({sql.marks(len(chunk))})""",
            chunk,
        ).fetchall()
    ]
    rows += [
        row
        for chunk in sql.chunks(withdrawn)
        for row in tx.execute(
            f"""SELECT {_KNOWN_COLUMNS} FROM effector_intents
                WHERE kind = 3 AND withdraws_intent_id IN ({sql.marks(len(chunk))})""",
            chunk,
        ).fetchall()
    ]
    known: dict[str, _Known] = {}
    for intent_id, digest, state, outcome, key, seq, kind, blob, retry_at_ms in rows:
        addressed = ToolIntent(intent_id=intent_id, entity_key=bytes(key), seq=int(seq))
        parsed = sql.outcome_result(outcome, addressed)
        valid = blob is not None and parsed is not None and parsed.status == ToolResult.OK
        known[intent_id] = _Known(
            bytes(digest),
            state,
            parsed,
            None if outcome is None else bytes(outcome),
            bytes(key),
            int(seq),
            kind,
            ToolIntent.FromString(bytes(blob)) if valid else None,
            retry_at_ms,
        )
    return known


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


_SETTLE = "state = ?, completed_at_ms = ?, settled_state = ?, run_ms = ? - started_at_ms"
"""The columns a result sets besides its outcome (state, completion, settled state, now)."""


def _finish(
    tx: sql.Tx,
    intent_id: str,
    result: ToolResult,
    envelope: AgentEnvelope,
    now_ms: int,
    from_state: int,
) -> bytes | None:
    """Record ``result`` and its ``envelope`` if still in ``from_state`` (first result wins)."""
    published = envelope.SerializeToString()
    recorded = tx.execute(
        f"""UPDATE effector_intents SET {_SETTLE}, outcome = ?
            WHERE intent_id = ? AND state = ?""",
        (sql.DONE, now_ms, sql.DONE, now_ms, published, intent_id, from_state),
    ).rowcount
    return published if recorded else None


def _finish_running(
    tx: sql.Tx, results: Sequence[tuple[str, ToolResult, Hold]], now_ms: int
) -> dict[str, bytes]:
    """Record results of RUNNING intents, each with its hold's attempts; envelopes by id."""
    rows = [
        (
            intent_id,
            result_envelope(result).SerializeToString(),
            hold.attempts,
            hold.started_at_ms,
        )
        for intent_id, result, hold in results
    ]
    envelopes = {row[0]: row[1] for row in rows}
    finished: dict[str, bytes] = {}
    for chunk in sql.chunks(rows):
        values = sql.row_marks(len(chunk), 4)
        for (intent_id,) in tx.execute(
            f"""WITH finished (intent_id, envelope, attempts, started_at_ms) AS (VALUES {values})
                UPDATE effector_intents SET state = ?, completed_at_ms = ?, settled_state = ?,
                  outcome = finished.envelope, attempts = finished.attempts,
                  started_at_ms = finished.started_at_ms,
                  run_ms = ? - finished.started_at_ms
                FROM finished
                WHERE effector_intents.intent_id = finished.intent_id
                  AND effector_intents.completed_at_ms IS NULL
                RETURNING effector_intents.intent_id""",
            [*sql.flatten(chunk), sql.DONE, now_ms, sql.DONE, now_ms],
        ).fetchall():
            finished[intent_id] = envelopes[intent_id]
    return finished


def held_record(record: IntentRecord, hold: Hold | None) -> IntentRecord:
    """``record`` as its key's ``hold`` has it: RUNNING while held, its attempts counted."""
    if hold is None or hold.intent_id != record.intent.intent_id or record.completed_at_ms:
        return record
    running = hold.token is not None and not _waits_out_doubt(
        record.state, record.retry_at_ms, hold
    )
    return dataclasses.replace(
        record,
        state=sql.RUNNING if running else record.state,
        attempts=max(record.attempts, hold.attempts),
        started_at_ms=hold.started_at_ms,
    )


def _waits_out_doubt(state: int, retry_at_ms: int | None, hold: Hold) -> bool:
    """Whether a held IN_DOUBT intent waits for its retry (not claimed again after it)."""
    return state == sql.IN_DOUBT and hold.started_at_ms < (retry_at_ms or 0)


def _votes(tx: sql.Tx, intent_id: str) -> list[Approval]:
    """The votes recorded on an approval still gathering its quorum, in voting order."""
    rows = tx.execute(
        "SELECT vote FROM effector_approval_votes WHERE intent_id = ? ORDER BY position",
        (intent_id,),
    ).fetchall()
    return [Approval.FromString(bytes(row[0])) for row in rows]


def _newest_first(
    tx: sql.Tx, conditions: Sequence[tuple[str, Any]], *, sort: bool = False
) -> Iterator[list[Any]]:
    """Rows of intents meeting ``conditions``, newest first by receipt, then id, in batches.

    ``sort``: the rows are open ones (few), sorted (see :func:`_sorted`), not walked in order.
    """
    after: tuple[Any, ...] = ()
    order = f"received_at_ms{' + 0' if sort else ''} DESC, intent_id DESC"
    while True:
        where = [condition for condition, _ in conditions] or ["1 = 1"]
        if after:
            where.append("(received_at_ms, intent_id) < (?, ?)")
        rows = tx.execute(
            f"SELECT {RECORD_COLUMNS}, intent_id FROM effector_intents WHERE {' AND '.join(where)}"
            f" ORDER BY {order} LIMIT ?",
            (*(value for _, value in conditions), *after, _SEARCH_SCAN_BATCH),
        ).fetchall()
        yield rows
        if len(rows) < _SEARCH_SCAN_BATCH:
            return
        after = (rows[-1][4], rows[-1][-1])


def _counts(tx: sql.Tx, running: dict[str, IntentState], *, done: bool = True) -> StoreCounts:
    """How many intents are in each state, and the log head.

    Open intents are counted by reading their rows (they are few); settled ones on the settled
    index alone.
    """
    by_state: Counter[int] = Counter()
    held = 0
    for state, kind, count in tx.execute(
        f"SELECT state, kind, COUNT(*) FROM effector_intents WHERE {sql.OPEN} GROUP BY state, kind"
    ).fetchall():
        if state == sql.AWAITING and kind == ToolIntent.TOOL:
            held += count  # a TOOL intent an effect policy holds for its approval
        else:
            by_state[state] += count
    by_state.subtract(running.values())
    by_state[sql.RUNNING] += len(running)
    if done:
        by_state.update(
            dict(
                tx.execute(
                    "SELECT settled_state, COUNT(*) FROM effector_intents"
                    f" WHERE {sql.SETTLED} GROUP BY settled_state"
                ).fetchall()
            )
        )
    return StoreCounts(
        pending=int(by_state.get(sql.PENDING, 0)),
        running=int(by_state.get(sql.RUNNING, 0)),
        awaiting_decision=int(by_state.get(sql.AWAITING, 0)),
        done=int(by_state.get(sql.DONE, 0)),
        head_offset=sql.read_head(tx),
        in_doubt=int(by_state.get(sql.IN_DOUBT, 0)),
        withdrawn=int(by_state.get(sql.WITHDRAWN, 0)),
        held=int(held),
    )


def _prune(tx: sql.Tx, cutoff: int) -> int:
    """Forget a batch of DONE intents, envelopes, idle keys, votes and compensation rows."""
    removed = sql.delete_oldest(
        tx,
        "effector_intents",
        ["intent_id"],
        "completed_at_ms",
        cutoff,
        sql.PRUNE_BATCH,
        sql.SETTLED,
    )
    removed += sql.delete_oldest(
        tx, "effector_envelopes", ["log_offset"], "appended_at_ms", cutoff, sql.PRUNE_BATCH
    )
    removed += prune_idle_keys(tx)
    # Votes on approvals no longer awaiting (expired ones); decided ones lose theirs at once.
    removed += tx.execute(
        f"""DELETE FROM effector_approval_votes WHERE recorded_at_ms < ? AND intent_id NOT IN
              (SELECT intent_id FROM effector_intents WHERE kind = 2 AND {sql.OPEN})""",
        (cutoff,),
    ).rowcount
    removed += sql.delete_oldest(
        tx, "effector_budget_leases", ["lease_id"], "expires_at_ms", cutoff, sql.PRUNE_BATCH
    )
    # A budget window goes once it has ended and nothing touched it within the retention.
    removed += tx.execute(
        """DELETE FROM effector_budget_windows WHERE (ledger, window_start_ms) IN (
             SELECT ledger, window_start_ms FROM effector_budget_windows
             WHERE window_start_ms + window_ms < ? AND updated_at_ms < ?
             ORDER BY window_start_ms LIMIT ?)""",
        (cutoff, cutoff, sql.PRUNE_BATCH),
    ).rowcount
    return removed + sql.delete_oldest(
        tx,
        "effector_compensations",
        ["original_intent_id"],
        "recorded_at_ms",
        cutoff,
        sql.PRUNE_BATCH,
    )


def _overview(
    tx: sql.Tx, counts: StoreCounts, oldest_open: IntentRecord | None, now_ms: int, window_ms: int
) -> Overview:
    """The overview's figures over whole minutes, from the one ``window_ms`` reaches into to now."""
    minutes = max(1, math.ceil(window_ms / MINUTE_MS))
    end = now_ms - now_ms % MINUTE_MS + MINUTE_MS
    start = end - minutes * MINUTE_MS

    def per_minute(figure: str, table: str, time: str, condition: str) -> list[tuple[int, int]]:
        totals = dict(
            tx.execute(
                f"""SELECT ({time} - ?) / {MINUTE_MS}, {figure} FROM {table}
                    WHERE {condition} AND {time} >= ? AND {time} < ? GROUP BY 1""",
                (start, start, end),
            ).fetchall()
        )
        return [
            (start + minute * MINUTE_MS, int(totals.get(minute, 0))) for minute in range(minutes)
        ]

    p50, p99 = _latency_percentiles(tx, start, end, (0.5, 0.99))
    return Overview(
        counts=counts,
        executions_per_minute=per_minute(
            "COUNT(*)", "effector_intents", "completed_at_ms", _EXECUTED
        ),
        errors_per_minute=per_minute("COUNT(*)", "effector_errors", "recorded_at_ms", "1 = 1"),
        tokens_per_minute=per_minute(
            "SUM(tokens)", "effector_traces", "wall_start_ms", "event_type = 2"
        ),
        tool_latency_p50_ms=p50,
        tool_latency_p99_ms=p99,
        pending_approvals=counts.awaiting_decision,
        oldest_open=oldest_open,
    )


def _latency_percentiles(
    tx: sql.Tx, start: int, end: int, quantiles: Sequence[float]
) -> list[float | None]:
    """Claim-to-result latencies of the executions completed in ``[start, end)``, interpolated."""
    executed = f"FROM effector_intents WHERE {_EXECUTED}"
    window = "AND completed_at_ms >= ? AND completed_at_ms < ?"
    (count,) = tx.execute(f"SELECT COUNT(*) {executed} {window}", (start, end)).fetchone()
    if not count:
        return [None] * len(quantiles)
    figures: list[float | None] = []
    for quantile in quantiles:
        position = quantile * (count - 1)
        below = math.floor(position)
        values = [
            int(latency)
            for (latency,) in tx.execute(
                f"""SELECT run_ms AS latency {executed} {window}
                    ORDER BY latency LIMIT 2 OFFSET ?""",
                (start, end, below),
            ).fetchall()
        ]
        above = values[-1] if position > below else values[0]
        figures.append(values[0] + (above - values[0]) * (position - below))
    return figures


def _oldest_open(tx: sql.Tx) -> Sequence[Any] | None:
    """The row of the intent not yet DONE that was received first (open ones are few: sorted)."""
    row: Sequence[Any] | None = tx.execute(
        f"""SELECT {RECORD_COLUMNS} FROM effector_intents WHERE {sql.OPEN}
            ORDER BY received_at_ms + 0, intent_id LIMIT 1"""
    ).fetchone()
    return row
