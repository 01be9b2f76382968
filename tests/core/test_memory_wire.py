"""Working memory's wire format: golden bytes against the proto, lazy slots, the cap."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_agents._protos import MemorySlot, MemoryState, RingItems
from beam_agents.core import _memory_wire
from beam_agents.core._memory_wire import MEMORY_SCHEMA_VERSION, RawSlot, encode_memory, scan
from beam_agents.core.errors import MemoryLimitError, MemorySlotError, StateSchemaError
from beam_agents.core.memory import MEMORY_CAP_BYTES, WorkingMemory

Content = bytes | list[bytes]


def proto_blob(slots: dict[str, Content]) -> bytes:
    """What the runtime wrote before the wire encoder: the generated proto, serialized."""
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
slot_contents = st.one_of(values, st.lists(values, max_size=5))
memories = st.dictionaries(keys, slot_contents, max_size=8)


@pytest.mark.parametrize("slots", MEMORIES)
def test_the_encoder_writes_the_protos_bytes(slots: dict[str, Content]) -> None:
    assert encode_memory(dict(slots)) == proto_blob(slots)
    memory = WorkingMemory(None)
    for key, content in slots.items():
        if isinstance(content, bytes):
            memory.set(key, content)
        else:
            for item in content:
                memory.append(key, item, max_items=max(1, len(content)))
            if not content:  # an empty ring only comes from a blob: set it up there
                memory = WorkingMemory(proto_blob(slots))
                break
    assert memory.encode() == proto_blob(slots)


@pytest.mark.parametrize("slots", MEMORIES)
def test_a_proto_blob_reads_back_and_re_encodes_unchanged(slots: dict[str, Content]) -> None:
    blob = proto_blob(slots)
    memory = WorkingMemory(blob or None)
    assert memory.size == len(blob)
    assert contents(memory) == slots
    assert WorkingMemory(blob or None).encode() == blob
    assert sum(memory.slot_sizes.values()) + 2 * bool(slots) == len(blob)


@settings(max_examples=200, deadline=None)
@given(memories, memories, st.sets(keys, max_size=4))
def test_changing_some_slots_encodes_as_the_proto_would(
    before: dict[str, Content], writes: dict[str, Content], deletes: set[str]
) -> None:
    memory = WorkingMemory(proto_blob(before) or None)
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
    assert memory.encode() == proto_blob(after)
    assert memory.size == (len(proto_blob(after)) if after else 0)
    assert contents(WorkingMemory(memory.encode() or None)) == after


def test_untouched_slots_are_neither_decoded_nor_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    committed: dict[str, Content] = {
        "a": b"1" * 1000,
        "b": [b"2"],
        "c": b"3" * 1000,
        "d": [b"4", b"5" * 300],
        "e": b"6" * 200,
    }
    blob = proto_blob(committed)
    slots = scan(blob)
    assert slots is not None and all(slot.field.obj is blob for slot in slots.values())

    def refuse(self: RawSlot) -> Content:
        raise AssertionError("an untouched slot was decoded")

    class Unparsable:
        def __getattr__(self, name: str) -> object:
            raise AssertionError("a ring was parsed")

    monkeypatch.setattr(_memory_wire, "RingItems", Unparsable())  # the scan walks rings unparsed
    memory = WorkingMemory(blob)
    assert memory.get("a") == committed["a"]
    monkeypatch.setattr(RawSlot, "decode", refuse)
    memory.set("b", b"new")
    memory.delete("c")
    assert memory.keys() == ["a", "b", "d", "e"]
    expected = {"a": committed["a"], "b": b"new", "d": committed["d"], "e": committed["e"]}
    assert memory.encode() == proto_blob(expected)


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
        assert scan(blob) is None
        memory = WorkingMemory(blob)
        assert contents(memory) == expected
        assert memory.encode() == proto_blob(expected)


def test_a_newer_schema_version_and_a_damaged_blob_are_refused() -> None:
    newer = MemoryState(schema_version=MEMORY_SCHEMA_VERSION + 1).SerializeToString()
    with pytest.raises(StateSchemaError):
        WorkingMemory(newer).keys()
    for damaged in (proto_blob({"a": b"1234"})[:-2], ring_blob(b"\x0a\x05x")):
        assert scan(damaged) is None
        with pytest.raises(DecodeError):
            WorkingMemory(damaged).keys()


def test_the_cap_holds_over_committed_slots_that_were_never_decoded() -> None:
    big = MEMORY_CAP_BYTES - 100
    blob = proto_blob({"big": bytes(big), "small": b"1"})
    memory = WorkingMemory(blob)
    assert memory.size == len(blob)
    with pytest.raises(MemoryLimitError):
        memory.set("more", bytes(200))
    with pytest.raises(MemoryLimitError):
        memory.append("small-ring", bytes(200))
    assert not memory.changed and memory.keys() == ["big", "small"]
    memory.set("small", bytes(50))
    assert memory.size == len(memory.encode()) <= MEMORY_CAP_BYTES
    memory.delete("big")
    memory.set("more", bytes(200))
    assert memory.encode() == proto_blob({"more": bytes(200), "small": bytes(50)})


def test_literal_bytes_of_a_release_before_the_wire_encoder() -> None:
    # Written by MemoryState(...).SerializeToString(deterministic=True) before this encoder.
    golden = bytes.fromhex("080112050a01611200120a0a01621a050a000a017812050a01631a00")
    slots: dict[str, Content] = {"a": b"", "b": [b"", b"x"], "c": []}
    assert encode_memory(dict(slots)) == golden
    memory = WorkingMemory(golden)
    assert contents(memory) == slots and memory.size == len(golden)
    memory.append("c", b"y")
    changed = "080112050a01611200120a0a01621a050a000a017812080a01631a030a0179"
    assert memory.encode() == bytes.fromhex(changed)
