"""Benchmark 6's account of a one-intent Submit row that is not met: rounds, waits, next change.

For each such row (missed in every paired round, or in some of them) it says
what the rounds found (:mod:`benchmarks.paired_rounds`), how long a call took at each side in the
median round, where the effector's CPU went (:mod:`benchmarks.submit_split`), where a call
waits (:mod:`benchmarks.group_commits`), what the fsync changed (SQLite), and the next change,
resting on where a call waits where the run measured it, on the CPU split only where it did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.effector_findings import CORES
from benchmarks.group_commits import GroupCommits, Wait, wait_text, where
from benchmarks.harness import percentile
from benchmarks.paired_rounds import Pairs, range_text, straddles
from benchmarks.report import Figure, Target
from benchmarks.submit_split import (
    SubmitSplit,
    deltas,
    largest_other,
    loop_occupied,
    saturated,
    split_text,
)


@dataclass(frozen=True)
class SubmitRow:
    """A one-intent Submit row and what the run measured behind it."""

    figure: Figure
    target: Target
    """The row's target (the figure's)."""
    pairs: Pairs
    callers: int
    latencies_s: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    """Each call's latency in the median round: the no-op server's, then the effector's."""
    split: SubmitSplit | None = None
    commits: GroupCommits | None = None
    relaxed: Pairs | None = None
    """Per round, the fsynced effector's rate (as the floor) and the ``synchronous=NORMAL``
    one's (SQLite)."""


def submit_account(rows: Sequence[SubmitRow]) -> str:
    """A paragraph for each row not met (in some rounds or in all); nothing for met rows."""
    parts = [_account(row) for row in rows if row.figure.met is not True]
    return "".join(f"\n\n{part}" for part in parts)


def _account(row: SubmitRow) -> str:
    figure, pairs, bound = row.figure, row.pairs, row.target.bound
    low, high = pairs.spread
    ratio = figure.ratio or 0.0
    verdict = (
        f"which straddles the {bound:g}x target: not met in every round, so not met in this run"
        if straddles(pairs, row.target)
        else f"below the {bound:g}x target in every round"
    )
    text = (
        f"{figure.name}: in {len(pairs.ours)} paired rounds the effector's calls/s were "
        f"{low:.2f}-{high:.2f}x the no-op gRPC server's (median {ratio:.2f}x: "
        f"{figure.ours:,.0f} against {figure.floor or 0:,.0f} calls/s in that round), {verdict}; "
        f"per call (one over the rate) the effector took {range_text(pairs.extra_us(), 'µs')} "
        "longer than a server that does nothing. "
        + _latencies(row)
        + ("Its split by thread was not measured here. " if row.split is None else "")
        + (split_text(row.split) if row.split is not None else "")
    )
    if row.commits is not None:
        text += " " + wait_text(row.commits, row.callers)
    if row.relaxed is not None:
        text += " " + _fsync(row.relaxed)
    return f"{text} {next_change(row)}"


def _latencies(row: SubmitRow) -> str:
    noop, ours = row.latencies_s
    if not (noop and ours):
        return ""

    def quantiles(samples: tuple[float, ...]) -> str:
        p50, p90, p99 = (percentile(samples, q) * 1000 for q in (0.5, 0.9, 0.99))
        return f"p50 {p50:.1f} ms, p90 {p90:.1f}, p99 {p99:.1f}"

    return (
        f"In the median round a call took {quantiles(ours)} at the effector against "
        f"{quantiles(noop)} at the no-op server (at the client, {row.callers} callers each "
        "waiting for its answer before the next call). "
    )


def _fsync(relaxed: Pairs) -> str:
    """What the fsynced effector's calls cost beyond the ``synchronous=NORMAL`` one's."""
    saved = [-extra for extra in relaxed.extra_us()]
    rounds = len(saved)
    said = (
        f"In the same {rounds} rounds an effector whose store runs with `synchronous=NORMAL` "
        "(no fsync per commit) "
    )
    if min(saved) > 0:
        return said + (
            f"took {range_text(saved, 'µs')} less per call than the fsynced one in every "
            "round: that is the fsync's share of the difference."
        )
    if max(saved) < 0:
        return said + (
            f"took {range_text([-x for x in saved], 'µs')} more per call in every round: this "
            "run shows no cost of the fsync."
        )
    return said + (
        f"took from {-max(saved):+.0f} to {-min(saved):+.0f} µs per call against the fsynced "
        "one across the rounds: the difference is within their spread, so this run does not "
        "separate the fsync's share."
    )


def budget_text(row: SubmitRow) -> str:
    """The time a call may take at the target, from the worst round, then the median one."""
    bound, pairs = row.target.bound, row.pairs
    budgets = [1e6 / (bound * floor) for floor in pairs.floor]
    overs = [1e6 / ours - budget for ours, budget in zip(pairs.ours, budgets, strict=True)]
    worst, median = max(range(len(overs)), key=lambda index: overs[index]), pairs.median
    text = (
        f"Next for this row: at {bound:g}x the no-op server's rate a call may take "
        f"{budgets[worst]:.0f} µs in the worst round, where it took {1e6 / pairs.ours[worst]:.0f}"
        + (
            f": to meet it in every round a call must take {overs[worst]:.0f} µs less"
            if overs[worst] > 0
            else ": every round met it"
        )
    )
    if median != worst:
        text += f" (in the median round it may take {budgets[median]:.0f} µs, " + (
            f"{overs[median]:.0f} fewer than then)" if overs[median] > 0 else "as it did)"
        )
    return text + "; "


def next_change(row: SubmitRow) -> str:
    """What the row must lose to meet its target, and what the measured facts point to."""
    text = budget_text(row)
    wait = None if row.commits is None else where(row.commits)
    split = row.split
    if wait is Wait.STORE:
        return text + STORE_POINTER
    if split is None:
        return text + "this run split neither the wait nor the CPU: " + MEASURE
    loop, busiest, rest, _ = deltas(split)
    if wait is Wait.OUTSIDE:
        occupied = loop_occupied(split)
        if occupied >= LOOP_BOUND:
            return text + LOOP_POINTER.format(
                occupied=f"{occupied:.0%}", loop=f"{loop:.0f}", writer=f"{busiest:.0f}"
            )
        seen = (
            "its time waiting for a core was not read"
            if split.queued is None
            else f"it was neither running nor waiting for a core {1 - occupied:.0%} of the "
            "split round"
        )
        return text + (
            "a call waits mostly outside the store's commits (above), but the event loop is not "
            f"shown to be the bottleneck ({seen}), so " + MEASURE
        )
    ours = split.ours
    if not saturated(ours):
        return text + (
            f"this run does not settle where a call waits, and CPU is not the bound either (the "
            f"processes, the client included, kept {ours.cores_with_client:.2f} of {CORES} "
            "cores busy in the split round), so " + MEASURE
        )
    parts = {
        "loop": loop,
        "writer": busiest,
        "rest": rest,
        "server": ours.us(ours.store_server_s),
    }
    largest = max(parts, key=lambda part: parts[part])
    total = sum(max(us, 0.0) for us in parts.values())
    named = {part: f"{us:.0f}" for part, us in parts.items()}
    most = "most" if total > 0 and parts[largest] > 0.5 * total else "the largest part"
    return (
        text
        + CPU_ONLY.format(cores=f"{ours.cores_with_client:.2f}", all=CORES)
        + CPU_POINTERS[largest].format(**named, most=most, name=largest_other(split) or "unnamed")
    )


LOOP_BOUND = 0.8
"""A loop running or waiting for a core this share of the round is taken as the bottleneck."""
MEASURE = (
    "this run does not place the wait: the next step is measuring it inside the effector, per "
    "call the time from its arrival to its hand-off to the group commit, in the commit, and "
    "from the commit to its response."
)
LOOP_POINTER = (
    "a call waits mostly outside the store's commits (above), and the event loop was running or "
    "waiting for a core {occupied} of the split round; of the effector's CPU per call beyond "
    "the no-op server's {loop} µs is on the loop (against {writer} on the busiest other "
    "thread): the next change is cutting what Submit runs on the loop per call that the "
    "no-op's handler does not (the intent's checks and argument validation, the record and the "
    "future handed to the group commit, the acknowledgement built from the store's answer)."
)
STORE_POINTER = (
    "the store's commits ran back to back (above), so they are on every call's critical path: "
    "the next change is the store's work per Submit (the intents' INSERT and the key rows' "
    "upsert), with the store cuts above."
)
CPU_ONLY = (
    "this run does not settle where a call waits, but the processes, the client included, kept "
    "{cores} of {all} cores busy in the split round, so CPU is the bound: "
)
CPU_POINTERS = {
    "loop": "the split puts {most} of the effector's extra CPU on the event loop ({loop} µs per "
    "call, against {writer} on the busiest other thread); cutting what Submit runs on the loop "
    "per call that the no-op's handler does not comes first.",
    "writer": "the split puts {most} of the effector's extra CPU on the busiest other thread "
    "({writer} µs per call, against {loop} on the event loop); the store's work per Submit (the "
    "intents' INSERT and the key rows' upsert) comes first.",
    "rest": "the split puts {most} of the effector's extra CPU on its other threads ({rest} µs "
    "per call, the most on `{name}`, against {loop} on the event loop); what those threads do "
    "per Submit comes first.",
    "server": "the split puts {most} of the CPU beyond the no-op's in the PostgreSQL server "
    "({server} µs per call, against {loop} on the event loops and {rest} on their other "
    "threads); the server's statements per Submit (the key rows' upsert and the intents' "
    "INSERT, timed above) come first.",
}
"""The change the largest part of the CPU difference points to, by part."""
