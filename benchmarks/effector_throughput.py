"""Effector throughput: sustained intents/s end to end, beside a no-op gRPC round trip.

Starts a real effector (``python -m effector serve``) on a fresh store, submits intents for a
no-op side-effecting tool in batches from several concurrent submitters, and reads the result
envelopes back through ``Read`` until every intent's result has been seen. Reported:

- sustained intents/s: intents / (first submit → last result envelope read), so each counted
  intent was recorded, executed, its result made durable and then published;
- p50/p99 Submit acknowledgement latency (one batch per Submit);
- the floor: p50/p99 of a no-op gRPC round trip (health ``Check``) to the same server, measured
  in the same run.

Run ``python benchmarks/effector_throughput.py`` (``--quick`` for a one-iteration smoke run,
``--store postgresql://...`` to measure PostgreSQL instead of SQLite).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from beam_agents._protos import ToolIntent
from beam_agents.tools import ToolRegistry, tool
from effector.client import AsyncEffectorClient

REPO = Path(__file__).resolve().parent.parent


@tool(side_effect=True)
def noop() -> None:
    """Do nothing: the benchmark measures the effector, not a tool."""


def make_registry() -> ToolRegistry:
    """The benchmark's tools (loaded by the effector subprocess)."""
    return ToolRegistry([noop])


def _intents(count: int, keys: int, run: str) -> list[ToolIntent]:
    intents = []
    for index in range(count):
        key = f"{run}-key-{index % keys}".encode()
        seq = index // keys
        intents.append(
            ToolIntent(
                intent_id=str(uuid.uuid5(uuid.NAMESPACE_OID, f"{key.hex()}|{seq}|0")),
                entity_key=key,
                seq=seq,
                tool_name="noop",
                args_json="{}",
                kind=ToolIntent.TOOL,
            )
        )
    return intents


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _floor(client: AsyncEffectorClient, calls: int) -> list[float]:
    latencies = []
    for _ in range(calls):
        started = time.perf_counter()
        await client.health()
        latencies.append(time.perf_counter() - started)
    return latencies


async def _measure(
    target: str, count: int, keys: int, batch: int, submitters: int
) -> dict[str, float]:
    async with AsyncEffectorClient(target) as client:
        await _floor(client, 50)  # warm the channel
        floor = await _floor(client, 500)
        intents = _intents(count, keys, uuid.uuid4().hex[:8])
        batches = [intents[i : i + batch] for i in range(0, count, batch)]
        ack_latencies: list[float] = []
        head = (await client.status()).head_offset

        async def submitter(worker: int) -> None:
            for chunk in batches[worker::submitters]:
                started = time.perf_counter()
                acks = await client.submit(chunk)
                ack_latencies.append(time.perf_counter() - started)
                assert all(ack.outcome == ack.ACCEPTED for ack in acks), acks[0]

        async def reader() -> None:
            offset, seen = head + 1, 0
            while seen < count:
                response = await client.read(offset, max_batch=5_000, wait_ms=1_000)
                seen += sum(1 for r in response.records if r.envelope.tool_result.status == 1)
                offset = response.next_offset

        started = time.perf_counter()
        reading = asyncio.create_task(reader())
        await asyncio.gather(*(submitter(i) for i in range(submitters)))
        submitted = time.perf_counter() - started
        await reading
        elapsed = time.perf_counter() - started
    return {
        "intents": count,
        "elapsed_s": elapsed,
        "intents_per_s": count / elapsed,
        "submit_only_per_s": count / submitted,
        "ack_p50_ms": statistics.median(ack_latencies) * 1000,
        "ack_p99_ms": _percentile(ack_latencies, 0.99) * 1000,
        "floor_p50_ms": statistics.median(floor) * 1000,
        "floor_p99_ms": _percentile(floor, 0.99) * 1000,
    }


def _start_server(store_url: str, concurrency: int) -> tuple[subprocess.Popen[str], str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(Path(__file__).resolve().parent), environment.get("PYTHONPATH", "")]
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "effector",
            "serve",
            "--tools",
            "effector_throughput:make_registry",
            "--store",
            store_url,
            "--listen",
            "127.0.0.1:0",
            "--concurrency",
            str(concurrency),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("effector listening on "):
        process.kill()
        raise SystemExit(f"effector did not start: {line!r}")
    return process, line.removeprefix("effector listening on ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small iteration (smoke run)")
    parser.add_argument("--store", help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--intents", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.intents, args.iterations = 2_000, 1
    with tempfile.TemporaryDirectory(prefix="effector-bench-") as scratch:
        store_url = args.store or f"sqlite:///{scratch}/bench.db"
        process, target = _start_server(store_url, args.concurrency)
        try:
            runs = [
                asyncio.run(_measure(target, args.intents, args.keys, args.batch, args.submitters))
                for _ in range(args.iterations)
            ]
        finally:
            process.terminate()
            process.wait(timeout=60)
    best = max(runs, key=lambda run: run["intents_per_s"])
    store_kind = "postgresql" if store_url.startswith("postgres") else "sqlite"
    print(
        f"effector throughput ({store_kind}, {args.intents} intents over {args.keys} keys, "
        f"batches of {args.batch}, {args.submitters} submitters, best of {len(runs)})"
    )
    rows = [
        ("sustained intents/s (submit → result read)", f"{best['intents_per_s']:,.0f}"),
        ("submit-only intents/s", f"{best['submit_only_per_s']:,.0f}"),
        (
            "submit ack p50 / p99 (ms per batch)",
            f"{best['ack_p50_ms']:.1f} / {best['ack_p99_ms']:.1f}",
        ),
        (
            "floor: no-op gRPC round trip p50 / p99 (ms)",
            f"{best['floor_p50_ms']:.3f} / {best['floor_p99_ms']:.3f}",
        ),
        ("all runs, intents/s", ", ".join(f"{run['intents_per_s']:,.0f}" for run in runs)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
