"""The ``MemoryState`` wire format, read and written without copying untouched slots.

A commit that changes one slot should cost about one write of that slot's bytes, whatever the
rest of the memory holds. The memory is kept as a list of byte strings (the elements of its
Beam bag) whose concatenation is the ``MemoryState`` blob that
``SerializeToString(deterministic=True)`` gives for the same slots. :func:`encode_memory` puts
every content of :data:`LARGE_CONTENT_BYTES` or more in an element of its own, right after one
ending with its slot's header, and joins the small rest: a large value is written as the very
``bytes`` object the agent gave, and an untouched large slot as the element it was read from.
:func:`scan` finds each slot in the elements (views into them; only keys are copied) and a slot
is decoded only when read. It accepts only the canonical form (version 1 first, slots sorted by
key, each slot exactly ``key`` then ``value`` or ``ring``, minimal varints, a content either
inside its header's element or exactly the next element); for anything else it returns ``None``
and the caller parses the joined elements with the generated proto class.
"""

from __future__ import annotations

from collections.abc import Sequence

from beam_agents._protos import RingItems

MEMORY_SCHEMA_VERSION = 1
"""The ``MemoryState.schema_version`` this code writes and the newest it reads."""

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
    """The blob is not in the form this module writes (the proto parser must read it)."""


class RawSlot:
    """One slot as committed: its encoded ``slots`` field, decoded only when read."""

    __slots__ = ("content", "head", "is_ring")

    def __init__(self, head: memoryview, content: bytes | memoryview, is_ring: bool) -> None:
        self.head = head
        """The field up to its content: tags and lengths of the slot, its key, the content's."""
        self.content = content
        """The value or the ring's payload: an element of its own (``bytes``) or a view."""
        self.is_ring = is_ring
        """Whether the slot holds a ring (else a single value)."""

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
    """Read a varint length at ``position``: ``(length, position after it)``.

    Raises :class:`NotCanonicalError` (or ``IndexError`` when truncated) if it is not minimal
    or the field it prefixes runs past ``end``.
    """
    value, position = _read_varint(blob, position)
    if position + value > end:
        raise NotCanonicalError("a field runs past its message")
    return value, position


def scan(elements: Sequence[bytes]) -> dict[str, RawSlot] | None:
    """The slots of a canonical memory's elements by key, or ``None`` if it is not canonical.

    Only keys are copied; each :class:`RawSlot` is a view into an element or an element itself.
    """
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

    ``view`` is a ``memoryview`` of ``blob``, made once per element by the caller.
    Its content is either inside ``blob`` or exactly ``following`` (then the element after
    ``blob``, which the returned index points past).
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
