"""Helpers for the effector tests: build intents, run a server in-process, wait for results."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import signal
import subprocess
import sys
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

from beam_agents._protos import (
    GetIntentResponse,
    IntentState,
    ToolIntent,
    canonical_json,
    withdrawal_id_for,
)
from beam_agents.tools import ToolRegistry
from effector import launch
from effector.client import AsyncEffectorClient
from effector.launch import running_server
from effector.server import EffectorServer, ServerSettings
from effector.store.intents import wall_clock_ms
from effector.store.sql import SqlStore
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


def make_withdrawal(
    target: ToolIntent,
    reason: str = "the run took its deadline route",
    *,
    key: bytes | None = None,
    created_at_ms: int | None = None,
) -> ToolIntent:
    """The WITHDRAWAL a run submits when it stops waiting for ``target`` (``key``: another)."""
    return ToolIntent(
        intent_id=withdrawal_id_for(target.intent_id),
        entity_key=target.entity_key if key is None else key,
        seq=target.seq,
        step_index=target.step_index,
        kind=ToolIntent.WITHDRAWAL,
        withdraws_intent_id=target.intent_id,
        args_json=canonical_json({"reason": reason}),
        created_at_ms=target.created_at_ms if created_at_ms is None else created_at_ms,
    )


@dataclass
class Running:
    server: EffectorServer
    store: SqlStore
    client: AsyncEffectorClient


@asynccontextmanager
async def running_effector(
    store_url: str,
    registry: ToolRegistry | None = None,
    settings: ServerSettings | None = None,
) -> AsyncIterator[Running]:
    async with running_server(
        store_url,
        registry if registry is not None else make_registry(),
        settings or ServerSettings(worker=FAST_WORKER),
    ) as server:
        client = AsyncEffectorClient(server.address, token=(settings.token if settings else None))
        try:
            yield Running(server, server.store, client)
        finally:
            await client.close()


class BackgroundEffector(launch.EffectorThread):
    """An in-process effector serving the test tools from its own event-loop thread.

    Beam pipelines block the calling thread, so the effector they talk to runs elsewhere.
    ``close()`` (or leaving the ``with`` block) drains the server and closes the store.
    """

    def __init__(self, store_url: str, settings: ServerSettings | None = None) -> None:
        super().__init__(store_url, make_registry(), settings or ServerSettings(worker=FAST_WORKER))


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
    return launch.child_environment(REPO, Path(__file__).parent, **overrides)


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


class EffectorProcess(launch.EffectorProcess):
    """``python -m effector serve ...`` with the test tools importable; killed on exit."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        super().__init__(*args, env=env or cli_environment(), stop_signal=signal.SIGKILL)
