"""How often two threads of one process ran at the same time, sampled from Linux's ``/proc``.

Every millisecond, a thread of the sampling process reads both threads' scheduler state (``R``:
on a CPU or waiting for one; ``S`` or ``D``: asleep, on a lock, the GIL or the disk). The share of
samples that find both running estimates how much they overlap; CPU-time counters would not do,
since the kernel brings a running thread's up to date only at its ticks. Benchmark 6 samples an
effector's event loop and its store writer this way.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_PROC = Path("/proc")


@dataclass(frozen=True)
class Overlap:
    """Shares of the samples that found the first, the second, and both threads running."""

    first_running: float
    second_running: float
    both_running: float
    samples: int


def _state(pid: int, tid: int) -> str:
    return (_PROC / str(pid) / "task" / str(tid) / "stat").read_text().rsplit(")", 1)[1].split()[0]


def on_cpu_ns(pid: int, tid: int) -> int:
    """The thread's time on a CPU so far, in nanoseconds (up to date at its last tick)."""
    return int((_PROC / str(pid) / "task" / str(tid) / "schedstat").read_text().split()[0])


def on_cpu_now(pid: int) -> dict[int, int]:
    """Every thread's on-CPU ns now (threads ending meanwhile are left out)."""
    found = {}
    for task in (_PROC / str(pid) / "task").iterdir():
        try:
            found[int(task.name)] = on_cpu_ns(pid, int(task.name))
        except FileNotFoundError:
            continue
    return found


def busiest_other(pid: int, before: dict[int, int]) -> int | None:
    """The thread, other than the main one, that ran longest since ``before`` (on-CPU ns)."""
    spent = []
    for tid, then in before.items():
        if tid == pid:
            continue
        try:
            spent.append((on_cpu_ns(pid, tid) - then, tid))
        except FileNotFoundError:
            continue  # the thread has ended
    return max(spent)[1] if spent else None


class OverlapSampler:
    """Samples two threads' states every ``interval_s`` while the ``with`` block runs."""

    def __init__(self, pid: int, first: int, second: int, interval_s: float = 0.001) -> None:
        self._pid, self._tids, self._interval_s = pid, (first, second), interval_s
        self._counts = [0, 0, 0, 0]  # samples; first running; second running; both
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="overlap-sampler", daemon=True)

    def _sample(self) -> None:
        first, second = self._tids
        while not self._stop.is_set():
            running = (_state(self._pid, first) == "R", _state(self._pid, second) == "R")
            self._counts[0] += 1
            self._counts[1] += running[0]
            self._counts[2] += running[1]
            self._counts[3] += running[0] and running[1]
            time.sleep(self._interval_s)

    def __enter__(self) -> OverlapSampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def overlap(self) -> Overlap:
        """The shares so far (all zero before the first sample)."""
        samples, first, second, both = self._counts
        if not samples:
            return Overlap(0.0, 0.0, 0.0, 0)
        return Overlap(first / samples, second / samples, both / samples, samples)
