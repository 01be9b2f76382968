# mypy: disallow-untyped-calls=False
"""The local loop's runner keeps no user-state cache: Beam weighs every value it caches.

The state is in memory in the same process; the loop's state still carries across elements,
and the runner leaves Beam's cache setting as it found it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.runners.worker.statecache import StateCache
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from beam_agents.io.effector_link import LoopRunner
from tests.io.io_harness import Collector

_TOTAL = ReadModifyWriteStateSpec("total", VarIntCoder())
_TOTAL_STATE: Any = beam.DoFn.StateParam(_TOTAL)


class _RunningTotal(beam.DoFn):
    def process(self, element: tuple[str, int], total: Any = _TOTAL_STATE) -> Iterator[int]:
        value = (total.read() or 0) + element[1]
        total.write(value)
        yield value


def _running_totals(runner: Any, collector: Collector) -> None:
    with beam.Pipeline(runner=runner) as pipeline:
        _ = (
            pipeline
            | beam.Create([("a", 1), ("a", 2), ("a", 3)], reshuffle=False)
            | beam.ParDo(_RunningTotal())
            | collector.sink()
        )


def test_state_on_the_loop_runner_carries_over_without_being_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cached: list[Any] = []
    put = StateCache.put

    def counting_put(cache: StateCache, key: Any, value: Any) -> None:
        cached.append(key)
        put(cache, key, value)

    monkeypatch.setattr(StateCache, "put", counting_put)
    setting_before = worker_handlers.STATE_CACHE_SIZE_MB
    on_fn_api, on_loop = Collector.new(), Collector.new()
    _running_totals(FnApiRunner(), on_fn_api)
    assert cached  # the plain FnApiRunner caches what a bundle writes
    cached.clear()
    _running_totals(LoopRunner(), on_loop)
    assert cached == []
    assert sorted(on_loop.values()) == sorted(on_fn_api.values()) == [1, 3, 6]
    setting_after = worker_handlers.STATE_CACHE_SIZE_MB
    assert setting_after == setting_before
