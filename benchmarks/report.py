"""Figures, targets, the printed rows and the ``BENCHMARKS.md`` built from them."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import sqlite3
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import Enum
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class Goal(Enum):
    """How a target bounds a figure."""

    RATIO_AT_MOST = "ratio_at_most"
    RATIO_AT_LEAST = "ratio_at_least"
    AT_MOST = "at_most"
    AT_LEAST = "at_least"
    BELOW = "below"


@dataclass(frozen=True)
class Target:
    """A goal and its bound: a ratio for the ratio goals, else in the figure's unit."""

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
        """Whether ``ours`` (or its ``ratio`` to the floor, for the ratio goals) meets it."""
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
    """One row: our number and the floor measured in the same run, in ``unit``."""

    name: str
    unit: str
    ours: float
    floor: float | None = None
    target: Target | None = None

    def __post_init__(self) -> None:
        for value in (self.ours, self.floor):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{self.name}: a measured figure must be positive, got {value}")

    @property
    def ratio(self) -> float | None:
        """Ours divided by the floor."""
        return None if self.floor is None else self.ours / self.floor

    @property
    def met(self) -> bool | None:
        """Whether the target is met; ``None`` without a target."""
        return None if self.target is None else self.target.is_met(self.ours, self.ratio)

    def cells(self) -> list[str]:
        """The row's cells: figure, ours, floor, ratio, target, met."""
        floor = "—" if self.floor is None else f"{format_number(self.floor)} {self.unit}"
        ratio = "—" if self.ratio is None else f"{self.ratio:.2f}x"
        target = "—" if self.target is None else self.target.describe(self.unit)
        met = "—" if self.met is None else ("yes" if self.met else "**no**")
        return [self.name, f"{format_number(self.ours)} {self.unit}", floor, ratio, target, met]


@dataclass
class Result:
    """What one benchmark measured, and at most five short lines on how."""

    name: str
    title: str
    method: str
    """At most five lines."""
    figures: list[Figure] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_json(self) -> str:
        """Serialize (the suite runs each benchmark in a subprocess)."""
        return json.dumps(asdict(self), default=lambda goal: goal.value)

    @classmethod
    def from_json(cls, text: str) -> Result:
        """The inverse of :meth:`to_json`."""
        raw = json.loads(text)
        figures = []
        for figure in raw.pop("figures"):
            target = figure.pop("target")
            if target is not None:
                target = Target(Goal(target["goal"]), target["bound"])
            figures.append(Figure(**figure, target=target))
        return cls(figures=figures, **raw)


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


HEADER = ("figure", "ours", "floor", "ratio", "target", "met")


def table(results: Sequence[Result]) -> list[str]:
    """A Markdown table of the results' figures, a row naming each benchmark before its own."""
    lines = ["| " + " | ".join(HEADER) + " |", "|---|---:|---:|---:|---|---|"]
    for result in results:
        lines.append(f"| **{result.name}** | | | | | |")
        lines += ["| " + " | ".join(figure.cells()) + " |" for figure in result.figures]
    return lines


_OLD_ROW = re.compile(r"^\| \d+ \| (.+?) \| .+? \| .+? \| ([\d.,]+)x[ |]")
"""A row of the report before issue 41: ``| N | figure | ours | floor | ratio x ...``."""
_ROW = re.compile(r"^\| (.+?) \| .+? \| .+? \| ([\d.,]+)x \|")


def ratios(report: str) -> dict[str, float]:
    """Each figure's ratio to its floor, by figure name, from a report of either format."""
    found = {}
    for line in report.splitlines():
        match = _OLD_ROW.match(line) or _ROW.match(line)
        if match:
            found[match[1]] = float(match[2].replace(",", ""))
    return found


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _revision() -> str:
    def git(*arguments: str) -> str:
        return subprocess.run(
            ["git", *arguments], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" with uncommitted changes" if changed else ", clean")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (the machine may be shared)."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def machine_info() -> dict[str, str]:
    """What the run ran on."""
    return {
        "CPU": _cpu_model(),
        "Cores": str(os.cpu_count()),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "Apache Beam": _version("apache-beam"),
        "grpcio": _version("grpcio"),
        "SQLite": sqlite3.sqlite_version,
        "Date (UTC)": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "Revision": _revision(),
        "Load average at start": load_average(),
    }


def render_markdown(
    results: Sequence[Result], machine: dict[str, str], failures: dict[str, str], mode: str
) -> str:
    """The whole ``BENCHMARKS.md``."""
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m benchmarks`). Do not edit by hand.",
        f"Run: {mode}. Ratio is ours over the floor measured in the same run.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {label} | {value} |" for label, value in machine.items()),
        "",
        "## Results",
        "",
        *table(results),
        "",
        "## Method",
        "",
    ]
    for result in results:
        lines += [f"### {result.name}: {result.title} ({result.elapsed_s:.0f} s)", ""]
        lines += [*result.method.strip().splitlines()[:5], ""]
    if failures:
        lines += ["## Did not finish", ""]
        lines += [f"- `{name}`: {reason}" for name, reason in failures.items()]
        lines.append("")
    return "\n".join(lines)
