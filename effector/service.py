"""The effector's service operations: what gRPC, the console and the MCP endpoint all run.

:class:`EffectorService` is the ``beam_agents.v1.Effector`` servicer; it checks every request
against the limits below, item by item: an item out of bounds (a time outside years 1-9999, JSON
too large or too deep, an oversized envelope) is refused alone, with a reason, never a crash.
Its ``decide`` and ``publish`` are the one path a decision or an external event takes, from any
of the three doors (the CLI decides over gRPC); every decision attempt logs one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

import beam_agents._protos as pb
import effector.observability as audit
from beam_agents._protos import (
    MAX_ATTRIBUTE_NAME_CHARS,
    MAX_ATTRIBUTES,
    MAX_ENTITY_KEY_BYTES,
    MAX_ENVELOPE_BYTES,
    MAX_TEXT_FIELD_CHARS,
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    IntentState,
    ToolIntent,
    TraceEvent,
    approval_digest,
    attribute_value_problem,
    bounds_problem,
    canonical_json,
    entity_key_problem,
    json_problem,
    recordable_problem,
    text_problem,
)
from beam_agents._protos.effector_pb2 import DESCRIPTOR as _EFFECTOR_FILE
from beam_agents.tools import ToolRegistry
from beam_agents.tools.errors import ToolArgumentError
from effector.observability import EffectorMetrics
from effector.policy import CountedBy, EffectCounter, LivePolicy, Outcome, gate_for, policy_answer
from effector.store.budgets import lease_problem
from effector.store.errors import ConfigurationError, StoreError
from effector.store.intents import (
    DEFAULT_RULE,
    Decision,
    IntentRecord,
    NewIntent,
    Recorded,
    SubmitOutcome,
    SubmitResult,
    expiry_deadline_ms,
    gate_id_for,
    intent_id_problem,
)
from effector.store.sql import SqlStore
from effector.store.telemetry import RecordPlace
from effector.worker import PreparedCall, Worker, screen_intent

_log = logging.getLogger(__name__)
_log.addFilter(audit.EscapingFilter())

MAX_SUBMIT_BATCH = 1_000
MAX_PUBLISH_BATCH = 1_000
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_READ_BATCH = 500
MAX_READ_BATCH = 5_000
MAX_READ_WAIT_MS = 60_000
DEFAULT_LIST_LIMIT = 100
DEFAULT_BUDGET_LEASE_MS = 60_000
MAX_LIST_LIMIT = 1_000
MAX_TELEMETRY_BATCH = 1_000
"""The most trace events one RecordTraces, or error records one RecordErrors, may carry."""
DEFAULT_RECORD_RUNS = 100
MAX_RECORD_RUNS = 1_000
MAX_READ_BYTES = MAX_MESSAGE_BYTES // 2
"""The default and largest ``ReadRequest.max_bytes``; one envelope more still fits a message."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""The largest activation record RecordActivations stores."""
MAX_ERROR_TEXT_CHARS = 64 * 1024
"""The longest ``detail`` or ``traceback`` an ``.errors`` record may carry."""
DIGEST_CHARS = 64
"""The length of an args digest (SHA-256, hex)."""
_ITEM_OVERHEAD_BYTES = 32
"""What one item adds to its size in an answer, at most (its tag and length)."""
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")


# -- addresses ----------------------------------------------------------------------------------


def parse_host_port(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 means any free port."""
    host, separator, port_text = text.rpartition(":")
    if not separator or not host or not port_text.isdigit():
        raise ConfigurationError(f"expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if port > 65_535:
        raise ConfigurationError(f"port {port} is out of range in {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def format_host_port(host: str, port: int) -> str:
    """Join a host and port the way gRPC targets spell them (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals; any other name, whatever it resolves to."""
    if host.lower() == "localhost":
        return True
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- who holds a token --------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
"""An approver's name: what a decision records, so printable and without separators."""
EMPTY_CHANNEL = "-"
"""How a channel list names the empty channel (approvals requested without one)."""


@dataclass(frozen=True, slots=True)
class Approver:
    """One token and who holds it: ``name`` ("" for a bare token) and its channel limit."""

    name: str
    token: str = field(repr=False)
    channels: frozenset[str] | None = None
    """The channels whose approvals this token may decide; ``None``: every channel."""

    def may_decide(self, channel: str) -> bool:
        """Whether this token may decide an approval requested on ``channel``."""
        return self.channels is None or channel in self.channels

    def refusal(self, channel: str) -> str | None:
        """Why this token may not decide on ``channel``, or ``None`` if it may."""
        if self.may_decide(channel):
            return None
        allowed = ", ".join(sorted(repr(name) for name in self.channels or ()))
        return (
            f"approver {self.name!r} may not decide approvals on channel {channel!r} "
            f"(its token is limited to {allowed})"
        )


@dataclass(frozen=True, slots=True)
class Tokens:
    """Every token the effector accepts; the first is the primary (the console keys off it)."""

    approvers: tuple[Approver, ...]

    def __post_init__(self) -> None:
        if not self.approvers:
            raise ConfigurationError("no token given")

    @classmethod
    def single(cls, token: str) -> Tokens:
        """A bare, unnamed token (``--token``, or a token file of one bare token)."""
        return cls((Approver("", token),))

    @property
    def primary(self) -> str:
        """The first token: the secret the console's session keys are derived from."""
        return self.approvers[0].token

    @property
    def named(self) -> bool:
        """Whether the tokens carry names (a token file of ``name:token`` lines)."""
        return bool(self.approvers[0].name)

    def identify(self, presented: str | bytes) -> Approver | None:
        """The holder of ``presented``, or ``None``; compares with every token, in constant time."""
        given = presented.encode() if isinstance(presented, str) else presented
        found = None
        for approver in self.approvers:
            if hmac.compare_digest(given, approver.token.encode()):
                found = approver
        return found

    def identify_bearer(self, header: str | bytes | None) -> Approver | None:
        """The holder of the token in an ``authorization: Bearer <token>`` value (any case)."""
        if header is None:
            return None
        value = header.encode() if isinstance(header, str) else header
        scheme, _, token = value.partition(b" ")
        if scheme.lower() != b"bearer":  # RFC 9110: the scheme is case-insensitive
            return None
        return self.identify(token.lstrip(b" "))


def parse_tokens(text: str, source: str) -> Tokens:
    """The tokens in a token file's ``text``; ``source`` names the file in errors.

    One bare token on its one line, or ``name:token`` lines, one per approver, each optionally
    ``name:token:channel1,channel2`` (``-`` names the empty channel). ``#`` starts a comment.
    """
    lines = [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#")
    ]
    if not lines:
        raise ConfigurationError(f"token file {source!r} is empty")
    if len(lines) == 1:
        return Tokens.single(lines[0][1])
    approvers = tuple(_named(source, number, line) for number, line in lines)
    for distinct in ({a.name for a in approvers}, {a.token for a in approvers}):
        if len(distinct) != len(approvers):
            raise ConfigurationError(f"token file {source!r} names an approver or a token twice")
    return Tokens(approvers)


def _named(source: str, number: int, line: str) -> Approver:
    where = f"token file {source!r} line {number}"
    parts = line.split(":")
    if len(parts) not in (2, 3):
        raise ConfigurationError(
            f"{where}: expected 'name:token' or 'name:token:channel,...' (a file of several "
            "tokens names each one)"
        )
    name, token = parts[0].strip(), parts[1].strip()
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"{where}: {name!r} is not an approver name (letters, digits and . _ @ + -)"
        )
    if not token:
        raise ConfigurationError(f"{where}: the token of {name!r} is empty")
    channels = None
    if len(parts) == 3:
        listed = [channel.strip() for channel in parts[2].split(",") if channel.strip()]
        if not listed:
            raise ConfigurationError(f"{where}: the channel list of {name!r} is empty")
        channels = frozenset("" if channel == EMPTY_CHANNEL else channel for channel in listed)
    return Approver(name, token, channels)


# -- what a request may carry -------------------------------------------------------------------


def intent_problem(intent: ToolIntent) -> str | None:
    """Why an intent cannot even be recorded, or ``None`` if it can.

    Its id, key, times, text lengths and JSON sizes and depths are checked here; what a valid
    intent may still be refused for (an unknown tool, bad arguments) is recorded as REJECTED.
    """
    problem = intent_id_problem(intent.intent_id)
    if problem is not None:
        return problem
    problem = recordable_problem(intent)
    return None if problem is None else f"intent {intent.intent_id} {problem}"


def external_event_problem(envelope: AgentEnvelope) -> str | None:
    """Why ``envelope`` may not be published by a caller (only external events), or ``None``."""
    problem = entity_key_problem(envelope.entity_key)
    if problem is not None:
        return problem
    if envelope.WhichOneof("payload") != "external_event":
        return (
            "is not an external_event: tool results and approvals are published only by the "
            "effector itself"
        )
    size = envelope.ByteSize()
    if size > MAX_ENVELOPE_BYTES:
        return (
            f"is {size} bytes, over the cap of {MAX_ENVELOPE_BYTES} (so that every Read answer "
            "fits in one message)"
        )
    return bounds_problem(envelope)


def trace_event_problem(event: TraceEvent) -> str | None:
    """Why a trace event cannot be stored (ids, key, times, attributes), or ``None`` if it can."""
    if not _TRACE_ID.fullmatch(event.trace_id):
        return f"has trace_id {event.trace_id[:64]!r}, not 32 lowercase hex digits"
    if not _SPAN_ID.fullmatch(event.span_id):
        return f"has span_id {event.span_id[:64]!r}, not 16 lowercase hex digits"
    return (
        entity_key_problem(event.entity_key)
        or text_problem(event)
        or bounds_problem(event)
        or _attributes_problem(event.attributes)
    )


def _attributes_problem(attributes: Mapping[str, str]) -> str | None:
    """Why a trace event's attributes are over the limits :mod:`beam_agents._protos` shares.

    Only a JSON-shaped value (see :func:`~beam_agents._protos.is_json_shaped`) is depth-checked.
    """
    if len(attributes) > MAX_ATTRIBUTES:
        return f"has {len(attributes)} attributes (at most {MAX_ATTRIBUTES})"
    for name, value in attributes.items():
        if len(name) > MAX_ATTRIBUTE_NAME_CHARS:
            return (
                f"has an attribute name of {len(name)} characters "
                f"(at most {MAX_ATTRIBUTE_NAME_CHARS})"
            )
        problem = attribute_value_problem(f"attribute {name[:64]!r}", value)
        if problem is not None:
            return f"has {problem}"
    return None


def agent_error_problem(error: AgentError) -> str | None:
    """Why an ``.errors`` record cannot be stored (key, times, sizes), or ``None`` if it can."""
    problem = (
        entity_key_problem(error.entity_key)
        or text_problem(error, allowed=("detail", "traceback"))
        or bounds_problem(error)
    )
    if problem is not None:
        return problem
    for name, text in (("detail", error.detail), ("traceback", error.traceback)):
        if len(text) > MAX_ERROR_TEXT_CHARS:
            return f"has a {name} of {len(text)} characters (at most {MAX_ERROR_TEXT_CHARS})"
    if len(error.envelope) > MAX_ENVELOPE_BYTES:
        return f"has an envelope of {len(error.envelope)} bytes (at most {MAX_ENVELOPE_BYTES})"
    try:
        envelope = AgentEnvelope.FromString(error.envelope)
    except DecodeError:
        return None  # a malformed element is what some errors record; it is stored as bytes
    problem = bounds_problem(envelope)
    return None if problem is None else f"has an envelope that {problem}"


def activation_record_problem(record: ActivationRecord) -> str | None:
    """Why an activation record cannot be stored (key, place, size, times), or ``None``."""
    if record.seq < 0 or record.trace_sequence < 0:
        return f"has seq {record.seq} and trace_sequence {record.trace_sequence}, not both >= 0"
    size = record.ByteSize()
    if size > MAX_RECORD_BYTES:
        return f"is {size} bytes (at most {MAX_RECORD_BYTES})"
    return entity_key_problem(record.entity_key) or bounds_problem(record, MAX_RECORD_BYTES)


# -- the checks a decision passes before the store records it -----------------------------------


def caller(tokens: Tokens | None, metadata: Iterable[tuple[str, Any]] | None) -> Approver | None:
    """The holder of the bearer token in a call's ``metadata``; ``None`` without tokens."""
    if tokens is None:
        return None
    return tokens.identify_bearer(dict(metadata or ()).get("authorization"))


async def add_approval_details(
    store: SqlStore, record: IntentRecord, response: pb.GetIntentResponse
) -> None:
    """Fill an approval's ``args_digest`` and, while it awaits a quorum, its votes so far."""
    intent = record.intent
    if intent.kind != ToolIntent.APPROVAL:
        return
    response.args_digest = approval_digest(intent.args_json)
    if record.state == IntentState.AWAITING_DECISION and intent.required_approvals > 1:
        response.votes.extend(await store.approval_votes(intent.intent_id))


def recorded_approver(identity: Approver | None, claimed: str) -> str:
    """The approver a decision records: a named token's name, else what the client claimed."""
    if identity is not None and identity.name:
        return identity.name
    return claimed


def screen_decision(
    record: IntentRecord | None,
    identity: Approver | None,
    approved: bool,
    edited_args_json: str,
    registry: ToolRegistry,
) -> tuple[Decision | None, str]:
    """A not-applied ``Decision`` refusing the decision, or ``None`` and the canonical edit.

    Unknown and decided intents pass through, for the store to answer.
    """
    intent = None if record is None else record.intent
    state = IntentState.INTENT_STATE_UNSPECIFIED if record is None else record.state
    if intent is None and identity is not None and identity.channels is not None:
        # Not recorded yet: a channel-limited approver may not race its submission.
        return Decision(False, IntentState.INTENT_STATE_UNSPECIFIED, "unknown intent", None), ""
    if (
        intent is None
        or intent.kind != ToolIntent.APPROVAL
        or state != IntentState.AWAITING_DECISION
    ):
        return None, ""
    if identity is not None:
        limited = identity.refusal(intent.channel)
        if limited is not None:
            return Decision(False, state, limited, None), ""
    if not edited_args_json:
        return None, ""
    problem, canonical = _edit_problem(intent, approved, edited_args_json, registry)
    if problem is not None:
        return Decision(False, state, problem, None), ""
    return None, "" if canonical == intent.args_json else canonical


def _edit_problem(
    intent: ToolIntent, approved: bool, edited_args_json: str, registry: ToolRegistry
) -> tuple[str | None, str]:
    if not approved:
        return "edited arguments come with an approval, not a denial", ""
    tool_name = intent.gated_tool
    if not tool_name:
        return (
            "this approval gates no tool (it was requested without tool=...), so its "
            "arguments cannot be edited; approve or deny it as asked",
            "",
        )
    if tool_name not in registry:
        return f"this effector has no tool {tool_name!r} to check the edited arguments", ""
    try:
        edited = json.loads(edited_args_json)
    except json.JSONDecodeError as exc:
        return f"the edited arguments are not valid JSON: {exc}", ""
    if not isinstance(edited, dict):
        return f"the edited arguments must be a JSON object, got {type(edited).__name__}", ""
    try:
        registry.get(tool_name).validate_arguments(edited)
    except ToolArgumentError as exc:
        return f"the edited arguments are invalid: {exc}", ""
    return None, canonical_json(edited)


# -- the servicer -------------------------------------------------------------------------------

_EFFECTOR = _EFFECTOR_FILE.services_by_name["Effector"]
EFFECTOR_SERVICE = _EFFECTOR.full_name
"""The fully qualified gRPC service name, ``beam_agents.v1.Effector``."""

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
    """Register the Effector RPCs on ``server``; undecodable bytes answer INVALID_ARGUMENT."""
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


_ACCEPTED = pb.SubmitAck.ACCEPTED
_DUPLICATE = pb.SubmitAck.DUPLICATE
_REFUSED = pb.SubmitAck.REJECTED

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


def _fitting(sizes: Iterable[int], max_bytes: int = MAX_READ_BYTES) -> int:
    """How many items of these ``sizes``, from the first, fit in ``max_bytes`` (one at least)."""
    kept = total = 0
    for size in sizes:
        total += size + _ITEM_OVERHEAD_BYTES
        if kept and total > max_bytes:
            break
        kept += 1
    return kept


def _list_limit(requested: int, default: int = DEFAULT_LIST_LIMIT) -> int:
    """A list request's limit: ``default`` for 0, capped at ``MAX_LIST_LIMIT``; never negative."""
    if requested < 0:
        raise _invalid("limit must not be negative")
    return min(requested or default, MAX_LIST_LIMIT)


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

    store: SqlStore
    registry: ToolRegistry
    """The tools an intent may name; Submit rejects any other."""
    worker: Worker
    """Woken when new work is accepted."""
    metrics: EffectorMetrics
    clock: Callable[[], int]
    """The effector's wall clock, in milliseconds."""
    tokens: Tokens | None = None
    """The tokens callers present; named ones identify the approver of a decision."""
    policy: LivePolicy | None = None
    """The effect policy every TOOL intent passes at intake (``None``: all are allowed)."""
    budget_lease_ms: int = DEFAULT_BUDGET_LEASE_MS
    """How long a fleet budget allowance lasts before its unspent part returns."""
    _counting: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)
    """Held while a Submit under a counting policy screens and records."""

    @_guarded
    async def Submit(
        self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitResponse:
        """Record a batch of intents; one acknowledgement per intent, in request order."""
        intents = request.intents
        _check_batch_size(len(intents), MAX_SUBMIT_BATCH, "Submit", "intents")
        metrics = self.metrics
        acks: list[pb.SubmitAck | None] = []
        to_record: list[NewIntent] = []
        prepared_calls: list[PreparedCall | None] = []
        for intent in intents:
            problem = intent_problem(intent)
            if problem is None:
                rejection, prepared = screen_intent(self.registry, intent)
                to_record.append(NewIntent(intent, rejection))
                prepared_calls.append(prepared)
                acks.append(None)  # acknowledged once the store has answered for it
            else:
                acks.append(
                    pb.SubmitAck(intent_id=intent.intent_id[:128], outcome=_REFUSED, reason=problem)
                )
                metrics.rejected_malformed.inc()
                audit.rejected(intent, problem)
        policy = self.policy
        # Counters count what is recorded: under a counting policy one Submit at a time screens
        # and records, so each sees the ones before it (replicas of one store may still overlap).
        counting = policy is not None and bool(policy.policy.counted)
        async with self._counting if counting else contextlib.nullcontext():
            now_ms = self.clock()
            if policy is not None and to_record:
                to_record = await self._screen_effects(policy, to_record, now_ms)
            answers = (
                await self.store.submit(
                    to_record, now_ms, redeliver_results=request.redeliver_results
                )
                if to_record
                else []
            )
        answered = iter(zip(to_record, prepared_calls, answers, strict=True))
        done = [ack if ack is not None else self._acknowledge(*next(answered)) for ack in acks]
        if policy is not None:  # the default's allows, counted once per Submit
            allowed = sum(
                1
                for new, answer in zip(to_record, answers, strict=True)
                if answer.outcome is SubmitOutcome.ACCEPTED
                and not new.policy_outcome
                and new.rejection is None
                and new.intent.kind == ToolIntent.TOOL
            )
            if allowed:
                metrics.count_decision("", Outcome.ALLOW.value, allowed)
        accepted = sum(ack.outcome == _ACCEPTED for ack in done)
        if accepted:
            metrics.accepted.inc(accepted)
            self.worker.wake()
        return pb.SubmitResponse(acks=done)

    async def _screen_effects(
        self, policy: LivePolicy, to_record: list[NewIntent], now_ms: int
    ) -> list[NewIntent]:
        """``to_record`` with the policy's verdict on each valid TOOL intent applied."""
        screened = [
            index
            for index, new in enumerate(to_record)
            if new.rejection is None and new.intent.kind == ToolIntent.TOOL
        ]
        if screened and policy.policy.counted:  # a duplicate is counted already: not again
            recorded = await self.store.recorded_ids(
                [to_record[i].intent.intent_id for i in screened]
            )
            screened = [i for i in screened if to_record[i].intent.intent_id not in recorded]
        if not screened:
            return to_record
        verdicts = await policy.screen(
            [(to_record[index].intent, None) for index in screened], now_ms, self._count_effects
        )
        screened_records = list(to_record)
        for index, verdict in zip(screened, verdicts, strict=True):
            if not verdict.rule and verdict.outcome is Outcome.ALLOW:
                continue
            intent = to_record[index].intent
            gate = (
                gate_for(intent, verdict) if verdict.outcome is Outcome.REQUIRE_APPROVAL else None
            )
            screened_records[index] = NewIntent(
                intent,
                verdict.rejection(),
                policy_rule=verdict.rule or DEFAULT_RULE,
                policy_outcome=verdict.outcome.value,
                gate=gate,
                policy_reason=verdict.reason,
            )
        return screened_records

    def _count_decision(self, new: NewIntent) -> None:
        """Count and log a rule's (or a deciding default's) decision on a new intent."""
        if new.policy_outcome:
            rule = "" if new.policy_rule == DEFAULT_RULE else new.policy_rule
            self.metrics.count_decision(rule, new.policy_outcome)
            audit.policy_decided(new.intent, rule, new.policy_outcome, new.policy_reason)

    def _acknowledge(
        self, new: NewIntent, prepared: PreparedCall | None, answer: SubmitResult
    ) -> pb.SubmitAck:
        """The acknowledgement of a recorded intent from the store's answer; counts and logs it."""
        intent = new.intent
        metrics = self.metrics
        if self.policy is not None and answer.outcome is SubmitOutcome.ACCEPTED:
            self._count_decision(new)
        if answer.outcome is SubmitOutcome.DUPLICATE:
            metrics.duplicates.inc()
            if answer.redelivered:
                metrics.redelivered.inc()
            return pb.SubmitAck(
                intent_id=intent.intent_id,
                outcome=_DUPLICATE,
                state=answer.state,
                result=answer.result,
            )
        if answer.outcome is SubmitOutcome.CONFLICT:
            metrics.rejected_conflict.inc()
            audit.conflict(intent, answer.recorded)
            return pb.SubmitAck(
                intent_id=intent.intent_id,
                outcome=_REFUSED,
                state=answer.state,
                # What the waiting run receives, published.
                result=answer.result if answer.refusal is None else answer.refusal,
                reason=(
                    f"conflict: intent {intent.intent_id} is already recorded with different "
                    f"content ({audit.CONFLICT_HINT}); the first submission is kept, and a "
                    "REJECTED result was published to the run that submitted this one"
                ),
            )
        rejection = new.rejection or answer.rejection
        if rejection is not None:
            if new.policy_outcome == Outcome.DENY.value and new.rejection is not None:
                metrics.rejected_policy.inc()  # its decision is logged already
            else:
                metrics.rejected_invalid.inc()
                audit.rejected(intent, rejection)
            return pb.SubmitAck(
                intent_id=intent.intent_id,
                outcome=_REFUSED,
                state=answer.state,
                result=answer.result,
                reason=rejection,
            )
        if prepared is not None and new.gate is None:
            self.worker.keep_validated(intent.intent_id, prepared, len(intent.args_json))
        return pb.SubmitAck(
            intent_id=intent.intent_id, outcome=_ACCEPTED, state=answer.state, result=answer.result
        )

    @_guarded
    async def Policies(
        self, request: pb.PoliciesRequest, context: grpc.aio.ServicerContext
    ) -> pb.PoliciesResponse:
        """The effect policy in force, each rule's decisions, and the newest decisions."""
        return await self.policies(_list_limit(request.limit, DEFAULT_LIST_LIMIT // 5))

    async def policies(self, limit: int) -> pb.PoliciesResponse:
        """:meth:`Policies`' answer: the one path of the RPC, the console and the CLI."""
        gate = self.policy
        if gate is None:
            return pb.PoliciesResponse(enforced=False, default_outcome=Outcome.ALLOW.value)
        answer = policy_answer(gate.policy, await self.store.policy_rule_counts())
        answer.loaded_at_ms = gate.loaded_at_ms
        answer.reload_error = gate.reload_error
        answer.recent.extend(await self.store.policy_decisions(limit))
        return answer

    @_guarded
    async def LeaseBudget(
        self, request: pb.LeaseBudgetRequest, context: grpc.aio.ServicerContext
    ) -> pb.LeaseBudgetResponse:
        """Grant a worker an allowance of a fleet budget's window (releasing its old lease)."""
        problem = lease_problem(request)
        if problem is not None:
            raise _invalid(problem)
        answer = await self.store.lease_budget(request, self.clock(), self.budget_lease_ms)
        asked = request.want_tokens or request.want_cost_micros or request.want_requests
        if not answer.lease_id and asked:
            self.metrics.budget_refusals.inc()
        return answer

    @_guarded
    async def Budgets(
        self, request: pb.BudgetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.BudgetsResponse:
        """The newest budget windows: caps, debited, leased and live leases."""
        limit = _list_limit(request.limit)
        return pb.BudgetsResponse(windows=await self.store.budget_windows(limit, self.clock()))

    @_guarded
    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadResponse:
        """Envelopes from an offset, in order, within ``max_bytes`` (at least one if any).

        Waits up to ``wait_ms`` if there are none yet.
        """
        if min(request.from_offset, request.max_batch, request.wait_ms, request.max_bytes) < 0:
            raise _invalid("from_offset, max_batch, wait_ms and max_bytes must not be negative")
        from_offset = max(request.from_offset, 1)
        limit = min(request.max_batch or DEFAULT_READ_BATCH, MAX_READ_BATCH)
        max_bytes = min(request.max_bytes or MAX_READ_BYTES, MAX_READ_BYTES)
        records = await self.store.read(from_offset, limit, max_bytes)
        if not records and request.wait_ms:
            await self.store.wait_for_offset(
                from_offset, min(request.wait_ms, MAX_READ_WAIT_MS) / 1000
            )
            records = await self.store.read(from_offset, limit, max_bytes)
        response = pb.ReadResponse(next_offset=records[-1].offset + 1 if records else from_offset)
        add = response.records.add  # in place: no record built, then copied into the answer
        for record in records:
            add(offset=record.offset, envelope=record.envelope)
        return response

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
            received_at_ms=record.received_at_ms,
            deadline_ms=expiry_deadline_ms(record.intent, record.received_at_ms),
            policy_rule=record.policy_rule,
            policy_outcome=record.policy_outcome,
        )
        if record.policy_outcome == Outcome.REQUIRE_APPROVAL.value:
            response.policy_gate_id = gate_id_for(record.intent.intent_id)
        await add_approval_details(self.store, record, response)
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
            identity=caller(self.tokens, context.invocation_metadata()),
            origin=f"gRPC from {context.peer()}",
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
        origin: str = "",
    ) -> Decision:
        """Screen a decision and record it: the one path of ``Decide``, the console, MCP and CLI.

        A named ``identity`` (the caller's token) is the approver recorded. Raises ``ValueError``
        (with a message safe to show) for an invalid request. Every attempt logs one line, with
        ``origin`` (the path and client it came from).
        """
        approver = recorded_approver(identity, approver)
        try:
            decision = await self._decide(
                intent_id,
                approved=approved,
                approver=approver,
                reason=reason,
                args_digest=args_digest,
                edited_args_json=edited_args_json,
                identity=identity,
            )
        except _RequestError as exc:
            problem = f"invalid request: {exc.message}"
            audit.decision(intent_id, approved, approver, False, problem, origin)
            raise
        except BaseException as exc:
            failure = f"failed: {type(exc).__name__}"
            audit.decision(intent_id, approved, approver, False, failure, origin)
            raise
        audit.decision(intent_id, approved, approver, decision.applied, decision.reason, origin)
        return decision

    async def _decide(
        self,
        intent_id: str,
        *,
        approved: bool,
        approver: str,
        reason: str,
        args_digest: str,
        edited_args_json: str,
        identity: Approver | None,
    ) -> Decision:
        _check_intent_id(intent_id)
        if edited_args_json:
            problem = json_problem("edited_args_json", edited_args_json)
            if problem is not None:
                raise _invalid(f"the decision {problem}")
        for name, text in (("approver", approver), ("reason", reason)):
            if len(text) > MAX_TEXT_FIELD_CHARS:
                raise _invalid(f"{name} is longer than {MAX_TEXT_FIELD_CHARS} characters")
        if args_digest and (
            len(args_digest) != DIGEST_CHARS
            or any(char not in "0123456789abcdef" for char in args_digest)
        ):
            raise _invalid(
                f"args_digest must be {DIGEST_CHARS} lowercase hex digits, got {args_digest!r}"
            )
        if identity is not None or edited_args_json:
            record = await self.store.get_intent(intent_id)
            refused, edited_args_json = screen_decision(
                record, identity, approved, edited_args_json, self.registry
            )
            if refused is None and record is not None and approved and edited_args_json:
                refused = await self._screen_edit(record, edited_args_json)
            if refused is not None:
                return refused
        decision = await self.store.record_vote(
            intent_id,
            approved=approved,
            approver=approver,
            reason=reason,
            now_ms=self.clock(),
            args_digest=args_digest,
            edited_args_json=edited_args_json,
        )
        if decision.expired is not None:
            audit.expired([decision.expired])
        return decision

    async def _screen_edit(self, gate: IntentRecord, edited_args_json: str) -> Decision | None:
        """Refuse an edit of a policy-held intent that the policy would deny as edited."""
        policy, held_id = self.policy, gate.intent.policy_gate_for
        if policy is None or not held_id:
            return None
        held = await self.store.get_intent(held_id)
        if held is None:
            return None
        edited = pb.ToolIntent()
        edited.CopyFrom(held.intent)
        edited.args_json = edited_args_json
        [verdict] = await policy.screen([(edited, None)], self.clock(), self._count_effects)
        if verdict.outcome is not Outcome.DENY:
            return None
        return Decision(
            False,
            pb.IntentState.AWAITING_DECISION,
            f"the edited arguments would be {verdict.rejection()}; the decision is not recorded",
            None,
        )

    async def _count_effects(
        self, counter: EffectCounter, groups: Sequence[bytes], since_ms: int
    ) -> dict[bytes, int]:
        """What ``counter`` counted since ``since_ms`` for each group (key, tenant, fleet)."""
        store, tool = self.store, counter.tool
        if counter.per is not CountedBy.TENANT:
            exact = counter.per is CountedBy.KEY
            return await store.count_effects(tool, groups, since_ms, exact=exact)
        # A tenant is a key prefix ending with the separator; a key without one is its own.
        separator = b"" if self.policy is None else self.policy.policy.tenant_separator.encode()
        prefixes = [group for group in groups if separator and group.endswith(separator)]
        keys = [group for group in groups if not (separator and group.endswith(separator))]
        found = await store.count_effects(tool, prefixes, since_ms, exact=False)
        found.update(await store.count_effects(tool, keys, since_ms, exact=True))
        return found

    async def pending_approvals(self, limit: int) -> tuple[list[IntentRecord], int]:
        """The oldest approvals awaiting a decision (at most ``limit``), and how many await."""
        oldest = await self.store.list_intents(IntentState.AWAITING_DECISION, limit)
        records = await asyncio.gather(*(self.store.get_intent(i.intent_id) for i in oldest))
        waiting = [r for r in records if r is not None and r.state == IntentState.AWAITING_DECISION]
        pending = (await self.store.counts(done=False)).awaiting_decision
        return waiting, max(pending, len(waiting))

    @_guarded
    async def Publish(
        self, request: pb.PublishRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishResponse:
        """Append external events to the envelope log, each refused alone if out of bounds."""
        offsets, problems = await self.publish_each(request.envelopes)
        return pb.PublishResponse(offsets=offsets, problems=problems)

    async def publish(self, envelopes: Sequence[pb.AgentEnvelope]) -> list[int]:
        """Append external events, all or none; ``ValueError`` (safe to show) if one is invalid."""
        _check_batch_size(len(envelopes), MAX_PUBLISH_BATCH, "Publish", "envelopes")
        for position, envelope in enumerate(envelopes):
            problem = external_event_problem(envelope)
            if problem is not None:
                raise _invalid(f"envelope {position} {problem}")
        offsets, _ = await self.publish_each(envelopes)
        return offsets

    async def publish_each(
        self, envelopes: Sequence[pb.AgentEnvelope]
    ) -> tuple[list[int], list[str]]:
        """Append the valid external events (an event time of 0 is stamped now).

        Returns each envelope's offset (0 if refused) and problem ("" if appended), in order.
        """
        _check_batch_size(len(envelopes), MAX_PUBLISH_BATCH, "Publish", "envelopes")
        now = self.clock()
        problems = [external_event_problem(envelope) or "" for envelope in envelopes]
        valid: list[pb.AgentEnvelope] = []
        for envelope, problem in zip(envelopes, problems, strict=True):
            if not problem:
                stamped = pb.AgentEnvelope()
                stamped.CopyFrom(envelope)
                if not stamped.event_time_ms:
                    stamped.event_time_ms = now
                valid.append(stamped)
        appended = iter(await self.store.publish(valid, now) if valid else [])
        offsets = [0 if problem else next(appended) for problem in problems]
        refused = [(i, problem) for i, problem in enumerate(problems) if problem]
        if refused:
            _log.warning(
                "Publish: refused %d of %d envelopes (the rest were appended); the first, "
                "envelope %d: %s",
                len(refused),
                len(envelopes),
                *refused[0],
            )
        return offsets, [
            f"envelope {i} {problem}" if problem else "" for i, problem in enumerate(problems)
        ]

    @_guarded
    async def ListIntents(
        self, request: pb.ListIntentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListIntentsResponse:
        """Intents in one state (or failed ones), oldest first: at most ``limit``, one at least.

        The answer also stays within ``MAX_READ_BYTES``, so large arguments never overflow it.
        """
        if request.state not in _LISTABLE_STATES:
            raise _invalid(f"state must be one of {_LISTABLE_NAMES}, got {request.state}")
        limit = _list_limit(request.limit)
        if request.failed_only:
            if request.state != pb.IntentState.DONE:
                raise _invalid("failed_only lists DONE intents: set state to DONE")
            failed = await self.store.list_failed(limit)
            failed = failed[: _fitting(i.ByteSize() + r.ByteSize() for i, r in failed)]
            return pb.ListIntentsResponse(
                intents=[intent for intent, _ in failed], results=[result for _, result in failed]
            )
        intents = await self.store.list_intents(request.state, limit)
        return pb.ListIntentsResponse(intents=intents[: _fitting(i.ByteSize() for i in intents)])

    @_guarded
    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        """How many intents are in each state, and the head of the envelope log."""
        counts = await self.store.counts()
        in_flight = (
            counts.pending
            + counts.running
            + counts.in_doubt
            + counts.awaiting_decision
            + counts.held
        )
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
        """A page of one key's activation records, the newest before a place, within one message.

        A run too large for one answer is split across pages; each page holds a record at least.
        """
        if not 0 < len(request.entity_key) <= MAX_ENTITY_KEY_BYTES:
            raise _invalid(f"entity_key must be 1 to {MAX_ENTITY_KEY_BYTES} bytes")
        if request.max_runs < 0 or request.before_seq < 0:
            raise _invalid("max_runs and before_seq must not be negative")
        before: RecordPlace | None = None
        if request.HasField("before"):
            place = request.before
            if place.seq < 0 or place.trace_sequence < 0:
                raise _invalid("before.seq and before.trace_sequence must not be negative")
            before = RecordPlace(place.seq, place.trace_sequence, place.intent_namespace)
        elif request.before_seq:
            before = RecordPlace(request.before_seq, 0, "")
        namespace = request.intent_namespace if request.HasField("intent_namespace") else None
        page = await self.store.records_before(
            request.entity_key,
            min(request.max_runs or DEFAULT_RECORD_RUNS, MAX_RECORD_RUNS),
            MAX_READ_BYTES,
            before=before,
            namespace=namespace,
        )
        response = pb.ListRecordsResponse(records=page.records)
        if page.more and page.records:
            oldest = page.records[0]
            response.next_before_seq = oldest.seq
            response.next_before.seq = oldest.seq
            response.next_before.trace_sequence = oldest.trace_sequence
            response.next_before.intent_namespace = oldest.intent_namespace
        return response

    async def _record_telemetry(
        self,
        rpc: str,
        items: str,
        batch: Sequence[_Message],
        problem: Callable[[_Message], str | None],
        record: Callable[[Sequence[_Message], int], Awaitable[Recorded]],
    ) -> _Stored:
        """Store a telemetry batch's valid items and count the outcome; leave invalid ones out."""
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
