"""The store interface: the durable record of intents, claims, results and envelopes.

Every backend (SQLite, PostgreSQL) implements :class:`EffectorStore` and passes the same
conformance suite. Time is always passed in (``now_ms``, the effector's wall clock), so the
store itself never reads a clock and its behaviour is reproducible.
"""

from __future__ import annotations

import abc
import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass

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

_log = logging.getLogger(__name__)


class SubmitOutcome(enum.Enum):
    """What the store did with one submitted intent."""

    ACCEPTED = "accepted"
    """Recorded for the first time."""
    DUPLICATE = "duplicate"
    """Already recorded with identical content; nothing changed."""
    CONFLICT = "conflict"
    """Already recorded with different content under the same id; the first is kept."""


@dataclass(frozen=True, slots=True)
class NewIntent:
    """An intent to record; with ``rejection`` set it is recorded as DONE with a REJECTED result."""

    intent: ToolIntent
    rejection: str | None = None


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """The store's answer for one submitted intent: the outcome and the recorded intent's state."""

    outcome: SubmitOutcome
    state: IntentState
    result: ToolResult | None
    redelivered: bool = False
    """Whether the intent's published result envelope was appended to the log again."""
    recorded: ToolIntent | None = None
    """For a CONFLICT, the intent recorded under the id (the one kept), to say what differs."""
    rejection: str | None = None
    """Why the store recorded a new intent REJECTED itself: an original compensated before it
    arrived (see ``effector/compensation.py``)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A leased right to execute one intent; ``token`` identifies this claim and no other."""

    token: str
    intent: ToolIntent
    attempt: int
    deadline_ms: int = 0
    """The intent's deadline on the effector's clock (0: none), as the claim found it."""
    reconcile_failures: int = 0
    """How many times in a row its reconciler has failed (it was IN_DOUBT that often)."""

    @property
    def possibly_started(self) -> bool:
        """Whether an earlier claim may have started the tool: its effect may have happened.

        True for every attempt after the first (a crash, a lost lease or a drain cut the earlier
        one off before a result was recorded), so a reconciler is asked before executing.
        """
        return self.attempt > 1


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    """What one claim round produced: intents to execute, and how many were refused as expired."""

    claims: list[Claim]
    """The intents to execute, each the head of a key this claim now holds."""
    expired: int
    """How many heads were refused as EXPIRED (and published) instead of being claimed."""


@dataclass(frozen=True, slots=True)
class Completion:
    """The result of executing a claimed intent, to be recorded and published."""

    claim: Claim
    result: ToolResult


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Whom a claim is for and how much to take: see :meth:`EffectorStore.claim`."""

    owner: str
    limit: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class CompensationSettlement:
    """What :meth:`EffectorStore.settle_compensation` decided for a claimed compensation."""

    execute: bool
    """Run it: its original ran and it is the (first) compensation recorded for it."""
    result: ToolResult | None = None
    """The NOT_NEEDED or REJECTED result recorded instead; ``None`` if it executes, or if the
    claim no longer held its key (nothing was done: the key's holder settles it)."""
    recorded: bool = False
    """Whether ``result`` was recorded by this call (not by another claim first)."""
    refused_original: ToolIntent | None = None
    """Its original, if it arrived after this compensation was claimed and was refused now."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The store's answer to an approval decision (see ``DecideResponse``)."""

    applied: bool
    """Whether this decision is the one recorded."""
    state: IntentState
    reason: str
    """Why it was not applied (empty when it was)."""
    result: ToolResult | None


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """Everything recorded about one intent."""

    intent: ToolIntent
    state: IntentState
    result: ToolResult | None
    """The terminal result, once the intent is DONE."""
    attempts: int
    """How many times the intent has been claimed for execution."""
    received_at_ms: int = 0
    """When the effector first recorded it (its wall clock)."""
    started_at_ms: int | None = None
    """When its latest execution attempt was claimed; ``None`` if never claimed."""
    completed_at_ms: int | None = None
    """When its terminal result was recorded; ``None`` until it is DONE."""
    in_doubt_reason: str = ""
    """Why its reconciler last failed (empty if it never did); see IN_DOUBT."""
    retry_at_ms: int | None = None
    """When an IN_DOUBT intent's reconciler is asked again; ``None`` if never in doubt."""


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """How many intents are in each state, and the newest offset of the envelope log."""

    pending: int
    running: int
    awaiting_decision: int
    done: int
    head_offset: int
    in_doubt: int = 0
    """Intents whose reconciler failed: held, neither executed again nor DONE."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One envelope of the log at its offset."""

    offset: int
    """Its position: offsets start at 1 and increase by one, in commit order."""
    envelope: AgentEnvelope


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a telemetry write did: how many items were new and how many already stored."""

    recorded: int
    duplicates: int


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One stored ``.errors`` record."""

    error_id: str
    """``error_id_for`` the record: a retry or a replay of it gets the same id."""
    error: AgentError
    recorded_at_ms: int
    redriven_at_ms: int | None = None
    """When its envelope was last published back to the pipeline; ``None`` if never."""


@dataclass(frozen=True, slots=True)
class KeySummary:
    """One entity key as the console lists it."""

    entity_key: bytes
    runs: int
    """How many runs (distinct seqs) of the key have stored trace events."""
    last_seen_ms: int
    """The newest time a trace event or error of the key was recorded."""
    open_intents: int
    """Its intents not yet DONE (pending, running or awaiting a decision)."""


@dataclass(frozen=True, slots=True)
class Overview:
    """The console's overview over the window ending at ``now_ms``, minute by minute."""

    counts: StoreCounts
    executions_per_minute: list[tuple[int, int]]
    """``(minute start ms, intents completed)`` for each minute of the window, oldest first."""
    errors_per_minute: list[tuple[int, int]]
    tokens_per_minute: list[tuple[int, int]]
    """Model tokens (input plus output, from LLM_CALL spans) by span wall-clock start."""
    tool_latency_p50_ms: float | None
    """Of the tool executions completed in the window (claim to result); ``None`` if none."""
    tool_latency_p99_ms: float | None
    pending_approvals: int
    oldest_open: IntentRecord | None
    """The intent not yet DONE that was received first, if any."""


class EffectorStore(abc.ABC):
    """The durable record behind one or more effector replicas.

    Guarantees every implementation keeps:

    - one record per intent id; a second submit of the same id never creates a second record;
    - a result is recorded in the same transaction that appends its envelope to the log, so
      nothing is published that is not durable; the envelope's bytes are kept with the result,
      so a redelivery publishes exactly the same bytes again;
    - envelope offsets start at 1, increase by one, and become visible in offset order;
    - at most one live claim per entity key, and a key's intents are claimed in
      ``(seq, step_index)`` order, each only after the one before it is DONE;
    - a claim whose lease has run out may be claimed again, with the attempt count increased;
    - an IN_DOUBT intent holds its key (nothing after it in the key runs) until it is claimed
      again at its retry time, which asks its reconciler again.
    """

    @abc.abstractmethod
    async def submit(
        self, intents: Sequence[NewIntent], now_ms: int, *, redeliver_results: bool = False
    ) -> list[SubmitResult]:
        """Record new intents (deduplicated by id) and answer for each, in request order.

        With ``redeliver_results``, every DUPLICATE whose intent is already DONE appends the
        envelope that published its result to the log again, at a new offset, byte for byte.
        Envelopes a submit appends (rejections, redeliveries) are appended in request order.
        """

    @abc.abstractmethod
    async def claim(self, owner: str, limit: int, now_ms: int, lease_ms: int) -> ClaimBatch:
        """Claim up to ``limit`` runnable intents, each the head of an idle key.

        An expired head is refused instead (recorded as EXPIRED and published), never claimed.
        """

    @abc.abstractmethod
    async def complete(self, completions: Sequence[Completion], now_ms: int) -> list[bool]:
        """Record results and publish their envelopes; ``False`` where another result won."""

    async def complete_and_claim(
        self, completions: Sequence[Completion], now_ms: int, request: ClaimRequest
    ) -> tuple[list[bool], ClaimBatch]:
        """:meth:`complete`, then :meth:`claim` as ``request`` says (nothing if its limit is 0).

        The keys the results release are claimable again at once, behind every key that was
        waiting longer. A backend may do both in one transaction (one commit instead of two);
        the claims it returns start only after the results are durable either way.
        """
        recorded = await self.complete(completions, now_ms)
        if request.limit <= 0:
            return recorded, ClaimBatch([], 0)
        try:
            batch = await self.claim(request.owner, request.limit, now_ms, request.lease_ms)
        except Exception as exc:
            # The results are durable: report them; the claim loop claims once woken (and
            # meets the same failure there, backing off and logging it, if it lasts).
            _log.warning("claiming after recording results failed: %r", exc, exc_info=exc)
            return recorded, ClaimBatch([], 0)
        return recorded, batch

    @abc.abstractmethod
    async def settle_compensation(self, claim: Claim, now_ms: int) -> CompensationSettlement:
        """Decide a claimed compensating intent (``effector.compensation.verdict``), atomically.

        In one transaction holding its key: refuse its original if that arrived after it was
        claimed; execute it if the original ran and no other compensation settled it (noting
        it as the one that did); otherwise record and publish its NOT_NEEDED or REJECTED
        result, noting an unknown original so that it is refused at Submit if it arrives.
        """

    @abc.abstractmethod
    async def renew(self, claims: Sequence[Claim], now_ms: int, lease_ms: int) -> set[str]:
        """Extend the leases of ``claims``; returns the tokens that are still held."""

    @abc.abstractmethod
    async def release(self, claims: Sequence[Claim], *, started: bool = True) -> None:
        """Give claims back unfinished, so that their intents run again later.

        ``started=False`` says they never ran: their attempt is not counted.
        """

    @abc.abstractmethod
    async def mark_in_doubt(self, claim: Claim, reason: str, now_ms: int, retry_at_ms: int) -> bool:
        """Leave a claimed intent IN_DOUBT (its reconciler failed) until ``retry_at_ms``.

        The intent keeps its key: the claim's lease is set to run out at ``retry_at_ms``, when a
        claim takes the intent again. Returns ``False`` (and changes nothing) if the claim no
        longer holds the key or the intent is no longer RUNNING.
        """

    @abc.abstractmethod
    async def expire_approvals(self, now_ms: int, limit: int) -> int:
        """Refuse undecided approvals past their deadline (EXPIRED result envelopes)."""

    @abc.abstractmethod
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
        """Record a decision (or a quorum's vote) on an approval intent; publish it once decided.

        A non-empty ``args_digest`` that is not the intent's refuses the decision (stale). An
        approval needing several approvers records one vote per approver and is decided when
        enough approve the same arguments, or at the first deny (``store/_approvals.py``).
        ``edited_args_json`` (canonical, already validated) is approved in place of the asked.
        """

    @abc.abstractmethod
    async def approval_votes(self, intent_id: str) -> list[Approval]:
        """The votes recorded so far on an approval gathering its quorum, in voting order."""

    @abc.abstractmethod
    async def publish(self, envelopes: Sequence[AgentEnvelope], now_ms: int) -> list[int]:
        """Append external envelopes to the log; returns their offsets in order."""

    @abc.abstractmethod
    async def read(self, from_offset: int, max_records: int) -> list[LogRecord]:
        """Envelopes with offset ``>= from_offset``, in offset order, at most ``max_records``."""

    @abc.abstractmethod
    async def wait_for_offset(self, offset: int, timeout_s: float) -> None:
        """Return once the log's head reaches ``offset`` or ``timeout_s`` has passed."""

    @abc.abstractmethod
    async def get_intent(self, intent_id: str) -> IntentRecord | None:
        """Everything recorded about one intent, or ``None`` if it is unknown."""

    @abc.abstractmethod
    async def list_intents(self, state: IntentState, limit: int) -> list[ToolIntent]:
        """At most ``limit`` intents in ``state``, oldest first (by first receipt, then id)."""

    @abc.abstractmethod
    async def list_failed(self, limit: int) -> list[tuple[ToolIntent, ToolResult]]:
        """At most ``limit`` DONE intents whose result is not OK, each with it, oldest first."""

    @abc.abstractmethod
    async def counts(self, *, done: bool = True) -> StoreCounts:
        """How many intents are in each state, and the head offset.

        ``done=False`` does not count DONE intents (``done`` reads 0), so its cost follows the
        intents in flight, not the retained ones: for callers that poll.
        """

    @abc.abstractmethod
    async def prune(self, now_ms: int, retention_ms: int) -> int:
        """Forget DONE intents and envelopes older than the retention; returns rows removed."""

    # -- telemetry and the console -----------------------------------------------------------

    @abc.abstractmethod
    async def record_traces(self, events: Sequence[TraceEvent], now_ms: int) -> Recorded:
        """Store trace events, idempotent on ``(trace_id, span_id)``: a stored one is kept."""

    @abc.abstractmethod
    async def record_errors(self, errors: Sequence[AgentError], now_ms: int) -> Recorded:
        """Store ``.errors`` records, idempotent on their ``error_id_for`` digest."""

    @abc.abstractmethod
    async def record_activations(
        self, records: Sequence[ActivationRecord], now_ms: int
    ) -> Recorded:
        """Store activation records, idempotent on ``(entity_key, seq, trace_sequence)``."""

    @abc.abstractmethod
    async def records_for_key(
        self, entity_key: bytes, max_runs: int, *, before_seq: int | None = None
    ) -> list[ActivationRecord]:
        """The records of the key's newest ``max_runs`` runs, in commit order.

        Runs are distinct seqs; with ``before_seq``, only those below it. The records are
        ordered by seq, then ``trace_sequence``.
        """

    @abc.abstractmethod
    async def traces_for_key(self, entity_key: bytes, max_runs: int) -> list[TraceEvent]:
        """The events of the key's newest ``max_runs`` runs, by seq then sequence."""

    @abc.abstractmethod
    async def list_keys(self, search: bytes, limit: int) -> list[KeySummary]:
        """Keys containing ``search`` (all keys if empty), most recently seen first.

        A search looks through the most recently seen keys only (tens of thousands), plus the
        key equal to ``search``; keys with no stored runs, not seen within the telemetry
        retention, are forgotten.
        """

    @abc.abstractmethod
    async def search_intents(
        self,
        *,
        state: IntentState | None,
        tool_name: str | None,
        entity_key: bytes | None,
        limit: int,
    ) -> list[IntentRecord]:
        """Intents matching every filter given, newest first by receipt, at most ``limit``."""

    @abc.abstractmethod
    async def list_errors(self, entity_key: bytes | None, limit: int) -> list[ErrorRecord]:
        """Stored errors (of one key, if given), newest first, at most ``limit``."""

    @abc.abstractmethod
    async def get_error(self, error_id: str) -> ErrorRecord | None:
        """One stored error, or ``None`` if it is unknown (or pruned)."""

    @abc.abstractmethod
    async def mark_redriven(self, error_id: str, now_ms: int, *, again: bool = False) -> bool:
        """Claim an error for a re-drive of its envelope, noting ``now_ms``; whether it did.

        ``False`` if the error is unknown or, unless ``again``, was re-driven already: of two
        concurrent claims one succeeds, so its envelope is published once.
        """

    @abc.abstractmethod
    async def overview(self, now_ms: int, window_ms: int) -> Overview:
        """The figures of the console's overview page."""

    @abc.abstractmethod
    async def prune_telemetry(self, now_ms: int, retention_ms: int) -> int:
        """Forget traces, errors and activation records stored before ``now_ms - retention_ms``.

        Returns how many rows were removed.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Release every resource the store holds; the store is unusable afterwards."""
