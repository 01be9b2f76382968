"""The LangGraph checkpointer of one activation, and its durable copy in ``ctx.memory``.

During an activation the graph checkpoints into a :class:`BeamCheckpointSaver`, an in-memory
saver owned by that activation alone. The durable copy is one memory slot holding the thread's
latest root checkpoint (with its pending writes), serialized with LangGraph's own serde; the
adapter loads it before the graph runs and stores it again only when the run completes.
"""

from __future__ import annotations

from typing import Any

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

_FORMAT = b"beam-agents/langgraph-checkpoint/1"


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
        super().__init__(serde=JsonPlusSerializer())
        self.thread_id = thread_id

    def load(self, blob: bytes | None) -> None:
        """Put the checkpoint :meth:`export` wrote (``None``: a fresh thread) into the saver."""
        if not blob:
            return
        header, _, rest = blob.partition(b"\n")
        type_name, _, data = rest.partition(b"\n")
        if header != _FORMAT:
            raise ValueError(f"memory slot {MEMORY_SLOT!r} does not hold a LangGraph checkpoint")
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

    def export(self, max_bytes: int) -> bytes | None:
        """The thread's latest root checkpoint as bytes (``None`` if there is none).

        Raises :class:`CheckpointTooLargeError` when it is over ``max_bytes``.
        """
        latest = self.get_tuple(thread_config(self.thread_id))
        if latest is None:
            return None
        stored = {
            "checkpoint": latest.checkpoint,
            "metadata": latest.metadata,
            "writes": [list(write) for write in latest.pending_writes or ()],
        }
        type_name, data = self.serde.dumps_typed(stored)
        blob = b"\n".join((_FORMAT, type_name.encode("ascii"), data))
        if len(blob) > max_bytes:
            raise CheckpointTooLargeError(len(blob), max_bytes)
        return blob
