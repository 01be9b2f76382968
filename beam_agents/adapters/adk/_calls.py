"""ADK's model and tools, answered through the running activation."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from google.adk.agents.llm_agent import ToolUnion
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest as AdkLlmRequest
from google.adk.models.llm_response import LlmResponse as AdkLlmResponse
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import BaseModel, Field

from beam_agents._protos import canonical_json
from beam_agents.adapters.base import IntentFailedError, Pending, current_activation
from beam_agents.model.client import LlmRequest, LlmResponse, TokenUsage, tool_message
from beam_agents.tools import Tool, ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolError


class AdkTranslationError(ValueError):
    """An ADK request holds something the neutral message format cannot carry."""


class BeamLlm(BaseLlm):
    """An ADK model that calls the model through the running activation (``ctx.call_model``)."""

    sampling_params: dict[str, Any] = Field(default_factory=dict)

    async def generate_content_async(
        self, llm_request: AdkLlmRequest, stream: bool = False
    ) -> AsyncGenerator[AdkLlmResponse, None]:
        """One model turn: the whole answer as one (non-partial) ADK response."""
        activation = current_activation()
        request = neutral_request(llm_request, self.model, self.sampling_params)
        response = await activation.call_model(request)
        yield adk_response(response, request)


def neutral_request(
    llm_request: AdkLlmRequest, model_id: str, extra: Mapping[str, Any] | None = None
) -> LlmRequest:
    """The neutral ``LlmRequest`` an ADK request stands for (deterministic: no ADK ids)."""
    messages: list[dict[str, Any]] = []
    config = llm_request.config
    system = _system_text(config.system_instruction if config is not None else None)
    if system:
        messages.append({"role": "system", "content": system})
    for content in llm_request.contents:
        messages.extend(_content_messages(content))
    sampling = _sampling(config)
    sampling.update(extra or {})
    return LlmRequest(
        model_id=model_id or (llm_request.model or ""),
        messages=messages,
        tools_schema=_tools_schema(config),
        sampling_params=sampling,
    )


def adk_response(response: LlmResponse, request: LlmRequest) -> AdkLlmResponse:
    """The ADK ``LlmResponse`` of a neutral answer; a call without an id gets a derived one."""
    parts: list[types.Part] = []
    if response.text or not response.tool_calls:
        parts.append(text_part(response.text))
    for position, call in enumerate(response.tool_calls):
        call_id = call.id or _derived_call_id(request, position)
        parts.append(_function_call_part(call_id, call.name, dict(call.arguments)))
    content = content_of("model", parts)
    model_version = response.model or None
    usage = _usage(response.usage)
    if model_version is not None and type(model_version) is not str:
        return AdkLlmResponse(content=content, model_version=model_version, usage_metadata=usage)
    values = {"content": content, "model_version": model_version, "usage_metadata": usage}
    return filled(_LLM_RESPONSE, values)


# ``google.genai`` models validate every field in Python on construction. Where the values are
# exactly of the declared types, a copy of an empty instance is filled in instead (:func:`filled`).
_PART = types.Part()
_FUNCTION_CALL = types.FunctionCall()
_CONTENT = types.Content()
_USAGE = types.GenerateContentResponseUsageMetadata()
_DECLARATION = types.FunctionDeclaration()
_LLM_RESPONSE = AdkLlmResponse()

_new_object = object.__new__
_set_attribute = object.__setattr__

_M = TypeVar("_M", bound=BaseModel)


def filled(template: _M, update: dict[str, Any], fields_set: Collection[str] = ()) -> _M:
    """``template.model_copy(update=update)`` without validation; ``fields_set`` marked set."""
    model = _new_object(type(template))
    values = template.__dict__.copy()
    values.update(update)
    private = template.__pydantic_private__
    _set_attribute(model, "__dict__", values)
    _set_attribute(model, "__pydantic_extra__", None)
    _set_attribute(model, "__pydantic_fields_set__", set(fields_set or update))
    _set_attribute(model, "__pydantic_private__", None if private is None else private.copy())
    return model


def text_part(text: str) -> types.Part:
    """``types.Part(text=text)``."""
    if type(text) is not str:
        return types.Part(text=text)
    return filled(_PART, {"text": text})


def content_of(role: str, parts: list[types.Part]) -> types.Content:
    """``types.Content(role=role, parts=parts)``."""
    if type(role) is not str or type(parts) is not list:
        return types.Content(role=role, parts=parts)
    for part in parts:
        if type(part) is not types.Part:
            return types.Content(role=role, parts=parts)
    return filled(_CONTENT, {"role": role, "parts": parts})


def _function_call_part(call_id: str, name: str, args: dict[str, Any]) -> types.Part:
    if type(call_id) is not str or type(name) is not str or not all(type(k) is str for k in args):
        call = types.FunctionCall(id=call_id, name=name, args=args)
    else:
        call = filled(_FUNCTION_CALL, {"id": call_id, "name": name, "args": args})
    return filled(_PART, {"function_call": call})


def _usage(usage: TokenUsage) -> types.GenerateContentResponseUsageMetadata:
    prompt, candidates, total = usage.input_tokens, usage.output_tokens, usage.total_tokens
    if type(prompt) is not int or type(candidates) is not int or type(total) is not int:
        return types.GenerateContentResponseUsageMetadata(
            prompt_token_count=prompt, candidates_token_count=candidates, total_token_count=total
        )
    return filled(
        _USAGE,
        {
            "prompt_token_count": prompt,
            "candidates_token_count": candidates,
            "total_token_count": total,
        },
    )


def _derived_call_id(request: LlmRequest, position: int) -> str:
    return f"beam-{request.content_digest()[:16]}-{position}"


def _system_text(instruction: object) -> str:
    if instruction is None:
        return ""
    if isinstance(instruction, str):
        return instruction
    if isinstance(instruction, types.Part):
        return instruction.text or ""
    if isinstance(instruction, types.Content):
        return "\n\n".join(part.text for part in instruction.parts or () if part.text)
    if isinstance(instruction, list):
        return "\n\n".join(text for item in instruction if (text := _system_text(item)))
    raise AdkTranslationError(f"system instructions must be text, got {type(instruction).__name__}")


def _content_messages(content: types.Content) -> list[dict[str, Any]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    tool_messages: list[dict[str, Any]] = []
    for part in content.parts or ():
        if part.thought:
            continue
        if part.function_call is not None:
            call = part.function_call
            calls.append(
                {"id": call.id or "", "name": call.name or "", "arguments": dict(call.args or {})}
            )
        elif part.function_response is not None:
            tool_messages.append(_tool_message(part.function_response))
        elif part.text is not None:
            texts.append(part.text)
        else:
            raise AdkTranslationError(
                "the neutral message format carries text, function calls and function "
                f"responses only, not {sorted(part.model_dump(exclude_none=True))}"
            )
    text = "".join(texts)
    if content.role == "model":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        return [message] if text or calls else []
    if calls:
        raise AdkTranslationError("a user turn cannot hold function calls")
    messages = tool_messages
    if text:
        messages = [*messages, {"role": "user", "content": text}]
    return messages


def _tool_message(response: types.FunctionResponse) -> dict[str, Any]:
    """A function response as a neutral ``tool`` message; ``{"error": ...}`` marks a failure."""
    value = response.response or {}
    if set(value) == {"result"}:
        value = value["result"]
    content = value if isinstance(value, str) else canonical_json(value)
    failed = isinstance(value, Mapping) and "error" in value
    return tool_message(response.id or "", content, failed)


def _tools_schema(config: types.GenerateContentConfig | None) -> list[dict[str, Any]]:
    schema: list[dict[str, Any]] = []
    for entry in (config.tools if config is not None else None) or ():
        if not isinstance(entry, types.Tool):
            continue
        for declaration in entry.function_declarations or ():
            schema.append(
                {
                    "name": declaration.name or "",
                    "description": declaration.description or "",
                    "parameters": _parameters(declaration),
                }
            )
    return schema


def _parameters(declaration: types.FunctionDeclaration) -> dict[str, Any]:
    if declaration.parameters_json_schema is not None:
        return dict(declaration.parameters_json_schema)
    if declaration.parameters is not None:
        converted = declaration.parameters.json_schema.model_dump(mode="json", exclude_none=True)
        return dict(converted)
    return {"type": "object", "properties": {}}


def _sampling(config: types.GenerateContentConfig | None) -> dict[str, Any]:
    if config is None:
        return {}
    sampling: dict[str, Any] = {}
    if config.temperature is not None:
        sampling["temperature"] = config.temperature
    if config.top_p is not None:
        sampling["top_p"] = config.top_p
    if config.max_output_tokens is not None:
        sampling["max_tokens"] = config.max_output_tokens
    return sampling


# -- tools --------------------------------------------------------------------------------
ConfirmationRule = bool | Callable[[str, Mapping[str, Any], ToolContext], bool]
"""Whether a call needs a person's confirmation: always, never, or ``rule(name, args, context)``."""

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
        name, description, schema = self.name, self.description, self._parameters
        if type(name) is not str or type(description) is not str:
            return types.FunctionDeclaration(
                name=name, description=description, parameters_json_schema=schema
            )
        update = {"name": name, "description": description, "parameters_json_schema": schema}
        return filled(_DECLARATION, update)

    async def check_require_confirmation(
        self, args: dict[str, Any], tool_context: ToolContext
    ) -> bool:
        """Whether this call still waits for a person (never once decided, or if refused)."""
        if not self._require_confirmation or tool_context.tool_confirmation is not None:
            return False  # nothing to ask, or decided already
        try:
            self.tool.validate_arguments(args)
        except ToolArgumentError:
            return False  # refused unasked by run_async
        return self._asks(args, tool_context)

    def _asks(self, args: dict[str, Any], tool_context: ToolContext) -> bool:
        rule = self._require_confirmation
        if callable(rule):
            return bool(rule(self.name, args, tool_context))
        return bool(rule)

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        """Run the call through the activation; failures reach the model as ``{"error": ...}``."""
        activation = current_activation()
        confirmation = tool_context.tool_confirmation
        if self._require_confirmation and confirmation is None:
            # The gate asked nobody about arguments this tool refuses: say why.
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
            value = activation.act(
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
    """The registry's tools (or those in ``names``) as ADK tools, for ``LlmAgent(tools=...)``."""
    chosen = [tool for tool in registry if names is None or tool.name in names]
    return [BeamTool(tool, require_confirmation=require_confirmation) for tool in chosen]


async def _run_inline(name: str, args: Mapping[str, Any]) -> Any:
    try:
        value = await current_activation().run_tool(name, args)
    except ToolArgumentError as exc:
        return {"error": str(exc)}
    except ToolError:
        raise  # not the model's doing: the registry lacks the tool, or runs it as an effect
    except Exception as exc:
        return {"error": f"{name} failed: {type(exc).__name__}: {exc}"}
    return _plain(value)


def _call_key(
    name: str, args: Mapping[str, Any], tool_context: ToolContext
) -> tuple[str | int, ...]:
    """The intent's key within one activation: the call's place, id, tool and arguments."""
    call_id = tool_context.function_call_id or ""
    position = call_position(tool_context.session.events, call_id, name)
    return ("adk-call", position, call_id, name, canonical_json(dict(args)))


def call_position(events: Sequence[Event], call_id: str, name: str) -> int:
    """The index of the latest event in ``events`` calling ``name`` as ``call_id``, else -1."""
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
