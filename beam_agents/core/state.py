"""How a key's state is laid out, decoded and written: every cell holds protobuf ``bytes``.

:class:`KeyState` is one key's state for one call: cells are read lazily (at most once) and
writes are recorded for the Beam glue to apply. Schema versions refuse state written by a newer
runtime. The cells and why they are read sparingly: ``core/README.md``, "State layout".
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


class Readable(Protocol):
    """A state cell as the core sees it: read-only. Writes go through :attr:`KeyState.writes`."""

    def read(self) -> Any:
        """The cell's value (``bytes`` or ``None``), or a bag's values."""


HEADER, MEMORY, CONTINUATION = 0, 1, 2
"""The value cells, as :attr:`KeyState.writes` numbers them (the order ``KeyState`` takes)."""


class KeyState:
    """One key's state for one ``process`` or timer call: lazy reads, staged writes.

    Each value cell is read at most once, and only when needed. Writes are recorded in
    :attr:`writes` (``None`` clears a cell) and the buffer's in :attr:`buffer_reset` and
    :attr:`buffer_added`, for the Beam glue to apply; later reads in the call see them.
    """

    __slots__ = (
        "_buffer_cell",
        "_continuation",
        "_continuation_cell",
        "_continuation_read",
        "_header",
        "_header_cell",
        "_memory_cell",
        "_memory_elements",
        "buffer_added",
        "buffer_reset",
        "writes",
    )

    def __init__(
        self,
        header: Readable,
        memory: Readable,
        continuation: Readable,
        buffer: Readable,
    ) -> None:
        self._header_cell = header
        self._memory_cell = memory
        self._continuation_cell = continuation
        self._buffer_cell = buffer
        self._header: KeyHeader | None = None
        self._memory_elements: list[bytes] | None = None
        self._continuation: Continuation | None = None
        self._continuation_read = False
        self.writes: dict[int, Any] = {}
        """Cell number (:data:`HEADER`, ...) to its new value; ``None`` clears the cell.

        Each value is ``bytes``, but :data:`MEMORY`'s, a bag, is a list of its elements."""
        self.buffer_reset = False
        """Whether the buffer is cleared before :attr:`buffer_added` is appended."""
        self.buffer_added: list[bytes] = []

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
        self.writes[HEADER] = header.SerializeToString()

    def read_memory(self) -> list[bytes]:
        """The committed memory's elements (read from the bag once per call)."""
        if self._memory_elements is None:
            self._memory_elements = list(self._memory_cell.read())
        return self._memory_elements

    def write_memory(self, elements: list[bytes]) -> None:
        """Store the memory's elements; none clears the bag."""
        self._memory_elements = elements
        self.writes[MEMORY] = elements or None

    def read_cache(self) -> bytes | None:
        """The suspended run's ``ModelCache`` blob (``None`` if empty); see :func:`decode_cache`."""
        continuation = self.continuation
        return None if continuation is None else continuation.replay_cache or None

    @property
    def continuation(self) -> Continuation | None:
        """The suspended run's continuation, or ``None`` when the key is not suspended."""
        if not self._continuation_read:
            blob = self._continuation_cell.read() if self.header.suspended else None
            self._continuation = (
                decode_versioned(Continuation, blob, CONTINUATION_SCHEMA_VERSION) if blob else None
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
            self.writes[CONTINUATION] = None
        else:
            continuation.schema_version = CONTINUATION_SCHEMA_VERSION
            self.writes[CONTINUATION] = continuation.SerializeToString(deterministic=True)
        if header.suspended != (continuation is not None):
            updated = KeyHeader()
            updated.CopyFrom(header)
            self.write_header(updated)

    def buffered(self) -> list[bytes]:
        """The serialized envelopes buffered while suspended, oldest first."""
        stored = [] if self.buffer_reset else list(self._buffer_cell.read())
        return [*stored, *self.buffer_added]

    def buffer(self, envelope_bytes: bytes) -> None:
        """Append an envelope to the buffer."""
        self.buffer_added.append(envelope_bytes)

    def replace_buffer(self, envelopes: list[bytes]) -> None:
        """Replace the buffer's content with ``envelopes``."""
        self.buffer_reset = True
        self.buffer_added = list(envelopes)

    def end_run(self) -> None:
        """The suspended run ended: clear its continuation, which holds its replay cache."""
        self.write_continuation(None)

    def wipe(self) -> None:
        """Idle-key cleanup: clear everything but the header."""
        self.writes[MEMORY] = None
        self._memory_elements = []
        self.end_run()
