"""Serving the console and the MCP endpoint with uvicorn on the effector's own event loop.

uvicorn installs no signal handlers and configures no logging; access logs are off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from effector.store.errors import ConfigurationError

_log = logging.getLogger(__name__)

_STOP_GRACE_S = 5


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the effector's process owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing."""
        yield


def _bind(host: str, port: int, what: str = "the console") -> socket.socket:
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, protocol)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve {what} on {host}:{port}: {exc}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
        listener.setblocking(False)
    except OSError as exc:
        listener.close()
        raise ConfigurationError(f"cannot serve {what} on {host}:{port}: {exc.strerror}") from None
    return listener


def tls_context(certificate: bytes, key: bytes, what: str = "the console") -> ssl.SSLContext:
    """A server TLS context for a PEM chain and key (written to a private temporary directory)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="effector-console-tls-") as directory:
        paths = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        for path, pem in zip(paths, (certificate, key), strict=True):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(pem)
        try:
            context.load_cert_chain(*paths)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigurationError(
                f"cannot serve {what} over TLS with the effector's certificate: {exc}"
            ) from None
    return context


class ConsoleServer:
    """An HTTP(S) server: bound on construction (a bad address or key fails then), started later.

    ``what`` names it in errors and logs; ``path`` ends its URL.
    """

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        *,
        tls: tuple[bytes, bytes] | None = None,
        what: str = "the console",
        path: str = "/",
        lifespan: bool = False,
    ) -> None:
        context = None if tls is None else tls_context(*tls, what=what)
        self._what = what
        self._socket = _bind(host, port, what)
        self.port: int = self._socket.getsockname()[1]
        """The bound port (the real one when 0 was asked for)."""
        self.https = context is not None
        """Whether the console speaks HTTPS."""
        self.path = path
        """The path its URL ends with."""
        factory: Callable[[uvicorn.Config, Callable[[], ssl.SSLContext]], ssl.SSLContext] | None
        factory = None if context is None else (lambda config, default: context)
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on" if lifespan else "off",
            ws="none",
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=_STOP_GRACE_S,
            ssl_context_factory=factory,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve from the running event loop; returns once the console accepts connections."""
        self._task = asyncio.create_task(self._server.serve([self._socket]), name=self._what)
        while not self._server.started:
            if self._task.done():
                failed, self._task = self._task, None
                failed.result()  # re-raises what stopped it
                raise ConfigurationError(f"{self._what} stopped while it started")
            await asyncio.sleep(0.01)
        self._task.add_done_callback(self._log_crash)

    def _log_crash(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            _log.error("%s stopped serving", self._what, exc_info=task.exception())

    async def stop(self) -> None:
        """Stop accepting connections, let open requests finish, and release the socket."""
        task, self._task = self._task, None
        try:
            if task is not None:
                self._server.should_exit = True
                await asyncio.wait([task])
        finally:
            # After a crash uvicorn did not shut down: stop listening and hang up here.
            for listening in getattr(self._server, "servers", ()):
                listening.close()
            for connection in list(self._server.server_state.connections):
                connection.shutdown()
            self._socket.close()
