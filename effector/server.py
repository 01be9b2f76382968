"""The effector process: its settings, bearer-token auth, and lifecycle.

:class:`EffectorServer` serves one store, tool registry and worker over ``grpc.aio``. Its web
endpoints (console, MCP) come from binders it is given, so this module never imports
:mod:`effector.console`: :func:`effector.launch.running_server` gives them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from beam_agents._protos import (
    MAX_TEXT_FIELD_CHARS,
)
from beam_agents.tools import ToolRegistry
from effector.observability import EffectorMetrics
from effector.policy import LivePolicy, PolicyError, unknown_tools
from effector.service import (
    DEFAULT_BUDGET_LEASE_MS,
    EFFECTOR_SERVICE,
    MAX_MESSAGE_BYTES,
    EffectorService,
    Tokens,
    add_effector_service,
    format_host_port,
    is_loopback_host,
    parse_host_port,
)
from effector.store.errors import ConfigurationError
from effector.store.intents import wall_clock_ms
from effector.store.sql import SqlStore
from effector.worker import (
    DEFAULT_TELEMETRY_RETENTION_MS,
    EffectorToolRunner,
    Worker,
    WorkerSettings,
)

_log = logging.getLogger(__name__)


DEFAULT_MCP_IDENTITY = "mcp-operator"
"""The approver recorded for decisions made through the MCP endpoint, unless configured."""
_WEB_PACKAGES = ("starlette", "jinja2", "uvicorn", "python_multipart")
CONSOLE_PACKAGES = {"--console-listen": _WEB_PACKAGES, "--mcp-listen": (*_WEB_PACKAGES, "mcp")}
"""What each optional endpoint imports: the ``[console]`` extra installs them all."""


def check_console_installed(flag: str) -> None:
    """Refuse ``flag`` (``--console-listen``, ``--mcp-listen``) without the ``[console]`` extra."""
    for package in CONSOLE_PACKAGES[flag]:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigurationError(
                f"{flag} needs the optional package {package!r}, which is not installed: "
                "pip install 'beam-agents[console]'"
            )


def check_token(token: str | None) -> None:
    """Refuse an empty token (all whitespace counts as empty)."""
    if token is not None and not token.strip():
        raise ConfigurationError("the token is empty")


def check_tls_pair(certificate: object | None, key: object | None) -> None:
    """Refuse a TLS certificate (PEM or path) without its private key, or a key without one."""
    if (certificate is None) != (key is None):
        raise ConfigurationError(
            "TLS needs both a certificate and its private key (--tls-cert and --tls-key go "
            "together)"
        )


_HEALTH_METHOD_PREFIX = f"/{health.SERVICE_NAME}/"


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every RPC but health checks unless it carries ``authorization: Bearer <token>``."""

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


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Everything an :class:`EffectorServer` needs besides its store and tools."""

    listen: str = "127.0.0.1:0"
    """``HOST:PORT`` to bind; port 0 picks a free port."""
    token: str | None = field(default=None, repr=False)
    """Shared secret every RPC but health checks must present as ``Bearer <token>``."""
    tokens: Tokens | None = field(default=None, repr=False)
    """Named tokens (:class:`Tokens`), any of which is accepted; ``token`` is their first."""
    tls_cert: bytes | None = field(default=None, repr=False)
    """PEM certificate chain; with ``tls_key`` the server speaks TLS only."""
    tls_key: bytes | None = field(default=None, repr=False)
    """PEM private key for ``tls_cert``."""
    allow_insecure_bind: bool = False
    """Permit a non-loopback ``listen`` without a token (anyone who can connect may submit)."""
    metrics_listen: str | None = None
    """``HOST:PORT`` for the Prometheus endpoint; ``None`` serves no metrics."""
    console_listen: str | None = None
    """``HOST:PORT`` for the web console; ``None`` serves no console."""
    mcp_listen: str | None = None
    """``HOST:PORT`` for the operator MCP endpoint; ``None`` serves none."""
    mcp_identity: str = DEFAULT_MCP_IDENTITY
    """The identity configured for the token: recorded as the approver of MCP decisions."""
    tool_timeout_ms: int = 30_000
    """How long one tool call may run."""
    telemetry_retention_s: int = DEFAULT_TELEMETRY_RETENTION_MS // 1000
    """How long stored trace events and error records are kept (7 days)."""
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    """How the worker claims, leases, retains and polls."""
    policy_file: str | None = None
    """The effect policy file (TOML with CEL rules) every TOOL intent passes at intake."""
    budget_lease_ms: int = DEFAULT_BUDGET_LEASE_MS
    """How long a fleet budget allowance lasts; a dead worker's unspent part returns after it."""

    def __post_init__(self) -> None:
        if self.tokens is not None and self.token is None:  # named tokens alone still guard
            object.__setattr__(self, "token", self.tokens.primary)

    @property
    def tls(self) -> tuple[bytes, bytes] | None:
        """The certificate chain and its key, if the effector speaks TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return self.tls_cert, self.tls_key

    def check(self) -> tuple[str, int]:
        """Validate the combination (the one validation); returns the parsed listen address."""
        host, port = parse_host_port(self.listen)
        self._check_open_bind(host, "listen")
        if self.console_listen is not None:
            self._check_open_bind(parse_host_port(self.console_listen)[0], "serve the console")
            check_console_installed("--console-listen")
        if self.mcp_listen is not None:
            self._check_mcp()
        check_tls_pair(self.tls_cert, self.tls_key)
        check_token(self.token)
        if self.metrics_listen is not None:
            parse_host_port(self.metrics_listen)
        if self.telemetry_retention_s <= 0:
            raise ConfigurationError(
                f"the telemetry retention must be positive, got {self.telemetry_retention_s} s"
            )
        return host, port

    def _check_mcp(self) -> None:
        """Validate the MCP endpoint's address and identity, and that its packages are installed."""
        assert self.mcp_listen is not None
        host = parse_host_port(self.mcp_listen)[0]
        if not self.token and not is_loopback_host(host):  # approvals: no insecure override
            raise ConfigurationError(
                f"refusing to serve the MCP endpoint on non-loopback {host!r} without a token "
                "(--token-file): whoever reaches it can approve"
            )
        identity = self.mcp_identity
        if not identity.strip() or len(identity) > MAX_TEXT_FIELD_CHARS:
            raise ConfigurationError(
                f"the MCP identity must be a name of 1 to {MAX_TEXT_FIELD_CHARS} characters"
            )
        check_console_installed("--mcp-listen")

    def _check_open_bind(self, host: str, what: str) -> None:
        """Refuse a non-loopback ``host`` without a token, unless insecure binds are allowed."""
        if not self.token and not is_loopback_host(host) and not self.allow_insecure_bind:
            raise ConfigurationError(
                f"refusing to {what} on non-loopback {host!r} without a token; set a token "
                "(--token-file) or pass --allow-insecure-bind"
            )


def _open_policy(settings: ServerSettings, clock: Callable[[], int]) -> LivePolicy:
    assert settings.policy_file is not None
    try:
        return LivePolicy.open(settings.policy_file, clock())
    except PolicyError as exc:
        raise ConfigurationError(f"--policy: {exc}") from None


class WebEndpoint(Protocol):
    """A web server beside the RPCs, bound when made; the effector starts and stops it."""

    port: int
    https: bool
    path: str

    async def start(self) -> None:
        """Serve; returns once it accepts connections."""

    async def stop(self) -> None:
        """Stop serving and release the socket."""


EndpointBinder = Callable[[EffectorService, ServerSettings], WebEndpoint]
"""Binds a web endpoint for the service, as the settings say (bound, not started)."""


class EffectorServer:
    """One running effector: gRPC, health, reflection, worker, metrics, console, MCP endpoint."""

    def __init__(
        self,
        store: SqlStore,
        registry: ToolRegistry,
        settings: ServerSettings,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        bind_console: EndpointBinder | None = None,
        bind_mcp: EndpointBinder | None = None,
    ) -> None:
        self.store = store
        """The store this server records in (opened, and closed, by whoever made the server)."""
        self._settings = settings
        self.metrics = EffectorMetrics()
        runner = EffectorToolRunner(settings.tool_timeout_ms)
        self._worker = Worker(
            store,
            registry,
            runner,
            self.metrics,
            settings.worker,
            clock=clock,
            telemetry_retention_ms=settings.telemetry_retention_s * 1000,
        )
        tokens = settings.tokens or (Tokens.single(settings.token) if settings.token else None)
        self._clock = clock
        self.policy = None if settings.policy_file is None else _open_policy(settings, clock)
        """The effect policy in force (``None``: every effect is allowed)."""
        self._policy_watch: asyncio.Task[None] | None = None
        self._service = EffectorService(
            store,
            registry,
            self._worker,
            self.metrics,
            clock,
            tokens=tokens,
            policy=self.policy,
            budget_lease_ms=settings.budget_lease_ms,
        )
        self._read_only_tools = sorted(tool.name for tool in registry if not tool.side_effect)
        self._effect_tools = {tool.name for tool in registry if tool.side_effect}
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._host = ""
        self._port = 0
        self._metrics_port: int | None = None
        self._binders = {"--console-listen": bind_console, "--mcp-listen": bind_mcp}
        self._console: WebEndpoint | None = None
        self._mcp: WebEndpoint | None = None
        self._worker_started = False

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

    @property
    def console_port(self) -> int | None:
        """The web console's port, if the console is served."""
        return None if self._console is None else self._console.port

    @property
    def console_url(self) -> str | None:
        """The web console's address (``https://`` with TLS), if the console is served."""
        return _url(self._console, self._settings.console_listen)

    @property
    def mcp_port(self) -> int | None:
        """The operator MCP endpoint's port, if it is served."""
        return None if self._mcp is None else self._mcp.port

    @property
    def mcp_url(self) -> str | None:
        """The operator MCP endpoint's URL (``https://`` with TLS), if it is served."""
        return _url(self._mcp, self._settings.mcp_listen)

    @property
    def service(self) -> EffectorService:
        """The service behind the RPCs (and the console)."""
        return self._service

    async def start(self) -> None:
        """Bind, serve and start the worker; on failure, stop what started and raise."""
        settings = self._settings
        host, port = settings.check()
        self._console = self._bind_endpoint("--console-listen", settings.console_listen)
        try:
            self._mcp = self._bind_endpoint("--mcp-listen", settings.mcp_listen)
            server, bound = self._bind_grpc(host, port)
            self._server, self._host, self._port = server, host, bound
            if settings.metrics_listen is not None:
                metrics_host, metrics_port = parse_host_port(settings.metrics_listen)
                try:
                    self._metrics_port = self.metrics.serve(metrics_host, metrics_port)
                except OSError as exc:
                    raise ConfigurationError(
                        f"cannot serve metrics on {settings.metrics_listen}: {exc.strerror}"
                    ) from None
            await server.start()
            if self.policy is not None:
                self._policy_watch = asyncio.create_task(
                    self._watch_policy(), name="effector-policy-watch"
                )
            await self._health.set(EFFECTOR_SERVICE, health_pb2.HealthCheckResponse.SERVING)
            self._worker.start()
            self._worker_started = True
            _log.info("effector listening on %s (worker %s)", self.address, self._worker.owner)
            if self._console is not None:
                await self._console.start()
                _log.info("effector console on %s", self.console_url)
            if self._mcp is not None:
                await self._mcp.start()
                _log.info(
                    "effector mcp on %s (deciding as %r)", self.mcp_url, settings.mcp_identity
                )
        except BaseException:
            await self._stop_parts(rpc_grace_s=0)
            raise
        self._warn_about_settings()

    def _bind_grpc(self, host: str, port: int) -> tuple[grpc.aio.Server, int]:
        """The gRPC server with its services, bound (not started); and the bound port."""
        settings = self._settings
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if settings.token:
            interceptors.append(BearerTokenInterceptor(self._service.tokens or settings.token))
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
            if settings.tls is not None:
                certificate, key = settings.tls
                credentials = grpc.ssl_server_credentials([(key, certificate)])
                bound = server.add_secure_port(address, credentials)
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ConfigurationError(f"cannot listen on {address}: {exc}") from None
        if not bound:
            raise ConfigurationError(f"cannot listen on {address}")
        return server, bound

    def _warn_about_policy(self) -> None:
        if self.policy is None:
            return
        unknown = unknown_tools(self.policy.policy, self._effect_tools)
        if unknown:
            _log.warning(
                "the effect policy %s names tools the registry has no side-effecting tool for "
                "(a rule on them never matches): %s",
                self.policy.policy.source,
                ", ".join(unknown),
            )

    def _warn_about_settings(self) -> None:
        self._warn_about_policy()
        settings = self._settings
        if settings.worker.concurrency == 0:
            _log.warning("ingest-only (concurrency 0): this effector executes no intents")
        if self._read_only_tools:
            _log.warning(
                "the tool registry holds read-only tools, which the effector never executes (an "
                "intent naming one is REJECTED; agents run them inline with ctx.run_tool): %s",
                ", ".join(self._read_only_tools),
            )
        for endpoint, listen, what, exposed in (
            (
                self._console,
                settings.console_listen,
                "the console",
                "the token (at login) and the session cookie travel",
            ),
            (self._mcp, settings.mcp_listen, "the MCP endpoint", "the token travels"),
        ):
            if endpoint is None or listen is None or endpoint.https or not settings.token:
                continue
            host = parse_host_port(listen)[0]
            if not is_loopback_host(host):
                _log.warning(
                    "%s on non-loopback %s speaks plain HTTP: %s in clear text; serve it over "
                    "TLS (--tls-cert and --tls-key) or behind a TLS-terminating proxy",
                    what,
                    host,
                    exposed,
                )

    async def stop(self, rpc_grace_s: float = 1.0) -> None:
        """Drain: stop the endpoints and RPCs, let executions finish; the store stays open."""
        if self._server is None:
            return
        await self._stop_parts(rpc_grace_s)
        _log.info("effector stopped")

    def reload_policy(self, *, force: bool = True) -> bool:
        """Load the policy file again (SIGHUP); ``True`` if a new policy is now in force.

        A bad file keeps the last good policy, logs why and counts a reload failure.
        """
        if self.policy is None:
            return False
        replaced = self.policy.reload(self._clock(), force=force)
        if self.policy.reload_error and not replaced:
            self.metrics.policy_reload_failures.inc()
        if replaced:
            self._warn_about_policy()
        return replaced

    async def _watch_policy(self, interval_s: float = 1.0) -> None:
        """Reload the policy whenever its file changes."""
        assert self.policy is not None
        while True:
            await asyncio.sleep(interval_s)
            if self.policy.changed():
                self.reload_policy(force=False)

    async def _stop_parts(self, rpc_grace_s: float) -> None:
        """Stop whatever has started, each part even if stopping another one failed."""
        if self._policy_watch is not None:
            self._policy_watch.cancel()
            self._policy_watch = None
        console, self._console = self._console, None
        mcp, self._mcp = self._mcp, None
        server, self._server = self._server, None
        try:
            await self._health.enter_graceful_shutdown()
            try:
                if mcp is not None:
                    await mcp.stop()
            finally:
                if console is not None:
                    await console.stop()
        finally:
            try:
                if server is not None:
                    await server.stop(rpc_grace_s)
            finally:
                if self._worker_started:
                    self._worker_started = False
                    await self._worker.drain(self._settings.tool_timeout_ms / 1000 + 1.0)
                self.metrics.close()

    def _bind_endpoint(self, flag: str, listen: str | None) -> WebEndpoint | None:
        """The web endpoint ``flag`` asks for, bound but not started; ``None`` if not asked for."""
        if listen is None:
            return None
        binder = self._binders[flag]
        if binder is None:
            raise ConfigurationError(f"{flag}: this server was given no binder for it")
        return binder(self._service, self._settings)


def _url(endpoint: WebEndpoint | None, listen: str | None) -> str | None:
    if endpoint is None or listen is None:
        return None
    scheme = "https" if endpoint.https else "http"
    return (
        f"{scheme}://{format_host_port(parse_host_port(listen)[0], endpoint.port)}{endpoint.path}"
    )
