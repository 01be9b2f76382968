"""Benchmark 4's placement of the commit's growth: the arithmetic of its account."""

from __future__ import annotations

from benchmarks.commit_placement import Placement, account
from benchmarks.in_pipeline import InPipeline
from benchmarks.report import Figure


def test_the_growth_beyond_the_floor_is_split_into_code_state_calls_and_the_rest() -> None:
    placement = Placement(
        ours=(InPipeline(process_us=50, state_us=5), InPipeline(process_us=200, state_us=30)),
        floor=(InPipeline(process_us=10, state_us=4), InPipeline(process_us=100, state_us=24)),
        alone=(30.0, 110.0),
    )
    smallest = Figure(name="1 KiB", unit="µs/activation", ours=80, samples=1, floor=45)
    largest = Figure(name="1023 KiB", unit="µs/activation", ours=260, samples=1, floor=110)
    text = account(placement, smallest, largest, ("1 KiB", "1023 KiB"))
    # Beyond the floor: (260 - 110) - (80 - 45) = 115. Our code grew 125, the floor's 70: +55.
    # State calls grew 25 against 20: +5. Outside process: 115 - 55 - 5 = 55.
    assert "ours grew 115 µs beyond the floor's growth" in text
    assert "+55 µs in our code beyond the floor's own code" in text
    assert "+5 in Beam's state calls beyond the floor's, and +55 outside `process`" in text
    # Alone our code grew 80, +10 beyond the floor's code (70); the other +45 is the interplay.
    assert "our code grew 80 µs, +10 beyond the growth of the floor's code" in text
    assert "the other +45 µs our code grew beyond the floor's in the pipeline" in text
