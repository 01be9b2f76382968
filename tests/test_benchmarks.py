"""Smoke runs of the performance suite: each benchmark once at tiny size, its rows present.

Nothing here asserts on speed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.harness import (
    BENCHMARKS,
    environment,
    instruction_total,
    instructions_per_element,
    main,
    run_one,
)
from benchmarks.pipelines import activation_command, activation_target
from benchmarks.report import Goal, Target, ratios
from tests.pg import find_postgres_bin

SQLITE_ROWS = [
    "sustained intents/s, SQLite",
    "sustained intents/s against bare inserts, SQLite",
    "sustained intents/s against the no-op request rate, SQLite",
    "Submit calls/s (1 intent each, 64 callers), SQLite",
]
ROWS = {
    "noop_activation": ["no-op activation, 100 keys", "model-call activation, 100 keys"],
    "budget_overhead": ["model-call activation with a fleet budget, 100 keys"],
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
    "policy_overhead": [
        "sustained, per intent, with a 10-rule policy, SQLite",
        "sustained, per intent, with the 10 rules and a per-key counter rule, SQLite",
    ],
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


def test_activation_targets_are_issue_44s() -> None:
    assert activation_target("ours", 1_000) == Target(Goal.RATIO_AT_MOST, 1.2)
    assert activation_target("model", 1_000) == Target(Goal.RATIO_AT_MOST, 1.6)
    assert activation_target("model", 10_000) == Target(Goal.RATIO_AT_MOST, 1.4)


CACHEGRIND_SUMMARY = """\
==4242== Cachegrind, a cache and branch-prediction profiler
==4242== Command: python -c pass
==4242==
==4242== I   refs:      17,088,478,178
"""


def test_instruction_total_reads_valgrinds_summary() -> None:
    assert instruction_total(CACHEGRIND_SUMMARY) == 17_088_478_178
    with pytest.raises(ValueError, match="I refs"):
        instruction_total("==4242== Command: python -c pass\n")


FAKE_VALGRIND = """\
#!/bin/sh
for argument; do cost=$count; count=$argument; done
echo "==7== I   refs:      $((1000000 + cost * count))" >&2
"""
COSTS = {"floor": 250, "ours": 400}
"""Instructions per element of the fake commands, by name."""


def fake_command(name: str, count: int) -> list[str]:
    """The fake valgrind's arguments: an element's cost and the element count."""
    return [str(COSTS[name]), str(count)]


def test_instructions_per_element_is_the_difference_over_the_added_elements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert instructions_per_element(fake_command, COSTS, 2_000, 2_000) is None
    valgrind = tmp_path / "valgrind"
    valgrind.write_text(FAKE_VALGRIND)
    valgrind.chmod(0o755)
    assert instructions_per_element(fake_command, COSTS, 2_000, 1_000) == {
        "floor": 250.0,
        "ours": 400.0,
    }


@pytest.mark.parametrize("stage", ["floor", "ours", "model floor", "model"])
def test_the_counted_command_runs_an_activation_stage(stage: str) -> None:
    subprocess.run(activation_command(stage, 20, keys=5), env=environment(), check=True)
