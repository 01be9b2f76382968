"""The ``beam_agents.v1.Effector`` RPCs: validate each request, run it on the store, answer.

:class:`EffectorService` checks every request against the limits below and answers with a
status code, never a crash; Submit acknowledges each intent in request order (the outcomes are
described in ``effector/README.md``). :func:`add_effector_service` registers it with parsers
that turn undecodable bytes into INVALID_ARGUMENT instead of UNKNOWN.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

import beam_agents._protos as pb
import effector.audit as audit
import effector.decisions as decisions
from beam_agents._protos.effector_pb2 import DESCRIPTOR as _EFFECTOR_FILE
from beam_agents.tools import ToolRegistry
from effector.compensation import intake_rejection
from effector.decisions import MAX_TEXT_FIELD_CHARS as MAX_TEXT_FIELD_CHARS
from effector.errors import StoreError
from effector.identities import Approver, Tokens
from effector.intents import (
    activation_record_problem,
    agent_error_problem,
    external_event_problem,
    identity_problem,
    intent_id_problem,
    trace_event_problem,
)
from effector.metrics import EffectorMetrics
from effector.records import DEFAULT_RUNS, MAX_RUNS, list_records_problem, records_page
from effector.store.base import Decision, EffectorStore, NewIntent, Recorded, SubmitOutcome
from effector.worker import Worker

_log = logging.getLogger(__name__)

_EFFECTOR = _EFFECTOR_FILE.services_by_name["Effector"]
EFFECTOR_SERVICE = _EFFECTOR.full_name
"""The fully qualified gRPC service name, ``beam_agents.v1.Effector``."""

MAX_SUBMIT_BATCH = 1_000
"""The most intents one Submit may carry."""
MAX_PUBLISH_BATCH = 1_000
"""The most envelopes one Publish may carry."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest request or response message, in bytes."""
DEFAULT_READ_BATCH = 500
"""Envelopes per Read when the request leaves ``max_batch`` at 0."""
MAX_READ_BATCH = 5_000
"""The most envelopes one Read returns."""
MAX_READ_WAIT_MS = 60_000
"""The longest a Read waits for new envelopes."""
DEFAULT_LIST_LIMIT = 100
"""Intents per ListIntents when the request leaves ``limit`` at 0."""
MAX_LIST_LIMIT = 1_000
"""The most intents one ListIntents returns."""
MAX_TELEMETRY_BATCH = 1_000
"""The most trace events one RecordTraces, or error records one RecordErrors, may carry."""

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_Message = TypeVar("_Message", bound=Message)


class _RequestError(ValueError):
    """A request refused as invalid: its message is safe to show to the caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> _RequestError:
    return _RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_batch_size(count: int, limit: int, rpc: str, items: str) -> None:
    """Refuse an empty batch or one over ``limit``, saying which and what to do."""
    if count == 0:
        raise _invalid(f"empty batch: a {rpc} carries at least one {items[:-1]}")
    if count > limit:
        raise _invalid(f"batch of {count} {items} is over the limit of {limit}; split it")


@dataclasses.dataclass(frozen=True, slots=True)
class _UndecodableRequest:
    """Stands in for a request whose bytes did not parse, so the RPC can refuse it properly."""

    problem: str


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except DecodeError as exc:
            return _UndecodableRequest(str(exc))

    return parse


def add_effector_service(servicer: pb.EffectorServicer, server: grpc.aio.Server) -> None:
    """Register the Effector RPCs on ``server`` with parsers that tolerate undecodable bytes.

    Left to the generated registration, gRPC reports a request that fails to parse as
    UNKNOWN, with the parser's exception in the details; here such a request reaches its RPC
    as an :class:`_UndecodableRequest`, which answers INVALID_ARGUMENT. Wrapping the parsers
    once, at registration, costs nothing per call (a server interceptor would run per call).
    """
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=_tolerant(GetMessageClass(method.input_type).FromString),
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
        for method in _EFFECTOR.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(EFFECTOR_SERVICE, handlers),)
    )
    server.add_registered_method_handlers(EFFECTOR_SERVICE, handlers)


def _guarded(
    method: Callable[[Any, _Request, grpc.aio.ServicerContext], Awaitable[_Response]],
) -> Callable[[Any, _Request, grpc.aio.ServicerContext], Awaitable[_Response]]:
    """Turn every failure of an RPC into a status code with a message safe to show."""

    @functools.wraps(method)
    async def handler(self: Any, request: _Request, context: grpc.aio.ServicerContext) -> _Response:
        try:
            if isinstance(request, _UndecodableRequest):
                raise _invalid(f"the request is not a valid protobuf message: {request.problem}")
            return await method(self, request, context)
        except _RequestError as exc:
            await context.abort(exc.code, exc.message)
        except StoreError as exc:
            _log.warning("%s failed: %s", method.__name__, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the effector's store is unavailable")
        except Exception:
            _log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error in the effector")
        raise AssertionError("context.abort always raises")

    return handler


_LISTABLE_STATES = (
    pb.IntentState.PENDING,
    pb.IntentState.RUNNING,
    pb.IntentState.AWAITING_DECISION,
    pb.IntentState.DONE,
    pb.IntentState.IN_DOUBT,
)
_LISTABLE_NAMES = ", ".join(pb.IntentState.Name(state) for state in _LISTABLE_STATES)


def _response(message: type[_Message], answer: Any, **more: Any) -> _Message:
    """A ``message`` with each field of the store's ``answer`` (a dataclass) it has; ``more``."""
    known = message.DESCRIPTOR.fields_by_name
    names = [field.name for field in dataclasses.fields(answer) if field.name in known]
    fields = {name: getattr(answer, name) for name in names}
    return message(**fields, **more)


def _check_intent_id(intent_id: str) -> None:
    problem = intent_id_problem(intent_id)
    if problem is not None:
        raise _invalid(problem)


@dataclasses.dataclass(frozen=True, slots=True)
class _Stored:
    """What a RecordTraces or RecordErrors call did: the store's counts and the refused items."""

    recorded: int
    duplicates: int
    rejected: int
    first_problem: str


@dataclasses.dataclass(frozen=True)
class EffectorService(pb.EffectorServicer):
    """The ``beam_agents.v1.Effector`` RPCs over one store (see the module docstring)."""

    store: EffectorStore
    registry: ToolRegistry
    """The tools an intent may name; Submit rejects any other."""
    worker: Worker
    """Woken when new work is accepted."""
    metrics: EffectorMetrics
    clock: Callable[[], int]
    """The effector's wall clock, in milliseconds."""
    tokens: Tokens | None = None
    """The tokens callers present; named ones identify the approver of a decision."""

    @_guarded
    async def Submit(
        self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitResponse:
        """Record a batch of intents; one acknowledgement per intent, in request order."""
        _check_batch_size(len(request.intents), MAX_SUBMIT_BATCH, "Submit", "intents")
        acks: list[pb.SubmitAck] = []
        to_record: list[NewIntent] = []
        for intent in request.intents:
            problem = identity_problem(intent)
            if problem is None:
                to_record.append(NewIntent(intent, intake_rejection(self.registry, intent)))
                acks.append(pb.SubmitAck(intent_id=intent.intent_id))
            else:
                acks.append(
                    pb.SubmitAck(
                        intent_id=intent.intent_id[:128],
                        outcome=pb.SubmitAck.REJECTED,
                        reason=problem,
                    )
                )
                self.metrics.rejected.labels("malformed").inc()
                audit.rejected(intent, problem)
        positions = [
            i for i, ack in enumerate(acks) if ack.outcome == pb.SubmitAck.OUTCOME_UNSPECIFIED
        ]
        answers = (
            await self.store.submit(
                to_record, self.clock(), redeliver_results=request.redeliver_results
            )
            if to_record
            else []
        )
        accepted = 0
        for position, new, answer in zip(positions, to_record, answers, strict=True):
            ack = acks[position]
            ack.state = answer.state
            if answer.result is not None:
                ack.result.CopyFrom(answer.result)
            if answer.outcome is SubmitOutcome.DUPLICATE:
                ack.outcome = pb.SubmitAck.DUPLICATE
                self.metrics.duplicates.inc()
                if answer.redelivered:
                    self.metrics.redelivered.inc()
            elif answer.outcome is SubmitOutcome.CONFLICT:
                ack.outcome = pb.SubmitAck.REJECTED
                ack.reason = (
                    f"conflict: intent {new.intent.intent_id} is already recorded with different "
                    f"content ({audit.CONFLICT_HINT}); the first submission is kept"
                )
                self.metrics.rejected.labels("conflict").inc()
                audit.conflict(new.intent, answer.recorded)
            elif (rejection := new.rejection or answer.rejection) is not None:
                ack.outcome = pb.SubmitAck.REJECTED
                ack.reason = rejection
                self.metrics.rejected.labels("invalid").inc()
                audit.rejected(new.intent, rejection)
            else:
                ack.outcome = pb.SubmitAck.ACCEPTED
                accepted += 1
        if accepted:
            self.metrics.accepted.inc(accepted)
            self.worker.wake()
        return pb.SubmitResponse(acks=acks)

    @_guarded
    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadResponse:
        """Envelopes from an offset, in order; waits up to ``wait_ms`` if there are none yet."""
        if request.from_offset < 0 or request.max_batch < 0 or request.wait_ms < 0:
            raise _invalid("from_offset, max_batch and wait_ms must not be negative")
        from_offset = max(request.from_offset, 1)
        limit = min(request.max_batch or DEFAULT_READ_BATCH, MAX_READ_BATCH)
        records = await self.store.read(from_offset, limit)
        if not records and request.wait_ms:
            await self.store.wait_for_offset(
                from_offset, min(request.wait_ms, MAX_READ_WAIT_MS) / 1000
            )
            records = await self.store.read(from_offset, limit)
        return pb.ReadResponse(
            records=[pb.EnvelopeRecord(offset=r.offset, envelope=r.envelope) for r in records],
            next_offset=records[-1].offset + 1 if records else from_offset,
        )

    @_guarded
    async def GetIntent(
        self, request: pb.GetIntentRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetIntentResponse:
        """Everything recorded about one intent; ``found`` is false if it is unknown."""
        _check_intent_id(request.intent_id)
        record = await self.store.get_intent(request.intent_id)
        if record is None:
            return pb.GetIntentResponse(found=False)
        in_doubt = record.state == pb.IntentState.IN_DOUBT
        response = pb.GetIntentResponse(
            found=True,
            state=record.state,
            intent=record.intent,
            result=record.result,
            attempts=record.attempts,
            in_doubt_reason=record.in_doubt_reason if in_doubt else "",
            retry_at_ms=(record.retry_at_ms or 0) if in_doubt else 0,
        )
        await decisions.add_approval_details(self.store, record, response)
        return response

    @_guarded
    async def Decide(
        self, request: pb.DecideRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecideResponse:
        """Record an approve/deny decision on an approval intent and publish it."""
        decision = await self.decide(
            request.intent_id,
            approved=request.approved,
            approver=request.approver,
            reason=request.reason,
            args_digest=request.args_digest,
            edited_args_json=request.edited_args_json,
            identity=decisions.caller(self.tokens, context.invocation_metadata()),
        )
        return _response(pb.DecideResponse, decision)

    async def decide(
        self,
        intent_id: str,
        *,
        approved: bool,
        approver: str,
        reason: str,
        args_digest: str = "",
        edited_args_json: str = "",
        identity: Approver | None = None,
    ) -> Decision:
        """Validate and record a decision: what ``Decide``, the console and MCP all run.

        ``identity``: the token the decision came with; a named one is the approver recorded
        and may be limited to channels (``effector/decisions.py``). Raises ``ValueError``
        (with a message safe to show) for an invalid request.
        """
        _check_intent_id(intent_id)
        ballot = decisions.Ballot(approved, approver, reason, args_digest, edited_args_json)
        try:
            return await decisions.decide(
                self.store, self.registry, intent_id, ballot, identity, self.clock()
            )
        except decisions.InvalidDecisionError as exc:
            raise _invalid(str(exc)) from None

    @_guarded
    async def Publish(
        self, request: pb.PublishRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishResponse:
        """Append external events to the envelope log (an event time of 0 is stamped now)."""
        return pb.PublishResponse(offsets=await self.publish(request.envelopes))

    async def publish(self, envelopes_in: Sequence[pb.AgentEnvelope]) -> list[int]:
        """Validate and append external events: what ``Publish`` and the console both run.

        Raises ``ValueError`` (with a message safe to show) for an invalid request.
        """
        _check_batch_size(len(envelopes_in), MAX_PUBLISH_BATCH, "Publish", "envelopes")
        now = self.clock()
        envelopes: list[pb.AgentEnvelope] = []
        for position, envelope in enumerate(envelopes_in):
            problem = external_event_problem(envelope)
            if problem is not None:
                raise _invalid(f"envelope {position} {problem}")
            stamped = pb.AgentEnvelope()
            stamped.CopyFrom(envelope)
            if not stamped.event_time_ms:
                stamped.event_time_ms = now
            envelopes.append(stamped)
        return await self.store.publish(envelopes, now)

    @_guarded
    async def ListIntents(
        self, request: pb.ListIntentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListIntentsResponse:
        """Intents in one state (or failed ones), oldest first by receipt, at most ``limit``."""
        if request.state not in _LISTABLE_STATES:
            raise _invalid(f"state must be one of {_LISTABLE_NAMES}, got {request.state}")
        if request.limit < 0:
            raise _invalid("limit must not be negative")
        limit = min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        if request.failed_only:
            if request.state != pb.IntentState.DONE:
                raise _invalid("failed_only lists DONE intents: set state to DONE")
            failed = await self.store.list_failed(limit)
            return pb.ListIntentsResponse(
                intents=[intent for intent, _ in failed], results=[result for _, result in failed]
            )
        return pb.ListIntentsResponse(intents=await self.store.list_intents(request.state, limit))

    @_guarded
    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        """How many intents are in each state, and the head of the envelope log."""
        counts = await self.store.counts()
        in_flight = counts.pending + counts.running + counts.in_doubt + counts.awaiting_decision
        return _response(pb.StatusResponse, counts, in_flight=in_flight)

    @_guarded
    async def RecordTraces(
        self, request: pb.RecordTracesRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecordTracesResponse:
        """Store the pipeline's trace events; one already stored (same span id) is kept."""
        stored = await self._record_telemetry(
            "RecordTraces", "events", request.events, trace_event_problem, self.store.record_traces
        )
        return _response(pb.RecordTracesResponse, stored)

    @_guarded
    async def RecordErrors(
        self, request: pb.RecordErrorsRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecordErrorsResponse:
        """Store the pipeline's ``.errors`` records; one already stored (same digest) is kept."""
        stored = await self._record_telemetry(
            "RecordErrors", "errors", request.errors, agent_error_problem, self.store.record_errors
        )
        return _response(pb.RecordErrorsResponse, stored)

    @_guarded
    async def RecordActivations(
        self, request: pb.RecordActivationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecordActivationsResponse:
        """Store the pipeline's activation records; one already stored (same place) is kept."""
        stored = await self._record_telemetry(
            "RecordActivations",
            "records",
            request.records,
            activation_record_problem,
            self.store.record_activations,
        )
        return _response(pb.RecordActivationsResponse, stored)

    @_guarded
    async def ListRecords(
        self, request: pb.ListRecordsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRecordsResponse:
        """A page of one key's activation records: its newest runs before ``before_seq``."""
        problem = list_records_problem(request)
        if problem is not None:
            raise _invalid(problem)
        max_runs = min(request.max_runs or DEFAULT_RUNS, MAX_RUNS)
        found = await self.store.records_for_key(
            request.entity_key, max_runs, before_seq=request.before_seq or None
        )
        records, next_before_seq = records_page(found, max_runs, MAX_MESSAGE_BYTES // 2)
        return pb.ListRecordsResponse(records=records, next_before_seq=next_before_seq)

    async def _record_telemetry(
        self,
        rpc: str,
        items: str,
        batch: Sequence[_Message],
        problem: Callable[[_Message], str | None],
        record: Callable[[Sequence[_Message], int], Awaitable[Recorded]],
    ) -> _Stored:
        """Store a telemetry batch's valid items and count the outcome; refuse invalid ones.

        An invalid item is left out (counted, the first one's problem reported, one WARNING
        per call), so one bad item never costs the rest of its batch.
        """
        _check_batch_size(len(batch), MAX_TELEMETRY_BATCH, rpc, items)
        kind = items[:-1]
        valid: list[_Message] = []
        problems: list[str] = []
        for position, item in enumerate(batch):
            found = problem(item)
            if found is None:
                valid.append(item)
            else:
                problems.append(f"{kind} {position} {found}")
        recorded = await record(valid, self.clock()) if valid else Recorded(0, 0)
        self.metrics.telemetry_recorded.labels(kind).inc(recorded.recorded)
        self.metrics.telemetry_duplicates.labels(kind).inc(recorded.duplicates)
        if problems:
            self.metrics.telemetry_rejected.labels(kind).inc(len(problems))
            _log.warning(
                "%s: refused %d of %d %s as invalid (the rest were stored); the first: %s",
                rpc,
                len(problems),
                len(batch),
                items,
                problems[0],
            )
        first_problem = problems[0] if problems else ""
        return _Stored(recorded.recorded, recorded.duplicates, len(problems), first_problem)
