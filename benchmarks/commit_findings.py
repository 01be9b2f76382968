"""Benchmark 4's "What is left": each size not met, the fixed cost by part, the growth by function.

The profile of our code is taken without Beam (:func:`benchmarks.commit_placement.memory_rankings`),
so its figures are scaled to the pipeline by a factor this run measures: our code's thread CPU
inside ``process`` at the smallest size against the same agent's without Beam
(:mod:`benchmarks.core_only`), both of our code alone.
"""

from __future__ import annotations

import statistics

from beam_agents.core._memory_wire import LARGE_CONTENT_BYTES
from benchmarks.commit_placement import (
    Placement,
    grew,
    growth,
    measurable,
    shown,
    tenth,
    tenths,
    whole,
)
from benchmarks.memory_runs import SIZES, Paired, label
from benchmarks.noop_profile import FAKE, PartCost, Ranking, part_costs, part_of
from benchmarks.report import Figure

MEMORY_PARTS = ("the memory write", "the activation's path")
"""Benchmark 1's named parts for its model-call activation, which writes memory as this one."""
LISTED = 8
"""Parts of our code the fixed cost lists by name (the rest are summed)."""
GROWN = 5
"""Our functions the growth lists by name."""
BOUND = 2.0
"""The target: ours at most twice the floor (:data:`benchmarks.state_commit.TARGET`)."""


def ordered_parts(ranking: Ranking) -> list[PartCost]:
    """Our code's parts in ``ranking``: benchmark 1's :data:`MEMORY_PARTS` first, then by size."""
    costs = [cost for cost in part_costs(ranking) if cost.part.label != FAKE]
    named = [cost for cost in costs if cost.part.label in MEMORY_PARTS]
    return named + [cost for cost in costs if cost.part.label not in MEMORY_PARTS]


def _functions(cost: PartCost) -> str:
    return ", ".join(f"{row.name} {row.charged_us:.1f}" for row in cost.rows[:3])


def fixed_cost(
    fixed_us: float, placement: Placement, ranking: Ranking, cuts: dict[str, float]
) -> str:
    """The fixed cost placed in the pipeline, our code's part of it by part (scaled to the
    pipeline), and what benchmark 1's named changes could remove against ``cuts``."""
    (_, ours_state, pipeline), (_, floor_state, floor_code) = map(
        shown, (placement.ours[0], placement.floor[0])
    )
    alone = tenth(placement.alone[0])
    factor = pipeline / alone
    code, state, outside = tenths(fixed_us, pipeline - floor_code, ours_state - floor_state)
    parts = ordered_parts(ranking)
    scaled = [tenth(cost.us / ranking.profiled_us * pipeline) for cost in parts]
    listed = list(zip(parts[:LISTED], scaled[:LISTED], strict=True))
    others, total = tenth(sum(scaled[LISTED:])), tenth(sum(scaled))
    rest = tenth(code - total)
    named = tenth(sum(us for cost, us in listed if cost.part.label in MEMORY_PARTS))
    fixed = tenth(fixed_us)
    count = sum(1 for cost, _ in listed if cost.part.label in MEMORY_PARTS)
    numbered = {1: "(1)", 2: "(1) and (2)"}.get(count, f"(1) to ({count})")
    smallest = label(SIZES[0])
    clauses = [
        f"({number}) {cost.part.label}, ~{us:.1f} µs ({_functions(cost)}): {cost.part.change}"
        for number, (cost, us) in enumerate(listed, 1)
    ]
    if others:
        clauses.append(f"every other function of ours, ~{others:.1f}")
    against = ", ".join(
        f"{over:.1f} µs at {size} ("
        + ("within it" if named >= over else f"short of it by {tenth(over - named):.1f}")
        + ")"
        for size, over in cuts.items()
    )
    size, largest = max(cuts.items(), key=lambda item: item[1])
    return (
        f"The fixed cost of an activation, {fixed:.1f} µs at {smallest} (ours less "
        "the floor, median of the rounds), placed in the pipeline (thread CPU of `process` at "
        f"{smallest}, one run each): {code:+.1f} µs in our code beyond the floor's own code, "
        f"{state:+.1f} in Beam's state calls beyond the floor's, and the rest, {outside:+.1f}, "
        "outside `process` (Beam binding our parameters, handing over the element and our "
        "outputs: not profiled in this run; noise lands here too). Our code took "
        f"{pipeline:.1f} µs inside `process`, Beam's state calls left out (the floor's own code "
        f"{floor_code:.1f}), and "
        f"{alone:.1f} without Beam (`benchmarks/core_only.py`, the best of its rounds): in the "
        f"pipeline it ran at {factor:.2f}x its time without Beam, the factor that scales the "
        f"profile below, of our code without Beam, to the pipeline. Profiled without Beam "
        f"({ranking.activations:,} activations of {smallest} on {ranking.keys} keys, cProfile; "
        "a function's figure is its µs per activation under the profiler, charged with the "
        "library code it calls; ~ is a part's share of all the profiled time times the "
        f"{pipeline:.1f} µs in the pipeline, i.e. its share of the {alone:.1f} without Beam "
        f"times {factor:.2f}), our code's parts, first those of benchmark 1's "
        "named changes for an activation that writes memory, then the rest largest first: "
        + "; ".join(clauses)
        + f". They take ~{total:.1f} of our code's {code:+.1f} beyond the floor's; the other "
        f"{rest:+.1f} is the profile's time outside our functions (the agent, the in-memory "
        "cells standing in for Beam's state, the driver loop) scaled alike, less the floor's "
        f"own code. Benchmark 1's named changes, {numbered}, take ~{named:.1f} µs in the "
        f"pipeline (~{named / factor:.1f} without Beam): removed entirely they would remove at "
        f"most that, against the cut the worst round needs: {against}. The rest of the fixed "
        f"cost, {tenth(fixed - named):.1f} µs, is the parts after them "
        f"(~{tenth(total - named):.1f} together), the other {rest:+.1f} of our code, and the "
        f"{tenth(state + outside):+.1f} in state calls and outside `process`. All our code's parts "
        f"together, ~{total:.1f}, "
        + (
            f"cover the largest cut ({largest:.1f} µs at {size}) if removed entirely; the parts "
            "come in their order, each change kept only if the rows move."
            if total >= largest
            else f"fall short of the largest cut ({largest:.1f} µs at {size}) even removed "
            "entirely: the rest would have to come from "
            + ("the growth (below) or " if largest > fixed else "")
            + "Beam's side of the activation (state calls and outside `process`)."
        )
    )


def grown_functions(small: Ranking, large: Ranking, parts: list[PartCost]) -> str:
    """Our functions whose charged time grew most from the smallest size to the largest."""
    before = {(row.path, row.function): row for row in small.rows}
    grown = sorted(
        (
            (
                row.charged_us - (before[key].charged_us if key in before else 0.0),
                row.self_us - (before[key].self_us if key in before else 0.0),
                row,
            )
            for row in large.rows
            for key in [(row.path, row.function)]
        ),
        key=lambda item: -item[0],
    )
    numbers = {cost.part.label: number for number, cost in enumerate(parts[:LISTED], 1)}
    clauses = []
    for charged, own, row in grown[:GROWN]:
        part = part_of(row)
        where = f"part ({numbers[part.label]})" if part.label in numbers else part.change
        clauses.append(f"{row.name} {charged:+.1f} (its own lines {own:+.1f}; {where})")
    everything = large.profiled_us - small.profiled_us
    ours = large.ours_us - small.ours_us
    top = sum(item[0] for item in grown[:GROWN])
    return (
        f"Profiled the same way at {label(SIZES[-1])} ({large.activations:,} activations), the "
        f"activation's profiled time grew {everything:+.1f} µs under the profiler: "
        f"{ours:+.1f} in our functions and {tenth(everything - ours):+.1f} outside them (the agent "
        "making its value, as the floor's code does, and the in-memory cells). Our functions "
        "that grew most: "
        + "; ".join(clauses)
        + f"; together {top:+.1f} of our {ours:+.1f}. None of our code works on the value "
        "byte by byte (`core/_memory_wire.py`): `scan` reads the slot headers and makes views "
        f"into the elements, the commit hands a content of {LARGE_CONTENT_BYTES >> 10} KiB or "
        "more to Beam as an element of its own (the agent's `bytes`, not copied), and slot "
        "sizes come from `len`; so there is no copy, encode or scan of the value's bytes to "
        "remove, and the growth is the same per-activation work running slower beside a large "
        "value, for a reason the profile cannot see (it times functions, not the processor's "
        "caches or the allocator). Each function's share goes with its part's change above; "
        "what grew outside `process` (above) is Beam's and this run does not profile it; no "
        "change aimed at the value's size is indicated by this run."
    )


def _size_paragraph(size: int, figure: Figure, small: Paired, paired: Paired) -> str:
    """One size not met: its rounds against 2x, the fixed cost and the growth."""
    assert figure.ratio is not None
    grown = growth(small, paired)
    fixed = statistics.median(grown.fixed)
    low, high = paired.spread
    over = paired.worst_excess(BOUND) * 1e6
    return (
        f"At {label(size)} the {len(paired.rounds)} paired rounds' ratios ran from {low:.2f}x "
        f"to {high:.2f}x (median {figure.ratio:.2f}x): "
        + (
            "within 2x in some rounds and not in others, so not met in this run"
            if low <= BOUND
            else "over 2x in every round"
        )
        + f". To be within 2x in every round ours must cost {over:.1f} µs an activation "
        f"less (the worst round's excess over twice its floor). Ours less the floor ran "
        f"{whole([(r.ours - r.floor) * 1e6 for r in paired.rounds])} µs over the rounds; "
        f"the fixed cost of an activation over the floor (ours less the floor at "
        f"{label(SIZES[0])}) ran {whole(grown.fixed)} µs (median {fixed:.0f}); round by "
        f"round (each round at {label(size)} against the same round at {label(SIZES[0])}), "
        + grew(grown.beyond, "what ours grew beyond the floor's growth")
        + ", and "
        + grew(grown.floor, "the floor's own growth")
        + (
            f"; cutting {over:.1f} µs of the fixed cost (median {fixed:.0f}) would clear 2x here."
            if fixed >= over
            else f"; even with none of the fixed cost (median {fixed:.0f}) it would be "
            f"{over - fixed:.1f} µs over: "
            + (
                "the growth must be cut too."
                if measurable(grown.beyond)
                else "that rest is in a growth this run cannot tell from noise (below)."
            )
        )
    )


def remaining(
    figures: list[Figure],
    measured: dict[int, Paired],
    commits: list[Figure],
    placement: Placement,
    placed: str,
    rankings: tuple[Ranking, Ranking],
) -> str:
    """Each size not met, then the fixed cost by part and the growth (noise if not measurable).

    ``placed`` is the in-pipeline account of the growth (:func:`commit_placement.account`);
    ``rankings`` profile this agent's activation without Beam at the smallest and largest size.
    """
    small = measured[SIZES[0]]
    parts, cuts, grows = [], {}, False
    for size, figure in zip(SIZES, figures, strict=True):
        if figure.met is not False or figure.floor is None or figure.ratio is None:
            continue
        paired = measured[size]
        parts.append(_size_paragraph(size, figure, small, paired))
        cuts[label(size)] = paired.worst_excess(BOUND) * 1e6
        grows = grows or measurable(growth(small, paired).beyond)
    missed_commits = [
        f"{figure.name} is {figure.ratio:.2f}x the floor's ({figure.ours:.0f} against "
        f"{figure.floor:.0f} µs per key; the details split off Beam's weighing of the cells)."
        for figure in commits
        if figure.met is False and figure.ratio is not None
    ]
    if not parts:
        return " ".join(missed_commits)
    low, high = small.spread
    parts.insert(
        0,
        f"The rounds' ratios move with the machine's load: at {label(SIZES[0])} (untargeted, the "
        f"same code in every round) they ran from {low:.2f}x to {high:.2f}x in this run.",
    )
    fixed = statistics.median(growth(small, small).fixed)
    parts.append(fixed_cost(fixed, placement, rankings[0], cuts))
    parts.append(
        "Then the growth."
        if grows
        else "What ours grew with the size beyond the floor's growth is not measurable at any "
        "size not met (each round-by-round range holds zero): this run cannot tell it from "
        "noise; where it would be, were it real, follows."
    )
    parts.append(placed)
    parts.append(grown_functions(*rankings, ordered_parts(rankings[0])))
    return " ".join(
        [
            *missed_commits,
            *parts,
            "A bag of slot records appended as slots change (the newest record of a key "
            "winning, the bag compacted when its dead bytes pass its live ones; a versioned "
            "layout change) would hand Beam only the slots a commit changed: that moves the "
            "rows with an untouched slot beside the changed one, not these rows, whose memory "
            "is the one slot each commit changes.",
        ]
    )
