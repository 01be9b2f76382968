# mypy: disallow-untyped-calls=False
"""Framework adapters: what each costs per activation beyond the framework it runs.

One conversation (two model calls, one read-only tool) runs inside ``AgentDoFn`` as the plain
``ctx`` agent and under the LangGraph, Pydantic AI and ADK adapters, and in each framework alone
with a fake model of its own and nothing of beam-agents.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import statistics
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypedDict

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest as AdkLlmRequest
from google.adk.models.llm_response import LlmResponse as AdkLlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.function_tool import FunctionTool
from google.genai import types
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.messages import ToolMessage as LangChainToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as langchain_tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from beam_agents import ActivationContext, AgentConfig, AgentEnvelope, Complete, canonical_json
from beam_agents.adapters import adk as adk_adapter
from beam_agents.adapters import langgraph as langgraph_adapter
from beam_agents.adapters.adk import AdkAgent
from beam_agents.adapters.langgraph import BeamChatModel, LangGraphAgent
from beam_agents.adapters.pydantic_ai import PydanticAIAgent
from beam_agents.core.context import AgentFn
from beam_agents.io.run_agent import AgentDoFn
from beam_agents.loop import assistant_message
from beam_agents.model.client import LlmRequest, ToolCall
from beam_agents.model.fake import FakeLLM, match_any, respond_with_fn
from beam_agents.tools import ToolRegistry, tool
from benchmarks.report import Figure, Goal, Result, Target
from tests.core.harness import InMemoryKeyState

MODEL_ID = "bench-model"
SYSTEM_PROMPT = "You look accounts up and report what you found."
FINAL_PREFIX = "DONE "
TOOL_NAME = "lookup_account"


def lookup_account(account: str) -> dict[str, Any]:
    """Look an account up (read-only).

    Args:
        account: The account id.
    """
    return {"account": account, "risk": len(account) % 7, "status": "open"}


LOOKUP = tool(lookup_account)
"""The registry's read-only tool; ADK alone gets the plain function (run inline)."""


# LangGraph and Pydantic AI alone get the tool as a coroutine function: both hand a plain
# function to a worker thread (``run_in_executor``, ``anyio.to_thread``), a hop of 60-90 µs of
# CPU that the adapters, which run the tool inline through ``ctx.run_tool``, do not make.
async def lookup_account_async(account: str) -> dict[str, Any]:
    """Look an account up (read-only).

    Args:
        account: The account id.
    """
    return lookup_account(account)


def event_payload(event_id: str) -> bytes:
    """One event's bytes."""
    return json.dumps({"account": f"acct-{event_id}", "id": event_id}, sort_keys=True).encode()


def account_of(prompt: str) -> str:
    """The account the event names."""
    return str(json.loads(prompt)["account"])


def final_text(tool_content: str) -> str:
    """The model's second answer: the final text."""
    return FINAL_PREFIX + tool_content


# -- inside beam-agents: FakeLLM, the plain agent, the three adapters ---------------------------


def _neutral_answer(request: LlmRequest) -> tuple[str, tuple[ToolCall, ...]]:
    """The script on the neutral messages: call the tool, then report its result."""
    prompt = ""
    for message in request.messages:
        if message.get("role") == "tool":
            return final_text(str(message.get("content", ""))), ()
        if message.get("role") == "user":
            prompt = str(message.get("content", ""))
    call = ToolCall(id="call-lookup", name=TOOL_NAME, arguments={"account": account_of(prompt)})
    return "", (call,)


def make_provider() -> FakeLLM:
    """The scripted model every variant inside beam-agents calls (it keeps no requests)."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        fake.requests.clear()  # a test's record, which would grow with every turn here
        text, calls = _neutral_answer(request)
        return fake.scripted_body(request, text, calls)

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def make_config() -> AgentConfig:
    """Every variant's config: the fake model and the one read-only tool."""
    return AgentConfig(provider_factory=make_provider, tool_registry=ToolRegistry([LOOKUP]))


async def plain_agent(ctx: ActivationContext) -> Complete:
    """The floor: the same two model calls and one tool call, written against ``ctx``."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": ctx.event.decode("utf-8")},
    ]
    tools = ctx.tool_registry.tools_schema
    while True:
        response = await ctx.call_model(LlmRequest(MODEL_ID, messages, tools))
        if not response.tool_calls:
            return Complete(output=response.text.encode("utf-8"))
        messages.append(assistant_message(response))
        for call in response.tool_calls:
            value = await ctx.run_tool(call.name, call.arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": canonical_json(value)}
            )


class Conversation(TypedDict):
    """The LangGraph state: the messages."""

    messages: Annotated[list[AnyMessage], add_messages]


def _graph(model: Runnable[LanguageModelInput, BaseMessage], tools: Sequence[BaseTool]) -> Any:
    """agent → tools → agent, until the model answers without a tool call."""

    async def agent(state: Conversation) -> dict[str, Any]:
        reply = await model.ainvoke([SystemMessage(content=SYSTEM_PROMPT), *state["messages"]])
        return {"messages": [reply]}

    def route(state: Conversation) -> Literal["tools", "__end__"]:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "__end__"

    graph = StateGraph(Conversation)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route)
    graph.add_edge("tools", "agent")
    return graph


def build_adapter_graph() -> Any:
    """The graph the LangGraph adapter runs: ``BeamChatModel`` and the registry's tools."""
    tools = langgraph_adapter.beam_tools(ToolRegistry([LOOKUP]))
    return _graph(BeamChatModel(model_id=MODEL_ID).bind_tools(tools), tools)


def build_adapter_pydantic_agent() -> Agent[None, str]:
    """The agent the Pydantic AI adapter runs (its model and tools come per run)."""
    return Agent(system_prompt=SYSTEM_PROMPT, output_type=str)


def build_adapter_adk_agent() -> LlmAgent:
    """The agent the ADK adapter runs."""
    return LlmAgent(
        name="lookup",
        model=MODEL_ID,
        instruction=SYSTEM_PROMPT,
        tools=adk_adapter.beam_tools(ToolRegistry([LOOKUP])),
    )


ADAPTERS: dict[str, Callable[[], AgentFn]] = {
    "plain": lambda: plain_agent,
    "langgraph": lambda: LangGraphAgent(build_adapter_graph),
    "pydantic_ai": lambda: PydanticAIAgent(build_adapter_pydantic_agent, model_id=MODEL_ID),
    "adk": lambda: AdkAgent(build_adapter_adk_agent, app_name="bench"),
}
"""Each agent run inside ``AgentDoFn``, by variant."""


# -- the frameworks alone: their own fake models, nothing of beam-agents ------------------------


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model answering the script in process (async, like the adapter's)."""

    @property
    def _llm_type(self) -> str:
        return "bench-scripted"

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` as OpenAI-style schemas, as provider chat models do."""
        return self.bind(tools=[convert_to_openai_tool(item) for item in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("async only")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt = ""
        reply: AIMessage | None = None
        for message in messages:
            if isinstance(message, LangChainToolMessage):
                reply = AIMessage(content=final_text(str(message.content)))
            elif isinstance(message, HumanMessage):
                prompt = str(message.content)
        if reply is None:
            call = {"id": "call-lookup", "name": TOOL_NAME, "args": {"account": account_of(prompt)}}
            reply = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _pydantic_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = ""
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                return ModelResponse(parts=[TextPart(final_text(part.model_response_str()))])
            if part.part_kind == "user-prompt" and isinstance(part.content, str):
                prompt = part.content
    arguments = {"account": account_of(prompt)}
    return ModelResponse(parts=[ToolCallPart(TOOL_NAME, arguments, tool_call_id="call-lookup")])


class ScriptedAdkLlm(BaseLlm):
    """An ADK model answering the script in process."""

    async def generate_content_async(
        self, llm_request: AdkLlmRequest, stream: bool = False
    ) -> AsyncGenerator[AdkLlmResponse, None]:
        """One answer: the tool call, or the final text once the tool has answered."""
        prompt = ""
        for content in llm_request.contents:
            for part in content.parts or ():
                if part.function_response is not None:
                    answer = json.dumps(part.function_response.response, sort_keys=True)
                    text = types.Part(text=final_text(answer))
                    yield AdkLlmResponse(
                        content=types.Content(role="model", parts=[text]), usage_metadata=_USAGE
                    )
                    return
                if content.role == "user" and part.text:
                    prompt = part.text
        call = types.FunctionCall(
            id="call-lookup", name=TOOL_NAME, args={"account": account_of(prompt)}
        )
        content = types.Content(role="model", parts=[types.Part(function_call=call)])
        yield AdkLlmResponse(content=content, usage_metadata=_USAGE)


_USAGE = types.GenerateContentResponseUsageMetadata(
    prompt_token_count=20, candidates_token_count=5, total_token_count=25
)
"""What the fake ADK model reports using (ADK logs a warning for every answer without it)."""


Events = Sequence[tuple[str, bytes]]
"""A batch's conversations: ``(key, event)`` pairs."""


class Alone:
    """A framework running conversations on its own, on an event loop of this object."""

    def __init__(self, converse: Callable[[str, bytes], Coroutine[Any, Any, str]]) -> None:
        self._converse = converse
        self._loop = asyncio.new_event_loop()

    def run(self, events: Events) -> list[str]:
        """Run one conversation per ``(key, event)``; their final texts."""
        return self._loop.run_until_complete(self._all(events))

    async def _all(self, events: Events) -> list[str]:
        return [await self._converse(key, event) for key, event in events]

    def close(self) -> None:
        """Close the loop."""
        self._loop.close()


def langgraph_alone() -> Alone:
    """The graph with the fake chat model and a plain LangChain tool, a thread per conversation.

    A thread's state lives in LangGraph's checkpointer (the in-memory one, written when the
    run exits, as the adapter runs it), as the adapter keeps it in the key's memory.
    """
    tools = [langchain_tool(TOOL_NAME)(lookup_account_async)]
    saver = InMemorySaver()
    graph = _graph(ScriptedChatModel().bind_tools(tools), tools).compile(checkpointer=saver)

    async def converse(key: str, event: bytes) -> str:
        state = await graph.ainvoke(
            {"messages": [HumanMessage(content=event.decode("utf-8"))]},
            {"configurable": {"thread_id": key}},
            durability="exit",
        )
        await saver.adelete_thread(key)  # as small as the adapter's saver, which holds one key
        return str(state["messages"][-1].text)

    return Alone(converse)


def pydantic_ai_alone() -> Alone:
    """An ``Agent`` on a ``FunctionModel``, the tool as ``tool_plain``."""
    agent = Agent(FunctionModel(_pydantic_answer), system_prompt=SYSTEM_PROMPT, output_type=str)
    agent.tool_plain(name=TOOL_NAME)(lookup_account_async)

    async def converse(key: str, event: bytes) -> str:
        result = await agent.run(event.decode("utf-8"))
        return result.output

    return Alone(converse)


def adk_alone() -> Alone:
    """A ``Runner`` over an ``InMemorySessionService``: a new session per conversation, deleted
    after it."""
    agent = LlmAgent(
        name="lookup",
        model=ScriptedAdkLlm(model=MODEL_ID),
        instruction=SYSTEM_PROMPT,
        tools=[FunctionTool(lookup_account)],
    )
    service = InMemorySessionService()
    runner = Runner(app_name="bench", agent=agent, session_service=service)

    async def converse(key: str, event: bytes) -> str:
        await service.create_session(app_name="bench", user_id=key, session_id=key)
        message = types.Content(role="user", parts=[types.Part(text=event.decode("utf-8"))])
        text = ""
        async for item in runner.run_async(user_id=key, session_id=key, new_message=message):
            if item.content is not None and not item.get_function_calls():
                text = "".join(part.text or "" for part in item.content.parts or ()) or text
        # As small as the adapter's, which holds one key's session at a time.
        await service.delete_session(app_name="bench", user_id=key, session_id=key)
        return text

    return Alone(converse)


ALONE: dict[str, Callable[[], Alone]] = {
    "langgraph": langgraph_alone,
    "pydantic_ai": pydantic_ai_alone,
    "adk": adk_alone,
}

FRAMEWORKS = {"langgraph": "LangGraph", "pydantic_ai": "Pydantic AI", "adk": "ADK"}
"""The frameworks, by variant, as the rows name them."""


# -- timing ---------------------------------------------------------------------------------------

ROLES = ("adapter", "alone", "plain")
ORDERS = tuple(itertools.permutations(ROLES))
"""Every order of the three roles: each follows each other equally often."""
BLOCK = 12
"""Turns per block (two of each order): a figure is the median of the blocks' means."""
_serial = itertools.count()


@dataclass
class Variant:
    """One role: ``run(prepare(key, event))`` answers a conversation and returns its final text.

    ``prepare`` builds, outside the timed part, what ``run`` takes.
    """

    prepare: Callable[[str, bytes], Any]
    run: Callable[[Any], str]
    close: Callable[[], None]


def in_dofn(agent: AgentFn) -> Variant:
    """``agent`` in a set-up ``AgentDoFn`` driven over in-memory state cells."""
    dofn = AgentDoFn(agent, make_config())
    dofn.setup()

    def prepare(key: str, event: bytes) -> tuple[InMemoryKeyState, bytes, AgentEnvelope]:
        envelope = AgentEnvelope(entity_key=key.encode(), event_time_ms=1_000, external_event=event)
        return InMemoryKeyState(), key.encode(), envelope

    def run(work: tuple[InMemoryKeyState, bytes, AgentEnvelope]) -> str:
        cells, key, envelope = work
        outputs = cells.process(dofn, key, envelope)
        return "".join(item.decode() for item in outputs if isinstance(item, bytes))

    return Variant(prepare, run, dofn.teardown)


def alone(framework: Alone) -> Variant:
    """A framework on its own."""
    return Variant(lambda *work: work, lambda work: framework.run([work])[0], framework.close)


def timed_turn(variant: Variant) -> float:
    """CPU seconds of one fresh conversation and of collecting its garbage (checked)."""
    event_id = f"e{next(_serial)}"
    event = event_payload(event_id)
    work = variant.prepare(f"key-{event_id}", event)
    started = time.process_time_ns()
    text = variant.run(work)
    gc.collect(0)
    elapsed = time.process_time_ns() - started
    if not (text.startswith(FINAL_PREFIX) and account_of(event.decode()) in text):
        raise AssertionError(f"a variant answered {text!r} to {event!r}")
    return elapsed / 1e9


def take_turns(framework: str, turns: int, warm_up: int) -> dict[str, list[float]]:
    """The adapter, the framework alone and the plain agent, conversation by conversation.

    The collector is frozen after the warm-up and off during the turns, so each turn pays for
    collecting what it allocated alone.
    """
    variants = {
        "adapter": in_dofn(ADAPTERS[framework]()),
        "alone": alone(ALONE[framework]()),
        "plain": in_dofn(ADAPTERS["plain"]()),
    }
    seconds: dict[str, list[float]] = {role: [] for role in ROLES}
    try:
        for variant in variants.values():
            for _ in range(warm_up):
                timed_turn(variant)
        gc.collect()
        gc.freeze()
        gc.disable()
        for turn in range(turns):
            for role in ORDERS[turn % len(ORDERS)]:
                seconds[role].append(timed_turn(variants[role]))
    finally:
        gc.enable()
        gc.unfreeze()
        for variant in variants.values():
            variant.close()
    return seconds


def block_means(values: Sequence[float]) -> list[float]:
    """The means of consecutive blocks of :data:`BLOCK` values."""
    return [statistics.fmean(values[at : at + BLOCK]) for at in range(0, len(values), BLOCK)]


def adapter_overhead(quick: bool) -> Result:
    """Each adapter's own work (adapter less framework alone) against the plain agent."""
    turns, warm_up = (3, 2) if quick else (360, 100)
    figures = []
    for name, label in FRAMEWORKS.items():
        blocks = {role: block_means(v) for role, v in take_turns(name, turns, warm_up).items()}
        ms = {role: 1e3 * statistics.median(values) for role, values in blocks.items()}
        pairs = zip(blocks["adapter"], blocks["alone"], strict=True)
        own = 1e3 * statistics.median(adapter - framework for adapter, framework in pairs)
        figures += [
            Figure(f"{label} adapter, per activation", "ms", ms["adapter"], ms["plain"]),
            Figure(
                f"{label} adapter's own work over the plain-ctx agent",
                "ms",
                max(own, 1e-3),  # an adapter measured cheaper than its framework shows 1 µs
                ms["plain"],
                Target(Goal.RATIO_AT_MOST, 2.0),
            ),
        ]
    return Result(
        "adapter_overhead",
        "Framework adapters: per-activation overhead against the plain ctx agent",
        """\
One conversation (two `FakeLLM` calls, one read-only tool) per activation, CPU time of
`AgentDoFn.process` on in-memory state; floor: the plain `ctx` agent doing the same calls.
Own work: the adapter less the framework alone with its own fake model, nothing of ours.
360 turns rotating adapter, framework alone and plain agent, garbage collected per turn;
medians over blocks of 12 turns.""",
        figures,
    )
