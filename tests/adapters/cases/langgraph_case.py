"""The conformance scenario as a LangGraph graph, run by ``LangGraphAgent``.

``agent`` calls the model (``BeamChatModel`` bound to the registry's tools), ``review`` asks a
person with ``interrupt()`` before ``apply_effect`` runs when the event says
``"approval": true``, and ``tools`` is LangGraph's ``ToolNode`` over ``beam_tools``. A denial
answers the call with an error tool message, so the model reports ``NOT APPLIED``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

from beam_agents.adapters.langgraph import BeamChatModel, LangGraphAgent, beam_tools
from tests.adapters.scenario import MODEL_ID, SYSTEM_PROMPT, triage_registry, user_prompt


class TriageState(TypedDict):
    """The conversation and whether the event asked for approval."""

    messages: Annotated[list[AnyMessage], add_messages]
    approval: bool


def event_input(event: bytes) -> dict[str, Any]:
    """The graph input for an event: the user prompt and the approval flag."""
    return {
        "messages": [HumanMessage(content=user_prompt(event))],
        "approval": bool(json.loads(event).get("approval")),
    }


def build_triage(*, sync: bool = False) -> Any:
    """The graph: agent -> review -> tools -> agent, until the model answers.

    ``sync=True`` makes ``agent`` a plain ``def`` node calling ``model.invoke``.
    """
    tools = beam_tools(triage_registry())
    model = BeamChatModel(model_id=MODEL_ID).bind_tools(tools)

    async def async_agent(state: TriageState) -> dict[str, Any]:
        reply = await model.ainvoke([SystemMessage(content=SYSTEM_PROMPT), *state["messages"]])
        return {"messages": [reply]}

    def sync_agent(state: TriageState) -> dict[str, Any]:
        reply = model.invoke([SystemMessage(content=SYSTEM_PROMPT), *state["messages"]])
        return {"messages": [reply]}

    def route(state: TriageState) -> Literal["review", "__end__"]:
        last = state["messages"][-1]
        return "review" if isinstance(last, AIMessage) and last.tool_calls else "__end__"

    def review(state: TriageState) -> Command[Literal["tools", "agent"]]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        effects = [call for call in last.tool_calls if call["name"] == "apply_effect"]
        if not effects or not state["approval"]:
            return Command(goto="tools")
        call = effects[0]
        decision = interrupt({"tool": call["name"], "arguments": call["args"]})
        if decision["approved"]:
            return Command(goto="tools")
        who = f"{decision['approver']}: {decision['reason']}" if decision["approver"] else "expired"
        denied = ToolMessage(
            content=f"denied by {who}", tool_call_id=str(call["id"]), status="error"
        )
        return Command(goto="agent", update={"messages": [denied]})

    graph = StateGraph(TriageState)
    graph.add_node("agent", sync_agent if sync else async_agent)
    graph.add_node("review", review)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route)
    graph.add_edge("tools", "agent")
    return graph


def build_sync_triage() -> Any:
    """:func:`build_triage` with a sync ``def agent`` node."""
    return build_triage(sync=True)


triage = LangGraphAgent(build_triage, input=event_input)
triage_agent = triage
sync_triage = LangGraphAgent(build_sync_triage, input=event_input)
