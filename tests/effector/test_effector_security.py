"""Bearer-token auth, TLS, reflection, and keeping the secret out of logs and errors."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from conftest import sqlite_url
from effector_harness import (
    FAST_WORKER,
    make_intent,
    running_effector,
    self_signed_certificate,
    wait_done,
)
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from effector.client import AsyncEffectorClient
from effector.server import ServerSettings
from effector.store.errors import ConfigurationError

TOKEN = "s3cret-token-value-1234"


async def list_services(
    channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]
) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
        metadata=metadata,
        timeout=5,
    )
    names: set[str] = set()
    async for response in call:
        names.update(service.name for service in response.list_services_response.service)
    return names


@pytest.mark.asyncio
async def test_token_is_required_except_for_health(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = ServerSettings(token=TOKEN, worker=FAST_WORKER)
    intent = make_intent("add", {"a": 1})
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        address = effector.server.address
        for token in (None, "wrong", TOKEN + "x", f"{TOKEN[:-1]}"):
            async with AsyncEffectorClient(address, token=token) as outsider:
                assert await outsider.health()
                for call in (outsider.status(), outsider.submit([intent]), outsider.read(1)):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert TOKEN not in (refused.value.details() or "")
        assert (await effector.client.status()).done == 0  # nothing was submitted
        await effector.client.submit([intent])
        await wait_done(effector.client, [intent.intent_id])
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused_reflection:
                await list_services(channel, ())
            assert refused_reflection.value.code() == grpc.StatusCode.UNAUTHENTICATED
            names = await list_services(channel, (("authorization", f"Bearer {TOKEN}"),))
        assert {"beam_agents.v1.Effector", "grpc.health.v1.Health"} <= names
    assert TOKEN not in caplog.text


@pytest.mark.asyncio
async def test_tls_with_a_generated_certificate(tmp_path: Path) -> None:
    certificate, key = self_signed_certificate()
    settings = ServerSettings(tls_cert=certificate, tls_key=key, token=TOKEN, worker=FAST_WORKER)
    intent = make_intent("add", {"a": 41})
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        address = effector.server.address
        async with AsyncEffectorClient(
            address, token=TOKEN, root_certificates=certificate
        ) as secure:
            assert await secure.health()
            await secure.submit([intent])
            done = await wait_done(secure, [intent.intent_id])
            assert done[intent.intent_id].result.payload == b"42"
        async with AsyncEffectorClient(address, token=TOKEN, timeout_s=2) as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await plaintext.status()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_settings_refuse_unsafe_combinations() -> None:
    with pytest.raises(ConfigurationError, match="non-loopback"):
        ServerSettings(listen="0.0.0.0:0").check()
    with pytest.raises(ConfigurationError, match="non-loopback"):
        ServerSettings(listen="example.internal:50051").check()
    ServerSettings(listen="0.0.0.0:0", token=TOKEN).check()
    ServerSettings(listen="0.0.0.0:0", allow_insecure_bind=True).check()
    ServerSettings(listen="[::1]:0").check()
    ServerSettings(listen="localhost:0").check()
    with pytest.raises(ConfigurationError, match="both"):
        ServerSettings(tls_cert=b"x").check()
    with pytest.raises(ConfigurationError, match="HOST:PORT"):
        ServerSettings(listen="127.0.0.1").check()
    assert TOKEN not in repr(ServerSettings(token=TOKEN))


@pytest.mark.asyncio
async def test_a_port_in_use_is_a_configuration_error(tmp_path: Path) -> None:
    async with running_effector(sqlite_url(tmp_path / "a.db")) as first:
        taken = ServerSettings(listen=first.server.address, worker=FAST_WORKER)
        with pytest.raises(ConfigurationError, match="cannot listen"):
            async with running_effector(sqlite_url(tmp_path / "b.db"), settings=taken):
                pass
