"""Working memory's wire format: golden bytes against the proto, lazy slots, the cap."""

from __future__ import annotations

import itertools

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_agents._protos import MemorySlot, MemoryState, RingItems
from beam_agents.core import state as _memory_wire
from beam_agents.core.agent import MemoryLimitError, MemorySlotError, StateSchemaError
from beam_agents.core.context import WorkingMemory
from beam_agents.core.state import (
    LARGE_CONTENT_BYTES,
    MEMORY_CAP_BYTES,
    MEMORY_SCHEMA_VERSION,
    RawSlot,
    encode_memory,
    scan,
)

Content = bytes | list[bytes]


def proto_blob(slots: dict[str, Content]) -> bytes:
    """The generated proto, serialized: the elements joined."""
    if not slots:
        return b""
    state = MemoryState(schema_version=MEMORY_SCHEMA_VERSION)
    for key in sorted(slots):
        content = slots[key]
        if isinstance(content, bytes):
            state.slots.append(MemorySlot(key=key, value=content))
        else:
            state.slots.append(MemorySlot(key=key, ring=RingItems(items=content)))
    return state.SerializeToString(deterministic=True)


def joined(memory: WorkingMemory) -> bytes:
    """The serialized ``MemoryState``: the memory's elements joined."""
    return b"".join(memory.encode())


def contents(memory: WorkingMemory) -> dict[str, Content]:
    """Every slot of ``memory`` decoded, by key."""
    result: dict[str, Content] = {}
    for key in sorted(memory.slot_sizes):
        try:
            value = memory.get(key)
        except MemorySlotError:
            result[key] = memory.ring(key)
        else:
            assert value is not None
            result[key] = value
    return result


MEMORIES: list[dict[str, Content]] = [
    {},
    {"a": b""},
    {"a": b"x" * 127, "b": b"y" * 128, "c": b"z" * 16_384},
    {"big": bytes(300_000), "small": b"1"},
    {"ring": [b""], "empty ring": [], "items": [b"a", b"", b"c" * 200]},
    {"ключ": b"\x00\xff", "キー": [b"1", b"2"], "é": b"", "z": b"last"},
    {f"slot-{index:03d}": bytes([index]) * index for index in range(200)},
    {"k" * 300: b"a long key", "v": [bytes(130)] * 64},
]

keys = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12)
values = st.binary(max_size=300)
large_values = st.sampled_from(
    [LARGE_CONTENT_BYTES - 1, LARGE_CONTENT_BYTES, LARGE_CONTENT_BYTES + 1, 3 * LARGE_CONTENT_BYTES]
).map(lambda size: bytes([size % 251]) * size)
"""Values either side of where a content becomes an element of its own."""
slot_contents = st.one_of(values, large_values, st.lists(values, max_size=5))
memories = st.dictionaries(keys, slot_contents, max_size=8)


@pytest.mark.parametrize("slots", MEMORIES)
def test_the_encoder_writes_the_protos_bytes(slots: dict[str, Content]) -> None:
    assert b"".join(encode_memory(dict(slots))) == proto_blob(slots)
    memory = WorkingMemory(None)
    for key, content in slots.items():
        if isinstance(content, bytes):
            memory.set(key, content)
        else:
            for item in content:
                memory.append(key, item, max_items=max(1, len(content)))
            if not content:  # an empty ring only comes from a blob: set it up there
                memory = WorkingMemory([proto_blob(slots)])
                break
    assert joined(memory) == proto_blob(slots)


@pytest.mark.parametrize("slots", MEMORIES)
def test_a_proto_blob_reads_back_and_re_encodes_unchanged(slots: dict[str, Content]) -> None:
    blob = proto_blob(slots)  # as a release before the bag wrote it
    memory = WorkingMemory([blob] if blob else None)
    assert memory.size == len(blob)
    assert contents(memory) == slots
    assert joined(WorkingMemory([blob] if blob else None)) == proto_blob(slots)
    assert sum(memory.slot_sizes.values()) + 2 * bool(slots) == len(blob)


@settings(max_examples=200, deadline=None)
@given(memories, memories, st.sets(keys, max_size=4))
def test_changing_some_slots_encodes_as_the_proto_would(
    before: dict[str, Content], writes: dict[str, Content], deletes: set[str]
) -> None:
    committed = encode_memory(dict(before))
    memory = WorkingMemory(committed or None)
    after = dict(before)
    for key, content in writes.items():
        if isinstance(content, bytes):
            memory.set(key, content)
        else:
            memory.delete(key)
            for item in content:
                memory.append(key, item, max_items=len(content))
        if content or isinstance(content, bytes):
            after[key] = content
        else:
            after.pop(key, None)
    for key in deletes:
        memory.delete(key)
        after.pop(key, None)
    assert joined(memory) == proto_blob(after)
    assert memory.size == (len(proto_blob(after)) if after else 0)
    assert contents(WorkingMemory(memory.encode() or None)) == after
    for key, content in before.items():  # an untouched large value: its element, not a copy
        untouched = key not in writes and key not in deletes
        if untouched and isinstance(content, bytes) and len(content) >= LARGE_CONTENT_BYTES:
            assert any(element is content for element in memory.encode())


def test_untouched_slots_are_neither_decoded_nor_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    committed: dict[str, Content] = {
        "a": b"1" * 1000,
        "b": [b"2"],
        "c": b"3" * 1000,
        "d": [b"4", b"5" * 300],
        "e": b"6" * 200,
    }
    blob = proto_blob(committed)
    slots = scan([blob])
    assert slots is not None
    assert all(slot.head.obj is blob and slot.content.obj is blob for slot in slots.values())

    class Unparsable:
        def __getattr__(self, name: str) -> object:
            raise AssertionError("a ring was parsed")

    monkeypatch.setattr(_memory_wire, "RingItems", Unparsable())  # the scan walks rings unparsed
    memory = WorkingMemory([blob])
    assert memory.get("a") == committed["a"]
    memory.set("b", b"new")
    memory.delete("c")
    assert memory.keys() == ["a", "b", "d", "e"]
    kept = memory._slots._slots  # the untouched slots are still views into the committed blob
    assert all(isinstance(kept[key], RawSlot) and kept[key].content.obj is blob for key in "de")
    expected = {"a": committed["a"], "b": b"new", "d": committed["d"], "e": committed["e"]}
    assert joined(memory) == proto_blob(expected)


def ring_blob(payload: bytes) -> bytes:
    """A memory whose one slot, ``r``, is a ring with exactly ``payload`` as its bytes."""
    slot = b"\x0a\x01r\x1a%c" % len(payload) + payload
    return b"\x08\x01\x12%c" % len(slot) + slot


def test_blobs_the_encoder_would_not_write_are_read_through_the_proto() -> None:
    first = MemoryState(schema_version=1, slots=[MemorySlot(key="b", value=b"old")])
    second = MemoryState(slots=[MemorySlot(key="a", ring=RingItems(items=[b"x"]))])
    third = MemoryState(slots=[MemorySlot(key="b", value=b"new")])
    unsorted = b"".join(message.SerializeToString() for message in (first, second, third))
    extra = MemorySlot(key="c", value=b"v").SerializeToString() + b"\x20\x01"  # unknown field 4
    odd_slot = MemoryState(schema_version=1).SerializeToString() + b"\x12%c" % len(extra) + extra
    long_varint = b"\x08\x01\x12\x85\x00\x0a\x01d\x12\x00"  # a 2-byte length where 1 will do
    cases: list[tuple[bytes, dict[str, Content]]] = [
        (unsorted, {"a": [b"x"], "b": b"new"}),
        (odd_slot, {"c": b"v"}),
        (long_varint, {"d": b""}),
        (ring_blob(b"\x0a\x01x\x10\x01"), {"r": [b"x"]}),  # an unknown field in the ring
        (ring_blob(b"\x0a\x81\x00x"), {"r": [b"x"]}),  # an item's length in two bytes
    ]
    for blob, expected in cases:
        assert scan([blob]) is None
        memory = WorkingMemory([blob])
        assert contents(memory) == expected
        assert joined(memory) == proto_blob(expected)


def test_a_newer_schema_version_and_a_damaged_blob_are_refused() -> None:
    newer = MemoryState(schema_version=MEMORY_SCHEMA_VERSION + 1).SerializeToString()
    with pytest.raises(StateSchemaError):
        WorkingMemory([newer]).keys()
    for damaged in (proto_blob({"a": b"1234"})[:-2], ring_blob(b"\x0a\x05x")):
        assert scan([damaged]) is None
        with pytest.raises(DecodeError):
            WorkingMemory([damaged]).keys()


def test_the_cap_holds_over_committed_slots_that_were_never_decoded() -> None:
    big = MEMORY_CAP_BYTES - 100
    blob = proto_blob({"big": bytes(big), "small": b"1"})
    memory = WorkingMemory([blob])
    assert memory.size == len(blob)
    with pytest.raises(MemoryLimitError):
        memory.set("more", bytes(200))
    with pytest.raises(MemoryLimitError):
        memory.append("small-ring", bytes(200))
    assert not memory.changed and memory.keys() == ["big", "small"]
    memory.set("small", bytes(50))
    assert memory.size == len(joined(memory)) <= MEMORY_CAP_BYTES
    memory.delete("big")
    memory.set("more", bytes(200))
    assert joined(memory) == proto_blob({"more": bytes(200), "small": bytes(50)})


def test_literal_bytes_of_a_small_memory() -> None:
    # What MemoryState(...).SerializeToString(deterministic=True) writes for these slots.
    golden = bytes.fromhex("080112050a01611200120a0a01621a050a000a017812050a01631a00")
    slots: dict[str, Content] = {"a": b"", "b": [b"", b"x"], "c": []}
    assert b"".join(encode_memory(dict(slots))) == golden
    memory = WorkingMemory([golden])
    assert contents(memory) == slots and memory.size == len(golden)
    memory.append("c", b"y")
    changed = "080112050a01611200120a0a01621a050a000a017812080a01631a030a0179"
    assert joined(memory) == bytes.fromhex(changed)


LARGE = _memory_wire.LARGE_CONTENT_BYTES


def test_large_contents_are_elements_of_their_own_and_the_elements_join_to_the_proto() -> None:
    value, ring = bytes(range(256)) * (LARGE // 256), [b"r" * LARGE]
    slots: dict[str, Content] = {"a": b"small", "big": value, "c": b"x" * 10, "ring": ring}
    elements = encode_memory(dict(slots))
    assert b"".join(elements) == proto_blob(slots)
    # [version, a, big's header] [big] [c, ring's header] [ring]
    assert len(elements) == 4 and elements[0][:2] == b"\x08\x01"
    assert elements[1] is value  # the agent's own bytes object: not copied
    assert elements[3] == RingItems(items=ring).SerializeToString()
    assert contents(WorkingMemory(elements)) == slots
    scanned = scan(elements)
    assert scanned is not None and scanned["big"].content is value
    assert scanned["big"].decode() is value  # read back without a copy either


def test_a_commit_reuses_untouched_large_elements_and_writes_only_what_changed() -> None:
    big, other = b"b" * (LARGE * 4), b"o" * (LARGE * 2)
    first = WorkingMemory(None)
    first.set("big", big)
    first.set("other", other)
    committed = first.encode()
    memory = WorkingMemory(committed)
    memory.set("other", b"o2" * LARGE)
    memory.set("new", b"n")
    elements = memory.encode()
    # The untouched slot's value is the committed element itself: nothing rewrote or copied it.
    assert any(element is committed[1] for element in elements)
    assert b"".join(elements) == proto_blob({"big": big, "other": b"o2" * LARGE, "new": b"n"})


def test_memory_read_as_one_blob_is_split_once() -> None:
    slots: dict[str, Content] = {"big": b"B" * (LARGE * 2), "small": b"s"}
    blob = proto_blob(slots)
    memory = WorkingMemory([blob])
    assert contents(memory) == slots and memory.size == len(blob)
    memory.set("small", b"t")
    elements = memory.encode()
    assert len(elements) == 3 and elements[0][:2] == b"\x08\x01" and elements[1] == slots["big"]
    again = WorkingMemory(elements)
    again.set("small", b"u")
    assert again.encode()[1] is elements[1]


@settings(max_examples=200, deadline=None)
@given(memories, st.lists(st.integers(min_value=0, max_value=10_000), max_size=6))
def test_a_blob_cut_anywhere_reads_the_same_slots(
    slots: dict[str, Content], cuts: list[int]
) -> None:
    blob = proto_blob(slots)
    points = sorted({cut % (len(blob) + 1) for cut in cuts} | {0, len(blob)})
    elements = [blob[start:end] for start, end in itertools.pairwise(points)]
    memory = WorkingMemory(elements or None)
    assert contents(memory) == slots
    assert joined(memory) == proto_blob(slots)
    memory.set("added", b"+")
    assert joined(memory) == proto_blob({**slots, "added": b"+"})


def test_elements_split_where_the_encoder_never_splits_are_read_through_the_proto() -> None:
    blob = proto_blob({"a": b"x" * 40, "b": b"y" * 40})
    middle = blob.index(b"y" * 40) + 10
    for elements in ([blob[:middle], blob[middle:]], [blob[:5], b"", blob[5:]], [b"", blob]):
        assert scan(elements) is None
        assert contents(WorkingMemory(elements)) == {"a": b"x" * 40, "b": b"y" * 40}


def test_literal_elements_of_a_split_memory() -> None:
    value = bytes(LARGE)
    elements = encode_memory({"a": b"1", "big": value})
    # schema_version 1, slot "a" = "1", then big's header: its field's length, its key, its
    # value's length; then the value itself, as the agent gave it.
    assert elements[0] == bytes.fromhex("080112060a0161120131128980010a0362696712808001")
    assert elements[1] is value and len(elements) == 2
    (whole,) = encode_memory({"a": b"1"})
    assert whole == bytes.fromhex("080112060a0161120131")
