"""Agent outcomes, the deterministic intent id, and the fast uuid5 it is built on."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beam_agents import Complete, FallbackContext, Suspend, intent_id_for
from beam_agents.core.agent import INTENT_NAMESPACE, uuid5_hex
from beam_agents.core.observability import trace_id_for


def test_the_intent_namespace_is_the_documented_constant() -> None:
    assert uuid.uuid5(uuid.NAMESPACE_URL, "urn:beam-agents:intent") == INTENT_NAMESPACE


def test_intent_id_is_uuid5_of_key_hex_seq_and_step() -> None:
    expected = str(uuid.uuid5(INTENT_NAMESPACE, f"{b'acct-1'.hex()}|0|0"))
    assert intent_id_for(b"acct-1", 0, 0) == expected
    assert intent_id_for(b"acct-1", 0, 1) != expected
    assert intent_id_for(b"acct-1", 1, 0) != expected
    assert intent_id_for(b"acct-2", 0, 0) != expected


@given(st.binary(max_size=40), st.integers(0, 2**40), st.integers(0, 2**20))
def test_fast_uuid5_matches_the_standard_library(key: bytes, seq: int, step: int) -> None:
    name = f"{key.hex()}|{seq}|{step}"
    assert uuid5_hex(INTENT_NAMESPACE, name) == uuid.uuid5(INTENT_NAMESPACE, name).hex
    assert intent_id_for(key, seq, step) == str(uuid.uuid5(INTENT_NAMESPACE, name))
    name_bytes = b"%d|%d|" % (seq, len(key)) + key
    expected_trace = hashlib.blake2b(name_bytes, digest_size=16, person=b"beam-agents.tr")
    assert trace_id_for(key, seq) == expected_trace.hexdigest()


@given(st.binary(max_size=8), st.binary(max_size=8), st.integers(0, 99), st.integers(0, 99))
def test_trace_ids_of_different_runs_differ(a: bytes, b: bytes, seq_a: int, seq_b: int) -> None:
    if (a, seq_a) != (b, seq_b):
        assert trace_id_for(a, seq_a) != trace_id_for(b, seq_b)
    assert trace_id_for(a, seq_a, "x") != trace_id_for(a, seq_a)
    assert trace_id_for(a, seq_a, "x") != trace_id_for(a, seq_a, "x|")


def test_complete_requires_bytes_output() -> None:
    assert Complete().output == b""
    with pytest.raises(TypeError, match=r"Complete.output must be bytes, got str"):
        Complete(output="text")  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_ms", [0, -5, 1.5, True])
def test_suspend_rejects_a_timeout_that_is_not_a_positive_int(timeout_ms: object) -> None:
    with pytest.raises(ValueError, match=r"Suspend\.timeout_ms"):
        Suspend(timeout_ms=timeout_ms)  # type: ignore[arg-type]


def test_suspend_checks_snapshot_and_adapter_types() -> None:
    assert Suspend(snapshot=b"s", adapter="a", timeout_ms=5).timeout_ms == 5
    with pytest.raises(TypeError, match="snapshot"):
        Suspend(snapshot="s")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="adapter"):
        Suspend(adapter=b"a")  # type: ignore[arg-type]


def test_fallback_context_carries_what_a_route_decides_on() -> None:
    fallback = FallbackContext(
        entity_key=b"k",
        seq=3,
        snapshot=b"s",
        deadline_ms=10,
        fired_at_ms=10,
        pending_intent_ids=frozenset({"a"}),
    )
    assert fallback.pending_intent_ids == frozenset({"a"})
    with pytest.raises(AttributeError):
        fallback.seq = 4  # type: ignore[misc]
