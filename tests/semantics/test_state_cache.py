"""The gates' state cache weigher (``state_cache.py``) gives Beam's weights, only faster."""

from __future__ import annotations

from typing import Any

import pytest
from apache_beam.runners.worker import statecache

from beam_agents._protos import AgentEnvelope, ToolResult
from tests.semantics import gate_tools
from tests.semantics.state_cache import beams_weight, module_walk_free_weights, weigh


class _Holder:
    """An instance whose attributes reach a module's globals."""

    def __init__(self) -> None:
        self.items = [1, "two", b"three"]
        self.module_globals = vars(gate_tools)


VALUES: list[Any] = [
    b"x" * 100,
    [b"a", b"bc", b""],
    AgentEnvelope(entity_key=b"key", external_event=b"e" * 50),
    [ToolResult(intent_id="i", status=ToolResult.OK, payload=b"{}")] * 3,
    {"nested": [1, 2, {"deeper": (3.0, "four")}]},
    vars(gate_tools),
    [vars(gate_tools), b"beside the globals"],
    _Holder(),
    {"__name__": "no.such.module", "x": 1},
    {"__name__": ["not", "a", "name"]},
    None,
    12_345_678_901_234_567_890,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda value: type(value).__name__)
def test_the_weigher_gives_beams_weight(value: Any) -> None:
    assert beams_weight is not weigh
    assert weigh(value) == beams_weight(value)


def test_the_block_swaps_the_weigher_in_and_puts_back_what_was_there() -> None:
    before = statecache.get_deep_size
    with module_walk_free_weights():
        assert statecache.get_deep_size is weigh
    assert statecache.get_deep_size is before
