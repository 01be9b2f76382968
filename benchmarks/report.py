"""Figures, targets and the ``BENCHMARKS.md`` report built from them.

Every benchmark returns a :class:`BenchmarkResult`: a list of :class:`Figure` rows (our number,
the floor measured in the same run, the ratio, the sample count and, where the issue sets one,
the :class:`Target` it is checked against) plus the measured details that explain them.
Nothing in the report is typed in: :func:`render_markdown` only formats what the run produced.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sqlite3
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple


class Goal(Enum):
    """How a target bounds a figure."""

    RATIO_AT_MOST = "ratio_at_most"
    RATIO_AT_LEAST = "ratio_at_least"
    AT_MOST = "at_most"
    AT_LEAST = "at_least"
    BELOW = "below"


@dataclass(frozen=True)
class Target:
    """A goal from the issue; ``bound`` is a ratio for the ratio goals, else in the unit."""

    goal: Goal
    bound: float

    def describe(self, unit: str) -> str:
        """The target as the table shows it, e.g. ``≤ 1.5x floor`` or ``< 30 ms``."""
        bound = format_number(self.bound)
        return {
            Goal.RATIO_AT_MOST: f"≤ {bound}x floor",
            Goal.RATIO_AT_LEAST: f"≥ {bound}x floor",
            Goal.AT_MOST: f"≤ {bound} {unit}",
            Goal.AT_LEAST: f"≥ {bound} {unit}",
            Goal.BELOW: f"< {bound} {unit}",
        }[self.goal]

    def is_met(self, ours: float, ratio: float | None) -> bool:
        """Whether ``ours`` (and its ``ratio`` to the floor, for ratio goals) meets the target."""
        if self.goal in (Goal.RATIO_AT_MOST, Goal.RATIO_AT_LEAST):
            if ratio is None:
                raise ValueError("a ratio target needs a floor")
            return ratio <= self.bound if self.goal is Goal.RATIO_AT_MOST else ratio >= self.bound
        if self.goal is Goal.AT_MOST:
            return ours <= self.bound
        if self.goal is Goal.AT_LEAST:
            return ours >= self.bound
        return ours < self.bound


@dataclass(frozen=True)
class Figure:
    """One row of the results table.

    ``samples`` counts what the number was computed over (elements, activations, intents, round
    trips); ``floor`` is the same quantity for the floor named ``floor_label``, measured in the
    same run (``None`` when the figure has an absolute target and no floor).
    """

    name: str
    unit: str
    ours: float
    samples: int
    floor: float | None = None
    floor_label: str = ""
    target: Target | None = None
    spread: tuple[float, float] | None = None
    """The least and the most ratio over paired rounds; a target is met only if both meet it."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ours) and self.ours > 0):
            raise ValueError(f"{self.name}: a measured figure must be positive, got {self.ours}")
        if self.floor is not None and not (math.isfinite(self.floor) and self.floor > 0):
            raise ValueError(f"{self.name}: a floor must be positive, got {self.floor}")
        if self.samples < 1:
            raise ValueError(f"{self.name}: a figure needs at least one sample")
        if self.spread is not None and not 0 < self.spread[0] <= self.spread[1]:
            raise ValueError(f"{self.name}: a spread must be positive and ordered")

    @property
    def ratio(self) -> float | None:
        """Ours divided by the floor."""
        return None if self.floor is None else self.ours / self.floor

    @property
    def met(self) -> bool | None:
        """Whether the target is met; ``None`` when the figure has no target."""
        if self.target is None:
            return None
        ratios = [self.ratio] if self.spread is None else list(self.spread)
        return all(self.target.is_met(self.ours, ratio) for ratio in ratios)


class ProfileOutput(NamedTuple):
    """What profiling a benchmark found: findings (Markdown sentences) and the raw summary."""

    findings: list[str]
    raw: list[str]


@dataclass
class BenchmarkResult:
    """What one benchmark measured: its figures and the details that explain them."""

    name: str
    title: str
    definition: str
    figures: list[Figure]
    details: list[str] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    """Side measurements of earlier revisions, each labelled with its commit: not this run's."""
    findings: list[str] = field(default_factory=list)
    """From profiling, when a target was missed."""
    profile: list[str] = field(default_factory=list)
    """The raw profile summary behind the findings."""
    remaining: str = ""
    """Where the time still goes and the next change, shown under "What is left" on a miss."""
    elapsed_s: float = 0.0

    def to_json(self) -> str:
        """Serialize (the report is assembled from benchmarks run as subprocesses)."""
        return json.dumps(asdict(self), default=_enum_value, indent=1)

    @classmethod
    def from_json(cls, text: str) -> BenchmarkResult:
        """The inverse of :meth:`to_json`."""
        raw = json.loads(text)
        figures = []
        for figure in raw.pop("figures"):
            target, spread = figure.pop("target"), figure.pop("spread", None)
            figures.append(
                Figure(
                    **figure,
                    target=None
                    if target is None
                    else Target(Goal(target["goal"]), target["bound"]),
                    spread=None if spread is None else (spread[0], spread[1]),
                )
            )
        return cls(figures=figures, **raw)


def _enum_value(value: object) -> Any:
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"cannot serialize {type(value).__name__}")


def format_number(value: float) -> str:
    """Three significant figures, thousands separated: ``12,345``, ``123``, ``1.23``, ``0.0123``."""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1 or magnitude == 0:
        return f"{value:.2f}"
    return f"{value:.3g}"


def tenth(us: float) -> float:
    """``us`` rounded to 0.1, as the reports print it, a rounded zero as ``0.0`` (never
    ``-0.0``), so that printed differences add up."""
    return round(us, 1) + 0.0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: the machine is shared, so they matter."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def revision() -> str:
    """The commit the suite runs from, and whether the tracked files differ from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*arguments: str) -> str:
        return subprocess.run(
            ["git", *arguments], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit + (" with uncommitted changes" if changed else ", clean")


def machine_info() -> dict[str, str]:
    """What the run ran on, for the report's header."""
    return {
        "CPU": _cpu_model(),
        "Cores": str(os.cpu_count()),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "Apache Beam": _version("apache-beam"),
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        "SQLite": sqlite3.sqlite_version,
        "Load average at start (1, 5, 15 min)": load_average(),
        "Date (UTC)": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "Revision": revision(),
    }


def _met_cell(figure: Figure) -> str:
    met = figure.met
    return "—" if met is None else ("yes" if met else "**no**")


RESULTS_HEADER = (
    "| # | Figure | Ours | Floor | Ratio | Samples | Target | Met |",
    "|---|---|---:|---:|---:|---:|---|---|",
)


def figure_row(number: int, figure: Figure) -> str:
    """One results-table row for ``figure`` of benchmark ``number``."""
    floor = (
        "—"
        if figure.floor is None
        else f"{format_number(figure.floor)} {figure.unit} ({figure.floor_label})"
    )
    ratio = "—" if figure.ratio is None else ratio_text(figure.ratio, figure.target)
    if figure.spread is not None:
        low, high = (ratio_text(end, figure.target) for end in figure.spread)
        ratio += f" ({low} to {high})"
    target = "—" if figure.target is None else figure.target.describe(figure.unit)
    return (
        f"| {number} | {figure.name} | {format_number(figure.ours)} {figure.unit} | "
        f"{floor} | {ratio} | {figure.samples:,} | {target} | {_met_cell(figure)} |"
    )


def render_markdown(
    results: list[BenchmarkResult],
    machine: dict[str, str],
    *,
    order: Sequence[str],
    quick: bool,
    failures: dict[str, str],
    elapsed_s: float,
) -> str:
    """The whole ``BENCHMARKS.md``; benchmarks are numbered by their place in ``order``."""
    numbered = [(order.index(result.name) + 1, result) for result in results]
    mode = "quick smoke mode (`--quick`): tiny sizes, numbers not meaningful" if quick else "full"
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m benchmarks`); every number below comes from that",
        "run. Do not edit by hand: re-run `make bench`.",
        "",
        f"Mode: {mode}. Whole suite: {elapsed_s:.0f} s.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {label} | {value} |" for label, value in machine.items()),
        "",
        "## Results",
        "",
        "Ratio is ours divided by the floor measured in the same run: above 1 is slower for times,",
        "below 1 is slower for rates. Met is checked against the issue's target for that figure.",
        "A range after a ratio is its least and most over paired rounds; a ratio target is then",
        "met only if both ends meet it (an absolute target is judged on the figure itself).",
        "Samples counts what the figure was computed over: elements, activations, rounds, key",
        "commits, calls or intents, as each benchmark's notes say.",
        "",
        *RESULTS_HEADER,
        *(figure_row(number, figure) for number, result in numbered for figure in result.figures),
        "",
    ]
    lines += _what_is_left(numbered)
    if failures:
        lines += ["## Benchmarks that did not finish", ""]
        lines += [f"- `{name}`: {reason}" for name, reason in failures.items()]
        lines.append("")
    lines += ["## Notes", ""]
    for number, result in numbered:
        lines += [f"### {number}. {result.title}", "", result.definition.strip(), ""]
        missed = [figure.name for figure in result.figures if figure.met is False]
        with_target = [figure for figure in result.figures if figure.target is not None]
        if with_target:
            verdict = "All targets met." if not missed else "Missed: " + "; ".join(missed) + "."
            lines += [f"Targets: {verdict}", ""]
        if result.details:
            lines += ["Measured in this run:", ""]
            lines += [f"- {detail}" for detail in result.details]
            lines.append("")
        if result.history:
            lines += ["Recorded earlier, not in this run (each at the commit it names):", ""]
            lines += [f"- {entry}" for entry in result.history]
            lines.append("")
        if result.findings:
            lines += ["Profile findings (cProfile, in a separate run after the measurement):", ""]
            lines += [f"- {finding}" for finding in result.findings]
            lines.append("")
        if result.profile:
            lines += ["<details><summary>Profile summary</summary>", "", "```"]
            lines += result.profile
            lines += ["```", "", "</details>", ""]
        lines += [f"Took {result.elapsed_s:.0f} s.", ""]
    return "\n".join(lines)


def _what_is_left(numbered: list[tuple[int, BenchmarkResult]]) -> list[str]:
    """The section naming each missed target, where its time goes and the next change."""
    lines = ["## What is left", ""]
    for number, result in numbered:
        missed = [figure.name for figure in result.figures if figure.met is False]
        if missed:
            lines.append(f"- **{number}. {result.title}**: missed {'; '.join(missed)}.")
            account = result.remaining or (
                "This benchmark gives no account of where the time goes yet: this miss is "
                "unexplained in this run."
            )
            paragraphs = [" ".join(part.split()) for part in account.split("\n\n")]
            lines.append("  " + "\n\n  ".join(part for part in paragraphs if part))
    if len(lines) == 2:
        lines.append("Every target with a figure in this run was met.")
    return [*lines, ""]


def ratio_text(ratio: float, target: Target | None) -> str:
    """The ratio to two decimals, or three where two would round it across its target's bound."""
    text = f"{ratio:.2f}x"
    if target is not None and target.goal in (Goal.RATIO_AT_MOST, Goal.RATIO_AT_LEAST):
        shown = round(ratio, 2)
        if target.is_met(shown, shown) != target.is_met(ratio, ratio):
            text = f"{ratio:.3f}x"
    return text
