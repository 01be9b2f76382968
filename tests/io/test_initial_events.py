"""``ReadEnvelopes(events=...)``: initial events the effector refuses are loud, never a replay."""

from __future__ import annotations

import logging

import pytest
from effector_harness import BackgroundEffector

from beam_agents._protos import MAX_ENTITY_KEY_BYTES, MAX_ENVELOPE_BYTES, AgentEnvelope
from beam_agents.io import EffectorConnection, ReadEnvelopes
from beam_agents.io.effector_link import _PublishInitialEventsFn
from effector.client import EffectorClient


def event(key: bytes, payload: bytes = b"e", at_ms: int = 1_000) -> AgentEnvelope:
    return AgentEnvelope(entity_key=key, event_time_ms=at_ms, external_event=payload)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (event(b"k" * (MAX_ENTITY_KEY_BYTES + 1)), "entity_key of 4097 bytes"),
        (event(b""), "empty entity_key"),
        (event(b"k", b"x" * MAX_ENVELOPE_BYTES), "-byte limit of one envelope"),
        (event(b"k", at_ms=2**62), "outside years 1-9999"),
    ],
)
def test_an_event_the_effector_would_refuse_is_refused_at_construction(
    bad: AgentEnvelope, problem: str
) -> None:
    with pytest.raises(ValueError, match="event 1") as refused:
        ReadEnvelopes("127.0.0.1:1", events=[event(b"fine"), bad])
    assert problem in str(refused.value)


def test_a_refused_first_event_is_logged_and_reading_starts_at_the_first_accepted(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    """Yesterday's log must not be read again because today's first event was refused."""
    with EffectorClient(effector.address) as client:
        client.publish([event(b"yesterday")])  # offset 1: must not be read again
    too_long = event(b"k" * (MAX_ENTITY_KEY_BYTES + 1)).SerializeToString()
    fine = event(b"today").SerializeToString()
    publish = _PublishInitialEventsFn(EffectorConnection(effector.address), [too_long, fine], None)
    with caplog.at_level(logging.ERROR, logger="beam_agents.io.effector_link"):
        [start] = list(publish.process(b""))
    assert start == 2  # "today": the refused event took no offset, and "yesterday" is 1
    [line] = [r.getMessage() for r in caplog.records if "refused initial event" in r.getMessage()]
    assert "initial event 0" in line and "4097 bytes" in line
    everything_refused = _PublishInitialEventsFn(
        EffectorConnection(effector.address), [too_long], None
    )
    with pytest.raises(ValueError, match="refused every one of the 1 initial events"):
        list(everything_refused.process(b""))
