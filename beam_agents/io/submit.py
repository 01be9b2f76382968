"""``SubmitIntents``: hand staged intents to the effector, once per intent id, from any bundle."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import grpc
from apache_beam.metrics import Metrics
from apache_beam.pvalue import PCollection, TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue

from beam_agents._protos import IntentDeadLetter, SubmitAck, SubmitRequest, ToolIntent
from beam_agents.io.connection import EffectorConnection, is_transient

_DEAD_LETTER = "dead_letter"


@dataclass(frozen=True)
class SubmitIntentsOutputs:
    """What ``SubmitIntents`` returns.

    ``acks``: one ``SubmitAck`` per intent the effector answered (accepted, duplicate or
    rejected). ``dead_letter``: one ``IntentDeadLetter`` per intent the effector rejected or
    could not be reached for, with the reason; re-submit them once the cause is fixed.
    """

    acks: PCollection[SubmitAck]
    dead_letter: PCollection[IntentDeadLetter]


@dataclass(frozen=True)
class _Backoff:
    """Exponential backoff with full jitter for transient gRPC failures."""

    max_attempts: int
    initial_s: float
    max_s: float

    def delays(self) -> Iterator[float]:
        """Sleep before each retry: uniform in [0, min(max, initial * 2**n)]."""
        for attempt in range(self.max_attempts - 1):
            yield random.uniform(0.0, min(self.max_s, self.initial_s * 2**attempt))


class _SubmitIntentsFn(beam.DoFn):  # type: ignore[misc]
    """Buffers a bundle's intents and submits them in batches when the bundle finishes."""

    def __init__(
        self,
        connection: EffectorConnection,
        batch_size: int,
        backoff: _Backoff,
        rpc_timeout_s: float,
        redeliver_results: bool,
    ) -> None:
        self._connection = connection
        self._batch_size = batch_size
        self._backoff = backoff
        self._rpc_timeout_s = rpc_timeout_s
        self._redeliver_results = redeliver_results
        self._accepted = Metrics.counter("beam_agents.io", "intents_accepted")
        self._duplicates = Metrics.counter("beam_agents.io", "intents_duplicate")
        self._dead_lettered = Metrics.counter("beam_agents.io", "intents_dead_lettered")
        self._retries = Metrics.counter("beam_agents.io", "submit_retries")

    def setup(self) -> None:
        self._channel = self._connection.open_channel()
        self._stub = self._connection.stub(self._channel)
        self._metadata = self._connection.metadata()

    def teardown(self) -> None:
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()

    def start_bundle(self) -> None:
        self._pending: list[tuple[ToolIntent, Any, Any]] = []

    def process(
        self,
        intent: ToolIntent,
        timestamp: Any = beam.DoFn.TimestampParam,
        window: Any = beam.DoFn.WindowParam,
    ) -> Iterator[Any]:
        if not isinstance(intent, ToolIntent):
            self._dead_lettered.inc()
            yield TaggedOutput(
                _DEAD_LETTER,
                IntentDeadLetter(reason=f"not a ToolIntent: {type(intent).__name__}"),
            )
            return
        self._pending.append((intent, timestamp, window))

    def finish_bundle(self) -> Iterator[Any]:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self._batch_size):
            yield from self._submit_batch(pending[start : start + self._batch_size])

    def _submit_batch(self, batch: Sequence[tuple[ToolIntent, Any, Any]]) -> Iterator[Any]:
        request = SubmitRequest(
            intents=[intent for intent, _, _ in batch], redeliver_results=self._redeliver_results
        )
        try:
            response = self._call_with_retries(request)
        except grpc.RpcError as error:
            reason = f"effector call failed: {error.code().name}: {error.details()}"
            for intent, timestamp, window in batch:
                self._dead_lettered.inc()
                letter = IntentDeadLetter(intent=intent, reason=reason)
                yield TaggedOutput(_DEAD_LETTER, WindowedValue(letter, timestamp, [window]))
            return
        for (intent, timestamp, window), ack in zip(batch, response.acks, strict=True):
            yield WindowedValue(ack, timestamp, [window])
            if ack.outcome == SubmitAck.ACCEPTED:
                self._accepted.inc()
            elif ack.outcome == SubmitAck.DUPLICATE:
                self._duplicates.inc()
            else:
                self._dead_lettered.inc()
                letter = IntentDeadLetter(
                    intent=intent,
                    reason=ack.reason,
                    outcome=SubmitAck.Outcome.Name(ack.outcome),
                )
                yield TaggedOutput(_DEAD_LETTER, WindowedValue(letter, timestamp, [window]))

    def _call_with_retries(self, request: SubmitRequest) -> Any:
        delays = self._backoff.delays()
        while True:
            try:
                return self._stub.Submit(
                    request, timeout=self._rpc_timeout_s, metadata=self._metadata
                )
            except grpc.RpcError as error:
                delay = next(delays, None) if is_transient(error) else None
                if delay is None:
                    raise
                self._retries.inc()
                time.sleep(delay)


class SubmitIntents(beam.PTransform):  # type: ignore[misc]
    """Submit ``ToolIntent``s to an effector; returns :class:`SubmitIntentsOutputs`.

    Intents are batched per bundle (at most ``batch_size`` per call). Transient gRPC failures
    (unavailable, deadline exceeded, ...) are retried with exponential backoff and full jitter up
    to ``max_attempts`` calls, which is safe because the effector deduplicates on intent id. What
    still fails, and every intent the effector rejects, goes to ``dead_letter`` with the reason.

    ``redeliver_results`` (default on) asks the effector to publish again the stored result of an
    intent that is already done, so re-running a pipeline from fresh state over the same events
    resumes its agents without executing anything twice.
    """

    def __init__(
        self,
        target: str | EffectorConnection,
        *,
        token: str | None = None,
        token_env: str | None = None,
        tls_root_cert: str | None = None,
        batch_size: int = 256,
        max_attempts: int = 6,
        initial_backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        rpc_timeout_s: float = 30.0,
        redeliver_results: bool = True,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if initial_backoff_s < 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s")
        self._connection = (
            target
            if isinstance(target, EffectorConnection)
            else EffectorConnection(
                target, token=token, token_env=token_env, tls_root_cert=tls_root_cert
            )
        )
        self._fn = _SubmitIntentsFn(
            self._connection,
            batch_size,
            _Backoff(max_attempts, initial_backoff_s, max_backoff_s),
            rpc_timeout_s,
            redeliver_results,
        )

    def expand(self, intents: PCollection[ToolIntent]) -> SubmitIntentsOutputs:
        results = intents | "Submit" >> beam.ParDo(self._fn).with_output_types(
            SubmitAck
        ).with_outputs(_DEAD_LETTER, main="acks")
        dead_letter = results[_DEAD_LETTER]
        dead_letter.element_type = IntentDeadLetter
        return SubmitIntentsOutputs(acks=results.acks, dead_letter=dead_letter)
