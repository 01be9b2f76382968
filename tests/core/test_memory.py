"""Working memory: slots and rings, staged writes, deterministic encoding, the 1 MiB cap."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_agents._protos import MemoryState
from beam_agents.core.agent import MemoryLimitError, MemorySlotError, StateSchemaError
from beam_agents.core.context import WorkingMemory
from beam_agents.core.state import MEMORY_CAP_BYTES


def reload(memory: WorkingMemory) -> WorkingMemory:
    return WorkingMemory(memory.encode() or None)


def blob(memory: WorkingMemory) -> bytes:
    """The serialized ``MemoryState``: the memory's elements joined."""
    return b"".join(memory.encode())


def test_values_round_trip_through_the_encoded_blob() -> None:
    memory = WorkingMemory(None)
    memory.set("b", b"2")
    memory.set("a", b"1")
    memory.append("log", b"x")
    again = reload(memory)
    assert again.get("a") == b"1" and again.get("b") == b"2"
    assert again.ring("log") == [b"x"]
    assert again.keys() == ["a", "b", "log"]
    assert again.get("missing") is None and again.ring("missing") == []


def test_encoding_sorts_slots_so_equal_memories_have_equal_bytes() -> None:
    first, second = WorkingMemory(None), WorkingMemory(None)
    first.set("a", b"1")
    first.set("b", b"2")
    second.set("b", b"2")
    second.set("a", b"1")
    assert first.encode() == second.encode()
    slots = MemoryState.FromString(blob(first)).slots
    assert [slot.key for slot in slots] == ["a", "b"]


def test_a_ring_keeps_only_the_newest_items() -> None:
    memory = WorkingMemory(None)
    for item in (b"1", b"2", b"3", b"4"):
        memory.append("recent", item, max_items=3)
    assert memory.ring("recent") == [b"2", b"3", b"4"]


def test_delete_removes_a_slot_and_deleting_nothing_changes_nothing() -> None:
    memory = WorkingMemory(None)
    memory.delete("nothing")
    assert not memory.changed
    memory.set("a", b"1")
    memory.delete("a")
    assert memory.changed and memory.keys() == [] and memory.encode() == []


def test_reads_do_not_count_as_changes_and_an_untouched_blob_is_not_decoded() -> None:
    committed = WorkingMemory(None)
    committed.set("a", b"1")
    memory = WorkingMemory(committed.encode())
    assert memory.get("a") == b"1"
    assert not memory.changed
    # Committed memory is never looked at if memory is never used.
    untouched = WorkingMemory(Untouchable())
    assert not untouched.changed
    with pytest.raises(AssertionError, match="looked at"):
        untouched.keys()


class Untouchable(list[bytes]):
    """Committed elements that fail the test if anything reads them."""

    def __getitem__(self, index: object) -> bytes:  # type: ignore[override]
        raise AssertionError("the committed memory was looked at")

    def __iter__(self) -> Iterator[bytes]:
        raise AssertionError("the committed memory was looked at")

    def __len__(self) -> int:
        return 1

    def __bool__(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.set("", b"v"), "non-empty str"),
        (lambda m: m.set("k", "text"), "must be bytes"),
        (lambda m: m.append("k", "text"), "must be bytes"),
        (lambda m: m.append("k", b"v", max_items=0), "max_items"),
        (lambda m: m.get(5), "non-empty str"),
    ],
)
def test_bad_keys_and_values_are_typed_errors(call: object, message: str) -> None:
    memory = WorkingMemory(None)
    with pytest.raises(MemorySlotError, match=message):
        call(memory)  # type: ignore[operator]
    assert not memory.changed


def test_a_slot_is_either_a_value_or_a_ring() -> None:
    memory = WorkingMemory(None)
    memory.set("value", b"v")
    memory.append("ring", b"r")
    with pytest.raises(MemorySlotError, match="ring"):
        memory.get("ring")
    with pytest.raises(MemorySlotError, match="single value"):
        memory.ring("value")
    with pytest.raises(MemorySlotError, match="single value"):
        memory.append("value", b"x")
    memory.set("ring", b"now a value")
    assert memory.get("ring") == b"now a value"


def test_a_write_over_the_cap_raises_and_changes_nothing() -> None:
    memory = WorkingMemory(None)
    memory.set("small", b"s")
    before = memory.encode()
    with pytest.raises(MemoryLimitError, match="over the 1048576-byte cap"):
        memory.set("huge", b"x" * MEMORY_CAP_BYTES)
    assert memory.encode() == before
    assert memory.get("huge") is None


def test_memory_can_be_filled_exactly_up_to_the_cap() -> None:
    memory = WorkingMemory(None)
    memory.set("k", b"")
    room = MEMORY_CAP_BYTES - len(blob(memory))
    # Growing the value by n bytes grows the blob by n plus the growth of its length varints.
    value = b"x" * (room - 6)
    memory.set("k", value)
    size = len(blob(memory))
    assert size <= MEMORY_CAP_BYTES
    with pytest.raises(MemoryLimitError):
        memory.set("k", value + b"x" * (MEMORY_CAP_BYTES - size + 1))


slot_names = st.text(min_size=1, max_size=12)
payloads = st.binary(max_size=300)


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(st.sampled_from(["set", "append", "delete"]), slot_names, payloads),
        max_size=30,
    )
)
def test_size_accounting_matches_the_serialized_size(
    operations: list[tuple[str, str, bytes]],
) -> None:
    memory = WorkingMemory(None)
    for operation, key, payload in operations:
        try:
            if operation == "set":
                memory.set(key, payload)
            elif operation == "append":
                memory.append(key, payload, max_items=4)
            else:
                memory.delete(key)
        except MemorySlotError:
            continue
        # The cap is enforced on the accounted size, so it must equal the real one.
        assert memory.size == len(blob(memory))
    assert reload(memory).keys() == memory.keys()


def test_a_newer_schema_version_is_refused() -> None:
    newer = MemoryState(schema_version=99).SerializeToString()
    with pytest.raises(StateSchemaError, match="schema version 99"):
        WorkingMemory([newer]).keys()


@pytest.mark.parametrize(
    "copy_it", [copy.copy, copy.deepcopy, pickle.dumps], ids=["copy", "deepcopy", "pickle"]
)
def test_a_working_memory_is_never_copied_or_pickled(copy_it: Callable[[object], object]) -> None:
    memory = WorkingMemory(None)
    memory.set("k", b"v")
    with pytest.raises(TypeError, match="belongs to its activation"):
        copy_it(memory)
