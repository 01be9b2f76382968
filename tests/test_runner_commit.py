"""Benchmark 4's timing of Beam's user-state commit, and its rounds, on real FnApiRunner runs."""

from __future__ import annotations

import time

import pytest
from apache_beam.runners.worker import bundle_processor, statecache

from benchmarks import memory_runs
from benchmarks.in_pipeline import InPipeline
from benchmarks.pipelines import bare_stateful, keyed_events, run_pipeline, source_only
from benchmarks.runner_commit import CommitClock, commit_of, per_key, timing_commits


def test_a_stateful_pipeline_commits_once_per_bundle_and_its_weighing_is_timed_within() -> None:
    with timing_commits() as clock:
        commit = commit_of(lambda: run_pipeline(keyed_events(200, 10), bare_stateful), clock, 10)
        assert clock.commits == 1
    assert commit.commit_us > 0
    assert 0 < commit.weigh_us <= commit.commit_us


def test_the_patches_are_undone_when_the_timing_ends() -> None:
    commit, weigh = bundle_processor.FnApiUserStateContext.commit, statecache.get_deep_size
    with timing_commits():
        assert bundle_processor.FnApiUserStateContext.commit is not commit
        assert statecache.get_deep_size is not weigh
    assert bundle_processor.FnApiUserStateContext.commit is commit
    assert statecache.get_deep_size is weigh


def test_weighing_outside_a_commit_is_not_counted() -> None:
    with timing_commits() as clock:
        assert statecache.get_deep_size([b"x" * 100]) > 0
    assert clock.weigh_ns == 0


def test_a_pipeline_without_state_has_no_commit_to_report() -> None:
    with timing_commits() as clock, pytest.raises(RuntimeError, match="no user-state commit"):
        commit_of(lambda: run_pipeline(keyed_events(20, 2), source_only), clock, 2)


def test_per_key_divides_by_the_keys() -> None:
    clock = CommitClock(commit_ns=40_000, weigh_ns=10_000, commits=1)
    commit = per_key(clock, 10)
    assert (commit.commit_us, commit.weigh_us) == (4.0, 1.0)


def test_measure_runs_a_fixed_number_of_interleaved_rounds_alternating_the_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stages = {memory_runs.FLOOR: source_only, memory_runs.OURS: bare_stateful}
    names = {id(stage): name for name, stage in stages.items()}
    runs: list[tuple[str, int]] = []
    cpu = [0.0]  # the fake process clock: the floor costs 1 s and ours 3 s per 100 activations

    def fake_run(elements: list[object], stage: object) -> None:
        runs.append((names[id(stage)], len(elements)))
        cpu[0] += (3.0 if runs[-1][0] == memory_runs.OURS else 1.0) * len(elements) / 100
        clock.commits, clock.commit_ns = 1, 10_000

    monkeypatch.setattr(memory_runs, "run_pipeline", fake_run)
    monkeypatch.setattr(time, "process_time", lambda: cpu[0])
    with timing_commits() as clock:
        paired = memory_runs.measure(1 << 10, 100, stages, clock, quick=False)
    floor, ours = memory_runs.FLOOR, memory_runs.OURS
    first = [(floor, 100), (ours, 100), (floor, 200), (ours, 200)]
    second = [(ours, 100), (floor, 100), (ours, 200), (floor, 200)]
    order = [first if index % 2 == 0 else second for index in range(memory_runs.ROUNDS)]
    assert runs == [run for round_ in order for run in round_]
    assert len(paired.rounds) == memory_runs.ROUNDS
    assert all(round_.ratio == pytest.approx(3.0) for round_ in paired.rounds)
    assert paired.ours.runs == paired.floor.runs == 2 * memory_runs.ROUNDS
    assert paired.ours.commit.commit_us == pytest.approx(1.0)


def test_measure_on_real_pipelines_pairs_the_floor_and_ours() -> None:
    stages = {
        memory_runs.FLOOR: memory_runs.floor_stage(1 << 10),
        memory_runs.OURS: memory_runs.agent_stage(memory_runs.rewrite_memory),
    }
    with timing_commits() as clock:
        paired = memory_runs.measure(1 << 10, 20, stages, clock, quick=True)
    assert len(paired.rounds) == 1 and paired.rounds[0].ratio > 0
    assert paired.floor.commit.commit_us > 0 and paired.ours.commit.commit_us > 0
    assert paired.ours.net_us < paired.ours.commit.commit_us


def test_the_lower_bound_is_the_larger_of_the_cpu_inside_process_and_the_smallest_cost() -> None:
    inside = InPipeline(process_us=50.0, state_us=10.0)
    assert memory_runs.lower_bound(inside, smallest=40e-6) == 50e-6
    assert memory_runs.lower_bound(inside, smallest=100e-6) == memory_runs.PLAUSIBLE * 100e-6
