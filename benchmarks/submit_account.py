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
from benchmarks.report import ratio_text as shown
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
        f" In the worst round, where a call must take {cut} µs less (below), the fsync's share "
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


def worst_round(row: SubmitRow) -> tuple[int, int, int, int]:
    """The round furthest from the target: the µs a call may take at the target and took
    there (rounded, as printed), the cut (their difference), and the round's index."""
    bound, pairs = row.target.bound, row.pairs
    budgets = [round(1e6 / (bound * floor)) for floor in pairs.floor]
    took = [round(1e6 / ours) for ours in pairs.ours]
    worst = max(range(len(took)), key=lambda index: took[index] - budgets[index])
    return budgets[worst], took[worst], took[worst] - budgets[worst], worst


def budget_text(row: SubmitRow) -> str:
    """The time a call may take at the target, from the worst round, then the median one."""
    bound, pairs = row.target.bound, row.pairs
    budget, took, cut, worst = worst_round(row)
    text = (
        f"Next for this row: at {bound:g}x the no-op server's rate a call may take {budget} µs "
        f"in the worst round, where it took {took}"
        + (
            f": to meet it in every round a call must take {cut} µs less"
            if cut > 0
            else ": every round met it"
        )
    )
    median = pairs.median
    if median != worst:
        allowed = round(1e6 / (bound * pairs.floor[median]))
        spent = round(1e6 / pairs.ours[median])
        text += f" (in the median round it may take {allowed} µs and took {spent}" + (
            f": {spent - allowed} µs too many)" if spent > allowed else ")"
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
    loop, grown, rest, _ = deltas(split)
    name = largest_other(split) or "unnamed"
    if wait is Wait.OUTSIDE:
        occupied = loop_occupied(split)
        if occupied >= LOOP_BOUND and loop > 0:
            return text + LOOP_POINTER.format(
                occupied=f"{occupied:.0%}", loop=loop, named=grown, name=name
            )
        seen = (
            "its time waiting for a core was not read"
            if split.queued is None
            else f"it was running or waiting for a core {occupied:.0%} of the split round but "
            f"used {loop} µs of CPU per call beyond the no-op's loop"
            if occupied >= LOOP_BOUND
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
        "named": grown,
        "rest": rest,
        "server": round(ours.us(ours.store_server_s)),
    }
    largest = max(parts, key=lambda part: parts[part])
    total = sum(max(us, 0) for us in parts.values())
    most = "most" if total > 0 and parts[largest] > 0.5 * total else "the largest part"
    pointer = CPU_POINTERS[largest].format(
        **parts,
        most=most,
        name=name,
        then=STORE_FIRST if name in STORE_THREADS else OTHERS_FIRST,
    )
    return (
        text
        + CPU_ONLY.format(cores=f"{ours.cores_with_client:.2f}", all=CORES)
        + pointer
        + _server_statements(row, ours.cores_with_client)
    )


def _server_statements(row: SubmitRow, cores: float) -> str:
    """The server's statement time per call (PostgreSQL) against the CPU a call must lose."""
    commits, cut = row.commits, worst_round(row)[2]
    if commits is None or commits.whole or cut <= 0:
        return ""
    commit_ms, shared, busy = (
        round(commits.commit_ms, 2),
        round(commits.calls_per_commit, 1),
        round(cores, 2),
    )
    per_call = round(commit_ms * 1000 / shared)
    needed = round(cut * busy)
    return (
        f" In the counted round above the server's statements took {per_call} µs of wall time "
        f"per call ({commit_ms:.2f} ms a commit over {shared:.1f} calls), lock waits included, "
        f"so their CPU is at most that; with {busy:.2f} of {CORES} cores busy, a call "
        f"{cut} µs shorter needs about {needed} µs less CPU per call ({cut} x {busy:.2f}): "
        + (
            "removing all of the server's statement time would not reach it."
            if per_call < needed
            else "removing all of the server's statement time could reach it only if it were "
            "all CPU."
        )
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
    "the no-op server's {loop} µs is on the loop (against {named} on `{name}`, the thread name "
    "that grew most): the next change is cutting what Submit runs on the loop per call that the "
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
STORE_THREADS = ("sqlite", "pg")
"""Thread names of the stores' writers (:mod:`benchmarks.submit_split`)."""
STORE_FIRST = "the store's work per Submit (the intents' INSERT and the key rows' upsert)"
OTHERS_FIRST = "what those threads do per Submit"
CPU_POINTERS = {
    "loop": "the split puts {most} of the effector's extra CPU on the event loop ({loop} µs per "
    "call, against {named} on `{name}`, the thread name that grew most); cutting what Submit "
    "runs on the loop per call that the no-op's handler does not comes first.",
    "named": "the split puts {most} of the effector's extra CPU on `{name}` ({named} µs per "
    "call beyond the no-op's threads of that name, against {loop} on the event loop); {then} "
    "comes first.",
    "rest": "the split puts {most} of the effector's extra CPU on its other threads besides "
    "`{name}` ({rest} µs per call, against {loop} on the event loop); what those threads do "
    "per Submit comes first.",
    "server": "the split puts {most} of the CPU beyond the no-op's in the PostgreSQL server "
    "({server} µs per call, against {loop} on the event loops, {named} on `{name}` and {rest} "
    "on their other threads); the server's statements per Submit (the key rows' upsert and "
    "the intents' INSERT, timed above) come first.",
}
"""The change the largest part of the CPU difference points to, by part."""
