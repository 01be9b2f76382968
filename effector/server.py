"""The effector's gRPC server: the ``Effector`` service, health, reflection, auth and TLS.

``EffectorServer`` wires one store, one tool registry and one worker behind a ``grpc.aio``
server. Submit validates every intent and acknowledges each one in request order:

- a malformed id (not a canonical UUID) or an empty ``entity_key`` is REJECTED and **not**
  recorded: there is no key to publish a result to, and no id to deduplicate on;
- an intent with a usable id and key that fails validation (unknown kind, ``args_json`` not
  JSON, unknown tool, read-only tool, invalid arguments, an ``intent`` argument,
  ``expires_at_ms`` before ``created_at_ms``) is REJECTED **and recorded** as DONE with a
  REJECTED ``ToolResult`` that is published on the envelope log, so an agent suspended on it
  resumes and learns why; a resubmission is then a DUPLICATE carrying that result;
- an id already recorded with identical content is a DUPLICATE (with its state, and its
  result once DONE); with different content it is REJECTED as a conflict, the first kept;
  when the request sets ``redeliver_results``, a DUPLICATE whose intent is DONE also appends
  the envelope that published its result to the log again (same bytes, new offset), so a
  pipeline replaying from fresh state receives the result it waits for;
- anything else is ACCEPTED.

``ListIntents`` lists the intents in one state, oldest first (by first receipt), at most
``MAX_LIST_LIMIT`` per call: an approver's inbox is ``AWAITING_DECISION``.

Batches are limited (``MAX_SUBMIT_BATCH`` intents; ``MAX_MESSAGE_BYTES`` per message) and an
empty batch is INVALID_ARGUMENT. Errors never carry secrets, and a request the server cannot
handle is answered with a status code, never with a crash.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from beam_agents._protos import (
    AgentEnvelope,
    DecideRequest,
    DecideResponse,
    EffectorServicer,
    EnvelopeRecord,
    GetIntentRequest,
    GetIntentResponse,
    IntentState,
    ListIntentsRequest,
    ListIntentsResponse,
    PublishRequest,
    PublishResponse,
    ReadRequest,
    ReadResponse,
    StatusRequest,
    StatusResponse,
    SubmitAck,
    SubmitRequest,
    SubmitResponse,
)
from beam_agents._protos.effector_pb2 import DESCRIPTOR as _EFFECTOR_FILE
from beam_agents.tools import ToolRegistry
from effector.errors import ConfigurationError, StoreError
from effector.intents import identity_problem, intent_id_problem, wall_clock_ms
from effector.metrics import EffectorMetrics
from effector.runner import EffectorToolRunner, rejection_reason
from effector.store.base import EffectorStore, NewIntent, SubmitOutcome
from effector.worker import Worker, WorkerSettings

_log = logging.getLogger(__name__)

_EFFECTOR = _EFFECTOR_FILE.services_by_name["Effector"]
EFFECTOR_SERVICE = _EFFECTOR.full_name
"""The fully qualified gRPC service name, ``beam_agents.v1.Effector``."""

MAX_SUBMIT_BATCH = 1_000
"""The most intents one Submit may carry."""
MAX_PUBLISH_BATCH = 1_000
"""The most envelopes one Publish may carry."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest request or response message, in bytes."""
DEFAULT_READ_BATCH = 500
"""Envelopes per Read when the request leaves ``max_batch`` at 0."""
MAX_READ_BATCH = 5_000
"""The most envelopes one Read returns."""
MAX_READ_WAIT_MS = 60_000
"""The longest a Read waits for new envelopes."""
MAX_TEXT_FIELD_CHARS = 4_096
"""The longest ``approver`` or ``reason`` a Decide may carry."""
DEFAULT_LIST_LIMIT = 100
"""Intents per ListIntents when the request leaves ``limit`` at 0."""
MAX_LIST_LIMIT = 1_000
"""The most intents one ListIntents returns."""

_HEALTH_METHOD_PREFIX = f"/{health.SERVICE_NAME}/"

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class _RequestError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> _RequestError:
    return _RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_batch_size(count: int, limit: int, rpc: str, items: str) -> None:
    """Refuse an empty batch or one over ``limit``, saying which and what to do."""
    if count == 0:
        raise _invalid(f"empty batch: a {rpc} carries at least one {items[:-1]}")
    if count > limit:
        raise _invalid(f"batch of {count} {items} is over the limit of {limit}; split it")


@dataclass(frozen=True, slots=True)
class _UndecodableRequest:
    """Stands in for a request whose bytes did not parse, so the RPC can refuse it properly."""

    problem: str


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except DecodeError as exc:
            return _UndecodableRequest(str(exc))

    return parse


def add_effector_service(servicer: EffectorServicer, server: grpc.aio.Server) -> None:
    """Register the Effector RPCs on ``server`` with parsers that tolerate undecodable bytes.

    Left to the generated registration, gRPC reports a request that fails to parse as
    UNKNOWN, with the parser's exception in the details; here such a request reaches its RPC
    as an :class:`_UndecodableRequest`, which answers INVALID_ARGUMENT. Wrapping the parsers
    once, at registration, costs nothing per call (a server interceptor would run per call).
    """
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=_tolerant(GetMessageClass(method.input_type).FromString),
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
        for method in _EFFECTOR.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(EFFECTOR_SERVICE, handlers),)
    )
    server.add_registered_method_handlers(EFFECTOR_SERVICE, handlers)


def _guarded(
    method: Callable[[Any, _Request, grpc.aio.ServicerContext], Awaitable[_Response]],
) -> Callable[[Any, _Request, grpc.aio.ServicerContext], Awaitable[_Response]]:
    """Turn every failure of an RPC into a status code with a message safe to show."""

    @functools.wraps(method)
    async def handler(self: Any, request: _Request, context: grpc.aio.ServicerContext) -> _Response:
        try:
            if isinstance(request, _UndecodableRequest):
                raise _invalid(f"the request is not a valid protobuf message: {request.problem}")
            return await method(self, request, context)
        except _RequestError as exc:
            await context.abort(exc.code, exc.message)
        except StoreError as exc:
            _log.warning("%s failed: %s", method.__name__, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the effector's store is unavailable")
        except Exception:
            _log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error in the effector")
        raise AssertionError("context.abort always raises")

    return handler


_LISTABLE_STATES = (
    IntentState.PENDING,
    IntentState.RUNNING,
    IntentState.AWAITING_DECISION,
    IntentState.DONE,
)


def _check_intent_id(intent_id: str) -> None:
    problem = intent_id_problem(intent_id)
    if problem is not None:
        raise _invalid(problem)


class EffectorService(EffectorServicer):
    """The ``beam_agents.v1.Effector`` RPCs over one store (see the module docstring)."""

    def __init__(
        self,
        store: EffectorStore,
        registry: ToolRegistry,
        worker: Worker,
        metrics: EffectorMetrics,
        clock: Callable[[], int],
    ) -> None:
        self._store = store
        self._registry = registry
        self._worker = worker
        self._metrics = metrics
        self._clock = clock

    @_guarded
    async def Submit(
        self, request: SubmitRequest, context: grpc.aio.ServicerContext
    ) -> SubmitResponse:
        """Record a batch of intents; one acknowledgement per intent, in request order."""
        _check_batch_size(len(request.intents), MAX_SUBMIT_BATCH, "Submit", "intents")
        acks: list[SubmitAck] = []
        to_record: list[NewIntent] = []
        for intent in request.intents:
            problem = identity_problem(intent)
            if problem is None:
                to_record.append(NewIntent(intent, rejection_reason(self._registry, intent)))
                acks.append(SubmitAck(intent_id=intent.intent_id))
            else:
                acks.append(
                    SubmitAck(
                        intent_id=intent.intent_id[:128], outcome=SubmitAck.REJECTED, reason=problem
                    )
                )
                self._metrics.rejected.labels("malformed").inc()
        positions = [
            i for i, ack in enumerate(acks) if ack.outcome == SubmitAck.OUTCOME_UNSPECIFIED
        ]
        answers = (
            await self._store.submit(
                to_record, self._clock(), redeliver_results=request.redeliver_results
            )
            if to_record
            else []
        )
        accepted = 0
        for position, new, answer in zip(positions, to_record, answers, strict=True):
            ack = acks[position]
            ack.state = answer.state
            if answer.result is not None:
                ack.result.CopyFrom(answer.result)
            if answer.outcome is SubmitOutcome.DUPLICATE:
                ack.outcome = SubmitAck.DUPLICATE
                self._metrics.duplicates.inc()
                if answer.redelivered:
                    self._metrics.redelivered.inc()
            elif answer.outcome is SubmitOutcome.CONFLICT:
                ack.outcome = SubmitAck.REJECTED
                ack.reason = (
                    f"conflict: intent {new.intent.intent_id} is already recorded with different "
                    "content; the first submission is kept"
                )
                self._metrics.rejected.labels("conflict").inc()
            elif new.rejection is not None:
                ack.outcome = SubmitAck.REJECTED
                ack.reason = new.rejection
                self._metrics.rejected.labels("invalid").inc()
            else:
                ack.outcome = SubmitAck.ACCEPTED
                accepted += 1
        if accepted:
            self._metrics.accepted.inc(accepted)
            self._worker.wake()
        return SubmitResponse(acks=acks)

    @_guarded
    async def Read(self, request: ReadRequest, context: grpc.aio.ServicerContext) -> ReadResponse:
        """Envelopes from an offset, in order; waits up to ``wait_ms`` if there are none yet."""
        if request.from_offset < 0 or request.max_batch < 0 or request.wait_ms < 0:
            raise _invalid("from_offset, max_batch and wait_ms must not be negative")
        from_offset = max(request.from_offset, 1)
        limit = min(request.max_batch or DEFAULT_READ_BATCH, MAX_READ_BATCH)
        records = await self._store.read(from_offset, limit)
        if not records and request.wait_ms:
            await self._store.wait_for_offset(
                from_offset, min(request.wait_ms, MAX_READ_WAIT_MS) / 1000
            )
            records = await self._store.read(from_offset, limit)
        return ReadResponse(
            records=[EnvelopeRecord(offset=r.offset, envelope=r.envelope) for r in records],
            next_offset=records[-1].offset + 1 if records else from_offset,
        )

    @_guarded
    async def GetIntent(
        self, request: GetIntentRequest, context: grpc.aio.ServicerContext
    ) -> GetIntentResponse:
        """Everything recorded about one intent; ``found`` is false if it is unknown."""
        _check_intent_id(request.intent_id)
        record = await self._store.get_intent(request.intent_id)
        if record is None:
            return GetIntentResponse(found=False)
        return GetIntentResponse(
            found=True,
            state=record.state,
            intent=record.intent,
            result=record.result,
            attempts=record.attempts,
        )

    @_guarded
    async def Decide(
        self, request: DecideRequest, context: grpc.aio.ServicerContext
    ) -> DecideResponse:
        """Record an approve/deny decision on an approval intent and publish it."""
        _check_intent_id(request.intent_id)
        for name in ("approver", "reason"):
            if len(getattr(request, name)) > MAX_TEXT_FIELD_CHARS:
                raise _invalid(f"{name} is longer than {MAX_TEXT_FIELD_CHARS} characters")
        decision = await self._store.decide(
            request.intent_id,
            approved=request.approved,
            approver=request.approver,
            reason=request.reason,
            now_ms=self._clock(),
        )
        return DecideResponse(
            applied=decision.applied,
            state=decision.state,
            reason=decision.reason,
            result=decision.result,
        )

    @_guarded
    async def Publish(
        self, request: PublishRequest, context: grpc.aio.ServicerContext
    ) -> PublishResponse:
        """Append external events to the envelope log (an event time of 0 is stamped now)."""
        _check_batch_size(len(request.envelopes), MAX_PUBLISH_BATCH, "Publish", "envelopes")
        now = self._clock()
        envelopes: list[AgentEnvelope] = []
        for position, envelope in enumerate(request.envelopes):
            if not envelope.entity_key:
                raise _invalid(f"envelope {position} has an empty entity_key")
            if envelope.WhichOneof("payload") != "external_event":
                raise _invalid(
                    f"envelope {position} is not an external_event: tool results and approvals "
                    "are published only by the effector itself"
                )
            stamped = AgentEnvelope()
            stamped.CopyFrom(envelope)
            if not stamped.event_time_ms:
                stamped.event_time_ms = now
            envelopes.append(stamped)
        return PublishResponse(offsets=await self._store.publish(envelopes, now))

    @_guarded
    async def ListIntents(
        self, request: ListIntentsRequest, context: grpc.aio.ServicerContext
    ) -> ListIntentsResponse:
        """Intents in one state, oldest first (by first receipt), at most ``limit``."""
        if request.state not in _LISTABLE_STATES:
            raise _invalid(
                f"state must be one of {', '.join(IntentState.Name(s) for s in _LISTABLE_STATES)}"
                f", got {request.state}"
            )
        if request.limit < 0:
            raise _invalid("limit must not be negative")
        limit = min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        return ListIntentsResponse(intents=await self._store.list_intents(request.state, limit))

    @_guarded
    async def Status(
        self, request: StatusRequest, context: grpc.aio.ServicerContext
    ) -> StatusResponse:
        """How many intents are in each state, and the head of the envelope log."""
        counts = await self._store.counts()
        return StatusResponse(
            pending=counts.pending,
            running=counts.running,
            awaiting_decision=counts.awaiting_decision,
            done=counts.done,
            head_offset=counts.head_offset,
            in_flight=counts.pending + counts.running + counts.awaiting_decision,
        )


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every RPC but health checks unless it carries ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

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
        if hmac.compare_digest(supplied, self._expected):
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


def parse_host_port(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 means any free port."""
    host, separator, port_text = text.rpartition(":")
    if not separator or not host or not port_text.isdigit():
        raise ConfigurationError(f"expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if port > 65_535:
        raise ConfigurationError(f"port {port} is out of range in {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def format_host_port(host: str, port: int) -> str:
    """Join a host and port the way gRPC targets spell them (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; any other name counts as non-loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Everything an :class:`EffectorServer` needs besides its store and tools."""

    listen: str = "127.0.0.1:0"
    """``HOST:PORT`` to bind; port 0 picks a free port."""
    token: str | None = field(default=None, repr=False)
    """Shared secret every RPC but health checks must present as ``Bearer <token>``."""
    tls_cert: bytes | None = field(default=None, repr=False)
    """PEM certificate chain; with ``tls_key`` the server speaks TLS only."""
    tls_key: bytes | None = field(default=None, repr=False)
    """PEM private key for ``tls_cert``."""
    allow_insecure_bind: bool = False
    """Permit a non-loopback ``listen`` without a token (anyone who can connect may submit)."""
    metrics_listen: str | None = None
    """``HOST:PORT`` for the Prometheus endpoint; ``None`` serves no metrics."""
    tool_timeout_ms: int = 30_000
    """How long one tool call may run."""
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    """How the worker claims, leases, retains and polls."""

    def check(self) -> tuple[str, int]:
        """Validate the combination; returns the parsed listen address."""
        host, port = parse_host_port(self.listen)
        if not self.token and not is_loopback_host(host) and not self.allow_insecure_bind:
            raise ConfigurationError(
                f"refusing to listen on non-loopback {host!r} without a token; set a token "
                "(--token-file) or pass --allow-insecure-bind"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigurationError("TLS needs both a certificate and its private key")
        if self.token is not None and not self.token.strip():
            raise ConfigurationError("the token is empty")
        if self.metrics_listen is not None:
            parse_host_port(self.metrics_listen)
        return host, port


class EffectorServer:
    """One running effector: gRPC service, health, reflection, worker and metrics."""

    def __init__(
        self,
        store: EffectorStore,
        registry: ToolRegistry,
        settings: ServerSettings,
        *,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._store = store
        self._registry = registry
        self._settings = settings
        self._clock = clock
        self.metrics = EffectorMetrics()
        self._worker = Worker(
            store,
            registry,
            EffectorToolRunner(settings.tool_timeout_ms),
            self.metrics,
            settings.worker,
            clock=clock,
        )
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._host = ""
        self._port = 0
        self._metrics_port: int | None = None

    @property
    def address(self) -> str:
        """The bound ``HOST:PORT`` (the real port when 0 was asked for)."""
        return format_host_port(self._host, self._port)

    @property
    def port(self) -> int:
        """The bound port."""
        return self._port

    @property
    def metrics_port(self) -> int | None:
        """The Prometheus endpoint's port, if metrics are served."""
        return self._metrics_port

    async def start(self) -> None:
        """Bind, start serving and start the worker; raises ``ConfigurationError`` on bad setup."""
        settings = self._settings
        host, port = settings.check()
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if settings.token:
            interceptors.append(BearerTokenInterceptor(settings.token))
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # gRPC enables SO_REUSEPORT by default, which would let a second server bind a
                # port that is already serving instead of failing.
                ("grpc.so_reuseport", 0),
            ],
        )
        add_effector_service(
            EffectorService(self._store, self._registry, self._worker, self.metrics, self._clock),
            server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            [EFFECTOR_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        address = format_host_port(host, port)
        try:
            if settings.tls_cert is not None and settings.tls_key is not None:
                credentials = grpc.ssl_server_credentials([(settings.tls_key, settings.tls_cert)])
                bound = server.add_secure_port(address, credentials)
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ConfigurationError(f"cannot listen on {address}: {exc}") from None
        if not bound:
            raise ConfigurationError(f"cannot listen on {address}")
        if settings.metrics_listen is not None:
            metrics_host, metrics_port = parse_host_port(settings.metrics_listen)
            try:
                self._metrics_port = self.metrics.serve(metrics_host, metrics_port)
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot serve metrics on {settings.metrics_listen}: {exc.strerror}"
                ) from None
        await server.start()
        self._server, self._host, self._port = server, host, bound
        await self._health.set(EFFECTOR_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._worker.start()
        _log.info("effector listening on %s (worker %s)", self.address, self._worker.owner)
        if settings.worker.concurrency == 0:
            _log.warning("ingest-only (concurrency 0): this effector executes no intents")

    async def stop(self, rpc_grace_s: float = 1.0) -> None:
        """Drain: stop accepting RPCs, let executions finish (or release them), stop metrics.

        Executions get the tool timeout plus a second to finish; the store stays open, and
        closing it is the caller's (it opened it).
        """
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(rpc_grace_s)
        await self._worker.drain(self._settings.tool_timeout_ms / 1000 + 1.0)
        self.metrics.close()
        self._server = None
        _log.info("effector stopped")
