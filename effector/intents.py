"""What the effector knows about one intent: identity checks, expiry, and result envelopes.

Everything here is pure and shared by the server, the stores and the worker, so that the
expiry rule and the shape of every published envelope are written down exactly once.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from typing import Any

from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    Approval,
    ToolIntent,
    ToolResult,
    TraceEvent,
    canonical_json_bytes,
)

MAX_ENTITY_KEY_BYTES = 4_096
"""The longest entity key a trace event or error record may carry."""
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""``str(uuid.UUID(...))``'s spelling: what every id matching it round-trips to."""


def wall_clock_ms() -> int:
    """Read the effector's processing-time clock, in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def display_key(entity_key: bytes) -> str:
    """The key as text if it is printable UTF-8 without whitespace, else ``0x`` and its hex.

    A text key that itself starts with ``0x`` is shown in hex too, so the two never collide.
    """
    try:
        text = entity_key.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    readable = text.isprintable() and not any(c.isspace() for c in text)
    if text and readable and not text.startswith("0x"):
        return text
    return "0x" + entity_key.hex()


def serialize_intent(intent: ToolIntent) -> bytes:
    """Serialize an intent deterministically, so that equal intents store equal bytes."""
    return intent.SerializeToString(deterministic=True)


def intent_digest(serialized_intent: bytes) -> bytes:
    """Digest every field of a serialized intent, for the same-id-different-content check."""
    return hashlib.sha256(serialized_intent).digest()


def error_id_for(error: AgentError) -> str:
    """The id of an ``.errors`` record: 32 hex digits of a SHA-256 of what identifies it.

    That is its ``entity_key``, ``seq``, ``reason``, ``event_time_ms`` and ``envelope``, which
    a retried bundle or a replayed run reproduces exactly; not its ``detail`` or
    ``traceback``, which may differ between workers (paths, versions, message text).
    """
    stable = AgentError(
        entity_key=error.entity_key,
        seq=error.seq,
        reason=error.reason,
        event_time_ms=error.event_time_ms,
        envelope=error.envelope,
    )
    return hashlib.sha256(stable.SerializeToString(deterministic=True)).hexdigest()[:32]


def intent_id_problem(intent_id: str) -> str | None:
    """Why ``intent_id`` is not a usable id, or ``None`` if it is.

    An id must be a UUID in its canonical lowercase hyphenated spelling, so that one intent
    can never be recorded under two spellings of the same id.
    """
    if _CANONICAL_UUID.fullmatch(intent_id):
        return None  # a tenth of the parse below, for every intent submitted
    try:
        canonical = str(uuid.UUID(intent_id))
    except ValueError:
        return f"intent_id {intent_id[:64]!r} is not a UUID"
    if canonical != intent_id:
        return f"intent_id {intent_id!r} is not in canonical form (expected {canonical!r})"
    return None


def identity_problem(intent: ToolIntent) -> str | None:
    """Why an intent cannot even be recorded (bad id or empty key), or ``None`` if it can."""
    problem = intent_id_problem(intent.intent_id)
    if problem is None and not intent.entity_key:
        problem = f"intent {intent.intent_id} has an empty entity_key"
    return problem


def external_event_problem(envelope: AgentEnvelope) -> str | None:
    """Why ``envelope`` may not be published by a caller, or ``None`` if it may.

    Only the effector publishes tool results and approvals; a caller publishes external events,
    each addressed to a key.
    """
    if not envelope.entity_key:
        return "has an empty entity_key"
    if envelope.WhichOneof("payload") != "external_event":
        return (
            "is not an external_event: tool results and approvals are published only by the "
            "effector itself"
        )
    return None


def _entity_key_problem(entity_key: bytes) -> str | None:
    if not entity_key:
        return "has an empty entity_key"
    if len(entity_key) > MAX_ENTITY_KEY_BYTES:
        return f"has an entity_key of {len(entity_key)} bytes (at most {MAX_ENTITY_KEY_BYTES})"
    return None


def trace_event_problem(event: TraceEvent) -> str | None:
    """Why a trace event cannot be stored (its ids or key), or ``None`` if it can."""
    if not _TRACE_ID.fullmatch(event.trace_id):
        return f"has trace_id {event.trace_id[:64]!r}, not 32 lowercase hex digits"
    if not _SPAN_ID.fullmatch(event.span_id):
        return f"has span_id {event.span_id[:64]!r}, not 16 lowercase hex digits"
    return _entity_key_problem(event.entity_key)


def agent_error_problem(error: AgentError) -> str | None:
    """Why an ``.errors`` record cannot be stored (its key), or ``None`` if it can."""
    return _entity_key_problem(error.entity_key)


def activation_record_problem(record: ActivationRecord) -> str | None:
    """Why an activation record cannot be stored (its key or place), or ``None`` if it can."""
    if record.seq < 0 or record.trace_sequence < 0:
        return f"has seq {record.seq} and trace_sequence {record.trace_sequence}, not both >= 0"
    return _entity_key_problem(record.entity_key)


def parse_arguments(args_json: str) -> Any:
    """Decode ``args_json``; empty text means no arguments. Raises ``ValueError`` if not JSON."""
    if not args_json:
        return {}
    return json.loads(args_json)


def ttl_problem(intent: ToolIntent) -> str | None:
    """Why an intent's expiry fields are inconsistent, or ``None`` if they are usable."""
    if intent.expires_at_ms != 0 and intent.expires_at_ms < intent.created_at_ms:
        return (
            f"expires_at_ms ({intent.expires_at_ms}) precedes created_at_ms "
            f"({intent.created_at_ms})"
        )
    return None


def expiry_deadline_ms(intent: ToolIntent, first_received_at_ms: int) -> int:
    """Return the wall-clock instant after which the intent is expired; 0 means never.

    The intent's TTL window (``expires_at_ms - created_at_ms``, both event-time values minted
    by the pipeline) is anchored at ``max(created_at_ms, first_received_at_ms)``. Replaying a
    backlog with old event times therefore does not mass-expire it, while an intent that
    waits at the effector for longer than its TTL is refused.
    """
    if intent.expires_at_ms == 0:
        return 0
    window = intent.expires_at_ms - intent.created_at_ms
    return max(intent.created_at_ms, first_received_at_ms) + window


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
        error_message=error_message,
        completed_at_ms=completed_at_ms,
        attempt=attempt,
    )


def rejected_result(intent: ToolIntent, reason: str, *, now_ms: int) -> ToolResult:
    """Build the REJECTED result of an intent that was refused without running."""
    return new_result(
        intent, ToolResult.REJECTED, completed_at_ms=now_ms, attempt=0, error_message=reason
    )


def expired_result(intent: ToolIntent, *, now_ms: int, attempts: int) -> ToolResult:
    """Build the EXPIRED result of an intent whose TTL ran out at the effector."""
    awaited = "decided" if intent.kind == ToolIntent.APPROVAL else "run"
    message = f"expired at the effector before it was {awaited}"
    if attempts:
        message += f"; {attempts} earlier attempt(s) were interrupted before recording a result"
    return new_result(
        intent, ToolResult.EXPIRED, completed_at_ms=now_ms, attempt=attempts, error_message=message
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


def decision_result(intent: ToolIntent, approval: Approval) -> ToolResult:
    """Build the OK result stored for a decided approval; its payload records the decision.

    ``args_digest`` (what it was decided on), ``approvers`` (a quorum's) and ``edited_args``
    (approve-with-edit, as JSON) appear only when set; with the rest they rebuild the
    ``Approval`` exactly (a version 1 store's migration does).
    """
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
        decision["edited_args"] = json.loads(approval.edited_args_json)
    payload = canonical_json_bytes(decision)
    return new_result(
        intent, ToolResult.OK, completed_at_ms=approval.decided_at_ms, attempt=0, payload=payload
    )
