# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""A LangGraph agent in the pipeline: ``RunAgent(LangGraphAgent(build_graph))``.

The graph is plain LangGraph: a model node and a ``ToolNode``. Only three things are
beam-agents': the model is a ``BeamChatModel`` (every call goes through ``ctx.call_model``),
the tools come from ``beam_tools`` (the read-only lookup runs inline, the refund becomes an
intent the effector executes), and ``LangGraphAgent`` runs the graph, suspending while the
refund is out and re-walking the graph when its result comes back (the model turns already
taken are answered from the replay cache). The model is a scripted ``FakeLLM``.

Run it:  python examples/langgraph_agent.py   (it starts an effector of its own for the run)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from beam_agents import (
    AgentConfig,
    AgentEnvelope,
    FakeLLM,
    LlmRequest,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    ToolRegistry,
    tool,
)
from beam_agents.adapters.langgraph import BeamChatModel, LangGraphAgent, beam_tools
from beam_agents.model import ToolCall

import apache_beam as beam


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up (read-only: runs inline in the pipeline).

    Args:
        order_id: The order number.
    """
    return {"order_id": order_id, "amount_cents": 1_200, "status": "broken"}


@tool(side_effect=True)
def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order (side-effecting: only the effector runs it).

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund, in cents.
    """
    return {"refund_id": f"R-{order_id}", "amount_cents": amount_cents}


def make_registry() -> ToolRegistry:
    """The tools the model may call (``AgentConfig.tool_registry``)."""
    return ToolRegistry([lookup_order, issue_refund])


def effector_tools() -> ToolRegistry:
    """The tools the effector executes: the side-effecting one."""
    return ToolRegistry([issue_refund])


def build_graph() -> StateGraph[Any, Any, Any, Any]:
    """Model, then tools, until the model answers: the usual LangGraph tool agent."""
    tools = beam_tools(make_registry())
    model = BeamChatModel(model_id="support").bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph


def scripted(request: LlmRequest) -> tuple[str, tuple[ToolCall, ...]]:
    """The fake model: look the order up, refund it, then say so."""
    order = json.loads(request.messages[0]["content"])["order"]
    results = [m["content"] for m in request.messages if m["role"] == "tool"]
    if not results:
        return "", (ToolCall("lookup", "lookup_order", {"order_id": order}),)
    if len(results) == 1:
        amount = json.loads(results[0])["amount_cents"]
        refund = {"order_id": order, "amount_cents": amount}
        return "", (ToolCall("refund", "issue_refund", refund),)
    return f"refunded {order}: {results[1]}", ()


def make_model() -> FakeLLM:
    """The ``provider_factory``: a scripted model in its own wire shape."""
    return FakeLLM.scripted(scripted)


def make_events() -> list[AgentEnvelope]:
    """Two complaints on two keys."""
    return [
        AgentEnvelope(
            entity_key=f"customer-{n}".encode(),
            event_time_ms=1_000 + n,
            external_event=json.dumps({"order": f"A-{n}"}).encode(),
        )
        for n in (1, 2)
    ]


def run(target: str, out_dir: str) -> None:
    """Events and results from the effector -> the LangGraph agent -> intents to the effector."""
    config = AgentConfig(provider_factory=make_model, tool_registry=make_registry())
    with beam.Pipeline() as pipeline:
        events = pipeline | ReadEnvelopes(target, events=make_events(), stop_when_idle_s=1.0)
        outputs = events | RunAgent(LangGraphAgent(build_graph), config=config)
        outputs.intents | SubmitIntents(target)
        outputs.output | beam.Map(bytes.decode) | beam.io.WriteToText(f"{out_dir}/answers")


def main() -> None:
    """Start an effector, run the pipeline against it, print the answers."""
    from effector import EffectorThread  # the sidecar, in this process for the example

    with tempfile.TemporaryDirectory() as scratch:
        with EffectorThread(f"sqlite:///{scratch}/effector.db", effector_tools()) as effector:
            run(effector.address, scratch)
        paths = Path(scratch).glob("answers-*")
        for line in sorted(line for path in paths for line in path.read_text().splitlines()):
            print(f"langgraph_agent: {line}")
    print("langgraph_agent: ok")


if __name__ == "__main__":
    main()
