"""``BeamChatModel``: a LangChain chat model whose every call is ``ctx.call_model``.

LangChain messages and bound tools become an ``LlmRequest`` in the neutral format
(``beam_agents/model/README.md``), built only from their content: message ids, timestamps and
metadata never reach the request, so a re-walk sends the same request and the replay cache
answers it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from beam_agents.adapters._bridge import current_bridge
from beam_agents.adapters._langgraph_tools import run_on_loop
from beam_agents.model.client import LlmRequest, LlmResponse

__all__ = ["BeamChatModel", "neutral_messages", "neutral_tool"]


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
            reply: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": message.tool_call_id,
                "content": _text(message.content, "tool"),
            }
            if message.status == "error":
                reply["is_error"] = True
            neutral.append(reply)
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


def _usage(response: LlmResponse) -> UsageMetadata:
    usage = response.usage
    return UsageMetadata(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
    )


class BeamChatModel(BaseChatModel):
    """A chat model that calls the pipeline's model through the running activation.

    ``model_id`` and ``sampling_params`` go into every ``LlmRequest``; the provider is
    ``AgentConfig.provider_factory``'s. ``ainvoke`` from async nodes; ``invoke`` from sync
    ``def`` nodes, which LangGraph runs in a worker thread (the call runs on the activation's
    event loop). A sync call on the event loop itself raises :class:`AdapterUsageError`.
    """

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
        bridge = current_bridge()
        response = await bridge.call_model(self.request(messages, kwargs.get("tools")))
        message = AIMessage(
            content=response.text,
            tool_calls=[
                {"id": call.id, "name": call.name, "args": dict(call.arguments)}
                for call in response.tool_calls
            ],
            usage_metadata=_usage(response),
            response_metadata={
                "model_name": response.model or self.model_id,
                "stop_reason": response.stop_reason,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


# LangChain asks on every call whether ``_agenerate`` takes ``run_manager``
# (``inspect.signature``); a cached ``__signature__`` answers without rebuilding it each time.
BeamChatModel._agenerate.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    BeamChatModel._agenerate
)
