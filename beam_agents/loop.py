"""The tool-calling loop: let the model call tools until it answers, across suspensions."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from beam_agents._protos import ToolResult, canonical_json, canonical_json_bytes
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.context import ActivationContext
from beam_agents.model.client import LlmRequest, LlmResponse, ToolCall, tool_message
from beam_agents.tools import ToolRegistry
from beam_agents.tools.errors import ToolArgumentError

LOOP_ADAPTER = "beam_agents.loop"
"""The ``Suspend.adapter`` of the loop's suspensions."""

_SNAPSHOT_FIELD = "beam_agents.tool_loop"
_SNAPSHOT_PREFIX = b'{"' + _SNAPSHOT_FIELD.encode() + b'":'

DEFAULT_MAX_ITERATIONS = 8
"""How many model calls one loop may make unless told otherwise."""


class ToolLoopError(Exception):
    """Base class of the errors :func:`run_tool_loop` raises."""


class ToolLoopLimitError(ToolLoopError):
    """The model still asked for tools after ``max_iterations`` model calls."""


class ToolLoopConfigError(ToolLoopError, ValueError):
    """The loop cannot run as configured (no request, or a tool ``ctx.run_tool`` cannot run)."""


@dataclass(frozen=True, slots=True)
class LoopOutcome:
    """Where the loop stopped: a final answer, or a suspension waiting for intents.

    Attributes:
        text: The model's final answer (``""`` while suspended).
        response: The model's last response.
        messages: The last request's messages and the model's last turn.
        pending_intent_ids: The current turn's intents without a result, in call order.
        iterations: Model calls the loop made, replayed ones included.
        suspend: The ``Suspend`` to return while intents are pending, else ``None``.
    """

    text: str
    response: LlmResponse
    messages: tuple[Mapping[str, Any], ...]
    pending_intent_ids: tuple[str, ...]
    iterations: int
    suspend: Suspend | None

    @property
    def done(self) -> bool:
        """Whether the model gave its final answer."""
        return self.suspend is None

    @property
    def outcome(self) -> Complete | Suspend:
        """What an agent that only runs this loop returns: the answer as UTF-8, or the suspend."""
        if self.suspend is not None:
            return self.suspend
        return Complete(output=self.text.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class _Reply:
    content: str
    is_error: bool = False


def _snapshot(request: LlmRequest) -> bytes:
    try:
        return canonical_json_bytes(
            {
                _SNAPSHOT_FIELD: {
                    "model_id": request.model_id,
                    "messages": list(request.messages),
                    "sampling_params": dict(request.sampling_params),
                }
            }
        )
    except (TypeError, ValueError) as exc:
        raise ToolLoopConfigError(
            f"the tool loop keeps its request in the run's snapshot, so its messages and "
            f"sampling_params must be JSON: {exc}"
        ) from None


def _stored_request(snapshot: bytes) -> LlmRequest | None:
    if not snapshot.startswith(_SNAPSHOT_PREFIX):
        return None
    stored = json.loads(snapshot)[_SNAPSHOT_FIELD]
    return LlmRequest(
        model_id=stored["model_id"],
        messages=stored["messages"],
        sampling_params=stored["sampling_params"],
    )


def _check_registry(ctx: ActivationContext, registry: ToolRegistry) -> None:
    runnable = ctx.tool_registry
    missing = sorted(
        tool.name for tool in registry if not tool.side_effect and tool.name not in runnable
    )
    if missing:
        raise ToolLoopConfigError(
            f"the tool loop offers read-only tools that ctx.run_tool cannot run: {missing}; "
            "add them to AgentConfig.tool_registry (or loop over AgentConfig.tool_registry "
            "itself by not passing registry=)"
        )


def result_reply(tool_name: str, result: ToolResult) -> tuple[str, bool]:
    """What the model is told of an effector result: ``(text, is_error)``."""
    if result.status == ToolResult.OK:
        return result.payload.decode("utf-8", errors="replace"), False
    detail = f": {result.error_message}" if result.error_message else ""
    if result.status == ToolResult.EXPIRED:
        return f"{tool_name} expired before it could run{detail}", True
    if result.status == ToolResult.REJECTED:
        return f"{tool_name} was rejected and did not run{detail}", True
    if result.status == ToolResult.NOT_NEEDED:  # a compensation of an effect that never ran
        return f"{tool_name} was not needed and did not run{detail}", False
    return f"{tool_name} failed{detail}", True


async def _run_inline(ctx: ActivationContext, call: ToolCall) -> _Reply:
    try:
        value = await ctx.run_tool(call.name, call.arguments)
    except ToolArgumentError as exc:
        return _Reply(str(exc), is_error=True)
    except Exception as exc:
        return _Reply(f"{call.name} failed: {type(exc).__name__}: {exc}", is_error=True)
    try:
        return _Reply(canonical_json(value))
    except (TypeError, ValueError) as exc:
        return _Reply(
            f"{call.name} returned a value that is not JSON-encodable: {exc}", is_error=True
        )


def assistant_message(response: LlmResponse) -> dict[str, Any]:
    """The neutral ``assistant`` turn recording ``response`` (its text and tool calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": response.text}
    if response.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "name": call.name, "arguments": dict(call.arguments)}
            for call in response.tool_calls
        ]
    return message


async def run_tool_loop(
    ctx: ActivationContext,
    request: LlmRequest | None,
    *,
    registry: ToolRegistry | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    intent_ttl_ms: int | None = None,
    suspend_timeout_ms: int | None = None,
) -> LoopOutcome:
    """Run the tool-calling loop for ``request``; see ``docs/tools.md``, "The tool-calling loop".

    Args:
        ctx: The activation context.
        request: The conversation to start from, with the registry's tools. A resume continues
            the stored one, so ``None`` is accepted then.
        registry: The tools the model may call (default: ``AgentConfig.tool_registry``).
        max_iterations: Most model calls; one more ask for tools raises :class:`ToolLoopLimitError`.
        intent_ttl_ms: TTL of the intents the loop stages (default ``AgentConfig.intent_ttl_ms``).
        suspend_timeout_ms: ``Suspend.timeout_ms`` of the loop's suspensions.
    """
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int):
        raise TypeError(f"max_iterations must be an int, got {type(max_iterations).__name__}")
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1, got {max_iterations}")
    tools = ctx.tool_registry if registry is None else registry
    if not isinstance(tools, ToolRegistry):
        raise TypeError(f"registry must be a ToolRegistry, got {type(tools).__name__}")
    _check_registry(ctx, tools)
    start = _stored_request(ctx.snapshot) if ctx.is_resume else None
    if start is None:
        if not isinstance(request, LlmRequest):
            raise ToolLoopConfigError(
                f"run_tool_loop needs an LlmRequest to start the run, got {request!r}"
            )
        start = request
    snapshot = _snapshot(start)
    messages: list[Mapping[str, Any]] = list(start.messages)
    tools_schema = tools.tools_schema
    iteration = 0
    while True:
        iteration += 1
        sent = dataclasses.replace(start, messages=tuple(messages), tools_schema=tools_schema)
        response = await ctx.call_model(sent)
        assistant = assistant_message(response)
        if not response.tool_calls:
            return LoopOutcome(
                text=response.text,
                response=response,
                messages=(*messages, assistant),
                pending_intent_ids=(),
                iterations=iteration,
                suspend=None,
            )
        if iteration >= max_iterations:
            asked = sorted({call.name for call in response.tool_calls})
            raise ToolLoopLimitError(
                f"the model still asked for tools {asked} after {max_iterations} model calls; "
                "raise max_iterations or change the prompt"
            )
        turn = [assistant]
        pending: list[str] = []
        for call in response.tool_calls:
            reply = await _answer(ctx, tools, call, intent_ttl_ms)
            if isinstance(reply, str):
                pending.append(reply)
            else:
                turn.append(tool_message(call.id, reply.content, reply.is_error))
        if pending:
            return LoopOutcome(
                text="",
                response=response,
                messages=(*messages, assistant),
                pending_intent_ids=tuple(pending),
                iterations=iteration,
                suspend=Suspend(
                    snapshot=snapshot, adapter=LOOP_ADAPTER, timeout_ms=suspend_timeout_ms
                ),
            )
        messages.extend(turn)


async def _answer(
    ctx: ActivationContext, tools: ToolRegistry, call: ToolCall, intent_ttl_ms: int | None
) -> _Reply | str:
    if call.name not in tools:
        offered = ", ".join(sorted(tools.names())) or "none"
        return _Reply(f"unknown tool {call.name!r}; the tools are: {offered}", is_error=True)
    tool = tools.get(call.name)
    if not tool.side_effect:
        return await _run_inline(ctx, call)
    try:
        # Validated here too: AgentConfig.tool_registry, which ctx.act checks, may lack it.
        tool.validate_arguments(call.arguments)
        intent_id = ctx.act(call.name, dict(call.arguments), ttl_ms=intent_ttl_ms)
    except ToolArgumentError as exc:
        return _Reply(str(exc), is_error=True)
    result = ctx.results.get(intent_id)
    return intent_id if result is None else _Reply(*result_reply(call.name, result))
