"""Benchmark 6's account of a one-intent Submit row that is not met: rounds, waits, next change.

For each such row (missed in every paired round, or in some of them) it says
what the rounds found (:mod:`benchmarks.paired_rounds`), how long a call took at each side in the
median round, where the effector's CPU went (:mod:`benchmarks.submit_split`), where a call
waits (:mod:`benchmarks.group_commits`), what the fsync changed (SQLite), whether the machine's
CPU alone forbids the target in the split round, judged against the cores the machine kept busy
there (:mod:`benchmarks.submit_cpu`), and what is next: the parts of the work this run names,
each bounded by the CPU it uses beyond the no-op's, set against the CPU cut when the round was
CPU-bound, else against the wall time a call must lose (with the measurement that would decide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.effector_findings import CORES
from benchmarks.group_commits import GroupCommits, Wait, wait_text, where
from benchmarks.harness import percentile
from benchmarks.paired_rounds import Pairs, range_text, straddles
from benchmarks.report import Figure, Target, tenth
from benchmarks.report import ratio_text as shown
from benchmarks.submit_cpu import (
    LOOP_SHORT,
    Change,
    bounds_text,
    changes,
    cpu_verdict,
    extra_parts,
    need,
    need_text,
    next_text,
)
from benchmarks.submit_profile import LoopProfile, parts_text
from benchmarks.submit_split import SubmitSplit, split_text


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
    loop: LoopProfile | None = None
    """The event loop's parts in a profiled round of the same calls (a single effector)."""


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
        f"{shown(low, row.target)[:-1]}-{shown(high, row.target)} the no-op gRPC server's "
        f"(median {shown(ratio, row.target)}: "
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
        text += " " + _fsync(row, row.relaxed)
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


def _fsync(row: SubmitRow, relaxed: Pairs) -> str:
    """What the fsynced effector's calls cost beyond the ``synchronous=NORMAL`` one's, and
    whether dropping the fsync would meet the row's target."""
    saved = [-extra for extra in relaxed.extra_us()]
    rounds = len(saved)
    said = (
        f"In the same {rounds} rounds an effector whose store runs with `synchronous=NORMAL` "
        "(no fsync per commit) "
    )
    if min(saved) > 0:
        said += (
            f"took {range_text(saved, 'µs')} less per call than the fsynced one in every "
            "round: that is the fsync's share of the difference."
        )
    elif max(saved) < 0:
        said += (
            f"took {range_text([-x for x in saved], 'µs')} more per call in every round: this "
            "run shows no cost of the fsync."
        )
    else:
        said += (
            f"took from {-max(saved):+.0f} to {-min(saved):+.0f} µs per call against the "
            "fsynced one across the rounds: the difference is within their spread, so this run "
            "does not separate the fsync's share."
        )
    return f"{said} {_without_fsync(row, relaxed, saved)}".rstrip()


def _without_fsync(row: SubmitRow, relaxed: Pairs, saved: Sequence[float]) -> str:
    """Whether the effector without the fsync meets the target, and the fsync's share in the
    worst round against the cut that round needs."""
    bound = row.target.bound
    if len(relaxed.ours) != len(row.pairs.floor):
        return ""
    ratios = [ours / noop for ours, noop in zip(relaxed.ours, row.pairs.floor, strict=True)]
    missed = sum(ratio < bound for ratio in ratios)
    if not missed:
        return (
            f"Without the fsync the effector met {bound:g}x in every round (its least "
            f"{shown(min(ratios), row.target)}): the fsync alone keeps this row from its "
            "target, at the cost of durability against a crash of the machine."
        )
    _, _, cut, worst = worst_round(row)
    share = (
        f" In the worst round, where a call must take {cut:.1f} µs less (below), the fsync's "
        "share "
        f"was {range_text([saved[worst]], 'µs')} per call ({range_text(saved, 'µs')} over the "
        "rounds)."
        if min(saved) > 0 and cut > 0
        else ""
    )
    return (
        f"Without the fsync the effector still missed {bound:g}x in {missed} of {len(ratios)} "
        f"rounds (its least {shown(min(ratios), row.target)} of the no-op server's rate): the "
        f"fsync is not the lever.{share}"
    )


def worst_round(row: SubmitRow) -> tuple[float, float, float, int]:
    """The round furthest from the target: the µs a call may take at the target and took
    there (to 0.1 µs, as printed), the cut (their difference), and the round's index."""
    bound, pairs = row.target.bound, row.pairs
    budgets = [tenth(1e6 / (bound * floor)) for floor in pairs.floor]
    took = [tenth(1e6 / ours) for ours in pairs.ours]
    worst = max(range(len(took)), key=lambda index: took[index] - budgets[index])
    return budgets[worst], took[worst], tenth(took[worst] - budgets[worst]), worst


def budget_text(row: SubmitRow) -> str:
    """The time a call may take at the target, from the worst round, then the median one."""
    bound, pairs = row.target.bound, row.pairs
    budget, took, cut, worst = worst_round(row)
    text = (
        f"Next for this row: at {bound:g}x the no-op server's rate a call may take {budget:.1f} "
        f"µs in the worst round, where it took {took:.1f}"
        + (
            f": to meet it in every round a call must take {cut:.1f} µs less"
            if cut > 0
            else ": every round met it"
        )
    )
    median = pairs.median
    if median != worst:
        allowed = tenth(1e6 / (bound * pairs.floor[median]))
        spent = tenth(1e6 / pairs.ours[median])
        text += f" (in the median round it may take {allowed:.1f} µs and took {spent:.1f}" + (
            f": {spent - allowed:.1f} µs too many)" if spent > allowed else ")"
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
        return text + "this run split neither the wait nor the CPU: " + MEASURE + DECIDES
    cpu = need(split, row.target.bound)
    found = changes(split, row.commits)
    apart = 0 if row.commits is None else row.commits.apart_us
    single = split.replicas == 1
    text = (
        text[:-2]
        + ". "
        + need_text(
            cpu,
            row.target.bound,
            single,
            extra_parts(split),
            apart,
            queued=split.queued is not None,
        )
    )
    if cpu.forbids:
        text += bounds_text(found, cpu.cut, "of CPU per call") + cpu_verdict(found, cpu.cut)
        if cpu.cpu_bound or cpu.wall_cut <= 0:
            return text + next_text(found)
        return (
            text
            + " That is necessary, not sufficient: in the split round a call must also take "
            + f"{cpu.wall_cut:.1f} µs less. "
            + _wall_verdict(split, found, cpu.wall_cut, wait, row.loop)
        )
    if cpu.wall_cut <= 0:
        worst_cut = worst_round(row)[2]
        if cpu.cpu_bound:
            # The worst round was not split; were it bound like the split one, a call's time
            # falls by a CPU cut over the cores busy, so its wall cut is that many µs of CPU.
            cut = tenth(worst_cut * cpu.busy)
            most = tenth(worst_cut * CORES)
            beyond = ", beyond every part's bound" if all(c.bound < most for c in found) else ""
            return text + (
                f"The split round met the target; the worst round was not split by thread. Were "
                f"it CPU-bound like the split round, its {worst_cut:.1f} µs a call would take "
                f"about {cut:.1f} µs less CPU per call ({worst_cut:.1f} x {cpu.busy:.2f}, the "
                f"cores {SIDES[single]} kept busy in the split round; the worst round's were not "
                f"measured, and at a higher level the same cut is more CPU: {most:.1f} µs at "
                f"{CORES} cores{beyond}). "
                + bounds_text(found, cut, "of CPU per call")
                + _were_bound(found, cut)
                + next_text(found)
            )
        # Not bound (a missed row has a worst round to cut): its wall cut against the parts.
        return text + (
            "The split round met the target; the worst round was not split by thread, so its "
            "cut is set against the split round's parts. "
            + bounds_text(found, worst_cut, "of wall time a call must lose in the worst round")
            + _wall_verdict(split, found, worst_cut, wait, row.loop)
        )
    return (
        text
        + bounds_text(found, cpu.wall_cut, "of wall time a call must lose in the split round")
        + _wall_verdict(split, found, cpu.wall_cut, wait, row.loop)
    )


SIDES = {True: "the effector's side", False: "the effectors' side"}
"""The effectors' side, by whether there is a single effector."""


def _were_bound(found: list[Change], cut: float) -> str:
    """The CPU verdict on the worst round's cut, which holds only were that round CPU-bound."""
    together = sum(max(change.bound, 0) for change in found)
    if together >= cut:
        return cpu_verdict(found, cut)
    return (
        f"No part's upper bound reaches the {cut:.1f} µs alone (together at most {together}): "
        "were the worst round CPU-bound like the split one, no change this run identifies would "
        "reach the target; it was not split, so this run does not show that it was."
    )


def _wall_verdict(
    split: SubmitSplit,
    found: list[Change],
    cut: float,
    wait: Wait | None = None,
    loop_profile: LoopProfile | None = None,
) -> str:
    """Whether removing the loop's extra CPU could cover the wall-time cut (only if a call's
    time fell one for one with it); with the wait outside the commits, the loop's parts by
    ``loop_profile`` and the next change, else what to measure next."""
    loop = next(change for change in found if change.short == LOOP_SHORT)
    occupied = ""
    if split.queued is not None:
        ran, waited = (round(split.ours.us(seconds)) for seconds in split.queued[0])
        occupied = (
            f" (by the run-queue reading around the split round, the event loop ran {ran} µs "
            f"per call and waited {waited} "
            f"for a core, {ran + waited} of the {round(split.ours.wall_us)} µs a call took)"
        )
    reaches = loop.bound >= cut
    text = (
        "Cutting a thread's CPU shortens a call as much only if a call's time falls one for one "
        f"with that thread's CPU{occupied}: removing all of the loop's extra, {loop.bound} µs, "
        + (
            f"would cover the {cut:.1f} µs only if it did, and only then would a change on the "
            f"loop have to remove at least {cut:.1f} of it ({cut / loop.bound:.0%})"
            if reaches
            else f"would not cover the {cut:.1f} µs even if it did ({cut - loop.bound:.1f} short)"
        )
    )
    if wait is Wait.OUTSIDE and loop_profile is not None:
        ours, noop = (round(s.us(s.servers.main_thread_s)) for s in (split.ours, split.noop))
        return text + RULED_OUT + " " + parts_text(loop_profile, ours, cut, noop)
    if wait is Wait.OUTSIDE:
        return text + RULED_OUT + OUTSIDE_NEXT + next_text(found)
    return (
        text
        + "; no change this run identifies is shown to reach it, so "
        + MEASURE
        + DECIDES
        + next_text(found, undecided=True)
    )


MEASURE = (
    "the next step is measuring where a call waits inside the effector: per call the time from "
    "its arrival to its hand-off to the group commit, in the commit, and from the commit to its "
    "response."
)
DECIDES = (
    " That decides between Submit's work on the loop (if a call waits before the hand-off or "
    "after the commit) and the store's commit path (the store's threads and, on PostgreSQL, the "
    "server's statements: if it waits in the commit)."
)
RULED_OUT = (
    ". The store's commits are ruled out as a call's main wait (above: it waits mostly outside "
    "them), so the wait is on Submit's side of the hand-off, where the loop's extra is the "
    "part named."
)
OUTSIDE_NEXT = (
    " No change this run identifies is shown to reach the cut, and the next step is "
    "splitting the wait outside the commits: per call the time from its arrival to its "
    "hand-off to the group commit, and from the commit's answer to its response."
)
STORE_POINTER = (
    "the store's commits ran back to back (above), so they are on every call's critical path: "
    "the next change is the store's work per Submit (the intents' INSERT and the key rows' "
    "upsert), with the store cuts above."
)
