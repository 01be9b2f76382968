"""Benchmark 1's ranking of our own code (``benchmarks/noop_profile.py``) and its report text.

What is charged to which function, how functions fall into parts, and that the "What is left"
text names the ranked parts with their figures. Nothing here asserts on speed.
"""

from __future__ import annotations

import pstats
from types import SimpleNamespace
from typing import Any

import pytest

from beam_agents import AgentConfig
from benchmarks import noop_activation
from benchmarks.in_pipeline import InPipeline
from benchmarks.noop_findings import HISTORY
from benchmarks.noop_profile import (
    FAKE,
    PARTS,
    Ranked,
    Ranking,
    named_us,
    next_changes,
    part_costs,
    part_of,
    rank,
    rank_without_beam,
    ranking_lines,
)
from benchmarks.noop_split import Parameters, Split
from benchmarks.pipelines import keyed_events
from benchmarks.report import Figure, Goal, Target

OURS = "site/beam_agents/core/activation.py"


def _stats(entries: dict[tuple[str, int, str], Any]) -> pstats.Stats:
    """A stand-in for a profile: ``rank`` reads only its ``stats`` mapping."""
    stats: pstats.Stats = SimpleNamespace(stats=entries)  # type: ignore[assignment]
    return stats


def test_a_function_is_charged_its_library_calls_but_not_ours_beams_or_the_benchmarks() -> None:
    commit = (OURS, 10, "_commit")
    header = ("site/beam_agents/core/state.py", 5, "write_header")
    builtin = ("~", 0, "<built-in method builtins.len>")
    json = ("lib/json/encoder.py", 1, "encode")
    send = ("~", 0, "<method 'send' of 'coroutine' objects>")
    cell = ("repo/tests/core/harness.py", 1, "write")
    beam = ("site/apache_beam/pvalue.py", 1, "__init__")
    # pstats entries: (primitive calls, calls, self s, cumulative s, {caller: edge figures}).
    stats = _stats(
        {
            commit: (2, 2, 1.0, 9.0, {}),
            header: (2, 2, 0.4, 0.4, {commit: (2, 2, 0.4, 0.4), send: (2, 2, 0.4, 0.4)}),
            builtin: (4, 4, 0.5, 0.5, {commit: (4, 4, 0.5, 0.5)}),
            json: (2, 2, 0.1, 0.7, {commit: (2, 2, 0.1, 0.7)}),
            send: (2, 2, 0.3, 5.0, {commit: (2, 2, 0.3, 5.0)}),  # leads back into ours
            cell: (2, 2, 2.0, 2.0, {commit: (2, 2, 2.0, 2.0)}),
            beam: (2, 2, 0.6, 0.6, {commit: (2, 2, 0.6, 0.6)}),
        }
    )
    rows = rank(stats, activations=2)
    assert [(row.path, row.function) for row in rows] == [
        ("beam_agents/core/activation.py", "_commit"),
        ("beam_agents/core/state.py", "write_header"),
    ]
    first = rows[0]
    # Its own 1.0 s, the builtin's 0.5, the encoder's 0.7 with what it calls, the coroutine's
    # own 0.3 only: over 2 activations.
    assert first.charged_us == pytest.approx((1.0 + 0.5 + 0.7 + 0.3) * 1e6 / 2)
    assert first.self_us == pytest.approx(0.5e6)
    assert first.calls == 1
    assert rows[1].charged_us == pytest.approx(0.2e6)
    assert first.name == "`core/activation.py _commit`"


@pytest.fixture(scope="module")
def noop_ranking() -> Ranking:
    """The no-op agent's ranking without Beam over a small input, 100 events a key."""
    return rank_without_beam(
        "no-op", noop_activation.noop_agent, AgentConfig(), keyed_events(300, 3), 3
    )


def test_the_noop_ranking_holds_our_activation_path_sorted(noop_ranking: Ranking) -> None:
    rows = noop_ranking.rows
    names = {(row.path, row.function) for row in rows}
    for expected in (
        ("beam_agents/core/dofn.py", "process"),
        ("beam_agents/core/activation.py", "_commit"),
        ("beam_agents/core/tracing.py", "_event"),
        ("beam_agents/core/ids.py", "uuid5_hex"),
    ):
        assert expected in names
    assert all(row.path.startswith("beam_agents/") for row in rows)
    assert all(row.charged_us >= row.self_us >= 0 for row in rows)
    assert all(row.charged_us > 0 for row in rows if row.function in {"_commit", "_event"})
    charged = [row.charged_us for row in rows]
    assert charged == sorted(charged, reverse=True)
    assert noop_ranking.per_key == 100
    assert 0 < noop_ranking.ours_us <= noop_ranking.profiled_us
    assert noop_ranking.plain_us > 0
    tracing = next(row for row in rows if row.function == "_event")
    assert tracing.calls == 2  # ACTIVATION_START and ACTIVATION_END


def test_the_ranking_lines_name_the_top_functions(noop_ranking: Ranking) -> None:
    lines = ranking_lines(noop_ranking, 3, where="without Beam")
    assert "300 activations over 3 keys, 100 per key" in lines[0]
    for row in noop_ranking.rows[:3]:
        assert f"{row.name} {row.charged_us:.1f} µs" in lines[0]
    assert noop_ranking.rows[3].name not in lines[0]
    assert "Without the profiler" in lines[1]


def _row(path: str, function: str, us: float) -> Ranked:
    return Ranked(path=path, function=function, charged_us=us, self_us=us / 2, calls=1)


def test_a_function_falls_in_the_part_naming_it_before_the_part_of_its_file() -> None:
    assert part_of(_row("beam_agents/core/tracing.py", "_event", 1)).label == "trace events"
    assert part_of(_row("beam_agents/core/tracing.py", "trace_id_for", 1)).label == "the trace id"
    assert part_of(_row("beam_agents/model/fake.py", "complete", 1)).label == FAKE
    unknown = part_of(_row("beam_agents/loop.py", "spin", 1))
    assert unknown.label == "`loop.py spin`"
    assert unknown.change == "not examined yet"
    assert not unknown.proposed
    assert not part_of(_row("beam_agents/model/fake.py", "complete", 1)).proposed
    assert not part_of(_row("beam_agents/core/bridge.py", "run", 1)).proposed
    assert part_of(_row("beam_agents/core/admission.py", "element_problem", 1)).proposed


SMALL = Ranking(
    agent="model-call",
    activations=1_000,
    keys=10,
    rows=[
        _row("beam_agents/core/_memory_wire.py", "scan", 6.0),
        _row("beam_agents/model/fake.py", "complete", 5.0),
        _row("beam_agents/core/tracing.py", "_event", 4.0),
        _row("beam_agents/model/client.py", "canonical_json", 3.0),
        _row("beam_agents/core/memory.py", "set", 2.5),
        _row("beam_agents/core/tracing.py", "record", 2.0),
    ],
    profiled_us=50.0,
    calls=100,
    plain_us=25.0,
)


def test_parts_sum_their_functions_most_charged_first() -> None:
    costs = part_costs(SMALL)
    assert [(cost.part.label, cost.us) for cost in costs] == [
        ("the memory write", 8.5),
        ("trace events", 6.0),
        (FAKE, 5.0),
        ("the request digest", 3.0),
    ]
    assert [row.function for row in costs[0].rows] == ["scan", "set"]


def test_the_next_changes_name_the_parts_with_their_figures_the_fake_aside() -> None:
    text = next_changes(SMALL, count=2)
    assert text.startswith(
        "(1) the memory write, 8.5 µs (~4.2; `core/_memory_wire.py scan` 6.0, "
        "`core/memory.py set` 2.5): splice"
    )
    assert "(2) trace events, 6.0 µs (~3.0; `core/tracing.py _event` 4.0, " in text
    assert "one span per activation" in text
    assert "request digest" not in text  # third: past the count
    assert text.endswith(
        "(the fake model's own answer, 5.0 µs (~2.5), stands in for a provider: it is in none "
        "of these parts)"
    )


def test_the_named_parts_are_timed_without_the_profiler() -> None:
    # The memory write (8.5) and trace events (6.0), the fake model aside: their share of the
    # 50 profiled µs applied to the 25 without the profiler, ~4.2 (4.25 as shown) and ~3.0.
    assert named_us(SMALL, 2) == pytest.approx(4.2 + 3.0)
    untimed = Ranking("model-call", 1_000, 10, SMALL.rows, 50.0, 100)
    assert named_us(untimed, 2) == pytest.approx(14.5)


def test_what_is_left_gives_each_missed_row_its_next_changes() -> None:
    def figure(name: str, ours: float, bound: float) -> Figure:
        target = Target(Goal.RATIO_AT_MOST, bound)
        return Figure(name, "µs/element", ours, samples=100, floor=50.0, target=target)

    figures = [figure("no-op activation, 1,000 keys", 90.0, 1.25), figure("model", 60.0, 1.8)]
    split = Split(10.0, [InPipeline(40.0, 20.0)], [InPipeline(25.0, 20.0)])
    noop = Ranking("no-op", 1_000, 10, SMALL.rows[2:3], 20.0, 50, 10.0)
    parameters = Parameters(rounds=[4.0, 6.0, 5.0], keys=200, events=20_000)
    text = noop_activation._remaining(figures, [split, split], parameters, [noop, SMALL])
    assert "at 100 events per key" in text
    assert "for the no-op activation, 1,000 keys, (1) trace events, 4.0 µs (~2.0;" in text
    assert "the memory write" not in text  # the model-call row met its target
    assert "the profile's largest first" not in text
    assert "at most" not in text
    assert "To meet its target, the no-op activation, 1,000 keys must lose" in text
    assert "keys (90.0 µs/element against its floor's 50.0) is 40.0 µs above its floor" in text
    assert "estimated at 5.0 µs/element, the median of the rounds' paired differences" in text
    # The no-op at 90 against 50 without the binding: (90 - 5) / 50, and by each round.
    assert "about 1.70x without them (1.68 to 1.72x by the rounds)" in text
    assert "not confirmed the estimate" in text
    # The rest, 25 µs (gap 40 less our code's 15), against the binding's 5.0: 20.0 unattributed.
    assert "+20.0 µs of the rest is beyond that estimate, +19.0 to +21.0 against" in text
    assert "noise" not in text
    assert text.endswith(HISTORY)


def test_the_coroutine_step_is_described_as_the_driver_runs_it() -> None:
    hotspot = next(h for h in noop_activation.HOTSPOTS if h.path.endswith("bridge.py"))
    part = next(p for p in PARTS if p.label == "stepping the coroutine")
    for text in (hotspot.what, part.change):
        assert "event loop" in text and "running loop" in text
        assert "runs only if" in text


def test_more_keys_sets_the_gaps_as_shown_side_by_side() -> None:
    def figure(name: str, ours: float, floor: float) -> Figure:
        return Figure(name, "µs/element", ours, samples=100, floor=floor)

    few = figure("model-call activation, 1,000 keys", 144.24, 57.26)
    many = figure("model-call activation, 10,000 keys", 337.16, 229.84)
    text = noop_activation._more_keys([few, few, many])
    # 337.2 - 229.8 and 144.2 - 57.3, where the unrounded gaps would read 107.3 and 87.0.
    assert "At 10,000 keys the floor itself costs 229.8 µs/element against 57.3 at 1,000" in text
    assert "ours is 107.4 µs above the floor there (337.2 against 229.8), against 86.9" in text
    assert noop_activation._more_keys([few, few]) == ""
