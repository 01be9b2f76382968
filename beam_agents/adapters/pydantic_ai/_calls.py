"""Pydantic AI's model and toolset, answered through the running activation."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any, TypeAlias

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import (
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettingName, ModelSettings
from pydantic_ai.tools import Tool as AgentTool
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RequestUsage
from pydantic_core import SchemaValidator, core_schema

from beam_agents.adapters.base import (
    AdapterUsageError,
    IntentFailedError,
    Pending,
    current_activation,
)
from beam_agents.model.client import LlmRequest, LlmResponse, tool_message
from beam_agents.tools import Tool, ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolError

_SAMPLING_SETTINGS: tuple[ModelSettingName, ...] = ("temperature", "top_p", "max_tokens", "seed")


class UnsupportedContentError(TypeError):
    """A message part the neutral format cannot carry (files, images, native tool parts)."""


class BeamModel(Model):
    """A Pydantic AI ``Model`` answered through the running activation's ``ctx.call_model``."""

    unsupported_settings = frozenset(
        {
            "top_k",
            "timeout",
            "max_retries",
            "parallel_tool_calls",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "stop_sequences",
            "extra_headers",
            "citations",
            "service_tier",
            "extra_body",
        }
    )

    def __init__(
        self,
        model_id: str,
        *,
        sampling_params: Mapping[str, Any] | None = None,
        settings: ModelSettings | None = None,
    ) -> None:
        if not isinstance(model_id, str) or not model_id:
            raise ValueError(f"BeamModel needs a model id, got {model_id!r}")
        super().__init__(settings=settings)
        self._beam_model_id = model_id
        self._sampling_params = dict(sampling_params or {})

    @property
    def model_name(self) -> str:
        """The ``LlmRequest.model_id`` the requests carry."""
        return self._beam_model_id

    @property
    def system(self) -> str:
        """The provider name Pydantic AI reports: the runtime's model gateway."""
        return "beam_agents"

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Send the conversation through ``ctx.call_model`` and return its answer."""
        activation = current_activation()
        model_settings, parameters = self.prepare_request(model_settings, model_request_parameters)
        request = self.llm_request(messages, model_settings, parameters)
        return self.model_response(await activation.call_model(request), request)

    def llm_request(
        self,
        messages: Sequence[ModelMessage],
        model_settings: ModelSettings | None,
        parameters: ModelRequestParameters,
    ) -> LlmRequest:
        """The neutral request for ``messages``: the same history gives the same bytes."""
        instructions = self._get_instruction_parts(messages, parameters)
        neutral: list[dict[str, Any]] = []
        text = InstructionPart.join(instructions) if instructions else None
        if text:
            neutral.append({"role": "system", "content": text})
        for message in messages:
            if isinstance(message, ModelRequest):
                neutral.extend(_request_messages(message))
            else:
                neutral.append(_assistant_message(message))
        tools = [*parameters.declared_function_tools, *parameters.output_tools]
        return LlmRequest(
            model_id=self._beam_model_id,
            messages=neutral,
            tools_schema=[_tool_schema(tool) for tool in tools],
            sampling_params=self._sampling(model_settings),
        )

    def model_response(self, response: LlmResponse, request: LlmRequest) -> ModelResponse:
        """``response`` to ``request`` as Pydantic AI's ``ModelResponse``."""
        parts: list[ModelResponsePart] = []
        if response.text:
            parts.append(TextPart(content=response.text))
        for index, call in enumerate(response.tool_calls):
            call_id = call.id or _fallback_call_id(request, index)
            parts.append(ToolCallPart(call.name, dict(call.arguments), tool_call_id=call_id))
        usage = response.usage
        return ModelResponse(
            parts=parts,
            usage=RequestUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens),
            model_name=response.model or self._beam_model_id,
            provider_name=self.system,
            provider_details={"stop_reason": response.stop_reason}
            if response.stop_reason
            else None,
        )

    def _sampling(self, model_settings: ModelSettings | None) -> dict[str, Any]:
        sampling: dict[str, Any] = {}
        settings: Mapping[str, Any] = model_settings or {}
        for name in _SAMPLING_SETTINGS:
            if settings.get(name) is not None:
                sampling[name] = settings[name]
        sampling.update(self._sampling_params)
        return sampling


def _fallback_call_id(request: LlmRequest, index: int) -> str:
    return f"call-{request.content_digest()[:16]}-{index}"


def _tool_schema(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": tool.parameters_json_schema,
    }


def _user_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    texts: list[str] = []
    for item in part.content:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, TextContent):
            texts.append(item.content)
        else:
            raise UnsupportedContentError(
                f"the beam_agents model carries text only; a user prompt holds a "
                f"{type(item).__name__}"
            )
    return "\n".join(texts)


def _request_messages(message: ModelRequest) -> list[dict[str, Any]]:
    neutral: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, SystemPromptPart):
            neutral.append({"role": "system", "content": part.content})
        elif isinstance(part, UserPromptPart):
            neutral.append({"role": "user", "content": _user_text(part)})
        elif isinstance(part, ToolReturnPart):
            if part.files:
                raise UnsupportedContentError(
                    f"the beam_agents model carries text only; tool {part.tool_name!r} "
                    "returned files"
                )
            text = part.model_response_str(wrap_if_error=False)
            neutral.append(tool_message(part.tool_call_id, text, part.outcome != "success"))
        else:
            raise UnsupportedContentError(
                f"the beam_agents model cannot send a {type(part).__name__} "
                "(it carries system, user and tool-result text)"
            )
    return neutral


def _assistant_message(message: ModelResponse) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            texts.append(part.content)
        elif isinstance(part, ToolCallPart):
            arguments = part.args_as_dict()
            calls.append({"id": part.tool_call_id, "name": part.tool_name, "arguments": arguments})
        elif isinstance(part, ThinkingPart):
            continue  # reasoning another model left in the history is not sent back
        else:
            raise UnsupportedContentError(
                f"the beam_agents model cannot send back a {type(part).__name__} "
                "(it carries text and function tool calls)"
            )
    assistant: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        assistant["tool_calls"] = calls
    return assistant


# -- the toolset --------------------------------------------------------------------------
INTENT_METADATA_KEY = "beam_agents.intent_id"
"""The ``DeferredToolRequests.metadata`` key naming the intent a deferred call waits for."""

ApprovalRule: TypeAlias = (
    bool | Collection[str] | Callable[[RunContext[Any], ToolDefinition, dict[str, Any]], bool]
)
"""Which calls need a person's approval: all, the named tools', or a predicate's picks."""

_Tools: TypeAlias = dict[str, ToolsetTool[Any]]

# The registry validates arguments itself (ctx.run_tool and ctx.act), with its own messages.
_ANY_ARGUMENTS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema()))

_log = logging.getLogger(__name__)


class BeamToolset(AbstractToolset[Any]):
    """The tools of a ``ToolRegistry`` (default ``AgentConfig.tool_registry``) for Pydantic AI."""

    def __init__(
        self,
        registry: ToolRegistry | None = None,
        *,
        approval_required: ApprovalRule = False,
        max_retries: int = 1,
        intent_ttl_ms: int | None = None,
        toolset_id: str = "beam_agents",
    ) -> None:
        if registry is not None and not isinstance(registry, ToolRegistry):
            raise TypeError(f"registry must be a ToolRegistry, got {type(registry).__name__}")
        if isinstance(approval_required, str):
            raise TypeError("approval_required takes a collection of tool names, not one str")
        self._registry = registry
        self._approval_required = approval_required
        self._max_retries = max_retries
        self._intent_ttl_ms = intent_ttl_ms
        self._id = toolset_id
        # The last registry listed, its tools and their Pydantic AI tools; not pickled.
        self._listed: tuple[ToolRegistry, tuple[Tool[..., Any], ...], _Tools] | None = None
        self._agent_tools: tuple[_Tools, tuple[AgentTool[Any], ...]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_listed"] = None
        state["_agent_tools"] = None
        return state

    @property
    def id(self) -> str | None:
        """The toolset id (``"beam_agents"`` unless told otherwise)."""
        return self._id

    @property
    def offers_activation_registry(self) -> bool:
        """Whether this toolset offers ``AgentConfig.tool_registry`` (no registry was given)."""
        return self._registry is None

    def registry(self) -> ToolRegistry:
        """The registry offered: the one given, else the running activation's."""
        if self._registry is not None:
            return self._registry
        return current_activation().ctx.tool_registry

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """One Pydantic AI tool per registry tool, built once per registry."""
        return dict(self._listed_tools())

    def _listed_tools(self) -> _Tools:
        registry = self.registry()
        registered = tuple(registry)
        listed = self._listed
        if (
            listed is None
            or listed[0] is not registry
            or len(listed[1]) != len(registered)
            or any(old is not new for old, new in zip(listed[1], registered, strict=True))
        ):
            listed = (registry, registered, self._tools(registered))
            self._listed = listed
            if not registered:
                _log.warning(
                    "BeamToolset offers the model no tools: its registry (by default "
                    "AgentConfig.tool_registry) is empty; pass tool_registry=ToolRegistry([...])"
                )
        return listed[2]

    def agent_tools(self) -> tuple[AgentTool[Any], ...] | None:
        """The registry tools as agent function tools, for ``Agent.override(tools=...)``."""
        listed = self._listed_tools()
        cached = self._agent_tools
        if cached is not None and cached[0] is listed:
            return cached[1]
        try:
            tools = tuple(self._agent_tool(tool) for tool in listed.values())
        except (AttributeError, TypeError):  # pragma: no cover - a Pydantic AI change
            return None
        self._agent_tools = (listed, tools)
        return tools

    def _agent_tool(self, toolset_tool: ToolsetTool[Any]) -> AgentTool[Any]:
        definition = toolset_tool.tool_def
        name = definition.name

        async def call(ctx: RunContext[Any], /, **arguments: Any) -> Any:
            return await self.call_tool(name, arguments, ctx, toolset_tool)

        tool: AgentTool[Any] = AgentTool.from_schema(
            call,
            name=name,
            description=definition.description,
            json_schema=definition.parameters_json_schema,
            takes_ctx=True,
            sequential=definition.sequential,
        )
        tool.max_retries = self._max_retries
        tool.function_schema.validator = _ANY_ARGUMENTS
        tool.function_schema.return_schema = None  # type: ignore[assignment]  # as in the toolset's
        if tool.tool_def != definition:  # pragma: no cover - a Pydantic AI change
            raise TypeError("the agent tool's definition differs from the toolset's")
        return tool

    def _tools(self, registered: Sequence[Tool[..., Any]]) -> _Tools:
        tools: _Tools = {}
        for tool in registered:
            schema = tool.schema
            definition = ToolDefinition(
                name=tool.name,
                parameters_json_schema=schema["parameters"],
                description=schema["description"],
                sequential=tool.side_effect,
            )
            tools[tool.name] = ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=self._max_retries,
                args_validator=_ANY_ARGUMENTS,
            )
        return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run the tool inline, or stage its intent; defer the call while it is unanswered."""
        activation = current_activation()
        registry_tool = self.registry().get(name)
        if not ctx.tool_call_approved and self._needs_approval(ctx, tool.tool_def, tool_args):
            try:  # arguments the tool refuses are the model's to fix, not a person's to judge
                registry_tool.validate_arguments(tool_args)
            except ToolArgumentError as exc:
                raise ModelRetry(str(exc)) from None
            raise ApprovalRequired
        if not registry_tool.side_effect:
            try:
                return await activation.run_tool(name, tool_args)
            except ToolArgumentError as exc:
                raise ModelRetry(str(exc)) from None
            except (AdapterUsageError, ToolError):  # the agent's setup is wrong: fail loudly
                raise
            except Exception as exc:  # an inline tool failing reads as an effector ERROR result
                raise ToolFailed(f"{name} failed: {type(exc).__name__}: {exc}") from None
        try:
            value = activation.act(
                name,
                tool_args,
                call_key=call_key("pydantic_ai", ctx.messages, ctx.tool_call_id),
                ttl_ms=self._intent_ttl_ms,
                tool=registry_tool,
            )
        except ToolArgumentError as exc:
            raise ModelRetry(str(exc)) from None
        except IntentFailedError as exc:
            raise ToolFailed(str(exc)) from None
        if isinstance(value, Pending):
            raise CallDeferred(metadata={INTENT_METADATA_KEY: value.intent_id})
        return value

    def _needs_approval(
        self, ctx: RunContext[Any], tool_def: ToolDefinition, arguments: dict[str, Any]
    ) -> bool:
        rule = self._approval_required
        if isinstance(rule, bool):
            return rule
        if callable(rule):
            return bool(rule(ctx, tool_def, arguments))
        return tool_def.name in rule


def call_key(kind: str, messages: Sequence[ModelMessage], tool_call_id: str | None) -> Hashable:
    """The activation's key of a tool call: ``(kind, position of its response, tool call id)``."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, ModelResponse) and any(
            isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id
            for part in message.parts
        ):
            return (kind, index, tool_call_id)
    return (kind, len(messages), tool_call_id)  # not in the messages: still a run position


def beam_toolset(
    registry: ToolRegistry | None = None,
    *,
    approval_required: ApprovalRule = False,
    max_retries: int = 1,
    intent_ttl_ms: int | None = None,
) -> BeamToolset:
    """A :class:`BeamToolset` over ``registry`` (default: ``AgentConfig.tool_registry``)."""
    return BeamToolset(
        registry,
        approval_required=approval_required,
        max_retries=max_retries,
        intent_ttl_ms=intent_ttl_ms,
    )
