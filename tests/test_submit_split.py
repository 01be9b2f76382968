"""Benchmark 6's split of a one-intent Submit call by thread: arithmetic, text, a real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import submit_split, usage
from benchmarks.effector_load import noop_command, server_processes
from benchmarks.harness import EFFECTOR_READY, effector_command
from benchmarks.noop_grpc import READY as NOOP_READY
from benchmarks.report import Figure, Goal, Target
from benchmarks.submit_split import Side, SubmitSplit, submit_account
from benchmarks.thread_overlap import Overlap

ROW = "Submit calls/s (1 intent each, 64 callers), SQLite"
PG_ROW = "Submit calls/s (1 intent each, 64 callers), PostgreSQL, 2 replicas"
TARGET = Target(Goal.RATIO_AT_LEAST, 0.6)


def _usage(main: float, busiest: float, other: float, system: float) -> usage.Usage:
    return usage.Usage(main, busiest, other, system, written=0, disk_written=0, write_calls=0)


# 1,000 calls each: the no-op server's take 0.1 s (100 µs a call), the effector's 0.2 s.
NOOP = Side(1_000, 0.1, _usage(0.080, 0.020, 0.010, 0.030))
OURS = Side(1_000, 0.2, _usage(0.140, 0.050, 0.020, 0.060))


def _figures(ours: float = 5_000.0, floor: float = 10_000.0) -> list[Figure]:
    return [
        Figure(ROW, "calls/s", ours, 4_000, floor, "no-op", TARGET),
        Figure(f"{ROW} with synchronous=NORMAL", "calls/s", 6_000.0, 4_000, 9_000.0, "no-op"),
    ]


def _overlap(both: float) -> Overlap:
    return Overlap(0.7, 0.3, both, samples=500, interval_s=0.0013)


def test_the_split_is_per_call_and_names_each_side_and_the_difference() -> None:
    text = submit_account(_figures(), {ROW: SubmitSplit(1, NOOP, OURS, _overlap(0.2))})
    assert text.startswith("\n\n" + ROW + ": 5,000 calls/s against the no-op gRPC server's 10,000")
    assert "spends 100 µs more per call" in text
    assert "(CPU time from `/proc`; 5,000 and 10,000 calls/s in that round)" in text
    # Per call: 210 µs for the effector (140 + 50 + 20, 60 in the kernel), 110 for the no-op.
    assert "per call the effector used 210 µs of CPU: 140 on its event loop (gRPC" in text
    assert "50 on its busiest other thread (presumably the store's writer" in text
    assert "and 20 on its other threads, 60 of it in the kernel;" in text
    assert "the no-op server used 110 µs of CPU: 80 on its event loop, 20 on its busiest" in text
    assert "The difference, 100 µs of CPU per call (in wall time a call took 100 µs longer" in text
    assert "is 60 on the event loop, 30 on the busiest other thread and 10 on the other" in text
    assert "threads, 30 of it in the kernel." in text
    assert "The effector kept 1.05 of" in text and "the no-op server 1.10." in text
    assert "Its event loop was on a CPU 70% of the round and its writer 25%" in text
    assert "at once in 20% of 500 samples: they take turns" in text
    assert "so the 190 µs they used per call together, against the round's 200 µs" in text
    # synchronous=NORMAL served 6,000/s: 200 - 167 µs a call.
    assert "so the fsync is 33 µs of the 100." in text
    # 0.6 x 10,000/s leaves 167 µs a call, 33 fewer than the 200 now.
    assert "a call may take 167 µs, 33 fewer than now" in text
    assert "most of the difference on the event loop (60 µs per call beyond" in text
    assert "against 30 on the busiest other thread), not in the store's statements" in text


def test_overlapping_threads_are_not_said_to_take_turns() -> None:
    text = submit_account(_figures(), {ROW: SubmitSplit(1, NOOP, OURS, _overlap(0.5))})
    assert "at once in 50% of 500 samples: they overlap part of the time" in text
    assert "take turns" not in text


def test_the_largest_part_of_the_difference_picks_the_next_change() -> None:
    writer_bound = Side(1_000, 0.2, _usage(0.090, 0.100, 0.020, 0.060))
    text = submit_account(_figures(), {ROW: SubmitSplit(1, NOOP, writer_bound, _overlap(0.1))})
    assert "most of the difference on the busiest other thread, presumably the store's (80" in text
    assert "against 10 on the event loop)" in text
    # Two effectors and a PostgreSQL server that used more than any of their threads' shares.
    postgres = Side(1_000, 0.2, _usage(0.100, 0.030, 0.020, 0.040), store_server_s=0.090)
    row = Figure(PG_ROW, "calls/s", 5_000.0, 4_000, 10_000.0, "no-op", TARGET)
    text = submit_account([row], {PG_ROW: SubmitSplit(2, NOOP, postgres)})
    assert "per call the effectors used 150 µs of CPU: 100 on their event loops" in text
    assert ", and the PostgreSQL server 90; the no-op servers used 110 µs" in text
    assert "The event loops were on a CPU 25% of the round, each on average." in text
    assert "The effectors and the PostgreSQL server kept 1.20 of" in text
    assert "most of the difference in the PostgreSQL server (90 µs per call" in text
    assert "fsync" not in text


def test_rows_met_or_unmeasured_say_so() -> None:
    assert submit_account(_figures(ours=7_000.0), {}) == ""
    text = submit_account(_figures(), {ROW: None})
    assert "Its split by thread was not measured here." in text
    assert "without the split, the store's statements per Submit come first." in text


@pytest.mark.skipif(
    not (usage.available() and usage.schedstat_available()), reason="needs Linux's /proc"
)
def test_a_real_ingest_only_effector_is_split_beside_the_noop_server(tmp_path: Path) -> None:
    ingest = effector_command(f"sqlite:///{tmp_path / 'e.db'}", concurrency=0)
    with (
        server_processes([noop_command()], NOOP_READY, tmp_path) as floor,
        server_processes([ingest], EFFECTOR_READY, tmp_path) as ours,
    ):
        split = submit_split.measure(floor, ours, (1, 16, 800))
    assert split is not None and split.replicas == 1
    for side in (split.ours, split.noop):
        assert side.calls == 800 and side.wall_us > 0
        assert side.servers.main_thread_s > 0
        assert side.servers.cpu_s >= side.servers.main_thread_s + side.servers.busiest_thread_s
    # The writer commits every group of Submits: it ran, on a thread other than the loop.
    assert split.ours.servers.busiest_thread_s > 0
    assert split.overlap is not None and split.overlap.samples > 10
    text = submit_split.split_text(split)
    assert f"{split.ours.us(split.ours.servers.main_thread_s):.0f} on its event loop" in text
