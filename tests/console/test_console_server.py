"""How the effector serves its console: settings, start and stop, the command line, launch.

The console runs on the effector's own event loop; it must leave the process's signal handlers
and logging as they were, refuse a non-loopback address without a token before anything binds,
and come up on port 0 with its URL known to whoever started the effector.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn
from effector_harness import self_signed_certificate

from beam_agents.tools import ToolRegistry
from effector import launch
from effector import server as server_module
from effector.client import AsyncEffectorClient
from effector.console import ConsoleServer
from effector.launch import env_name, running_server
from effector.server import ServerSettings
from effector.store.errors import ConfigurationError
from tests.console.harness import TOKEN, client_for, start_effector

REPO = Path(__file__).resolve().parents[2]
TOOLS = "tests.console.harness:empty_registry"


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "console.example"])
def test_a_non_loopback_console_needs_a_token(host: str) -> None:
    with pytest.raises(ConfigurationError, match="refusing to serve the console on non-loopback"):
        ServerSettings(console_listen=f"{host}:8080").check()
    ServerSettings(console_listen=f"{host}:8080", token="t").check()
    ServerSettings(console_listen=f"{host}:8080", allow_insecure_bind=True).check()
    ServerSettings(console_listen="localhost:8080").check()
    with pytest.raises(ConfigurationError, match="expected HOST:PORT"):
        ServerSettings(console_listen="8080").check()


def test_the_console_comes_up_on_a_free_port_and_goes_with_the_effector(tmp_path: Path) -> None:
    with start_effector(tmp_path) as effector:
        port = effector.server.console_port
        assert port and effector.console_url == f"http://127.0.0.1:{port}/"
        with client_for(effector) as client:
            assert client.get("/").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
    with launch.EffectorThread(f"sqlite:///{tmp_path / 'plain.db'}", ToolRegistry()) as plain:
        assert plain.console_url is None and plain.server.console_port is None


def test_a_console_port_in_use_fails_the_start(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        settings = ServerSettings(console_listen=f"127.0.0.1:{taken}")
        with pytest.raises(
            ConfigurationError, match=f"cannot serve the console on 127.0.0.1:{taken}"
        ):
            launch.EffectorThread(f"sqlite:///{tmp_path / 'e.db'}", ToolRegistry(), settings)


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0


def other_tasks() -> set[asyncio.Task[object]]:
    """The running loop's tasks but the current one."""
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]


@pytest.mark.asyncio
async def test_a_console_that_cannot_start_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f"sqlite:///{tmp_path / 'e.db'}"
    async with running_server(store, ToolRegistry(), ServerSettings(console_listen="127.0.0.1:0")):
        pass  # whatever starts once per process (gRPC's own threads) has started
    threads = set(threading.enumerate())
    grpc_port = launch.free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        settings = ServerSettings(
            listen=f"127.0.0.1:{grpc_port}", console_listen=f"127.0.0.1:{taken}"
        )
        with pytest.raises(ConfigurationError, match=f"cannot serve the console on .*:{taken}"):
            async with running_server(store, ToolRegistry(), settings):
                pytest.fail("the effector started without its console")
    assert not accepts(grpc_port)

    async def refuse(self: ConsoleServer) -> None:
        raise ConfigurationError("the console refused to start")

    monkeypatch.setattr(ConsoleServer, "start", refuse)  # fails after gRPC and the worker start
    settings = ServerSettings(listen=f"127.0.0.1:{grpc_port}", console_listen="127.0.0.1:0")
    with pytest.raises(ConfigurationError, match="the console refused to start"):
        async with running_server(store, ToolRegistry(), settings):
            pytest.fail("the effector started without its console")
    assert not accepts(grpc_port)
    assert other_tasks() == set(), "the worker or a server task was left running"
    assert set(threading.enumerate()) <= threads, "a thread was left running"


@pytest.mark.asyncio
async def test_a_console_that_crashes_is_logged_and_the_effector_still_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def crash(self: uvicorn.Server, counter: int) -> bool:
        raise RuntimeError("the console's loop broke")

    caplog.set_level(logging.INFO)
    settings = ServerSettings(console_listen="127.0.0.1:0")
    store = f"sqlite:///{tmp_path / 'e.db'}"
    async with running_server(store, ToolRegistry(), settings) as server:
        console_port, grpc_port = server.console_port, server.port
        assert console_port is not None and accepts(console_port)
        monkeypatch.setattr(uvicorn.Server, "on_tick", crash)
        for _ in range(500):
            crashed = [r for r in caplog.records if r.name == "effector.console.serve"]
            if crashed:
                break
            await asyncio.sleep(0.01)
        [record] = crashed
        assert record.levelno == logging.ERROR and "stopped serving" in record.getMessage()
        assert record.exc_info is not None and "loop broke" in str(record.exc_info[1])
        async with AsyncEffectorClient(server.address) as client:
            assert (await client.status()).head_offset == 0, "gRPC serves on"
    assert caplog.records[-1].getMessage() == "effector stopped"
    assert not accepts(grpc_port) and not accepts(console_port)
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_the_console_keeps_the_process_signals_and_logging(tmp_path: Path) -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    root_handlers = list(logging.getLogger().handlers)
    settings = ServerSettings(console_listen="127.0.0.1:0")
    async with running_server(f"sqlite:///{tmp_path / 'e.db'}", ToolRegistry(), settings) as server:
        assert server.console_url is not None
        async with httpx.AsyncClient() as client:
            assert (await client.get(server.console_url)).status_code == 200
        during = {signum: signal.getsignal(signum) for signum in before}
        assert during == before
    assert {signum: signal.getsignal(signum) for signum in before} == before
    assert logging.getLogger().handlers == root_handlers
    assert logging.getLogger("uvicorn.error").handlers == []


def test_serve_prints_the_console_url_and_drains_on_sigterm(tmp_path: Path) -> None:
    environment = launch.child_environment(REPO, **{env_name("--console-listen"): "127.0.0.1:0"})
    with launch.EffectorProcess(
        *("--tools", TOOLS, "--store", f"sqlite:///{tmp_path / 'e.db'}"),
        *("--listen", "127.0.0.1:0"),
        env=environment,
        cwd=REPO,
    ) as effector:
        url = effector.console_url  # the console came from the environment
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert httpx.get(url, timeout=10).status_code == 200
        effector.signal(signal.SIGTERM)
        assert effector.wait(30) == 0
        assert f"effector console on {url}" in effector.stderr()
    with launch.EffectorProcess(
        *("--tools", TOOLS, "--store", f"sqlite:///{tmp_path / 'e.db'}"),
        *("--listen", "127.0.0.1:0", "--console-listen", "127.0.0.1:0"),
        env=launch.child_environment(REPO),
        cwd=REPO,
    ) as effector:
        assert effector.console_url is not None
        assert httpx.get(effector.console_url, timeout=10).status_code == 200


def test_the_help_explains_the_console_flag() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "effector", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=launch.child_environment(REPO),
    ).stdout
    flat = " ".join(shown.split())
    assert "--console-listen HOST:PORT" in flat
    assert "web console" in flat and env_name("--console-listen") in flat


def test_with_tls_the_console_speaks_https_and_its_cookie_is_secure(tmp_path: Path) -> None:
    certificate, key = self_signed_certificate()
    with start_effector(tmp_path, token=TOKEN, tls=(certificate, key)) as effector:
        port = effector.server.console_port
        assert effector.console_url == f"https://127.0.0.1:{port}/"
        trusted = ssl.create_default_context(cadata=certificate.decode())
        with client_for(effector, verify=trusted) as client:
            assert client.get("/").headers["location"].startswith("/login")
            login = client.post("/login", data={"token": TOKEN, "next": "/approvals"})
            assert login.status_code == 303
            cookie = login.headers["set-cookie"]
            assert "; secure" in cookie.lower() and "httponly" in cookie.lower()
            approvals = client.get("/approvals")
            assert approvals.status_code == 200 and "Approvals inbox" in approvals.text
        with pytest.raises(httpx.TransportError):  # no plain HTTP beside it
            httpx.get(f"http://127.0.0.1:{port}/login", timeout=5)
    with start_effector(tmp_path / "open", tls=(certificate, key)) as effector:
        trusted = ssl.create_default_context(cadata=certificate.decode())
        with client_for(effector, verify=trusted) as client:
            first = client.get("/")  # without a token the first visit starts the session
            assert first.status_code == 200 and "; secure" in first.headers["set-cookie"].lower()


def test_a_non_loopback_console_without_tls_warns_once_that_it_is_clear_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # Tests bind loopback only: have the server take 127.0.0.1 for a public address.
    monkeypatch.setattr(server_module, "is_loopback_host", lambda host: False)
    with start_effector(tmp_path / "plain", token=TOKEN):
        pass
    [warning] = [r for r in caplog.records if "clear text" in r.getMessage()]
    assert warning.levelno == logging.WARNING and warning.name == "effector.server"
    assert "TLS" in warning.getMessage() and TOKEN not in caplog.text
    caplog.clear()
    with start_effector(tmp_path / "tls", token=TOKEN, tls=self_signed_certificate()):
        pass
    assert "effector console on https://" in caplog.text
    monkeypatch.undo()  # a loopback console is not warned about either
    with start_effector(tmp_path / "loopback", token=TOKEN):
        pass
    assert [r for r in caplog.records if "clear text" in r.getMessage()] == []
