"""Load gate: 8 clients submit for 30 seconds; no error, everything executed, memory bounded.

One effector subprocess on SQLite (durable: every commit fsynced) takes Submits from 8
concurrent clients, each with its own channel, for 30 seconds after a short warm-up. Each call
carries a small batch of ``touch`` intents on the client's own keys, in seq order per key.
Every call must succeed and every intent be ACCEPTED; once the clients stop, every accepted
intent must be executed exactly once (the ledger) and DONE (the effector's counts).

Printed: throughput, p50/p99 acknowledgement latency (one Submit call, measured by the
client), and the server's resident memory (``VmRSS`` from ``/proc/<pid>/status``) after the
warm-up and at the end. The growth bound, 64 MiB, is generous: what the server holds per
intent lives in the store on disk, so its memory should stay flat however long it runs (it
grows by about 5 MiB here, from caches warming up), while a leak of a kilobyte or two per
intent would cross the bound over a run of this size (some 50,000 intents).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from effector_harness import make_intent

from beam_agents._protos import SubmitAck, ToolIntent
from effector.client import EffectorClient
from effector.launch import free_port
from tests.semantics.gate_tools import Ledger
from tests.semantics.loop import sidecar

CLIENTS = 8
DURATION_S = 30.0
WARM_UP_S = 3.0
BATCH = 5
KEYS_PER_CLIENT = 40
RSS_GROWTH_BOUND_KIB = 64 * 1024


def rss_kib(pid: int) -> int:
    """The resident set size of process ``pid``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


@dataclass(eq=False)  # a thread, compared by identity
class LoadClient(threading.Thread):
    """Submits batches until told to stop; records each call's latency and every ack."""

    number: int
    address: str
    stop_event: threading.Event
    measuring: threading.Event
    latencies_s: list[float] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(daemon=True, name=f"load-client-{self.number}")
        self._next_seq = [0] * KEYS_PER_CLIENT

    def batch(self, position: int) -> list[ToolIntent]:
        intents = []
        for offset in range(BATCH):
            slot = (position + offset) % KEYS_PER_CLIENT
            key = f"client-{self.number}-key-{slot:02d}".encode()
            intent = make_intent("touch", {"note": "load"}, key=key, seq=self._next_seq[slot])
            # A fresh random id per intent: the load must never lean on deduplication.
            intent.intent_id = str(uuid.uuid4())
            self._next_seq[slot] += 1
            intents.append(intent)
        return intents

    def run(self) -> None:
        position = 0
        with EffectorClient(self.address, timeout_s=30) as client:
            while not self.stop_event.is_set():
                intents = self.batch(position)
                position += BATCH
                started = time.perf_counter()
                try:
                    acks = client.submit(intents)
                except Exception as exc:  # every failure is a gate failure, reported below
                    self.problems.append(f"{type(exc).__name__}: {exc}")
                    continue
                elapsed = time.perf_counter() - started
                if self.measuring.is_set():
                    self.latencies_s.append(elapsed)
                for ack in acks:
                    if ack.outcome != SubmitAck.ACCEPTED:
                        self.problems.append(f"{ack.intent_id}: {ack.outcome} {ack.reason}")
                    else:
                        self.accepted.append(ack.intent_id)


def wait_until_done(client: EffectorClient, expected: int, timeout_s: float) -> float:
    """Wait until the effector has finished ``expected`` intents; returns how long it took."""
    started = time.monotonic()
    while (status := client.status()).done < expected or status.in_flight:
        assert time.monotonic() - started < timeout_s, f"only {status.done} of {expected} done"
        time.sleep(0.2)
    return time.monotonic() - started


def test_eight_clients_for_thirty_seconds(
    tmp_path: Path, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    store = f"sqlite:///{tmp_path / 'effector.db'}"
    with sidecar(store, free_port(), ledger) as effector:
        stop, measuring = threading.Event(), threading.Event()
        clients = [LoadClient(n, effector.address, stop, measuring) for n in range(CLIENTS)]
        try:
            for client in clients:
                client.start()
            time.sleep(WARM_UP_S)
            rss_start = rss_kib(effector.pid)
            measuring.set()
            measured_from = time.monotonic()
            time.sleep(DURATION_S)
            measuring.clear()
            measured_s = time.monotonic() - measured_from
        finally:
            stop.set()
            for client in clients:
                client.join(timeout=60)
        problems = [problem for client in clients for problem in client.problems]
        assert problems == [], problems[:5]
        accepted = [intent_id for client in clients for intent_id in client.accepted]
        assert len(set(accepted)) == len(accepted)
        with EffectorClient(effector.address) as observer:
            drain_s = wait_until_done(observer, len(accepted), timeout_s=120)
        rss_end = rss_kib(effector.pid)

    recorded = Ledger.read(ledger)
    invocations = recorded.invocation_counts()
    assert set(invocations) == set(accepted), "executed intents differ from accepted ones"
    assert set(invocations.values()) == {1}, "an intent was executed more than once"
    latencies = sorted(s for client in clients for s in client.latencies_s)
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(len(latencies) * 0.99)] * 1000
    growth = rss_end - rss_start
    assert growth < RSS_GROWTH_BOUND_KIB, f"server memory grew {growth} KiB"
    gate_report(
        "load",
        f"clients={CLIENTS} duration={measured_s:.0f}s store=sqlite(fsync) batch={BATCH} "
        f"calls={len(latencies)} intents_accepted={len(accepted)} "
        f"rate={len(latencies) * BATCH / measured_s:.0f}/s errors=0 executed={len(invocations)} "
        f"(each once) drain_after_stop={drain_s:.1f}s ack_latency p50={p50:.1f}ms "
        f"p99={p99:.1f}ms rss_start={rss_start / 1024:.1f}MiB rss_end={rss_end / 1024:.1f}MiB "
        f"growth={growth / 1024:.1f}MiB (bound {RSS_GROWTH_BOUND_KIB // 1024}MiB)",
    )
