"""Benchmark 4's paired rounds, its verdict on their range and the accounts it writes from them."""

from __future__ import annotations

import pytest

from benchmarks import commit_findings, commit_placement, state_commit
from benchmarks.commit_placement import Placement, grew, growth, signed, whole
from benchmarks.in_pipeline import InPipeline
from benchmarks.memory_runs import FLOOR, OURS, SIZES, Paired, Round, Side
from benchmarks.noop_profile import Ranked, Ranking
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
    placement = Placement(
        ours=(InPipeline(26, 6), InPipeline(30, 6)),
        floor=(InPipeline(7, 5), InPipeline(9, 5)),
        alone=(16.0, 18.0),
    )
    inside = {size: {OURS: InPipeline(30, 6), FLOOR: InPipeline(9, 5)} for size in SIZES}
    text = commit_findings.remaining(
        figures, measured, [], placement, "PLACED.", (MEMORY, MEMORY), inside
    )
    assert "At 64 KiB the 5 paired rounds' ratios ran from 1.90x to 2.10x (median 1.98x)" in text
    assert "within 2x in some rounds and not in others, so not met in this run" in text
    assert "ours must cost 4.0 µs an activation less" in text
    assert (
        "at 1 KiB (untargeted, the same code in every round) they ran from 2.67x to 2.67x" in text
    )
    # Round by round at 64 KiB: ours less the floor 38, 44, 39, 36 and 39 µs against the fixed
    # cost of 50 at 1 KiB, so growths of -14 to -6: below zero in every round, not growth.
    assert "Ours less the floor ran 36 to 44 µs over the rounds" in text
    assert "ran 50 µs (median 50.0)" in text
    assert (
        "what ours grew beyond the floor's growth fell in every round (-14 to -6 µs round by "
        "round, median -11)" in text
    )
    assert "the floor's own growth ran 10 µs round by round (median 10)" in text
    assert "cutting 4.0 µs of the fixed cost (median 50.0) would clear 2x here" in text
    # The parts: 10 and 6 of 40 profiled µs applied to our code's 20 µs in the pipeline.
    assert "(1) the memory write, ~5.0 µs" in text and "(2) the activation's path, ~3.0" in text
    # At 64 KiB our code is (30 - 6) - (9 - 5) = 20.0 µs; the cut, 4.0, is 80% of part (1).
    assert "At 64 KiB the worst round needs 4.0 µs cut" in text
    assert "(30.0 - 6.0) - (9.0 - 5.0) = 20.0 µs, which covers it" in text
    assert (
        "the cut is 80% of the largest part with a change proposed, (1), ~5.0, and 50% of all "
        "2 parts with a change proposed, (1) and (2), ~8.0 together" in text
    )
    # No measurable growth: the placement is given as where it would be, were it real.
    assert "is not measurable at any size not met" in text
    assert "where it would be, were it real, follows. PLACED." in text
    assert "At 256 KiB" not in text and "At 1023 KiB" not in text  # both met


MEMORY = Ranking(
    "memory",
    4_000,
    10,
    [
        Ranked("beam_agents/core/_memory_wire.py", "scan", 10.0, 5.0, 1),
        Ranked("beam_agents/core/activation.py", "_new_run", 6.0, 3.0, 1),
    ],
    profiled_us=40.0,
    calls=100,
    plain_us=20.0,
)


def test_a_rounded_zero_prints_without_a_minus() -> None:
    assert signed(-0.3) == "+0" and signed(-1.6) == "-2" and signed(10.4) == "+10"
    assert whole([-0.3, 0.2]) == "0" and whole([-3.2, 4.0]) == "-3 to 4"


def test_growth_pairs_round_i_at_a_size_with_round_i_at_the_smallest() -> None:
    small = _paired((30, 80), (35, 75), (30, 90))
    big = _paired((40, 100), (38, 80), (50, 130))
    grown = growth(small, big)
    assert grown.fixed == pytest.approx([50, 40, 60])
    assert grown.beyond == pytest.approx([10, 2, 20])
    assert grown.floor == pytest.approx([10, 3, 20])
    assert grew(grown.beyond, "x") == "x ran 2 to 20 µs round by round (median 10)"
    assert grew([-3.0, -1.0, 2.0], "x") == "x is not measurable (noise: -3 to 2 µs round by round)"
    # One rule for every range: zero inside it (as printed) is noise, wherever the median is.
    assert "not measurable" in grew([0.3, 5.0, 9.0], "x")
    assert "not measurable" in grew([-5.0, 3.0, 8.0], "x")
    assert grew([-9.0, -4.0, -2.0], "x") == (
        "x fell in every round (-9 to -2 µs round by round, median -4)"
    )


def test_the_placement_leaves_unmeasured_growth_unplaced() -> None:
    placement = Placement(
        ours=(InPipeline(40, 6), InPipeline(140, 8)),
        floor=(InPipeline(10, 5.6), InPipeline(85, 7.9)),
        alone=(20.0, 100.0),
    )
    text = commit_placement.account(placement, [38.0, 40.0, 44.0], ("a", "b"))
    # Our code grew 132 - 34 = 98, the floor's 77.1 - 4.4 = 72.7: +25.3; state calls +2
    # against +2.3: -0.3; the rest of the median 40, +15.0, outside process.
    assert "-0.3 in Beam's state calls" in text
    assert "+25.3 µs in our code" in text and "the rest, +15.0, outside `process`" in text
    # Without Beam our code grew +80; the floor's code is not timed there, so no split.
    assert "our code grew 98.0 µs there, the floor's 72.7" in text
    assert "our code grew 80.0 µs; this run does not time the floor's code without Beam" in text
    assert "is not identified by this run" in text and "allocator" not in text


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
