"""Benchmark 1's profile of our own code: ``beam_agents`` functions ranked by µs per activation.

Each function is charged its self time plus the library code it calls directly (builtins, the
standard library, protobuf): the work it asks for, wherever the interpreter books it. Our
functions it calls are charged to themselves, and Beam's code (state calls, the runner) and the
benchmark's own (the agent, the in-memory cells) to no one of ours. Without Beam the profile
runs ``AgentDoFn.process`` on in-memory cells (as :mod:`benchmarks.core_only` times it).
"""

from __future__ import annotations

import pstats
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from beam_agents import AgentConfig
from beam_agents.core.agent import AgentFn
from beam_agents.core.dofn import AgentDoFn
from benchmarks.harness import profile_call, total_seconds
from benchmarks.pipelines import Element
from tests.core.harness import InMemoryKeyState

OURS = "beam_agents/"
NOT_CHARGED = ("apache_beam/", "/tests/", "/benchmarks/")
"""Callees charged to none of ours: Beam's code and the benchmark's (agent, cells, harness)."""

Function = tuple[str, int, str]
"""A pstats key: file, first line, name."""


@dataclass(frozen=True)
class Ranked:
    """One of our functions' cost per activation, under the profiler."""

    path: str
    """Its file from the package root, e.g. ``beam_agents/core/tracing.py``."""
    function: str
    charged_us: float
    """Self time plus the library code it calls directly, µs per activation."""
    self_us: float
    """Self time alone (its own Python lines), µs per activation."""
    calls: float
    """Calls per activation."""

    @property
    def name(self) -> str:
        """``core/tracing.py _event``: as the report names it, in backquotes."""
        return f"`{self.path.removeprefix(OURS)} {self.function}`"


@dataclass(frozen=True)
class Ranking:
    """One agent's ranked functions, and the totals that put them in scale."""

    agent: str
    activations: int
    keys: int
    rows: list[Ranked]
    """Every function of ours, most charged first."""
    profiled_us: float
    """All the profiled time per activation (all code), under the profiler."""
    calls: float
    """Calls per activation the profiler saw (all code)."""
    plain_us: float = 0.0
    """The same activations' wall time per activation without the profiler (0 if not timed)."""

    @property
    def per_key(self) -> int:
        """Activations per key."""
        return self.activations // self.keys

    @property
    def ours_us(self) -> float:
        """All our functions' charged time per activation, under the profiler."""
        return sum(row.charged_us for row in self.rows)

    def unprofiled(self, us: float) -> float:
        """``us`` of profiled time as its share of it applied to the time without the profiler."""
        return us / self.profiled_us * self.plain_us if self.profiled_us else 0.0


def _short(filename: str) -> str:
    return filename[filename.find(OURS) :]


def _is_ours(filename: str) -> bool:
    return OURS in filename


def _charged_elsewhere(filename: str) -> bool:
    return _is_ours(filename) or any(marker in filename for marker in NOT_CHARGED)


def _reaching_ours(entries: dict[Function, Any]) -> set[Function]:
    """Every function from which a call chain leads into ours (callers of ours, transitively)."""
    seen: set[Function] = set()
    frontier = [function for function in entries if _is_ours(function[0])]
    while frontier:
        function = frontier.pop()
        for caller in entries[function][4] if function in entries else ():
            if caller not in seen:
                seen.add(caller)
                frontier.append(caller)
    return seen


def rank(stats: pstats.Stats, activations: int) -> list[Ranked]:
    """Our functions in ``stats`` by charged time per activation, most first.

    A library callee that leads back into our code (a coroutine's ``send``, say) is charged by
    its self time only, so no time is counted twice.
    """
    entries: dict[Function, Any] = stats.stats  # type: ignore[attr-defined]
    reaching = _reaching_ours(entries)
    charged = {function: entry[2] for function, entry in entries.items() if _is_ours(function[0])}
    for callee, (_, _, _, _, callers) in entries.items():
        if _charged_elsewhere(callee[0]):
            continue
        for caller, (_, _, edge_self_s, edge_cumulative_s) in callers.items():
            if caller in charged:
                charged[caller] += edge_self_s if callee in reaching else edge_cumulative_s
    rows = [
        Ranked(
            path=_short(function[0]),
            function=function[2],
            charged_us=seconds * 1e6 / activations,
            self_us=entries[function][2] * 1e6 / activations,
            calls=entries[function][1] / activations,
        )
        for function, seconds in charged.items()
    ]
    return sorted(rows, key=lambda row: -row.charged_us)


def _driver(
    agent: AgentFn, config: AgentConfig, events: list[Element]
) -> tuple[Callable[[], None], AgentDoFn]:
    """A call that delivers every event to one ``AgentDoFn`` over per-key in-memory cells."""
    dofn = AgentDoFn(agent, config)
    dofn.setup()
    cells: dict[bytes, InMemoryKeyState] = {}

    def run_all() -> None:
        for key, envelope in events:
            state = cells.get(key)
            if state is None:
                state = cells[key] = InMemoryKeyState()
            state.process(dofn, key, envelope)

    return run_all, dofn


def rank_without_beam(
    name: str, agent: AgentFn, config: AgentConfig, events: list[Element], keys: int
) -> Ranking:
    """Profile ``agent``'s activations without Beam (after a warm-up pass) and rank ours.

    The same pass is timed once without the profiler, to put the profiled figures in scale.
    """
    run_all, dofn = _driver(agent, config, events)
    try:
        run_all()  # warm-up: every key gets its cells and first commit
        started = time.perf_counter()
        run_all()
        plain_s = time.perf_counter() - started
        stats = profile_call(run_all)
    finally:
        dofn.teardown()
    return ranking_of(name, stats, len(events), keys, plain_s * 1e6 / len(events))


def ranking_of(
    name: str, stats: pstats.Stats, activations: int, keys: int, plain_us: float = 0.0
) -> Ranking:
    """The :class:`Ranking` of a profile of ``activations`` activations over ``keys`` keys."""
    return Ranking(
        agent=name,
        activations=activations,
        keys=keys,
        rows=rank(stats, activations),
        profiled_us=total_seconds(stats) * 1e6 / activations,
        calls=stats.total_calls / activations,  # type: ignore[attr-defined]
        plain_us=plain_us,
    )


def ranking_lines(ranking: Ranking, top: int, *, where: str) -> list[str]:
    """Report sentences: the ``top`` functions of ``ranking``, ``where`` saying what ran."""
    rows = "; ".join(
        f"{row.name} {row.charged_us:.1f} µs (called {row.calls:g}x, {row.self_us:.1f} in its own "
        "lines)"
        for row in ranking.rows[:top]
    )
    lines = [
        f"Our code in the {ranking.agent} activation, {where} ({ranking.activations:,} "
        f"activations over {ranking.keys:,} keys, {ranking.per_key} per key as in the "
        f"measurement, cProfile): our functions were charged {ranking.ours_us:.1f} µs per "
        f"activation of the {ranking.profiled_us:.1f} profiled. The top {top}, each charged "
        "its self time plus the library code it calls directly (builtins, standard library, "
        "protobuf; not Beam's code, not our other functions), µs per activation under the "
        f"profiler: {rows}."
    ]
    if ranking.plain_us:
        overhead = (ranking.profiled_us - ranking.plain_us) / ranking.calls
        lines.append(
            f"Without the profiler the same {ranking.agent} activations took "
            f"{ranking.plain_us:.1f} µs of wall time against {ranking.profiled_us:.1f} under "
            f"it: over the {ranking.calls:.0f} calls per activation it saw, about "
            f"{overhead:.2f} µs a call, booked partly to the calling function, so a part "
            "making many small calls ranks above what it costs; the figures marked ~ are a "
            "profiled figure's share applied to the time without the profiler."
        )
    return lines


@dataclass(frozen=True)
class Part:
    """A part of our code: the functions it covers and the next change it would take."""

    label: str
    members: tuple[str, ...]
    """``path`` (every function of the file) or ``path function`` (that one)."""
    change: str
    """The next change to it, or why none (unmeasured: the saving is at most its figure)."""
    proposed: bool = True
    """Whether ``change`` proposes one (not so for a part left as it is, or not examined)."""


PARTS = (
    Part(
        "trace events",
        ("beam_agents/core/tracing.py", "beam_agents/core/staging.py closing_attributes"),
        "one span per activation instead of the ACTIVATION_START/ACTIVATION_END pair (a trace "
        "format change), or none built when a config switch says `.traces` is not read",
    ),
    Part(
        "the trace id",
        ("beam_agents/core/tracing.py trace_id_for", "beam_agents/core/ids.py uuid5_hex"),
        "a trace id that needs no SHA-1 per run (a trace-id format change), or none when "
        "traces are off",
    ),
    Part(
        "the request digest",
        ("beam_agents/model/client.py", "beam_agents/model/cache.py cache_key_for_digest"),
        "a fast path writing the same canonical JSON for the common request (plain-text "
        "messages, no tools or sampling parameters) without building its dict and lists, "
        "checked byte for byte against the encoder",
    ),
    Part(
        "`call_model`'s own lines and the replay cache",
        (
            "beam_agents/core/context.py call_model",
            "beam_agents/core/context.py _replay_cache",
            "beam_agents/model/cache.py",
        ),
        "stage the cache entry as plain values and build its `ModelCacheEntry` proto only "
        "when the cache is written (a run that suspends; these complete)",
    ),
    Part(
        "the gateway",
        (
            "beam_agents/core/model_gateway.py",
            "beam_agents/model/resilience.py",
            "beam_agents/core/retry_memo.py",
            "beam_agents/core/dofn.py inc",
        ),
        "a first-attempt fast path: call the provider at once and enter "
        "`call_with_resilience` only on a `ProviderError` (no closure, attempt list or clock "
        "reads when it answers)",
    ),
    Part(
        "the memory write",
        (
            "beam_agents/core/memory.py",
            "beam_agents/core/_memory_wire.py",
            "beam_agents/core/state.py read_memory",
            "beam_agents/core/state.py write_memory",
            "beam_agents/core/context.py memory",
        ),
        "splice the changed slot into the committed bytes in one pass at commit, instead of "
        "scanning them into slot views, sizing them and encoding them again",
    ),
    Part(
        "the commit",
        (
            "beam_agents/core/activation.py _commit",
            "beam_agents/core/activation.py _write_header",
            "beam_agents/core/dofn.py _applied",
            "beam_agents/core/dofn.py <listcomp>",
            "beam_agents/core/state.py write_header",
        ),
        "a straight path for the commonest commit (a new run that completes, with no "
        "recording, hook or buffered events): one test instead of the suspension, cache, "
        "recording and drain branches, the header written without the generic writes loop",
    ),
    Part(
        "the activation's objects",
        (
            "beam_agents/core/context.py __init__",
            "beam_agents/core/staging.py __init__",
            "beam_agents/core/tracing.py __init__",
            "beam_agents/core/cursor.py __init__",
            "beam_agents/core/plan.py __init__",
            "beam_agents/core/state.py __init__",
            "beam_agents/core/agent.py",
        ),
        "merge the objects built for every activation (context, staged record, trace "
        "recorder, step cursor, plan, key state) into fewer",
    ),
    Part(
        "the activation's path",
        (
            "beam_agents/core/activation.py",
            "beam_agents/core/context.py",
            "beam_agents/core/staging.py",
            "beam_agents/core/cursor.py",
            "beam_agents/core/state.py",
        ),
        "flatten a new run's path (`on_element`, `_new_run`, `_activate`, `_checked`, each "
        "reading the header or continuation through properties): read the state once, pass "
        "it down",
    ),
    Part(
        "admitting the element",
        ("beam_agents/core/admission.py", "beam_agents/core/dofn.py process"),
        "read the payload kind once (`element_problem` and `on_element` each call "
        "`WhichOneof`) and check the well-formed case first",
    ),
    Part(
        "stepping the coroutine",
        ("beam_agents/core/bridge.py",),
        "none proposed: its library part is installing the driver's own event loop as "
        "asyncio's running loop for the inline first step and restoring the previous one "
        "(agents may rely on finding a running loop; the loop itself runs only if they wait)",
        proposed=False,
    ),
    Part(
        "the fake model",
        (
            "beam_agents/model/fake.py",
            "beam_agents/model/fake_behaviors.py",
            "beam_agents/model/fake_wire.py",
        ),
        "",
        proposed=False,
    ),
)
"""The parts the next changes are named by; a function no part covers is a part of its own."""

FAKE = "the fake model"
"""The benchmark's stand-in for a provider's client: ranked, but not a change to make."""


@dataclass(frozen=True)
class PartCost:
    """A part's charged time in one ranking, and its functions, most charged first."""

    part: Part
    us: float
    rows: list[Ranked]


def part_of(row: Ranked, parts: Iterable[Part] = PARTS) -> Part:
    """The part covering ``row``: one naming the function before one naming only its file."""
    exact = f"{row.path} {row.function}"
    for wanted in (exact, row.path):
        for part in parts:
            if wanted in part.members:
                return part
    return Part(row.name, (exact,), "not examined yet", proposed=False)


def part_costs(ranking: Ranking) -> list[PartCost]:
    """``ranking`` summed by part, the most charged part first."""
    grouped: dict[str, tuple[Part, list[Ranked]]] = {}
    for row in ranking.rows:
        part = part_of(row)
        grouped.setdefault(part.label, (part, []))[1].append(row)
    costs = [
        PartCost(part, sum(row.charged_us for row in rows), rows) for part, rows in grouped.values()
    ]
    return sorted(costs, key=lambda cost: -cost.us)


NAMED = 5
"""Parts the next changes name, for each missed row."""


def shown(ranking: Ranking, us: float) -> float:
    """``us`` profiled as the text shows it: its ~ figure (or the profiled one), to 0.1 µs."""
    return round(ranking.unprofiled(us) if ranking.plain_us else us, 1)


def named_parts(ranking: Ranking, count: int = NAMED) -> list[PartCost]:
    """The ``count`` most charged parts of ``ranking``, the fake model aside."""
    return [cost for cost in part_costs(ranking) if cost.part.label != FAKE][:count]


def other_parts(ranking: Ranking, count: int = NAMED) -> list[PartCost]:
    """The parts of ``ranking`` past the ``count`` named, the fake model aside."""
    return [cost for cost in part_costs(ranking) if cost.part.label != FAKE][count:]


def shown_sum(ranking: Ranking, costs: Iterable[PartCost]) -> float:
    """The parts' figures as shown, added up: the sum the reader gets from the shown figures."""
    return round(sum(shown(ranking, cost.us) for cost in costs), 1)


def named_us(ranking: Ranking, count: int = NAMED) -> float:
    """The named parts' shown figures added up (µs per activation without the profiler)."""
    return shown_sum(ranking, named_parts(ranking, count))


def fake_us(ranking: Ranking) -> float:
    """The fake model's own answer as shown: in none of the parts, and not a change to make."""
    return shown_sum(ranking, (cost for cost in part_costs(ranking) if cost.part.label == FAKE))


def next_changes(ranking: Ranking, count: int = NAMED) -> str:
    """The ``count`` most charged parts of ``ranking``, the fake model aside, as clauses.

    Each names the part, its µs per activation, its largest functions and its next change.
    """
    fake = sum(cost.us for cost in part_costs(ranking) if cost.part.label == FAKE)
    clauses = []
    for number, cost in enumerate(named_parts(ranking, count), 1):
        functions = ", ".join(f"{row.name} {row.charged_us:.1f}" for row in cost.rows[:3])
        if ranking.plain_us:
            functions = f"~{shown(ranking, cost.us):.1f}; {functions}"
        clauses.append(
            f"({number}) {cost.part.label}, {cost.us:.1f} µs ({functions}): {cost.part.change}"
        )
    approx = f" (~{fake_us(ranking):.1f})" if ranking.plain_us else ""
    aside = (
        f" (the fake model's own answer, {fake:.1f} µs{approx}, stands in for a provider: it is "
        "in none of these parts)"
        if fake
        else ""
    )
    return "; ".join(clauses) + aside
