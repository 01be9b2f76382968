"""Paired rounds: ours and a floor measured in the same rounds, judged by every round's ratio.

Benchmark 6 measures the effector and the no-op gRPC server in interleaved rounds (each round
one batch of calls at each, in alternating order), so load from elsewhere on the machine hits
both alike. Each round gives one paired ratio; the row shows the round with the median ratio
and carries the ratios' range (``Figure.spread``), so a ratio target counts as met only if
every round meets it, as in benchmark 4. A row whose rounds straddle its target is not met in
this run (within its noise: :func:`straddles`). An absolute target (intents/s) is judged on the
median run, with every run's rate in the details.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.report import Figure, Target, format_number


@dataclass(frozen=True)
class Batch:
    """One side's calls in one round."""

    calls: int
    elapsed_s: float
    latencies_s: tuple[float, ...] = ()
    """Each call's latency at the client."""

    @property
    def rate(self) -> float:
        """Calls per second."""
        return self.calls / self.elapsed_s


@dataclass(frozen=True)
class Pairs:
    """Per round, the floor's rate and ours, measured in the same round."""

    floor: tuple[float, ...]
    ours: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.floor or len(self.floor) != len(self.ours):
            raise ValueError("paired rounds need one floor rate per rate of ours, at least one")

    @classmethod
    def of(cls, floor: Sequence[Batch], ours: Sequence[Batch]) -> Pairs:
        """The rates of two sides' batches, round by round."""
        return cls(tuple(b.rate for b in floor), tuple(b.rate for b in ours))

    @property
    def ratios(self) -> list[float]:
        """Ours over the floor, round by round."""
        return [ours / floor for floor, ours in zip(self.floor, self.ours, strict=True)]

    @property
    def median(self) -> int:
        """The round whose ratio is the median (the lower of the two middle ones if even)."""
        ratios = self.ratios
        return sorted(range(len(ratios)), key=lambda index: ratios[index])[(len(ratios) - 1) // 2]

    @property
    def spread(self) -> tuple[float, float]:
        """The lowest and the highest ratio."""
        return min(self.ratios), max(self.ratios)

    def extra_us(self) -> list[float]:
        """Per round, how many µs longer a call of ours took than the floor's (1 / rate)."""
        return [1e6 / ours - 1e6 / floor for floor, ours in zip(self.floor, self.ours, strict=True)]


def verdict(pairs: Pairs, target: Target) -> bool | None:
    """``True`` if every round meets ``target``, ``False`` if none does, else ``None``."""
    met = [target.is_met(ours, ratio) for ours, ratio in zip(pairs.ours, pairs.ratios, strict=True)]
    return True if all(met) else (False if not any(met) else None)


def range_text(values: Sequence[float], unit: str = "") -> str:
    """``1,234-1,456 unit`` (one value: itself; ``-5 to 10`` below zero), as the report formats."""
    low, high = min(values), max(values)
    suffix = f" {unit}" if unit else ""
    if len(values) == 1 or format_number(low) == format_number(high):
        return f"{format_number(low)}{suffix}"
    dash = " to " if low < 0 else "-"
    return f"{format_number(low)}{dash}{format_number(high)}{suffix}"


def paired_figure(
    name: str,
    unit: str,
    pairs: Pairs,
    samples: int,
    floor_label: str,
    target: Target | None,
    rounds: str = "paired round",
) -> Figure:
    """The row for ``pairs``: the median round's rates, judged by every round (module doc).

    ``rounds`` names a round in the label (a floor measured once is paired with each run).
    """
    index = pairs.median
    count = len(pairs.floor)
    return Figure(
        name=name,
        unit=unit,
        ours=pairs.ours[index],
        samples=samples,
        floor=pairs.floor[index],
        floor_label=f"{floor_label}; {count} {rounds}{'s' if count > 1 else ''}",
        target=target,
        spread=pairs.spread if count > 1 else None,
    )


def straddles(pairs: Pairs, target: Target | None) -> bool:
    """Whether some rounds meet ``target`` and others do not (not met, within the noise)."""
    return target is not None and verdict(pairs, target) is None
