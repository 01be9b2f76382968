"""Benchmark 6's profiled one-intent Submit round: the event loop's parts and the next change."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import submit_profile
from benchmarks.submit_account import submit_account
from benchmarks.submit_profile import PARTS, LoopProfile, parts_text
from benchmarks.submit_split import SubmitSplit
from tests.test_submit_split import NOOP, OURS, _commits, _overlap, _row
from tests.test_submit_split import _two_cores as _two_cores  # autouse: the splits' 2 cores

PROFILE = LoopProfile(4_000, (0.10, 0.05, 0.02, 0.03, 0.80))
"""Checks 10%, hand-off 5%, flusher 2%, the rest of the handler 3%, around the call 80%."""


def test_the_parts_are_sized_by_their_share_of_the_loops_cpu_and_the_next_change_named() -> None:
    text = parts_text(PROFILE, 150, 60.0)
    # 10% of 150 is 15.0, 5% 7.5, 2% 3.0, 3% 4.5, 80% 120.0.
    assert "(1) Submit's checks (`identity_problem`, and `intake_rejection`" in text
    assert "validates the arguments) 10% (~15.0 µs): at intake keep only the verdict" in text
    assert "(2) the hand-off on Submit's side" in text and "5% (~7.5 µs): await" in text
    assert "2% (~3.0 µs): none proposed: one round trip" in text
    assert "3% (~4.5 µs): none proposed: one acknowledgement" in text
    assert "80% (~120.0 µs): none proposed: the no-op server" in text
    # Only (1) and (2) propose a change: 22.5 together, 37.5 short of 60.
    assert "The next change is (1), at most ~15.0 µs of the loop's CPU per call" in text
    assert "the parts with a change take ~22.5 together, short of the 60.0 µs" in text
    assert "(37.5 short): no change this run identifies is shown to reach the target." in text
    assert text.endswith("which this run does not measure.")
    # A smaller cut the two could cover, only removing 44% of them, one for one.
    text = parts_text(PROFILE, 150, 10.0)
    assert "which would cover the 10.0 µs a call must lose only were a call's time" in text
    assert "only if they removed 44% of those parts" in text
    assert "no change this run identifies is shown to reach the target" in text


def test_the_largest_part_with_a_change_comes_first() -> None:
    text = parts_text(LoopProfile(100, (0.02, 0.06, 0.02, 0.10, 0.80)), 200, 50.0)
    assert "The next change is (2), at most ~12.0 µs" in text


def test_a_wait_outside_the_commits_names_the_loops_next_change_when_profiled() -> None:
    split = SubmitSplit(1, NOOP, OURS, _overlap(0.2))
    row = _row(split=split, commits=_commits(0.3, 1.0, 20.0))
    unprofiled = submit_account([row])
    assert "the next step is splitting the wait outside the commits" in unprofiled
    text = submit_account([dataclasses.replace(row, loop=PROFILE)])
    assert "The store's commits are ruled out as a call's main wait" in text
    # The split round's loop: 140 µs of CPU a call; 10% of it is 14.0.
    assert "times the 140 µs of loop CPU per call of the split round" in text
    assert "The next change is (1), at most ~14.0 µs of the loop's CPU per call" in text
    assert "the next step is splitting" not in text
    assert "Whether a change shortens a call is checked by splitting the wait" in text


def test_a_real_profiled_round_splits_the_loop_into_every_part() -> None:
    profile = submit_profile.measure(300)
    assert profile is not None and profile.calls == 300
    assert len(profile.shares) == len(PARTS)
    assert sum(profile.shares) == pytest.approx(1.0)
    # Every part of Submit's own work ran, and gRPC's and asyncio's took the rest.
    assert all(share > 0 for share in profile.shares)


def test_the_work_around_the_call_is_set_beside_the_noop_servers_whole_loop() -> None:
    # 80% of 150 is 120.0 around the call, against the no-op's 90 µs loop: ~30.0 beyond.
    text = parts_text(PROFILE, 150, 60.0, 90)
    assert "Of (5), ~30.0 µs is beyond the no-op server's whole event loop in its split" in text
    assert "round (90 µs a call): work it does not do, the suspension and the resumption" in text
    # Not beyond: nothing said.
    assert "is beyond the no-op" not in parts_text(PROFILE, 150, 60.0, 130)
