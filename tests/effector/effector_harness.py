"""Helpers for the effector tests: build intents, run a server in-process, wait for results."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from effector_test_tools import make_registry

from beam_agents._json import canonical_json
from beam_agents._protos import GetIntentResponse, IntentState, ToolIntent
from beam_agents.tools import ToolRegistry
from effector.client import AsyncEffectorClient
from effector.intents import wall_clock_ms
from effector.server import EffectorServer, ServerSettings
from effector.store import EffectorStore, open_store
from effector.worker import WorkerSettings

FAST_WORKER = WorkerSettings(poll_interval_ms=50, housekeeping_interval_ms=100, lease_ms=30_000)


def intent_id(key: bytes, seq: int, step: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{key.hex()}|{seq}|{step}"))


def make_intent(
    tool_name: str,
    args: Mapping[str, Any] | str = "{}",
    *,
    key: bytes = b"key",
    seq: int = 0,
    step: int = 0,
    kind: ToolIntent.Kind = ToolIntent.TOOL,
    ttl_ms: int = 0,
    created_at_ms: int | None = None,
) -> ToolIntent:
    created = wall_clock_ms() if created_at_ms is None else created_at_ms
    return ToolIntent(
        intent_id=intent_id(key, seq, step),
        entity_key=key,
        seq=seq,
        step_index=step,
        tool_name=tool_name,
        args_json=args if isinstance(args, str) else canonical_json(dict(args)),
        created_at_ms=created,
        expires_at_ms=created + ttl_ms if ttl_ms else 0,
        kind=kind,
        trace_id="trace",
    )


@dataclass
class Running:
    server: EffectorServer
    store: EffectorStore
    client: AsyncEffectorClient


@asynccontextmanager
async def running_effector(
    store_url: str,
    registry: ToolRegistry | None = None,
    settings: ServerSettings | None = None,
) -> AsyncIterator[Running]:
    store = await open_store(store_url)
    try:
        server = EffectorServer(
            store,
            registry if registry is not None else make_registry(),
            settings or ServerSettings(worker=FAST_WORKER),
        )
        await server.start()
        try:
            client = AsyncEffectorClient(
                server.address, token=(settings.token if settings else None)
            )
            try:
                yield Running(server, store, client)
            finally:
                await client.close()
        finally:
            await server.stop()
    finally:
        await store.close()


class BackgroundEffector:
    """An in-process effector serving from its own event-loop thread, for synchronous tests.

    Beam pipelines block the calling thread, so the effector they talk to runs elsewhere.
    ``close()`` (or leaving the ``with`` block) drains the server and closes the store.
    """

    def __init__(self, store_url: str, settings: ServerSettings | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._context = running_effector(store_url, settings=settings)
        try:
            self.running = self._call(self._context.__aenter__())
        except BaseException:
            self._stop_loop()
            raise
        self.address = self.running.server.address
        self.port = self.running.server.port

    def _call(self, coroutine: Any, timeout_s: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._context.__aexit__(None, None, None))
        finally:
            self._stop_loop()

    def __enter__(self) -> BackgroundEffector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def self_signed_certificate(
    dns_names: Sequence[str] = ("localhost",), ip_addresses: Sequence[str] = ("127.0.0.1",)
) -> tuple[bytes, bytes]:
    """A self-signed certificate for the given names, and its private key (both PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])])
    now = datetime.datetime.now(datetime.UTC)
    alternative_names: list[x509.GeneralName] = [x509.DNSName(dns) for dns in dns_names]
    alternative_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        certificate.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


async def wait_done(
    client: AsyncEffectorClient, intent_ids: Iterable[str], timeout_s: float = 30.0
) -> dict[str, GetIntentResponse]:
    """Poll until every intent is DONE; returns what GetIntent says about each."""
    waiting = set(intent_ids)
    done: dict[str, GetIntentResponse] = {}
    deadline = time.monotonic() + timeout_s
    while waiting:
        for intent_id_ in list(waiting):
            response = await client.get_intent(intent_id_)
            if response.state == IntentState.DONE:
                done[intent_id_] = response
                waiting.discard(intent_id_)
        if waiting:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(waiting)} intent(s) not DONE after {timeout_s}s")
            await asyncio.sleep(0.05)
    return done


REPO = Path(__file__).resolve().parents[2]
TOOLS = "effector_test_tools:make_registry"


def cli_environment(**overrides: str) -> dict[str, str]:
    """The environment for an effector subprocess: the repo and the test tools importable."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO), str(Path(__file__).parent)])
    environment.update(overrides)
    return environment


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m effector ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "effector", *args],
        capture_output=True,
        text=True,
        env=env or cli_environment(),
        timeout=timeout_s,
    )


class EffectorProcess:
    """``python -m effector serve ...`` as a subprocess; killed on exit if still running."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        # stderr goes to a file: an unread pipe would fill up and stall the server.
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in __exit__
        self.process = subprocess.Popen(
            [sys.executable, "-m", "effector", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env or cli_environment(),
        )
        self.address = self._await_ready()

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def _await_ready(self, timeout_s: float = 60) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        prefix = "effector listening on "
        if not line.startswith(prefix):
            self.process.kill()
            self.process.wait(timeout=30)
            raise AssertionError(f"effector did not start: {line!r} {self.stderr()[-2000:]}")
        return line.strip().removeprefix(prefix)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = 60) -> int:
        return self.process.wait(timeout=timeout_s)

    def __enter__(self) -> EffectorProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=30)
        self._stderr.close()
