"""Benchmark 6's paired rounds (verdicts by every round), thread names, and where calls wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import named_threads, usage
from benchmarks.group_commits import GroupCommits, Wait, where
from benchmarks.harness import REPO_ROOT
from benchmarks.paired_rounds import (
    Batch,
    Pairs,
    paired_figure,
    range_text,
    straddles,
    verdict,
)
from benchmarks.report import Goal, Target

RATIO = Target(Goal.RATIO_AT_LEAST, 0.6)
RATE = Target(Goal.AT_LEAST, 9_000.0)


def test_the_median_round_is_shown_and_every_round_judges() -> None:
    pairs = Pairs((100.0, 200.0, 100.0), (70.0, 130.0, 62.0))  # ratios 0.70, 0.65, 0.62
    assert pairs.median == 1 and pairs.spread == (0.62, 0.70)
    figure = paired_figure("row", "calls/s", pairs, 10, "no-op", RATIO)
    assert (figure.ours, figure.floor) == (130.0, 200.0)
    assert figure.met is True and figure.target == RATIO
    assert figure.floor_label == "no-op; 3 paired rounds" and figure.spread == (0.62, 0.70)
    missed = Pairs((100.0, 100.0), (50.0, 59.0))
    assert verdict(missed, RATIO) is False
    assert paired_figure("row", "calls/s", missed, 10, "no-op", RATIO).met is False


def test_rounds_that_straddle_the_target_are_not_met() -> None:
    pairs = Pairs((100.0,) * 5, (55.0, 58.0, 59.0, 61.0, 66.0))
    assert verdict(pairs, RATIO) is None and straddles(pairs, RATIO)
    figure = paired_figure("row", "calls/s", pairs, 10, "no-op", RATIO)
    # The median round (0.59x) alone would miss too; one that meets it still needs every round.
    assert figure.target == RATIO and figure.met is False and figure.ours == 59.0
    assert figure.spread == (0.55, 0.66)
    above = Pairs((100.0,) * 3, (55.0, 61.0, 66.0))
    assert paired_figure("row", "calls/s", above, 10, "no-op", RATIO).met is False
    assert not straddles(Pairs((100.0,) * 2, (61.0, 66.0)), RATIO)


def test_an_absolute_target_is_judged_by_every_run() -> None:
    runs = Pairs((40_000.0,) * 3, (8_800.0, 9_100.0, 9_300.0))
    assert verdict(runs, RATE) is None
    assert verdict(Pairs((40_000.0,), (9_100.0,)), RATE) is True
    figure = paired_figure("row", "intents/s", runs, 5, "bare", RATE, rounds="run")
    assert figure.floor_label == "bare; 3 runs" and figure.ours == 9_100.0
    assert figure.met is True  # an absolute target is judged on the median run


def test_pairs_need_one_floor_per_round() -> None:
    with pytest.raises(ValueError):
        Pairs((1.0,), (1.0, 2.0))
    with pytest.raises(ValueError):
        Pairs((), ())
    assert Pairs.of([Batch(10, 0.5)], [Batch(10, 1.0)]).ratios == [0.5]


def test_ranges_read_as_the_report_formats_numbers() -> None:
    assert range_text([72.44, 150.2], "µs") == "72.4-150 µs"
    assert range_text([-32.5, 146.0], "µs") == "-32.5 to 146 µs"
    assert range_text([5.0], "µs") == "5.00 µs"
    assert Pairs((4_000.0, 5_000.0), (5_000.0, 5_000.0)).extra_us() == [-50.0, 0.0]


def _commits(busy: float, commit_ms: float, p50_ms: float, whole: bool = True) -> GroupCommits:
    """1,000 calls in 1 s; commits of ``commit_ms`` filling ``busy`` of it."""
    commits = round(busy * 1000 / commit_ms)
    return GroupCommits(Batch(1_000, 1.0, (p50_ms / 1000,) * 5), commits, busy, 0.0, whole)


def test_where_a_call_waits() -> None:
    assert where(_commits(0.85, 1.0, 20.0)) is Wait.STORE
    assert where(_commits(0.85, 1.0, 20.0, whole=False)) is Wait.STORE
    assert where(_commits(0.3, 2.0, 20.0)) is Wait.OUTSIDE  # 4 ms of a 20 ms p50
    assert where(_commits(0.3, 6.0, 20.0)) is Wait.BOTH  # 12 ms of 20
    assert where(_commits(0.3, 2.0, 20.0, whole=False)) is Wait.UNRESOLVED


def test_thread_names_fit_the_kernel_and_group_pools() -> None:
    assert named_threads.kernel_name("effector-sqlite-read_0") == b"sqlite-read_0"
    assert named_threads.kernel_name("Thread-1 (_poll_wrapper)") == b"_poll_wrapper"
    assert named_threads.kernel_name("effector-sqlite-checkpoint") == b"sqlite-checkpoi"
    assert usage.thread_name("pg_3") == "pg" and usage.thread_name("sqlite-read_0") == "sqlite-read"
    assert usage.thread_name("event_engine") == "event_engine"
    assert named_threads.command([sys.executable, "-m", "effector", "serve"])[2:] == [
        "benchmarks.named_threads",
        "effector",
        "serve",
    ]
    with pytest.raises(ValueError):
        named_threads.command(["python", "script.py"])


@pytest.mark.skipif(not usage.schedstat_available(), reason="needs Linux's /proc")
def test_a_named_module_shows_its_threads_by_name_in_proc(tmp_path: Path) -> None:
    script = tmp_path / "two_threads.py"
    script.write_text(
        "import threading, time\n"
        "t = threading.Thread(target=time.sleep, args=(30,), name='effector-pg_0', daemon=True)\n"
        "t.start(); print('started', flush=True); time.sleep(30)\n"
    )
    command = named_threads.command([sys.executable, "-m", "two_threads"])
    environment = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO_ROOT}"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "started"
        time.sleep(0.1)
        sample = usage.sample([process.pid])
        assert "pg" in sample[0].names.values()
        assert usage.between(sample, sample).by_name[0][1] == 0.0
    finally:
        process.kill()
        process.wait()
