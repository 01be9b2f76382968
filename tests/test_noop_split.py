"""Benchmark 1's split of a row's gap (``benchmarks/noop_split.py``) and its report text.

Synthetic figures only: the arithmetic of the split, the timing's calibration taken off, and
what the text says about the parameters' cost (the rest of the text: ``test_noop_findings``).
"""

from __future__ import annotations

import pytest

from benchmarks import in_pipeline
from benchmarks.in_pipeline import Calibration, InPipeline, _Clock, _measured, calibrate
from benchmarks.noop_split import Parameters, Split, parameters_estimate, span, split_line


def test_a_span_shows_one_value_or_the_range() -> None:
    assert span([2.04, 1.96]) == "2.0"
    assert span([3.0, 1.25, 2.0]) == "1.2 to 3.0"
    assert span([-1.0, 2.0], sign="+") == "-1.0 to +2.0"
    assert span([1.234, 1.5], 2) == "1.23 to 1.50"


def _split(own: float = 10.0) -> Split:
    return Split(
        own,
        ours=[InPipeline(40.0, 10.0, timing_us=2.0, timing_state_us=0.5), InPipeline(44.0, 12.0)],
        floor=[InPipeline(12.0, 8.0), InPipeline(13.0, 8.0)],
    )


def test_a_split_takes_each_round_apart() -> None:
    split = _split()
    assert split.code == [30.0 - 4.0, 32.0 - 5.0]
    assert split.state == [2.0, 4.0]
    assert split.rest(40.0) == [40.0 - 26.0 - 2.0, 40.0 - 27.0 - 4.0]
    # From the figures as shown: 32.4 - 21.2 - 1.2 = 10.0, where 32.44 - 21.16 - 1.16 would
    # show as 10.1.
    shown = Split(10.0, [InPipeline(22.32, 1.16)], [InPipeline(0.0, 0.0)])
    assert shown.rest(32.44) == [10.0]
    assert split.slower == [3.0, 3.2]
    # With the timing left in: our code plus what the timing booked outside the state calls.
    assert split.slower_timed == [(30.0 + 2.0 - 0.5) / 10.0, 3.2]


def test_the_timing_is_taken_off_by_calls_per_activation() -> None:
    calibration = Calibration(state_call_ns=800.0, state_inner_ns=300.0, process_ns=400.0)
    _Clock.reset()
    _Clock.process_ns, _Clock.state_ns, _Clock.calls, _Clock.state_calls = 50_000, 20_000, 2, 6
    measured = _measured(2, calibration)
    assert measured.state_calls == 3
    assert measured.timing_us == pytest.approx((3 * 800 + 400) / 1000)
    assert measured.timing_state_us == pytest.approx(3 * 300 / 1000)
    assert measured.process_us == pytest.approx(25.0 - 2.8)
    assert measured.state_us == pytest.approx(10.0 - 0.9)
    assert measured.code_us == pytest.approx(15.0 - 1.9)
    with pytest.raises(RuntimeError):
        _measured(3, calibration)
    _Clock.reset()


def test_the_calibration_books_a_state_call_partly_inside_its_own_clock() -> None:
    calibration = calibrate(calls=2_000, rounds=3)
    assert calibration.state_call_ns > calibration.state_inner_ns > 0
    assert calibration.process_ns > 0
    assert in_pipeline._Clock.calls == in_pipeline._Clock.state_calls == 0


PARAMETERS = Parameters(rounds=[7.0, 12.0, 9.0], keys=200, events=20_000)
"""The binding: the median of the rounds' paired differences is 9.0."""


def test_the_parameters_are_an_estimate_with_their_spread() -> None:
    text = parameters_estimate(30.0, PARAMETERS)
    assert (
        "estimated at 9.0 µs/element, the median of the rounds' paired differences (30% of" in text
    )
    assert "+7.0 to +12.0 round by round" in text
    assert "at most" not in text
    assert PARAMETERS.without(90.0, 60.0) == pytest.approx([83 / 60, 78 / 60, 81 / 60])
    none = parameters_estimate(30.0, Parameters([-2.0, -0.5], 200, 20_000))
    assert "nothing measurable to save" in none


def test_the_split_line_gives_our_code_as_the_shown_figures_differ() -> None:
    # 29.54 less 5.66 is 23.88, shown 23.9; the line shows 29.5 less 5.7, 23.8.
    split = Split(17.0, [InPipeline(29.54, 5.66)], [InPipeline(6.1, 4.3)])
    line = split_line("no-op", split, 500, 1, 15.1)
    assert (
        "`process` took 29.5 µs, 5.7 of it in Beam's 0 state calls, so our code took 23.8" in line
    )
