"""Typed clients for a running effector: ``EffectorClient`` (sync) and ``AsyncEffectorClient``.

Both take the same connection settings: a ``target`` (``HOST:PORT``), an optional bearer
``token`` (sent as ``authorization: Bearer <token>`` on every call), and TLS either with the
system's roots (``tls=True``) or with a given root certificate (``root_certificates``, PEM
bytes; implies TLS). Every call has a deadline (``timeout_s``; a Read adds its ``wait_ms``).
Failures raise ``grpc.RpcError`` (sync) or ``grpc.aio.AioRpcError`` (async) with the status
code the server chose.

A client holds a channel, so it is not picklable: a Beam DoFn keeps the settings and builds
its client in ``setup``.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from beam_agents._protos import (
    AgentEnvelope,
    DecideRequest,
    DecideResponse,
    EffectorStub,
    GetIntentRequest,
    GetIntentResponse,
    IntentState,
    ListIntentsRequest,
    PublishRequest,
    ReadRequest,
    ReadResponse,
    StatusRequest,
    StatusResponse,
    SubmitAck,
    SubmitRequest,
    ToolIntent,
)

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


def _credentials(tls: bool, root_certificates: bytes | None) -> grpc.ChannelCredentials | None:
    if root_certificates is not None:
        return grpc.ssl_channel_credentials(root_certificates=root_certificates)
    if tls:
        return grpc.ssl_channel_credentials()
    return None


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


class EffectorClient:
    """A blocking client for the ``Effector`` service and its health check."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        credentials = _credentials(tls, root_certificates)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
        self._stub = EffectorStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = _metadata(token)
        self._timeout_s = timeout_s

    def submit(
        self, intents: Iterable[ToolIntent], *, redeliver_results: bool = False
    ) -> list[SubmitAck]:
        """Submit a batch of intents; one acknowledgement per intent, in order.

        With ``redeliver_results``, the result envelope of every duplicate that is already
        DONE is appended to the envelope log again.
        """
        request = SubmitRequest(intents=intents, redeliver_results=redeliver_results)
        response = self._stub.Submit(request, **self._call())
        return list(response.acks)

    def read(self, from_offset: int, *, max_batch: int = 0, wait_ms: int = 0) -> ReadResponse:
        """Envelopes from ``from_offset`` on; waits up to ``wait_ms`` when there are none yet."""
        request = ReadRequest(from_offset=from_offset, max_batch=max_batch, wait_ms=wait_ms)
        response: ReadResponse = self._stub.Read(request, **self._call(wait_ms))
        return response

    def get_intent(self, intent_id: str) -> GetIntentResponse:
        """Everything the effector recorded about one intent."""
        response: GetIntentResponse = self._stub.GetIntent(
            GetIntentRequest(intent_id=intent_id), **self._call()
        )
        return response

    def decide(
        self, intent_id: str, *, approved: bool, approver: str = "", reason: str = ""
    ) -> DecideResponse:
        """Approve or deny an approval intent."""
        request = DecideRequest(
            intent_id=intent_id, approved=approved, approver=approver, reason=reason
        )
        response: DecideResponse = self._stub.Decide(request, **self._call())
        return response

    def publish(self, envelopes: Iterable[AgentEnvelope]) -> list[int]:
        """Append external events to the envelope log; returns their offsets."""
        response = self._stub.Publish(PublishRequest(envelopes=envelopes), **self._call())
        return list(response.offsets)

    def status(self) -> StatusResponse:
        """How many intents are in each state, and the log's head offset."""
        response: StatusResponse = self._stub.Status(StatusRequest(), **self._call())
        return response

    def list_intents(self, state: IntentState, *, limit: int = 0) -> list[ToolIntent]:
        """Intents in ``state``, oldest first; ``limit`` 0 means the server's default."""
        request = ListIntentsRequest(state=state, limit=limit)
        return list(self._stub.ListIntents(request, **self._call()).intents)

    def health(self, service: str = "") -> bool:
        """True if the server reports SERVING for ``service`` ("" is the whole server)."""
        response = self._health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self._timeout_s
        )
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> EffectorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, wait_ms: int = 0) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self._timeout_s + wait_ms / 1000}


class AsyncEffectorClient:
    """An asyncio client for the ``Effector`` service and its health check."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        credentials = _credentials(tls, root_certificates)
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
        self._stub = EffectorStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = _metadata(token)
        self._timeout_s = timeout_s

    async def submit(
        self, intents: Iterable[ToolIntent], *, redeliver_results: bool = False
    ) -> list[SubmitAck]:
        """Submit a batch of intents; one acknowledgement per intent, in order.

        With ``redeliver_results``, the result envelope of every duplicate that is already
        DONE is appended to the envelope log again.
        """
        request = SubmitRequest(intents=intents, redeliver_results=redeliver_results)
        response = await self._stub.Submit(request, **self._call())
        return list(response.acks)

    async def read(self, from_offset: int, *, max_batch: int = 0, wait_ms: int = 0) -> ReadResponse:
        """Envelopes from ``from_offset`` on; waits up to ``wait_ms`` when there are none yet."""
        request = ReadRequest(from_offset=from_offset, max_batch=max_batch, wait_ms=wait_ms)
        response: ReadResponse = await self._stub.Read(request, **self._call(wait_ms))
        return response

    async def get_intent(self, intent_id: str) -> GetIntentResponse:
        """Everything the effector recorded about one intent."""
        response: GetIntentResponse = await self._stub.GetIntent(
            GetIntentRequest(intent_id=intent_id), **self._call()
        )
        return response

    async def decide(
        self, intent_id: str, *, approved: bool, approver: str = "", reason: str = ""
    ) -> DecideResponse:
        """Approve or deny an approval intent."""
        request = DecideRequest(
            intent_id=intent_id, approved=approved, approver=approver, reason=reason
        )
        response: DecideResponse = await self._stub.Decide(request, **self._call())
        return response

    async def publish(self, envelopes: Iterable[AgentEnvelope]) -> list[int]:
        """Append external events to the envelope log; returns their offsets."""
        response = await self._stub.Publish(PublishRequest(envelopes=envelopes), **self._call())
        return list(response.offsets)

    async def status(self) -> StatusResponse:
        """How many intents are in each state, and the log's head offset."""
        response: StatusResponse = await self._stub.Status(StatusRequest(), **self._call())
        return response

    async def list_intents(self, state: IntentState, *, limit: int = 0) -> list[ToolIntent]:
        """Intents in ``state``, oldest first; ``limit`` 0 means the server's default."""
        request = ListIntentsRequest(state=state, limit=limit)
        return list((await self._stub.ListIntents(request, **self._call())).intents)

    async def health(self, service: str = "") -> bool:
        """True if the server reports SERVING for ``service`` ("" is the whole server)."""
        response = await self._health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self._timeout_s
        )
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncEffectorClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def _call(self, wait_ms: int = 0) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self._timeout_s + wait_ms / 1000}
