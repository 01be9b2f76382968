"""Benchmark 6's overlap sampler, on a child process whose two threads behave as we choose.

The sampler runs in a process of its own, as it does beside an effector, so its Python never
competes with the sampled threads for their GIL.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from benchmarks.thread_overlap import Overlap, OverlapSampler
from benchmarks.usage import busiest_other, on_cpu_now, schedstat_available

_CHILD = """
import hashlib, sys, threading, time
stop = threading.Event()
block = bytes(1 << 20)
def hash():
    while not stop.is_set():
        hashlib.sha256(block).digest()  # lets go of the GIL for large data
def spin():
    while not stop.is_set():
        pass
def doze():
    stop.wait()
work = {"spin": spin, "doze": doze, "hash": hash}
threads = [threading.Thread(target=work[name]) for name in sys.argv[1:3]]
for t in threads:
    t.start()
time.sleep(0.1)
print(*(t.native_id for t in threads), flush=True)
sys.stdin.read()
stop.set()
"""


@contextmanager
def _child(first: str, second: str) -> Iterator[tuple[int, int, int]]:
    """A child process with two threads (``spin``, ``hash`` or ``doze``); yields pid and ids."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, first, second],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        first_id, second_id = map(int, child.stdout.readline().split())
        yield child.pid, first_id, second_id
    finally:
        child.communicate("", timeout=30)


def _sample(first: str, second: str) -> Overlap:
    with _child(first, second) as (pid, first_id, second_id):
        sampler = OverlapSampler(pid, first_id, second_id)
        with sampler:
            time.sleep(0.8)
    assert sampler.overlap is not None
    return sampler.overlap


def test_a_spinning_thread_beside_a_dozing_one_never_overlaps() -> None:
    overlap = _sample("spin", "doze")
    assert overlap.samples > 100
    assert 0.0009 < overlap.interval_s < 0.01
    assert overlap.first_running > 0.3
    assert overlap.second_running < 0.05
    assert overlap.both_running < 0.05


def test_python_spinners_overlap_far_less_than_threads_outside_the_gil() -> None:
    apart, together = _sample("spin", "spin"), _sample("hash", "hash")
    # Hashing a large block lets go of the GIL: both threads are always running or ready to.
    assert together.both_running > 0.8
    # One GIL: the spinner waiting for it sleeps. Unloaded, both are found running in a few
    # samples (a switch caught mid-way); a busy machine adds samples where one is only ready.
    assert apart.first_running > 0.2 and apart.second_running > 0.2
    assert apart.both_running < together.both_running - 0.3


def test_a_sampler_whose_thread_is_gone_fails_loudly() -> None:
    with _child("doze", "doze") as (pid, dozing, _):
        sampler = OverlapSampler(pid, dozing, 2**22 + 1)  # above Linux's largest thread id
        with pytest.raises(RuntimeError, match="the overlap sampler failed"), sampler:
            time.sleep(0.05)
    assert sampler.overlap is None


@pytest.mark.skipif(not schedstat_available(), reason="needs Linux's /proc schedstat")
def test_busiest_other_finds_the_thread_that_ran() -> None:
    with _child("doze", "spin") as (pid, dozing, spinning):
        before = on_cpu_now(pid)
        assert {dozing, spinning} <= set(before)
        time.sleep(0.3)
        assert busiest_other(pid, before) == spinning
