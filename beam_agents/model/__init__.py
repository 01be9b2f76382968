"""Model clients: the neutral request/response types, the fake for tests, and HTTP providers.

Nothing here imports Apache Beam, ``beam_agents.core`` or ``beam_agents.io``; the module map is
in ``beam_agents/model/README.md``. The names below are the package's public API; the modules
they come from are the place to read about each.
"""

from beam_agents.model.anthropic import AnthropicMessagesProvider
from beam_agents.model.client import (
    CompletesRequests,
    LlmRequest,
    LlmResponse,
    ModelClient,
    TokenUsage,
    ToolCall,
    as_model_client,
    decode_plain,
    decode_with,
)
from beam_agents.model.errors import (
    ProviderError,
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ServerError,
)
from beam_agents.model.fake import (
    Behavior,
    FakeLLM,
    Matcher,
    Responder,
    Shape,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
    respond_with_fn,
    respond_with_text,
    respond_with_tool_calls,
    simulate_latency,
    wire_body,
    word_count_usage,
)
from beam_agents.model.openai import OpenAIChatProvider
from beam_agents.model.resilience import CircuitOpenError, RetryPolicy
from beam_agents.model.transport import HttpOptions, JsonHttpProvider

__all__ = [
    "AnthropicMessagesProvider",
    "Behavior",
    "CircuitOpenError",
    "CompletesRequests",
    "FakeLLM",
    "HttpOptions",
    "JsonHttpProvider",
    "LlmRequest",
    "LlmResponse",
    "Matcher",
    "ModelClient",
    "OpenAIChatProvider",
    "ProviderError",
    "ProviderRequestError",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RateLimitError",
    "Responder",
    "RetryPolicy",
    "ServerError",
    "Shape",
    "TokenUsage",
    "ToolCall",
    "as_model_client",
    "decode_plain",
    "decode_with",
    "fail_then_succeed",
    "match_any",
    "match_contains",
    "match_model_id",
    "raise_error",
    "respond_with",
    "respond_with_fn",
    "respond_with_text",
    "respond_with_tool_calls",
    "simulate_latency",
    "wire_body",
    "word_count_usage",
]
