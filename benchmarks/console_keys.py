"""Benchmark 8: the web console's keys page for a key with 1,000 runs.

The effector serves its console from a SQLite store filled through ``record_traces``; one
client times the key's page over HTTP (see ``DEFINITION``). Not a timed unit test.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx

from beam_agents.tools import ToolRegistry
from benchmarks.harness import percentile
from benchmarks.report import BenchmarkResult, Figure, Goal, Target
from effector.console.pages import DEFAULT_RUNS, MAX_RUNS
from effector.launch import EffectorThread
from effector.server import ServerSettings
from tests.console.runs_data import key_runs

TITLE = "The console's keys page for a key with 1,000 runs"

DEFINITION = f"""\
An effector on a fresh SQLite store (default `synchronous=FULL`) serves its console
(`--console-listen 127.0.0.1:0`) from its own event loop. The store holds, through
`record_traces` (what `WriteTraces` calls), 1,000 runs of one key (9 trace events each, with
GenAI attributes and wall-clock times: an activation, a model call, a tool call, an approval
intent, the suspension, the resume, a second model call, a payment intent and the end with
the memory's slots) plus 10 runs on each of 100 other keys. One client on 127.0.0.1 then loads
the key's page over HTTP, one request at a time: **render time = from sending the GET to having
read the whole HTML response**: the store query (`traces_for_key`), building the waterfalls,
the other queries of the page (open intents, errors), rendering the Jinja2 template and the
transfer. The page draws the newest {DEFAULT_RUNS} runs by default (and links to more); the
second row draws all {MAX_RUNS} (`?runs={MAX_RUNS}`, about 4.5 MB of HTML), for scale. Target:
the page (as it opens) under 300 ms at p50."""

RUNS = 1_000
OTHER_KEYS = 100
REQUESTS = 30
QUICK_REQUESTS = 2
TARGET = Target(Goal.BELOW, 300.0)


def _fill(effector: EffectorThread, key: bytes) -> int:
    """Record the busy key's runs and the other keys' runs; how many events."""
    now_ns = time.time_ns()
    events = key_runs(key, RUNS, start_ns=now_ns)
    for other in range(OTHER_KEYS):
        events += key_runs(f"other-{other:03d}".encode(), 10, start_ns=now_ns)
    store = effector.server.store
    for start in range(0, len(events), 1_000):
        effector.run(store.record_traces(events[start : start + 1_000], now_ns // 1_000_000))
    return len(events)


def _time_page(client: httpx.Client, path: str, requests: int) -> tuple[list[float], int]:
    """Milliseconds per load of ``path`` (after one warm-up load), and the page's size."""
    size = len(client.get(path).content)
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        answer = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        if answer.status_code != 200 or f"Run {RUNS - 1}" not in answer.text:
            raise RuntimeError(f"{path} answered {answer.status_code} without the newest run")
    return samples, size


def run(quick: bool) -> BenchmarkResult:
    """Fill a store, serve its console, and time the key's page."""
    requests = QUICK_REQUESTS if quick else REQUESTS
    key = b"customer-busy"
    settings = ServerSettings(console_listen="127.0.0.1:0")
    with (
        tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch,
        EffectorThread(f"sqlite:///{Path(scratch) / 'e.db'}", ToolRegistry(), settings) as eff,
    ):
        events = _fill(eff, key)
        assert eff.console_url is not None
        with httpx.Client(base_url=eff.console_url.rstrip("/"), timeout=60) as client:
            default, default_size = _time_page(client, f"/keys/{key.hex()}", requests)
            full, full_size = _time_page(client, f"/keys/{key.hex()}?runs={MAX_RUNS}", requests)
    figures = [
        Figure(
            name=f"keys page, key with 1,000 runs (newest {DEFAULT_RUNS} drawn), p50",
            unit="ms",
            ours=percentile(default, 0.5),
            samples=len(default),
            target=TARGET,
        ),
        Figure(
            name=f"keys page, key with 1,000 runs, all {MAX_RUNS:,} drawn, p50",
            unit="ms",
            ours=percentile(full, 0.5),
            samples=len(full),
        ),
    ]
    details = [
        f"{events:,} trace events stored ({RUNS:,} runs of the key, 10 of each of "
        f"{OTHER_KEYS} other keys). The default page is {default_size / 1024:.0f} KiB, p99 "
        f"{percentile(default, 0.99):.1f} ms; with every run drawn it is "
        f"{full_size / 1024 / 1024:.1f} MiB, p99 {percentile(full, 0.99):.0f} ms."
    ]
    return BenchmarkResult(
        name="console_keys", title=TITLE, definition=DEFINITION, figures=figures, details=details
    )
