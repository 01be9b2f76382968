"""Compensation in the runtime: linking an effect to its undo, and staging the undo.

``ctx.act(tool, args, compensate_with=(undo_tool, undo_args))`` records a link
(``CompensationLink``, kept in the run's ``Continuation.compensations``); ``ctx.compensate``
(:func:`stage_compensation`) stages the linked call as a TOOL intent with
``compensates_intent_id`` set, taking a step like any intent, so its id is a pure function of
its position and a re-walk returns it again; a ``Deny(compensate=True)`` timeout route
(:func:`stage_route_compensations`) stages the undo of the run's effects, newest first. The
effector runs a compensation only if its original ran (``effector/README.md``).
"""

from __future__ import annotations

from beam_agents._protos import CompensationLink, Continuation, ToolIntent, ToolResult
from beam_agents.core.arguments import arguments_json, check_side_effect_call
from beam_agents.core.continuation import run_namespace
from beam_agents.core.cursor import ReplayCursor
from beam_agents.core.errors import CompensationError
from beam_agents.core.ids import intent_id_for
from beam_agents.core.staging import (
    STEP_KIND_OF_INTENT,
    Staged,
    compensation_link_text,
    intent_step_digest,
)
from beam_agents.core.tracing import TraceRecorder
from beam_agents.tools import ToolRegistry

NEVER_RAN = frozenset({ToolResult.EXPIRED, ToolResult.REJECTED, ToolResult.NOT_NEEDED})
"""Results of an effect that never ran: a route has nothing to undo for it."""


def check_compensate_with(
    compensate_with: object, registry: ToolRegistry, warned: set[str]
) -> tuple[str, str]:
    """``(tool_name, canonical args_json)`` of a ``compensate_with``, validated like ``act``'s.

    It must be a ``(tool_name, args)`` pair, ``args`` a JSON object (text) or a mapping. A tool
    the registry knows must be side-effecting (``ReadOnlyIntentError``) and the arguments must
    pass its validation (``ToolArgumentError``); an unknown name is refused as ``act`` refuses
    it (``ToolNotFoundError`` when the registry holds side-effecting tools).
    """
    if not isinstance(compensate_with, tuple) or len(compensate_with) != 2:
        raise TypeError(
            f"compensate_with must be a (tool_name, args) tuple, got {compensate_with!r}"
        )
    tool_name, args = compensate_with
    if not isinstance(tool_name, str) or not tool_name:
        raise ValueError(f"compensate_with needs a tool name, got {tool_name!r}")
    arguments, args_json = arguments_json(tool_name, args)
    check_side_effect_call(tool_name, arguments, registry, warned)
    return tool_name, args_json


def stage_compensation(staged: Staged, intent_id: str, high_water_step: int) -> str:
    """Stage the compensation linked to ``intent_id``, taking a step; return its id.

    A step that replays the run's record returns the id staged before. Raises
    :class:`CompensationError` for an id this run did not stage, one staged without
    ``compensate_with``, or one already compensated by an earlier step of the run; then no
    step is taken.
    """
    link = _link_of(staged, intent_id, high_water_step)
    tool_name, args_json = link.tool_name, link.args_json
    if link.compensation_intent_id:
        digest = intent_step_digest(
            ToolIntent.TOOL, tool_name, args_json, compensation_link_text(intent_id)
        )
        if not staged.cursor.would_replay(STEP_KIND_OF_INTENT[ToolIntent.TOOL], digest):
            raise CompensationError(
                f"intent {intent_id} is already compensated by intent "
                f"{link.compensation_intent_id}; a compensation is staged once per effect",
                intent_id=intent_id,
            )
    compensation_id = staged.stage_intent(
        ToolIntent.TOOL, tool_name, args_json, 0, "", compensates=intent_id
    )
    link.compensation_intent_id = compensation_id
    return compensation_id


def stage_route_compensations(suspended: Continuation, trace: TraceRecorder) -> list[ToolIntent]:
    """Stage, newest first, the compensations a ``Deny(compensate=True)`` route takes.

    One per linked effect of the run not yet compensated whose result is not known to say it
    never ran (EXPIRED, REJECTED): those that ran (OK, ERROR) and those still unanswered, which
    may yet run (the effector runs each compensation after its original, or records
    NOT_NEEDED). They take the run's next steps, at ``trace``'s event time.
    """
    outcome = {result.intent_id: result.status for result in suspended.results}
    staged = Staged(trace, ReplayCursor(suspended.next_step), namespace=run_namespace(suspended))
    for link in sorted(suspended.compensations, key=lambda link: -link.step_index):
        if link.compensation_intent_id or outcome.get(link.intent_id) in NEVER_RAN:
            continue
        staged.stage_intent(
            ToolIntent.TOOL, link.tool_name, link.args_json, 0, "", compensates=link.intent_id
        )
    return staged.intents


def _link_of(staged: Staged, intent_id: str, high_water_step: int) -> CompensationLink:
    for link in staged.links:
        if link.intent_id == intent_id:
            return link
    if not isinstance(intent_id, str):
        raise TypeError(f"compensate takes an intent id (str), got {type(intent_id).__name__}")
    trace = staged.trace
    ours = {
        intent_id_for(trace.entity_key, trace.seq, step, staged.namespace)
        for step in range(high_water_step)
    }
    if intent_id in ours:
        raise CompensationError(
            f"intent {intent_id} was staged without compensate_with, so it has no compensation; "
            "stage it with ctx.act(..., compensate_with=(tool_name, args))",
            intent_id=intent_id,
        )
    raise CompensationError(
        f"intent {intent_id} was not staged by this run (key {trace.entity_key!r}, seq "
        f"{trace.seq}); only a run's own effects can be compensated",
        intent_id=intent_id,
    )
