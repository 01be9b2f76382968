"""Where an ingest-only effector's time per one-intent Submit call goes, beside the no-op's.

Benchmark 6 compares the Submit calls/s of ingest-only effectors with a no-op gRPC server's.
Right after the figure's rounds, :func:`measure` drives one more round of the same calls at each
side (the same processes, the same callers), reading every thread's CPU time from ``/proc``
(:func:`benchmarks.usage.between`) around it, then one more at a single effector with its event
loop and its busiest other thread sampled for running at once (:mod:`benchmarks.thread_overlap`).
Thread CPU comes from :mod:`benchmarks.usage` (``schedstat`` nanoseconds where the kernel has
them); the effectors run under :mod:`benchmarks.named_threads`, so their threads have names.
:func:`split_text` says per call what the split shows, for benchmark 6's "what is left".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks import usage
from benchmarks.effector_findings import CORES
from benchmarks.effector_load import chunks, make_intents, submit_all
from benchmarks.thread_overlap import Overlap, OverlapSampler
from effector.client import AsyncEffectorClient
from effector.launch import EffectorProcess


@dataclass(frozen=True)
class Side:
    """One round of Submit calls against one side's servers, and what it cost them."""

    calls: int
    elapsed_s: float
    servers: usage.Usage
    """The servers' processes: main threads (the event loop), busiest other threads, the rest."""
    client_s: float = 0.0
    """The benchmark process, whose callers drive the round."""
    store_server_s: float = 0.0
    """The store's own server (PostgreSQL) over the round; nothing for SQLite or the no-op."""

    def us(self, seconds: float) -> float:
        """``seconds`` per call, in microseconds."""
        return seconds / self.calls * 1e6

    @property
    def wall_us(self) -> float:
        """Wall time per call (one over the round's rate), in microseconds."""
        return self.us(self.elapsed_s)

    @property
    def cores(self) -> float:
        """Cores the servers (and the store's server) kept busy on average over the round."""
        return (self.servers.cpu_s + self.store_server_s) / self.elapsed_s

    @property
    def cores_with_client(self) -> float:
        """Cores the servers, the store's server and the benchmark's client kept busy."""
        return self.cores + self.client_s / self.elapsed_s

    def busy(self, seconds: float) -> float:
        """The share of the round that ``seconds`` of one thread's CPU fills."""
        return seconds / self.elapsed_s


@dataclass(frozen=True)
class SubmitSplit:
    """The no-op servers' round and the effectors' round, with a single effector's overlap."""

    replicas: int
    noop: Side
    ours: Side
    overlap: Overlap | None = None
    """How often a single effector's event loop and busiest other thread ran at once."""
    queued: tuple[tuple[float, float], tuple[float, float]] | None = None
    """A single effector's event loop, then its busiest other thread, in the split round:
    seconds on a CPU and seconds ready but waiting on a run queue (``schedstat``)."""


def measure(
    floor: Sequence[EffectorProcess],
    ours: Sequence[EffectorProcess],
    shape: tuple[int, int, int],
    store_server_pids: Callable[[], list[int]] = list,
) -> SubmitSplit | None:
    """One round of ``shape`` (intents per call, callers, intents) at each side, split by thread.

    With a single effector, a third round samples its event loop and busiest other thread
    (where ``/proc`` has ``schedstat``). ``None`` where ``/proc`` cannot tell threads' CPU time.
    """
    if not usage.available():
        return None
    noop = asyncio.run(_round(floor, shape, list))
    sampled = len(ours) == 1 and usage.schedstat_available()
    pid = ours[0].pid
    before = usage.on_cpu_now(pid) if sampled else {}
    queued_before = usage.run_queue_now(pid, before)
    effector = asyncio.run(_round(ours, shape, store_server_pids))
    writer = usage.busiest_other(pid, before) if sampled else None
    if writer is None:
        return SubmitSplit(len(ours), noop, effector)
    queued = _queued(queued_before, usage.run_queue_now(pid, [pid, writer]), (pid, writer))
    with OverlapSampler(pid, pid, writer) as sampler:
        asyncio.run(_round(ours, shape, list))
    return SubmitSplit(1, noop, effector, sampler.overlap, queued)


def _queued(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], tids: tuple[int, int]
) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """Seconds on a CPU and waiting on a run queue, per thread of ``tids``, between readings."""
    if not all(tid in before and tid in after for tid in tids):
        return None
    loop, writer = (
        tuple((a - b) / 1e9 for a, b in zip(after[tid], before[tid], strict=True)) for tid in tids
    )
    return (loop[0], loop[1]), (writer[0], writer[1])


async def _round(
    processes: Sequence[EffectorProcess],
    shape: tuple[int, int, int],
    store_server_pids: Callable[[], list[int]],
) -> Side:
    """Submit fresh intents in ``shape`` to ``processes``; what their threads used meanwhile."""
    per_call, callers, intents = shape
    clients = [AsyncEffectorClient(process.address) for process in processes]
    pids = [process.pid for process in processes]
    try:
        # The new channels connect on their first calls, outside the measured interval.
        await submit_all(clients, chunks(make_intents(callers * per_call), per_call), callers)
        calls = chunks(make_intents(intents), per_call)
        before = usage.sample(pids), usage.sample(store_server_pids())
        client_before, started = time.process_time(), time.perf_counter()
        await submit_all(clients, calls, callers)
        elapsed_s = time.perf_counter() - started
        client_s = time.process_time() - client_before
        after = usage.sample(pids), usage.sample(store_server_pids())
    finally:
        for client in clients:
            await client.close()
    servers = usage.between(before[0], after[0])
    store_server = usage.between(before[1], after[1]).cpu_s if after[1] else 0.0
    return Side(len(calls), elapsed_s, servers, client_s, store_server)


def split_text(split: SubmitSplit) -> str:
    """Where a call's CPU went on each side, the difference, and how busy the effector was."""
    ours, noop, single = split.ours, split.noop, split.replicas == 1
    effector, its, servers = (
        ("the effector", "its", "server") if single else ("the effectors", "their", "servers")
    )
    postgres = f", and the PostgreSQL server {ours.us(ours.store_server_s):.0f}"
    loop, _, _, kernel = deltas(split)
    others = sum(_parts(ours)[1:]) - sum(_parts(noop)[1:])
    loops = "" if single else "s"
    text = (
        f"Split by thread (CPU accounting, not where a call waits) in one more round of "
        f"{ours.calls:,} such calls at each, right after the paired rounds on the same servers "
        f"({usage.resolution()}; {1e6 / ours.wall_us:,.0f} and {1e6 / noop.wall_us:,.0f} "
        f"calls/s in that round): per call {effector} used "
        f"{_threads(ours, its, EFFECTOR_THREADS[single])}"
        f"{postgres if ours.store_server_s else ''}; the no-op {servers} used "
        f"{_threads(noop, its, NOOP_THREADS[single])}. By thread name, every thread but the "
        f"event loop{loops}: {effector} {_names(ours)}; the no-op "
        f"{servers} {_names(noop)}. The difference, {loop + others} µs of CPU per call"
        f"{' besides the PostgreSQL server' if ours.store_server_s else ''} (in wall time a "
        f"call took {abs(ours.wall_us - noop.wall_us):.0f} µs "
        f"{'longer' if ours.wall_us >= noop.wall_us else 'shorter'} in that round), is {loop} "
        f"on the event loop{loops} and {others} on the other threads{_grown(split, others)}"
        + (
            f", {kernel} of it in the kernel"
            if usage.kernel_known(ours.servers.system_s, noop.servers.system_s)
            else ""
        )
        + f". {_cores(split, effector, servers)} "
    )
    return text + _turns(split)


def _grown(split: SubmitSplit, others: int) -> str:
    """The other threads' difference by thread name (like with like), as a clause."""
    parts = other_parts(split, others)
    if not parts:
        return ""
    return " (by thread name: " + ", ".join(f"{us:+d} on {label}" for label, us in parts) + ")"


def other_parts(split: SubmitSplit, others: int) -> list[tuple[str, int]]:
    """The other threads' ``others`` µs per call beyond the no-op's, by thread name (the
    largest changes first, whichever their sign), then the rest: adding up to ``others``."""
    named = sorted(
        ((name, us) for name, us in name_deltas(split) if us), key=lambda pair: -abs(pair[1])
    )[:NAMES_SHOWN]
    if not named:
        return []
    rest = others - sum(us for _, us in named)
    return [(f"`{name}`", us) for name, us in named] + ([("the rest", rest)] if rest else [])


def _cores(split: SubmitSplit, effector: str, servers: str) -> str:
    """The client's CPU per call, and the cores each side kept busy, the client included."""
    ours, noop = split.ours, split.noop
    postgres = ", the PostgreSQL server" if ours.store_server_s else ""
    return (
        f"The benchmark's client (the callers) used {ours.us(ours.client_s):.0f} µs of CPU per "
        f"call against {effector}, {noop.us(noop.client_s):.0f} against the no-op {servers}. "
        f"{effector.capitalize()}{postgres} and the client kept {ours.cores_with_client:.2f} of "
        f"{CORES} cores busy ({ours.cores:.2f} without the client), the no-op {servers} and "
        f"the client {noop.cores_with_client:.2f}."
    )


EFFECTOR_THREADS = {
    True: (
        "event loop (gRPC, Submit's checks and argument validation, handing the intent to the "
        "group commit, the acknowledgement)",
        "busiest other thread",
    ),
    False: (
        "event loops (gRPC, Submit's checks and argument validation, handing the intent to the "
        "group commit, the acknowledgement)",
        "busiest other threads",
    ),
}
"""What an effector's event loop and busiest other thread do, for one effector and for two."""
NOOP_THREADS = {
    True: ("event loop", "busiest other thread"),
    False: ("event loops", "busiest other threads"),
}


def _parts(side: Side) -> tuple[int, int, int]:
    """A side's µs of CPU per call as printed: its event loop, busiest other thread, the rest."""
    used = side.servers
    return (
        round(side.us(used.main_thread_s)),
        round(side.us(used.busiest_thread_s)),
        round(side.us(used.other_threads_s)),
    )


def deltas(split: SubmitSplit) -> tuple[int, int, int, int]:
    """The effectors' CPU per call beyond the no-op's, as printed: the event loop, the thread
    name that grew most (against the no-op's threads of that name), the other threads' rest,
    the kernel."""
    ours, noop = _parts(split.ours), _parts(split.noop)
    others = sum(ours[1:]) - sum(noop[1:])
    named = name_deltas(split)
    top = named[0][1] if named else 0
    kernel = round(split.ours.us(split.ours.servers.system_s)) - round(
        split.noop.us(split.noop.servers.system_s)
    )
    return ours[0] - noop[0], top, others - top, kernel


def name_deltas(split: SubmitSplit) -> list[tuple[str, int]]:
    """Per thread name, the effectors' µs of CPU per call beyond the no-op's threads of that
    name (as the sides' lists print them), the largest growth first."""
    ours, noop = dict(split.ours.servers.by_name), dict(split.noop.servers.by_name)
    grown = {
        name: round(split.ours.us(ours.get(name, 0.0))) - round(split.noop.us(noop.get(name, 0.0)))
        for name in ours.keys() | noop.keys()
    }
    return sorted(grown.items(), key=lambda pair: (-pair[1], pair[0]))


NAMES_SHOWN = 4
"""Thread names shown per side, largest CPU first."""
THREAD_NAMES = {
    "pg": "the PostgreSQL store's connection threads",
    "sqlite": "the SQLite store's writer",
    "sqlite-read": "its reader",
    "sqlite-checkpoi": "its checkpointer",
    "_poll_wrapper": "grpc.aio's completion-queue poller",
    "event_engine": "gRPC's C-core event engine",
    "grpc_global_tim": "gRPC's timer",
    "asyncio": "the event loop's default executor",
}
"""What the threads named in the split are, by name (:mod:`benchmarks.named_threads`)."""


def _names(side: Side) -> str:
    """A side's CPU per call by thread name, largest first (a pool's threads together)."""
    named = [(name, side.us(cpu)) for name, cpu in side.servers.by_name]
    shown = [(name, us) for name, us in named[:NAMES_SHOWN] if us >= 0.5]
    if not shown:
        return "not named"
    rest = sum(us for _, us in named) - sum(us for _, us in shown)
    parts = [f"{us:.0f} µs on `{name}`{_known(name)}" for name, us in shown]
    return ", ".join(parts) + (f", {rest:.0f} on the rest" if rest >= 0.5 else "")


def _known(name: str) -> str:
    known = THREAD_NAMES.get(name)
    return "" if known is None else f" ({known})"


def _threads(side: Side, its: str, names: tuple[str, str]) -> str:
    """A side's CPU per call: every thread, its event loop, its busiest other thread, the rest."""
    used = side.servers
    loop, busiest = names
    kernel = (
        f", {side.us(used.system_s):.0f} of it in the kernel"
        if usage.kernel_known(used.system_s)
        else ""
    )
    main, most, rest = _parts(side)
    return (
        f"{main + most + rest} µs of CPU: {main} on {its} {loop}, {most} on {its} {busiest} and "
        f"{rest} on {its} other threads{kernel}"
    )


def _turns(split: SubmitSplit) -> str:
    """How busy the event loop and the busiest other thread were, and whether they overlapped."""
    ours, overlap = split.ours, split.overlap
    used = ours.servers
    if overlap is None:
        share, several = ours.busy(used.main_thread_s) / split.replicas, split.replicas > 1
        return (
            f"The event loop{'s were' if several else ' was'} on a CPU {share:.0%} of the round"
            f"{', each on average' if several else ''}."
        )
    other = _writer(ours)
    first, second, both, either = overlap.shares()
    return (
        f"Its event loop was on a CPU {ours.busy(used.main_thread_s):.0%} of the round and its "
        f"{other} {ours.busy(used.busiest_thread_s):.0%}"
        f"{_queued_text(split, other)}; in a third round the two were running (or ready to run) "
        f"at once in {both}% of {overlap.samples:,} samples, and at least one of them in "
        f"{either}% ({first}% and {second}%, less the {both}% both at once)."
    )


def _writer(side: Side) -> str:
    """The busiest other thread, by its name where the SQLite writer's is the top one."""
    named = side.servers.by_name
    return "writer (`sqlite`)" if named and named[0][0] == "sqlite" else "busiest other thread"


def _queued_text(split: SubmitSplit, other: str) -> str:
    """Per call, the loop's and the other thread's time on a CPU and waiting for one."""
    if split.queued is None:
        return ""
    ours = split.ours
    (loop_cpu, loop_wait), (other_cpu, other_wait) = split.queued
    ran, split_ran = round(ours.us(loop_cpu)), round(ours.us(ours.servers.main_thread_s))
    window = (
        ""
        if ran == split_ran
        else (
            ", read around the whole round with its connections' first calls, a wider window "
            f"than the split's, hence {ran} µs here for the loop against {split_ran} above"
        )
    )
    return (
        f"; per call in that round (`schedstat`{window}) the event loop ran {ran} µs "
        f"and waited {ours.us(loop_wait):.0f} µs ready on a run queue for a core, its {other} "
        f"ran {ours.us(other_cpu):.0f} and waited {ours.us(other_wait):.0f}, so the loop was "
        f"neither running nor waiting for a core {1 - loop_occupied(split):.0%} of the round"
    )


def loop_occupied(split: SubmitSplit) -> float:
    """The share of the split round a single effector's loop ran or waited for a core (0 if
    not read)."""
    if split.queued is None:
        return 0.0
    loop_cpu, loop_wait = split.queued[0]
    return min((loop_cpu + loop_wait) / split.ours.elapsed_s, 1.0)
