"""``BeamModel``: a Pydantic AI model whose every request is ``ctx.call_model``.

Pydantic AI's messages and request parameters become one :class:`LlmRequest` in the neutral
format (``beam_agents/model/README.md``), and the :class:`LlmResponse` comes back as a
``ModelResponse``. The request holds only what the conversation says (no timestamps, no run or
part ids that Pydantic AI mints), so a re-walked run sends byte-identical requests and the
replay cache answers them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RequestUsage

from beam_agents.adapters._bridge import current_bridge
from beam_agents.model.client import LlmRequest, LlmResponse

__all__ = ["BeamModel", "UnsupportedContentError"]

# ModelSettings fields passed on as sampling params under the same (provider-native) name.
_SAMPLING_SETTINGS: tuple[ModelSettingName, ...] = ("temperature", "top_p", "max_tokens", "seed")


class UnsupportedContentError(TypeError):
    """A message part the neutral format cannot carry (files, images, native tool parts)."""


class BeamModel(Model):
    """A Pydantic AI ``Model`` answered through the running activation's ``ctx.call_model``.

    Build it anywhere; it looks the activation up when a request is made, so using it outside
    an adapter run raises ``AdapterUsageError``. ``sampling_params`` are sent as they are
    (provider-native fields); ``temperature``, ``top_p``, ``max_tokens`` and ``seed`` from the
    run's ``ModelSettings`` are added to them.
    """

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
        bridge = current_bridge()
        model_settings, parameters = self.prepare_request(model_settings, model_request_parameters)
        request = self.llm_request(messages, model_settings, parameters)
        return self.model_response(await bridge.call_model(request), request)

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
        """``response`` to ``request`` as Pydantic AI's ``ModelResponse``.

        Tool call ids are kept as given; a call without one is named after the request and its
        position in the response.
        """
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
    """A stable id for a tool call the provider gave none (never Pydantic AI's random one).

    It names the call by the request it answers and its place in the response, not by the
    response's bytes: two turns given the same body still get different ids.
    """
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
            tool: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": part.tool_call_id,
                "content": part.model_response_str(wrap_if_error=False),
            }
            if part.outcome != "success":
                tool["is_error"] = True
            neutral.append(tool)
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
