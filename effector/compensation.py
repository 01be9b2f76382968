"""Compensation: an intent that undoes an earlier intent's effect, run only if that one ran.

A TOOL intent staged with ``ctx.act(..., compensate_with=(tool, args))`` carries its link
(``ToolIntent.compensate_tool``, ``compensate_args_json``); the compensating intent that
``ctx.compensate`` (or a ``Deny(compensate=True)`` route) stages names it in
``compensates_intent_id``, on the same key at a later step, so per-key order claims it only
once the original is DONE. :func:`intake_rejection` checks both at Submit;
:func:`verdict` decides, when a compensation is claimed, from the original's record:
execute it (the original ran: OK or ERROR), record ``NOT_NEEDED`` (it never ran: REJECTED,
EXPIRED, or itself NOT_NEEDED), or refuse it (the original is unknown, does not match, or was
compensated already by another intent). The store applies it (``settle_compensation``) in one
transaction with the key locked, and records in ``effector_compensations`` which compensation
settled each original: the one that executes, or the one refused because its original was
unknown, so that original is refused at Submit if it arrives later (it would otherwise run
with its undo already spent). See "Compensation" in ``effector/README.md``.
"""

from __future__ import annotations

from beam_agents._protos import IntentState, ToolIntent, ToolResult
from beam_agents.tools import ToolRegistry
from effector.intents import intent_id_problem, new_result, rejected_result
from effector.runner import IntentRejectedError, prepare_call, rejection_reason
from effector.store.base import IntentRecord

RAN = frozenset({ToolResult.OK, ToolResult.ERROR})
"""Results of an original that ran (or may have made part of its effect): compensate it."""


def intake_rejection(registry: ToolRegistry, intent: ToolIntent) -> str | None:
    """Why a well-identified intent must be recorded as REJECTED, or ``None`` if it is valid.

    :func:`effector.runner.rejection_reason`, plus the compensation fields: only a TOOL
    intent may carry them; a link names a side-effecting tool of this registry with valid
    arguments (an effect is refused before it runs if its undo could not); a compensating
    intent names a canonical UUID other than its own, and is not itself linked.
    """
    reason = rejection_reason(registry, intent)
    if reason is not None:
        return reason
    linked = bool(intent.compensate_tool or intent.compensate_args_json)
    compensates = intent.compensates_intent_id
    if not (linked or compensates):
        return None
    if intent.kind != ToolIntent.TOOL:
        return "only a TOOL intent may compensate or be compensated"
    if compensates:
        problem = intent_id_problem(compensates)
        if problem is not None:
            return f"compensates_intent_id: {problem}"
        if compensates == intent.intent_id:
            return "an intent cannot compensate itself"
        if linked:
            return "a compensating intent cannot itself have a compensation"
        return None
    undo = ToolIntent(tool_name=intent.compensate_tool, args_json=intent.compensate_args_json)
    try:
        prepare_call(registry, undo)
    except IntentRejectedError as exc:
        return f"its compensation cannot run: {exc}"
    return None


def verdict(
    original: IntentRecord | None,
    compensation: ToolIntent,
    *,
    now_ms: int,
    attempt: int,
    compensated_by: str | None = None,
) -> ToolResult | None:
    """What a claimed compensating intent records instead of executing; ``None``: execute it.

    ``original`` is the record of the intent it compensates (``None`` if unknown: never
    submitted, or pruned after the result retention); ``compensated_by`` the compensation
    recorded as settling it, if any. Per-key order makes the original DONE by the time its
    compensation is claimed (one that arrives later is refused first: :func:`arrived_late`).
    An unknown original stays REJECTED, not NOT_NEEDED: a pruned one may have run long ago;
    the store refuses it at Submit if it arrives after this. An original that ran is undone
    once: a compensation other than ``compensated_by`` is REJECTED without executing.
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
    if problem is None and (original.state != IntentState.DONE or original.result is None):
        state = IntentState.Name(original.state)
        problem = f"compensated intent {target} is {state}, not DONE, when its compensation ran"
    if problem is not None:
        return rejected_result(compensation, problem, now_ms=now_ms)
    assert original.result is not None
    if original.result.status in RAN:
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
    """Whether ``original`` arrived after ``compensation`` was claimed, so must be refused.

    It is queued ahead of its claimed compensation and never claimed: it was submitted after
    the compensation took the key (a late retry, a re-submitted dead letter).
    """
    return (
        original is not None
        and original.state == IntentState.PENDING
        and original.attempts == 0
        and _mismatch(original.intent, compensation) is None
    )


def late_original_reason(compensation_id: str) -> str:
    """Why an original compensated before it arrived is refused (recorded, published)."""
    return f"compensated by {compensation_id} before it arrived; it will not run"


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
