"""Typed clients for a running effector: ``EffectorClient`` (sync) and ``AsyncEffectorClient``.

Every call has a deadline (``timeout_s``, plus a Read's ``wait_ms``); failures raise
``grpc.RpcError``. A client holds a channel, so it is not picklable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import beam_agents._protos as pb

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


class _Client:
    """What both clients share: the channel and its stubs, the token and the deadline."""

    _channels: ClassVar[Any]

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if root_certificates is None and not tls:
            self._channel = self._channels.insecure_channel(target, options=_CHANNEL_OPTIONS)
        else:  # no root certificates: the system's
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = self._channels.secure_channel(
                target, credentials, options=_CHANNEL_OPTIONS
            )
        self._stub = pb.EffectorStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout_s = timeout_s

    def _call(self, wait_ms: int = 0) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self._timeout_s + wait_ms / 1000}


class EffectorClient(_Client):
    """A blocking client for the ``Effector`` service and its health check."""

    _channels = grpc

    def submit(
        self, intents: Iterable[pb.ToolIntent], *, redeliver_results: bool = False
    ) -> list[pb.SubmitAck]:
        """Submit intents; one acknowledgement each, in order."""
        request = pb.SubmitRequest(intents=intents, redeliver_results=redeliver_results)
        response = self._stub.Submit(request, **self._call())
        return list(response.acks)

    def read(
        self, from_offset: int, *, max_batch: int = 0, wait_ms: int = 0, max_bytes: int = 0
    ) -> pb.ReadResponse:
        """Envelopes from ``from_offset`` on, within ``max_bytes`` (0: the server's default).

        Waits up to ``wait_ms`` when there are none yet.
        """
        request = pb.ReadRequest(
            from_offset=from_offset, max_batch=max_batch, wait_ms=wait_ms, max_bytes=max_bytes
        )
        response: pb.ReadResponse = self._stub.Read(request, **self._call(wait_ms))
        return response

    def get_intent(self, intent_id: str) -> pb.GetIntentResponse:
        """Everything the effector recorded about one intent."""
        response: pb.GetIntentResponse = self._stub.GetIntent(
            pb.GetIntentRequest(intent_id=intent_id), **self._call()
        )
        return response

    def decide(
        self,
        intent_id: str,
        *,
        approved: bool,
        approver: str = "",
        reason: str = "",
        args_digest: str = "",
        edited_args_json: str = "",
    ) -> pb.DecideResponse:
        """Approve or deny an approval intent (``DecideRequest`` documents the fields)."""
        request = pb.DecideRequest(
            intent_id=intent_id,
            approved=approved,
            approver=approver,
            reason=reason,
            args_digest=args_digest,
            edited_args_json=edited_args_json,
        )
        response: pb.DecideResponse = self._stub.Decide(request, **self._call())
        return response

    def publish(self, envelopes: Iterable[pb.AgentEnvelope]) -> list[int]:
        """Append external events; their offsets, 0 for a refused one (see ``publish_report``)."""
        return list(self.publish_report(envelopes).offsets)

    def publish_report(self, envelopes: Iterable[pb.AgentEnvelope]) -> pb.PublishResponse:
        """Append external events; each one's offset, and its problem if it was refused."""
        request = pb.PublishRequest(envelopes=envelopes)
        response: pb.PublishResponse = self._stub.Publish(request, **self._call())
        return response

    def status(self) -> pb.StatusResponse:
        """How many intents are in each state, and the log's head offset."""
        response: pb.StatusResponse = self._stub.Status(pb.StatusRequest(), **self._call())
        return response

    def list_intents(self, state: pb.IntentState, *, limit: int = 0) -> list[pb.ToolIntent]:
        """Intents in ``state``, oldest first; ``limit`` 0 means the server's default."""
        request = pb.ListIntentsRequest(state=state, limit=limit)
        return list(self._stub.ListIntents(request, **self._call()).intents)

    def policies(self, limit: int = 0) -> pb.PoliciesResponse:
        """The effect policy in force and its newest ``limit`` decisions (0: the default)."""
        request = pb.PoliciesRequest(limit=limit)
        response: pb.PoliciesResponse = self._stub.Policies(request, **self._call())
        return response

    def budgets(self, limit: int = 0) -> list[pb.BudgetWindow]:
        """The newest fleet budget windows (``limit`` 0: the server's default)."""
        response = self._stub.Budgets(pb.BudgetsRequest(limit=limit), **self._call())
        return list(response.windows)

    def lease_budget(self, request: pb.LeaseBudgetRequest) -> pb.LeaseBudgetResponse:
        """Lease an allowance of a fleet budget's window (see ``LeaseBudgetRequest``)."""
        response: pb.LeaseBudgetResponse = self._stub.LeaseBudget(request, **self._call())
        return response

    def list_failed(self, *, limit: int = 0) -> list[tuple[pb.ToolIntent, pb.ToolResult]]:
        """DONE intents whose result is not OK, each with it, oldest first (``limit`` as above)."""
        request = pb.ListIntentsRequest(state=pb.IntentState.DONE, limit=limit, failed_only=True)
        response = self._stub.ListIntents(request, **self._call())
        return list(zip(response.intents, response.results, strict=True))

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

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncEffectorClient(_Client):
    """An asyncio client for the ``Effector`` service and its health check."""

    _channels = grpc.aio

    async def submit(
        self, intents: Iterable[pb.ToolIntent], *, redeliver_results: bool = False
    ) -> list[pb.SubmitAck]:
        """Submit intents; one acknowledgement each, in order."""
        request = pb.SubmitRequest(intents=intents, redeliver_results=redeliver_results)
        response = await self._stub.Submit(request, **self._call())
        return list(response.acks)

    async def read(
        self, from_offset: int, *, max_batch: int = 0, wait_ms: int = 0, max_bytes: int = 0
    ) -> pb.ReadResponse:
        """Envelopes from ``from_offset`` on, within ``max_bytes`` (0: the server's default).

        Waits up to ``wait_ms`` when there are none yet.
        """
        request = pb.ReadRequest(
            from_offset=from_offset, max_batch=max_batch, wait_ms=wait_ms, max_bytes=max_bytes
        )
        response: pb.ReadResponse = await self._stub.Read(request, **self._call(wait_ms))
        return response

    async def get_intent(self, intent_id: str) -> pb.GetIntentResponse:
        """Everything the effector recorded about one intent."""
        response: pb.GetIntentResponse = await self._stub.GetIntent(
            pb.GetIntentRequest(intent_id=intent_id), **self._call()
        )
        return response

    async def decide(
        self,
        intent_id: str,
        *,
        approved: bool,
        approver: str = "",
        reason: str = "",
        args_digest: str = "",
        edited_args_json: str = "",
    ) -> pb.DecideResponse:
        """Approve or deny an approval intent (``DecideRequest`` documents the fields)."""
        request = pb.DecideRequest(
            intent_id=intent_id,
            approved=approved,
            approver=approver,
            reason=reason,
            args_digest=args_digest,
            edited_args_json=edited_args_json,
        )
        response: pb.DecideResponse = await self._stub.Decide(request, **self._call())
        return response

    async def publish(self, envelopes: Iterable[pb.AgentEnvelope]) -> list[int]:
        """Append external events; their offsets, 0 for a refused one (see ``publish_report``)."""
        return list((await self.publish_report(envelopes)).offsets)

    async def publish_report(self, envelopes: Iterable[pb.AgentEnvelope]) -> pb.PublishResponse:
        """Append external events; each one's offset, and its problem if it was refused."""
        request = pb.PublishRequest(envelopes=envelopes)
        response: pb.PublishResponse = await self._stub.Publish(request, **self._call())
        return response

    async def status(self) -> pb.StatusResponse:
        """How many intents are in each state, and the log's head offset."""
        response: pb.StatusResponse = await self._stub.Status(pb.StatusRequest(), **self._call())
        return response

    async def list_intents(self, state: pb.IntentState, *, limit: int = 0) -> list[pb.ToolIntent]:
        """Intents in ``state``, oldest first; ``limit`` 0 means the server's default."""
        request = pb.ListIntentsRequest(state=state, limit=limit)
        return list((await self._stub.ListIntents(request, **self._call())).intents)

    async def policies(self, limit: int = 0) -> pb.PoliciesResponse:
        """The effect policy in force and its newest ``limit`` decisions (0: the default)."""
        request = pb.PoliciesRequest(limit=limit)
        response: pb.PoliciesResponse = await self._stub.Policies(request, **self._call())
        return response

    async def budgets(self, limit: int = 0) -> list[pb.BudgetWindow]:
        """The newest fleet budget windows (``limit`` 0: the server's default)."""
        response = await self._stub.Budgets(pb.BudgetsRequest(limit=limit), **self._call())
        return list(response.windows)

    async def lease_budget(self, request: pb.LeaseBudgetRequest) -> pb.LeaseBudgetResponse:
        """Lease an allowance of a fleet budget's window (see ``LeaseBudgetRequest``)."""
        response: pb.LeaseBudgetResponse = await self._stub.LeaseBudget(request, **self._call())
        return response

    async def list_failed(self, *, limit: int = 0) -> list[tuple[pb.ToolIntent, pb.ToolResult]]:
        """DONE intents whose result is not OK, each with it, oldest first (``limit`` as above)."""
        request = pb.ListIntentsRequest(state=pb.IntentState.DONE, limit=limit, failed_only=True)
        response = await self._stub.ListIntents(request, **self._call())
        return list(zip(response.intents, response.results, strict=True))

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

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
