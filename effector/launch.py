"""Start an effector: :func:`running_server`, and for a ``with`` block a subprocess or a thread.

:func:`running_server` is the one place that wires in the console and the operator MCP endpoint
(:mod:`effector.console`, loaded only when asked). Here too: the lines ``serve`` prints.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

from beam_agents.tools import ToolRegistry
from effector.server import EffectorServer, ServerSettings, WebEndpoint
from effector.service import EffectorService, is_loopback_host, parse_host_port
from effector.store import open_store
from effector.store.intents import wall_clock_ms

_T = TypeVar("_T")

LOOPBACK = "127.0.0.1"
ENV_PREFIX = "BEAM_AGENTS_EFFECTOR_"
READY_PREFIX = "effector listening on "
"""``serve`` prints this and the bound ``HOST:PORT`` on stdout once it is ready."""
CONSOLE_PREFIX = "effector console on "
"""With a console, ``serve`` prints this and its URL on the line after the ready line."""
MCP_PREFIX = "effector mcp on "
"""With ``--mcp-listen``, ``serve`` prints this and the endpoint's URL after the console's."""
METRICS_PREFIX = "effector metrics on "
"""With ``--metrics-listen``, ``serve`` prints this and the metrics URL (its real port) last."""


def env_name(flag: str) -> str:
    """The environment variable that supplies ``--flag``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def bind_console(service: EffectorService, settings: ServerSettings) -> WebEndpoint:
    """The web console's server, bound but not started."""
    # Imported here: an effector without a console never loads Starlette, Jinja2 or uvicorn.
    from effector.console.app import create_app
    from effector.console.serve import ConsoleServer

    assert settings.console_listen is not None
    host, port = parse_host_port(settings.console_listen)
    app = create_app(
        service,
        token=settings.token,
        tokens=service.tokens,
        loopback_only=not settings.token and is_loopback_host(host),
        https=settings.tls is not None,
    )
    return ConsoleServer(app, host, port, tls=settings.tls)


def bind_mcp(service: EffectorService, settings: ServerSettings) -> WebEndpoint:
    """The operator MCP endpoint's server, bound but not started."""
    # Imported here: an effector without the endpoint never loads the MCP SDK.
    from effector.console.mcp import bind_mcp_endpoint

    assert settings.mcp_listen is not None
    host, port = parse_host_port(settings.mcp_listen)
    return bind_mcp_endpoint(
        service, host, port, identity=settings.mcp_identity, token=settings.token, tls=settings.tls
    )


@asynccontextmanager
async def running_server(
    store_url: str,
    registry: ToolRegistry,
    settings: ServerSettings,
    *,
    clock: Callable[[], int] = wall_clock_ms,
) -> AsyncIterator[EffectorServer]:
    """Serve the store at ``store_url`` (console and MCP endpoint as asked) for a ``with`` block."""
    store = await open_store(store_url)
    try:
        server = EffectorServer(
            store, registry, settings, clock=clock, bind_console=bind_console, bind_mcp=bind_mcp
        )
        await server.start()
        try:
            yield server
        finally:
            await server.stop()
    finally:
        await store.close()


class EffectorStartError(RuntimeError):
    """The effector did not become ready; the message ends with the tail of its log."""


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound for a moment, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def child_environment(*importable: str | Path, **overrides: str) -> dict[str, str]:
    """The environment for a child: ours, ``importable`` first on ``PYTHONPATH``, ``overrides``."""
    environment = dict(os.environ)
    paths = [*map(str, importable), environment.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    environment.update(overrides)
    return environment


class EffectorProcess:
    """``python -m effector serve ARGS`` as a subprocess, ready once it prints its address.

    ``command`` replaces the whole command line (it must print ``ready_prefix`` and the address
    first). Stderr goes to ``log``, else to a temporary file. Leaving the ``with`` block sends
    ``stop_signal``, then SIGKILL after ``stop_timeout_s``.
    """

    def __init__(
        self,
        *args: str,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log: IO[str] | Path | None = None,
        ready_prefix: str = READY_PREFIX,
        ready_timeout_s: float = 60.0,
        stop_signal: int = signal.SIGTERM,
        stop_timeout_s: float = 30.0,
    ) -> None:
        if command is not None and args:
            raise ValueError("give the serve arguments or a whole command, not both")
        self.command = list(command or [sys.executable, "-m", "effector", "serve", *args])
        self._owns_log = log is None or isinstance(log, Path)
        if log is None:
            log = tempfile.TemporaryFile("a+")  # noqa: SIM115 - closed in stop()
        elif isinstance(log, Path):
            log = log.open("w")
        self._log: IO[str] = log
        self._stop_signal = stop_signal
        self._stop_timeout_s = stop_timeout_s
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
        self.address = self._await_ready(ready_prefix, ready_timeout_s)
        self.console_url: str | None = None
        """The web console's URL, when the command line or the environment asks for one."""
        environment = os.environ if env is None else env
        if environment.get(env_name("--console-listen")) or any(
            arg.startswith("--console-listen") for arg in self.command
        ):
            self.console_url = self._console_line()

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def _await_ready(self, prefix: str, timeout_s: float) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if line.startswith(prefix):
            return line.strip().removeprefix(prefix)
        self.process.kill()
        self.process.wait(timeout=30)
        tail = "\n".join(self.stderr().strip().splitlines()[-20:])
        self._close_files()
        raise EffectorStartError(
            f"{' '.join(self.command[1:5])} did not start (first line {line!r}); "
            f"its log ends:\n{tail}"
        )

    def _console_line(self) -> str:
        # Printed right after the ready line, which the read of that line may have buffered
        # already: read it without waiting for the pipe to be readable.
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith(CONSOLE_PREFIX):
            self.stop()
            raise EffectorStartError(
                f"expected the console's URL after the ready line, got {line!r}"
            )
        return line.strip().removeprefix(CONSOLE_PREFIX)

    def stderr(self) -> str:
        """Everything the process has written to its log so far."""
        self._log.flush()
        if isinstance(self._log.name, str) and os.path.exists(self._log.name):
            return Path(self._log.name).read_text(errors="replace")
        self._log.seek(0)  # an anonymous file in append mode: the process's writes stay at its end
        return self._log.read()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process."""
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = 60) -> int:
        """Wait for the process to exit; returns its exit status."""
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> None:
        """Stop the process if it still runs (see the class doc), and release its files."""
        if self.process.poll() is None:
            self.process.send_signal(self._stop_signal)
            try:
                self.process.wait(timeout=self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_files()

    def _close_files(self) -> None:
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self._owns_log:
            self._log.close()

    def __enter__(self) -> EffectorProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class EffectorThread:
    """An effector serving in this process, from an event loop on a thread of its own."""

    def __init__(
        self,
        store_url: str,
        registry: ToolRegistry,
        settings: ServerSettings | None = None,
        *,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="effector", daemon=True)
        self._thread.start()
        self._serving = running_server(store_url, registry, settings or ServerSettings())
        try:
            self.server: EffectorServer = self.run(self._serving.__aenter__(), ready_timeout_s)
        except BaseException:
            self._stop_loop()
            raise
        self.address = self.server.address
        self.port = self.server.port
        self.console_url = self.server.console_url
        """The web console's URL (``settings.console_listen``; port 0 picks one), or ``None``."""

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float = 60) -> _T:
        """Run ``coroutine`` on the effector's event loop; returns its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def close(self) -> None:
        """Drain the server and close the store; idempotent."""
        if self._loop.is_closed():
            return
        try:
            self.run(self._serving.__aexit__(None, None, None))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> EffectorThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
