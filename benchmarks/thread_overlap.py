"""How often two threads of one process ran at the same time, sampled from Linux's ``/proc``.

A sampler process of its own (``python -m benchmarks.thread_overlap PID TID TID``, so no other
Python competes with it for a GIL) reads both threads' scheduler states every millisecond until
its stdin closes: ``R`` is on a CPU or ready for one, ``S`` or ``D`` asleep (on a lock, the GIL
or the disk). The share of samples that find both running estimates how much they overlap;
CPU-time counters would not do, since the kernel brings a running thread's up to date only at
its ticks. Benchmark 6 samples an effector's event loop and its store writer this way.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from types import TracebackType

from benchmarks.usage import thread_state

INTERVAL_S = 0.001


@dataclass(frozen=True)
class Overlap:
    """Shares of the samples that found the first, the second, and both threads running."""

    first_running: float
    second_running: float
    both_running: float
    samples: int
    interval_s: float
    """The mean time between samples (a little over the sampler's sleep)."""

    def shares(self) -> tuple[int, int, int, int]:
        """The first's, the second's, both's and either's shares in whole percent, as printed:
        either is the first plus the second less both, from the rounded figures."""
        first, second, both = (
            round(share * 100)
            for share in (self.first_running, self.second_running, self.both_running)
        )
        return first, second, both, first + second - both


class OverlapSampler:
    """Samples two threads of ``pid`` while the ``with`` block runs; :attr:`overlap` after it.

    Raises :class:`RuntimeError` on leaving the block if the sampler failed (a thread ended).
    """

    def __init__(self, pid: int, first: int, second: int) -> None:
        self._command = [sys.executable, "-m", __name__, str(pid), str(first), str(second)]
        self._process: subprocess.Popen[str] | None = None
        self.overlap: Overlap | None = None

    def __enter__(self) -> OverlapSampler:
        self._process = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "sampling":
            raise RuntimeError(f"the overlap sampler did not start: {self._finish()}")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        counts = self._finish()
        if kind is not None:
            return
        try:
            samples, first, second, both, seconds = (float(part) for part in counts.split())
        except ValueError:
            raise RuntimeError(f"the overlap sampler failed: {counts}") from None
        if not samples:
            raise RuntimeError("the overlap sampler took no sample")
        self.overlap = Overlap(
            first / samples, second / samples, both / samples, int(samples), seconds / samples
        )

    def _finish(self) -> str:
        assert self._process is not None
        out, err = self._process.communicate("", timeout=30)
        return out.strip() if self._process.returncode == 0 else err.strip()[-500:]


def _sample(pid: int, first: int, second: int) -> None:
    """Count states until stdin closes, then print the counts and the seconds sampled."""
    samples = first_running = second_running = both = 0
    waiting = selectors.DefaultSelector()
    waiting.register(sys.stdin, selectors.EVENT_READ)
    print("sampling", flush=True)
    start = time.perf_counter()
    while not waiting.select(timeout=INTERVAL_S):
        running = (thread_state(pid, first) == "R", thread_state(pid, second) == "R")
        samples += 1
        first_running += running[0]
        second_running += running[1]
        both += running[0] and running[1]
    elapsed = time.perf_counter() - start
    print(samples, first_running, second_running, both, f"{elapsed:.6f}", flush=True)


if __name__ == "__main__":
    _sample(*(int(argument) for argument in sys.argv[1:4]))
