"""Benchmark 4's placement of the commit's growth: the arithmetic of its account."""

from __future__ import annotations

from benchmarks.commit_placement import Placement, account, shown, tenths
from benchmarks.in_pipeline import InPipeline


def test_the_growth_beyond_the_floor_is_split_into_code_state_calls_and_the_rest() -> None:
    placement = Placement(
        ours=(InPipeline(process_us=50, state_us=5), InPipeline(process_us=200, state_us=30)),
        floor=(InPipeline(process_us=10, state_us=4), InPipeline(process_us=100, state_us=24)),
        alone=(30.0, 110.0),
    )
    # Beyond the floor, round by round: the median, 115, is what the account places.
    text = account(placement, [100.0, 115.0, 130.0], ("1 KiB", "1023 KiB"))
    assert "what ours grew beyond the floor's growth ran 100 to 130 µs round by round" in text
    assert "its median, +115.0 µs, placed in the pipeline" in text
    # Our code grew 125, the floor's 70: +55. State calls grew 25 against 20: +5. The rest,
    # 115 - 55 - 5 = 55, outside process: the three add up to the median.
    assert "+55.0 µs in our code beyond the floor's own code" in text
    assert "+5.0 in Beam's state calls beyond the floor's, and the rest, +55.0, outside" in text
    # In `process` our code grew 145 - 20 = 125, the floor's 76 - 6 = 70; without Beam our
    # code grew 80, and the floor's code is not timed there: no split of the +55 is printed.
    assert "our code grew 125.0 µs there, the floor's 70.0" in text
    assert "Without Beam (`benchmarks/core_only.py`, the same events) our code grew 80.0" in text
    assert "this run does not time the floor's code without Beam" in text
    assert "how much of our code's +55.0 beyond the floor's is work with the value" in text
    assert "our own work with the value" not in text and "+10.0" not in text


def test_a_growth_whose_range_holds_zero_is_placed_as_noise() -> None:
    placement = Placement(
        ours=(InPipeline(50, 5), InPipeline(60, 5)),
        floor=(InPipeline(10, 4), InPipeline(20, 4)),
        alone=(30.0, 40.0),
    )
    text = account(placement, [-7.0, 3.0, 16.0], ("1 KiB", "1023 KiB"))
    assert "is not measurable (noise: -7 to 16 µs round by round)" in text


def test_printed_parts_add_up_to_the_printed_total() -> None:
    code, state, rest = tenths(40.04, 36.26, 1.24)
    assert (code, state, rest) == (36.3, 1.2, 2.5)
    assert round(code + state + rest, 1) == 40.0


def test_a_rounded_zero_prints_without_a_minus() -> None:
    assert tenths(0.0, -0.04) == (0.0, 0.0) and f"{tenths(0.0, -0.04)[0]:+.1f}" == "+0.0"


def test_our_code_is_printed_as_the_difference_of_the_printed_figures() -> None:
    # 55.54 - 8.16 = 47.38 would print 47.4; the printed 55.5 less 8.2 is 47.3.
    assert shown(InPipeline(process_us=55.54, state_us=8.16)) == (55.5, 8.2, 47.3)
