"""The single point where an activation reaches the model provider.

``ActivationContext.call_model`` consults the replay cache and, on a miss, calls
:meth:`ModelGateway.complete`; that method is the one place a retry policy, a circuit breaker
or a token budget wraps the provider call. Replays never reach the provider.
"""

from __future__ import annotations

from beam_agents._protos import ModelCacheEntry
from beam_agents.model.cache import replayed_response
from beam_agents.model.client import LlmRequest, LlmResponse, ModelClient


class ModelGateway:
    """Calls one DoFn instance's model client and rebuilds replayed responses with it."""

    __slots__ = ("client",)

    def __init__(self, client: ModelClient) -> None:
        if not callable(getattr(client, "complete", None)):
            raise TypeError(
                f"provider_factory returned {type(client).__name__}, which has no "
                "`async complete(request)` method"
            )
        self.client = client

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Send ``request`` to the provider."""
        response = await self.client.complete(request)
        if not isinstance(response, LlmResponse):
            raise TypeError(
                f"{type(self.client).__name__}.complete returned "
                f"{type(response).__name__}, not an LlmResponse"
            )
        return response

    def replay(self, entry: ModelCacheEntry) -> LlmResponse:
        """The response recorded in ``entry``, decoded by this gateway's client."""
        return replayed_response(self.client, entry)
