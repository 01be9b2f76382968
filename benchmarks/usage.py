"""What processes used over a measured interval, read from Linux's ``/proc``.

CPU time by thread (the main thread, the busiest other one, the rest, and every thread but the
main one by its name; of it, the kernel's share), and what they wrote: bytes through write calls
(``wchar``), bytes that reached the block layer (``write_bytes``) and write calls. A thread's CPU
time comes from ``schedstat`` in nanoseconds where the kernel has it, else from ``stat`` in clock
ticks; the kernel's share always from ``stat`` (:func:`resolution` says which). Benchmark 6
divides these by the intents of its sustained runs to show where an intent's cost goes.
Elsewhere (no ``/proc``) nothing is measured.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_IO_FIELDS = ("wchar", "write_bytes", "syscw")


@dataclass(frozen=True)
class ProcessSample:
    """One process at one moment: CPU seconds by thread id (all, of it in the kernel); writes."""

    pid: int
    threads: dict[int, tuple[float, float]]
    io: dict[str, int]
    names: dict[int, str] = field(default_factory=dict)
    """Thread names by id (``comm``, a trailing number dropped)."""


@dataclass(frozen=True)
class Usage:
    """What a group of processes used between two samples, in seconds and bytes."""

    main_thread_s: float
    """The processes' main threads (an effector's event loop)."""
    busiest_thread_s: float
    """Each process's busiest other thread, summed (a SQLite effector's store writer)."""
    other_threads_s: float
    system_s: float
    """Of all the above, the time spent in the kernel."""
    written: int
    """Bytes passed to write calls (``wchar``)."""
    disk_written: int
    """Bytes sent to the block layer (``write_bytes``)."""
    write_calls: int
    by_name: tuple[tuple[str, float], ...] = ()
    """Every thread but the main ones, CPU seconds summed by thread name, largest first."""

    @property
    def cpu_s(self) -> float:
        """All CPU time, every thread."""
        return self.main_thread_s + self.busiest_thread_s + self.other_threads_s


def available() -> bool:
    """Whether this machine has the ``/proc`` files this module reads."""
    return (_PROC / "self" / "task").is_dir() and (_PROC / "self" / "io").is_file()


def sample(pids: Iterable[int]) -> list[ProcessSample]:
    """Read the processes' counters now; processes that are gone are left out."""
    samples = []
    for pid in pids:
        try:
            times, names = _thread_times(pid)
            samples.append(ProcessSample(pid, times, _io_counters(pid), names))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return samples


def between(before: Sequence[ProcessSample], after: Sequence[ProcessSample]) -> Usage:
    """What the processes sampled ``after`` used since ``before`` (one absent then, all of it)."""
    earlier = {process.pid: process for process in before}
    main = busiest = other = system = 0.0
    written = disk_written = write_calls = 0
    by_name: dict[str, float] = {}
    for process in after:
        start = earlier.get(
            process.pid, ProcessSample(process.pid, {}, dict.fromkeys(_IO_FIELDS, 0))
        )
        spent = {
            tid: _since(times, start.threads.get(tid)) for tid, times in process.threads.items()
        }
        system += sum(kernel for _, kernel in spent.values())
        main += spent.pop(process.pid, (0.0, 0.0))[0]
        for tid, (cpu, _) in spent.items():
            name = process.names.get(tid, "?")
            by_name[name] = by_name.get(name, 0.0) + cpu
        totals = sorted((cpu for cpu, _ in spent.values()), reverse=True)
        busiest += sum(totals[:1])
        other += sum(totals[1:])
        written += process.io["wchar"] - start.io["wchar"]
        disk_written += process.io["write_bytes"] - start.io["write_bytes"]
        write_calls += process.io["syscw"] - start.io["syscw"]
    named = tuple(sorted(by_name.items(), key=lambda pair: -pair[1]))
    return Usage(main, busiest, other, system, written, disk_written, write_calls, named)


def resolution() -> str:
    """Where the CPU times come from, and how fine they are, for the report's text."""
    tick_ms = 1000 / _TICKS_PER_S
    if schedstat_available():
        return (
            "on-CPU time from `/proc`'s `schedstat`, in nanoseconds; the kernel's share from "
            f"`stat`, in {tick_ms:g} ms clock ticks"
        )
    return f"CPU time from `/proc`'s `stat`, in {tick_ms:g} ms clock ticks"


def _since(now: tuple[float, float], then: tuple[float, float] | None) -> tuple[float, float]:
    if then is None:  # a thread born since the first sample
        return now
    return now[0] - then[0], now[1] - then[1]


def children(parent: int) -> list[int]:
    """The ids of ``parent``'s child processes."""
    found = []
    for stat in _PROC.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def listening_postgres(port: int) -> list[int]:
    """The PostgreSQL server listening on ``port``: its postmaster and every child process."""
    for cmdline in _PROC.glob("[0-9]*/cmdline"):
        try:
            arguments = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        words = b" ".join(arguments).split()
        if arguments[0].endswith(b"postgres") and f"port={port}".encode() in words:
            postmaster = int(cmdline.parent.name)
            return [postmaster, *children(postmaster)]
    return []


def _thread_times(pid: int) -> tuple[dict[int, tuple[float, float]], dict[int, str]]:
    """Every thread's (CPU seconds, of them in the kernel), and its name."""
    times, names = {}, {}
    precise = schedstat_available()
    for task in (_PROC / str(pid) / "task").iterdir():
        try:
            fields = _stat_fields(task)
            name = (task / "comm").read_text().strip()
            cpu_ns = int((task / "schedstat").read_text().split()[0]) if precise else None
        except FileNotFoundError:
            continue  # the thread ended while the directory was read
        user, kernel = int(fields[11]) / _TICKS_PER_S, int(fields[12]) / _TICKS_PER_S
        tid = int(task.name)
        times[tid] = (user + kernel if cpu_ns is None else cpu_ns / 1e9, kernel)
        names[tid] = thread_name(name)
    return times, names


def thread_name(comm: str) -> str:
    """A thread's name without the number a pool gives each of its threads (``pg_3``: ``pg``)."""
    return re.sub(r"[-_.]?\d+$", "", comm) or comm


def _stat_fields(task: Path) -> list[str]:
    """A thread's ``stat`` fields after its name: the state first."""
    return (task / "stat").read_text().rsplit(")", 1)[1].split()


def thread_state(pid: int, tid: int) -> str:
    """The thread's scheduler state: ``R`` on a CPU or ready for one, ``S``/``D`` asleep."""
    return _stat_fields(_PROC / str(pid) / "task" / str(tid))[0]


def schedstat_available() -> bool:
    """Whether threads' CPU time can be read in nanoseconds (``schedstat``)."""
    return (_PROC / "self" / "schedstat").is_file()


def on_cpu_ns(pid: int, tid: int) -> int:
    """The thread's time on a CPU so far, in nanoseconds (up to date at its last tick)."""
    return int((_PROC / str(pid) / "task" / str(tid) / "schedstat").read_text().split()[0])


def on_cpu_now(pid: int) -> dict[int, int]:
    """Every thread's on-CPU nanoseconds now (threads ending meanwhile are left out)."""
    found = {}
    for task in (_PROC / str(pid) / "task").iterdir():
        try:
            found[int(task.name)] = on_cpu_ns(pid, int(task.name))
        except FileNotFoundError:
            continue
    return found


def run_queue_now(pid: int, tids: Iterable[int]) -> dict[int, tuple[int, int]]:
    """Per thread, nanoseconds on a CPU and waiting on a run queue (ready, not running) so far."""
    found = {}
    for tid in tids:
        try:
            fields = (_PROC / str(pid) / "task" / str(tid) / "schedstat").read_text().split()
        except FileNotFoundError:
            continue  # the thread has ended
        found[tid] = int(fields[0]), int(fields[1])
    return found


KERNEL_TICKS_S = 1.0
"""Kernel CPU (from 10 ms ticks) below this, over a round, is too coarse to print per call."""


def kernel_known(*system_s: float) -> bool:
    """Whether every kernel total given spans enough clock ticks to be printed per call."""
    return all(seconds >= KERNEL_TICKS_S for seconds in system_s)


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


def _io_counters(pid: int) -> dict[str, int]:
    counters = {}
    for line in (_PROC / str(pid) / "io").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in _IO_FIELDS:
            counters[name] = int(value)
    return counters
