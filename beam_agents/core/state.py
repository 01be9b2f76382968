"""A key's state: every cell holds protobuf ``bytes``, read lazily, written only on commit.

:class:`KeyState` holds one key's cells for one call; :class:`MemorySlots` is the memory an
activation reads and stages. Every format is version 1; a newer version is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from google.protobuf.message import Message

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    KeyHeader,
    MemoryState,
    ModelCache,
    RingItems,
)
from beam_agents.core.agent import MemoryLimitError, MemorySlotError, StateSchemaError
from beam_agents.core.model_calls import CACHE_SCHEMA_VERSION

HEADER_SCHEMA_VERSION = 1
"""The ``KeyHeader.schema_version`` this code writes and the newest it reads."""

CONTINUATION_SCHEMA_VERSION = 1
"""The ``Continuation.schema_version`` this code writes and the newest it reads."""

MEMORY_SCHEMA_VERSION = 1
"""The ``MemoryState.schema_version`` this code writes and the newest it reads."""

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


class Bag(Protocol):
    """A bag state cell as the core uses it (Beam's bag state, or a test's stand-in)."""

    def read(self) -> Iterable[bytes]:
        """The bag's elements, oldest first."""

    def add(self, value: bytes) -> None:
        """Append ``value``."""

    def clear(self) -> None:
        """Remove every element."""


BUFFERED_MARK = b"\x00"
"""The first byte of a header-bag element that is a buffered envelope (no proto starts so)."""


class KeyState:
    """One key's state for one ``process`` or timer call: lazy reads, staged writes.

    The header bag is a log: :class:`KeyHeader` elements (the last one counts; it holds the
    suspended run's continuation) and :data:`BUFFERED_MARK`-prefixed envelopes buffered behind
    that run, in arrival order. A new header is appended while events wait, so they are not
    written again; the bag is rewritten whole once superseded headers outweigh the events. The
    memory bag holds the memory's elements. Each bag is read at most once, and only when
    needed; :meth:`commit` writes what changed.
    """

    __slots__ = (
        "_continuation",
        "_continuation_read",
        "_header",
        "_header_cell",
        "_header_out",
        "_memory_cell",
        "_memory_elements",
        "_memory_written",
        "_stored",
        "buffer_added",
        "buffer_reset",
    )

    def __init__(self, header: Bag, memory: Bag) -> None:
        self._header_cell = header
        self._memory_cell = memory
        self._header: KeyHeader | None = None
        self._stored: list[bytes] | None = None
        self._header_out: bytes | None = None
        self._memory_elements: list[bytes] | None = None
        self._memory_written = False
        self._continuation: Continuation | None = None
        self._continuation_read = False
        self.buffer_reset = False
        """Whether the buffer is cleared before :attr:`buffer_added` is appended."""
        self.buffer_added: list[bytes] = []

    @property
    def header(self) -> KeyHeader:
        """The key's header (a fresh one for a key never committed)."""
        if self._header is None:
            blob = self._stored_header()
            self._header = (
                KeyHeader(schema_version=HEADER_SCHEMA_VERSION)
                if blob is None
                else decode_versioned(KeyHeader, blob, HEADER_SCHEMA_VERSION)
            )
        return self._header

    def _read(self) -> list[bytes]:
        """The header bag as stored."""
        if self._stored is None:
            self._stored = list(self._header_cell.read())
        return self._stored

    def _stored_header(self) -> bytes | None:
        """The last header element of the bag, if it has one."""
        for element in reversed(self._read()):
            if element[:1] != BUFFERED_MARK:
                return element
        return None

    @property
    def last_activity_ms(self) -> int:
        """The event time of the key's last activity: its header's, or a later buffered event's."""
        latest = self.header.last_activity_ms
        for envelope_bytes in self.buffered():
            latest = max(latest, AgentEnvelope.FromString(envelope_bytes).event_time_ms)
        return latest

    def write_header(self, header: KeyHeader) -> None:
        """Store ``header``, with the key's continuation as it stands."""
        continuation = self.header.continuation
        if continuation:
            header.continuation = continuation
        self._stage_header(header)

    def _stage_header(self, header: KeyHeader) -> None:
        self._header = header
        self._header_out = header.SerializeToString()

    def read_memory(self) -> list[bytes]:
        """The committed memory's elements (read from the bag once per call)."""
        if self._memory_elements is None:
            self._memory_elements = list(self._memory_cell.read())
        return self._memory_elements

    def write_memory(self, elements: list[bytes]) -> None:
        """Store the memory's elements; none clears the bag."""
        self._memory_elements = elements
        self._memory_written = True

    def read_cache(self) -> bytes | None:
        """The suspended run's ``ModelCache`` blob (``None`` if empty); see :func:`decode_cache`."""
        continuation = self.continuation
        return None if continuation is None else continuation.replay_cache or None

    @property
    def continuation(self) -> Continuation | None:
        """The suspended run's continuation, or ``None`` when the key is not suspended."""
        if not self._continuation_read:
            blob = self.header.continuation
            self._continuation = (
                decode_versioned(Continuation, blob, CONTINUATION_SCHEMA_VERSION) if blob else None
            )
            self._continuation_read = True
        return self._continuation

    def write_continuation(
        self, continuation: Continuation | None, header: KeyHeader | None = None
    ) -> None:
        """Store ``continuation`` (``None`` clears it) in ``header``, or in the current header."""
        if continuation is None:
            blob = b""
        else:
            continuation.schema_version = CONTINUATION_SCHEMA_VERSION
            blob = continuation.SerializeToString(deterministic=True)
        if header is None:
            header = KeyHeader()
            header.CopyFrom(self.header)
        self._continuation = continuation
        self._continuation_read = True
        header.continuation = blob
        self._stage_header(header)

    def buffered(self) -> list[bytes]:
        """The serialized envelopes buffered while suspended, oldest first."""
        stored = [] if self.buffer_reset else self._stored_events()
        return [*stored, *self.buffer_added]

    def buffered_count(self) -> int:
        """How many envelopes are buffered (none is copied to count them)."""
        stored = 0 if self.buffer_reset else len(self._read()) - self._header_elements()
        return stored + len(self.buffer_added)

    def _stored_events(self) -> list[bytes]:
        return [e[1:] for e in self._read() if e[:1] == BUFFERED_MARK]

    def _header_elements(self) -> int:
        return sum(1 for element in self._read() if element[:1] != BUFFERED_MARK)

    def buffer(self, envelope_bytes: bytes) -> None:
        """Append an envelope to the buffer."""
        self.buffer_added.append(envelope_bytes)

    def replace_buffer(self, envelopes: list[bytes]) -> None:
        """Replace the buffer's content with ``envelopes``."""
        self.buffer_reset = True
        self.buffer_added = list(envelopes)

    def end_run(self, header: KeyHeader | None = None) -> None:
        """The suspended run ended: clear its continuation, which holds its replay cache.

        ``header``: the key's new header, as for :meth:`write_continuation`.
        """
        self.write_continuation(None, header)

    def wipe(self) -> None:
        """Idle-key cleanup: clear everything but the header."""
        self.write_memory([])
        self.end_run()

    def commit(self) -> None:
        """Write what this call changed to the bags."""
        if self._header_out is not None or self.buffer_reset:
            self._commit_header()
        else:
            self._append(self.buffer_added)
        if self._memory_written:
            memory = self._memory_cell
            memory.clear()
            for element in self._memory_elements or ():
                memory.add(element)

    def _commit_header(self) -> None:
        """Append the new header behind waiting events, or rewrite the bag once that is cheaper."""
        stored = self._read()
        head = self._header_out
        if head is None:  # the buffer alone was replaced: the header stays
            head = self._stored_header() or self.header.SerializeToString()
        superseded = sum(len(element) for element in stored if element[:1] != BUFFERED_MARK)
        waiting = sum(len(element) for element in stored) - superseded
        if self.buffer_reset or superseded >= waiting:
            kept = self.buffered()
            self._header_cell.clear()
            self._header_cell.add(head)
            self._append(kept)
        else:
            self._header_cell.add(head)
            self._append(self.buffer_added)

    def _append(self, envelopes: list[bytes]) -> None:
        for envelope_bytes in envelopes:
            self._header_cell.add(BUFFERED_MARK + envelope_bytes)


# -- working memory: the MemoryState wire format and the memory an activation sees ------------
# The memory is kept as the elements of a Beam bag whose concatenation is the MemoryState blob
# SerializeToString(deterministic=True) gives. encode_memory puts every content of
# LARGE_CONTENT_BYTES or more in an element of its own (written as the agent's own bytes, and
# an untouched one as the element it was read from), so a commit costs what changed. scan reads
# only that canonical form, as views; anything else is parsed with the generated class.
VERSION_FIELD = bytes((0x08, MEMORY_SCHEMA_VERSION))
"""``schema_version`` (field 1, varint): how a memory's first element starts."""

_SLOTS_TAG = 0x12  # MemoryState.slots: field 2, length-delimited
_KEY_TAG = 0x0A  # MemorySlot.key: field 1
_VALUE_TAG = 0x12  # MemorySlot.value: field 2
_RING_TAG = 0x1A  # MemorySlot.ring: field 3
_ITEM_TAG = 0x0A  # RingItems.items: field 1

LARGE_CONTENT_BYTES = 16 << 10
"""A slot content this large is an element of its own (below it, copying costs less than an
element: Beam frames, weighs and hands over each one)."""

Slot = bytes | list[bytes]
"""A decoded slot: one value, or a ring's items oldest first."""


class NotCanonicalError(ValueError):
    """The blob is not in the form :func:`encode_memory` writes (the proto parser reads it)."""


class RawSlot:
    """One slot as committed: its encoded ``slots`` field, decoded only when read."""

    __slots__ = ("content", "head", "is_ring")

    def __init__(self, head: memoryview, content: bytes | memoryview, is_ring: bool) -> None:
        self.head = head
        """The field up to its content: tags and lengths of the slot, its key, the content's."""
        self.content = content
        self.is_ring = is_ring

    @property
    def size(self) -> int:
        """The encoded field's size in bytes."""
        return len(self.head) + len(self.content)

    def decode(self) -> Slot:
        """The slot's content as Python objects (an element of its own is not copied)."""
        if self.is_ring:
            return list(_parse_ring(self.content).items)
        return self.content if isinstance(self.content, bytes) else bytes(self.content)


def _parse_ring(payload: bytes | memoryview) -> RingItems:
    """Parse a ring's payload in place (the parser takes any buffer; its stub says bytes)."""
    return RingItems.FromString(payload)  # type: ignore[arg-type]


def _canonical_ring(ring: bytes, start: int, end: int) -> bool:
    """Whether ``ring[start:end]`` is exactly a ring's items, each encoded canonically."""
    position = start
    try:
        while position < end:
            if ring[position] != _ITEM_TAG:
                return False
            length, position = _length(ring, position + 1, end)
            position += length
    except (NotCanonicalError, IndexError):
        return False
    return position == end


def varint_size(value: int) -> int:
    """How many bytes ``value`` takes as a varint."""
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def field_size(payload_size: int) -> int:
    """Encoded size of a length-delimited field with a one-byte tag (field numbers < 16)."""
    return 1 + varint_size(payload_size) + payload_size


def slot_size(key: str, slot: Slot) -> int:
    """Encoded size of the slot as it appears inside ``MemoryState`` (tag and length included)."""
    if isinstance(slot, bytes):
        content = field_size(len(slot))
    else:
        content = field_size(sum(field_size(len(item)) for item in slot))
    return field_size(field_size(len(key.encode("utf-8"))) + content)


def varint(value: int) -> bytes:
    """``value`` as a protobuf base-128 varint."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _head(tag: int, length: int) -> bytes:
    return bytes((tag,)) + varint(length)


def _read_varint(blob: bytes, position: int) -> tuple[int, int]:
    """Read a minimal varint at ``position``: ``(value, position after it)``."""
    value = blob[position]
    position += 1
    if value < 0x80:
        return value, position
    value &= 0x7F
    shift = 7
    while True:
        byte = blob[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    if byte == 0:
        raise NotCanonicalError("non-minimal varint")
    return value, position


def _length(blob: bytes, position: int, end: int) -> tuple[int, int]:
    """Read a minimal varint length whose field ends by ``end``: ``(length, position after)``."""
    value, position = _read_varint(blob, position)
    if position + value > end:
        raise NotCanonicalError("a field runs past its message")
    return value, position


def scan(elements: Sequence[bytes]) -> dict[str, RawSlot] | None:
    """The slots of a canonical memory's elements by key (as views), or ``None``."""
    if not elements or any(type(element) is not bytes for element in elements):
        return None  # the views below must point into immutable buffers
    first = elements[0]
    if first[:2] != VERSION_FIELD or first == VERSION_FIELD:
        return None
    slots: dict[str, RawSlot] = {}
    previous = ""
    index, position = 0, len(VERSION_FIELD)
    views = [memoryview(element) for element in elements]  # one per element, not per slot
    try:
        while index < len(elements):
            blob = elements[index]
            if position == len(blob):
                index, position = index + 1, 0
                if index < len(elements) and not elements[index]:
                    raise NotCanonicalError("an empty element")
                continue
            following = elements[index + 1] if index + 1 < len(elements) else b""
            key, slot, index, position = _slot_at(blob, views[index], position, following, index)
            if key <= previous:  # also refuses an empty key
                raise NotCanonicalError("slots are not sorted by key")
            slots[key] = slot
            previous = key
    except (NotCanonicalError, IndexError, UnicodeDecodeError):
        return None
    return slots


def _slot_at(
    blob: bytes, view: memoryview, field: int, following: bytes, index: int
) -> tuple[str, RawSlot, int, int]:
    """The slot whose field starts at ``blob[field]``: ``(key, slot, index, position)`` after it.

    Its content is either inside ``blob`` (``view`` is a view of it) or exactly ``following``.
    """
    end = len(blob)
    if blob[field] != _SLOTS_TAG:
        raise NotCanonicalError("not a slot")
    length, start = _read_varint(blob, field + 1)
    slot_end = start + length
    if blob[start] != _KEY_TAG:
        raise NotCanonicalError("a slot must start with its key")
    length, key_start = _read_varint(blob, start + 1)
    key_end = key_start + length
    if key_end >= min(slot_end, end):
        raise NotCanonicalError("a slot holds exactly a key and a value or a ring")
    key = blob[key_start:key_end].decode("utf-8")
    tag = blob[key_end]
    length, content = _read_varint(blob, key_end + 1)
    if tag not in (_VALUE_TAG, _RING_TAG) or content + length != slot_end:
        raise NotCanonicalError("a slot holds exactly a key and a value or a ring")
    is_ring = tag == _RING_TAG
    if slot_end <= end:
        if is_ring and not _canonical_ring(blob, content, slot_end):
            raise NotCanonicalError("a ring's items are not encoded canonically")
        return key, RawSlot(view[field:content], view[content:slot_end], is_ring), index, slot_end
    if content != end or len(following) != length:
        raise NotCanonicalError("a content is neither inside its element nor the next one")
    if is_ring and not _canonical_ring(following, 0, length):
        raise NotCanonicalError("a ring's items are not encoded canonically")
    return key, RawSlot(view[field:], following, is_ring), index + 1, length


def _encode_slot(key: str, slot: Slot) -> tuple[bytes, bytes]:
    """A changed slot's field as ``(head, content)``; a value is its content as it is."""
    encoded_key = key.encode("utf-8")
    key_field = _head(_KEY_TAG, len(encoded_key)) + encoded_key
    if isinstance(slot, bytes):
        tag, content = _VALUE_TAG, slot if type(slot) is bytes else bytes(slot)
    else:
        tag, content = _RING_TAG, RingItems(items=slot).SerializeToString()
    content_head = _head(tag, len(content))
    slot_length = len(key_field) + len(content_head) + len(content)
    return _head(_SLOTS_TAG, slot_length) + key_field + content_head, content


def encode_memory(slots: dict[str, Slot | RawSlot]) -> list[bytes]:
    """The canonical memory of ``slots`` as elements (none when there are no slots)."""
    if not slots:
        return []
    elements: list[bytes] = []
    pending: list[bytes | memoryview] = [VERSION_FIELD]
    for key in sorted(slots):
        slot = slots[key]
        head: bytes | memoryview
        content: bytes | memoryview
        if isinstance(slot, RawSlot):
            head, content = slot.head, slot.content
        else:
            head, content = _encode_slot(key, slot)
        if len(content) < LARGE_CONTENT_BYTES:
            pending += (head, content)
            continue
        pending.append(head)
        elements.append(b"".join(pending))
        elements.append(content if type(content) is bytes else bytes(content))
        pending = []
    if pending:
        elements.append(b"".join(pending))
    return elements


PARSED_WHOLE_BYTES = 1 << 10
"""A memory this small is parsed by the protobuf codec, every slot at once: cheaper than views."""

MEMORY_CAP_BYTES = 1 << 20
"""The hard cap on a key's serialized working memory: 1 MiB."""

DEFAULT_RING_ITEMS = 64
"""How many items ``append`` keeps in a ring unless told otherwise."""

_VERSION_FIELD_SIZE = len(VERSION_FIELD)


class MemorySlots:
    """A key's memory slots in one activation: the committed ones plus staged writes.

    A slot holds either one value or a ring of items; using it as the other kind raises
    :class:`MemorySlotError`. Slots are decoded only when read, and a commit re-uses the
    committed bytes of every slot it did not change. Arguments are checked by its caller,
    ``WorkingMemory`` in ``core.context``.
    """

    __slots__ = ("_changed", "_elements", "_encoded", "_size", "_sizes", "_slots")

    def __init__(self, elements: Sequence[bytes] | None) -> None:
        self._elements = elements
        self._slots: dict[str, Slot | RawSlot] | None = None
        self._sizes: dict[str, int] = {}
        self._size = 0
        self._changed = False
        self._encoded: list[bytes] | None = None

    def _loaded(self) -> dict[str, Slot | RawSlot]:
        if self._slots is None:
            self._slots = self._decode(self._elements) if self._elements else {}
            self._size = _VERSION_FIELD_SIZE
            for key, content in self._slots.items():
                size = self._sizes[key] = (
                    content.size if isinstance(content, RawSlot) else slot_size(key, content)
                )
                self._size += size
        return self._slots

    @staticmethod
    def _decode(elements: Sequence[bytes]) -> dict[str, Slot | RawSlot]:
        """The committed slots: a small memory parsed whole, else views into ``elements``."""
        small = len(elements) == 1 and len(elements[0]) <= PARSED_WHOLE_BYTES
        raw = None if small else scan(elements)
        if raw is not None:
            return dict(raw)
        blob = b"".join(elements)
        state = decode_versioned(MemoryState, blob, MEMORY_SCHEMA_VERSION)
        return {
            slot.key: list(slot.ring.items) if slot.WhichOneof("content") == "ring" else slot.value
            for slot in state.slots
        }

    def _slot(self, key: str) -> Slot | None:
        """Slot ``key`` decoded (once: the decoded content replaces the committed view)."""
        slots = self._loaded()
        slot = slots.get(key)
        if isinstance(slot, RawSlot):
            slot = slots[key] = slot.decode()
        return slot

    def _replace(self, key: str, new: Slot | None) -> None:
        """Swap slot ``key`` for ``new`` (``None`` deletes), enforcing the cap first."""
        slots = self._loaded()
        sizes = self._sizes
        new_size = 0 if new is None else slot_size(key, new)
        size = self._size - sizes.get(key, 0) + new_size
        if size > MEMORY_CAP_BYTES:
            raise MemoryLimitError(
                f"writing memory slot {key!r} would make this key's memory {size} bytes, over "
                f"the {MEMORY_CAP_BYTES}-byte cap; store large data elsewhere and keep a "
                "reference in memory"
            )
        if new is None:
            del slots[key]
            del sizes[key]
        else:
            slots[key] = new
            sizes[key] = new_size
        self._size = size
        self._changed = True
        self._encoded = None

    def get(self, key: str) -> bytes | None:
        """The value in slot ``key``, or ``None`` if there is none."""
        slot = self._slot(key)
        if isinstance(slot, list):
            raise MemorySlotError(f"memory slot {key!r} is a ring; read it with ring({key!r})")
        return slot

    def set(self, key: str, value: bytes) -> None:
        """Put ``value`` in slot ``key`` (replacing a value or a ring)."""
        self._replace(key, value)

    def delete(self, key: str) -> None:
        """Remove slot ``key``; deleting a missing slot is a no-op."""
        if key in self._loaded():
            self._replace(key, None)

    def keys(self) -> list[str]:
        """The names of all slots, sorted."""
        return sorted(self._loaded())

    def append(self, key: str, item: bytes, max_items: int) -> None:
        """Append ``item`` to the ring in slot ``key``, keeping only the newest ``max_items``."""
        current = self._slot(key)
        if isinstance(current, bytes):
            raise MemorySlotError(
                f"memory slot {key!r} holds a single value; delete it before using it as a ring"
            )
        self._replace(key, [*(current or ()), item][-max_items:])

    def ring(self, key: str) -> list[bytes]:
        """The items of the ring in slot ``key``, oldest first (empty if there is none)."""
        slot = self._slot(key)
        if isinstance(slot, bytes):
            raise MemorySlotError(f"memory slot {key!r} holds a single value; read it with get()")
        return list(slot or ())

    @property
    def size(self) -> int:
        """The size of this memory's serialized form in bytes: what the cap limits."""
        return self._size if self._loaded() else 0

    @property
    def slot_sizes(self) -> dict[str, int]:
        """Each slot's share of :attr:`size`, by name (its encoded bytes, tag included)."""
        self._loaded()
        return dict(self._sizes)

    @property
    def changed(self) -> bool:
        """Whether this activation wrote anything."""
        return self._changed

    def encode(self) -> list[bytes]:
        """The memory's bag elements (none when memory is empty); see :func:`encode_memory`."""
        if self._encoded is None:
            self._encoded = encode_memory(self._loaded())
        return self._encoded
