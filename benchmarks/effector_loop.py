"""Benchmark 6: the SQLite effector's event loop, split by its profile, and the changes named.

:func:`loop_shares` reads the parts of the worker's path per intent from the main thread's
cProfile; :func:`loop_next` sizes them against the loop's CPU per intent measured from ``/proc``
(a profile share times that CPU: an estimate, the profiler inflating Python calls more than C).
"""

from __future__ import annotations

import pstats
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoopPart:
    """A part of the event loop's work per intent: the functions that make it and its change."""

    name: str
    functions: tuple[tuple[str, str, str], ...]
    """(file ending, function, calling function or "" for any caller)."""
    change: str
    """What would cut it, or "" where none is named (the part is context)."""


SUBMIT = LoopPart(
    "Submit (the handler, its validation included)", (("service.py", "Submit", ""),), ""
)
WORKER = LoopPart("the worker's path (`_execute`)", (("worker.py", "_execute", ""),), "")
PARTS = (
    LoopPart(
        "validating the arguments again before the call (`prepare_call` from `execute`)",
        (("effector/runner.py", "prepare_call", "execute"),),
        "keep the arguments Submit validated, by intent id, for the intents this process "
        "executes (another replica or a restart still validates)",
    ),
    LoopPart(
        "the tool call's timeout (`asyncio.timeout`: a timer scheduled and cancelled per call)",
        (("asyncio/timeouts.py", "__aenter__", ""), ("asyncio/timeouts.py", "__aexit__", "")),
        "one deadline for the calls a claim batch starts together, instead of a timer per call",
    ),
    LoopPart(
        "the sync tool's hop to a pool thread, on the loop's side (`_ToolThreads.call`, the "
        "inbox's delivery)",
        (("effector/runner.py", "call", ""), ("effector/runner.py", "_deliver", "")),
        "one pool job per claim batch of sync calls instead of one per intent (the batch's calls "
        "then run one after another on its thread)",
    ),
    LoopPart(
        "a task per intent (`create_task` in `_start`)",
        (("effector/worker.py", "_start", ""),),
        "one task per claim batch stepping its intents' paths, instead of one per intent",
    ),
)
"""The parts of the worker's path a change is named for, the largest expected first."""


@dataclass(frozen=True)
class PartShare:
    """A part's share of the main thread's busy time in the profile."""

    part: LoopPart
    share: float


def _cumulative(stats: pstats.Stats, path: str, function: str, caller: str) -> float:
    """Cumulative seconds of ``function`` in files ending ``path``, from ``caller`` only if
    given."""
    entries: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    seconds = 0.0
    for (filename, _, name), entry in entries.items():
        if name != function or not filename.endswith(path):
            continue
        if not caller:
            seconds += entry[3]
            continue
        seconds += sum(edge[3] for key, edge in entry[4].items() if key[2] == caller)
    return seconds


def loop_shares(stats: pstats.Stats, busy_s: float) -> tuple[PartShare, ...]:
    """Submit, the worker's path and each named part, as shares of ``busy_s``."""
    return tuple(
        PartShare(part, sum(_cumulative(stats, *where) for where in part.functions) / busy_s)
        for part in (SUBMIT, WORKER, *PARTS)
        if busy_s > 0
    )


def shares_line(shares: tuple[PartShare, ...]) -> str:
    """The profile finding: each part's share of the main thread's busy time."""
    return (
        "The event loop's work by part (cumulative time, shares of the main thread's busy time; "
        "the parts after the first two are inside or beside the worker's path): "
        + "; ".join(f"{share.part.name} {share.share:.0%}" for share in shares)
        + "."
    )


def sized_parts(shares: tuple[PartShare, ...], loop_us: float) -> list[tuple[PartShare, float]]:
    """The parts with a change, largest first, each with its share of ``loop_us`` rounded as
    printed (to 0.1 µs), so that their printed sum is the sum of the printed parts."""
    named = sorted((share for share in shares if share.part.change), key=lambda s: -s.share)
    return [(share, round(share.share * loop_us, 1)) for share in named]


def named_bound(shares: tuple[PartShare, ...], loop_us: float) -> float:
    """The parts with a change, removed entirely: µs per intent of ``loop_us``, as printed."""
    return round(sum(us for _, us in sized_parts(shares, loop_us)), 1)


def named_share(shares: tuple[PartShare, ...]) -> float:
    """The parts with a change, together, as a share of the loop's busy time."""
    return sum(share.share for share in shares if share.part.change)


def loop_next(shares: tuple[PartShare, ...], loop_us: float) -> tuple[str, float]:
    """The loop's account for "what is left", and the named changes' upper bound in µs."""
    if not shares:
        return (
            "The event loop's share was not split by the profile in this run (it runs only when "
            "a target is missed), so no change to it is sized here. ",
            0.0,
        )

    def sized(share: PartShare) -> str:
        return f"{share.part.name} {share.share:.0%} (~{share.share * loop_us:.1f} µs)"

    bound = named_bound(shares, loop_us)
    text = (
        f"Where the event loop's {loop_us:.0f} µs of CPU per intent went, by this run's profile "
        "(details; each part's share of the main thread's busy time under cProfile, times the "
        f"{loop_us:.0f} µs measured from `/proc`: a profile share, an estimate, since the "
        "profiler inflates Python calls more than C ones): "
        + "; ".join(sized(share) for share in shares if not share.part.change)
        + ". Next, for the loop (none measured yet), the parts of the worker's path with a change, "
        "largest first, each bounded by removing the part entirely: "
        + "; ".join(
            f"{sized(share)}: {share.part.change}" for share, _ in sized_parts(shares, loop_us)
        )
        + f"; together at most ~{bound:.1f} µs of the loop's CPU per intent. "
    )
    return text, bound
