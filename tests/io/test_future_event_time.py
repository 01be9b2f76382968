"""One envelope stamped far in the future does not move event time past now (issue 42).

Publish takes event times up to year 9999. ``ReadEnvelopes`` caps the watermark it reports at
its own clock, so one envelope stamped year 9000 cannot fire every key's idle timer
(``AgentConfig(ttl_ms=...)``) on a runner that follows the reader's watermark; the envelope is
delivered with an ERROR line. The reader runs here as a runner drives it: a real effector, a
real offset tracker and Beam's manual watermark estimator.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker
from apache_beam.utils.timestamp import Timestamp
from effector_harness import BackgroundEffector

from beam_agents._protos import AgentEnvelope
from beam_agents.io import ReadEnvelopes

LOGGER = "beam_agents.io.effector_link"
YEAR_9000_MS = 221_845_392_000_000
"""9000-01-01T00:00:00Z: inside years 1-9999, so Publish takes it."""
LAG_S = 60.0


def read_once(effector: BackgroundEffector, events: list[AgentEnvelope]) -> tuple[list[Any], Any]:
    """Publish ``events``, then one poll of the reader: what it emitted, and its watermark."""
    transform = ReadEnvelopes(
        effector.address, events=events, poll_wait_ms=50, watermark_lag_s=LAG_S
    )
    [start] = transform._publish_fn.process(b"")
    reader = transform._read_fn
    tracker = RestrictionTrackerView(
        ThreadsafeRestrictionTracker(OffsetRestrictionTracker(OffsetRange(start, 2**62)))
    )
    watermark = ManualWatermarkEstimator(None)
    reader.setup()
    try:
        emitted = list(reader.process(start, tracker=tracker, watermark=watermark))
    finally:
        reader.teardown()
    return emitted, watermark.current_watermark()


def test_a_year_9000_envelope_does_not_move_the_watermark_past_the_clock(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    now_ms = int(time.time() * 1000)
    events = [
        AgentEnvelope(entity_key=b"waiting", event_time_ms=now_ms, external_event=b"go"),
        AgentEnvelope(entity_key="9000-\u202e".encode(), event_time_ms=YEAR_9000_MS),
        AgentEnvelope(entity_key=b"next", event_time_ms=now_ms + 1, external_event=b"go"),
    ]
    events[1].external_event = b"from the future"
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        emitted, watermark = read_once(effector, events)
        after = Timestamp.now()
    # Every envelope is delivered at its own event time, the year-9000 one included.
    assert [value.timestamp.micros // 1000 for value in emitted] == [
        event.event_time_ms for event in events
    ]
    assert watermark <= after - LAG_S
    assert watermark >= Timestamp(micros=now_ms * 1000) - LAG_S
    future = [
        r.getMessage() for r in caplog.records if "ahead of this worker's clock" in str(r.msg)
    ]
    assert len(future) == 1, future
    assert "offset 2 " in future[0] and str(YEAR_9000_MS) in future[0]
    assert "0x" + events[1].entity_key.hex() in future[0]

    # An envelope from the past still moves the watermark to its own time, quietly.
    caplog.clear()
    past = AgentEnvelope(entity_key=b"past", event_time_ms=now_ms - 600_000, external_event=b"p")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        _, watermark = read_once(effector, [past])
    assert watermark == Timestamp(micros=past.event_time_ms * 1000) - LAG_S
    assert not [r for r in caplog.records if r.name == LOGGER]
