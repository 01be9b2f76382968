# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""What the portable-runner test ships to its SDK worker: the agent, its model, its tools, a sink.

The worker is another process started by Beam's worker pool, so everything the pipeline
pickles must be importable there by module name: this module (``tests.portable.agents``), with
the repository root on the worker's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import apache_beam as beam

from beam_agents import Complete
from beam_agents._protos import canonical_json_bytes
from beam_agents.core.context import ActivationContext
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, match_contains, respond_with
from beam_agents.tools import ToolRegistry, tool

MODEL_ID = "portable-notes"
SHIP_PREFIX = "ship:"
FIRST_REPLY = b"nice to meet you"
LATER_REPLY = b"welcome back"


@tool(side_effect=True)
def ship_parcel(parcel: str) -> str:
    """Ship a parcel: a side effect, so only the effector would ever run it."""
    return f"shipped:{parcel}"


def make_registry() -> ToolRegistry:
    """The agent's tools: the side-effecting ``ship_parcel``, so ``ctx.act`` validates it."""
    registry = ToolRegistry()
    registry.register(ship_parcel)
    return registry


def make_provider() -> FakeLLM:
    """A model that greets a key it has seen no events for, and welcomes back the others."""
    return FakeLLM(
        [
            (match_contains("[0 seen]"), respond_with(FIRST_REPLY)),
            (match_any(), respond_with(LATER_REPLY)),
        ]
    )


async def note_taker(ctx: ActivationContext) -> Complete:
    """Ask the model about the event, ship parcels as intents, remember the event, report."""
    seen = ctx.memory.ring("events")
    event = ctx.event.decode()
    reply = await ctx.call_model(
        LlmRequest(
            model_id=MODEL_ID,
            messages=[{"role": "user", "content": f"[{len(seen)} seen] {event}"}],
        )
    )
    intent_id = ""
    if event.startswith(SHIP_PREFIX):
        intent_id = ctx.act("ship_parcel", {"parcel": event.removeprefix(SHIP_PREFIX)})
    ctx.memory.append("events", ctx.event, max_items=1_000)
    report = {
        "key": ctx.entity_key.decode(),
        "seq": ctx.seq,
        "event": event,
        "seen": [item.decode() for item in seen],
        "reply": reply.response.decode(),
        "intent_id": intent_id,
        "pid": os.getpid(),
    }
    return Complete(output=canonical_json_bytes(report))


class WriteEach(beam.DoFn):
    """Writes every element to a file of its own in ``directory``, named ``<tag>-<uuid>``.

    The worker runs in another process, so files are how the test sees what it emitted.
    Elements are bytes, or protobuf messages (written serialized).
    """

    def __init__(self, directory: str, tag: str) -> None:
        self._directory = directory
        self._tag = tag

    def process(self, element: Any) -> None:
        """Write one element (atomically, so a reader never sees half a file)."""
        data = element if isinstance(element, bytes) else element.SerializeToString()
        name = f"{self._tag}-{uuid.uuid4().hex}"
        final = Path(self._directory) / name
        partial = Path(self._directory) / f".{name}.partial"
        partial.write_bytes(data)
        os.replace(partial, final)


def read_reports(directory: Path) -> list[dict[str, object]]:
    """The JSON reports the agent emitted on ``.output``, as written by :class:`WriteEach`."""
    return [json.loads(path.read_bytes()) for path in sorted(directory.glob("output-*"))]
