"""Real MCP servers for the tests: ``ticket_server.py`` over stdio and over streamable HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from beam_agents.tools.mcp import McpServer
from beam_agents.tools.mcp._sessions import session_pool

# Every module's pipelines weigh Beam's state cache values without walking every module.
from tests.semantics.state_cache import module_walk_free_state_cache  # noqa: F401

HERE = Path(__file__).parent
TICKET_SERVER = str(HERE / "ticket_server.py")
RAW_SERVER = str(HERE / "raw_server.py")


def stdio_server(ledger: Path, **env: str) -> McpServer:
    """A ticket server the pool spawns itself (a fresh one per distinct environment)."""
    return McpServer.stdio(
        sys.executable,
        [TICKET_SERVER, "stdio"],
        env={"TICKET_LEDGER": str(ledger), **env},
        call_timeout_s=5,
    )


class HttpServerProcess:
    """A ticket server process on 127.0.0.1 serving streamable HTTP; stop() kills it."""

    def __init__(self, ledger: Path, port: int = 0, **env: str) -> None:
        environment = {"TICKET_LEDGER": str(ledger), "TICKET_PORT": str(port), **env}
        self.process = subprocess.Popen(
            [sys.executable, TICKET_SERVER, "http"],
            stdout=subprocess.PIPE,
            text=True,
            env={**_base_env(), **environment},
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline().split()
        assert ready and ready[0] == "ready", f"ticket server did not start: {ready}"
        self.port = int(ready[1])
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


def _base_env() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key.startswith(("PATH", "PYTHON"))}


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture(params=["stdio", "http"])
def ticket_server(request: pytest.FixtureRequest, ledger: Path) -> Iterator[McpServer]:
    """The ticket server over each transport (an HTTP one is stopped after the test)."""
    if request.param == "stdio":
        server = stdio_server(ledger)
        try:
            yield server
        finally:
            session_pool().forget(server)  # the pool's server process exits with its session
        return
    process = HttpServerProcess(ledger)
    server = McpServer.http(process.url, headers={"x-beam-test": "1"}, call_timeout_s=5)
    try:
        yield server
    finally:
        session_pool().forget(server)
        process.stop()
