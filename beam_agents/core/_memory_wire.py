"""The ``MemoryState`` wire format, read and written without copying untouched slots.

A commit that changes one slot should cost about one write of that slot's bytes, whatever the
rest of the memory holds. So the committed blob is not parsed into messages: :func:`scan` finds
each slot's encoded bytes (zero-copy ``memoryview`` slices of the blob), a slot is decoded only
when it is read, and :func:`encode_memory` joins the untouched slots' original bytes with the
changed slots encoded anew. The result is byte for byte what
``MemoryState(...).SerializeToString(deterministic=True)`` gives for the same slots, because
:func:`scan` accepts only blobs in that canonical form (version 1 first, slots sorted by key,
each slot exactly ``key`` then ``value`` or ``ring``, minimal varints). Any other blob makes it
return ``None`` and the caller parses it with the generated proto class instead.
"""

from __future__ import annotations

from beam_agents._protos import RingItems

MEMORY_SCHEMA_VERSION = 1
"""The ``MemoryState.schema_version`` this code writes and the newest it reads."""

VERSION_FIELD = bytes((0x08, MEMORY_SCHEMA_VERSION))
"""``schema_version`` (field 1, varint): the fast path reads and writes only this version."""

_SLOTS_TAG = 0x12  # MemoryState.slots: field 2, length-delimited
_KEY_TAG = 0x0A  # MemorySlot.key: field 1
_VALUE_TAG = 0x12  # MemorySlot.value: field 2
_RING_TAG = 0x1A  # MemorySlot.ring: field 3
_ITEM_TAG = 0x0A  # RingItems.items: field 1

Slot = bytes | list[bytes]
"""A decoded slot: one value, or a ring's items oldest first."""


class NotCanonicalError(ValueError):
    """The blob is not in the form this module writes (the proto parser must read it)."""


class RawSlot:
    """One slot as committed: its encoded field in ``MemoryState``, decoded only when read."""

    __slots__ = ("_content", "field", "is_ring")

    def __init__(self, field: memoryview, is_ring: bool, content: int) -> None:
        self.field = field
        """The ``slots`` field holding the slot: tag, length and ``MemorySlot`` message."""
        self.is_ring = is_ring
        """Whether the slot holds a ring (else a single value)."""
        self._content = content

    def decode(self) -> Slot:
        """The slot's content as fresh Python objects (the only copy of its bytes)."""
        content = self.field[self._content :]
        if not self.is_ring:
            return bytes(content)
        return list(_parse_ring(content).items)


def _parse_ring(payload: memoryview) -> RingItems:
    """Parse a ring's payload in place (the parser takes any buffer; its stub says bytes)."""
    return RingItems.FromString(payload)  # type: ignore[arg-type]


def _canonical_ring(ring: bytes, start: int, end: int) -> bool:
    """Whether ``ring[start:end]`` is exactly a ring's items, each encoded canonically.

    Walks the items' tags and minimal lengths without parsing or copying them.
    """
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


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _head(tag: int, length: int) -> bytes:
    return bytes((tag,)) + _varint(length)


def _length(blob: bytes, position: int, end: int) -> tuple[int, int]:
    """Read a varint length at ``position``: ``(length, position after it)``.

    Raises :class:`NotCanonicalError` (or ``IndexError`` when truncated) if it is not minimal
    or the field it prefixes runs past ``end``.
    """
    value = blob[position]
    position += 1
    if value >= 0x80:
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
    if position + value > end:
        raise NotCanonicalError("a field runs past its message")
    return value, position


def scan(blob: bytes) -> dict[str, RawSlot] | None:
    """The slots of a canonical ``MemoryState`` blob by key, or ``None`` if it is not canonical.

    Only keys are copied; each :class:`RawSlot` is a view into ``blob``.
    """
    if not isinstance(blob, bytes) or blob[:2] != VERSION_FIELD:
        return None  # the views below must point into an immutable buffer
    data = memoryview(blob)
    slots: dict[str, RawSlot] = {}
    previous = ""
    position, end = len(VERSION_FIELD), len(blob)
    try:
        while position < end:
            field = position
            if blob[position] != _SLOTS_TAG:
                raise NotCanonicalError("not a slot")
            length, start = _length(blob, position + 1, end)
            position = start + length
            if blob[start] != _KEY_TAG:
                raise NotCanonicalError("a slot must start with its key")
            length, key_start = _length(blob, start + 1, position)
            key_end = key_start + length
            key = blob[key_start:key_end].decode("utf-8")
            tag = blob[key_end]
            length, content = _length(blob, key_end + 1, position)
            if tag not in (_VALUE_TAG, _RING_TAG) or content + length != position:
                raise NotCanonicalError("a slot holds exactly a key and a value or a ring")
            if key <= previous:  # also refuses an empty key
                raise NotCanonicalError("slots are not sorted by key")
            if tag == _RING_TAG and not _canonical_ring(blob, content, position):
                raise NotCanonicalError("a ring's items are not encoded canonically")
            slots[key] = RawSlot(data[field:position], tag == _RING_TAG, content - field)
            previous = key
    except (NotCanonicalError, IndexError, UnicodeDecodeError):
        return None
    return slots


def _encode_slot(key: str, slot: Slot, parts: list[bytes | memoryview]) -> None:
    """Append the encoding of one changed slot to ``parts`` (its value bytes by reference)."""
    encoded_key = key.encode("utf-8")
    key_field = _head(_KEY_TAG, len(encoded_key)) + encoded_key
    if isinstance(slot, bytes):
        content_head = _head(_VALUE_TAG, len(slot))
        body: list[bytes] = [slot]
        content_size = len(slot)
    else:
        ring = RingItems(items=slot).SerializeToString()
        content_head = _head(_RING_TAG, len(ring))
        body = [ring]
        content_size = len(ring)
    slot_length = len(key_field) + len(content_head) + content_size
    parts.append(_head(_SLOTS_TAG, slot_length) + key_field + content_head)
    parts += body


def encode_memory(slots: dict[str, Slot | RawSlot]) -> bytes:
    """The canonical ``MemoryState`` blob of ``slots`` (``b""`` when there are none)."""
    if not slots:
        return b""
    parts: list[bytes | memoryview] = [VERSION_FIELD]
    for key in sorted(slots):
        slot = slots[key]
        if isinstance(slot, RawSlot):
            parts.append(slot.field)
        else:
            _encode_slot(key, slot, parts)
    return b"".join(parts)
