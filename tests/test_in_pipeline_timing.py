"""The pipeline split's timing of Beam's state calls (``benchmarks/in_pipeline.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from apache_beam.runners.worker import bundle_processor

from benchmarks.in_pipeline import _Clock, _TimedCell

_SPIN_NS = 20_000_000


def _spin() -> None:
    """Use about ``_SPIN_NS`` of this thread's CPU."""
    started = time.thread_time_ns()
    while time.thread_time_ns() - started < _SPIN_NS:
        pass


class _LazyBag:
    """A bag whose ``read`` fetches nothing until iterated, as Beam's does."""

    def __init__(self) -> None:
        self.added: list[bytes] = []

    def read(self) -> Iterator[bytes]:
        def fetch() -> Iterator[bytes]:
            _spin()
            yield b"a"
            yield b"b"

        return fetch()

    def add(self, value: bytes) -> None:
        self.added.append(value)


class _Cell:
    """A read-modify-write cell: ``read`` returns the value itself."""

    def read(self) -> bytes:
        return b"value"


def test_a_bag_read_is_timed_with_its_iteration() -> None:
    _Clock.state_ns = 0
    elements = _TimedCell(_LazyBag()).read()
    assert _Clock.state_ns >= _SPIN_NS
    assert elements == [b"a", b"b"]


def test_a_cell_read_returns_its_value_and_other_calls_pass_through() -> None:
    _Clock.state_ns = 0
    assert _TimedCell(_Cell()).read() == b"value"
    bag = _LazyBag()
    _TimedCell(bag).add(b"x")
    assert bag.added == [b"x"]
    assert _Clock.state_ns < _SPIN_NS


def test_the_bag_rule_matches_the_state_objects_beam_passes() -> None:
    # The wrapper tells a bag (lazy read) from a read-modify-write cell by its ``add``.
    assert hasattr(bundle_processor.SynchronousBagRuntimeState, "add")
    assert not hasattr(bundle_processor.ReadModifyWriteRuntimeState, "add")
