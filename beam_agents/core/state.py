"""How a key's state is laid out, decoded and written: every cell is ``bytes``.

Cells (all ``ReadModifyWriteStateSpec(BytesCoder)`` except the buffer):

- ``header``: ``KeyHeader`` (the next ``seq``, last activity, whether the key is suspended).
  Read by every activation, and the only cell idle-key cleanup keeps, so identifiers never
  repeat for a key.
- ``memory``: ``MemoryState``, read only when the agent touches ``ctx.memory``.
- ``cache``: ``ModelCache``, the model calls of the suspended run, read only when a resumed
  run calls the model. Written only when a run suspends, and cleared when the run ends: a
  key runs one run at a time, and an entry is replayed only by the run that made it (its
  ``seq`` is in the cache key), so a run that ended has nothing left to replay and a new run
  starts from an empty cache without reading the cell.
- ``continuation``: ``Continuation``, present only while the key's run is suspended. The
  header records whether it is present (``KeyState`` keeps the two in step), so an event on a
  key that is not suspended reads the header alone.
- ``buffer``: a bag of serialized ``AgentEnvelope``s, the external events that arrived while
  the key was suspended; non-empty only while ``continuation`` is present.

Cells hold serialized protos rather than objects because Beam's state cache sizes every cached
object per key and bundle, which for rich objects grows with the object. Even for ``bytes`` each
weighing walks the globals of every loaded module (``objsize``), hundreds of microseconds in a
Beam worker, paid for every cell a key first reads in a bundle: hence reading as few cells as
possible. A cell is written only when its content changed, and an empty content clears it.
The Beam state objects are used only through ``read``/``write``/``clear``/``add``, so nothing
here imports Apache Beam.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from google.protobuf.message import Message

from beam_agents._protos import Continuation, KeyHeader, ModelCache
from beam_agents.core.errors import StateSchemaError
from beam_agents.model.cache import CACHE_SCHEMA_VERSION

HEADER_SCHEMA_VERSION = 1
"""The ``KeyHeader.schema_version`` this code writes and the newest it reads."""

CONTINUATION_SCHEMA_VERSION = 1
"""The ``Continuation.schema_version`` this code writes and the newest it reads."""

M = TypeVar("M", bound=Message)


def decode_versioned(message_type: type[M], blob: bytes, newest_version: int) -> M:
    """Parse ``blob`` as ``message_type``, refusing a schema version newer than ``newest``."""
    message = message_type.FromString(blob)
    version: int = getattr(message, "schema_version")  # noqa: B009 - every state blob has one
    if version > newest_version:
        raise StateSchemaError(
            f"{message_type.__name__} state has schema version {version}; this runtime reads "
            f"up to {newest_version}. Run the newer beam-agents version that wrote it."
        )
    return message


def decode_cache(blob: bytes) -> ModelCache:
    """Parse a committed replay-cache blob, refusing a newer schema version."""
    return decode_versioned(ModelCache, blob, CACHE_SCHEMA_VERSION)


class ValueCell(Protocol):
    """A Beam ``ReadModifyWrite`` state object, as far as the runtime uses it."""

    def read(self) -> Any:
        """The stored value, or ``None``."""

    def write(self, value: Any) -> None:
        """Replace the stored value."""

    def clear(self) -> None:
        """Remove the stored value."""


class BagCell(Protocol):
    """A Beam ``Bag`` state object, as far as the runtime uses it."""

    def read(self) -> Any:
        """The stored values, in insertion order."""

    def add(self, value: Any) -> None:
        """Append a value."""

    def clear(self) -> None:
        """Remove every value."""


class KeyState:
    """One key's state cells for the duration of one ``process`` or timer call.

    Decoded values are kept so that several runs in one call (a resume followed by buffered
    events) read each cell at most once.
    """

    __slots__ = (
        "_buffer_cell",
        "_cache_cell",
        "_continuation",
        "_continuation_cell",
        "_continuation_read",
        "_header",
        "_header_cell",
        "_memory_blob",
        "_memory_cell",
        "_memory_read",
    )

    def __init__(
        self,
        header: ValueCell,
        memory: ValueCell,
        cache: ValueCell,
        continuation: ValueCell,
        buffer: BagCell,
    ) -> None:
        self._header_cell = header
        self._memory_cell = memory
        self._cache_cell = cache
        self._continuation_cell = continuation
        self._buffer_cell = buffer
        self._header: KeyHeader | None = None
        self._memory_blob: bytes | None = None
        self._memory_read = False
        self._continuation: Continuation | None = None
        self._continuation_read = False

    @property
    def header(self) -> KeyHeader:
        """The key's header (a fresh one for a key never seen or never committed).

        A key with no header has no continuation either: every commit writes the header.
        """
        if self._header is None:
            blob = self._header_cell.read()
            self._header = (
                decode_versioned(KeyHeader, blob, HEADER_SCHEMA_VERSION)
                if blob
                else KeyHeader(schema_version=HEADER_SCHEMA_VERSION, suspended=False)
            )
        return self._header

    def write_header(self, header: KeyHeader) -> None:
        """Store ``header``, with ``suspended`` set to whether the key has a continuation."""
        header.suspended = self.continuation is not None
        self._header = header
        self._header_cell.write(header.SerializeToString())

    def read_memory(self) -> bytes | None:
        """The committed ``MemoryState`` blob (read from the cell once per call)."""
        if not self._memory_read:
            self._memory_blob = self._memory_cell.read()
            self._memory_read = True
        return self._memory_blob

    def write_memory(self, blob: bytes) -> None:
        """Store the memory blob; ``b""`` clears the cell."""
        self._memory_blob = blob or None
        self._memory_read = True
        _write_or_clear(self._memory_cell, blob)

    def read_cache(self) -> bytes | None:
        """The committed ``ModelCache`` blob (``None`` if empty); see :func:`decode_cache`."""
        blob: bytes | None = self._cache_cell.read()
        return blob or None

    def write_cache(self, blob: bytes) -> None:
        """Store the replay-cache blob; ``b""`` clears the cell."""
        _write_or_clear(self._cache_cell, blob)

    @property
    def continuation(self) -> Continuation | None:
        """The suspended run's continuation, or ``None`` when the key is not suspended."""
        if not self._continuation_read:
            header = self.header
            # Unset in a header written before the field existed: then only the cell can tell.
            if header.HasField("suspended") and not header.suspended:
                self._continuation = None
            else:
                blob = self._continuation_cell.read()
                self._continuation = (
                    decode_versioned(Continuation, blob, CONTINUATION_SCHEMA_VERSION)
                    if blob
                    else None
                )
            self._continuation_read = True
        return self._continuation

    def write_continuation(self, continuation: Continuation | None) -> None:
        """Store ``continuation``; ``None`` clears it (the key is no longer suspended).

        The header follows when the key starts or stops being suspended, so the two cells
        never disagree in a commit.
        """
        header = self.header
        self._continuation = continuation
        self._continuation_read = True
        if continuation is None:
            self._continuation_cell.clear()
        else:
            self._continuation_cell.write(continuation.SerializeToString(deterministic=True))
        # A header without ``suspended`` that stays unsuspended may stay as it is: it makes the
        # next call read the continuation cell, which is then empty.
        if header.suspended != (continuation is not None):
            updated = KeyHeader()
            updated.CopyFrom(header)
            self.write_header(updated)

    def buffered(self) -> list[bytes]:
        """The serialized envelopes buffered while suspended, oldest first."""
        return list(self._buffer_cell.read())

    def buffer(self, envelope_bytes: bytes) -> None:
        """Append an envelope to the buffer."""
        self._buffer_cell.add(envelope_bytes)

    def replace_buffer(self, envelopes: list[bytes]) -> None:
        """Replace the buffer's content with ``envelopes``."""
        self._buffer_cell.clear()
        for envelope_bytes in envelopes:
            self._buffer_cell.add(envelope_bytes)

    def end_run(self) -> None:
        """The suspended run ended: clear its continuation and its replay cache."""
        self._cache_cell.clear()
        self.write_continuation(None)

    def wipe(self) -> None:
        """Idle-key cleanup: clear everything but the header."""
        self._memory_cell.clear()
        self._memory_blob = None
        self._memory_read = True
        self.end_run()


def _write_or_clear(cell: ValueCell, blob: bytes) -> None:
    if blob:
        cell.write(blob)
    else:
        cell.clear()
