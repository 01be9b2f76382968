"""The effector process: settings and their validation, addresses, auth, and lifecycle.

:class:`EffectorServer` wires one store, one tool registry and one worker behind a ``grpc.aio``
server (the :mod:`effector.service` RPCs, health, reflection, bearer-token auth, TLS).
:meth:`ServerSettings.check` is the one validation of a configuration, used by the command line
and the server alike; :func:`running_server` opens a store and serves it for a ``with`` block.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from beam_agents.tools import ToolRegistry
from effector.errors import ConfigurationError
from effector.intents import wall_clock_ms
from effector.metrics import EffectorMetrics
from effector.runner import EffectorToolRunner
from effector.service import (
    EFFECTOR_SERVICE,
    MAX_MESSAGE_BYTES,
    EffectorService,
    add_effector_service,
)
from effector.store import open_store
from effector.store.base import EffectorStore
from effector.worker import Worker, WorkerSettings

_log = logging.getLogger(__name__)

_HEALTH_METHOD_PREFIX = f"/{health.SERVICE_NAME}/"


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


def check_token(token: str | None) -> None:
    """Refuse an empty token (all whitespace counts as empty)."""
    if token is not None and not token.strip():
        raise ConfigurationError("the token is empty")


def check_tls_pair(certificate: object | None, key: object | None) -> None:
    """Refuse a TLS certificate without its private key, or a key without its certificate.

    Takes the PEM bytes or, before they are read, the paths they come from.
    """
    if (certificate is None) != (key is None):
        raise ConfigurationError(
            "TLS needs both a certificate and its private key (--tls-cert and --tls-key go "
            "together)"
        )


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
        """Validate the combination; returns the parsed listen address.

        The one validation of a configuration: the command line runs it before it loads the
        tools or opens the store, and :meth:`EffectorServer.start` before it binds.
        """
        host, port = parse_host_port(self.listen)
        if not self.token and not is_loopback_host(host) and not self.allow_insecure_bind:
            raise ConfigurationError(
                f"refusing to listen on non-loopback {host!r} without a token; set a token "
                "(--token-file) or pass --allow-insecure-bind"
            )
        check_tls_pair(self.tls_cert, self.tls_key)
        check_token(self.token)
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
        self.store = store
        """The store this server records in (opened, and closed, by whoever made the server)."""
        self._settings = settings
        self.metrics = EffectorMetrics()
        runner = EffectorToolRunner(settings.tool_timeout_ms)
        self._worker = Worker(store, registry, runner, self.metrics, settings.worker, clock=clock)
        self._service = EffectorService(store, registry, self._worker, self.metrics, clock)
        self._read_only_tools = sorted(tool.name for tool in registry if not tool.side_effect)
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
        add_effector_service(self._service, server)
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
        if self._read_only_tools:
            _log.warning(
                "the tool registry holds read-only tools, which the effector never executes (an "
                "intent naming one is REJECTED; agents run them inline with ctx.run_tool): %s",
                ", ".join(self._read_only_tools),
            )

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


@asynccontextmanager
async def running_server(
    store_url: str,
    registry: ToolRegistry,
    settings: ServerSettings,
    *,
    clock: Callable[[], int] = wall_clock_ms,
) -> AsyncIterator[EffectorServer]:
    """Open the store at ``store_url`` and serve it for the ``with`` block; then drain, close."""
    store = await open_store(store_url)
    try:
        server = EffectorServer(store, registry, settings, clock=clock)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()
    finally:
        await store.close()
