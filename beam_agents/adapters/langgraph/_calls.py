"""LangGraph's model and tools, answered through the running activation.

A call is keyed by its graph task and tool call id (or position), so a re-walk finds it again.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable, Coroutine, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.config import get_config
from langgraph.types import interrupt

from beam_agents._protos import canonical_json
from beam_agents.adapters.base import (
    AdapterActivation,
    AdapterUsageError,
    IntentFailedError,
    Pending,
    current_activation,
)
from beam_agents.model.client import LlmRequest, tool_message
from beam_agents.tools import Tool, ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolError

PENDING_MARKER = "beam_agents.pending_intent"
"""The key of the adapter's own ``interrupt()`` value: ``{PENDING_MARKER: intent_id}``."""

_RUN: ContextVar[GraphRun | None] = ContextVar("beam_agents_langgraph_run", default=None)
_TOOL_CALL_ID: ContextVar[str | None] = ContextVar("beam_agents_tool_call_id", default=None)
_T = TypeVar("_T")


class GraphRun:
    """One activation's LangGraph run: its ``AdapterActivation``, event loop and call counters."""

    def __init__(self, activation: AdapterActivation, loop: asyncio.AbstractEventLoop) -> None:
        self.activation = activation
        self.loop = loop
        self._counters: dict[str, int] = {}

    def restart(self) -> None:
        """Forget the call counters: the graph is invoked (or resumed) again, tasks rerun."""
        self._counters.clear()

    def call_key(self, config: RunnableConfig) -> Hashable:
        """The running call's name: its task plus its tool call id or position in the task."""
        namespace = str((config.get("configurable") or {}).get("checkpoint_ns", ""))
        call_id = _TOOL_CALL_ID.get()
        if call_id is not None:
            return ("tool_call", namespace, call_id)
        index = self._counters.get(namespace, 0)
        self._counters[namespace] = index + 1
        return ("call", namespace, index)


def current_run() -> GraphRun:
    """The running activation's :class:`GraphRun`; ``AdapterUsageError`` outside one."""
    activation = current_activation()
    run = _RUN.get()
    if run is None or run.activation is not activation:
        raise AdapterUsageError(
            "a beam_agents LangGraph tool was used outside a LangGraphAgent run; run the graph "
            "with beam_agents.adapters.langgraph.LangGraphAgent"
        )
    return run


def run_on_loop(coro: Coroutine[Any, Any, _T], what: str) -> _T:
    """Run ``coro`` on the activation's event loop from a sync node's worker thread."""
    try:
        loop = current_run().loop
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise AdapterUsageError(
                f"{what} was called synchronously on the event loop (from an async node?); "
                "await its async form instead (ainvoke), or call it from a sync def node, "
                "which LangGraph runs in a worker thread"
            )
    except BaseException:
        coro.close()
        raise
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


@contextmanager
def bound_run(run: GraphRun) -> Iterator[GraphRun]:
    """Make ``run`` the :func:`current_run` inside the ``with`` block (and its tasks)."""
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


def is_pending_marker(value: object) -> bool:
    """Whether an interrupt value is the adapter's own "an intent is pending" marker."""
    return isinstance(value, dict) and len(value) == 1 and PENDING_MARKER in value


def stage(
    tool_name: str,
    arguments: Mapping[str, Any],
    *,
    ttl_ms: int | None = None,
    tool: Tool[..., Any] | None = None,
) -> Any:
    """Stage a side effect from inside a node: its value if answered, else :class:`Pending`.

    A failed result raises :class:`IntentFailedError`. ``tool`` checks the arguments when
    ``AgentConfig.tool_registry`` lacks the tool.
    """
    run = current_run()
    return run.activation.act(
        tool_name, arguments, call_key=run.call_key(get_config()), ttl_ms=ttl_ms, tool=tool
    )


def _content(tool_name: str, value: object) -> str:
    """The tool message text: a string as it is (as LangChain tools give it), else JSON."""
    if isinstance(value, str):
        return value
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise ToolException(f"{tool_name} returned a value that is not JSON: {exc}") from None


class BeamTool(BaseTool):
    """A registry tool as a LangChain tool; a pending intent pauses the graph (``interrupt()``)."""

    beam_tool: Tool[..., Any]
    beam_schema: dict[str, Any]
    ttl_ms: int | None = None
    handle_tool_error: bool = True

    async def ainvoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the tool; a ``ToolCall`` input keys a side effect by its tool call id."""
        with _keyed_by(input):
            return await super().ainvoke(input, config, **kwargs)

    def invoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the tool from a sync node (a worker thread); keyed as :meth:`ainvoke` is."""
        with _keyed_by(input):
            return super().invoke(input, config, **kwargs)

    def _run(self, config: RunnableConfig, **kwargs: Any) -> str:
        return run_on_loop(self._arun(config, **kwargs), f"tool {self.name!r}")

    async def _arun(self, config: RunnableConfig, **kwargs: Any) -> str:
        run = current_run()
        name = self.name
        if not self.beam_tool.side_effect:
            try:
                value = await run.activation.run_tool(name, kwargs)
            except ToolArgumentError as exc:
                raise ToolException(str(exc)) from exc
            except ToolError:  # not the model's mistake: the tool is missing or misdeclared
                raise
            except Exception as exc:
                raise ToolException(f"{name} failed: {type(exc).__name__}: {exc}") from exc
            return _content(name, value)
        try:
            value = run.activation.act(
                name, kwargs, call_key=run.call_key(config), ttl_ms=self.ttl_ms, tool=self.beam_tool
            )
        except (IntentFailedError, ToolArgumentError) as exc:
            raise ToolException(str(exc)) from exc
        if isinstance(value, Pending):
            interrupt({PENDING_MARKER: value.intent_id})
            raise AdapterUsageError(
                f"the adapter's pending marker for {name!r} was resumed; only LangGraphAgent "
                "may answer it"
            )
        return _content(name, value)


def _introspected_once(method: Any) -> None:
    """Resolve ``method``'s annotations and signature once, for LangChain's per-call checks."""
    hints = typing.get_type_hints(method)
    method.__annotations__ = hints
    method.__signature__ = inspect.signature(method)
    # LangChain's per-call lookup needs only the ``RunnableConfig`` annotation.
    method.__annotations__ = {name: hint for name, hint in hints.items() if name == "config"}


for _method in (BeamTool._run, BeamTool._arun):
    _introspected_once(_method)


def beam_tools(
    tools: ToolRegistry | Iterable[Tool[..., Any]], *, ttl_ms: int | None = None
) -> list[BaseTool]:
    """LangChain tools for ``tools``, each also in ``AgentConfig.tool_registry``."""
    return [
        BeamTool(
            name=tool.name,
            description=tool.description,
            args_schema=dict(tool.schema["parameters"]),
            beam_tool=tool,
            beam_schema=dict(tool.schema),
            ttl_ms=ttl_ms,
        )
        for tool in tools
    ]


@contextmanager
def _keyed_by(tool_input: object) -> Iterator[None]:
    """While a tool runs: the tool call id its input carries, if it is a ``ToolCall``."""
    call_id = None
    if isinstance(tool_input, dict) and tool_input.get("type") == "tool_call":
        call_id = str(tool_input.get("id") or "") or None
    token = _TOOL_CALL_ID.set(call_id)
    try:
        yield
    finally:
        _TOOL_CALL_ID.reset(token)


# -- the chat model ------------------------------------------------------------------------
def _text(content: str | list[str | dict[str, Any]], kind: str) -> str:
    """A message's content as text: its text blocks joined; other blocks are refused."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            raise ValueError(
                f"BeamChatModel sends text only; a {kind} message has a "
                f"{block.get('type')!r} content block"
            )
    return "".join(parts)


def neutral_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as neutral message dicts (content, tool calls; never ids)."""
    neutral: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            neutral.append({"role": "system", "content": _text(message.content, "system")})
        elif isinstance(message, HumanMessage):
            neutral.append({"role": "user", "content": _text(message.content, "user")})
        elif isinstance(message, AIMessage):
            turn: dict[str, Any] = {
                "role": "assistant",
                "content": _text(message.content, "assistant"),
            }
            if message.tool_calls:
                turn["tool_calls"] = [
                    {"id": call["id"], "name": call["name"], "arguments": dict(call["args"])}
                    for call in message.tool_calls
                ]
            neutral.append(turn)
        elif isinstance(message, ToolMessage):
            text = _text(message.content, "tool")
            neutral.append(tool_message(message.tool_call_id, text, message.status == "error"))
        else:
            raise ValueError(
                f"BeamChatModel cannot send a {type(message).__name__}; use system, human, "
                "AI and tool messages"
            )
    return neutral


def neutral_tool(
    tool: Mapping[str, Any] | type | Callable[..., Any] | BaseTool,
) -> dict[str, Any]:
    """A tool as the neutral ``{"name", "description", "parameters"}`` schema."""
    schema = getattr(tool, "beam_schema", None)
    if isinstance(schema, dict):  # a registry tool: its own schema, exactly
        return dict(schema)
    function = convert_to_openai_tool(tool)["function"]
    return {
        "name": function["name"],
        "description": function.get("description", ""),
        "parameters": function.get("parameters", {"type": "object", "properties": {}}),
    }


class BeamChatModel(BaseChatModel):
    """A chat model that calls the pipeline's model through the running activation."""

    model_id: str
    sampling_params: dict[str, Any] | None = None

    @property
    def _llm_type(self) -> str:
        return "beam-agents"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "sampling_params": self.sampling_params}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` to the model (``tool_choice`` beyond ``"auto"`` is not supported)."""
        if tool_choice not in (None, "auto"):
            raise ValueError(
                f"BeamChatModel does not support tool_choice={tool_choice!r}; put the "
                "provider's own field in sampling_params instead"
            )
        return self.bind(tools=[neutral_tool(tool) for tool in tools], **kwargs)

    def request(
        self, messages: Sequence[BaseMessage], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> LlmRequest:
        """The ``LlmRequest`` for ``messages`` and ``tools`` (deterministic: content only)."""
        return LlmRequest(
            model_id=self.model_id,
            messages=neutral_messages(messages),
            tools_schema=[dict(tool) for tool in tools or ()],
            sampling_params=dict(self.sampling_params or {}),
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return run_on_loop(self._agenerate(messages, stop, None, **kwargs), "BeamChatModel.invoke")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if stop:
            raise ValueError("BeamChatModel does not take stop=; use sampling_params")
        activation = current_activation()
        response = await activation.call_model(self.request(messages, kwargs.get("tools")))
        usage = response.usage
        message = AIMessage(
            content=response.text,
            tool_calls=[
                {"id": call.id, "name": call.name, "args": dict(call.arguments)}
                for call in response.tool_calls
            ],
            usage_metadata=UsageMetadata(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                total_tokens=usage.total_tokens,
            ),
            response_metadata={
                "model_name": response.model or self.model_id,
                "stop_reason": response.stop_reason,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


# LangChain inspects ``_agenerate`` on every call; a cached ``__signature__`` answers at once.
BeamChatModel._agenerate.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    BeamChatModel._agenerate
)
