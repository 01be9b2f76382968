"""Benchmark 6's one-intent Submit round under the profiler: where the event loop's time goes.

:func:`measure` runs one more round of one-intent Submits at an ingest-only SQLite effector
with every thread profiled (:mod:`benchmarks.profiled_effector`) and splits its event loop's
busy time into the parts of a call's work there; :func:`parts_text` sizes each part by its
share of that time applied to the loop's CPU per call measured without the profiler (a profile
share, an estimate) and names the next change to it, or why none.
"""

from __future__ import annotations

import asyncio
import pstats
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.effector_load import SINGLE_CALLERS, calls_round, servers
from benchmarks.harness import EFFECTOR_READY, cumulative, effector_command, idle_seconds
from benchmarks.report import tenth

_Function = tuple[str, str]
_RUN_ONCE: _Function = ("asyncio/base_events.py", "_run_once")
_SUBMIT: _Function = ("effector/service.py", "Submit")
_CHECKS: tuple[_Function, ...] = (
    ("effector/intents.py", "identity_problem"),
    ("effector/compensation.py", "intake_rejection"),
)
_HAND_OFF: _Function = ("effector/store/_sql.py", "submit")
_FLUSHER: _Function = ("effector/group_commit.py", "_flush")


@dataclass(frozen=True)
class LoopPart:
    """A part of the event loop's work per call, and the next change to it (or why none)."""

    label: str
    change: str
    proposed: bool


CHECKS = LoopPart(
    "Submit's checks (`identity_problem`, and `intake_rejection`, which looks the tool up, "
    "parses `args_json` and validates the arguments)",
    "at intake keep only the verdict: validate without the null-pruning walk of the "
    "arguments when `args_json` holds no `null`, and without building the keyword arguments "
    "the executor needs",
    True,
)
HAND_OFF = LoopPart(
    "the hand-off on Submit's side (the store's `submit`: queueing the call for the group "
    "commit and awaiting its answer)",
    "await the answer's future itself instead of through `asyncio.shield` (which adds a "
    "future and two callbacks per call; a queued request is committed whether or not its "
    "caller still waits, so the shield guards nothing)",
    True,
)
FLUSHER = LoopPart(
    "the group commit's flusher on the loop (the executor round trip's loop side, each "
    "call's answer set)",
    "none proposed: one round trip to the store's thread per commit, shared by its calls",
    False,
)
HANDLER_REST = LoopPart(
    "the rest of Submit's handler (the acknowledgement filled from the store's answer, the "
    "metrics' counters)",
    "none proposed: one acknowledgement per intent is the wire's contract",
    False,
)
AROUND = LoopPart(
    "gRPC's and asyncio's work around the call (receiving and answering it, scheduling: the "
    "suspension at the hand-off and the resumption included)",
    "none proposed: the no-op server does the receiving and answering too, without the "
    "suspension; what the suspension costs is not told apart",
    False,
)
PARTS = (CHECKS, HAND_OFF, FLUSHER, HANDLER_REST, AROUND)
"""Every part, in the order :func:`shares` gives them."""


@dataclass(frozen=True)
class LoopProfile:
    """The profiled round: its calls, and each part's share of the loop's busy time."""

    calls: int
    shares: tuple[float, ...]
    """One share per part of :data:`PARTS`, in its order; they add up to 1."""


def shares(stats: pstats.Stats) -> tuple[float, ...]:
    """The parts' shares of the loop's busy time (every step it ran, less its waits)."""
    busy = cumulative(stats, *_RUN_ONCE)[0] - idle_seconds(stats)
    if busy <= 0:
        return ()
    checks = sum(cumulative(stats, *function)[0] for function in _CHECKS)
    hand_off = cumulative(stats, *_HAND_OFF)[0]
    handler = max(cumulative(stats, *_SUBMIT)[0], checks + hand_off)
    flusher = cumulative(stats, *_FLUSHER)[0]
    around = max(busy - handler - flusher, 0.0)
    seconds = (checks, hand_off, flusher, handler - checks - hand_off, around)
    return tuple(part / sum(seconds) for part in seconds)


def measure(calls: int) -> LoopProfile | None:
    """One round of ``calls`` one-intent Submits at a profiled ingest-only SQLite effector."""
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        command = effector_command(
            f"sqlite:///{scratch / 'effector.db'}",
            concurrency=0,
            profile_dir=scratch / "profiles",
        )
        with servers([command], EFFECTOR_READY, scratch) as targets:
            batch = asyncio.run(calls_round(targets, (1, SINGLE_CALLERS, calls)))
        main = scratch / "profiles" / "MainThread.prof"
        if not main.exists():
            return None
        found = shares(pstats.Stats(str(main)))
    return LoopProfile(batch.calls, found) if found else None


def parts_text(profile: LoopProfile, loop_us: int, cut: float, noop_loop_us: int = 0) -> str:
    """Each part sized against the loop's ``loop_us`` of CPU per call, the next change named,
    and whether the parts with a change could cover the ``cut`` of wall time a call must lose
    (only were a call's time to fall one for one with the loop's CPU); ``noop_loop_us``: the
    no-op server's loop CPU per call, set beside the work around the call."""
    sized = [
        (index, part, share, round(share * loop_us, 1))
        for index, (part, share) in enumerate(zip(PARTS, profile.shares, strict=True), start=1)
    ]
    listed = "; ".join(
        f"({index}) {part.label} {share:.0%} (~{us:.1f} µs): {part.change}"
        for index, part, share, us in sized
    )
    changed = sorted(
        ((index, us) for index, part, _, us in sized if part.proposed), key=lambda item: -item[1]
    )
    together = round(sum(us for _, us in changed), 1)
    first, first_us = changed[0]
    text = (
        f"Profiled in one more such round ({profile.calls:,} calls at an ingest-only effector "
        "with cProfile on every thread; a part's share of the event loop's busy time there, "
        f"times the {loop_us} µs of loop CPU per call of the split round: a profile share, an "
        "estimate, as the profiler inflates Python calls more than C ones), the loop's work per "
        f"call: {listed}.{_beyond_noop(sized[-1][3], noop_loop_us)} The next change is "
        f"({first}), at most ~{first_us:.1f} µs of the loop's "
        f"CPU per call; the parts with a change take ~{together:.1f} together, "
    )
    if together < cut:
        text += (
            f"short of the {cut:.1f} µs a call must lose even removed entirely and even were a "
            f"call's time to fall one for one with the loop's CPU ({tenth(cut - together):.1f} "
            "short): no change this run identifies is shown to reach the target."
        )
    else:
        text += (
            f"which would cover the {cut:.1f} µs a call must lose only were a call's time to "
            f"fall one for one with the loop's CPU and only if they removed {cut / together:.0%} "
            "of those parts; what each saves is not measured, so no change this run identifies "
            "is shown to reach the target."
        )
    return text + (
        " Whether a change shortens a call is checked by splitting the wait outside the "
        "commits (per call the time from its arrival to its hand-off to the group commit, and "
        "from the commit's answer to its response), which this run does not measure."
    )


def _beyond_noop(around_us: float, noop_loop_us: int) -> str:
    """How much of the work around the call exceeds the no-op server's whole loop."""
    if not noop_loop_us or around_us <= noop_loop_us:
        return ""
    return (
        f" Of ({len(PARTS)}), ~{tenth(around_us - noop_loop_us):.1f} µs is beyond the no-op "
        f"server's whole event loop in its split round ({noop_loop_us} µs a call): work it does "
        "not do, the suspension and the resumption among it (an estimate, by the profile share)."
    )
