# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``SubmitIntents``: hand staged intents to the effector, once per intent id, from any bundle.

Intents go in batches; transient failures are retried (safe: the effector deduplicates on
intent id), and what cannot be handed over goes to a dead-letter output with the reason. Every
retry and (rate-limited) every dead letter logs a WARNING; a wrong token fails the pipeline.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import apache_beam as beam
import grpc
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection, TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue

from beam_agents._protos import IntentDeadLetter, SubmitAck, SubmitRequest, ToolIntent
from beam_agents.io.connection import (
    _AUTH_CODES,
    _MAX_MESSAGE_BYTES,
    EffectorConnection,
    _call_failure,
    _connection,
    _describe,
    _is_transient,
    _status_code,
)

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

_DEAD_LETTER = "dead_letter"
_METRICS_NAMESPACE = "beam_agents.io"

_MAX_BATCH_SIZE = 1_000
"""The most intents one Submit may carry (the effector's ``MAX_SUBMIT_BATCH``)."""
_MAX_BATCH_BYTES = 4 * 1024 * 1024
"""A batch is cut before it grows past this, so requests stay well under the message limit."""
_MAX_INTENT_BYTES = _MAX_MESSAGE_BYTES - 64 * 1024
"""An intent larger than this cannot be sent at all (with room for the request's framing)."""
DEAD_LETTER_LOG_LINES = 10
"""The most dead-letter WARNING lines one ``SubmitIntents`` instance logs per interval."""
DEAD_LETTER_LOG_INTERVAL_S = 60.0
"""The interval of :data:`DEAD_LETTER_LOG_LINES`; lines past it are counted, then summarized."""


@dataclass(frozen=True)
class SubmitIntentsOutputs:
    """What ``SubmitIntents`` returns.

    ``acks``: one ``SubmitAck`` per intent the effector answered (accepted, duplicate or
    rejected), in the intent's window and with its timestamp. ``dead_letter``: one
    ``IntentDeadLetter`` per intent that was refused or never reached the effector, with the
    reason (and the effector's outcome name when it refused it); re-submit them once the cause
    is fixed.
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
        """The sleep before each retry: uniform in ``[0, min(max, initial * 2**n)]``."""
        for retry in range(self.max_attempts - 1):
            yield random.uniform(0.0, min(self.max_s, self.initial_s * 2**retry))


def _check_call_settings(
    batch_size: int,
    max_batch_size: int,
    max_attempts: int,
    initial_backoff_s: float,
    max_backoff_s: float,
    rpc_timeout_s: float,
) -> None:
    """Refuse batch, retry and deadline settings a sink of the effector cannot use."""
    if not 1 <= batch_size <= max_batch_size:
        raise ValueError(f"batch_size must be between 1 and {max_batch_size}, got {batch_size}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    if initial_backoff_s < 0 or max_backoff_s < initial_backoff_s:
        raise ValueError(
            "need 0 <= initial_backoff_s <= max_backoff_s, got "
            f"{initial_backoff_s} and {max_backoff_s}"
        )
    if rpc_timeout_s <= 0:
        raise ValueError(f"rpc_timeout_s must be positive, got {rpc_timeout_s}")


@dataclass(frozen=True)
class _Pending:
    intent: ToolIntent
    timestamp: Any
    window: Any

    def output(self, value: Any) -> WindowedValue:
        return WindowedValue(value, self.timestamp, (self.window,))


class _LogBudget:
    """At most ``lines`` log lines per ``interval_s``; counts the lines it refuses."""

    def __init__(
        self, lines: int, interval_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._lines = lines
        self._interval_s = interval_s
        self._clock = clock
        self._window_start = clock()
        self._used = 0
        self.suppressed = 0
        """Lines refused since the last summary."""

    def _roll(self) -> bool:
        """Start a new window if the current one is over; whether it did."""
        now = self._clock()
        if now - self._window_start < self._interval_s:
            return False
        self._window_start, self._used = now, 0
        return True

    def allow(self) -> bool:
        """Whether one more line may be logged now (if not, it is counted as suppressed)."""
        self._roll()
        if self._used < self._lines:
            self._used += 1
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self, *, final: bool = False) -> int:
        """The suppressed count to summarize now (its window is over, or ``final``), reset."""
        if not self.suppressed or not (final or self._roll()):
            return 0
        count, self.suppressed = self.suppressed, 0
        return count


def _key_text(entity_key: bytes) -> str:
    """The key as text if it is printable UTF-8, else ``0x`` and its hex (cut to 120 chars)."""
    try:
        text = entity_key.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    shown = text if text and text.isprintable() else "0x" + entity_key.hex()
    return shown if len(shown) <= 120 else shown[:117] + "..."


class _CallFailedError(Exception):
    def __init__(self, error: grpc.RpcError, attempts: int) -> None:
        super().__init__(error)
        self.reason = f"effector call failed after {attempts} attempt(s): {_describe(error)}"


def _call_with_retries(
    call: Callable[[], _T],
    backoff: _Backoff,
    what: str,
    target: str,
    log_retry: Callable[[int, grpc.RpcError, float], None],
    error: grpc.RpcError | None = None,
) -> _T:
    """``call()``, again after each transient failure while ``backoff`` allows.

    Starts with a retry when given the ``error`` of a first attempt made elsewhere. A wrong
    token (UNAUTHENTICATED, PERMISSION_DENIED) raises ``PermissionError`` at once: retrying
    cannot fix it, and every call would fail alike. Any other failure that retrying cannot fix,
    or that outlasts the retries, raises :class:`_CallFailedError`.
    """
    delays = backoff.delays()
    attempts = 0 if error is None else 1
    while True:
        if error is not None:
            if _status_code(error) in _AUTH_CODES:
                raise _call_failure(what, target, error) from error
            delay = next(delays, None) if _is_transient(error) else None
            if delay is None:
                raise _CallFailedError(error, attempts) from error
            log_retry(attempts, error, delay)
            time.sleep(delay)
        attempts += 1
        try:
            return call()
        except grpc.RpcError as failed:
            error = failed


_TIMESTAMP: Any = beam.DoFn.TimestampParam
_WINDOW: Any = beam.DoFn.WindowParam


class _SubmitIntentsFn(beam.DoFn):
    """Buffers intents into batches and submits each batch, retrying transient failures."""

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
        self._accepted = Metrics.counter(_METRICS_NAMESPACE, "intents_accepted")
        self._duplicates = Metrics.counter(_METRICS_NAMESPACE, "intents_duplicate")
        self._rejected = Metrics.counter(_METRICS_NAMESPACE, "intents_rejected")
        self._dead_lettered = Metrics.counter(_METRICS_NAMESPACE, "intents_dead_lettered")
        self._retries = Metrics.counter(_METRICS_NAMESPACE, "submit_retries")
        self._batch_sizes = Metrics.distribution(_METRICS_NAMESPACE, "submit_batch_size")

    def setup(self) -> None:
        """Open the channel and resolve the token (from the worker's environment, if so told)."""
        self._log_budget = _LogBudget(DEAD_LETTER_LOG_LINES, DEAD_LETTER_LOG_INTERVAL_S)
        self._metadata = self._connection.metadata()
        self._channel = self._connection.open_channel()
        self._stub = self._connection.stub(self._channel)

    def teardown(self) -> None:
        """Say how many dead letters were not logged; close the channel."""
        budget = getattr(self, "_log_budget", None)
        if budget is not None:
            self._log_suppressed(budget.take_suppressed(final=True))
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()

    def start_bundle(self) -> None:
        """Start an empty batch."""
        self._batch: list[_Pending] = []
        self._batch_bytes = 0

    def process(
        self,
        intent: ToolIntent,
        timestamp: Any = _TIMESTAMP,
        window: Any = _WINDOW,
    ) -> Iterator[Any]:
        """Add ``intent`` to the batch; submit the batch first if it is full."""
        if not isinstance(intent, ToolIntent):
            yield self._dead_letter(
                IntentDeadLetter(reason=f"not a ToolIntent: {type(intent).__name__}")
            )
            return
        size = intent.ByteSize()
        if size > _MAX_INTENT_BYTES:
            yield self._dead_letter(
                IntentDeadLetter(
                    intent=intent,
                    reason=f"intent is {size} bytes, over the {_MAX_INTENT_BYTES}-byte limit "
                    "of one effector request",
                )
            )
            return
        if self._batch and self._batch_bytes + size > _MAX_BATCH_BYTES:
            yield from self._submit_batch()
        self._batch.append(_Pending(intent, timestamp, window))
        self._batch_bytes += size
        if len(self._batch) >= self._batch_size:
            yield from self._submit_batch()

    def finish_bundle(self) -> Iterator[Any]:
        """Submit what is left of the batch."""
        yield from self._submit_batch()
        self._log_suppressed(self._log_budget.take_suppressed())

    def _submit_batch(self) -> Iterator[Any]:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        self._batch_sizes.update(len(batch))
        try:
            acks = self._submit([pending.intent for pending in batch])
        except _CallFailedError as failure:
            for pending in batch:
                letter = IntentDeadLetter(intent=pending.intent, reason=failure.reason)
                yield self._dead_letter(pending.output(letter))
            return
        for pending, ack in zip(batch, acks, strict=True):
            yield pending.output(ack)
            if ack.outcome == SubmitAck.ACCEPTED:
                self._accepted.inc()
            elif ack.outcome == SubmitAck.DUPLICATE:
                self._duplicates.inc()
            else:
                self._rejected.inc()
                letter = IntentDeadLetter(
                    intent=pending.intent,
                    reason=ack.reason,
                    outcome=SubmitAck.Outcome.Name(ack.outcome),
                )
                yield self._dead_letter(pending.output(letter))

    def _submit(self, intents: Sequence[ToolIntent]) -> Sequence[SubmitAck]:
        """Submit one batch; retrying is safe because the effector deduplicates by intent id."""
        request = SubmitRequest(intents=intents, redeliver_results=self._redeliver_results)

        def log_retry(attempts: int, error: grpc.RpcError, delay: float) -> None:
            self._retries.inc()
            _log.warning(
                "SubmitIntents: submitting %d intent(s) to the effector at %s failed "
                "(attempt %d of %d: %s); retrying in %.2f s",
                len(intents),
                self._connection.target,
                attempts,
                self._backoff.max_attempts,
                _describe(error),
                delay,
            )

        response = _call_with_retries(
            lambda: self._stub.Submit(
                request, timeout=self._rpc_timeout_s, metadata=self._metadata
            ),
            self._backoff,
            "submitting intents",
            self._connection.target,
            log_retry,
        )
        if len(response.acks) != len(intents):
            raise RuntimeError(
                f"the effector answered {len(response.acks)} acknowledgements for "
                f"{len(intents)} intents"
            )
        return list(response.acks)

    def _dead_letter(self, letter: Any) -> TaggedOutput[str, Any]:
        self._dead_lettered.inc()
        value = letter.value if isinstance(letter, WindowedValue) else letter
        if self._log_budget.allow():
            intent = value.intent
            _log.warning(
                "SubmitIntents to %s: dead letter for intent %s (key %s, tool %r)%s: %s",
                self._connection.target,
                intent.intent_id or "(none)",
                _key_text(intent.entity_key),
                intent.tool_name,
                f" {value.outcome}" if value.outcome else "",
                value.reason,
            )
        return TaggedOutput(_DEAD_LETTER, letter)

    def _log_suppressed(self, count: int) -> None:
        if count:
            _log.warning(
                "SubmitIntents to %s: %d more dead letter(s) were not logged (at most %d lines "
                "per %.0f s); see the dead_letter output and the intents_dead_lettered counter",
                self._connection.target,
                count,
                DEAD_LETTER_LOG_LINES,
                DEAD_LETTER_LOG_INTERVAL_S,
            )


class SubmitIntents(beam.PTransform[PCollection[ToolIntent], SubmitIntentsOutputs]):
    """Submit ``ToolIntent``s to an effector; returns :class:`SubmitIntentsOutputs`.

    Intents are submitted in batches of at most ``batch_size`` (and a few MiB), cut within a
    bundle and at its end. A call that fails transiently (unavailable, deadline exceeded, ...)
    is retried with exponential backoff and full jitter, ``initial_backoff_s`` doubling up to
    ``max_backoff_s``, for at most ``max_attempts`` calls in all; each call has a deadline of
    ``rpc_timeout_s``. With the defaults a batch is retried for about ten seconds on average
    (twenty at most), enough to ride out an effector restart; each retry logs a WARNING with
    the target and the delay. Retrying is safe because the effector deduplicates on intent id.
    A batch that still fails, or fails for another reason retrying cannot fix, goes to
    ``dead_letter`` with the gRPC status, as does every intent the effector rejects (with its
    reason); each dead letter logs a WARNING with the intent id and the reason, at most
    :data:`DEAD_LETTER_LOG_LINES` per :data:`DEAD_LETTER_LOG_INTERVAL_S` per instance (a later
    line counts the rest). A wrong token (UNAUTHENTICATED, PERMISSION_DENIED) fails the
    pipeline with ``PermissionError``, as it does for ``ReadEnvelopes``: every intent would
    fail alike.

    ``target`` is ``HOST:PORT`` with ``token`` or ``token_env`` and ``tls_root_cert`` (see
    :class:`EffectorConnection`), or an ``EffectorConnection``.

    ``redeliver_results`` (default on) asks the effector to publish again the stored result of
    an intent that is already done, so re-running a pipeline from fresh state over the same
    events resumes its agents without executing anything twice.

    Beam metrics (namespace ``beam_agents.io``): ``intents_accepted``, ``intents_duplicate``,
    ``intents_rejected``, ``intents_dead_lettered``, ``submit_retries`` and the distribution
    ``submit_batch_size``.
    """

    def __init__(
        self,
        target: str | EffectorConnection,
        *,
        token: str | None = None,
        token_env: str | None = None,
        tls_root_cert: str | os.PathLike[str] | bytes | None = None,
        batch_size: int = 256,
        max_attempts: int = 10,
        initial_backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        rpc_timeout_s: float = 30.0,
        redeliver_results: bool = True,
    ) -> None:
        super().__init__()
        _check_call_settings(
            batch_size,
            _MAX_BATCH_SIZE,
            max_attempts,
            initial_backoff_s,
            max_backoff_s,
            rpc_timeout_s,
        )
        self._fn = _SubmitIntentsFn(
            _connection(target, token, token_env, tls_root_cert),
            batch_size,
            _Backoff(max_attempts, initial_backoff_s, max_backoff_s),
            rpc_timeout_s,
            redeliver_results,
        )

    def expand(self, intents: PCollection[ToolIntent]) -> SubmitIntentsOutputs:
        """Submit ``intents``; split the answers into acknowledgements and dead letters."""
        results = intents | "Submit" >> beam.ParDo(self._fn).with_output_types(
            SubmitAck
        ).with_outputs(_DEAD_LETTER, main="acks")
        dead_letter = results[_DEAD_LETTER]
        dead_letter.element_type = IntentDeadLetter
        return SubmitIntentsOutputs(acks=results.acks, dead_letter=dead_letter)
