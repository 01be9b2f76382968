"""Bearer-token authentication of the gRPC server: any accepted token, health checks free.

Split from ``server.py``. The tokens come from ``identities.py``; a refused call is answered
UNAUTHENTICATED by a handler of the same shape as the one it replaces.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health

from effector.identities import Tokens

_HEALTH_METHOD_PREFIX = f"/{health.SERVICE_NAME}/"


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every RPC but health checks unless it carries ``authorization: Bearer <token>``.

    With named tokens any of them will do; ``Decide`` then asks which (``decisions.caller``).
    """

    def __init__(self, tokens: str | Tokens) -> None:
        self._tokens = Tokens.single(tokens) if isinstance(tokens, str) else tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Pass authorized calls (and health checks) on; answer the rest UNAUTHENTICATED."""
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_HEALTH_METHOD_PREFIX):
            return handler
        supplied = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                supplied = value.encode() if isinstance(value, str) else value
        if self._tokens.identify_bearer(supplied) is not None:
            return handler
        return _refusing_handler(handler)


def _refusing_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **serializers)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **serializers)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **serializers)
    return grpc.unary_unary_rpc_method_handler(refuse, **serializers)
