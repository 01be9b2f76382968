"""Smoke runs of the performance suite: each benchmark once at tiny size, its rows present.

Nothing here asserts on speed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.harness import BENCHMARKS, main, run_one
from benchmarks.report import ratios
from tests.pg import find_postgres_bin

SQLITE_ROWS = [
    "sustained intents/s, SQLite",
    "sustained intents/s against bare inserts, SQLite",
    "sustained intents/s against the no-op request rate, SQLite",
    "Submit calls/s (1 intent each, 64 callers), SQLite",
]
ROWS = {
    "noop_activation": ["no-op activation, 100 keys", "model-call activation, 100 keys"],
    "overhead_tiers": [
        *(
            f"activation overhead {label}, L = {latency} ms ({pipelines} pipelines)"
            for latency, pipelines in ((5, 2), (50, 4))
            for label in ("p50", "p99")
        ),
        "overhead growth, p50 at 50 ms over p50 at 5 ms",
    ],
    "run_inference": ["per element, 100 keys"],
    "state_commit": [
        "state commit, memory value of 1 KiB, per element",
        "state commit, memory value of 64 KiB, per element",
    ],
    "suspend_resume": ["round trip p50", "round trip p99"],
    "effector_throughput": SQLITE_ROWS
    + (
        [row.replace("SQLite", "PostgreSQL, 2 replicas") for row in SQLITE_ROWS]
        if find_postgres_bin()
        else []
    ),
    "write_traces": ["the loop with WriteTraces, per event"],
    "console_keys": [
        "keys page, key with 1,000 runs (newest 50 drawn), p50",
        "keys page, key with 1,000 runs, all 1,000 drawn, p50",
    ],
    "replay_backtest": [
        "backtest, 400 recorded activations on 40 keys, per activation",
        "live run with recording, per event",
    ],
    "adapter_overhead": [
        row
        for framework in ("LangGraph", "Pydantic AI", "ADK")
        for row in (
            f"{framework} adapter, per activation",
            f"{framework} adapter's own work over the plain-ctx agent",
        )
    ],
    "end_to_end": ["the loop, activations/s"],
}
WITHOUT_FLOOR = {"round trip p50", "round trip p99", *ROWS["console_keys"]}


def test_every_benchmark_is_smoke_tested() -> None:
    assert list(ROWS) == list(BENCHMARKS)


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_benchmark_rows(name: str) -> None:
    result = run_one(name, quick=True)
    assert [figure.name for figure in result.figures] == ROWS[name]
    for figure in result.figures:
        assert figure.ours > 0
        assert (figure.floor is None) == (figure.name in WITHOUT_FLOOR)
        assert len(figure.cells()) == 6
    assert 1 <= len(result.method.strip().splitlines()) <= 5


def test_suite_writes_a_report_compare_reads(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    assert main(["--quick", "--only", "run_inference", "--output", str(report)]) == 0
    text = report.read_text()
    assert list(ratios(text)) == ["per element, 100 keys"]
    assert len(text.splitlines()) <= 250
    assert max(map(len, text.splitlines())) <= 300


def test_compare_reads_the_report_of_before_issue_41() -> None:
    old = (
        "| 1 | no-op activation, 1,000 keys | 70.4 µs/element | 44.3 µs/element (bare) | 1.59x "
        "| 100,000 | ≤ 1.25x floor | **no** |\n"
        "| 4 | activation, memory value of 1 KiB | 78.5 µs | 36.5 µs (bare) | 2.15x (1.75x to "
        "2.72x) | 5 | — | — |\n"
        "| 5 | round trip p50 | 8.86 ms | — | — | 600 | < 30.0 ms | yes |\n"
    )
    assert ratios(old) == {
        "no-op activation, 1,000 keys": 1.59,
        "activation, memory value of 1 KiB": 2.15,
    }
