"""What the effector knows about intents: their rules, and what a store answers about them.

Pure: it imports nothing of the effector.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    Approval,
    IntentState,
    ToolIntent,
    ToolResult,
    canonical_json_bytes,
    edit_diff,
    submission_digest,
)

_KIND_NUMBERS = frozenset(ToolIntent.Kind.values())
INT64_MAX = 2**63 - 1
"""The largest value a SQL BIGINT (and SQLite's INTEGER) holds."""

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""``str(uuid.UUID(...))``'s spelling: what every id matching it round-trips to."""


def wall_clock_ms() -> int:
    """Read the effector's processing-time clock, in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def intent_id_problem(intent_id: str) -> str | None:
    """Why ``intent_id`` is not a canonical lowercase hyphenated UUID, or ``None`` if it is."""
    if _CANONICAL_UUID.fullmatch(intent_id):
        return None  # a tenth of the parse below, for every intent submitted
    try:
        canonical = str(uuid.UUID(intent_id))
    except ValueError:
        return f"intent_id {intent_id[:64]!r} is not a UUID"
    if canonical != intent_id:
        return f"intent_id {intent_id!r} is not in canonical form (expected {canonical!r})"
    return None


def error_id_for(error: AgentError) -> str:
    """The id of an ``.errors`` record: a SHA-256 of what a retry or replay reproduces (32 hex)."""
    stable = AgentError(
        entity_key=error.entity_key,
        seq=error.seq,
        reason=error.reason,
        event_time_ms=error.event_time_ms,
        envelope=error.envelope,
        trace_id=error.trace_id,
    )
    return hashlib.sha256(stable.SerializeToString(deterministic=True)).hexdigest()[:32]


def expiry_deadline_ms(intent: ToolIntent, first_received_at_ms: int) -> int:
    """The wall-clock instant after which the intent is expired; 0 means never.

    The TTL window is anchored at ``max(created_at_ms, first_received_at_ms)``, so replaying an
    old backlog does not mass-expire it. Clamped to ``[1, INT64_MAX]``, so any pair of times a
    client sends fits a BIGINT column (a deadline before 1 has passed already, like 1).
    """
    if intent.expires_at_ms == 0:
        return 0
    window = intent.expires_at_ms - intent.created_at_ms
    return min(max(max(intent.created_at_ms, first_received_at_ms) + window, 1), INT64_MAX)


def encodable_text(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) escaped, so a message carries it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def new_result(
    intent: ToolIntent,
    status: ToolResult.Status,
    *,
    completed_at_ms: int,
    attempt: int,
    payload: bytes = b"",
    error_message: str = "",
) -> ToolResult:
    """Build a ``ToolResult`` addressed back to ``intent``'s key and activation."""
    return ToolResult(
        intent_id=intent.intent_id,
        entity_key=intent.entity_key,
        seq=intent.seq,
        status=status,
        payload=payload,
        error_message=encodable_text(error_message),
        completed_at_ms=completed_at_ms,
        attempt=attempt,
    )


def rejected_result(intent: ToolIntent, reason: str, *, now_ms: int) -> ToolResult:
    """Build the REJECTED result of an intent that was refused without running."""
    return new_result(
        intent, ToolResult.REJECTED, completed_at_ms=now_ms, attempt=0, error_message=reason
    )


DEFAULT_RULE = "(default)"
"""The rule name recorded for an intent the policy file's ``default`` decided."""
_GATE_NAMESPACE = uuid.UUID("5b0c6f3e-29d7-4f0c-9d64-3c1c0b7e2a41")


def gate_id_for(intent_id: str) -> str:
    """The id of the approval an effect policy opens for TOOL intent ``intent_id`` (pure)."""
    return str(uuid.uuid5(_GATE_NAMESPACE, intent_id))


def gate_refusal(gate: ToolIntent, approval: Approval) -> str:
    """The REJECTED result's message of an intent whose policy approval ``approval`` denied."""
    said = f": {approval.reason}" if approval.reason else ""
    return (
        f"denied by effect policy: rule {gate.policy_rule!r} required approval on channel "
        f"{gate.channel!r}, and {approval.approver!r} denied it{said}"
    )


def args_diff(original_json: str, edited_json: str) -> str:
    """:func:`edit_diff` of two JSON objects' texts (empty if either is not an object)."""
    original, edited = json.loads(original_json or "{}"), json.loads(edited_json)
    if not isinstance(original, dict) or not isinstance(edited, dict):
        return ""
    return edit_diff(original, edited)


def expired_result(intent: ToolIntent, *, now_ms: int, attempts: int) -> ToolResult:
    """Build the EXPIRED result of an intent whose TTL ran out at the effector."""
    awaited = "decided" if intent.kind == ToolIntent.APPROVAL else "run"
    message = f"expired at the effector before it was {awaited}"
    if attempts:
        message += f"; {attempts} earlier attempt(s) were interrupted before recording a result"
    return new_result(
        intent, ToolResult.EXPIRED, completed_at_ms=now_ms, attempt=attempts, error_message=message
    )


def decision_result(intent: ToolIntent, approval: Approval) -> ToolResult:
    """The OK result stored for a decided approval; its payload records the decision."""
    decision: dict[str, object] = {
        "approved": approval.approved,
        "approver": approval.approver,
        "decided_at_ms": approval.decided_at_ms,
        "reason": approval.reason,
    }
    if approval.args_digest:
        decision["args_digest"] = approval.args_digest
    if len(approval.approvers) > 1:
        decision["approvers"] = list(approval.approvers)
    if approval.edited_args_json:
        try:
            decision["edited_args"] = json.loads(approval.edited_args_json)
        except (ValueError, RecursionError):  # the service checks it; kept as text if not
            decision["edited_args"] = approval.edited_args_json
    payload = canonical_json_bytes(decision)
    return new_result(
        intent, ToolResult.OK, completed_at_ms=approval.decided_at_ms, attempt=0, payload=payload
    )


def result_envelope(result: ToolResult) -> AgentEnvelope:
    """Wrap ``result`` in the envelope that re-injects it, stamped with its completion time."""
    return AgentEnvelope(
        entity_key=result.entity_key, event_time_ms=result.completed_at_ms, tool_result=result
    )


def approval_envelope(approval: Approval, entity_key: bytes) -> AgentEnvelope:
    """Wrap a recorded approval decision in the envelope that re-injects it."""
    return AgentEnvelope(
        entity_key=entity_key, event_time_ms=approval.decided_at_ms, approval=approval
    )


def withdrawal_reason(withdrawal: ToolIntent) -> str:
    """The reason a WITHDRAWAL intent gives (its ``args_json``), or its raw text if unreadable."""
    try:
        reason = json.loads(withdrawal.args_json).get("reason")
    except (ValueError, AttributeError, RecursionError):
        reason = None
    return reason if isinstance(reason, str) else withdrawal.args_json[:256]


def withdrawn_result(intent: ToolIntent, withdrawal: ToolIntent, *, now_ms: int) -> ToolResult:
    """The WITHDRAWN result stored (never published) for an intent its run stopped waiting for."""
    message = (
        f"withdrawn by {withdrawal.intent_id} before it started: {withdrawal_reason(withdrawal)}"
    )
    return new_result(
        intent, ToolResult.WITHDRAWN, completed_at_ms=now_ms, attempt=0, error_message=message
    )


def conflict_result(refused: ToolIntent, recorded: ToolIntent, *, now_ms: int) -> ToolResult:
    """The REJECTED result published to a submission refused as a conflict with ``recorded``."""
    differing = [
        field.name
        for field in ToolIntent.DESCRIPTOR.fields
        if getattr(refused, field.name) != getattr(recorded, field.name)
    ]
    kept = (
        f"{ToolIntent.Kind.Name(recorded.kind) if recorded.kind in _KIND_NUMBERS else 'intent'} "
        f"{recorded.tool_name[:64]!r} at seq {recorded.seq} step {recorded.step_index} of key "
        f"{recorded.entity_key[:32].hex()}"
    )
    reason = (
        f"conflict: intent {refused.intent_id} is already recorded with different content "
        f"(the kept one: {kept}; differing fields: {', '.join(differing)}); the first "
        "submission is kept and this one is refused (set AgentConfig.namespace when two agents "
        "or pipelines share an effector)"
    )
    result = rejected_result(refused, reason, now_ms=now_ms)
    result.refused_submission_digest = submission_digest(refused)
    return result


def late_original_reason(compensation_id: str) -> str:
    """Why an original compensated before it arrived is refused (recorded, published)."""
    return f"compensated by {compensation_id} before it arrived; it will not run"


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
    policy_rule: str = ""
    """The effect policy rule that decided it (empty: none did)."""
    policy_outcome: str = ""
    """What that rule decided: allow, deny or require_approval."""
    gate: ToolIntent | None = None
    """The APPROVAL intent a policy opened for it: recorded with it, it holds the intent (and
    its key's queue) AWAITING_DECISION until decided."""
    policy_reason: str = ""
    """Why the rule decided so (for the audit log; a deny's is in its rejection too)."""


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
    """Why the store recorded a new intent REJECTED itself: its compensation came first, or (a
    withdrawal) its target is of another key."""
    refusal: ToolResult | None = None
    """For a CONFLICT, the REJECTED result published to the refused submission."""


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
        """Whether an earlier claim may have started the tool: every attempt after the first."""
        return self.attempt > 1


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    """What one claim round produced: intents to execute, and the heads refused as EXPIRED."""

    claims: list[Claim]
    """The intents to execute, each the head of a key this claim now holds."""
    expired_intents: Sequence[ToolIntent] = ()
    """The heads refused as EXPIRED (and published) instead of being claimed."""

    @property
    def expired(self) -> int:
        """How many heads were refused as EXPIRED."""
        return len(self.expired_intents)


@dataclass(frozen=True, slots=True)
class Completion:
    """The result of executing a claimed intent, to be recorded and published."""

    claim: Claim
    result: ToolResult


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Whom a claim is for and how much to take."""

    owner: str
    limit: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class CompensationSettlement:
    """What settling a claimed compensation decided."""

    execute: bool
    """Run it: its original ran and it is the (first) compensation recorded for it."""
    result: ToolResult | None = None
    """The NOT_NEEDED or REJECTED result recorded instead; ``None`` if it executes, or if the
    claim no longer held its key (the key's holder settles it)."""
    recorded: bool = False
    """Whether ``result`` was recorded by this call (not by another claim first)."""
    refused_original: ToolIntent | None = None
    """Its original, if it arrived after this compensation was claimed and was refused now."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The store's answer to a decision on an approval (see ``DecideResponse``)."""

    applied: bool
    """Whether this decision (or vote) is the one recorded."""
    state: IntentState
    reason: str
    """Why it was not applied (empty when it was); a vote's count while a quorum gathers."""
    result: ToolResult | None
    expired: ToolIntent | None = None
    """The approval, if this decision found it past its deadline and recorded it EXPIRED."""


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """Everything recorded about one intent."""

    intent: ToolIntent
    state: IntentState
    result: ToolResult | None
    """The terminal result, once the intent is DONE (or WITHDRAWN: stored, never published)."""
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
    policy_rule: str = ""
    """The effect policy rule that decided it at intake (empty: none did)."""
    policy_outcome: str = ""
    """That rule's outcome: allow, deny or require_approval."""


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
    withdrawn: int = 0
    """Intents their runs stopped waiting for before they started: terminal, never run."""
    held: int = 0
    """TOOL intents an effect policy holds until its approval is decided."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One envelope of the log at its offset (offsets start at 1, in commit order)."""

    offset: int
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
