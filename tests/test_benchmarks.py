"""Smoke runs of the performance suite, so no benchmark can rot between ``make bench`` runs.

Each benchmark runs one tiny iteration (``--quick``) in its own interpreter, exactly as
``make bench`` runs it, and must produce well-formed figures: the expected rows, positive
numbers, sample counts, floors where the benchmark has one. Nothing here asserts on speed.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from benchmarks import effector_throughput, noop_activation
from benchmarks.harness import REPO_ROOT, percentile
from benchmarks.report import BenchmarkResult, Figure, Goal, Target, format_number, render_markdown
from benchmarks.run_all import BENCHMARKS, main, run_in_subprocess

EXPECTED_ROWS = {
    "noop_activation": ["no-op activation, 100 keys", "model-call activation, 100 keys"],
    "overhead_tiers": [
        "activation overhead p50, L = 5 ms (2 pipelines)",
        "activation overhead p99, L = 5 ms (2 pipelines)",
        "activation overhead p50, L = 50 ms (4 pipelines)",
        "activation overhead p99, L = 50 ms (4 pipelines)",
        "overhead growth, p50 at 50 ms over p50 at 5 ms",
        "a key's first activation in its bundle, overhead p50, L = 5 ms",
        "a key's first activation in its bundle, overhead p99, L = 5 ms",
        "a key's first activation in its bundle, overhead p50, L = 50 ms",
        "a key's first activation in its bundle, overhead p99, L = 50 ms",
    ],
    "run_inference": ["per element, 100 keys"],
    "state_commit": [
        "activation, memory value of 1 KiB",
        "activation, memory value of 64 KiB",
        "Beam's commit of a key's state, memory value of 1 KiB",
        "Beam's commit of a key's state, memory value of 64 KiB",
    ],
    "suspend_resume": ["round trip p50", "round trip p99"],
    "effector_throughput": [
        "sustained intents/s, SQLite",
        "sustained intents/s against the no-op request rate, SQLite",
        "Submit calls/s (1 intent each, 64 callers), SQLite",
        "Submit calls/s (1 intent each, 64 callers), SQLite with synchronous=NORMAL",
        "Submit calls/s (100 intents each, 4 callers), SQLite",
        "sustained intents/s, PostgreSQL, 2 replicas",
        "sustained intents/s against the no-op request rate, PostgreSQL, 2 replicas",
        "Submit calls/s (1 intent each, 64 callers), PostgreSQL, 2 replicas",
        "Submit calls/s (100 intents each, 4 callers), PostgreSQL, 2 replicas",
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
        "plain ctx agent back to back, per activation",
        "LangGraph adapter, per activation",
        "LangGraph alone, per conversation",
        "plain ctx agent alongside LangGraph, per activation",
        "LangGraph adapter's own work over the plain-ctx agent",
        "LangGraph adapter's own work over the plain-ctx agent back to back",
        "Pydantic AI adapter, per activation",
        "Pydantic AI alone, per conversation",
        "plain ctx agent alongside Pydantic AI, per activation",
        "Pydantic AI adapter's own work over the plain-ctx agent",
        "Pydantic AI adapter's own work over the plain-ctx agent back to back",
        "ADK adapter, per activation",
        "ADK alone, per conversation",
        "plain ctx agent alongside ADK, per activation",
        "ADK adapter's own work over the plain-ctx agent",
        "ADK adapter's own work over the plain-ctx agent back to back",
    ],
    "scale_out": [
        "speedup, 2 workers over 1, 100 keys",
        "speedup, keys split over 2 processes against 1, 100 keys",
    ],
    "end_to_end": ["the loop, activations/s"],
}
"""The rows each benchmark's quick run must produce, in order."""

WITH_FLOOR = {
    "noop_activation",
    "overhead_tiers",
    "run_inference",
    "state_commit",
    "write_traces",
    "replay_backtest",
    "scale_out",
    "end_to_end",
}
"""Benchmarks whose every row has a floor (the others mix absolute targets and floors)."""


def test_every_benchmark_is_smoke_tested() -> None:
    assert set(EXPECTED_ROWS) == set(BENCHMARKS)


def _assert_well_formed(result: BenchmarkResult, name: str) -> None:
    assert result.name == name
    assert result.title and result.definition.strip()
    assert [figure.name for figure in result.figures] == EXPECTED_ROWS[name]
    for figure in result.figures:
        assert math.isfinite(figure.ours) and figure.ours > 0, figure
        assert figure.samples >= 1, figure
        assert figure.unit, figure
        if name in WITH_FLOOR:
            assert figure.floor is not None and figure.floor > 0, figure
            assert figure.floor_label, figure
        if figure.floor is not None:
            ratio = figure.ratio
            assert ratio is not None and math.isclose(ratio, figure.ours / figure.floor)
        if figure.target is not None:
            assert isinstance(figure.met, bool)
    assert result.elapsed_s > 0


@pytest.mark.parametrize("name", BENCHMARKS)
def test_quick_run_produces_well_formed_figures(name: str) -> None:
    result = run_in_subprocess(name, quick=True, profile=False)
    _assert_well_formed(result, name)


def test_suite_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "BENCHMARKS.md"
    assert main(["--quick", "--only", "noop_activation", "--output", str(report)]) == 0
    text = report.read_text()
    assert text.startswith("# Benchmarks")
    assert "## Machine" in text and "| CPU |" in text and "| Apache Beam |" in text
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert f"| Revision | {head}" in text  # the commit the numbers belong to
    assert "## Results" in text and "| 1 | no-op activation, 100 keys |" in text
    assert "### 1. No-op and model-call activations" in text


def test_unknown_benchmark_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--quick", "--only", "no_such_benchmark"])


def test_a_failing_benchmark_is_reported_without_local_paths() -> None:
    with pytest.raises(RuntimeError, match="exited with status 2") as failure:
        run_in_subprocess("no_such_benchmark", quick=True, profile=False)
    assert "unknown benchmark 'no_such_benchmark'" in str(failure.value)
    assert str(REPO_ROOT) not in str(failure.value)


def test_runagent_profile_names_our_functions() -> None:
    findings, raw = noop_activation.profile(quick=True)
    assert any(finding.startswith("`beam_agents/core/dofn.py` `process`: ") for finding in findings)
    assert any("Proposed fix: " in finding for finding in findings)
    assert raw[0].startswith("profiled ")


def test_effector_profile_covers_the_store_thread() -> None:
    findings, raw = effector_throughput.profile(quick=True)
    assert any(finding.startswith("thread MainThread: busy ") for finding in findings)
    assert any(finding.startswith("thread effector-sqlite") for finding in findings)
    assert any("`sqlite3.Connection.execute` was called" in finding for finding in findings)
    assert any(line.startswith("thread effector-sqlite") for line in raw)


def test_figure_refuses_non_positive_numbers() -> None:
    with pytest.raises(ValueError, match="positive"):
        Figure(name="x", unit="ms", ours=0.0, samples=1)
    with pytest.raises(ValueError, match="floor"):
        Figure(name="x", unit="ms", ours=1.0, samples=1, floor=-1.0)
    with pytest.raises(ValueError, match="sample"):
        Figure(name="x", unit="ms", ours=1.0, samples=0)


def test_targets_are_checked_against_the_right_number() -> None:
    slower = Figure(name="x", unit="µs", ours=3.0, samples=1, floor=2.0)
    assert Target(Goal.RATIO_AT_MOST, 1.5).is_met(slower.ours, slower.ratio)
    assert not Target(Goal.RATIO_AT_MOST, 1.4).is_met(slower.ours, slower.ratio)
    assert Target(Goal.RATIO_AT_LEAST, 1.5).is_met(slower.ours, slower.ratio)
    assert Target(Goal.BELOW, 30.0).is_met(29.9, None)
    assert not Target(Goal.BELOW, 30.0).is_met(30.0, None)
    assert Target(Goal.AT_LEAST, 2_000.0).is_met(2_000.0, None)
    with pytest.raises(ValueError, match="floor"):
        Target(Goal.RATIO_AT_MOST, 1.5).is_met(1.0, None)


def test_a_ratio_is_shown_with_three_decimals_where_two_would_round_across_its_target() -> None:
    rows = []
    for ours in (2_363.0, 2_500.0):  # 0.5952x and 0.6297x of the floor, against at least 0.6x
        figure = Figure(
            name="f",
            unit="/s",
            ours=ours,
            samples=1,
            floor=3_970.0,
            floor_label="floor",
            target=Target(Goal.RATIO_AT_LEAST, 0.6),
        )
        result = BenchmarkResult(name="m", title="t", definition="d", figures=[figure])
        text = render_markdown([result], {}, order=["m"], quick=False, failures={}, elapsed_s=1)
        rows.append(next(line for line in text.splitlines() if line.startswith("| 1 | f |")))
    assert "| 0.595x |" in rows[0] and "**no**" in rows[0]
    assert "| 0.63x |" in rows[1]


def test_results_survive_the_trip_through_json() -> None:
    result = BenchmarkResult(
        name="n",
        title="t",
        definition="d",
        figures=[
            Figure(
                name="f",
                unit="ms",
                ours=2.0,
                samples=3,
                floor=1.0,
                floor_label="floor",
                target=Target(Goal.RATIO_AT_MOST, 1.5),
            )
        ],
        details=["detail"],
        history=["an earlier side measurement (recorded at abc1234)"],
        remaining="Where it goes;\n the next change.",
        elapsed_s=1.0,
    )
    again = BenchmarkResult.from_json(result.to_json())
    assert again == result
    assert again.figures[0].met is False
    text = render_markdown(
        [again], {"CPU": "c"}, order=["m", "n"], quick=True, failures={}, elapsed_s=1.0
    )
    assert "| 2 | f | 2.00 ms | 1.00 ms (floor) | 2.00x | 3 | ≤ 1.50x floor | **no** |" in text
    assert "### 2. t" in text
    assert "Missed: f." in text
    # This run's details and earlier side measurements sit under headings of their own.
    measured, earlier = text.split("Measured in this run:", 1)[1].split("Recorded earlier", 1)
    assert "- detail" in measured and "abc1234" not in measured
    assert "- an earlier side measurement (recorded at abc1234)" in earlier
    left = text.split("## What is left", 1)[1].split("## Notes", 1)[0]
    assert "- **2. t**: missed f.\n  Where it goes; the next change." in left


def _rendered_alone(ours_ms: float, remaining: str = "") -> str:
    """The report of one benchmark whose one figure has the target "below 2 ms"."""
    result = BenchmarkResult(
        name="m",
        title="t",
        definition="d",
        figures=[
            Figure(name="f", unit="ms", ours=ours_ms, samples=1, target=Target(Goal.BELOW, 2))
        ],
        remaining=remaining,
    )
    return render_markdown([result], {}, order=["m"], quick=False, failures={}, elapsed_s=1.0)


def test_what_is_left_says_so_when_every_target_is_met() -> None:
    text = _rendered_alone(1.0, remaining="never shown")
    assert "## What is left\n\nEvery target with a figure in this run was met." in text
    assert "never shown" not in text


def test_a_miss_without_an_account_is_called_unexplained() -> None:
    text = _rendered_alone(3.0)
    left = text.split("## What is left", 1)[1].split("## Notes", 1)[0]
    assert "- **1. t**: missed f.\n  This benchmark gives no account" in left
    assert "this miss is unexplained in this run." in left


def test_percentile_and_number_format() -> None:
    samples = [float(value) for value in range(1, 101)]
    assert percentile(samples, 0.5) == 50.0
    assert percentile(samples, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert [format_number(v) for v in (12_345.6, 123.4, 12.34, 1.234, 0.01234)] == [
        "12,346",
        "123",
        "12.3",
        "1.23",
        "0.0123",
    ]
