"""The link sends without waiting where it can: intents early, the next read ahead.

``SubmitIntents`` sends a bundle's first intent at once and full batches as they fill, one
call at a time, and waits for the answers only when the bundle ends. ``ReadEnvelopes`` sends
the next ``Read`` before its bundle ends; the next poll takes it if it is for that offset and
still waiting or answered with envelopes, then reads what arrived since without waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_agents._protos import (
    AgentEnvelope,
    EnvelopeRecord,
    ReadRequest,
    ReadResponse,
    SubmitAck,
    SubmitRequest,
    SubmitResponse,
)
from beam_agents.io import ReadEnvelopes, SubmitIntents
from tests.io.io_harness import record_intent

_LOG_END = 2**62


class _Call:
    """A call sent without waiting, answered when the test says so."""

    def __init__(self, request: Any, log: list[str]) -> None:
        self.request = request
        self.cancelled = False
        self._log = log
        self._response: Any = None

    def answer(self, response: Any) -> None:
        self._response = response

    def done(self) -> bool:
        return self._response is not None

    def exception(self) -> None:
        return None

    def result(self) -> Any:
        assert self._response is not None, "waited for a call nobody answers"
        self._log.append(f"answer {id(self)}")
        return self._response

    def cancel(self) -> None:
        self.cancelled = True


class _Method:
    """A stub method: calls waited for are answered by ``answer``; calls sent without waiting
    are kept as ``_Call``s, answered at once by ``answer_sent`` if given."""

    def __init__(
        self,
        answer: Callable[[Any], Any] | None = None,
        answer_sent: Callable[[Any], Any] | None = None,
    ) -> None:
        self.waited: list[Any] = []
        self.sent: list[_Call] = []
        self.log: list[str] = []
        self._answer = answer
        self._answer_sent = answer_sent

    def __call__(self, request: Any, **options: Any) -> Any:
        assert self._answer is not None, "a call waited for where none was expected"
        self.waited.append(request)
        return self._answer(request)

    def future(self, request: Any, **options: Any) -> _Call:
        call = _Call(request, self.log)
        self.log.append(f"send {id(call)}")
        self.sent.append(call)
        if self._answer_sent is not None and (response := self._answer_sent(request)) is not None:
            call.answer(response)
        return call


def _accepted(request: SubmitRequest) -> SubmitResponse:
    return SubmitResponse(
        acks=[
            SubmitAck(intent_id=intent.intent_id, outcome=SubmitAck.ACCEPTED)
            for intent in request.intents
        ]
    )


def _values(outputs: list[Any]) -> list[Any]:
    return [output.value if isinstance(output, WindowedValue) else output for output in outputs]


class _SubmitStub:
    def __init__(self, answer_sent: Callable[[Any], Any] | None) -> None:
        self.Submit = _Method(answer_sent=answer_sent)


def _process(fn: Any, intent: Any) -> list[Any]:
    return list(fn.process(intent, timestamp=Timestamp(1), window=GlobalWindow()))


def _submit_fn(
    batch_size: int, answer_sent: Callable[[Any], Any] | None = None
) -> tuple[Any, _Method]:
    fn: Any = SubmitIntents("127.0.0.1:1", batch_size=batch_size)._fn
    fn.setup()
    stub = _SubmitStub(answer_sent)
    fn._stub = stub
    fn.start_bundle()
    return fn, stub.Submit


def test_the_first_intent_of_a_bundle_is_sent_at_once_and_the_rest_when_it_ends() -> None:
    fn, submit = _submit_fn(batch_size=256, answer_sent=_accepted)
    try:
        first, second, third = (record_intent(b"k", f"n{seq}", seq=seq) for seq in range(3))
        assert _process(fn, first) == []
        [call] = submit.sent
        assert [i.intent_id for i in call.request.intents] == [first.intent_id]
        assert _process(fn, second) == [] and _process(fn, third) == []
        assert len(submit.sent) == 1  # the others wait for the bundle's end
        acks = _values(list(fn.finish_bundle()))
        [_, rest] = submit.sent
        assert [i.intent_id for i in rest.request.intents] == [second.intent_id, third.intent_id]
        assert [ack.intent_id for ack in acks] == [
            first.intent_id,
            second.intent_id,
            third.intent_id,
        ]
        # One call at a time: the rest went once the first was answered.
        assert submit.log == [
            f"send {id(call)}",
            f"answer {id(call)}",
            f"send {id(rest)}",
            f"answer {id(rest)}",
        ]
        assert submit.waited == []
    finally:
        fn.teardown()


def test_a_full_batch_is_sent_once_the_call_before_it_is_answered() -> None:
    fn, submit = _submit_fn(batch_size=2)
    try:
        intents = [record_intent(b"k", f"n{seq}", seq=seq) for seq in range(3)]
        assert _process(fn, intents[0]) == []
        [first_call] = submit.sent
        first_call.answer(_accepted(first_call.request))
        assert _process(fn, intents[1]) == []
        emitted = _values(_process(fn, intents[2]))  # the batch is full: it goes now
        assert [ack.intent_id for ack in emitted] == [intents[0].intent_id]
        [_, second_call] = submit.sent
        assert [i.intent_id for i in second_call.request.intents] == [
            intents[1].intent_id,
            intents[2].intent_id,
        ]
        # One call at a time: the second was sent after the first was answered.
        assert submit.log == [
            f"send {id(first_call)}",
            f"answer {id(first_call)}",
            f"send {id(second_call)}",
        ]
        second_call.answer(_accepted(second_call.request))
        assert len(list(fn.finish_bundle())) == 2
    finally:
        fn.teardown()


# -- the read sent ahead --------------------------------------------------------------------------


def _records(*offsets: int) -> ReadResponse:
    return ReadResponse(
        records=[
            EnvelopeRecord(
                offset=offset,
                envelope=AgentEnvelope(
                    entity_key=b"k", event_time_ms=1_000 + offset, external_event=b"e"
                ),
            )
            for offset in offsets
        ]
    )


class _ReadStub:
    def __init__(self, answers: dict[tuple[int, int], ReadResponse]) -> None:
        """``answers`` by (from_offset, wait_ms); a read sent ahead that waits is answered by
        the test."""
        self.Read = _Method(
            lambda request: answers[request.from_offset, request.wait_ms],
            lambda request: answers[request.from_offset, 0] if not request.wait_ms else None,
        )


def _reader(answers: dict[tuple[int, int], ReadResponse]) -> tuple[Any, _Method]:
    reader: Any = ReadEnvelopes("127.0.0.1:1", poll_wait_ms=200, progress_interval_s=None)._read_fn
    reader.setup()
    stub = _ReadStub(answers)
    reader._stub = stub
    return reader, stub.Read


def _poll(reader: Any, start: int) -> tuple[list[int], int]:
    """One ``process`` call from ``start``: the offsets emitted, and where the remainder starts."""
    tracker = ThreadsafeRestrictionTracker(OffsetRestrictionTracker(OffsetRange(start, _LOG_END)))
    outputs = list(
        reader.process(
            start, tracker=RestrictionTrackerView(tracker), watermark=ManualWatermarkEstimator(None)
        )
    )
    deferred = tracker.deferred_status()
    assert deferred is not None
    offsets = [envelope.event_time_ms - 1_000 for _, envelope in (o.value for o in outputs)]
    return offsets, deferred[0].start


def test_the_next_read_goes_ahead_and_the_next_poll_takes_it_then_what_came_since() -> None:
    reader, read = _reader({(1, 200): _records(1, 2), (4, 0): _records(4, 5), (6, 200): _records()})
    try:
        assert _poll(reader, 1) == ([1, 2], 3)
        [ahead] = read.sent
        assert (ahead.request.from_offset, ahead.request.wait_ms) == (3, 200)
        ahead.answer(_records(3))
        assert _poll(reader, 3) == ([3, 4, 5], 6)  # 4 and 5 came in a read that did not wait
        assert [(r.from_offset, r.wait_ms) for r in read.waited] == [(1, 200)]
        [_, rest, empty] = read.sent
        assert (rest.request.from_offset, rest.request.wait_ms) == (4, 0)
        empty.answer(_records())  # it found nothing: the next poll reads the log as it is now
        assert _poll(reader, 6) == ([], 6)
        assert [(r.from_offset, r.wait_ms) for r in read.waited][-1] == (6, 200)
    finally:
        reader.teardown()


def test_a_read_sent_ahead_for_another_offset_is_cancelled() -> None:
    reader, read = _reader({(1, 200): _records(1), (5, 200): _records(5)})
    try:
        _poll(reader, 1)
        [ahead] = read.sent
        assert _poll(reader, 5) == ([5], 6)
        assert ahead.cancelled
        assert isinstance(read.waited[-1], ReadRequest) and read.waited[-1].from_offset == 5
    finally:
        reader.teardown()
