"""``BeamTool`` and ``beam_tools``: registry tools as ADK tools, run through the activation.

A read-only tool runs inline (``ctx.run_tool``); a side-effecting one becomes an intent
(``ctx.act``, keyed by the function call and its place in the session, so a re-run gets the
same intent back and a later call that reuses the id and arguments gets its own). While the
effector has not answered, the tool returns a placeholder and ends ADK's turn
(``skip_summarization``); the adapter then suspends, and the placeholder is never committed.
A tool may ask for ADK tool confirmation first; the adapter turns that into an approval intent.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from google.adk.agents.llm_agent import ToolUnion
from google.adk.events.event import Event
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import BaseModel

from beam_agents._protos import canonical_json
from beam_agents.adapters._adk_model import function_declaration
from beam_agents.adapters._bridge import IntentFailedError, Pending, current_bridge
from beam_agents.tools import Tool, ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolError

__all__ = ["PENDING_STATUS", "BeamTool", "ConfirmationRule", "beam_tools", "call_position"]

ConfirmationRule = bool | Callable[[str, Mapping[str, Any], ToolContext], bool]
"""Whether a call needs a person's confirmation: always, never, or per call
(``rule(tool_name, arguments, tool_context) -> bool``; ``tool_context.state`` is the session's
state, where :class:`~beam_agents.adapters.adk.AdkAgent`'s ``state`` hook puts event facts)."""

PENDING_STATUS = "beam_agents: waiting for the effector"
"""The placeholder result of a side-effecting call still in flight (never committed)."""


class BeamTool(BaseTool):
    """One registry tool as an ADK tool (declaration from ``Tool.schema``)."""

    def __init__(
        self, tool: Tool[..., Any], *, require_confirmation: ConfirmationRule = False
    ) -> None:
        schema = tool.schema
        super().__init__(name=tool.name, description=str(schema.get("description", "")))
        self.tool = tool
        self._parameters: dict[str, Any] = dict(schema.get("parameters") or {})
        self._require_confirmation = require_confirmation

    def _get_declaration(self) -> types.FunctionDeclaration:
        return function_declaration(self.name, self.description, self._parameters)

    async def check_require_confirmation(
        self, args: dict[str, Any], tool_context: ToolContext
    ) -> bool:
        """Whether this call still waits for a person (the tool's ``require_confirmation``).

        Once the decision is attached to the call it waits no more: :meth:`run_async` then
        runs it, or tells the model who denied it and why. A call whose arguments the tool
        refuses is never put to a person: :meth:`run_async` answers it with the error.
        """
        if not self._require_confirmation or tool_context.tool_confirmation is not None:
            return False  # nothing to ask, or decided already
        try:
            self.tool.validate_arguments(args)
        except ToolArgumentError:
            return False  # refused unasked by run_async
        return self._asks(args, tool_context)

    def _asks(self, args: dict[str, Any], tool_context: ToolContext) -> bool:
        """The confirmation rule's answer for this call (its arguments already checked)."""
        rule = self._require_confirmation
        if callable(rule):
            return bool(rule(self.name, args, tool_context))
        return bool(rule)

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        """Run the call through the activation; failures reach the model as ``{"error": ...}``.

        Invalid arguments, a failed or refused effect and a failing read-only tool are the
        model's to handle; any other ``ToolError`` (the tool missing from
        ``AgentConfig.tool_registry``, or registered there as the other kind) is the
        pipeline's misconfiguration and fails the activation.
        """
        bridge = current_bridge()
        confirmation = tool_context.tool_confirmation
        if self._require_confirmation and confirmation is None:
            # The gate asked nobody about arguments this tool refuses: say why, with this tool
            # (the pipeline's registered tool of the same name could still accept them).
            try:
                self.tool.validate_arguments(args)
            except ToolArgumentError as exc:
                return {"error": str(exc)}
            if self._asks(args, tool_context):
                # ADK's own gate asks before run_async; this covers a caller that does not.
                tool_context.request_confirmation(hint=f"Approve the call of {self.name}?")
                tool_context.actions.skip_summarization = True
                return {"error": f"{self.name} is waiting for a person's confirmation"}
        if confirmation is not None and not confirmation.confirmed:
            return {"error": _refusal(self.name, confirmation.payload)}
        if not self.tool.side_effect:
            return await _run_inline(self.name, args)
        try:
            value = bridge.act(
                self.name, args, call_key=_call_key(self.name, args, tool_context), tool=self.tool
            )
        except (IntentFailedError, ToolArgumentError) as exc:
            return {"error": str(exc)}
        if isinstance(value, Pending):
            tool_context.actions.skip_summarization = True
            return {"status": PENDING_STATUS, "intent_id": value.intent_id}
        return _plain(value)


def beam_tools(
    registry: ToolRegistry,
    *,
    require_confirmation: ConfirmationRule = False,
    names: Collection[str] | None = None,
) -> list[ToolUnion]:
    """The registry's tools (or those in ``names``) as ADK tools, for ``LlmAgent(tools=...)``.

    Read-only tools must also be in ``AgentConfig.tool_registry`` (they run with
    ``ctx.run_tool``); a side-effecting call's arguments are validated by ``ctx.act`` when that
    registry holds the tool, else by the tool given here.
    """
    chosen = [tool for tool in registry if names is None or tool.name in names]
    return [BeamTool(tool, require_confirmation=require_confirmation) for tool in chosen]


async def _run_inline(name: str, args: Mapping[str, Any]) -> Any:
    try:
        value = await current_bridge().run_tool(name, args)
    except ToolArgumentError as exc:
        return {"error": str(exc)}
    except ToolError:
        raise  # not the model's doing: the registry lacks the tool, or runs it as an effect
    except Exception as exc:
        # As the tool loop tells a model: an inline failure reads like an effector ERROR result.
        return {"error": f"{name} failed: {type(exc).__name__}: {exc}"}
    return _plain(value)


def _call_key(
    name: str, args: Mapping[str, Any], tool_context: ToolContext
) -> tuple[str | int, ...]:
    """The intent's key within one activation: the call's place, id, tool and arguments.

    The place (the index of the session event carrying the call) tells apart calls a provider
    gave the same id and arguments in different turns (``call_0`` in every turn, say).
    """
    call_id = tool_context.function_call_id or ""
    position = call_position(tool_context.session.events, call_id, name)
    return ("adk-call", position, call_id, name, canonical_json(dict(args)))


def call_position(events: Sequence[Event], call_id: str, name: str) -> int:
    """The index of the latest event in ``events`` calling ``name`` as ``call_id``, else -1.

    ADK appends a model turn to the session before it runs the turn's calls, and a re-run of a
    confirmed call looks back at the same event, so the index names the call within the run:
    the session's committed prefix is the same on every activation.
    """
    for index in range(len(events) - 1, -1, -1):
        for call in events[index].get_function_calls():
            if call.id == call_id and call.name == name:
                return index
    return -1


def _plain(value: Any) -> Any:
    """A tool value as ADK sends it to the model: a dict, or ``{"result": value}`` for others."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return value


def _refusal(name: str, payload: object) -> str:
    """What the model is told of a refused confirmation."""
    decision = payload if isinstance(payload, Mapping) else {}
    if decision.get("timed_out"):
        return f"{name} was denied: nobody approved it in time, so it did not run"
    approver = decision.get("approver") or "a person"
    reason = decision.get("reason")
    detail = f": {reason}" if reason else ""
    return f"{name} was denied by {approver} and did not run{detail}"
