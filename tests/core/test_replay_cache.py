"""The replay cache helpers: position-keyed entries, bounds, and rebuilt responses."""

from __future__ import annotations

import asyncio

from beam_agents._protos import ModelCache, ModelCacheEntry
from beam_agents.core.model_calls import (
    ENTITY_KEY_SPELLED_MAX,
    ReplayCache,
    cache_key_for_digest,
    replay_cache_key,
    replayed_response,
)
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with_tool_calls

REQUEST = LlmRequest(model_id="m", messages=[{"role": "user", "content": "hi"}])


def entry(name: str, size: int = 10) -> ModelCacheEntry:
    return ModelCacheEntry(cache_key=name, seq=0, step_index=0, response=b"x" * size)


def test_the_cache_key_depends_on_content_and_position() -> None:
    base = replay_cache_key(REQUEST, b"k", 0, 0)
    assert base == replay_cache_key(REQUEST, b"k", 0, 0)
    other = LlmRequest(model_id="m", messages=[{"role": "user", "content": "bye"}])
    assert (
        len(
            {
                base,
                replay_cache_key(other, b"k", 0, 0),
                replay_cache_key(REQUEST, b"k", 0, 1),
                replay_cache_key(REQUEST, b"k", 1, 0),
                replay_cache_key(REQUEST, b"j", 0, 0),
            }
        )
        == 5
    )


def test_the_cache_key_is_the_request_digest_and_the_position_unambiguously() -> None:
    digest = REQUEST.content_digest()
    assert replay_cache_key(REQUEST, b"k", 0, 0).startswith(digest)
    long_key = b"x" * (ENTITY_KEY_SPELLED_MAX + 1)
    positions = [
        (key, seq, step)
        for key in (b"", b"\x00", b"1", b"11", b"1:1", long_key, long_key + b"y")
        for seq in (0, 1, 11, 111)
        for step in (0, 1, 11)
    ]
    keys = {cache_key_for_digest(digest, *position) for position in positions}
    assert len(keys) == len(positions)
    # Bounded: a long entity key costs no more than the longest spelled one.
    longest = max(len(key) for key in keys)
    assert longest <= len(digest) + 2 * ENTITY_KEY_SPELLED_MAX + 16
    assert len(cache_key_for_digest(digest, b"k" * 10_000, 1, 1)) <= longest


def test_recorded_entries_are_found_and_survive_encoding() -> None:
    cache = ReplayCache(None, max_entries=10, max_bytes=10_000)
    assert cache.lookup("a") is None and not cache.changed
    cache.record(entry("a"))
    assert cache.changed and cache.lookup("a") == entry("a")
    again = ReplayCache(ModelCache.FromString(cache.encode()), max_entries=10, max_bytes=10_000)
    assert again.lookup("a") == entry("a") and not again.changed


def test_the_entry_bound_evicts_the_oldest_entries() -> None:
    cache = ReplayCache(None, max_entries=3, max_bytes=10_000)
    for name in "abcde":
        cache.record(entry(name))
    kept = ModelCache.FromString(cache.encode())
    assert [e.cache_key for e in kept.entries] == ["c", "d", "e"]


def test_the_byte_bound_evicts_the_oldest_entries() -> None:
    cache = ReplayCache(None, max_entries=100, max_bytes=100)
    for name in "abcd":
        cache.record(entry(name, size=30))
    blob = cache.encode()
    assert len(blob) <= 100
    assert [e.cache_key for e in ModelCache.FromString(blob).entries] == ["c", "d"]


def test_an_entry_larger_than_the_byte_bound_is_not_kept() -> None:
    cache = ReplayCache(None, max_entries=10, max_bytes=50)
    cache.record(entry("big", size=500))
    assert cache.encode() == b""


def test_a_replayed_response_is_decoded_by_the_client_with_the_recorded_usage() -> None:
    fake = FakeLLM([(match_any(), respond_with_tool_calls([("lookup", {"id": 7})], text="t"))])
    raw = asyncio.run(fake.complete(REQUEST)).response
    stored = ModelCacheEntry(cache_key="k", response=raw, input_tokens=5, output_tokens=2)
    response = replayed_response(fake, stored)
    assert response.tool_calls[0].name == "lookup"
    assert dict(response.tool_calls[0].arguments) == {"id": 7}
    assert (response.usage.input_tokens, response.usage.output_tokens) == (5, 2)
    plain = replayed_response(object(), ModelCacheEntry(response=b"plain text"))
    assert plain.text == "plain text"


def committed_cache(*entries: ModelCacheEntry) -> tuple[ModelCache, bytes]:
    blob = ModelCache(schema_version=1, entries=entries).SerializeToString(deterministic=True)
    return ModelCache.FromString(blob), blob


def test_recording_a_committed_key_replaces_it_as_the_newest_and_leaves_the_input_alone() -> None:
    committed, blob = committed_cache(entry("a"), entry("b"), entry("c"))
    cache = ReplayCache(committed, max_entries=10, max_bytes=10_000, serialized=blob)
    assert cache.lookup("b") == entry("b") and len(cache) == 3
    cache.record(entry("a", size=3))
    assert cache.lookup("a") == entry("a", size=3) and len(cache) == 3
    kept = ModelCache.FromString(cache.encode())
    assert [e.cache_key for e in kept.entries] == ["b", "c", "a"]
    assert kept.entries[-1].response == b"xxx"
    assert committed.SerializeToString(deterministic=True) == blob


def test_a_key_found_only_inside_a_stored_response_is_a_miss() -> None:
    stored = ModelCacheEntry(cache_key="k1", response=b"the answer mentions k2")
    committed, blob = committed_cache(stored)
    for serialized in (blob, None):
        cache = ReplayCache(committed, max_entries=10, max_bytes=10_000, serialized=serialized)
        assert cache.lookup("k2") is None and cache.lookup("k3") is None
        assert cache.lookup("k1") == stored


def test_new_entries_are_appended_after_the_committed_ones_within_the_bounds() -> None:
    committed, blob = committed_cache(entry("a"), entry("b"))
    cache = ReplayCache(committed, max_entries=3, max_bytes=10_000, serialized=blob)
    cache.record(entry("c"))
    cache.record(entry("d"))
    kept = ModelCache.FromString(cache.encode())
    assert [e.cache_key for e in kept.entries] == ["b", "c", "d"]
    assert kept.schema_version == 1
