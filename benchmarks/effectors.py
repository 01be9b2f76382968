"""Effector benchmarks: throughput on SQLite and PostgreSQL, the overhead of an effect policy, and
the console's keys page.

The throughput's floors: a bare insert-and-commit of the same records into the same store, and
a no-op gRPC server (``python -m benchmarks.effectors --listen HOST:PORT``) serving the same
``Effector`` service, whose Submit acknowledges every intent and does nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg

from beam_agents import ToolRegistry
from beam_agents._protos import (
    AgentEnvelope,
    EffectorServicer,
    SubmitAck,
    SubmitRequest,
    SubmitResponse,
    ToolIntent,
    ToolResult,
    add_EffectorServicer_to_server,
)
from benchmarks.harness import EFFECTOR_READY, effector_command, percentile, servers
from benchmarks.report import Figure, Goal, Result, Target
from effector.client import AsyncEffectorClient
from effector.console.pages import DEFAULT_RUNS, MAX_RUNS
from effector.launch import EffectorThread
from effector.server import ServerSettings
from tests.console.runs_data import key_runs
from tests.pg import find_postgres_bin, postgres_server

KEYS = 1_000
SUBMITTERS = 4
CALLERS = 64
NOOP_READY = "noop listening on "
THROUGHPUT_TARGETS = {"SQLite": 20_000.0, "PostgreSQL, 2 replicas": 12_000.0}
BARE_RATIO_TARGET = Target(Goal.RATIO_AT_LEAST, 0.25)
REQUEST_RATE_TARGET = Target(Goal.RATIO_AT_LEAST, 0.8)


# -- the no-op gRPC floor -----------------------------------------------------------------------


class NoopEffector(EffectorServicer):
    """Acknowledges every submitted intent as accepted, and does nothing else."""

    async def Submit(
        self, request: SubmitRequest, context: grpc.aio.ServicerContext
    ) -> SubmitResponse:
        """One ACCEPTED acknowledgement per intent, in order."""
        acks = [
            SubmitAck(intent_id=i.intent_id, outcome=SubmitAck.ACCEPTED) for i in request.intents
        ]
        return SubmitResponse(acks=acks)


async def serve_noop(listen: str) -> None:
    """Serve the no-op ``Effector`` with the effector's message limits until SIGTERM or SIGINT."""
    limit = 16 * 1024 * 1024
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    add_EffectorServicer_to_server(NoopEffector(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port(listen)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await server.start()
    print(f"{NOOP_READY}{listen.rsplit(':', 1)[0]}:{port}", flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


NOOP_COMMAND = [sys.executable, "-m", "benchmarks.effectors", "--listen", "127.0.0.1:0"]


# -- the load -----------------------------------------------------------------------------------


def make_intents(count: int) -> list[ToolIntent]:
    """``count`` fresh ``noop`` intents over :data:`KEYS` keys, each key's in seq order."""
    run = uuid.uuid4().hex[:8]
    now_ms = int(time.time() * 1000)
    intents = []
    for index in range(count):
        key = f"{run}-key-{index % KEYS}".encode()
        seq = index // KEYS
        intent_id = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{key.hex()}|{seq}|0"))
        intents.append(
            ToolIntent(
                intent_id=intent_id,
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
    """``intents`` in calls of ``size``."""
    return [intents[start : start + size] for start in range(0, len(intents), size)]


async def submit_all(
    clients: Sequence[AsyncEffectorClient], calls: list[list[ToolIntent]], callers: int
) -> None:
    """Submit every call, ``callers`` at a time; every intent must be accepted."""

    async def caller(worker: int) -> None:
        client = clients[worker % len(clients)]
        for chunk in calls[worker::callers]:
            acks = await client.submit(chunk)
            if any(ack.outcome != SubmitAck.ACCEPTED for ack in acks):
                raise RuntimeError(f"intents not accepted: {acks[0]}")

    await asyncio.gather(*(caller(worker) for worker in range(callers)))


async def calls_per_s(clients: Sequence[AsyncEffectorClient], calls: int) -> float:
    """One-intent Submit calls per second from :data:`CALLERS` concurrent callers."""
    batch = chunks(make_intents(calls), 1)
    started = time.perf_counter()
    await submit_all(clients, batch, CALLERS)
    return calls / (time.perf_counter() - started)


async def paired_rates(
    sides: Sequence[Sequence[str]], calls: int, rounds: int
) -> list[list[float]]:
    """Per side (its servers' targets), the calls/s of each round; the order rotates."""
    clients = [[AsyncEffectorClient(target) for target in targets] for targets in sides]
    rates: list[list[float]] = [[] for _ in sides]
    try:
        for side in clients:
            await calls_per_s(side, CALLERS * 2)  # warm-up: the channels connect
        for index in range(rounds):
            for side in [*range(index % 2, len(sides)), *range(index % 2)]:
                rates[side].append(await calls_per_s(clients[side], calls))
    finally:
        for side in clients:
            for client in side:
                await client.close()
    return rates


async def _read_results(client: AsyncEffectorClient, after: int, wanted: set[str]) -> None:
    """Read the log after offset ``after`` until every wanted intent's OK result was seen."""
    offset = after + 1
    while wanted:
        response = await client.read(offset, max_batch=5_000, wait_ms=1_000)
        for record in response.records:
            if record.envelope.WhichOneof("payload") != "tool_result":
                continue
            result = record.envelope.tool_result
            if result.intent_id in wanted:
                if result.status != ToolResult.OK:
                    raise RuntimeError(f"intent failed: {result.error_message}")
                wanted.discard(result.intent_id)
        offset = response.next_offset


async def sustained(targets: Sequence[str], count: int, batch: int) -> float:
    """Intents/s from the first Submit until the reader has seen every intent's OK result."""
    clients = [AsyncEffectorClient(target) for target in targets]
    try:
        for client in clients:
            await client.health()
        intents = make_intents(count)
        head = (await clients[0].status()).head_offset
        wanted = {intent.intent_id for intent in intents}
        reading = asyncio.create_task(_read_results(clients[0], head, wanted))
        started = time.perf_counter()
        await submit_all(clients, chunks(intents, batch), SUBMITTERS)
        await asyncio.wait_for(reading, 120.0)
        return count / (time.perf_counter() - started)
    finally:
        for client in clients:
            await client.close()


async def sustained_beside_noop(
    targets: Sequence[str], noop: Sequence[str], size: tuple[int, int, int], calls: int
) -> tuple[list[float], list[float]]:
    """Sustained runs, each followed by a round of the no-op's one-intent calls."""
    count, batch, runs = size
    ours, floor = [], []
    noop_clients = [AsyncEffectorClient(target) for target in noop]
    try:
        await calls_per_s(noop_clients, CALLERS * 2)  # warm-up: the channels connect
        for _ in range(runs):
            ours.append(await sustained(targets, count, batch))
            floor.append(await calls_per_s(noop_clients, calls))
    finally:
        for client in noop_clients:
            await client.close()
    return ours, floor


# -- the bare insert-and-commit floor -------------------------------------------------------------


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


def bare_insert_rate(connection: Any, mark: str, count: int, batch: int) -> float:
    """Intents/s of inserting and committing the intents, then their results and log rows."""
    insert_intent = f"INSERT INTO intents VALUES ({', '.join([mark] * 7)})"
    insert_result = f"INSERT INTO results VALUES ({', '.join([mark] * 4)})"
    insert_log = f"INSERT INTO log VALUES ({', '.join([mark] * 3)})"
    cursor = connection.cursor()
    offset = 0
    started = time.perf_counter()
    for chunk in chunks(make_intents(count), batch):
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
        results, log = [], []
        for intent in chunk:
            result = ToolResult(
                intent_id=intent.intent_id,
                entity_key=intent.entity_key,
                seq=intent.seq,
                status=ToolResult.OK,
                payload=b"null",
                completed_at_ms=now_ms,
            )
            results.append((result.intent_id, result.status, result.payload, now_ms))
            offset += 1
            envelope = AgentEnvelope(
                entity_key=result.entity_key, event_time_ms=now_ms, tool_result=result
            )
            log.append((offset, result.entity_key, envelope.SerializeToString()))
        cursor.executemany(insert_result, results)
        cursor.executemany(insert_log, log)
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


# -- the benchmark --------------------------------------------------------------------------------


def measure_store(
    label: str,
    database: Callable[[str], str],
    replicas: int,
    bare_rate: float,
    quick: bool,
    logs: Path,
) -> list[Figure]:
    """Sustained intents/s and one-intent Submit calls/s of one store, beside their floors."""
    size = (1_000, 100, 1) if quick else (20_000, 500, 3)
    calls, rounds = (200, 2) if quick else (4_000, 5)
    ingest = [effector_command(database("ingest"), concurrency=0)] * replicas
    executing = [effector_command(database("effector"))] * replicas
    with servers([NOOP_COMMAND] * replicas, NOOP_READY, logs) as noop:
        with servers(ingest, EFFECTOR_READY, logs) as ingesting:
            noop_rates, ours_rates = asyncio.run(paired_rates([noop, ingesting], calls, rounds))
        with servers(executing, EFFECTOR_READY, logs) as targets:
            runs, beside = asyncio.run(sustained_beside_noop(targets, noop, size, calls))
    ratios = [ours / floor for ours, floor in zip(ours_rates, noop_rates, strict=True)]
    median = ratios.index(statistics.median_low(ratios))
    return [
        Figure(
            f"sustained intents/s, {label}",
            "intents/s",
            statistics.median(runs),
            bare_rate,
            Target(Goal.AT_LEAST, THROUGHPUT_TARGETS[label]),
        ),
        Figure(
            f"sustained intents/s against bare inserts, {label}",
            "intents/s",
            statistics.median(runs),
            bare_rate,
            BARE_RATIO_TARGET,
        ),
        Figure(
            f"sustained intents/s against the no-op request rate, {label}",
            "/s",
            statistics.median(runs),
            statistics.median(beside),
        ),
        Figure(
            f"Submit calls/s (1 intent each, {CALLERS} callers), {label}",
            "calls/s",
            ours_rates[median],
            noop_rates[median],
            REQUEST_RATE_TARGET,
        ),
    ]


def effector_throughput(quick: bool) -> Result:
    """SQLite with one effector; PostgreSQL with two replicas when its binaries are here."""
    count, batch = (1_000, 100) if quick else (20_000, 500)
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        bare = bare_sqlite_rate(scratch / "floor.db", count, batch)
        figures = measure_store(
            "SQLite", lambda name: f"sqlite:///{scratch / name}.db", 1, bare, quick, scratch
        )
        if find_postgres_bin() is not None:
            with postgres_server() as server:
                bare = bare_postgres_rate(server.create_database("floor"), count, batch)
                label = "PostgreSQL, 2 replicas"
                figures += measure_store(label, server.create_database, 2, bare, quick, scratch)
    return Result(
        "effector_throughput",
        "Effector throughput: SQLite, and PostgreSQL with two replicas",
        """\
Sustained: 20,000 `noop` intents over 1,000 keys, 500 a Submit from 4 callers, until a reader
has read every OK result; median of 3 runs. Floor: a bare insert-and-commit of the same rows.
Submit calls/s: one-intent calls from 64 callers to ingest-only effectors (`--concurrency 0`)
against a no-op gRPC server in 5 rounds taking turns; the median round's ratio.
SQLite fsyncs every commit; the throwaway PostgreSQL cluster runs with `fsync=off`.""",
        figures,
    )


# -- effect policies ------------------------------------------------------------------------------

POLICY = """\
default = "allow"

[[rules]]
name = "blocked-keys"
when = 'key.startsWith("blocked/")'
outcome = "deny"
reason = "the key is blocked"

[[rules]]
name = "frozen-keys"
when = 'key.endsWith("/frozen") || key.contains("..")'
outcome = "deny"

[[rules]]
name = "destructive-tools"
when = 'tool in ["drop_table", "delete_account", "wipe_disk"]'
outcome = "deny"

[[rules]]
name = "admin-tools"
when = 'tool.startsWith("admin_")'
outcome = "require_approval"
channel = "ops"

[[rules]]
name = "negative-amounts"
when = 'has(args.amount) && args.amount < 0'
outcome = "deny"

[[rules]]
name = "oversized-args"
when = 'size(args) > 32'
outcome = "deny"

[[rules]]
name = "noop-forbidden"
when = 'tool == "noop" && has(args.forbidden)'
outcome = "deny"

[[rules]]
name = "big-refunds"
when = 'tool == "refund" && args.amount > 100'
outcome = "require_approval"
channel = "finance"

[[rules]]
name = "large-transfers"
when = 'tool == "transfer" && args.amount >= 10000'
outcome = "deny"

[[rules]]
name = "outside-email"
when = 'tool == "send_email" && !args.to.endsWith("@example.com")'
outcome = "require_approval"
channel = "comms"
"""
"""Ten rules on ``tool``, ``args`` and ``key``, none of which holds for the benchmark's intents:
each intent runs all ten and is allowed by the default."""

COUNTED_POLICY = (
    POLICY
    + """
[[rules]]
name = "refunds-per-key"
when = 'tool == "refund" && counters.refunds_per_key >= 5'
outcome = "require_approval"
channel = "finance"

[counters.refunds_per_key]
tool = "refund"
per = "key"
window = "1h"
"""
)
"""The ten rules and one on a per-key sliding window of a tool the benchmark never submits: its
count is still queried for every key of a batch."""

POLICY_TARGET = Target(Goal.RATIO_AT_MOST, 1.1)


async def rotating_sustained(
    targets: Sequence[str], count: int, batch: int, rounds: int
) -> list[list[float]]:
    """Per target, the sustained intents/s of each round; the order rotates every round."""
    for target in targets:
        await sustained([target], max(count // 10, batch), batch)  # warm-up
    rates: list[list[float]] = [[] for _ in targets]
    for index in range(rounds):
        first = index % len(targets)
        for side in [*range(first, len(targets)), *range(first)]:
            rates[side].append(await sustained([targets[side]], count, batch))
    return rates


async def check_undecided(target: str, rules: int) -> None:
    """Raise unless ``target`` enforces ``rules`` rules, none of which decided an intent."""
    client = AsyncEffectorClient(target)
    try:
        answer = await client.policies()
    finally:
        await client.close()
    decided = {rule.name: rule.decisions for rule in answer.rules if rule.decisions}
    if not answer.enforced or len(answer.rules) != rules or decided or answer.reload_error:
        raise RuntimeError(
            f"the policy is not as measured: {len(answer.rules)} rules, decided {decided}, "
            f"enforced {answer.enforced}, {answer.reload_error or 'no reload error'}"
        )


async def policy_rates(
    targets: Sequence[str], count: int, batch: int, rounds: int
) -> list[list[float]]:
    """:func:`rotating_sustained` of no policy, the ten rules and the counted policy, checked."""
    rates = await rotating_sustained(targets, count, batch, rounds)
    await check_undecided(targets[1], POLICY.count("[[rules]]"))
    await check_undecided(targets[2], COUNTED_POLICY.count("[[rules]]"))
    return rates


def per_intent(name: str, ours: list[float], floor: list[float], target: Target | None) -> Figure:
    """Microseconds per intent of the round whose ratio to the floor's is the median."""
    ratios = [without / with_ for with_, without in zip(ours, floor, strict=True)]
    median = ratios.index(statistics.median_low(ratios))
    return Figure(name, "µs", 1e6 / ours[median], 1e6 / floor[median], target)


def policy_overhead(quick: bool) -> Result:
    """SQLite sustained throughput with 10 policy rules, and with a counter too, beside none."""
    count, batch, rounds = (1_000, 100, 2) if quick else (20_000, 500, 5)
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        policies: list[Path | None] = [None, scratch / "rules.toml", scratch / "counted.toml"]
        (scratch / "rules.toml").write_text(POLICY)
        (scratch / "counted.toml").write_text(COUNTED_POLICY)
        commands = [
            effector_command(f"sqlite:///{scratch / f'e{index}.db'}", policy=policy)
            for index, policy in enumerate(policies)
        ]
        with servers(commands, EFFECTOR_READY, scratch) as targets:
            none, rules, counted = asyncio.run(policy_rates(targets, count, batch, rounds))
    return Result(
        "policy_overhead",
        "Overhead of an effect policy on the effector's sustained throughput",
        """\
Sustained as in effector_throughput (20,000 `noop` intents over 1,000 keys, 500 a Submit from 4
callers, until every OK result is read) on three SQLite effectors, 5 rounds taking turns. Floor:
no policy. Ours: 10 CEL rules on tool, args and key, none holding (checked), so all 10 run and the
default allows; and those 10 and a rule on a per-key 1 h counter of a tool never submitted, whose
count is queried for each key of a batch. The median round's ratio.""",
        [
            per_intent(
                "sustained, per intent, with a 10-rule policy, SQLite", rules, none, POLICY_TARGET
            ),
            per_intent(
                "sustained, per intent, with the 10 rules and a per-key counter rule, SQLite",
                counted,
                none,
                None,
            ),
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Serve the no-op gRPC floor.")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free)")
    asyncio.run(serve_noop(parser.parse_args().listen))


# -- the console's keys page ----------------------------------------------------------------------


def _page_ms(client: httpx.Client, path: str, requests: int, newest: str) -> list[float]:
    """Milliseconds per load of ``path``, after one warm-up load."""
    client.get(path)
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        answer = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        if answer.status_code != 200 or newest not in answer.text:
            raise RuntimeError(f"{path} answered {answer.status_code} without the newest run")
    return samples


def console_keys(quick: bool) -> Result:
    """The console's page of a key with 1,000 runs, over HTTP from a filled SQLite store."""
    runs, requests, key = 1_000, 2 if quick else 30, b"customer-busy"
    settings = ServerSettings(console_listen="127.0.0.1:0")
    with (
        tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch,
        EffectorThread(f"sqlite:///{Path(scratch) / 'e.db'}", ToolRegistry(), settings) as eff,
    ):
        now_ns = time.time_ns()
        events = key_runs(key, runs, start_ns=now_ns)
        for other in range(100):
            events += key_runs(f"other-{other:03d}".encode(), 10, start_ns=now_ns)
        for start in range(0, len(events), 1_000):
            batch = events[start : start + 1_000]
            eff.run(eff.server.store.record_traces(batch, now_ns // 1_000_000))
        assert eff.console_url is not None
        with httpx.Client(base_url=eff.console_url.rstrip("/"), timeout=60) as client:
            page = f"/keys/{key.hex()}"
            default = _page_ms(client, page, requests, f"Run {runs - 1}")
            full = _page_ms(client, f"{page}?runs={MAX_RUNS}", requests, f"Run {runs - 1}")
    return Result(
        "console_keys",
        "The console's keys page for a key with 1,000 runs",
        """\
An effector's console over a SQLite store holding 1,000 runs of one key (9 trace events each)
and 10 runs of each of 100 other keys. One client loads the key's page, one request at a time:
from sending the GET to having read the whole HTML. No floor.""",
        [
            Figure(
                f"keys page, key with 1,000 runs (newest {DEFAULT_RUNS} drawn), p50",
                "ms",
                percentile(default, 0.5),
                None,
                Target(Goal.BELOW, 300.0),
            ),
            Figure(
                f"keys page, key with 1,000 runs, all {MAX_RUNS:,} drawn, p50",
                "ms",
                percentile(full, 0.5),
            ),
        ],
    )
