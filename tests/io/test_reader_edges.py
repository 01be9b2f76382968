"""ReadEnvelopes at the edges: records no pipeline can timestamp, progress lines, idle waits.

A record in the log whose event time is outside years 1-9999 is skipped loudly and the
envelopes around it are delivered. The reader says how far it got, and an idle reader that
does not stop says which approvals it waits for.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import grpc
import pytest
from effector_harness import BackgroundEffector, make_intent

from beam_agents._protos import AgentEnvelope, ToolIntent, ToolResult
from beam_agents.core.observability import progress_line
from beam_agents.io import ReadEnvelopes
from effector.client import EffectorClient
from effector.store import open_store
from tests.io.io_harness import Collector, counter, run_pipeline

LOGGER = "beam_agents.io.effector_link"
PROGRESS = "beam_agents.progress"


def envelope(key: bytes, at_ms: int, payload: bytes = b"e") -> AgentEnvelope:
    return AgentEnvelope(entity_key=key, event_time_ms=at_ms, external_event=payload)


async def _append_to_the_log(url: str, envelopes: list[AgentEnvelope]) -> None:
    """Write envelopes straight into the store's log, past any check at the API."""
    store = await open_store(url)
    try:
        await store.publish(envelopes, 1_000)
    finally:
        await store.close()


def lines(caplog: pytest.LogCaptureFixture, level: int, logger: str = LOGGER) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


def test_envelopes_beam_cannot_timestamp_are_skipped_loudly_and_the_rest_delivered(
    store_url: str, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = [envelope(b"k-%d" % n, 1_000 * (n + 1), b"good-%d" % n) for n in range(5)]
    far_future = envelope(b"far-\xe2\x80\xae", 2**62, b"bad")
    before_time = envelope(b"before", -(2**63), b"bad")
    stored = [good[0], far_future, good[1], before_time, good[2]]
    asyncio.run(_append_to_the_log(store_url, stored))
    collector = Collector.new()
    with BackgroundEffector(store_url) as effector, caplog.at_level(logging.INFO, logger=LOGGER):
        with EffectorClient(effector.address) as client:
            # Through Publish too: refused there, or appended and skipped by the reader.
            client.publish_report([good[3], envelope(b"far", 2**62), good[4]])
        transform = ReadEnvelopes(
            effector.address, start_offset=1, stop_when_idle_s=0.5, poll_wait_ms=50
        )
        result = run_pipeline(lambda pipeline: pipeline | transform | collector.sink())
    delivered = [value for value, _ in collector.timestamped()]
    assert [env.external_event for _, env in delivered] == [b"good-%d" % n for n in range(5)]
    timestamps = [micros for _, micros in collector.timestamped()]
    assert timestamps == [1_000_000 * (n + 1) for n in range(5)]
    skipped = [line for line in lines(caplog, logging.ERROR) if "skipped the envelope" in line]
    assert len(skipped) >= 2 and counter(result, "envelopes_skipped") == len(skipped)
    assert any(
        "offset 2" in line and str(2**62) in line and "0x" + far_future.entity_key.hex() in line
        for line in skipped
    )
    assert any("offset 4" in line and str(-(2**63)) in line for line in skipped)


def test_initial_events_out_of_time_range_are_refused_when_the_transform_is_built() -> None:
    for at_ms in (2**62, -(2**63), 253_402_300_800_000):
        with pytest.raises(ValueError, match=r"event 1: event_time_ms .* outside years 1-9999"):
            ReadEnvelopes("127.0.0.1:1", events=[envelope(b"k", 1), envelope(b"k", at_ms)])


def test_the_reader_says_how_far_it_got(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    events = [envelope(b"k-%d" % n, 1_000 + n) for n in range(3)]
    transform = ReadEnvelopes(
        effector.address,
        events=events,
        stop_when_idle_s=1.0,
        poll_wait_ms=50,
        progress_interval_s=0.2,
    )
    with caplog.at_level(logging.INFO, logger=PROGRESS):
        run_pipeline(lambda pipeline: pipeline | transform | Collector.new().sink())
    progress = [line for line in lines(caplog, logging.INFO, PROGRESS) if "envelope(s)" in line]
    assert progress, "no progress line"
    assert re.search(
        r"^ReadEnvelopes: 3 envelope\(s\) read, next offset 4; effector: 0 intent\(s\) in "
        r"flight \(0 awaiting a decision\), 0 done, log head 3$",
        progress[-1],
    ), progress


def test_progress_goes_to_stderr_when_info_lines_are_not_logged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logger = logging.getLogger(PROGRESS)
    previous = logger.level
    logger.setLevel(logging.WARNING)
    try:
        progress_line("ReadEnvelopes: 7 envelope(s) read")
    finally:
        logger.setLevel(previous)
    assert capsys.readouterr().err == "ReadEnvelopes: 7 envelope(s) read\n"
    with pytest.raises(ValueError, match="progress_interval_s must be positive"):
        ReadEnvelopes("127.0.0.1:1", progress_interval_s=0)


def test_an_idle_reader_held_by_an_approval_says_which_until_it_expires(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    approval = make_intent(
        "", {"to": "acct-\u202e4321"}, key=b"held", kind=ToolIntent.APPROVAL, ttl_ms=3_000
    )
    with EffectorClient(effector.address) as client:
        client.submit([approval])
    collector = Collector.new()
    transform = ReadEnvelopes(
        effector.address,
        events=[envelope(b"k", 1_000)],
        stop_when_idle_s=0.5,
        poll_wait_ms=50,
        progress_interval_s=0.5,
    )
    with caplog.at_level(logging.INFO, logger=PROGRESS):
        run_pipeline(lambda pipeline: pipeline | transform | collector.sink())
    waits = [line for line in lines(caplog, logging.INFO, PROGRESS) if "not stopping" in line]
    assert waits, "an idle reader held by an approval said nothing"
    assert "1 awaiting a decision" in waits[0] and approval.intent_id in waits[0]
    assert "(key held)" in waits[0]
    # It stopped once the approval expired and its result was read.
    [_, (_, expired)] = collector.values()
    assert expired.tool_result.intent_id == approval.intent_id
    assert expired.tool_result.status == ToolResult.EXPIRED


def test_envelopes_too_large_to_read_together_are_read_one_answer_at_a_time(
    store_url: str, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two 9 MiB events side by side (issue 42): one Read could not carry both."""
    huge = [envelope(b"huge-%d" % n, 2_000 + n, bytes([65 + n]) * (9 << 20)) for n in range(2)]
    small = [envelope(b"small-%d" % n, 1_000 + n, b"s") for n in range(2)]
    asyncio.run(_append_to_the_log(store_url, [small[0], *huge, small[1]]))
    collector = Collector.new()
    with BackgroundEffector(store_url) as effector:
        transform = ReadEnvelopes(
            effector.address, start_offset=1, stop_when_idle_s=0.5, poll_wait_ms=50
        )
        run_pipeline(lambda pipeline: pipeline | transform | collector.sink())
    read = [env for _, env in collector.values()]
    assert [env.entity_key for env in read] == [b"small-0", b"huge-0", b"huge-1", b"small-1"]
    assert [len(env.external_event) for env in read] == [1, 9 << 20, 9 << 20, 1]


class _TooLarge(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return "Received message larger than max (18900000 vs. 16777216)"


def test_against_an_effector_that_does_not_bound_its_answers_the_reader_asks_for_less(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = ReadEnvelopes("127.0.0.1:1", max_batch=500)._read_fn
    reader.setup()
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            halvings = 0
            while reader._ask_for_less(_TooLarge(), 7):
                halvings += 1
        assert reader._batch_limit == 1 and halvings == 8  # 500 -> 250 -> ... -> 1
        assert "asking for at most 1 envelope(s) per read" in caplog.messages[-1]
        assert "from offset 7" in caplog.messages[-1]
    finally:
        reader.teardown()
