"""RecordTraces and RecordErrors: storing, limits, validation, the token, and retention.

Each test talks to a real effector over gRPC on 127.0.0.1 (SQLite store); retention runs on
the worker's own housekeeping with a clock the test moves forward.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from conftest import sqlite_url
from effector_harness import FAST_WORKER, running_effector
from effector_test_tools import make_registry

import beam_agents._protos as pb
from beam_agents._protos import (
    MAX_ENTITY_KEY_BYTES,
)
from effector import cli
from effector.launch import running_server
from effector.server import EffectorServer, ServerSettings
from effector.service import (
    MAX_TELEMETRY_BATCH,
)
from effector.store.errors import ConfigurationError
from effector.store.intents import error_id_for, wall_clock_ms

TOKEN = "telemetry-token-5678"


def event(n: int, key: bytes = b"k", **fields: object) -> pb.TraceEvent:
    values: dict[str, object] = {
        "trace_id": f"{n:032x}",
        "span_id": f"{n:016x}",
        "entity_key": key,
        "seq": n,
        "event_type": pb.TraceEvent.TOOL_CALL,
        **fields,
    }
    return pb.TraceEvent(**values)  # type: ignore[arg-type]


def error(detail: str, key: bytes = b"k") -> pb.AgentError:
    """An error record whose envelope (part of its id) carries ``detail`` too."""
    envelope = pb.AgentEnvelope(entity_key=key, external_event=detail.encode())
    return pb.AgentError(
        entity_key=key,
        reason="activation_error",
        detail=detail,
        envelope=envelope.SerializeToString(),
    )


@asynccontextmanager
async def effector_stub(
    tmp_path: Path, settings: ServerSettings | None = None
) -> AsyncIterator[tuple[EffectorServer, pb.EffectorStub]]:
    async with (
        running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as running,
        grpc.aio.insecure_channel(running.server.address) as channel,
    ):
        yield running.server, pb.EffectorStub(channel)  # type: ignore[no-untyped-call]


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def sample(server: EffectorServer, name: str, kind: str) -> float | None:
    return server.metrics.registry.get_sample_value(name, {"kind": kind})


@pytest.mark.asyncio
async def test_traces_and_errors_are_stored_once_and_counted(tmp_path: Path) -> None:
    async with effector_stub(tmp_path) as (server, stub):
        events = [event(n) for n in range(3)]
        first = await stub.RecordTraces(pb.RecordTracesRequest(events=events))
        again = await stub.RecordTraces(pb.RecordTracesRequest(events=[*events, event(3)]))
        assert (first.recorded, first.duplicates) == (3, 0)
        assert (again.recorded, again.duplicates) == (1, 3)
        assert await server.store.traces_for_key(b"k", 10) == [*events, event(3)]

        errors = [error("a"), error("b"), error("a")]
        answer = await stub.RecordErrors(pb.RecordErrorsRequest(errors=errors))
        assert (answer.recorded, answer.duplicates) == (2, 1)
        stored = await server.store.get_error(error_id_for(error("b")))
        assert stored is not None and stored.error == error("b")

        assert sample(server, "effector_telemetry_recorded_total", "event") == 4
        assert sample(server, "effector_telemetry_duplicate_total", "event") == 3
        assert sample(server, "effector_telemetry_recorded_total", "error") == 2
        assert sample(server, "effector_telemetry_duplicate_total", "error") == 1


@pytest.mark.asyncio
async def test_errors_and_records_of_different_runs_are_stored_apart(tmp_path: Path) -> None:
    async with effector_stub(tmp_path) as (server, stub):
        errors = [error("same") for _ in range(3)]
        errors[0].trace_id, errors[1].trace_id, errors[2].trace_id = "a" * 32, "b" * 32, "a" * 32
        answer = await stub.RecordErrors(pb.RecordErrorsRequest(errors=errors))
        assert (answer.recorded, answer.duplicates) == (2, 1)
        assert error_id_for(errors[0]) != error_id_for(errors[1])
        assert error_id_for(error("same")) != error_id_for(errors[0])
        records = [
            pb.ActivationRecord(entity_key=b"k", seq=0, intent_namespace=namespace)
            for namespace in ("", "v2", "v2")
        ]
        stored = await stub.RecordActivations(pb.RecordActivationsRequest(records=records))
        assert (stored.recorded, stored.duplicates) == (2, 1)
        kept = await server.store.records_for_key(b"k", 10)
        assert sorted(r.intent_namespace for r in kept) == ["", "v2"]


@pytest.mark.asyncio
async def test_batches_are_bounded(tmp_path: Path) -> None:
    async with effector_stub(tmp_path) as (server, stub):
        too_many = [event(n) for n in range(MAX_TELEMETRY_BATCH + 1)]
        for call, message in (
            (stub.RecordTraces(pb.RecordTracesRequest()), "empty batch: a RecordTraces"),
            (stub.RecordErrors(pb.RecordErrorsRequest()), "empty batch: a RecordErrors"),
            (
                stub.RecordTraces(pb.RecordTracesRequest(events=too_many)),
                f"batch of {MAX_TELEMETRY_BATCH + 1} events is over the limit",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in (refused.value.details() or "")
        assert await server.store.traces_for_key(b"k", 10) == []
        full = await stub.RecordTraces(pb.RecordTracesRequest(events=too_many[:-1]))
        assert full.recorded == MAX_TELEMETRY_BATCH


@pytest.mark.asyncio
async def test_invalid_items_are_refused_alone_and_the_rest_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="effector.service")
    async with effector_stub(tmp_path) as (server, stub):
        cases = [
            (event(1, trace_id="A" * 32), "event 1 has trace_id 'AAAA"),
            (event(1, trace_id="ab"), "not 32 lowercase hex digits"),
            (event(1, span_id="0123456789abcdeg"), "event 1 has span_id '0123456789abcdeg'"),
            (event(1, span_id=""), "not 16 lowercase hex digits"),
            (event(1, key=b""), "event 1 has an empty entity_key"),
            (event(1, key=b"x" * (MAX_ENTITY_KEY_BYTES + 1)), "entity_key of 4097 bytes"),
        ]
        for n, (bad, message) in enumerate(cases, start=2):
            answer = await stub.RecordTraces(pb.RecordTracesRequest(events=[event(n), bad]))
            assert (answer.recorded, answer.duplicates, answer.rejected) == (1, 0, 1)
            assert message in answer.first_problem
        stored = await server.store.traces_for_key(b"k", 100)
        assert stored == [event(n) for n in range(2, 2 + len(cases))]
        clean = await stub.RecordTraces(pb.RecordTracesRequest(events=[event(0)]))
        assert (clean.recorded, clean.rejected, clean.first_problem) == (1, 0, "")

        only_bad = [event(9, key=b""), event(10, span_id="x")]
        answer = await stub.RecordTraces(pb.RecordTracesRequest(events=only_bad))
        assert (answer.recorded, answer.rejected) == (0, 2)
        assert answer.first_problem.startswith("event 0 has an empty entity_key")

        errors = [error("ok"), error("x", b""), error("fine")]
        answer = await stub.RecordErrors(pb.RecordErrorsRequest(errors=errors))
        assert (answer.recorded, answer.rejected) == (2, 1)
        assert answer.first_problem == "error 1 has an empty entity_key"
        assert {e.error.detail for e in await server.store.list_errors(None, 10)} == {"ok", "fine"}

        assert sample(server, "effector_telemetry_rejected_total", "event") == len(cases) + 2
        assert sample(server, "effector_telemetry_rejected_total", "error") == 1
    warnings = [r for r in caplog.records if r.name == "effector.service"]
    assert len(warnings) == len(cases) + 2  # one per call that refused any
    assert all(r.levelno == logging.WARNING for r in warnings)
    assert "RecordErrors: refused 1 of 3 errors" in warnings[-1].getMessage()
    assert "error 1 has an empty entity_key" in warnings[-1].getMessage()


@pytest.mark.asyncio
async def test_recording_needs_the_token(tmp_path: Path) -> None:
    settings = ServerSettings(token=TOKEN, worker=FAST_WORKER)
    async with effector_stub(tmp_path, settings) as (server, stub):
        traces, errors = (
            pb.RecordTracesRequest(events=[event(0)]),
            pb.RecordErrorsRequest(errors=[error("e")]),
        )
        for token in (None, "wrong"):
            calls = (
                stub.RecordTraces(traces, metadata=metadata(token)),
                stub.RecordErrors(errors, metadata=metadata(token)),
            )
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await server.store.traces_for_key(b"k", 10) == []
        recorded = await stub.RecordTraces(traces, metadata=metadata(TOKEN))
        stored = await stub.RecordErrors(errors, metadata=metadata(TOKEN))
        assert (recorded.recorded, stored.recorded) == (1, 1)


@pytest.mark.asyncio
async def test_the_worker_prunes_telemetry_past_its_retention(tmp_path: Path) -> None:
    skew_ms = [0]

    def clock() -> int:
        return wall_clock_ms() + skew_ms[0]

    settings = ServerSettings(worker=FAST_WORKER, telemetry_retention_s=60)
    async with running_server(
        sqlite_url(tmp_path / "s.db"), make_registry(), settings, clock=clock
    ) as server:
        store = server.store
        await store.record_traces([event(0)], clock())
        await store.record_errors([error("old")], clock())
        await asyncio.sleep(0.5)  # several housekeeping rounds: still within the retention
        assert len(await store.traces_for_key(b"k", 10)) == 1
        skew_ms[0] = 61_000
        await store.record_traces([event(1, key=b"new")], clock())
        deadline = time.monotonic() + 30
        while await store.list_errors(b"k", 10) or await store.traces_for_key(b"k", 10):
            assert time.monotonic() < deadline, "telemetry past its retention was not pruned"
            await asyncio.sleep(0.05)
        assert len(await store.traces_for_key(b"new", 10)) == 1


def test_the_retention_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["serve", "--tools", "m:r", "--store", "s.db"]
    parsed = cli.build_parser().parse_args([*base, "--telemetry-retention-s", "3600"])
    assert cli._server_settings(parsed).telemetry_retention_s == 3600
    default = cli._server_settings(cli.build_parser().parse_args(base))
    assert default.telemetry_retention_s == 7 * 24 * 3600
    monkeypatch.setenv("BEAM_AGENTS_EFFECTOR_TELEMETRY_RETENTION_S", "120")
    assert cli._server_settings(cli.build_parser().parse_args(base)).telemetry_retention_s == 120
    with pytest.raises(ConfigurationError, match="telemetry retention must be positive"):
        ServerSettings(telemetry_retention_s=0).check()
