"""Benchmark 4's "What is left": each size not met, the fixed cost by part, the growth by function.

The profile of our code is taken without Beam (:func:`benchmarks.commit_placement.memory_rankings`),
so its figures are scaled to the pipeline by a factor this run measures: our code's thread CPU
inside ``process`` at the smallest size against the same agent's without Beam
(:mod:`benchmarks.core_only`), both of our code alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from beam_agents.core._memory_wire import LARGE_CONTENT_BYTES
from benchmarks.commit_placement import (
    Placement,
    grew,
    growth,
    measurable,
    shown,
    tenths,
    whole,
)
from benchmarks.in_pipeline import InPipeline
from benchmarks.memory_runs import FLOOR, OURS, SIZES, Paired, label
from benchmarks.noop_profile import FAKE, PartCost, Ranking, part_costs, part_of
from benchmarks.report import Figure, tenth

LISTED = 8
"""Parts of our code the fixed cost lists by name (the rest are summed)."""
GROWN = 5
"""Our functions the growth lists by name."""
BOUND = 2.0
"""The target: ours at most twice the floor (:data:`benchmarks.state_commit.TARGET`)."""


def ordered_parts(ranking: Ranking) -> list[PartCost]:
    """Our code's parts in ``ranking``, the largest first (the fake model aside)."""
    return [cost for cost in part_costs(ranking) if cost.part.label != FAKE]


def _functions(cost: PartCost) -> str:
    return ", ".join(f"{row.name} {row.charged_us:.1f}" for row in cost.rows[:3])


def _numbers(numbers: list[int]) -> str:
    """``[1, 2, 3]`` as "(1) to (3)", ``[1, 3]`` as "(1) and (3)"."""
    marks = [f"({number})" for number in numbers]
    if len(marks) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{marks[0]} to {marks[-1]}"
    return marks[0] if len(marks) == 1 else ", ".join(marks[:-1]) + " and " + marks[-1]


@dataclass(frozen=True)
class Miss:
    """A size not met: the cut its worst round needs and ``process`` there, ours and the floor's."""

    size: str
    cut: float
    """µs an activation, as printed (0.1 µs)."""
    ours: InPipeline
    floor: InPipeline
    rounds: int


@dataclass(frozen=True)
class Listed:
    """A part as the fixed cost lists it: its number there and its ~ figure in the pipeline."""

    number: int
    cost: PartCost
    us: float


def bottom_line(miss: Miss, listed: list[Listed]) -> str:
    """Whether the parts with a change proposed cover ``miss``'s cut, or all our code does."""
    (ours, ours_state, ours_code), (floor, floor_state, floor_code) = map(
        shown, (miss.ours, miss.floor)
    )
    code, cut = tenth(ours_code - floor_code), miss.cut
    head = (
        f"At {miss.size} the worst round needs {cut:.1f} µs cut, and our code beyond the "
        f"floor's own inside `process` there (one run) is ({ours:.1f} - {ours_state:.1f}) - "
        f"({floor:.1f} - {floor_state:.1f}) = {code:.1f} µs"
    )
    beam = (
        "Beam's side of the activation (its state calls, "
        f"{tenth(ours_state - floor_state):+.1f} µs for ours beyond the floor's inside `process` "
        "there, and outside `process`) or be noise (the cut is the worst of "
        f"{miss.rounds} rounds; our code's figure is one run)"
    )
    out_of_reach = f"at {miss.size} the target is out of reach of every change this run identifies"
    if cut > code:
        short = tenth(cut - code)
        return (
            f"{head}, {short:.1f} short of it: even deleting all of our code would not clear "
            f"it, so {out_of_reach}; the other {short:.1f} µs could only come from {beam}."
        )
    proposed = [part for part in listed if part.cost.part.proposed]
    total = tenth(sum(part.us for part in proposed))
    every = (
        f"all {len(proposed)} parts with a change proposed, "
        f"{_numbers([part.number for part in proposed])}, ~{total:.1f} together"
        if proposed
        else "no part with a change proposed, ~0.0"
    )
    if total < cut:
        return (
            f"{head}, which covers it; but {every}, fall short of it by "
            f"{tenth(cut - total):.1f} even removed entirely: that would have to come from our "
            f"code outside them ({tenth(code - total):.1f} µs of it there, its growth with the "
            f"size included), for which this run names no change, or from {beam}, so "
            f"{out_of_reach}."
        )
    count, fewest = 0, 0.0
    while fewest < cut:
        fewest = tenth(fewest + proposed[count].us)
        count += 1
    largest = _numbers([part.number for part in proposed[:count]])
    if count == len(proposed):
        share = f"{cut / total:.0%} of {every}"
    elif count == 1:
        share = f"{cut / fewest:.0%} of the largest part with a change proposed, {largest}, "
        share += f"~{fewest:.1f}, and {cut / total:.0%} of {every}"
    else:
        share = f"{cut / fewest:.0%} of the largest {count} parts with a change proposed, "
        share += f"{largest}, ~{fewest:.1f} together, and {cut / total:.0%} of {every}"
    return (
        f"{head}, which covers it: the cut is {share}, the share of those parts' time their "
        "changes would have to remove between them (that share of each part, were all cut "
        f"alike). What those changes save is not measured in this run: at {miss.size} no change "
        "this run identifies is shown to reach the target."
    )


def fixed_cost(fixed_us: float, placement: Placement, ranking: Ranking, misses: list[Miss]) -> str:
    """The fixed cost placed in the pipeline, our code's part of it by part (scaled to the
    pipeline), and, for each size in ``misses``, whether those parts or our code cover its cut."""
    (_, ours_state, pipeline), (_, floor_state, floor_code) = map(
        shown, (placement.ours[0], placement.floor[0])
    )
    alone = tenth(placement.alone[0])
    factor = pipeline / alone
    code, state, outside = tenths(fixed_us, pipeline - floor_code, ours_state - floor_state)
    parts = ordered_parts(ranking)
    scaled = [tenth(cost.us / ranking.profiled_us * pipeline) for cost in parts]
    listed = [
        Listed(number, cost, us)
        for number, (cost, us) in enumerate(zip(parts[:LISTED], scaled[:LISTED], strict=True), 1)
    ]
    others, total = tenth(sum(scaled[LISTED:])), tenth(sum(scaled))
    smallest = label(SIZES[0])
    clauses = [
        f"({part.number}) {part.cost.part.label}, ~{part.us:.1f} µs ({_functions(part.cost)}): "
        f"{part.cost.part.change}"
        for part in listed
    ]
    if others:
        clauses.append(f"every other function of ours, ~{others:.1f}")
    return (
        f"The fixed cost of an activation, {tenth(fixed_us):.1f} µs at {smallest} (ours less "
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
        f"times {factor:.2f}), our code's parts, largest first, each with benchmark 1's next "
        "change to it (or why none): "
        + "; ".join(clauses)
        + f". They take ~{total:.1f} of our code's {code:+.1f} beyond the floor's; the other "
        f"{tenth(code - total):+.1f} is the profile's time outside our functions (the agent, the "
        "in-memory cells standing in for Beam's state, the driver loop) scaled alike, less the "
        f"floor's own code. The bottom line for each size not met, against these parts as "
        f"profiled at {smallest} and our code in `process` at that size. "
        + " ".join(bottom_line(miss, listed) for miss in misses)
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
        clauses.append(f"{row.name} {tenth(charged):+.1f} (its own lines {own:+.1f}; {where})")
    # Sums and differences of the printed (0.1 µs) figures, so the reader's arithmetic agrees.
    everything = tenth(large.profiled_us - small.profiled_us)
    ours, outside = tenths(everything, large.ours_us - small.ours_us)
    top = tenth(sum(tenth(item[0]) for item in grown[:GROWN]))
    return (
        f"Profiled the same way at {label(SIZES[-1])} ({large.activations:,} activations), the "
        f"activation's profiled time grew {everything:+.1f} µs under the profiler: "
        f"{ours:+.1f} in our functions and {outside:+.1f} outside them (the agent "
        "making its value, as the floor's code does, and the in-memory cells). Our functions "
        "that grew most: "
        + "; ".join(clauses)
        + f"; together {top:+.1f} of our {ours:+.1f}. By the code (`core/_memory_wire.py`), none "
        "of ours works on the value byte by byte: `scan` reads the slot headers and makes views "
        f"into the elements, the commit hands a content of {LARGE_CONTENT_BYTES >> 10} KiB or "
        "more to Beam as an element of its own (the agent's `bytes`, not copied), and slot "
        "sizes come from `len`; so our code has no copy, encode or scan of the value's bytes "
        "to remove. What moves our functions' profiled time with the value's size (the "
        f"{ours:+.1f} above) is not identified by this run. Each function's share goes with its "
        "part's change above; what grew outside `process` (above) is Beam's and this run does not "
        "profile it; no change aimed at the value's size is indicated by this run."
    )


def _size_paragraph(size: int, figure: Figure, small: Paired, paired: Paired) -> str:
    """One size not met: its rounds against 2x, the fixed cost and the growth."""
    assert figure.ratio is not None
    grown = growth(small, paired)
    fixed = tenth(statistics.median(grown.fixed))
    low, high = paired.spread
    over = tenth(paired.worst_excess(BOUND) * 1e6)
    return (
        f"At {label(size)} the {len(paired.rounds)} paired rounds' ratios ran from {low:.2f}x "
        f"to {high:.2f}x (median {figure.ratio:.2f}x): "
        + (
            "within 2x in some rounds and not in others, so not met in this run"
            if low <= BOUND
            else "over 2x in every round"
        )
        + f". To be within 2x in every round ours must cost {over:.1f} µs an activation "
        f"less (the worst round's excess over twice its floor){_implausible(small, paired)}. "
        "Ours less the floor ran "
        f"{whole([(r.ours - r.floor) * 1e6 for r in paired.rounds])} µs over the rounds; "
        f"the fixed cost of an activation over the floor (ours less the floor at "
        f"{label(SIZES[0])}) ran {whole(grown.fixed)} µs (median {fixed:.1f}); round by "
        f"round (each round at {label(size)} against the same round at {label(SIZES[0])}), "
        + grew(grown.beyond, "what ours grew beyond the floor's growth")
        + ", and "
        + grew(grown.floor, "the floor's own growth")
        + (
            f"; cutting {over:.1f} µs of the fixed cost (median {fixed:.1f}) would clear 2x here."
            if fixed >= over
            else f"; even with none of the fixed cost (median {fixed:.1f}) it would be "
            f"{tenth(over - fixed):.1f} µs over: "
            + (
                "the growth must be cut too."
                if measurable(grown.beyond)
                else "that rest is in a growth this run cannot tell from noise (below)."
            )
        )
    )


def _implausible(small: Paired, paired: Paired) -> str:
    """That the worst round's floor is below every round's floor at the smallest size, where
    writing more bytes cannot cost less: that round is noise, and what the median round needs."""
    worst = max(paired.rounds, key=lambda r: r.ours - BOUND * r.floor)
    least = min(r.floor for r in small.rounds)
    if worst.floor >= least:
        return ""
    median = paired.median
    need = tenth((median.ours - BOUND * median.floor) * 1e6)
    return (
        f"; but that round's floor, {worst.floor * 1e6:.1f} µs, is below every round's floor "
        f"at {label(SIZES[0])} (the least {least * 1e6:.1f}): writing more bytes cannot cost "
        "less, so that round's figures are noise and the cut it sets overstates what our code "
        "must lose; the median round "
        + (f"needs {need:.1f} µs cut" if need > 0 else "is within 2x")
    )


def remaining(
    figures: list[Figure],
    measured: dict[int, Paired],
    commits: list[Figure],
    placement: Placement,
    placed: str,
    rankings: tuple[Ranking, Ranking],
    inside: Mapping[int, Mapping[str, InPipeline]],
) -> str:
    """Each size not met, then the fixed cost by part and the growth (noise if not measurable).

    ``placed`` is the in-pipeline account of the growth (:func:`commit_placement.account`);
    ``rankings`` profile this agent's activation without Beam at the smallest and largest size;
    ``inside`` is ``process`` at every size, ours and the floor's (:mod:`benchmarks.in_pipeline`).
    """
    small = measured[SIZES[0]]
    parts: list[str] = []
    misses: list[Miss] = []
    grows = False
    for size, figure in zip(SIZES, figures, strict=True):
        if figure.met is not False or figure.floor is None or figure.ratio is None:
            continue
        paired = measured[size]
        parts.append(_size_paragraph(size, figure, small, paired))
        misses.append(
            Miss(
                label(size),
                tenth(paired.worst_excess(BOUND) * 1e6),
                inside[size][OURS],
                inside[size][FLOOR],
                len(paired.rounds),
            )
        )
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
    parts.append(fixed_cost(fixed, placement, rankings[0], misses))
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
