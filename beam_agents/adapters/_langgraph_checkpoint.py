"""The LangGraph checkpointer of one activation, and its durable copy in ``ctx.memory``.

During an activation the graph checkpoints into a :class:`BeamCheckpointSaver`, an in-memory
saver owned by that activation alone. The durable copy is one memory slot holding the thread's
latest root checkpoint (with its pending writes), serialized with LangGraph's own serde; the
adapter loads it before the graph runs and stores it again only when the run completes.

The slot holds the checkpoint as the saver itself keeps it: the checkpoint, its metadata, its
channel values and pending writes each already serialized by LangGraph's serde when the graph
saved them. Loading the slot puts those bytes back into the saver and exporting takes them out
again, so neither decodes nor re-encodes a channel value: the graph decodes the checkpoint once
when it starts and encodes it once when it exits (the adapter runs it with
``durability="exit"``). The first format (one serde value of the whole checkpoint) still loads.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

__all__ = [
    "DEFAULT_CHECKPOINT_MAX_BYTES",
    "MEMORY_SLOT",
    "BeamCheckpointSaver",
    "CheckpointTooLargeError",
    "thread_config",
]

MEMORY_SLOT = "beam_agents.langgraph.checkpoint"
"""The ``ctx.memory`` slot holding the key's latest LangGraph checkpoint."""

DEFAULT_CHECKPOINT_MAX_BYTES = 256 * 1024
"""How large the stored checkpoint may be unless ``checkpoint_max_bytes`` says otherwise."""

_FORMAT = b"beam-agents/langgraph-checkpoint/2"
"""The header of the slot: the saver's own serialized pieces, packed with msgpack."""

_FORMAT_V1 = b"beam-agents/langgraph-checkpoint/1"
"""The first format's header: the whole checkpoint as one serde value (still loaded)."""

_ROOT_NS = ""

_SERDE = JsonPlusSerializer()
"""LangGraph's serde, shared: it keeps no state between calls."""


class CheckpointTooLargeError(ValueError):
    """The thread's checkpoint is over ``checkpoint_max_bytes``: nothing is stored.

    The activation fails (its run is not committed); trim the graph state, for example with
    ``RemoveMessage`` or a summarizing node, or raise the limit (``ctx.memory`` holds 1 MiB).
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the LangGraph checkpoint of this key is {size} bytes, over checkpoint_max_bytes="
            f"{limit}; trim the graph state (e.g. RemoveMessage) or raise the limit"
        )
        self.size = size
        self.limit = limit


def thread_config(thread_id: str) -> RunnableConfig:
    """The config naming the root namespace of ``thread_id``."""
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


class BeamCheckpointSaver(InMemorySaver):
    """An activation's checkpointer: LangGraph's in-memory saver plus load and export.

    Sync and async methods are the in-memory saver's. Only :meth:`export` leaves the
    activation, and only the latest root checkpoint of the thread, so the durable state stays
    bounded however long the thread runs.
    """

    def __init__(self, thread_id: str) -> None:
        # ``InMemorySaver.__init__`` with its defaults, less the check that the serde has
        # typed methods (a runtime ``Protocol`` isinstance, costly per activation): the shared
        # ``JsonPlusSerializer`` has them.
        self.serde = _SERDE
        self.storage = defaultdict(lambda: defaultdict(dict))
        self.writes = defaultdict(dict)
        self.blobs = defaultdict()
        self.stack = ExitStack()
        self.thread_id = thread_id

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The in-memory saver's ``put_writes`` (its signature is cached, see below)."""
        super().put_writes(config, writes, task_id, task_path)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The in-memory saver's ``aput_writes`` (its signature is cached, see below)."""
        InMemorySaver.put_writes(self, config, writes, task_id, task_path)

    def load(self, blob: bytes | None) -> None:
        """Put the checkpoint :meth:`export` wrote (``None``: a fresh thread) into the saver."""
        if not blob:
            return
        header, _, rest = blob.partition(b"\n")
        if header == _FORMAT:
            self._load_pieces(rest)
        elif header == _FORMAT_V1:
            self._load_v1(rest)
        else:
            raise ValueError(f"memory slot {MEMORY_SLOT!r} does not hold a LangGraph checkpoint")

    def export(self, max_bytes: int) -> bytes | None:
        """The thread's latest root checkpoint as bytes (``None`` if there is none).

        Raises :class:`CheckpointTooLargeError` when it is over ``max_bytes``.
        """
        checkpoints = self.storage[self.thread_id][_ROOT_NS]
        if not checkpoints:
            return None
        checkpoint_id = max(checkpoints)
        checkpoint, metadata, _ = checkpoints[checkpoint_id]
        versions = self.serde.loads_typed(checkpoint)["channel_versions"]
        blobs = self.blobs
        values = [
            [channel, version, *stored]
            for channel, version in versions.items()
            if (stored := blobs.get((self.thread_id, _ROOT_NS, channel, version))) is not None
        ]
        writes = [
            [*inner_key, channel, *value, task_path]
            for inner_key, (_, channel, value, task_path) in self.writes.get(
                (self.thread_id, _ROOT_NS, checkpoint_id), {}
            ).items()
        ]
        packed = ormsgpack.packb([checkpoint_id, [*checkpoint], [*metadata], values, writes])
        blob = _FORMAT + b"\n" + packed
        if len(blob) > max_bytes:
            raise CheckpointTooLargeError(len(blob), max_bytes)
        return blob

    def _load_pieces(self, packed: bytes) -> None:
        """Load :meth:`export`'s pieces as they are: serialized, as the saver keeps them."""
        checkpoint_id, checkpoint, metadata, values, writes = ormsgpack.unpackb(packed)
        thread_id = self.thread_id
        self.storage[thread_id][_ROOT_NS][checkpoint_id] = (
            (checkpoint[0], checkpoint[1]),
            (metadata[0], metadata[1]),
            None,
        )
        for channel, version, type_name, data in values:
            self.blobs[(thread_id, _ROOT_NS, channel, version)] = (type_name, data)
        if writes:
            stored = self.writes[(thread_id, _ROOT_NS, checkpoint_id)]
            for task_id, index, channel, type_name, data, task_path in writes:
                stored[(task_id, index)] = (task_id, channel, (type_name, data), task_path)

    def _load_v1(self, rest: bytes) -> None:
        """Load the first format: one serde value holding the whole checkpoint."""
        type_name, _, data = rest.partition(b"\n")
        stored: dict[str, Any] = self.serde.loads_typed((type_name.decode("ascii"), data))
        checkpoint = stored["checkpoint"]
        config = self.put(
            thread_config(self.thread_id),
            checkpoint,
            stored["metadata"],
            dict(checkpoint["channel_versions"]),
        )
        writes: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in stored["writes"]:
            writes.setdefault(task_id, []).append((channel, value))
        for task_id, task_writes in writes.items():
            self.put_writes(config, task_writes, task_id)


# LangGraph inspects the saver's ``put_writes`` (sync runs) or ``aput_writes`` (async runs)
# signature on every run (does it take ``task_path``?); a cached ``__signature__`` answers that
# without rebuilding it each time.
_method: Any
for _method in (BeamCheckpointSaver.put_writes, BeamCheckpointSaver.aput_writes):
    _method.__signature__ = inspect.signature(_method)
