"""Benchmark 4's timing of Beam's user-state commit, and its rounds, on real FnApiRunner runs."""

from __future__ import annotations

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


def test_a_cost_below_the_lower_bound_takes_every_round_and_is_not_settled() -> None:
    notes: list[str] = []
    stage = memory_runs.floor_stage(1 << 10)
    with timing_commits() as clock:
        measured = memory_runs.measure(
            1 << 10, 1_000, stage, clock, quick=False, at_least=10.0, notes=notes, name="the floor"
        )
    assert not measured.settled
    assert measured.runs == 2 * memory_runs.MAX_ROUNDS
    assert measured.commit.commit_us > 0
    assert len(notes) == 1 and "still under" in notes[0] and "not judged" in notes[0]


def test_a_plausible_cost_stops_after_the_usual_rounds() -> None:
    notes: list[str] = []
    stage = memory_runs.floor_stage(1 << 10)
    with timing_commits() as clock:
        measured = memory_runs.measure(
            1 << 10, 2_000, stage, clock, quick=False, at_least=0.0, notes=notes, name="the floor"
        )
    assert measured.settled and measured.seconds > 0
    assert measured.runs == 2 * memory_runs.ROUNDS
    assert notes == []


def test_the_lower_bound_is_the_larger_of_the_cpu_inside_process_and_the_smallest_cost() -> None:
    inside = InPipeline(process_us=50.0, state_us=10.0)
    assert memory_runs.lower_bound(inside, smallest=40e-6) == 50e-6
    assert memory_runs.lower_bound(inside, smallest=100e-6) == memory_runs.PLAUSIBLE * 100e-6
