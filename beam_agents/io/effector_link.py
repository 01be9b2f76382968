# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""The pipeline's link to the effector: its connection, ``SubmitIntents`` and ``ReadEnvelopes``."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import apache_beam as beam
import grpc
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics.metric import Metrics
from apache_beam.pipeline import PipelineVisitor
from apache_beam.pvalue import PBegin, PCollection, TaggedOutput
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner, SwitchingDirectRunner
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_agents._protos import (
    MAX_ENVELOPE_BYTES,
    AgentEnvelope,
    EffectorStub,
    IntentDeadLetter,
    IntentState,
    ListIntentsRequest,
    PublishRequest,
    ReadRequest,
    StatusRequest,
    SubmitAck,
    SubmitRequest,
    ToolIntent,
    ToolResult,
    entity_key_problem,
    time_problem,
)
from beam_agents.core.observability import progress_line

# -- reaching the effector: target, bearer token, TLS and limits ------------------------------
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message the effector accepts or sends by default (its ``MAX_MESSAGE_BYTES``)."""
_MAX_ITEM_BYTES = _MAX_MESSAGE_BYTES - 64 * 1024
"""An item (intent, event, trace) larger than this cannot be sent (room left for framing)."""
_MAX_BATCH_SIZE = 1_000
"""The most items one Submit or Record call may carry (the effector's limit)."""
_MAX_BATCH_BYTES = 4 * 1024 * 1024
"""A batch is cut before it grows past this, so requests stay well under the message limit."""
_METRICS_NAMESPACE = "beam_agents.io"

_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    # gRPC's reconnect backoff grows to two minutes by default; a restarted effector should be
    # found within the retry budget of SubmitIntents and the read loop of ReadEnvelopes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)

_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
"""gRPC service config spreading calls over every address of a replica list."""

_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
_AUTH_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def _status_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def _is_transient(error: grpc.RpcError) -> bool:
    """Whether a failed call may succeed if simply tried again."""
    return _status_code(error) in _TRANSIENT_CODES


def _describe(error: grpc.RpcError) -> str:
    """``CODE: details`` of a failed call, for dead letters and error messages."""
    code = _status_code(error)
    details = getattr(error, "details", None)
    text = details() if callable(details) else str(error)
    return f"{code.name if code is not None else 'UNKNOWN'}: {text}"


def _call_failure(what: str, target: str, error: grpc.RpcError) -> Exception:
    """The exception to raise for a call that failed for good: typed by its cause."""
    message = f"{what} at {target} failed: {_describe(error)}"
    if _status_code(error) in _AUTH_CODES:
        return PermissionError(f"{message} (check the token)")
    if _is_transient(error):
        return ConnectionError(message)
    return RuntimeError(message)


@dataclass(frozen=True)
class EffectorConnection:
    """Connection settings for an effector; picklable, so Beam can ship it to workers.

    - ``target``: ``HOST:PORT`` (or any gRPC target) of the effector, or its replicas as a
      comma-separated list of ``IP:PORT`` addresses (``[IPv6]:PORT``), reached round-robin.
    - ``token``, or the environment variable ``token_env`` read on the worker (so the secret
      never enters the pipeline graph): sent as ``authorization: Bearer <token>``.
    - ``tls_root_cert``: the PEM root certificate (a path, read now, or the bytes) that the
      effector's ``--tls-cert`` must chain to; with it the channel uses TLS.
    - ``tls_server_name``: the name to check in the server's certificate instead of the host.
    """

    target: str
    token: str | None = field(default=None, repr=False)
    token_env: str | None = None
    tls_root_cert: str | os.PathLike[str] | bytes | None = field(default=None, repr=False)
    tls_server_name: str | None = None
    _root_certificates: bytes | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or ":" not in self.target:
            raise ValueError(f"effector target must be HOST:PORT, got {self.target!r}")
        _channel_target(self.target)
        if self.token is not None and self.token_env is not None:
            raise ValueError("give either token or token_env, not both")
        if self.token is not None and not self.token.strip():
            raise ValueError("token is empty")
        if self.tls_server_name is not None and self.tls_root_cert is None:
            raise ValueError("tls_server_name needs tls_root_cert (it only applies to TLS)")
        object.__setattr__(self, "_root_certificates", _read_root_certificates(self.tls_root_cert))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the bearer token, read from ``token_env`` when that is set."""
        token = self.token
        if self.token_env is not None:
            token = os.environ.get(self.token_env, "").strip()
            if not token:
                raise ValueError(
                    f"environment variable {self.token_env} (the effector token) is not set"
                )
        return (("authorization", f"Bearer {token}"),) if token else ()

    def open_channel(self) -> grpc.Channel:
        """A new synchronous channel to the effector; the caller closes it."""
        options: list[tuple[str, str | int]] = list(_CHANNEL_OPTIONS)
        target = _channel_target(self.target)
        if target != self.target:
            options.append(("grpc.service_config", _ROUND_ROBIN))
        if self._root_certificates is None:
            return grpc.insecure_channel(target, options=options)
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        credentials = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
        return grpc.secure_channel(target, credentials, options=options)

    def stub(self, channel: grpc.Channel) -> EffectorStub:
        """The generated ``Effector`` stub over ``channel``."""
        return EffectorStub(channel)


def _channel_target(target: str) -> str:
    """The gRPC target for ``target``; a list of replicas must be IP addresses of one family."""
    if "," not in target:
        return target
    families: set[int] = set()
    for address in target.split(","):
        host, separator, port = address.strip().rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        try:
            version = ipaddress.ip_address(host[1:-1] if bracketed else host).version
        except ValueError:
            raise ValueError(
                f"a list of effector replicas must give IP:PORT addresses, got {address!r} in "
                f"{target!r} (for host names, use one DNS name that resolves to every replica)"
            ) from None
        if not separator or not port.isdigit() or (version == 6) != bracketed:
            raise ValueError(
                f"effector replica {address!r} in {target!r} is not IP:PORT ([IPv6]:PORT)"
            )
        families.add(version)
    if len(families) > 1:
        raise ValueError(f"effector replicas {target!r} mix IPv4 and IPv6 addresses")
    addresses = ",".join(address.strip() for address in target.split(","))
    return f"ipv{families.pop()}:{addresses}"


def _read_root_certificates(source: str | os.PathLike[str] | bytes | None) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise ValueError(
            f"cannot read tls_root_cert {os.fspath(source)!r}: {exc.strerror}"
        ) from None


def _connection(
    target: str | EffectorConnection,
    token: str | None,
    token_env: str | None,
    tls_root_cert: str | os.PathLike[str] | bytes | None,
) -> EffectorConnection:
    """The connection a transform was given, or one built from its keyword arguments."""
    if isinstance(target, EffectorConnection):
        if token is not None or token_env is not None or tls_root_cert is not None:
            raise ValueError(
                "pass token, token_env and tls_root_cert inside the EffectorConnection, "
                "not beside it"
            )
        return target
    return EffectorConnection(target, token=token, token_env=token_env, tls_root_cert=tls_root_cert)


_log = logging.getLogger(__name__)

_T = TypeVar("_T")

# -- SubmitIntents: hand staged intents to the effector, once per intent id -------------------
_DEAD_LETTER = "dead_letter"
_KIND_NAMES = {value: name for name, value in ToolIntent.Kind.items()}
_NOT_SENT = "not sent"
_UNDELIVERED = "undelivered"
_UNRECORDED = "refused unrecorded"
_RECORDED_REJECTED = "recorded REJECTED"
_POLICY_DENIAL = "denied by effect policy"
"""How the effector's REJECTED reason begins when an effect policy refused the intent."""
_CONFLICT = "conflict"
_DEADLINE_ROUTE = "the run waiting for it takes its deadline route"
_CONSEQUENCES = {
    _NOT_SENT: f"{{never}}: it never reached the effector, and {_DEADLINE_ROUTE}",
    _UNDELIVERED: f"unless an unanswered attempt reached the effector, {{never}} and "
    f"{_DEADLINE_ROUTE}",
    _UNRECORDED: f"{{never}}: the effector recorded and publishes nothing, and {_DEADLINE_ROUTE}",
    _RECORDED_REJECTED: "{never}: the effector publishes a REJECTED result, which resumes the "
    "run waiting for it",
    _CONFLICT: "the effector keeps the intent first recorded under this id and publishes a "
    "REJECTED result to the run that staged this one",
}
"""What each way of being dead-lettered means for the waiting run, said in its log line."""
_NEVER_DONE: dict[int, str] = {
    ToolIntent.TOOL: "it never runs",
    ToolIntent.APPROVAL: "nobody is asked",
}


def _consequence(kind: int, fate: str) -> str:
    """What a dead letter of ``kind`` that met ``fate`` means for its run."""
    if kind == ToolIntent.BUDGET_DEBIT:
        return "its model call's usage is not debited from its fleet budget"
    if kind == ToolIntent.WITHDRAWAL:
        if fate == _CONFLICT:
            return "the withdrawal first recorded under this id stands"
        return "the effector may still offer the intent it withdraws"
    return _CONSEQUENCES[fate].format(never=_NEVER_DONE.get(kind, "it never runs"))


def _refusal_fate(ack: SubmitAck) -> str:
    """How the effector refused an intent, told from its acknowledgement (see effector.proto)."""
    if ack.state == IntentState.INTENT_STATE_UNSPECIFIED:
        return _UNRECORDED  # refused at the boundary: no state, nothing published
    if ack.result.refused_submission_digest:
        return _CONFLICT  # the REJECTED result published to this submission
    if ack.state == IntentState.DONE and ack.result.status == ToolResult.REJECTED:
        return _RECORDED_REJECTED
    return _CONFLICT  # the state of the intent kept under this id (a withdrawal's conflict)


@dataclass(frozen=True)
class SubmitIntentsOutputs:
    """What ``SubmitIntents`` returns.

    ``acks``: one ``SubmitAck`` per intent the effector answered, in the intent's window.
    ``dead_letter``: one ``IntentDeadLetter`` per intent refused or never delivered, with the
    reason; re-submit them once the cause is fixed.
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
    max_attempts: int,
    initial_backoff_s: float,
    max_backoff_s: float,
    rpc_timeout_s: float,
) -> None:
    """Refuse batch, retry and deadline settings a sink of the effector cannot use."""
    if not 1 <= batch_size <= _MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be between 1 and {_MAX_BATCH_SIZE}, got {batch_size}")
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


def _key_text(entity_key: bytes) -> str:
    """The key as text if it is printable UTF-8, else ``0x`` and its hex (cut to 120 chars)."""
    try:
        text = entity_key.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    shown = text if text and text.isprintable() else "0x" + entity_key.hex()
    return shown if len(shown) <= 120 else shown[:117] + "..."


@dataclass(frozen=True)
class _Submission:
    """A Submit call in flight: the intents it carries, its request and the call."""

    batch: list[_Pending]
    request: SubmitRequest
    call: grpc.Future


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
    token raises ``PermissionError`` at once; any other lasting failure :class:`_CallFailedError`.
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
        self._metadata = self._connection.metadata()
        self._channel = self._connection.open_channel()
        self._stub = self._connection.stub(self._channel)

    def teardown(self) -> None:
        """Close the channel."""
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()

    def start_bundle(self) -> None:
        """Start an empty batch, with no call made yet."""
        self._batch: list[_Pending] = []
        self._batch_bytes = 0
        self._in_flight: _Submission | None = None
        self._sent_any = False

    def process(
        self,
        intent: ToolIntent,
        timestamp: Any = _TIMESTAMP,
        window: Any = _WINDOW,
    ) -> Iterator[Any]:
        """Add ``intent`` to the batch; send the bundle's first intent at once, and full batches."""
        if not isinstance(intent, ToolIntent):
            yield self._dead_letter(
                IntentDeadLetter(reason=f"not a ToolIntent: {type(intent).__name__}"), _NOT_SENT
            )
            return
        size = intent.ByteSize()
        if size > _MAX_ITEM_BYTES:
            yield self._dead_letter(
                IntentDeadLetter(
                    intent=intent,
                    reason=f"intent is {size} bytes, over the {_MAX_ITEM_BYTES}-byte limit "
                    "of one effector request",
                ),
                _NOT_SENT,
            )
            return
        if self._batch and self._batch_bytes + size > _MAX_BATCH_BYTES:
            yield from self._send()
        self._batch.append(_Pending(intent, timestamp, window))
        self._batch_bytes += size
        if not self._sent_any or len(self._batch) >= self._batch_size:
            yield from self._send()

    def finish_bundle(self) -> Iterator[Any]:
        """Submit what is left of the batch; wait for every answer."""
        yield from self._send()
        yield from self._settle()

    def _send(self) -> Iterator[Any]:
        """Start submitting the batch once the call before it is answered; do not wait.

        The effector works on the batch while the bundle goes on. One call at a time keeps
        each key's intents in order.
        """
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        yield from self._settle()
        self._sent_any = True
        self._batch_sizes.update(len(batch))
        request = SubmitRequest(
            intents=[pending.intent for pending in batch],
            redeliver_results=self._redeliver_results,
        )
        call = self._stub.Submit.future(
            request, timeout=self._rpc_timeout_s, metadata=self._metadata
        )
        self._in_flight = _Submission(batch, request, call)

    def _settle(self) -> Iterator[Any]:
        """Wait for the call in flight, retrying it if it failed; emit its answers."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        batch = in_flight.batch
        try:
            acks = self._answers(in_flight)
        except _CallFailedError as failure:
            for pending in batch:
                letter = IntentDeadLetter(intent=pending.intent, reason=failure.reason)
                yield self._dead_letter(pending.output(letter), _UNDELIVERED)
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
                yield self._dead_letter(pending.output(letter), _refusal_fate(ack))

    def _answers(self, submission: _Submission) -> Sequence[SubmitAck]:
        """The acknowledgements of one call; retrying is safe (the effector deduplicates by id)."""
        request = submission.request
        count = len(request.intents)

        def log_retry(attempts: int, error: grpc.RpcError, delay: float) -> None:
            self._retries.inc()
            _log.warning(
                "SubmitIntents: submitting %d intent(s) to the effector at %s failed "
                "(attempt %d of %d: %s); retrying in %.2f s",
                count,
                self._connection.target,
                attempts,
                self._backoff.max_attempts,
                _describe(error),
                delay,
            )

        try:
            response = submission.call.result()
        except grpc.RpcError as error:
            response = _call_with_retries(
                lambda: self._stub.Submit(
                    request, timeout=self._rpc_timeout_s, metadata=self._metadata
                ),
                self._backoff,
                "submitting intents",
                self._connection.target,
                log_retry,
                error,
            )
        if len(response.acks) != count:
            raise RuntimeError(
                f"the effector answered {len(response.acks)} acknowledgements for {count} intents"
            )
        return list(response.acks)

    def _dead_letter(self, letter: Any, fate: str) -> TaggedOutput[str, Any]:
        """Count and log one dead letter and what its ``fate`` means for the run waiting on it."""
        self._dead_lettered.inc()
        value = letter.value if isinstance(letter, WindowedValue) else letter
        intent = value.intent
        # A policy's deny is an outcome the run handles, not a failure: a warning.
        denied = fate == _RECORDED_REJECTED and value.reason.startswith(_POLICY_DENIAL)
        _log.log(
            logging.WARNING if denied else logging.ERROR,
            "SubmitIntents to %s: dead letter for intent %s (key %s, %s, tool %r)%s: %s; %s",
            self._connection.target,
            intent.intent_id or "(none)",
            _key_text(intent.entity_key),
            _KIND_NAMES.get(intent.kind, f"kind {intent.kind}"),
            intent.tool_name,
            f" {value.outcome}" if value.outcome else "",
            value.reason,
            _consequence(intent.kind, fate),
        )
        return TaggedOutput(_DEAD_LETTER, letter)


class SubmitIntents(beam.PTransform[PCollection[ToolIntent], SubmitIntentsOutputs]):
    """Submit ``ToolIntent``s to an effector; returns :class:`SubmitIntentsOutputs`.

    Intents go in batches of at most ``batch_size`` (and a few MiB): a bundle's first intent at
    once, so the effector starts on it while the bundle goes on, the rest as batches fill and
    when the bundle ends, one call at a time. A call that fails transiently is retried with
    exponential backoff and full jitter (``initial_backoff_s`` doubling up to
    ``max_backoff_s``, at most ``max_attempts`` calls, each with a deadline of
    ``rpc_timeout_s``); each retry logs a WARNING. A batch that still fails goes to
    ``dead_letter``, as does every intent the effector rejects. Each dead letter logs one
    ERROR line with the intent's id, key, the reason and what it means for the waiting run,
    whether or not ``dead_letter`` is consumed. A refusal the effector records (REJECTED, or a
    conflict) reaches the run as a REJECTED result; an intent never delivered, or refused
    unrecorded (bad id, key, time, size or depth), leaves the run to its deadline route.
    A wrong token fails the pipeline with ``PermissionError``.

    ``target`` is ``HOST:PORT`` with ``token`` or ``token_env`` and ``tls_root_cert``, or an
    :class:`EffectorConnection`. ``redeliver_results`` asks the effector to publish again the
    result of an intent already done, so a re-run from fresh state executes nothing twice.

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
            batch_size, max_attempts, initial_backoff_s, max_backoff_s, rpc_timeout_s
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


# -- ReadEnvelopes: the effector's envelope log as a (key, AgentEnvelope) source --------------
_LOG_END = 2**62
"""The restriction's end: beyond any offset the log will reach, so the range is unbounded."""
_PUBLISH_MAX_ENVELOPES = 500
_PUBLISH_MAX_BYTES = 4 * 1024 * 1024
"""An event larger than this cannot be published at all (with room for the request's framing)."""
_RPC_TIMEOUT_S = 30.0
_MAX_POLL_WAIT_MS = 60_000
"""The effector waits at most this long in one Read."""
_RETRY_INITIAL_S = 0.1
_RETRY_MAX_S = 5.0
_READ_MAX_BYTES = _MAX_MESSAGE_BYTES // 2
"""The bytes of envelopes one ``Read`` asks for: its answer stays under the message limit."""
DEFAULT_PROGRESS_INTERVAL_S = 15.0
"""How often ``ReadEnvelopes`` says how far it got, by default."""
_AWAITING_SHOWN = 3
"""Approvals awaiting a decision named in the line saying why an idle reader does not stop."""


class _LogRestrictions(RestrictionProvider):
    """One unsplittable offset range per reader: the log is consumed in order."""

    def initial_restriction(self, start_offset: int) -> OffsetRange:
        """From the start offset to (practically) forever."""
        return OffsetRange(start_offset, _LOG_END)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        """Claims offsets in increasing order."""
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, start_offset: int, restriction: OffsetRange) -> int:
        """Unknown, and never split: report one unit of work."""
        return 1

    def split(self, start_offset: int, restriction: OffsetRange) -> Iterator[OffsetRange]:
        """Never split up front: one reader per log."""
        yield restriction


def _publish_chunks(events: list[bytes]) -> Iterator[list[AgentEnvelope]]:
    """Serialized events in Publish-sized chunks (bounded in count and in bytes)."""
    chunk: list[AgentEnvelope] = []
    size = 0
    for raw in events:
        if chunk and (len(chunk) == _PUBLISH_MAX_ENVELOPES or size + len(raw) > _PUBLISH_MAX_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(AgentEnvelope.FromString(raw))
        size += len(raw)
    if chunk:
        yield chunk


class _PublishInitialEventsFn(beam.DoFn):
    """Publishes the initial events, then emits the offset the reader starts from."""

    def __init__(
        self, connection: EffectorConnection, events: list[bytes], start_offset: int | None
    ) -> None:
        self._connection = connection
        self._events = events
        self._start_offset = start_offset

    def process(self, _impulse: bytes) -> Iterator[int]:
        """Publish (if there are events) and emit the first offset to read."""
        first_published = 1
        if self._events:
            first_published = self._publish()
        yield first_published if self._start_offset is None else self._start_offset

    def _publish(self) -> int:
        metadata = self._connection.metadata()
        channel = self._connection.open_channel()
        offsets: list[int] = []
        try:
            stub = self._connection.stub(channel)
            for chunk in _publish_chunks(self._events):
                response = stub.Publish(
                    PublishRequest(envelopes=chunk), timeout=_RPC_TIMEOUT_S, metadata=metadata
                )
                problems = [*response.problems, *[""] * (len(chunk) - len(response.problems))]
                for envelope, offset, problem in zip(
                    chunk, response.offsets, problems, strict=True
                ):
                    if not offset:
                        _log.error(
                            "ReadEnvelopes: the effector refused initial event %d (key %r): %s",
                            len(offsets),
                            envelope.entity_key[:64],
                            problem or "no reason given",
                        )
                    offsets.append(offset)
        except grpc.RpcError as error:
            raise _call_failure(
                f"publishing the initial events ({len(offsets)} of {len(self._events)} done)",
                self._connection.target,
                error,
            ) from error
        finally:
            channel.close()
        published = [offset for offset in offsets if offset]
        if not published:
            raise ValueError(
                f"the effector refused every one of the {len(offsets)} initial events (the "
                "reasons are logged above); nothing to read from"
            )
        return min(published)


_TRACKER: Any = beam.DoFn.RestrictionParam(_LogRestrictions())
_WATERMARK: Any = beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider())


@beam.DoFn.unbounded_per_element()
class _ReadLogFn(beam.DoFn):
    """Long-polls the envelope log from the restriction's start; defers between polls."""

    def __init__(
        self,
        connection: EffectorConnection,
        max_batch: int,
        poll_wait_ms: int,
        stop_when_idle_s: float | None,
        watermark_lag_s: float,
        progress_interval_s: float | None = DEFAULT_PROGRESS_INTERVAL_S,
    ) -> None:
        self._connection = connection
        self._max_batch = max_batch
        self._poll_wait_ms = poll_wait_ms
        self._stop_when_idle_s = stop_when_idle_s
        self._watermark_lag = Duration.of(watermark_lag_s)
        self._progress_interval_s = progress_interval_s
        self._read = Metrics.counter(_METRICS_NAMESPACE, "envelopes_read")
        self._skipped = Metrics.counter(_METRICS_NAMESPACE, "envelopes_skipped")
        self._retries = Metrics.counter(_METRICS_NAMESPACE, "read_retries")

    def setup(self) -> None:
        """Open the channel; reset the idle clock, the failure count and the progress counts."""
        self._metadata = self._connection.metadata()
        self._channel = self._connection.open_channel()
        self._stub = self._connection.stub(self._channel)
        # Kept on the instance across the deferred remainders it processes: stopping when idle
        # is meant for local runs, where one instance reads the whole log.
        self._idle_since: float | None = None
        self._failures = 0
        self._batch_limit = self._max_batch
        """Envelopes asked for per ``Read``: halved while answers are too large to receive."""
        self._read_total = 0
        self._skipped_total = 0
        self._last_report = time.monotonic()
        self._last_blocked_report: float | None = None
        self._next_read: tuple[int, grpc.Future] | None = None
        """The ``Read`` sent ahead for the next remainder, with the offset it reads from."""

    def teardown(self) -> None:
        """Cancel the read sent ahead; close the channel."""
        next_read = getattr(self, "_next_read", None)
        if next_read is not None:
            next_read[1].cancel()
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()

    def process(
        self,
        start_offset: int,
        tracker: Any = _TRACKER,
        watermark: Any = _WATERMARK,
    ) -> Iterator[Any]:
        """One poll: emit what arrived, then defer the rest of the log (or stop when idle)."""
        position = tracker.current_restriction().start
        self._report_progress(position)
        try:
            response, sent_ahead = self._poll(position)
            stop = not response.records and self._idle_and_drained(position)
        except grpc.RpcError as error:
            if not self._ask_for_less(error, position):
                self._back_off(error)
            tracker.defer_remainder()
            return
        self._failures = 0
        self._batch_limit = min(self._max_batch, self._batch_limit * 2)
        if stop:
            tracker.try_claim(_LOG_END)
            return
        if response.records:
            self._idle_since = None
        now = Timestamp.now()
        newest: Timestamp | None = None
        for record in self._records(response, sent_ahead):
            if not tracker.try_claim(record.offset):
                return
            position = record.offset + 1
            envelope = record.envelope
            problem = time_problem("event_time_ms", envelope.event_time_ms)
            if problem is not None:
                self._skip(record.offset, envelope, problem)
                continue
            timestamp = Timestamp(micros=envelope.event_time_ms * 1000)
            if timestamp - now > self._watermark_lag:
                self._report_future(record.offset, envelope, timestamp - now)
            newest = timestamp if newest is None else max(newest, timestamp)
            self._read.inc()
            self._read_total += 1
            yield TimestampedValue((envelope.entity_key, envelope), timestamp)
        # The watermark follows the newest event time read, but never passes the clock: one
        # envelope from the future must not fire every key's event-time timers (idle TTLs).
        # With nothing to read the reader is at the head of the log, so it follows the clock.
        head = now if newest is None else min(newest, now)
        self._advance_watermark(watermark, head - self._watermark_lag)
        tracker.defer_remainder()
        self._read_ahead(position)

    def _read_request(self, position: int, wait_ms: int) -> tuple[ReadRequest, dict[str, Any]]:
        """A ``Read`` from ``position`` waiting up to ``wait_ms``, and its call options."""
        request = ReadRequest(
            from_offset=position,
            max_batch=self._batch_limit,
            wait_ms=wait_ms,
            max_bytes=_READ_MAX_BYTES,
        )
        options = {"timeout": _RPC_TIMEOUT_S + wait_ms / 1000, "metadata": self._metadata}
        return request, options

    def _read_ahead(self, position: int) -> None:
        """Send the next remainder's ``Read`` now: it waits for the log while the bundle ends."""
        request, options = self._read_request(position, self._poll_wait_ms)
        self._next_read = (position, self._stub.Read.future(request, **options))

    def _poll(self, position: int) -> tuple[Any, bool]:
        """The envelopes from ``position``, and whether they come from the read sent ahead.

        That read is taken if it is for ``position`` and still waiting or answered with
        envelopes; one that found nothing, or failed, is not: a new read looks at the log now.
        """
        next_read, self._next_read = self._next_read, None
        if next_read is not None:
            at, call = next_read
            if at == position and (not call.done() or _has_records(call)):
                return call.result(), True
            call.cancel()
        request, options = self._read_request(position, self._poll_wait_ms)
        return self._stub.Read(request, **options), False

    def _records(self, response: Any, sent_ahead: bool) -> Iterator[Any]:
        """The records of ``response``; after those of a read sent ahead, what came since.

        A read sent ahead answers as soon as the log grows, often with a few envelopes only;
        one more read, which does not wait, is sent before those are taken and takes the rest.
        """
        records = response.records
        rest = None
        if sent_ahead and 0 < len(records) < self._batch_limit:
            request, options = self._read_request(records[-1].offset + 1, 0)
            rest = self._stub.Read.future(request, **options)
        yield from records
        if rest is None:
            return
        try:
            yield from rest.result().records
        except grpc.RpcError:
            return  # the next poll reads them, and handles the failure

    def _ask_for_less(self, error: grpc.RpcError, position: int) -> bool:
        """Halve the batch after an answer too large to receive; whether it could."""
        if _status_code(error) != grpc.StatusCode.RESOURCE_EXHAUSTED or self._batch_limit == 1:
            return False
        self._batch_limit //= 2
        _log.warning(
            "reading the envelope log at %s from offset %d: the answer was too large to "
            "receive (%s); asking for at most %d envelope(s) per read",
            self._connection.target,
            position,
            _describe(error),
            self._batch_limit,
        )
        return True

    def _skip(self, offset: int, envelope: AgentEnvelope, problem: str) -> None:
        """Log and count an envelope no pipeline can take (Beam cannot timestamp it)."""
        self._skipped.inc()
        self._skipped_total += 1
        _log.error(
            "ReadEnvelopes from %s: skipped the envelope at offset %d (key %s, %s): %s, so "
            "Beam cannot timestamp it; the envelopes around it are delivered",
            self._connection.target,
            offset,
            _key_text(envelope.entity_key),
            envelope.WhichOneof("payload") or "no payload",
            problem,
        )

    def _report_future(self, offset: int, envelope: AgentEnvelope, ahead: Duration) -> None:
        """Log an envelope stamped later than the clock plus the lag (the watermark ignores it)."""
        _log.error(
            "ReadEnvelopes from %s: the envelope at offset %d (key %s, %s) has event_time_ms "
            "%d, %.0f s ahead of this worker's clock (more than the watermark lag of %.0f s); "
            "it is delivered, but the watermark follows the clock, not it: fix the clock or "
            "the event time of whoever published it",
            self._connection.target,
            offset,
            _key_text(envelope.entity_key),
            envelope.WhichOneof("payload") or "no payload",
            envelope.event_time_ms,
            ahead.micros / 1e6,
            self._watermark_lag.micros / 1e6,
        )

    def _report_progress(self, position: int) -> None:
        """Say how far the read got, once per progress interval."""
        interval = self._progress_interval_s
        now = time.monotonic()
        if interval is None or now - self._last_report < interval:
            return
        self._last_report = now
        try:
            status = self._stub.Status(
                StatusRequest(), timeout=_RPC_TIMEOUT_S, metadata=self._metadata
            )
        except grpc.RpcError as error:
            effector = f"effector status unavailable ({_describe(error)})"
        else:
            effector = (
                f"effector: {status.in_flight} intent(s) in flight "
                f"({status.awaiting_decision} awaiting a decision), {status.done} done, "
                f"log head {status.head_offset}"
            )
        skipped = f", {self._skipped_total} skipped" if self._skipped_total else ""
        progress_line(
            f"ReadEnvelopes: {self._read_total} envelope(s) read{skipped}, next offset "
            f"{position}; {effector}"
        )

    def _advance_watermark(self, watermark: Any, candidate: Timestamp) -> None:
        current = watermark.current_watermark()
        if current is None or candidate > current:
            watermark.set_watermark(candidate)

    def _idle_and_drained(self, position: int) -> bool:
        """Whether to stop: told to, idle for long enough, nothing in flight, nothing unread."""
        if self._stop_when_idle_s is None:
            return False
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self._stop_when_idle_s:
            return False
        status = self._stub.Status(StatusRequest(), timeout=_RPC_TIMEOUT_S, metadata=self._metadata)
        # The store counts before it reads the head, so a result published after the counts
        # shows in the head and is read before stopping.
        if status.in_flight == 0 and status.head_offset < position:
            return True
        if status.in_flight:
            self._say_why_not_stopping(now - self._idle_since, status)
        return False

    def _say_why_not_stopping(self, idle_s: float, status: Any) -> None:
        """Say, once per progress interval, what keeps an idle reader from stopping."""
        interval = self._progress_interval_s or DEFAULT_PROGRESS_INTERVAL_S
        now = time.monotonic()
        last = self._last_blocked_report
        if last is not None and now - last < interval:
            return
        self._last_blocked_report = now
        awaiting = ""
        if status.awaiting_decision:
            awaiting = (
                f"; approvals awaiting a decision: {self._awaiting_ids()} (decide them with "
                "beam-agents-effector approve/deny, or wait for them to expire)"
            )
        progress_line(
            f"ReadEnvelopes: idle for {idle_s:.0f} s but not stopping: the effector at "
            f"{self._connection.target} has {status.in_flight} intent(s) in flight "
            f"({status.pending} pending, {status.running} running, {status.in_doubt} in doubt, "
            f"{status.awaiting_decision} awaiting a decision){awaiting}"
        )

    def _awaiting_ids(self) -> str:
        """The first approvals awaiting a decision, by id (or why they cannot be listed)."""
        try:
            listed = self._stub.ListIntents(
                ListIntentsRequest(state=IntentState.AWAITING_DECISION, limit=_AWAITING_SHOWN),
                timeout=_RPC_TIMEOUT_S,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            return f"(not listed: {_describe(error)})"
        return ", ".join(
            f"{intent.intent_id} (key {_key_text(intent.entity_key)})" for intent in listed.intents
        )

    def _back_off(self, error: grpc.RpcError) -> None:
        if not _is_transient(error):
            raise _call_failure(
                "reading the envelope log", self._connection.target, error
            ) from error
        self._retries.inc()
        delay = min(_RETRY_MAX_S, _RETRY_INITIAL_S * 2**self._failures)
        self._failures += 1
        _log.warning(
            "reading the envelope log at %s failed (%s); retrying in %.1f s",
            self._connection.target,
            _describe(error),
            delay,
        )
        # Slept here rather than requested as a resume delay: local runners resume at once.
        time.sleep(delay)


def _has_records(call: grpc.Future) -> bool:
    """Whether a finished ``Read`` call succeeded with envelopes."""
    return call.exception() is None and bool(call.result().records)


class ReadEnvelopes(beam.PTransform[PBegin, PCollection[tuple[bytes, AgentEnvelope]]]):
    """Read the effector's envelope log as ``KV[bytes, AgentEnvelope]``, timestamped by event time.

    Elements are ``(envelope.entity_key, envelope)`` in log order, timestamped by event time.

    - ``events``: external events to publish before reading; reading starts at the first of
      them, so the output is those events and every envelope appended after them. This is
      the single source a local runner needs to close the loop.
    - ``start_offset``: where to start instead (default: the first published event, else 1).
    - ``stop_when_idle_s``: stop once nothing has arrived for this long, the effector has
      nothing in flight (an approval awaiting a decision counts) and the log is read to its
      end. ``None`` (default) reads forever.
    - ``max_batch``: envelopes per ``Read``; ``poll_wait_ms``: how long one ``Read`` waits
      (at most 60 000). The next ``Read`` is sent before a bundle ends.
    - ``watermark_lag_s``: how far the watermark trails the newest event time read, or the
      reader's clock when that is earlier.
    - ``progress_interval_s``: how often one line says how far the read got and what the
      effector holds (INFO, or stderr when INFO is not logged); ``None``: no such line. An
      idle reader that does not stop says why as often (every 15 s with ``None``), naming
      the approvals it waits for.
    - ``token``, ``token_env``, ``tls_root_cert``: as for :class:`EffectorConnection`.

    An envelope whose ``event_time_ms`` is outside years 1-9999 cannot be timestamped: it is
    skipped with an ERROR line and counted (``envelopes_skipped``); the rest are delivered.
    An envelope stamped more than ``watermark_lag_s`` ahead of the reader's clock is delivered
    with an ERROR line; the watermark does not follow it past the clock.

    Reading retries transient failures indefinitely; a wrong token fails the pipeline with
    ``PermissionError``. Publishing is not retried, since a cut-off ``Publish`` may have been
    applied: the pipeline fails with ``ConnectionError`` and running it again is safe. An
    event too large for one effector request is refused when the transform is built.
    """

    def __init__(
        self,
        target: str | EffectorConnection,
        *,
        events: Iterable[AgentEnvelope] | None = None,
        start_offset: int | None = None,
        stop_when_idle_s: float | None = None,
        max_batch: int = 500,
        poll_wait_ms: int = 200,
        watermark_lag_s: float = 60.0,
        progress_interval_s: float | None = DEFAULT_PROGRESS_INTERVAL_S,
        token: str | None = None,
        token_env: str | None = None,
        tls_root_cert: str | os.PathLike[str] | bytes | None = None,
    ) -> None:
        super().__init__()
        if progress_interval_s is not None and not progress_interval_s > 0:
            raise ValueError(
                f"progress_interval_s must be positive (or None for no progress lines), got "
                f"{progress_interval_s}"
            )
        if start_offset is not None and start_offset < 1:
            raise ValueError(f"start_offset counts from 1, got {start_offset}")
        if stop_when_idle_s is not None and stop_when_idle_s <= 0:
            raise ValueError("stop_when_idle_s must be positive (or None to read forever)")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if not 0 <= poll_wait_ms <= _MAX_POLL_WAIT_MS:
            raise ValueError(f"poll_wait_ms must be between 0 and {_MAX_POLL_WAIT_MS}")
        if watermark_lag_s < 0:
            raise ValueError(f"watermark_lag_s must not be negative, got {watermark_lag_s}")
        connection = _connection(target, token, token_env, tls_root_cert)
        self._publish_fn = _PublishInitialEventsFn(
            connection, _encode_events(events or ()), start_offset
        )
        self._read_fn = _ReadLogFn(
            connection,
            max_batch,
            poll_wait_ms,
            stop_when_idle_s,
            watermark_lag_s,
            progress_interval_s,
        )

    def expand(self, pbegin: PBegin) -> PCollection[tuple[bytes, AgentEnvelope]]:
        """Impulse → publish the events → read the log from the first one."""
        prefer_fn_api_runner(pbegin.pipeline)
        envelopes: PCollection[tuple[bytes, AgentEnvelope]] = (
            pbegin
            | "Start" >> beam.Impulse()
            | "Publish" >> beam.ParDo(self._publish_fn)
            | "ReadLog" >> beam.ParDo(self._read_fn).with_output_types(tuple[bytes, AgentEnvelope])
        )
        return envelopes


def _encode_events(events: Iterable[AgentEnvelope]) -> list[bytes]:
    encoded: list[bytes] = []
    for position, envelope in enumerate(events):
        if not isinstance(envelope, AgentEnvelope):
            raise ValueError(
                f"events must be AgentEnvelopes; event {position} is a {type(envelope).__name__}"
            )
        problem = entity_key_problem(envelope.entity_key)
        if problem is not None:
            raise ValueError(f"event {position} {problem}")
        problem = time_problem("event_time_ms", envelope.event_time_ms)
        if problem is not None:
            raise ValueError(f"event {position}: {problem}")
        if envelope.WhichOneof("payload") != "external_event":
            raise ValueError(
                f"event {position} is not an external_event envelope: only the effector "
                "publishes tool results and approvals"
            )
        raw = envelope.SerializeToString()
        if len(raw) > MAX_ENVELOPE_BYTES:
            raise ValueError(
                f"event {position} is {len(raw)} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit "
                "of one envelope; keep large payloads elsewhere and send a reference"
            )
        encoded.append(raw)
    return encoded


# -- the local runner: the DirectRunner's FnApiRunner for a pipeline that reads the effector ---
# The DirectRunner hands a pipeline with processing-time timers to its bundle-based runner,
# which cannot run ReadEnvelopes' unbounded read; such a pipeline runs on the FnApiRunner.
class LoopRunner(FnApiRunner):
    """The ``FnApiRunner``, refusing a ``TestStream`` (which it cannot play), without a state cache.

    Beam's in-process worker caches user state, weighing each value it stores by walking every
    loaded module (``objsize``): about 0.3 ms for each state cell a bundle writes, several per
    activation. The state it would cache is in memory in this process already.
    """

    def run_pipeline(self, pipeline: beam.Pipeline, options: Any) -> Any:
        """Run on the ``FnApiRunner`` unless a ``TestStream`` needs the bundle-based runner."""
        if _has_test_stream(pipeline):
            raise ValueError(
                "ReadEnvelopes and TestStream cannot share a pipeline on the DirectRunner: "
                "feed RunAgent from one of them (beam_agents.testing.EnvelopeStream replays "
                "results without an effector)"
            )
        with _NoStateCache():
            return super().run_pipeline(pipeline, options)


class _NoStateCache:
    """While any loop runs, Beam's in-process workers are created without a user-state cache."""

    _lock = threading.Lock()
    _runs = 0
    _size_mb = 0
    """Beam's setting when the first of the loops running now started, restored after the last."""

    def __enter__(self) -> None:
        with self._lock:
            if not _NoStateCache._runs:
                _NoStateCache._size_mb = worker_handlers.STATE_CACHE_SIZE_MB
                worker_handlers.STATE_CACHE_SIZE_MB = 0
            _NoStateCache._runs += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            _NoStateCache._runs -= 1
            if not _NoStateCache._runs:
                worker_handlers.STATE_CACHE_SIZE_MB = _NoStateCache._size_mb


def prefer_fn_api_runner(pipeline: beam.Pipeline) -> None:
    """Run ``pipeline`` on :class:`LoopRunner` if it is on the default ``DirectRunner``."""
    if isinstance(pipeline.runner, BundleBasedDirectRunner):
        raise ValueError(
            "ReadEnvelopes cannot run on BundleBasedDirectRunner (it cannot run an unbounded "
            "read): use beam.Pipeline() or beam.Pipeline(runner=FnApiRunner())"
        )
    if type(pipeline.runner) is SwitchingDirectRunner:
        _log.info("ReadEnvelopes: the DirectRunner runs this pipeline on its FnApiRunner")
        pipeline.runner = LoopRunner()


def _has_test_stream(pipeline: beam.Pipeline) -> bool:
    class _Finder(PipelineVisitor):
        found = False

        def visit_transform(self, applied: Any) -> None:
            self.found = self.found or isinstance(applied.transform, TestStream)

    finder = _Finder()
    pipeline.visit(finder)
    return finder.found
