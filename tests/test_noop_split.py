"""Benchmark 1's split of a row's gap (``benchmarks/noop_split.py``) and its report text.

Synthetic figures only: the arithmetic of the split, the timing's calibration taken off, and
what the "What is left" text says about the rest, the parameters and the named parts.
"""

from __future__ import annotations

import pytest

from benchmarks import in_pipeline, noop_activation
from benchmarks.in_pipeline import Calibration, InPipeline, _Clock, _measured, calibrate
from benchmarks.noop_profile import Ranked, Ranking
from benchmarks.noop_split import Parameters, Split, parameters_estimate, span
from benchmarks.report import Figure, Goal, Target


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


def _figure(ours: float, floor: float, bound: float = 1.25) -> Figure:
    target = Target(Goal.RATIO_AT_MOST, bound)
    return Figure("no-op activation, 1,000 keys", "µs/element", ours, 100, floor, target=target)


RANKING = Ranking(
    "no-op",
    1_000,
    10,
    [Ranked("beam_agents/core/tracing.py", "_event", 8.0, 4.0, 2)],
    profiled_us=40.0,
    calls=100,
    plain_us=20.0,
)
"""One named part, trace events: 8.0 µs profiled, ~4.0 without the profiler."""

PARAMETERS = Parameters(rounds=[7.0, 12.0, 9.0], keys=200, events=20_000)
"""The binding: the median of the rounds' paired differences is 9.0."""


def test_the_bound_says_how_much_of_the_named_parts_the_changes_must_remove() -> None:
    # 90 against 60 at 1.25x: 15 µs to lose, of 26.5 µs of our code (3.1x its time without
    # Beam), so about 4.8 µs without Beam, of the 4.0 the one named part takes: more than all.
    text = noop_activation._bound(_figure(90.0, 60.0), _split(), RANKING, 15.0, PARAMETERS)
    assert "must lose 15.0 µs, 57% of our code in the pipeline" in text
    assert "runs at 3.00 to 3.20x its time without Beam" in text
    assert "even removed entirely they cover 83% of it" in text
    # What remains after all of them: 15 / 3.1 - 4.0 µs without Beam, beyond any change named.
    assert f"and {15.0 / 3.1 - 4.0:.1f} µs without Beam would remain" in text
    assert "out of reach of the changes named" in text
    assert "estimated below at 9.0 µs/element" in text
    slight = noop_activation._bound(_figure(90.0, 60.0), _split(), RANKING, 10.0, PARAMETERS)
    assert "would have to remove 81% of those parts' time" in slight
    assert "out of reach" not in slight


def test_the_bound_says_when_the_timing_explained_the_slowdown() -> None:
    text = noop_activation._bound(_figure(90.0, 60.0), _split(own=31.0), RANKING, 10.0, PARAMETERS)
    assert "the timing explained the slowdown" in text


def test_a_rest_below_the_binding_it_holds_is_flagged() -> None:
    split = _split()
    assert noop_activation._rest(split.rest(40.0), PARAMETERS) == ""  # 12.0 and 9.0: not below
    # 36 µs: rests of 8.0 and 5.0, below the binding's 9.0 but within its rounds' 7 to 12.
    above_zero = noop_activation._rest(split.rest(36.0), PARAMETERS)
    assert "below zero" not in above_zero
    assert "the two disagree by 1.0 µs or more and their ranges overlap" in above_zero
    assert "+7.0 to +12.0 round by round" in above_zero
    # 25 µs: rests of -3.0 and -6.0, 12.0 µs or more below the binding's 9.0.
    note = noop_activation._rest(split.rest(25.0), PARAMETERS)
    assert "below zero, below Beam's binding" in note
    assert "disagree by 12.0 µs or more and their ranges do not overlap" in note


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
