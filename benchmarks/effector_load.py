"""The load and the floors of benchmark 6 (effector throughput): intents, Submits, reads.

:mod:`benchmarks.effector_throughput` drives these against effector subprocesses and reports;
the sustained run, the Submit-rate comparison and the bare insert-and-commit floors live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from beam_agents._protos import AgentEnvelope, SubmitAck, ToolIntent, ToolResult
from benchmarks.harness import server_process
from benchmarks.paired_rounds import Batch
from effector.client import AsyncEffectorClient
from effector.launch import EffectorProcess

KEYS = 1_000
SUBMITTERS = 4
CONCURRENCY = 256
FULL = (20_000, 500, 3)
QUICK = (1_000, 100, 1)
"""(intents per run, intents per Submit, runs per store)."""
SINGLE_CALLERS = 64
SINGLE_CALLS = 4_000
QUICK_SINGLE_CALLS = 200
"""One-intent Submit calls per round."""
RATE_ROUNDS = {False: 5, True: 3}
"""Paired rounds of Submit calls, full and quick."""
READ_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Sustained:
    """One sustained run."""

    intents: int
    calls: int
    elapsed_s: float
    submit_s: float
    ack_s: list[float]

    @property
    def intents_per_s(self) -> float:
        """Intents whose results were read, per second."""
        return self.intents / self.elapsed_s

    @property
    def calls_per_s(self) -> float:
        """Submit calls acknowledged per second."""
        return self.calls / self.submit_s


def make_intents(count: int) -> list[ToolIntent]:
    """``count`` fresh ``noop`` intents over :data:`KEYS` keys, each key's in seq order."""
    run = uuid.uuid4().hex[:8]
    now_ms = int(time.time() * 1000)
    intents = []
    for index in range(count):
        key = f"{run}-key-{index % KEYS}".encode()
        seq = index // KEYS
        intents.append(
            ToolIntent(
                intent_id=str(uuid.uuid5(uuid.NAMESPACE_OID, f"{key.hex()}|{seq}|0")),
                entity_key=key,
                seq=seq,
                tool_name="noop",
                args_json="{}",
                created_at_ms=now_ms,
                kind=ToolIntent.TOOL,
                trace_id=run,
            )
        )
    return intents


def chunks(intents: list[ToolIntent], size: int) -> list[list[ToolIntent]]:
    return [intents[start : start + size] for start in range(0, len(intents), size)]


async def submit_all(
    clients: Sequence[AsyncEffectorClient], calls: list[list[ToolIntent]], callers: int
) -> list[float]:
    """Submit every batch, ``callers`` at a time; return each call's latency."""
    latencies: list[float] = []

    async def submitter(worker: int) -> None:
        client = clients[worker % len(clients)]
        for chunk in calls[worker::callers]:
            started = time.perf_counter()
            acks = await client.submit(chunk)
            latencies.append(time.perf_counter() - started)
            refused = [ack for ack in acks if ack.outcome != SubmitAck.ACCEPTED]
            if refused:
                raise RuntimeError(f"{len(refused)} intents not accepted, e.g. {refused[0]}")

    await asyncio.gather(*(submitter(worker) for worker in range(callers)))
    return latencies


async def _read_results(client: AsyncEffectorClient, after: int, wanted: set[str]) -> None:
    """Read the log from offset ``after + 1`` until every wanted intent's OK result was seen."""
    offset, waiting = after + 1, set(wanted)
    while waiting:
        response = await client.read(offset, max_batch=5_000, wait_ms=1_000)
        for record in response.records:
            envelope = record.envelope
            if envelope.WhichOneof("payload") != "tool_result":
                continue
            result = envelope.tool_result
            if result.intent_id in waiting:
                if result.status != ToolResult.OK:
                    raise RuntimeError(f"intent {result.intent_id} failed: {result.error_message}")
                waiting.discard(result.intent_id)
        offset = response.next_offset


async def sustained(targets: Sequence[str], count: int, batch: int) -> Sustained:
    """Submit ``count`` intents to the effectors at ``targets`` and read all results back."""
    clients = [AsyncEffectorClient(target) for target in targets]
    try:
        for client in clients:
            await client.health()
        intents = make_intents(count)
        head = (await clients[0].status()).head_offset
        reading = asyncio.create_task(
            _read_results(clients[0], head, {intent.intent_id for intent in intents})
        )
        started = time.perf_counter()
        ack_s = await submit_all(clients, chunks(intents, batch), SUBMITTERS)
        submit_s = time.perf_counter() - started
        await asyncio.wait_for(reading, READ_TIMEOUT_S)
        elapsed_s = time.perf_counter() - started
    finally:
        for client in clients:
            await client.close()
    return Sustained(count, len(ack_s), elapsed_s, submit_s, ack_s)


async def paired_calls(
    sides: Sequence[Sequence[str]], shape: tuple[int, int, int], rounds: int
) -> list[list[Batch]]:
    """Per side (its servers' targets), one batch of Submit calls of ``shape`` per round.

    Each side is warmed up first; then in every round each side runs one batch, the order
    rotating from round to round, so load from elsewhere on the machine hits them alike. Every
    batch submits fresh intents, so an effector records each.
    """
    clients = [[AsyncEffectorClient(target) for target in targets] for targets in sides]
    batches: list[list[Batch]] = [[] for _ in sides]
    try:
        for side in clients:
            await _calls(side, shape, warm=True)
        for index in range(rounds):
            turn = index % len(sides)
            for side in [*range(turn, len(sides)), *range(turn)]:
                batches[side].append(await _calls(clients[side], shape))
    finally:
        for side in clients:
            for client in side:
                await client.close()
    return batches


async def calls_round(
    targets: Sequence[str], shape: tuple[int, int, int], *, warm: bool = True
) -> Batch:
    """One batch of Submit calls of ``shape`` at ``targets``, after a warm-up if ``warm``.

    Without one, the channels connect on the first calls, inside the batch.
    """
    if warm:
        return (await paired_calls([targets], shape, 1))[0][0]
    clients = [AsyncEffectorClient(target) for target in targets]
    try:
        return await _calls(clients, shape)
    finally:
        for client in clients:
            await client.close()


async def _calls(
    clients: Sequence[AsyncEffectorClient], shape: tuple[int, int, int], *, warm: bool = False
) -> Batch:
    """Submit fresh intents in ``shape`` (a warm-up: two calls per caller); time them."""
    per_call, callers, intents = shape
    calls = chunks(make_intents(callers * 2 * per_call if warm else intents), per_call)
    started = time.perf_counter()
    latencies = await submit_all(clients, calls, callers)
    return Batch(len(calls), time.perf_counter() - started, tuple(latencies))


def _floor_schema(blob: str) -> list[str]:
    return [
        f"CREATE TABLE intents (intent_id TEXT PRIMARY KEY, entity_key {blob} NOT NULL, "
        f"seq BIGINT NOT NULL, step_index BIGINT NOT NULL, tool_name TEXT NOT NULL, "
        f"args_json TEXT NOT NULL, intent {blob} NOT NULL)",
        f"CREATE TABLE results (intent_id TEXT PRIMARY KEY, status INTEGER NOT NULL, "
        f"payload {blob} NOT NULL, completed_at_ms BIGINT NOT NULL)",
        f"CREATE TABLE log (log_offset BIGINT PRIMARY KEY, entity_key {blob} NOT NULL, "
        f"envelope {blob} NOT NULL)",
    ]


def bare_insert_rate(connection: Any, placeholder: str, count: int, batch: int) -> float:
    """Intents/s of the bare insert-and-commit floor on a DB-API ``connection``."""
    marks = ", ".join([placeholder] * 7)
    insert_intent = f"INSERT INTO intents VALUES ({marks})"
    insert_result = f"INSERT INTO results VALUES ({', '.join([placeholder] * 4)})"
    insert_log = f"INSERT INTO log VALUES ({', '.join([placeholder] * 3)})"
    intents = make_intents(count)
    cursor = connection.cursor()
    offset = 0
    started = time.perf_counter()
    for chunk in chunks(intents, batch):
        cursor.executemany(
            insert_intent,
            [
                (i.intent_id, i.entity_key, i.seq, i.step_index, i.tool_name, i.args_json,
                 i.SerializeToString())
                for i in chunk
            ],
        )  # fmt: skip
        connection.commit()
        now_ms = int(time.time() * 1000)
        results = [
            ToolResult(
                intent_id=i.intent_id,
                entity_key=i.entity_key,
                seq=i.seq,
                status=ToolResult.OK,
                payload=b"null",
                completed_at_ms=now_ms,
            )
            for i in chunk
        ]
        cursor.executemany(
            insert_result, [(r.intent_id, r.status, r.payload, r.completed_at_ms) for r in results]
        )
        log_rows = []
        for result in results:
            offset += 1
            envelope = AgentEnvelope(
                entity_key=result.entity_key, event_time_ms=now_ms, tool_result=result
            )
            log_rows.append((offset, result.entity_key, envelope.SerializeToString()))
        cursor.executemany(insert_log, log_rows)
        connection.commit()
    return count / (time.perf_counter() - started)


def bare_sqlite_rate(path: Path, count: int, batch: int) -> float:
    """The floor on a fresh SQLite file, WAL and ``synchronous=FULL`` like the effector's."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        for statement in _floor_schema("BLOB"):
            connection.execute(statement)
        return bare_insert_rate(connection, "?", count, batch)
    finally:
        connection.close()


def bare_postgres_rate(url: str, count: int, batch: int) -> float:
    """The floor on a fresh PostgreSQL database."""
    with psycopg.connect(url) as connection:
        for statement in _floor_schema("BYTEA"):
            connection.execute(statement)
        connection.commit()
        return bare_insert_rate(connection, "%s", count, batch)


@contextlib.contextmanager
def servers(commands: Sequence[list[str]], ready: str, logs: Path) -> Iterator[list[str]]:
    """Start the servers; yield their addresses."""
    with server_processes(commands, ready, logs) as processes:
        yield [process.address for process in processes]


@contextlib.contextmanager
def server_processes(
    commands: Sequence[list[str]], ready: str, logs: Path
) -> Iterator[list[EffectorProcess]]:
    """Start the servers, each logging to a file in ``logs``; yield their processes."""
    with contextlib.ExitStack() as stack:
        processes = []
        for index, command in enumerate(commands):
            log = stack.enter_context((logs / f"server-{ready.split()[0]}-{index}.log").open("w"))
            processes.append(stack.enter_context(server_process(command, ready, log)))
        yield processes


def noop_command() -> list[str]:
    return [sys.executable, "-m", "benchmarks.noop_grpc", "--listen", "127.0.0.1:0"]
