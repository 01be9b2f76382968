"""``SqlStore``: the :class:`EffectorStore` both SQL backends share, one method per operation.

Each method runs one transaction of a phase module (:mod:`~effector.store._intake`,
:mod:`~effector.store._execution`, :mod:`~effector.store._reads`,
:mod:`~effector.store._telemetry`) on the backend's executor
threads, wakes local readers once it appended envelopes, and group-commits concurrent submits.
The backend supplies the connection, the transaction boundaries and its :class:`Dialect`.
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

import effector.audit as audit
import effector.store._approvals as approvals
import effector.store._compensations as compensations
import effector.store._execution as execution
import effector.store._intake as intake
import effector.store._reads as reads
import effector.store._records as activation_records
import effector.store._telemetry as telemetry
from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    Approval,
    IntentState,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from effector.compensation import late_original_reason
from effector.group_commit import GroupCommit
from effector.store._tx import Dialect, Tx, append, head_after, read_head
from effector.store.base import (
    Claim,
    ClaimBatch,
    ClaimRequest,
    CompensationSettlement,
    Completion,
    Decision,
    EffectorStore,
    ErrorRecord,
    IntentRecord,
    KeySummary,
    LogRecord,
    NewIntent,
    Overview,
    Recorded,
    StoreCounts,
    SubmitResult,
)

_T = TypeVar("_T")


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
        *,
        claim_with_results: bool = False,
    ) -> None:
        self._dialect = dialect
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
        answers, head = await self._run(lambda tx: intake.submit(tx, intents, now_ms, redeliver))
        self._announce(head)
        split, start = [], 0
        for submission in submissions:
            split.append(answers[start : start + len(submission.intents)])
            start += len(submission.intents)
        return split

    async def claim(self, owner: str, limit: int, now_ms: int, lease_ms: int) -> ClaimBatch:
        """See :meth:`EffectorStore.claim`."""
        batch, expired, head = await self._run(
            lambda tx: execution.claim_work(tx, self._dialect, owner, limit, now_ms, lease_ms)
        )
        self._announce(head)
        audit.expired(expired)
        return batch

    async def complete(self, completions: Sequence[Completion], now_ms: int) -> list[bool]:
        """See :meth:`EffectorStore.complete`."""
        recorded, head = await self._run(
            lambda tx: execution.record_completions(tx, self._dialect, completions, now_ms)
        )
        self._announce(head)
        return recorded

    async def complete_and_claim(
        self, completions: Sequence[Completion], now_ms: int, request: ClaimRequest
    ) -> tuple[list[bool], ClaimBatch]:
        """See :meth:`EffectorStore.complete_and_claim`.

        One transaction where the backend says so (``claim_with_results``: SQLite, whose
        writes are serialized anyway, saves a commit and its fsync); otherwise (PostgreSQL)
        two, so the key rows the results lock are not held through the claim while Submits
        of the same keys wait for them.
        """
        if not self._claim_with_results:
            return await super().complete_and_claim(completions, now_ms, request)
        recorded, batch, expired, head = await self._run(
            lambda tx: execution.record_and_claim(tx, self._dialect, completions, now_ms, request)
        )
        self._announce(head)
        audit.expired(expired)
        return recorded, batch

    async def settle_compensation(self, claim: Claim, now_ms: int) -> CompensationSettlement:
        """See :meth:`EffectorStore.settle_compensation`."""
        settled, head = await self._run(
            lambda tx: compensations.settle(tx, self._dialect, claim, now_ms)
        )
        self._announce(head)
        if settled.refused_original is not None:
            reason = late_original_reason(claim.intent.intent_id)
            audit.rejected(settled.refused_original, reason)
        return settled

    async def renew(self, claims: Sequence[Claim], now_ms: int, lease_ms: int) -> set[str]:
        """See :meth:`EffectorStore.renew`."""
        return await self._run(lambda tx: execution.renew_leases(tx, claims, now_ms, lease_ms))

    async def release(self, claims: Sequence[Claim], *, started: bool = True) -> None:
        """See :meth:`EffectorStore.release`."""
        await self._run(lambda tx: execution.release_claims(tx, claims, started=started))

    async def mark_in_doubt(self, claim: Claim, reason: str, now_ms: int, retry_at_ms: int) -> bool:
        """See :meth:`EffectorStore.mark_in_doubt`."""
        return await self._run(
            lambda tx: execution.mark_in_doubt(tx, claim, reason, now_ms, retry_at_ms)
        )

    async def expire_approvals(self, now_ms: int, limit: int) -> int:
        """See :meth:`EffectorStore.expire_approvals`."""
        expired, head = await self._run(
            lambda tx: execution.expire_approvals(tx, self._dialect, now_ms, limit)
        )
        self._announce(head)
        audit.expired(expired)
        return len(expired)

    async def decide(
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
        """See :meth:`EffectorStore.decide`."""
        approval = Approval(
            intent_id=intent_id,
            approved=approved,
            approver=approver,
            decided_at_ms=now_ms,
            reason=reason,
            args_digest=args_digest,
            edited_args_json=edited_args_json,
        )
        decision, expired, head = await self._run(
            lambda tx: approvals.vote(tx, self._dialect, intent_id, approval)
        )
        self._announce(head)
        if expired is not None:
            audit.expired([expired])
        return decision

    async def approval_votes(self, intent_id: str) -> list[Approval]:
        """See :meth:`EffectorStore.approval_votes`."""
        return await self._run(lambda tx: approvals.votes(tx, intent_id), write=False)

    async def publish(self, envelopes: Sequence[AgentEnvelope], now_ms: int) -> list[int]:
        """See :meth:`EffectorStore.publish`."""
        serialized = [envelope.SerializeToString() for envelope in envelopes]
        offsets = await self._run(lambda tx: append(tx, serialized, now_ms))
        self._announce(head_after(offsets))
        return offsets

    async def read(self, from_offset: int, max_records: int) -> list[LogRecord]:
        """See :meth:`EffectorStore.read`."""
        return await self._run(lambda tx: reads.read_log(tx, from_offset, max_records), write=False)

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
                    self._announce(await self._run(read_head, write=False))

    async def get_intent(self, intent_id: str) -> IntentRecord | None:
        """See :meth:`EffectorStore.get_intent`."""
        return await self._run(lambda tx: reads.get_intent(tx, intent_id), write=False)

    async def list_intents(self, state: IntentState, limit: int) -> list[ToolIntent]:
        """See :meth:`EffectorStore.list_intents`."""
        return await self._run(lambda tx: reads.list_intents(tx, state, limit), write=False)

    async def list_failed(self, limit: int) -> list[tuple[ToolIntent, ToolResult]]:
        """See :meth:`EffectorStore.list_failed`."""
        return await self._run(lambda tx: reads.list_failed(tx, limit), write=False)

    async def counts(self, *, done: bool = True) -> StoreCounts:
        """See :meth:`EffectorStore.counts`."""
        counts = await self._run(lambda tx: reads.counts(tx, done=done), write=False)
        self._announce(counts.head_offset)
        return counts

    async def prune(self, now_ms: int, retention_ms: int) -> int:
        """See :meth:`EffectorStore.prune`."""
        return await self._run(
            lambda tx: (
                reads.prune(tx, now_ms, retention_ms)
                + approvals.prune_votes(tx, now_ms, retention_ms)
                + compensations.prune(tx, now_ms, retention_ms)
            )
        )

    async def record_traces(self, events: Sequence[TraceEvent], now_ms: int) -> Recorded:
        """See :meth:`EffectorStore.record_traces`."""
        return await self._run(lambda tx: telemetry.record_traces(tx, events, now_ms))

    async def record_errors(self, errors: Sequence[AgentError], now_ms: int) -> Recorded:
        """See :meth:`EffectorStore.record_errors`."""
        return await self._run(lambda tx: telemetry.record_errors(tx, errors, now_ms))

    async def record_activations(
        self, records: Sequence[ActivationRecord], now_ms: int
    ) -> Recorded:
        """See :meth:`EffectorStore.record_activations`."""
        return await self._run(
            lambda tx: activation_records.record_activations(tx, records, now_ms)
        )

    async def records_for_key(
        self, entity_key: bytes, max_runs: int, *, before_seq: int | None = None
    ) -> list[ActivationRecord]:
        """See :meth:`EffectorStore.records_for_key`."""
        return await self._run(
            lambda tx: activation_records.records_for_key(tx, entity_key, max_runs, before_seq),
            write=False,
        )

    async def traces_for_key(self, entity_key: bytes, max_runs: int) -> list[TraceEvent]:
        """See :meth:`EffectorStore.traces_for_key`."""
        return await self._run(
            lambda tx: telemetry.traces_for_key(tx, entity_key, max_runs), write=False
        )

    async def list_keys(self, search: bytes, limit: int) -> list[KeySummary]:
        """See :meth:`EffectorStore.list_keys`."""
        return await self._run(
            lambda tx: telemetry.list_keys(tx, self._dialect, search, limit), write=False
        )

    async def search_intents(
        self,
        *,
        state: IntentState | None,
        tool_name: str | None,
        entity_key: bytes | None,
        limit: int,
    ) -> list[IntentRecord]:
        """See :meth:`EffectorStore.search_intents`."""
        return await self._run(
            lambda tx: reads.search_intents(tx, state, tool_name, entity_key, limit), write=False
        )

    async def list_errors(self, entity_key: bytes | None, limit: int) -> list[ErrorRecord]:
        """See :meth:`EffectorStore.list_errors`."""
        return await self._run(lambda tx: telemetry.list_errors(tx, entity_key, limit), write=False)

    async def get_error(self, error_id: str) -> ErrorRecord | None:
        """See :meth:`EffectorStore.get_error`."""
        return await self._run(lambda tx: telemetry.get_error(tx, error_id), write=False)

    async def mark_redriven(self, error_id: str, now_ms: int, *, again: bool = False) -> bool:
        """See :meth:`EffectorStore.mark_redriven`."""
        return await self._run(lambda tx: telemetry.mark_redriven(tx, error_id, now_ms, again))

    async def overview(self, now_ms: int, window_ms: int) -> Overview:
        """See :meth:`EffectorStore.overview`."""
        return await self._run(lambda tx: telemetry.overview(tx, now_ms, window_ms), write=False)

    async def prune_telemetry(self, now_ms: int, retention_ms: int) -> int:
        """See :meth:`EffectorStore.prune_telemetry`; one bounded transaction per batch."""
        cutoff, removed = now_ms - retention_ms, 0
        while True:
            batch = await self._run(
                lambda tx: (
                    telemetry.prune_telemetry(tx, self._dialect, cutoff)
                    + activation_records.prune_records(tx, cutoff, telemetry.PRUNE_BATCH)
                )
            )
            removed += batch
            if batch < telemetry.PRUNE_BATCH:
                return removed
