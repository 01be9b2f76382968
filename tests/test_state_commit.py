"""Benchmark 4's paired rounds, its verdict on their range and the accounts it writes from them."""

from __future__ import annotations

import pytest

from benchmarks import state_commit
from benchmarks.in_pipeline import InPipeline
from benchmarks.memory_runs import FLOOR, OURS, SIZES, Paired, Round, Side
from benchmarks.report import BenchmarkResult, Figure, Goal, Target, figure_row
from benchmarks.runner_commit import KeyCommit

TARGET = Target(Goal.RATIO_AT_MOST, 2.0)


def _paired(*rounds_us: tuple[float, float], net: tuple[float, float] = (60.0, 40.0)) -> Paired:
    """Rounds of (floor, ours) in µs, and each side's commit (1,300 µs, net of weighing ``net``)."""
    rounds = tuple(Round(floor / 1e6, ours / 1e6) for floor, ours in rounds_us)
    floor = sorted(round_.floor for round_ in rounds)[len(rounds) // 2]
    ours = sorted(round_.ours for round_ in rounds)[len(rounds) // 2]
    return Paired(
        rounds,
        Side(floor, KeyCommit(1_300.0, 1_300.0 - net[1]), net[1], 10),
        Side(ours, KeyCommit(1_300.0, 1_300.0 - net[0]), net[0], 10),
    )


def test_the_median_round_and_the_range_come_from_the_paired_ratios() -> None:
    paired = _paired((40, 80), (40, 84), (50, 95), (40, 78), (41, 77.9))
    assert paired.median == Round(40e-6, 78e-6)  # ratios 2.0, 2.1, 1.9, 1.95 and 1.9
    assert paired.spread == pytest.approx((1.9, 2.1))
    assert paired.worst_excess(2.0) == pytest.approx(4e-6)  # the 84 µs round, over 80


def test_a_figure_is_met_only_if_its_whole_range_meets_the_target() -> None:
    inside = Figure("x", "µs", ours=78, samples=5, floor=40, target=TARGET, spread=(1.8, 1.99))
    across = Figure("x", "µs", ours=78, samples=5, floor=40, target=TARGET, spread=(1.9, 2.06))
    assert inside.met is True and across.met is False
    assert "1.95x (1.90x to 2.06x)" in figure_row(4, across)
    with pytest.raises(ValueError, match="spread"):
        Figure("x", "µs", ours=1, samples=1, floor=1, spread=(2.0, 1.0))


def test_a_range_survives_the_json_between_processes() -> None:
    figure = Figure("x", "µs", ours=78, samples=5, floor=40, target=TARGET, spread=(1.9, 2.06))
    result = BenchmarkResult(name="b", title="t", definition="d", figures=[figure])
    assert BenchmarkResult.from_json(result.to_json()).figures == [figure]


def _figures(measured: dict[int, Paired]) -> list[Figure]:
    return [
        state_commit._activation(f"{size}", paired, TARGET if size > SIZES[0] else None)
        for size, paired in measured.items()
    ]


def test_a_range_across_2x_is_not_met_and_the_account_splits_the_excess() -> None:
    steady = ((30, 80), (30, 80), (30, 80), (30, 80), (30, 80))
    measured = {
        SIZES[0]: _paired(*steady),
        SIZES[1]: _paired((40, 78), (40, 84), (40, 79), (40, 76), (40, 79)),
        SIZES[2]: _paired((45, 85), (45, 85), (45, 85), (45, 85), (45, 85)),
        SIZES[3]: _paired((100, 180), (100, 180), (100, 180), (100, 180), (100, 180)),
    }
    figures = _figures(measured)
    assert [figure.met for figure in figures] == [None, False, True, True]
    text = state_commit._remaining(figures, measured, [], "PLACED.")
    assert "At 64 KiB the 5 paired rounds' ratios ran from 1.90x to 2.10x (median 1.98x)" in text
    assert "within 2x in some rounds and not in others, so not met in this run" in text
    assert "ours must cost 4.0 µs an activation less" in text
    assert (
        "at 1 KiB (untargeted, the same code in every round) they ran from 2.67x to 2.67x" in text
    )
    # Ours less the floor at 64 KiB: 39 µs; the fixed cost (at 1 KiB) 50 µs; the growth -11.
    assert "39 µs, 50 µs is the fixed cost" in text and "-11 µs is what ours grew" in text
    assert "cutting 4.0 of the fixed cost's 50 µs would clear 2x here" in text
    assert 'Benchmark 1\'s "What is left"' in text and "the memory write" in text
    assert "PLACED." not in text  # the growth is under the unplaced bound: the fixed cost first
    assert "256 KiB" not in text and "1023 KiB" not in text


def test_the_commit_account_gives_the_ratio_net_of_the_weighing() -> None:
    measured = {size: _paired((30, 60), (30, 60), (30, 60)) for size in SIZES}
    work = _figures(measured)
    commits = [state_commit._commit(f"{size}", p, None) for size, p in measured.items()]
    text = state_commit._commit_account(
        work, commits, list(measured.values()), ["a", "b", "c", "d"]
    )
    assert "a: ours 1300 µs, 1240 of it weighing, the floor 1300 µs, 1260 of it weighing" in text
    assert "net ours 60 against 40, 1.50x" in text
    assert "The target is judged on the whole commit." in text


def test_a_median_below_its_lower_bound_is_noted_and_not_judged() -> None:
    measured = {
        SIZES[0]: _paired((30, 80), (30, 80), (30, 80)),
        SIZES[1]: _paired((40, 60), (40, 60), (40, 60)),  # ours under 0.9 x its 80 at 1 KiB
    }
    inside = {size: {FLOOR: InPipeline(10, 5), OURS: InPipeline(20, 5)} for size in measured}
    notes = state_commit._implausible(measured, inside)
    assert list(notes) == [SIZES[1]]
    assert notes[SIZES[1]] == [
        "Not judged: ours at 64 KiB cost 60.0 µs an activation (median of the rounds), under its "
        "lower bound of 72.0 µs; the row is reported, not judged against the target."
    ]
