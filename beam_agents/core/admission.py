"""Admission: which elements reach an agent, and which answers may resume a run.

:func:`element_problem` refuses malformed input elements (``.errors`` with a typed reason).
:func:`answer_refusal` holds every ``orphaned_result`` rule: a tool result or approval resumes
the key's suspended run only if it answers one of its pending intents, in time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    Approval,
    Continuation,
    ToolIntent,
    ToolResult,
)
from beam_agents.core.continuation import pending_kind, timed_out_approval
from beam_agents.core.errors import ErrorReason
from beam_agents.core.plan import error_record


def element_problem(element: Any) -> AgentError | None:
    """The ``.errors`` record for a malformed input element, or ``None`` if it is well formed."""
    if not (isinstance(element, tuple) and len(element) == 2):
        return error_record(
            b"",
            ErrorReason.MALFORMED_ELEMENT,
            f"expected a (bytes, AgentEnvelope) pair, got {type(element).__name__}",
            0,
            b"",
            0,
        )
    key, envelope = element
    if not isinstance(envelope, AgentEnvelope):
        return error_record(
            key if isinstance(key, bytes) else b"",
            ErrorReason.MALFORMED_ELEMENT,
            f"expected an AgentEnvelope value, got {type(envelope).__name__}",
            0,
            b"",
            0,
        )
    if not isinstance(key, bytes):
        reason, detail = (
            ErrorReason.MALFORMED_ELEMENT,
            f"expected a bytes key, got {type(key).__name__}",
        )
    elif not key:
        reason, detail = ErrorReason.EMPTY_KEY, "the element's key is empty"
    elif envelope.entity_key != key:
        reason, detail = (
            ErrorReason.KEY_MISMATCH,
            f"the element's key {key!r} differs from the envelope's entity_key "
            f"{envelope.entity_key!r}",
        )
    elif envelope.WhichOneof("payload") is None:
        reason, detail = (
            ErrorReason.MISSING_PAYLOAD,
            "the envelope has no external_event, tool_result or approval",
        )
    else:
        return None
    return error_record(
        key if isinstance(key, bytes) else b"",
        reason,
        detail,
        envelope.event_time_ms,
        envelope.SerializeToString(),
        0,
    )


def answer_refusal(
    key: bytes,
    suspended: Continuation | None,
    answer: ToolResult | Approval,
    processing_ms: Callable[[], int],
) -> str | None:
    """Why ``answer`` cannot resume this key's run, or ``None`` if it is admitted.

    ``processing_ms`` reads the runner's processing time; it is called only when every other
    rule has passed and the run has a deadline (past it, the timeout route decides instead).
    """
    is_approval = isinstance(answer, Approval)
    what = "approval" if is_approval else "tool result"
    intent_id = answer.intent_id
    if suspended is None:
        return (
            f"no suspended run on this key to take the {what} for intent {intent_id!r}: the "
            "key never suspended, its run already ended, or its state was cleaned up"
        )
    if isinstance(answer, ToolResult) and answer.entity_key and answer.entity_key != key:
        return f"the {what} for intent {intent_id!r} names another key, {answer.entity_key!r}"
    if intent_id in suspended.answered_intent_ids:
        if timed_out_approval(suspended, intent_id):
            return (
                f"the {what} for intent {intent_id!r} arrived after the deadline: the "
                "request timed out and was escalated"
            )
        return f"duplicate delivery: the {what} for intent {intent_id!r} was already applied"
    if intent_id not in suspended.pending_intent_ids:
        return (
            f"intent {intent_id!r} is not pending in this key's suspended run (seq {suspended.seq})"
        )
    # An approval intent may also end with a ToolResult (the effector reports it EXPIRED or
    # REJECTED), but a tool intent is never answered by an approval.
    if is_approval and pending_kind(suspended, intent_id) != ToolIntent.APPROVAL:
        return f"intent {intent_id!r} is a tool intent and cannot take an approval"
    if suspended.deadline_ms and processing_ms() >= suspended.deadline_ms:
        return (
            f"the {what} for intent {intent_id!r} arrived after the deadline "
            f"({suspended.deadline_ms} ms); the timeout route decides this run"
        )
    return None
