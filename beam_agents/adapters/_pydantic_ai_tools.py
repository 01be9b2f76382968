"""``BeamToolset``: registry tools as a Pydantic AI toolset, run the way ``RunAgent`` runs them.

A read-only tool runs inline (``ctx.run_tool``); a side-effecting one becomes an intent
(``ctx.act``, keyed by :func:`call_key`): its value once the effector answered, else the call
is deferred (``CallDeferred``) and the adapter suspends the run. Side-effecting tools are
sequential in Pydantic AI's sense, so a turn stages its intents in the order the model asked.
A registry error other than bad arguments (an unknown tool, a side-effecting tool run inline)
is the agent's mistake, not the model's: it fails the activation instead of reaching the model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, TypeAlias

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import Tool as AgentTool
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from beam_agents.adapters._bridge import (
    AdapterUsageError,
    IntentFailedError,
    Pending,
    current_bridge,
)
from beam_agents.tools import Tool, ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolError

__all__ = ["INTENT_METADATA_KEY", "ApprovalRule", "BeamToolset", "beam_toolset", "call_key"]

INTENT_METADATA_KEY = "beam_agents.intent_id"
"""The ``DeferredToolRequests.metadata`` key naming the intent a deferred call waits for."""

ApprovalRule: TypeAlias = (
    bool | Collection[str] | Callable[[RunContext[Any], ToolDefinition, dict[str, Any]], bool]
)
"""Which calls need a person's approval: all, those of the named tools, or those a predicate
(``(run_context, tool_def, arguments) -> bool``) picks."""

_Tools: TypeAlias = dict[str, ToolsetTool[Any]]

# The registry validates arguments itself (ctx.run_tool and ctx.act), with its own messages.
_ANY_ARGUMENTS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema()))

_log = logging.getLogger(__name__)


class BeamToolset(AbstractToolset[Any]):
    """The tools of a ``ToolRegistry`` for a Pydantic AI agent run by ``PydanticAIAgent``.

    ``registry=None`` (the default) offers ``AgentConfig.tool_registry``, looked up when the
    run lists its tools. ``approval_required`` makes calls wait for a person's decision
    (Pydantic AI's ``ApprovalRequired``), which the adapter asks for as an approval intent.
    A failed, expired or rejected intent reaches the model as the tool's failure text.
    """

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
        # The last registry listed, its tools and their Pydantic AI tools (built once, not every
        # model step); dropped when pickled.
        self._listed: tuple[ToolRegistry, tuple[Tool[..., Any], ...], _Tools] | None = None
        # The agent tools of the last registry (see agent_tools), built once per registry too.
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
        return current_bridge().ctx.tool_registry

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """One Pydantic AI tool per registry tool, described by ``Tool.schema``.

        The tools are built once per registry (again should its tools change).
        """
        return dict(self._listed_tools())

    def _listed_tools(self) -> _Tools:
        """The Pydantic AI tools of the registry offered (cached; see :meth:`get_tools`)."""
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
        """The registry tools as agent function tools that run through :meth:`call_tool`.

        The adapter hands these to ``Agent.override(tools=...)`` when the agent has no tool of
        its own, so a run lists one toolset, not two (each model step of a run over two
        toolsets starts a task per toolset). They are listed, validated and called as this
        toolset's tools are. ``None`` if Pydantic AI's ``Tool`` no longer allows it.
        """
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
        bridge = current_bridge()
        registry_tool = self.registry().get(name)
        if not ctx.tool_call_approved and self._needs_approval(ctx, tool.tool_def, tool_args):
            try:  # arguments the tool refuses are the model's to fix, not a person's to judge
                registry_tool.validate_arguments(tool_args)
            except ToolArgumentError as exc:
                raise ModelRetry(str(exc)) from None
            raise ApprovalRequired
        if not registry_tool.side_effect:
            try:
                return await bridge.run_tool(name, tool_args)
            except ToolArgumentError as exc:
                raise ModelRetry(str(exc)) from None
            except (AdapterUsageError, ToolError):  # the agent's setup is wrong: fail loudly
                raise
            except Exception as exc:  # an inline tool failing reads as an effector ERROR result
                raise ToolFailed(f"{name} failed: {type(exc).__name__}: {exc}") from None
        try:
            value = bridge.act(
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
    """The bridge's key of a tool call: ``(kind, position of its response, tool call id)``.

    Providers reuse tool call ids across turns (``call_0`` every turn), so the id alone names
    two calls alike. The position is the index, in the run's full message list (the committed
    history and this run's messages), of the latest ``ModelResponse`` holding the call: the
    committed prefix is fixed for the whole run, so every re-walk finds the same index.
    """
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
